//! csi-driver-host-path and csi-node-driver-registrar as host daemons, as a
//! DaemonSet would run them: the driver's socket under the kubelet's
//! `plugins/`, the registrar announcing it in `plugins_registry/`, where the
//! kubelet picks it up. Volumes come from CSI CreateVolume on that socket.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use health_tests::hostpath::{self, Access, CreatedVolume};
use health_tests::{fs, sys};
use xtask::util::output;

use super::super::state::KUBELET_ROOT;
use super::super::{daemon, State};
use super::{Mode, VolumeSpec};

pub(super) use health_tests::hostpath::DRIVER;
pub(super) const PLUGIN_DAEMON: &str = "hostpathplugin";
pub(super) const REGISTRAR_DAEMON: &str = "csi-node-driver-registrar";
const SOCKET_WAIT: Duration = Duration::from_secs(20);

fn plugin_dir() -> PathBuf {
    Path::new(KUBELET_ROOT).join("plugins").join(DRIVER)
}

fn registry_dir() -> PathBuf {
    Path::new(KUBELET_ROOT).join("plugins_registry")
}

/// The driver's socket (the same path for us, the kubelet and the agent).
pub(super) fn socket() -> PathBuf {
    plugin_dir().join("csi.sock")
}

/// The registrar's socket, which the kubelet's plugin watcher finds.
pub(super) fn registration_socket() -> PathBuf {
    registry_dir().join(format!("{DRIVER}-reg.sock"))
}

fn asset(name: &str) -> anyhow::Result<PathBuf> {
    hostpath::asset(name).map_err(|why| {
        anyhow::anyhow!(
            "{why}: the CSI driver and registrar come from there (shared/csi/README.md)"
        )
    })
}

/// The driver, serving `statedir`, unless it runs already.
pub(super) fn ensure_plugin(state: &State, statedir: &Path) -> anyhow::Result<()> {
    if daemon::running(state, PLUGIN_DAEMON).is_some() && socket().exists() {
        return Ok(());
    }
    daemon::stop(state, PLUGIN_DAEMON, Duration::from_secs(10))?;
    let bin = asset(hostpath::PLUGIN)?;
    remove_file(&socket())?;
    std::fs::create_dir_all(plugin_dir())
        .with_context(|| format!("creating {}", plugin_dir().display()))?;
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--endpoint=unix://{}", socket().display()))
        .arg(format!("--nodeid={}", state.node_name()))
        .arg(format!("--drivername={DRIVER}"))
        .arg(format!("--statedir={}", statedir.display()))
        // Every gRPC call is logged: who asked what, when.
        .arg("-v=5");
    daemon::start(state, PLUGIN_DAEMON, cmd)?;
    wait_socket(state, PLUGIN_DAEMON, &socket())
}

/// The registrar, unless it runs already.
pub(super) fn ensure_registrar(state: &State) -> anyhow::Result<()> {
    if daemon::running(state, REGISTRAR_DAEMON).is_some() && registration_socket().exists() {
        return Ok(());
    }
    daemon::stop(state, REGISTRAR_DAEMON, Duration::from_secs(10))?;
    let bin = asset(hostpath::REGISTRAR)?;
    remove_file(&registration_socket())?;
    // The kubelet made it when it started; made here too, the registrar
    // never fails on its absence.
    std::fs::create_dir_all(registry_dir())
        .with_context(|| format!("creating {}", registry_dir().display()))?;
    let mut cmd = Command::new(bin);
    cmd.arg(format!("--csi-address={}", socket().display()))
        // The kubelet runs on this host: it sees the socket where we do.
        .arg(format!(
            "--kubelet-registration-path={}",
            socket().display()
        ))
        .arg(format!(
            "--plugin-registration-path={}",
            registry_dir().display()
        ))
        .arg("-v=2");
    daemon::start(state, REGISTRAR_DAEMON, cmd)?;
    wait_socket(state, REGISTRAR_DAEMON, &registration_socket())
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

/// CreateVolume for `spec`, named after its PV: the driver answers the same
/// volume again on a later `up`.
pub(super) async fn create_volume(spec: &VolumeSpec) -> anyhow::Result<CreatedVolume> {
    let access = match spec.mode {
        Mode::Filesystem => Access::Mount,
        Mode::Block => Access::Block,
    };
    let bytes = i64::try_from(spec.bytes)?;
    let created = hostpath::create_volume(&socket(), spec.pv, bytes, access).await?;
    if created.capacity_bytes != bytes {
        bail!(
            "CreateVolume {} answered {} bytes, not {bytes}",
            spec.pv,
            created.capacity_bytes
        );
    }
    Ok(created)
}

/// The loop device the driver attached over a block volume's file, with
/// direct I/O switched on (the driver attaches it buffered: a pod's writes
/// would wait in the page cache of the file, and fail only at its next
/// flush) and every block of the file written once (the driver fallocates
/// it: ext4 answers reads of unwritten extents with zeroes and never asks
/// the disk). Returns (device, "MAJ:MIN").
pub(super) fn prepare_block(file: &Path) -> anyhow::Result<(PathBuf, String)> {
    // The kernel records the backing file by its canonical path.
    let file = &file
        .canonicalize()
        .with_context(|| format!("resolving {}", file.display()))?;
    let loops = sys::loops_backed_by(file)?;
    let [name] = loops.as_slice() else {
        bail!(
            "{} should have one loop device (the driver's), has {loops:?}",
            file.display()
        );
    };
    let device = PathBuf::from(format!("/dev/{name}"));
    if sys::read_sysfs(format!("/sys/block/{name}/loop/dio"))? != "1" {
        output(Command::new("losetup").arg("--direct-io=on").arg(&device))?;
        let dio = sys::read_sysfs(format!("/sys/block/{name}/loop/dio"))?;
        if dio != "1" {
            bail!("{}: direct I/O refused (dio={dio})", device.display());
        }
    }
    let unwritten = fs::file_extents(file)?
        .iter()
        .any(|e| e.flags & fs::Extent::FLAG_UNWRITTEN != 0);
    if unwritten {
        let len = std::fs::metadata(file)?.len();
        let zeroes = vec![0u8; 1 << 20];
        let mut offset = 0;
        while offset < len {
            let n = zeroes.len().min(usize::try_from(len - offset)?);
            let written = fs::o_direct_write(&device, offset, &zeroes[..n])
                .with_context(|| format!("writing {} at {offset}", device.display()))?;
            if written != n {
                bail!(
                    "{}: wrote {written} of {n} bytes at {offset}",
                    device.display()
                );
            }
            offset += n as u64;
        }
    }
    Ok((device, sys::block_maj_min(name)?))
}

/// Removes the sockets the daemons leave behind (the kubelet's root itself
/// is the cluster's to remove).
pub(super) fn remove_sockets() -> anyhow::Result<()> {
    remove_file(&registration_socket())?;
    remove_file(&socket())?;
    match std::fs::remove_dir(plugin_dir()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", plugin_dir().display())),
    }
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
    [
        (PLUGIN_DAEMON, socket()),
        (REGISTRAR_DAEMON, registration_socket()),
    ]
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
