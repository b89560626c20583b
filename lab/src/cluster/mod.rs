//! `cargo xtask cluster up|down|status|fault`: a single-node Kubernetes on
//! this host, from local parts only (docs/local-cluster.md is the user's
//! view).
//!
//! etcd, kube-apiserver, kube-controller-manager, kube-scheduler and the
//! kubelet of Kubernetes 1.37 with its volume health on (the project's
//! build from Go modules, `xtask::components`, or a user's own in
//! `HEALTH_K8S_ASSETS`), containerd and runc and the CNI plugins from
//! Debian; the pause, busybox and agent images built here and imported
//! (nothing is pulled). Everything lives in one state directory
//! ([`State`]) except the kubelet's root, `/var/lib/kubelet`, where the
//! chart's hostPaths expect it.
//!
//! `up` is idempotent: a healthy cluster is reported and left alone, a
//! half-up one is completed. `down` stops everything and undoes every change
//! to the host that `up` and the kubelet made (recorded before they were
//! made). The parts: [`preflight`] (what must hold before anything
//! starts), [`packages`], [`network`] (the addresses and containerd's
//! socket the others use), [`assets`] (the Kubernetes binaries),
//! [`images`], [`pki`] (CA, certificates, tokens), [`config`] (every file
//! the daemons read), [`control_plane`] (etcd and the three control-plane
//! daemons), [`node`] (containerd, the service address, the kubelet),
//! [`api`] (waiting on the API server), [`teardown`] (`down`),
//! [`mounts`] and [`host`] (mounts, cgroups, links, sysctls), [`status`],
//! and `storage` (the fault disk, the CSI driver and the PVs).

mod api;
mod assets;
mod config;
mod control_plane;
mod daemon;
mod host;
mod images;
mod mounts;
mod network;
mod node;
mod packages;
mod pki;
mod preflight;
mod state;
mod status;
mod storage;
mod teardown;

use std::time::Instant;

use anyhow::{bail, Context};
use serde_json::json;
pub use xtask::lab_cli::cluster::ClusterArgs;
use xtask::lab_cli::cluster::{ClusterCommand, UpArgs};
use xtask::util::say;

use state::State;

/// The ports the cluster listens on; `up` refuses when another process
/// holds one (docs/local-cluster.md lists them).
pub(super) const PORTS: &[(u16, &str)] = &[
    (ETCD_PORT, "etcd (clients, 127.0.0.1)"),
    (ETCD_PEER_PORT, "etcd (peers, 127.0.0.1)"),
    (APISERVER_PORT, "kube-apiserver"),
    (KUBELET_PORT, "kubelet"),
    (KUBELET_HEALTHZ_PORT, "kubelet healthz (127.0.0.1)"),
    (KCM_PORT, "kube-controller-manager (127.0.0.1)"),
    (SCHEDULER_PORT, "kube-scheduler (127.0.0.1)"),
];
pub(super) const ETCD_PORT: u16 = 2379;
pub(super) const ETCD_PEER_PORT: u16 = 2380;
pub(super) const APISERVER_PORT: u16 = 6443;
pub(super) const KUBELET_PORT: u16 = 10250;
pub(super) const KUBELET_HEALTHZ_PORT: u16 = 10248;
pub(super) const KCM_PORT: u16 = 10257;
pub(super) const SCHEDULER_PORT: u16 = 10259;

/// The daemons, in the order `up` starts them (`down` stops them in the
/// order its steps need).
pub(super) const DAEMONS: &[&str] = &[
    "containerd",
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubelet",
];

pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let state = State::open(args.state_dir.as_deref())?;
    match &args.command {
        ClusterCommand::Up(up_args) => up(&state, up_args),
        ClusterCommand::Down => teardown::down(&state),
        ClusterCommand::Status => status::report(&state),
        ClusterCommand::Fault(fault) => storage::fault(&state, fault),
        ClusterCommand::Test { .. } => {
            bail!("`cluster test` is run by xtask (xtask/cli/src/cluster_test.rs), not by the lab")
        }
    }
}

fn up(state: &State, args: &UpArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    preflight::require_root()?;
    if status::healthy(state) {
        say(format!(
            "the cluster in {} is up and healthy; nothing to start",
            state.dir.display()
        ));
        // A new build of the agent on a running cluster: its image under
        // the same name (pods started from now on run it).
        if let Some(archive) = &args.agent_archive {
            images::import_archive(state, archive)?;
            say(format!("imported {}", archive.display()));
        }
        print_usage(state);
        return Ok(());
    }
    let assets = assets::Assets::find()?;
    preflight::check(state)?;
    packages::ensure()?;
    std::fs::create_dir_all(&state.dir)
        .with_context(|| format!("creating {}", state.dir.display()))?;
    host::record_before(state)?;
    for mounted in host::mount_kernel_filesystems(state)? {
        say(format!(
            "mounted {mounted} (the host had none; `down` unmounts it)"
        ));
    }
    let net = network::Network::detect()?;
    pki::ensure(state, &net)?;
    config::write_all(state, &net, &assets)?;
    let built = images::build(state, args.agent_archive.as_deref())?;
    node::start_containerd(state)?;
    images::import(state, &built)?;
    control_plane::start(state, &assets, &net)?;
    host::route_service_address(&net)?;
    node::start_kubelet(state, &assets, &net)?;
    api::wait_node_usable(state)?;
    write_description(state, &net)?;
    say(format!(
        "Kubernetes up in {:.1} s; the storage next",
        started.elapsed().as_secs_f64()
    ));
    storage::up(state)?;
    say(format!(
        "cluster up in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    print_usage(state);
    Ok(())
}

/// `cluster.json` with `"storage": null`; storage::up fills its part in.
fn write_description(state: &State, net: &network::Network) -> anyhow::Result<()> {
    state.write_description(&json!({
        "kubeconfig": state.kubeconfig(),
        "node": state.node_name(),
        "node_ip": net.node_ip.to_string(),
        "apiserver": net.apiserver_url(),
        "kubelet_root": state::KUBELET_ROOT,
        "images": {
            "agent": images::AGENT_IMAGE,
            "busybox": images::BUSYBOX_IMAGE,
            "pause": images::PAUSE_IMAGE,
            "agent_full": images::full_name(images::AGENT_IMAGE),
        },
        "containerd_socket": network::containerd_socket(state),
        "storage": null,
    }))
}

fn print_usage(state: &State) {
    let kubeconfig = state.kubeconfig();
    println!(
        "\nThe cluster is up. To use it:\n  export KUBECONFIG={k}\n  kubectl get nodes\n  \
         helm install volume-health deploy/helm/volume-health -n volume-health --create-namespace   # helm, kubectl: cargo xtask tools\n\
         Images are imported, never pulled: pods use imagePullPolicy IfNotPresent or Never \
         ({agent}, {busybox}).\n\
         State: {dir}; stop and clean up: cargo xtask cluster down",
        k = kubeconfig.display(),
        agent = images::AGENT_IMAGE,
        busybox = images::BUSYBOX_IMAGE,
        dir = state.dir.display(),
    );
}
