//! etcd, kube-apiserver, kube-controller-manager and kube-scheduler: each
//! started when it does not run, and waited for.
//!
//! The API server is set up as the tests' real server is
//! (tests/src/envtest.rs: static tokens, Node and RBAC authorization,
//! ServiceAccount keys), plus what a node needs: its serving certificate
//! from the cluster's CA, a client certificate towards the kubelet, and
//! InternalIP first so `kubectl logs/exec` reach the kubelet. Kubernetes'
//! volume health (`pvc.status.healthStatus`, `pod.status.volumeHealth`,
//! `CSINode.status.storageHealth`) is on: the `CSIVolumeHealth` gate on the
//! API server and the kubelet ([`FEATURE_GATES`]). The controller-manager
//! runs every controller except the pod CIDR allocator (nodeipam; the
//! bridge's host-local range is fixed); it signs ServiceAccount tokens and
//! publishes the CA (kube-root-ca.crt) that pods verify the API server
//! with.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::bail;
use xtask::util::say;

use super::assets::Assets;
use super::daemon::log_tail;
use super::network::{Network, SERVICE_CIDR};
use super::{api, daemon, pki, State};
use super::{APISERVER_PORT, ETCD_PEER_PORT, ETCD_PORT, KCM_PORT, SCHEDULER_PORT};

/// The feature gates of the API server and the kubelet: Kubernetes'
/// volume health, alpha in 1.37 and off by default.
pub(super) const FEATURE_GATES: &str = "--feature-gates=CSIVolumeHealth=true";

pub(super) fn start(state: &State, assets: &Assets, net: &Network) -> anyhow::Result<()> {
    if daemon::running(state, "etcd").is_none() {
        say("starting etcd");
        daemon::start(state, "etcd", etcd(state, assets))?;
    }
    wait_port(state, "etcd", ETCD_PORT, Duration::from_secs(30))?;
    if daemon::running(state, "kube-apiserver").is_none() {
        say("starting kube-apiserver");
        daemon::start(state, "kube-apiserver", apiserver(state, assets, net))?;
    }
    api::wait_apiserver_ready(state, Duration::from_secs(90))?;
    for (name, port) in [
        ("kube-controller-manager", KCM_PORT),
        ("kube-scheduler", SCHEDULER_PORT),
    ] {
        if daemon::running(state, name).is_none() {
            say(format!("starting {name}"));
            let cmd = match name {
                "kube-controller-manager" => controller_manager(state, assets),
                _ => scheduler(state, assets),
            };
            daemon::start(state, name, cmd)?;
        }
        wait_port(state, name, port, Duration::from_secs(60))?;
    }
    Ok(())
}

fn etcd(state: &State, assets: &Assets) -> Command {
    let mut cmd = assets.command("etcd");
    cmd.arg("--name=volume-health")
        .arg(format!("--data-dir={}", state.path("etcd").display()))
        .arg(format!("--listen-client-urls=http://127.0.0.1:{ETCD_PORT}"))
        .arg(format!(
            "--advertise-client-urls=http://127.0.0.1:{ETCD_PORT}"
        ))
        .arg(format!(
            "--listen-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}"
        ))
        .arg(format!(
            "--initial-advertise-peer-urls=http://127.0.0.1:{ETCD_PEER_PORT}"
        ))
        .arg(format!(
            "--initial-cluster=volume-health=http://127.0.0.1:{ETCD_PEER_PORT}"
        ));
    cmd
}

fn apiserver(state: &State, assets: &Assets, net: &Network) -> Command {
    let pki = pki::dir(state);
    let p = |f: &str| pki.join(f).display().to_string();
    let mut cmd = assets.command("kube-apiserver");
    cmd.arg(format!("--etcd-servers=http://127.0.0.1:{ETCD_PORT}"))
        .arg(format!("--secure-port={APISERVER_PORT}"))
        .arg("--bind-address=0.0.0.0")
        .arg(format!("--advertise-address={}", net.node_ip))
        .arg(format!("--tls-cert-file={}", p("apiserver.crt")))
        .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
        .arg(format!("--client-ca-file={}", p("ca.crt")))
        .arg(format!("--token-auth-file={}", p("tokens.csv")))
        .arg("--authorization-mode=Node,RBAC")
        .arg(format!("--service-account-key-file={}", p("sa.pub")))
        .arg(format!(
            "--service-account-signing-key-file={}",
            p("sa.key")
        ))
        .arg("--service-account-issuer=https://kubernetes.default.svc")
        .arg("--api-audiences=https://kubernetes.default.svc")
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"))
        .arg("--enable-admission-plugins=NodeRestriction")
        .arg("--allow-privileged=true")
        .arg(FEATURE_GATES)
        .arg("--kubelet-preferred-address-types=InternalIP,Hostname")
        .arg(format!(
            "--kubelet-client-certificate={}",
            p("apiserver-kubelet-client.crt")
        ))
        .arg(format!(
            "--kubelet-client-key={}",
            p("apiserver-kubelet-client.key")
        ))
        .arg("--profiling=false");
    cmd
}

/// What the controller-manager and the scheduler share: the admin's
/// kubeconfig for everything (so `--use-service-account-credentials` and
/// its RBAC bootstrapping are not needed), no leader election (one of each).
fn common(cmd: &mut Command, state: &State) {
    let kubeconfig = state.kubeconfig().display().to_string();
    cmd.arg(format!("--kubeconfig={kubeconfig}"))
        .arg(format!("--authentication-kubeconfig={kubeconfig}"))
        .arg(format!("--authorization-kubeconfig={kubeconfig}"))
        .arg("--leader-elect=false")
        .arg("--bind-address=127.0.0.1")
        .arg("--profiling=false");
}

fn controller_manager(state: &State, assets: &Assets) -> Command {
    let pki = pki::dir(state);
    let p = |f: &str| pki.join(f).display().to_string();
    let mut cmd = assets.command("kube-controller-manager");
    common(&mut cmd, state);
    cmd.arg(format!("--secure-port={KCM_PORT}"))
        .arg("--controllers=*,-nodeipam")
        .arg(format!(
            "--service-account-private-key-file={}",
            p("sa.key")
        ))
        .arg(format!("--root-ca-file={}", p("ca.crt")))
        .arg(format!("--cluster-signing-cert-file={}", p("ca.crt")))
        .arg(format!("--cluster-signing-key-file={}", p("ca.key")))
        .arg(format!("--service-cluster-ip-range={SERVICE_CIDR}"));
    cmd
}

fn scheduler(state: &State, assets: &Assets) -> Command {
    let mut cmd = assets.command("kube-scheduler");
    common(&mut cmd, state);
    cmd.arg(format!("--secure-port={SCHEDULER_PORT}"));
    cmd
}

/// Waits until `name` listens on 127.0.0.1:`port`; fails early, with its
/// log, when it exits.
pub(super) fn wait_port(
    state: &State,
    name: &str,
    port: u16,
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        if daemon::running(state, name).is_none() {
            bail!("{name} exited while starting; {}", log_tail(state, name));
        }
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{name} does not listen on port {port} after {} s; {}",
                within.as_secs(),
                log_tail(state, name)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
