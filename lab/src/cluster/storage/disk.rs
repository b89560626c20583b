//! The fault disk: the faultdisk server as a daemon, loop devices with
//! direct I/O over regions of its image; and taking all of it away again.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use health_tests::protocol::{
    Request, Response, ServerInfo, CONTROL_SOCKET, IMAGE_NAME, MOUNT_DIR,
};
use health_tests::{sys, LoopDevice};
use xtask::util::{output, say};

use super::super::mounts::mounted_under;
use super::super::{daemon, State};
use super::{Description, Region};

pub(super) const DAEMON: &str = "faultdisk";
/// How long the server may take to mount and answer.
const READY: Duration = Duration::from_secs(30);

/// The running faultdisk server.
pub(super) struct FaultDisk {
    socket: PathBuf,
    info: ServerInfo,
}

fn work_dir(state: &State) -> PathBuf {
    super::dir(state).join("faultdisk")
}

impl FaultDisk {
    /// The server, when its daemon runs, answers and has the size of this
    /// layout (an older layout is replaced whole).
    pub(super) fn connect(state: &State) -> anyhow::Result<Option<FaultDisk>> {
        if daemon::running(state, DAEMON).is_none() {
            return Ok(None);
        }
        let socket = work_dir(state).join(CONTROL_SOCKET);
        match request(&socket, &Request::Info) {
            Ok(Response {
                info: Some(info), ..
            }) if info.size == super::layout().1 => Ok(Some(FaultDisk { socket, info })),
            Ok(Response {
                info: Some(info), ..
            }) => {
                // `up` takes it down in order (mounts, loops, server).
                say(format!(
                    "the fault disk has {} bytes, this layout wants {}: replacing it",
                    info.size,
                    super::layout().1
                ));
                Ok(None)
            }
            Ok(other) => bail!("the fault disk answered Info without info: {other:?}"),
            Err(e) => {
                say(format!(
                    "the fault disk server runs but does not answer ({e:#}); replacing it"
                ));
                daemon::stop(state, DAEMON, Duration::from_secs(10))?;
                Ok(None)
            }
        }
    }

    /// Starts a fresh server (a new, empty image of the layout's size) and
    /// waits until it answers.
    pub(super) fn start(state: &State) -> anyhow::Result<FaultDisk> {
        let bin = server_binary()?;
        let dir = work_dir(state);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let (_, bytes) = super::layout();
        let mut cmd = Command::new(&bin);
        cmd.arg("--dir")
            .arg(&dir)
            .args(["--size", &bytes.to_string(), "--no-stdin"]);
        daemon::start(state, DAEMON, cmd)?;
        let socket = dir.join(CONTROL_SOCKET);
        let deadline = Instant::now() + READY;
        loop {
            match request(&socket, &Request::Info) {
                Ok(Response {
                    info: Some(info), ..
                }) => {
                    say(format!(
                        "fault disk: {} ({} MiB)",
                        info.image_path,
                        bytes >> 20
                    ));
                    return Ok(FaultDisk { socket, info });
                }
                Ok(other) => bail!("the fault disk answered Info without info: {other:?}"),
                Err(e) if Instant::now() > deadline || daemon::running(state, DAEMON).is_none() => {
                    bail!(
                        "the fault disk server did not come up ({e:#}); its log: {}",
                        daemon::log_file(state, DAEMON).display()
                    )
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    pub(super) fn control_socket(&self) -> &Path {
        &self.socket
    }

    pub(super) fn image(&self) -> &Path {
        Path::new(&self.info.image_path)
    }

    pub(super) fn size(&self) -> u64 {
        self.info.size
    }

    /// The loop device over exactly `region` of the image: the one already
    /// attached, or a new one with direct I/O (errors would otherwise wait
    /// in a second page cache) whose requests each fit one FUSE request.
    /// Returns the device and its "MAJ:MIN".
    pub(super) fn loop_over(&self, region: Region) -> anyhow::Result<(PathBuf, String)> {
        let name = self.find_or_attach(region)?;
        let maj_min = sys::block_maj_min(&name)?;
        Ok((PathBuf::from(format!("/dev/{name}")), maj_min))
    }

    fn find_or_attach(&self, region: Region) -> anyhow::Result<String> {
        for name in sys::loops_backed_by(self.image())? {
            if loop_region(&name)? == region {
                return Ok(name);
            }
        }
        let dev = output(Command::new("losetup").args([
            "-f",
            "--show",
            "--direct-io=on",
            "--offset",
            &region.offset.to_string(),
            "--sizelimit",
            &region.bytes.to_string(),
            &self.info.image_path,
        ]))?;
        let dev = dev.trim();
        let name = dev
            .strip_prefix("/dev/")
            .filter(|n| n.starts_with("loop"))
            .with_context(|| format!("losetup printed {dev:?}, not a /dev/loopN"))?
            .to_string();
        let dio = sys::read_sysfs(format!("/sys/block/{name}/loop/dio"))?;
        if dio != "1" {
            bail!("{dev}: the kernel refused direct I/O (dio={dio}); errors would hide in a page cache");
        }
        let fit = LoopDevice::fuse_fit_kb(self.info.max_request_bytes);
        let max = format!("/sys/block/{name}/queue/max_sectors_kb");
        std::fs::write(&max, fit.to_string()).with_context(|| format!("writing {fit} to {max}"))?;
        Ok(name)
    }
}

/// One request on a fresh connection to the server's control socket.
pub(super) fn request(socket: &Path, req: &Request) -> anyhow::Result<Response> {
    health_tests::faultdisk::call(socket, req)
}

/// `$FAULTDISK_BIN`, else the release build of health-tests' `faultdisk`
/// (built now: cargo does nothing when it is current).
fn server_binary() -> anyhow::Result<PathBuf> {
    if let Some(bin) = std::env::var_os("FAULTDISK_BIN") {
        let bin = PathBuf::from(bin);
        if !bin.is_file() {
            bail!("FAULTDISK_BIN={} is not a file", bin.display());
        }
        return Ok(bin);
    }
    xtask::build::release_test_binary("faultdisk")
}

/// Where loop device `name` starts in its backing file, and how much of it
/// it shows.
fn loop_region(name: &str) -> anyhow::Result<Region> {
    let read = |attr: &str| -> anyhow::Result<u64> {
        let path = format!("/sys/block/{name}/loop/{attr}");
        let text = sys::read_sysfs(&path)?;
        text.parse().with_context(|| format!("{path}: {text:?}"))
    };
    Ok(Region {
        offset: read("offset")?,
        bytes: read("sizelimit")?,
    })
}

/// Everything under `dir` goes: every mount under it (deepest first), the
/// loop devices over the image (and the kubelet's loop devices holding a
/// block volume's), the server (which unmounts its FUSE mount) and the
/// files, the driver's records with them. Idempotent.
pub(super) fn tear_down(state: &State, dir: &Path) -> anyhow::Result<()> {
    // Loop devices name their backing files by canonical path.
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    let fuse = dir.join("faultdisk").join(MOUNT_DIR);
    let image = fuse.join(IMAGE_NAME);
    let mut errors = Vec::new();
    // The filesystems; the server's own FUSE mount stays until its loop
    // devices are gone.
    for mount in mounted_under(&dir)?
        .iter()
        .filter(|m| !m.starts_with(&fuse))
    {
        if let Err(e) = sys::unmount(mount, true) {
            errors.push(format!("{e:#}"));
        }
    }
    for name in sys::loops_backed_by(&image)? {
        if let Err(e) = detach_holders(&name) {
            errors.push(format!("{e:#}"));
        }
        if let Err(e) = sys::detach_loop_device(&name, None) {
            errors.push(format!("{e:#}"));
        }
    }
    if let Err(e) = daemon::stop(state, DAEMON, Duration::from_secs(20)) {
        errors.push(format!("{e:#}"));
    }
    // A server that died leaves its FUSE mount (unanswered) behind.
    for mount in mounted_under(&dir)? {
        if let Err(e) = sys::unmount(&mount, true) {
            errors.push(format!("{e:#}"));
        }
    }
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", dir.display())),
    }
}

/// Detaches the loop devices whose backing file is the device node of loop
/// device `name`. The kubelet attaches one over each block volume it maps
/// into a pod (to keep the device from going away under the pod), and
/// detaches it when it unmaps the volume: a kubelet stopped with pods
/// running leaves them behind, unmounted paths that can no longer be told
/// by name, so they are found by the node's identity.
fn detach_holders(name: &str) -> anyhow::Result<()> {
    let node = sys::FileId::of(Path::new(&format!("/dev/{name}")))?;
    for other in all_loops()?.iter().filter(|o| *o != name) {
        if sys::detach_loop_device(other, Some(node))? {
            say(format!("detached /dev/{other}, left holding /dev/{name}"));
        }
    }
    Ok(())
}

fn all_loops() -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block").context("listing /sys/block")? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with("loop") {
            out.push(name);
        }
    }
    Ok(out)
}

/// The server, its loop devices and filesystems, as `status` shows them.
pub(super) fn status(state: &State, d: &Description) -> Vec<(String, bool, String)> {
    let mut out = Vec::new();
    let server = match daemon::running(state, DAEMON) {
        None => (false, "not running".to_string()),
        Some(pid) => match request(&d.control_socket, &Request::Stats) {
            Ok(r) => (
                true,
                format!(
                    "pid {pid}, {}, {} failures injected",
                    d.image.display(),
                    r.stats.map_or(0, |s| s.total_injected)
                ),
            ),
            Err(e) => (false, format!("pid {pid} does not answer: {e:#}")),
        },
    };
    out.push(("fault disk".to_string(), server.0, server.1));
    for v in &d.volumes {
        let attached = v
            .device
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .filter(|n| {
                sys::loop_backing_file(n).is_some_and(|b| b == d.image)
                    && loop_region(n).is_ok_and(|r| r == v.region)
            });
        let (ok, detail) = match attached {
            Some(_) => (
                true,
                format!(
                    "{} ({}) over image bytes [{}, {})",
                    v.device.display(),
                    v.maj_min,
                    v.region.offset,
                    v.region.offset + v.region.bytes
                ),
            ),
            None => (
                false,
                format!(
                    "{} is no longer attached over its stretch of {}",
                    v.device.display(),
                    d.image.display()
                ),
            ),
        };
        out.push((format!("fault disk volume {}", v.pv), ok, detail));
    }
    out
}
