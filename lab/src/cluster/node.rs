//! The node's daemons: containerd (its own config, root, state and socket
//! under the state directory) and the kubelet (root /var/lib/kubelet,
//! marked as ours before it starts; everything else under the state
//! directory).

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use xtask::util::say;

use super::assets::Assets;
use super::config;
use super::control_plane::wait_port;
use super::daemon::log_tail;
use super::network::{self, Network};
use super::state::{KUBELET_MARKER, KUBELET_ROOT};
use super::{daemon, images, State, KUBELET_HEALTHZ_PORT};

pub(super) fn start_containerd(state: &State) -> anyhow::Result<()> {
    if daemon::running(state, "containerd").is_none() {
        say("starting containerd");
        let mut cmd = Command::new("containerd");
        cmd.arg("--config").arg(config::containerd_config(state));
        daemon::start(state, "containerd", cmd)?;
    }
    // Answering on its socket: the CRI plugin and the image store are up.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answer = images::ctr(state).arg("version").output();
        if answer.as_ref().is_ok_and(|o| o.status.success()) {
            return Ok(());
        }
        if daemon::running(state, "containerd").is_none() {
            bail!(
                "containerd exited while starting; {}",
                log_tail(state, "containerd")
            );
        }
        if Instant::now() >= deadline {
            bail!(
                "containerd does not answer on {} after 30 s; {}",
                network::containerd_socket(state).display(),
                log_tail(state, "containerd")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

pub(super) fn start_kubelet(state: &State, assets: &Assets, net: &Network) -> anyhow::Result<()> {
    if daemon::running(state, "kubelet").is_none() {
        std::fs::create_dir_all(KUBELET_ROOT)
            .with_context(|| format!("creating {KUBELET_ROOT}"))?;
        std::fs::write(KUBELET_MARKER, format!("{}\n", state.dir.display()))
            .with_context(|| format!("writing {KUBELET_MARKER}"))?;
        say("starting the kubelet");
        let mut cmd = assets.command("kubelet");
        cmd.arg(format!(
            "--config={}",
            config::kubelet_config(state).display()
        ))
        .arg(format!(
            "--kubeconfig={}",
            config::kubelet_kubeconfig(state).display()
        ))
        .arg(format!("--hostname-override={}", state.node_name()))
        .arg(format!("--node-ip={}", net.node_ip))
        .arg(format!("--root-dir={KUBELET_ROOT}"))
        .arg(format!(
            "--cert-dir={}",
            state.path("kubelet/pki").display()
        ))
        .arg(super::control_plane::FEATURE_GATES);
        daemon::start(state, "kubelet", cmd)?;
    }
    wait_port(
        state,
        "kubelet",
        KUBELET_HEALTHZ_PORT,
        Duration::from_secs(60),
    )
}
