//! The project's CSI driver (`csi-loop-driver`, health-tests) and
//! `health-agent csi-proxy` in front of it, as host daemons, as a driver's
//! node DaemonSet would run them with the proxy as its sidecar: the
//! driver's socket under the kubelet's `plugins/`, the proxy's beside it
//! (`volume-health/csi.sock`), and the driver serving the kubelet's plugin
//! registration itself in `plugins_registry/`, announcing the proxy's
//! socket. So the kubelet's every CSI node call goes through the proxy,
//! and Kubernetes 1.37's volume health (`pod.status.volumeHealth`,
//! `CSINode.status.storageHealth`) carries the agent's conditions once the
//! agent serves its conditions socket (the chart's `csiProxy.enabled`).
//! The agent itself talks to the driver's own socket, as it does on any
//! node. Volumes come from CSI CreateVolume on the driver's socket.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use health_tests::csi_driver::backing::{FILE, FS_OPTIONS, MKFS_OPTIONS, OFFSET};
use health_tests::csi_driver::client::{self, CreatedVolume};
use health_tests::csi_driver::requests::Access;

use super::super::state::KUBELET_ROOT;
use super::super::{daemon, State};
use super::{Mode, Region, VolumeSpec};

/// The name the driver registers under (its default).
pub(super) use health_tests::csi_driver::DEFAULT_DRIVER_NAME as DRIVER;
pub(super) const PLUGIN_DAEMON: &str = "csi-loop-driver";
pub(super) const PROXY_DAEMON: &str = "csi-proxy";
const SOCKET_WAIT: Duration = Duration::from_secs(20);
/// Where the agent answers the proxy (the chart's `csiProxy.socketDir`,
/// health_node::conditions_socket::DEFAULT_SOCKET).
const AGENT_SOCKET: &str = "/run/volume-health/conditions.sock";

fn plugin_dir() -> PathBuf {
    Path::new(KUBELET_ROOT).join("plugins").join(DRIVER)
}

fn registry_dir() -> PathBuf {
    Path::new(KUBELET_ROOT).join("plugins_registry")
}

/// The driver's own socket (the agent's and the controller's way to it).
pub(super) fn socket() -> PathBuf {
    plugin_dir().join("csi.sock")
}

/// The proxy's socket: what the kubelet is told to call.
pub(super) fn proxy_socket() -> PathBuf {
    plugin_dir().join("volume-health/csi.sock")
}

/// The registration socket, which the kubelet's plugin watcher finds.
pub(super) fn registration_socket() -> PathBuf {
    registry_dir().join(format!("{DRIVER}-reg.sock"))
}

/// The driver, its records in `state_dir`, unless it runs already.
pub(super) fn ensure_plugin(state: &State, state_dir: &Path) -> anyhow::Result<()> {
    if daemon::running(state, PLUGIN_DAEMON).is_some()
        && socket().exists()
        && registration_socket().exists()
    {
        return Ok(());
    }
    daemon::stop(state, PLUGIN_DAEMON, Duration::from_secs(10))?;
    let bin = xtask::build::release_test_binary("csi-loop-driver")?;
    remove_file(&socket())?;
    remove_file(&registration_socket())?;
    for dir in [plugin_dir(), registry_dir()] {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--endpoint=unix://{}", socket().display()))
        .arg(format!("--node-id={}", state.node_name()))
        .arg("--state-dir")
        .arg(state_dir)
        .arg("--registration-socket")
        .arg(registration_socket())
        .arg("--kubelet-endpoint")
        .arg(proxy_socket());
    daemon::start(state, PLUGIN_DAEMON, cmd)?;
    wait_socket(state, PLUGIN_DAEMON, &socket())?;
    wait_socket(state, PLUGIN_DAEMON, &registration_socket())
}

/// The proxy in front of the driver, unless it runs already: the agent's
/// binary as `cargo xtask image` (or `build`) left it.
pub(super) fn ensure_proxy(state: &State) -> anyhow::Result<()> {
    if daemon::running(state, PROXY_DAEMON).is_some() && proxy_socket().exists() {
        return Ok(());
    }
    daemon::stop(state, PROXY_DAEMON, Duration::from_secs(10))?;
    let agent = xtask::util::target_dir().join("release/health-agent");
    if !agent.is_file() {
        bail!(
            "the CSI proxy is the agent's own `health-agent csi-proxy`, and {} is missing: \
             build it first (`cargo xtask build`)",
            agent.display()
        );
    }
    remove_file(&proxy_socket())?;
    let mut cmd = Command::new(agent);
    cmd.arg("csi-proxy")
        .arg("--listen")
        .arg(proxy_socket())
        .arg("--csi-address")
        .arg(socket())
        .arg("--volume-health-socket")
        .arg(AGENT_SOCKET);
    daemon::start(state, PROXY_DAEMON, cmd)?;
    wait_socket(state, PROXY_DAEMON, &proxy_socket())
}

fn wait_socket(state: &State, name: &str, socket: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + SOCKET_WAIT;
    while !socket.exists() {
        if daemon::running(state, name).is_none() || Instant::now() > deadline {
            bail!(
                "{name} did not create {} within {SOCKET_WAIT:?}; its log: {}",
                socket.display(),
                daemon::log_file(state, name).display()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// CreateVolume for `spec`, named after its PV, over its `region` of the
/// fault disk's `image`: the driver answers the same volume again on a
/// later `up`. A filesystem volume gets ext4 without a journal that
/// continues on errors (see the module docs of `storage`).
pub(super) async fn create_volume(
    spec: &VolumeSpec,
    image: &Path,
    region: Region,
) -> anyhow::Result<CreatedVolume> {
    let mut parameters = BTreeMap::from([
        (FILE.to_string(), image.display().to_string()),
        (OFFSET.to_string(), region.offset.to_string()),
    ]);
    let access = match spec.mode {
        Mode::Filesystem => {
            parameters.insert(MKFS_OPTIONS.to_string(), "-O ^has_journal".to_string());
            parameters.insert(FS_OPTIONS.to_string(), "errors=continue".to_string());
            Access::Mount
        }
        Mode::Block => Access::Block,
    };
    let bytes = i64::try_from(spec.bytes)?;
    let created = client::create_volume(&socket(), spec.pv, bytes, access, &parameters).await?;
    if created.capacity_bytes != bytes {
        bail!(
            "CreateVolume {} answered {} bytes, not {bytes}",
            spec.pv,
            created.capacity_bytes
        );
    }
    Ok(created)
}

/// Removes the sockets the daemons leave behind (the kubelet's root itself
/// is the cluster's to remove).
pub(super) fn remove_sockets() -> anyhow::Result<()> {
    remove_file(&registration_socket())?;
    remove_file(&proxy_socket())?;
    remove_file(&socket())?;
    for dir in [plugin_dir().join("volume-health"), plugin_dir()] {
        match std::fs::remove_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", dir.display())),
        }
    }
    Ok(())
}

fn remove_file(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
    }
}

/// Both daemons and their sockets.
pub(super) fn status(state: &State) -> Vec<(String, bool, String)> {
    [(PLUGIN_DAEMON, socket()), (PROXY_DAEMON, proxy_socket())]
        .into_iter()
        .map(|(name, socket)| {
            let (ok, detail) = match (daemon::running(state, name), socket.exists()) {
                (Some(pid), true) => (true, format!("pid {pid}, {}", socket.display())),
                (Some(pid), false) => (false, format!("pid {pid}, but no {}", socket.display())),
                (None, _) => (false, "not running".to_string()),
            };
            (name.to_string(), ok, detail)
        })
        .collect()
}
