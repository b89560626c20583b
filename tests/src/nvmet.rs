//! NVMe over Fabrics on one machine, for the VM tests (tests/guest/nvme_multipath.rs):
//! the kernel's NVMe target (nvmet, configured through configfs) serves one
//! namespace over TCP on loopback through several ports, and the host
//! connects one controller to each port through `/dev/nvme-fabrics` (no
//! nvme-cli). Native NVMe multipath (`nvme_core.multipath=Y`, Debian's
//! default) joins the controllers' namespaces into one head disk
//! (`nvme0n1`, bio-based) over hidden path disks (`nvme0c0n1`,
//! `nvme0c1n1`, one per controller).
//!
//! What the kernels show (Debian 6.1 and 5.10, measured):
//! - the path disks have no `dev` file, no `/sys/dev/block` link, no device
//!   node and are not in `/proc/partitions`; 6.1 lists them in
//!   `/proc/diskstats` with their numbers (259:0, 259:2 around the head's
//!   259:1), 5.10 lists them there as `0 0`;
//! - a failed request on a path is traced with the path disk's number;
//! - unlinking a port from the subsystem on the target makes that
//!   controller `connecting`; it reconnects if the port comes back within
//!   `ctrl_loss_tmo`, else it is removed with its path disk (5.10 shows
//!   `deleting (no IO)` on the way);
//! - with no path left, the head queues I/O ("no usable path - requeuing
//!   I/O") until the last controller is removed, then fails it ("no
//!   available path - failing I/O"). Debian's 5.10 oopses in nvme_tcp when
//!   that happens with I/O queued: tests bring a port back in time.
//!
//! Nothing here skips: a missing module or tool is an error naming it. The
//! handle disconnects its controllers and removes the target on drop.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::cmd;
use crate::devices::{modprobe, BlockDev};
use crate::sys;

const CONFIGFS: &str = "/sys/kernel/config";
const NVMET: &str = "/sys/kernel/config/nvmet";
const FABRICS_DEV: &str = "/dev/nvme-fabrics";

/// The host's identity for every connection (both paths must share it for
/// the controllers to join one subsystem).
pub const HOST_ID: &str = "da7a0000-0000-4000-8000-0000000e0e0e";

pub fn host_nqn() -> String {
    format!("nqn.2014-08.org.nvmexpress:uuid:{HOST_ID}")
}

/// How the host treats a lost connection (nvme-cli's `--ctrl-loss-tmo`,
/// `--reconnect-delay`).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// Seconds a controller keeps reconnecting before it is removed.
    pub ctrl_loss_tmo: u32,
    /// Seconds between reconnection attempts.
    pub reconnect_delay: u32,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            ctrl_loss_tmo: 5,
            reconnect_delay: 1,
        }
    }
}

/// One hidden path disk of the head.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathDisk {
    /// `nvme0c1n1`.
    pub name: String,
    /// Its `MAJ:MIN` from `/proc/diskstats`; `None` where the kernel lists
    /// it as `0:0` there (5.10).
    pub maj_min: Option<String>,
    /// The controller it belongs to (`nvme1`).
    pub ctrl: String,
}

/// The nvmet side: a subsystem with namespace 1 and its ports. Removed on
/// drop, whatever was made of it.
struct Target {
    nqn: String,
    ports: Vec<u16>,
    namespace: bool,
}

impl Target {
    fn subsys_dir(&self) -> PathBuf {
        Path::new(NVMET).join("subsystems").join(&self.nqn)
    }

    fn port_dir(port: u16) -> PathBuf {
        Path::new(NVMET).join("ports").join(port.to_string())
    }

    fn link(&self, port: u16) -> PathBuf {
        Self::port_dir(port).join("subsystems").join(&self.nqn)
    }

    fn create(nqn: &str, backend: &Path, ports: &[u16]) -> Result<Target> {
        let mut me = Target {
            nqn: nqn.to_string(),
            ports: Vec::new(),
            namespace: false,
        };
        let subsys = me.subsys_dir();
        if subsys.exists() {
            bail!("the nvmet subsystem {nqn} exists already: another test's target is still there");
        }
        mkdir(&subsys)?;
        write(&subsys.join("attr_allow_any_host"), "1")?;
        let ns = subsys.join("namespaces/1");
        mkdir(&ns)?;
        me.namespace = true;
        write(&ns.join("device_path"), &backend.to_string_lossy())?;
        write(&ns.join("enable"), "1")?;
        for &port in ports {
            let dir = Self::port_dir(port);
            if dir.exists() {
                bail!("the nvmet port {port} exists already: another test's target is still there");
            }
            mkdir(&dir)?;
            me.ports.push(port);
            write(&dir.join("addr_trtype"), "tcp")?;
            write(&dir.join("addr_adrfam"), "ipv4")?;
            write(&dir.join("addr_traddr"), "127.0.0.1")?;
            write(&dir.join("addr_trsvcid"), &port.to_string())?;
            me.link_port(port)?;
        }
        Ok(me)
    }

    fn link_port(&self, port: u16) -> Result<()> {
        let link = self.link(port);
        std::os::unix::fs::symlink(self.subsys_dir(), &link)
            .with_context(|| format!("linking {} into port {port}", self.nqn))
    }

    fn unlink_port(&self, port: u16) -> Result<()> {
        let link = self.link(port);
        std::fs::remove_file(&link).with_context(|| format!("rm {}", link.display()))
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let quiet = |r: std::io::Result<()>, what: &Path| {
            if let Err(e) = r {
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("nvmet cleanup of {}: {e}", what.display());
                }
            }
        };
        for &port in &self.ports {
            let link = self.link(port);
            quiet(std::fs::remove_file(&link), &link);
            let dir = Self::port_dir(port);
            quiet(std::fs::remove_dir(&dir), &dir);
        }
        let subsys = self.subsys_dir();
        if self.namespace {
            let ns = subsys.join("namespaces/1");
            quiet(std::fs::write(ns.join("enable"), "0"), &ns);
            quiet(std::fs::remove_dir(&ns), &ns);
        }
        quiet(std::fs::remove_dir(&subsys), &subsys);
    }
}

/// A target over `backend` and the host connected to each of its ports:
/// one head disk over one path per port. Drop disconnects every controller
/// of the subsystem, waits for the head to go, then removes the target.
pub struct NvmeOf {
    pub nqn: String,
    pub head: BlockDev,
    pub timeouts: Timeouts,
    target: Target,
}

impl NvmeOf {
    /// Loads the modules, brings loopback up, makes the target (subsystem
    /// `nqn.2024-01.io.volume-health:<name>`) and connects one controller
    /// per port (e.g. 4420, 4421).
    pub fn start(name: &str, backend: &Path, ports: &[u16], timeouts: Timeouts) -> Result<NvmeOf> {
        prepare()?;
        let nqn = format!("nqn.2024-01.io.volume-health:{name}");
        let target = Target::create(&nqn, backend, ports)?;
        let mut me = NvmeOf {
            nqn,
            head: BlockDev {
                name: String::new(),
                maj_min: String::new(),
                path: PathBuf::new(),
            },
            timeouts,
            target,
        };
        for &port in ports {
            me.connect(port)?;
        }
        let mut head = None;
        sys::wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
            head = me.head_name().filter(|h| {
                sys::read_sysfs(format!("/sys/class/block/{h}/size"))
                    .map(|s| s != "0")
                    .unwrap_or(false)
            });
            head.is_some()
        });
        let head = head.with_context(|| {
            format!(
                "connected to {} on ports {ports:?}, but no head disk with a size appeared \
                 within 30 s (is nvme_core.multipath off?)",
                me.nqn
            )
        })?;
        me.head = BlockDev::of(&head)?;
        let want = ports.len();
        let mut paths = Vec::new();
        sys::wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
            paths = me.paths().unwrap_or_default();
            paths.len() == want
        });
        if paths.len() != want {
            bail!(
                "{} has {} path disks ({paths:?}), expected {want}",
                me.head.name,
                paths.len()
            );
        }
        Ok(me)
    }

    /// Connects the host to `port` through `/dev/nvme-fabrics`; returns
    /// the new controller (`nvme1`).
    pub fn connect(&self, port: u16) -> Result<String> {
        let opts = format!(
            "transport=tcp,traddr=127.0.0.1,trsvcid={port},nqn={},hostnqn={},hostid={HOST_ID},\
             ctrl_loss_tmo={},reconnect_delay={}",
            self.nqn,
            host_nqn(),
            self.timeouts.ctrl_loss_tmo,
            self.timeouts.reconnect_delay
        );
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(FABRICS_DEV)
            .with_context(|| format!("opening {FABRICS_DEV}"))?;
        // The kernel takes the options in one write.
        let n = f
            .write(opts.as_bytes())
            .with_context(|| format!("connecting: writing {opts:?} to {FABRICS_DEV}"))?;
        if n != opts.len() {
            bail!("{FABRICS_DEV} took {n} of {} bytes", opts.len());
        }
        let mut reply = String::new();
        f.read_to_string(&mut reply)
            .context("reading the new controller from /dev/nvme-fabrics")?;
        // "instance=1,cntlid=2"
        let instance = reply
            .trim()
            .split(',')
            .find_map(|kv| kv.strip_prefix("instance="))
            .with_context(|| format!("no instance in {reply:?}"))?;
        Ok(format!("nvme{instance}"))
    }

    /// The head disk's name, from the subsystem's sysfs directory.
    fn head_name(&self) -> Option<String> {
        let subsys = self.subsystem_dir()?;
        std::fs::read_dir(subsys)
            .ok()?
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .find(|n| is_head_name(n))
    }

    /// `/sys/class/nvme-subsystem/nvme-subsysN` of this target's NQN.
    pub fn subsystem_dir(&self) -> Option<PathBuf> {
        std::fs::read_dir("/sys/class/nvme-subsystem")
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                sys::read_sysfs(p.join("subsysnqn"))
                    .map(|n| n == self.nqn)
                    .unwrap_or(false)
            })
    }

    /// The host's controllers of this subsystem now: (name, port).
    pub fn controllers(&self) -> Vec<(String, u16)> {
        let mut out = Vec::new();
        for e in std::fs::read_dir("/sys/class/nvme")
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = e.path();
            if sys::read_sysfs(dir.join("subsysnqn")).ok().as_deref() != Some(self.nqn.as_str()) {
                continue;
            }
            let port = sys::read_sysfs(dir.join("address"))
                .ok()
                .and_then(|a| {
                    a.split(',')
                        .find_map(|kv| kv.strip_prefix("trsvcid=").map(str::to_string))
                })
                .and_then(|p| p.parse().ok());
            if let Some(port) = port {
                out.push((e.file_name().to_string_lossy().into_owned(), port));
            }
        }
        out.sort();
        out
    }

    /// The controller connected to `port`, if there is one.
    pub fn controller_of(&self, port: u16) -> Option<String> {
        self.controllers()
            .into_iter()
            .find(|(_, p)| *p == port)
            .map(|(c, _)| c)
    }

    /// The `state` of the controller on `port` (`live`, `connecting`,
    /// `deleting`, `deleting (no IO)`, ...); `None` once it is removed.
    pub fn ctrl_state(&self, port: u16) -> Option<String> {
        let ctrl = self.controller_of(port)?;
        sys::read_sysfs(format!("/sys/class/nvme/{ctrl}/state")).ok()
    }

    /// Waits until the state of the controller on `port` satisfies `cond`
    /// (`None`: removed); returns whether it did within `timeout`.
    pub fn wait_ctrl_state(
        &self,
        port: u16,
        timeout: Duration,
        cond: impl Fn(Option<&str>) -> bool,
    ) -> bool {
        sys::wait_for(timeout, Duration::from_millis(20), || {
            cond(self.ctrl_state(port).as_deref())
        })
    }

    /// The head's path disks now, one per controller still there.
    pub fn paths(&self) -> Result<Vec<PathDisk>> {
        let stats = diskstats_numbers()?;
        let mut out = Vec::new();
        for (ctrl, _) in self.controllers() {
            let dir = Path::new("/sys/class/nvme").join(&ctrl);
            for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                if !is_path_name(&name) {
                    continue;
                }
                let maj_min = stats
                    .iter()
                    .find(|(n, _)| *n == name)
                    .and_then(|(_, mm)| (mm != "0:0").then(|| mm.clone()));
                out.push(PathDisk {
                    name,
                    maj_min,
                    ctrl: ctrl.clone(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The path disk of the controller on `port`.
    pub fn path_of(&self, port: u16) -> Result<PathDisk> {
        let ctrl = self
            .controller_of(port)
            .with_context(|| format!("no controller on port {port}"))?;
        self.paths()?
            .into_iter()
            .find(|p| p.ctrl == ctrl)
            .with_context(|| format!("controller {ctrl} has no path disk"))
    }

    /// Takes `port` away from the subsystem on the target: the target drops
    /// that controller's connection, and the host's reconnection attempts
    /// are refused.
    pub fn unlink_port(&self, port: u16) -> Result<()> {
        self.target.unlink_port(port)
    }

    /// Gives `port` back to the subsystem: a controller still reconnecting
    /// comes back by itself; a removed one needs [`NvmeOf::connect`].
    pub fn link_port(&self, port: u16) -> Result<()> {
        self.target.link_port(port)
    }

    /// The ANA state the target reports for its namespace through `port`
    /// (`optimized`, `non-optimized`, `inaccessible`, ...): the host's path
    /// disk on that port shows it in `ana_state` after an ANA change event.
    pub fn set_ana_state(&self, port: u16, state: &str) -> Result<()> {
        write(
            &Target::port_dir(port).join("ana_groups/1/ana_state"),
            state,
        )
    }
}

impl Drop for NvmeOf {
    fn drop(&mut self) {
        for (ctrl, _) in self.controllers() {
            let p = format!("/sys/class/nvme/{ctrl}/delete_controller");
            if let Err(e) = std::fs::write(&p, "1") {
                // Already on its way out.
                if e.kind() != std::io::ErrorKind::NotFound {
                    eprintln!("NvmeOf cleanup: writing 1 to {p}: {e}");
                }
            }
        }
        let gone = sys::wait_for(Duration::from_secs(20), Duration::from_millis(50), || {
            self.controllers().is_empty()
                && (self.head.name.is_empty()
                    || !Path::new("/sys/class/block").join(&self.head.name).exists())
        });
        if !gone {
            eprintln!(
                "NvmeOf cleanup: controllers {:?} of {} still there after 20 s",
                self.controllers(),
                self.nqn
            );
        }
        // The node was made by hand where devtmpfs did not; a stale one
        // would point the next test at the wrong disk.
        if !self.head.name.is_empty()
            && !Path::new("/sys/class/block").join(&self.head.name).exists()
        {
            let _ = std::fs::remove_file(&self.head.path);
        }
        // Then `target` drops: ports, namespace, subsystem.
    }
}

/// `nvme0n1`: a head (or plain namespace) disk, not a path (`nvme0c1n1`)
/// nor a partition (`nvme0n1p1`).
fn is_head_name(n: &str) -> bool {
    let Some(rest) = n.strip_prefix("nvme") else {
        return false;
    };
    let Some((a, b)) = rest.split_once('n') else {
        return false;
    };
    !a.is_empty()
        && a.bytes().all(|c| c.is_ascii_digit())
        && !b.is_empty()
        && b.bytes().all(|c| c.is_ascii_digit())
}

/// `nvme0c1n1`.
fn is_path_name(n: &str) -> bool {
    let Some(rest) = n.strip_prefix("nvme") else {
        return false;
    };
    let Some((s, rest)) = rest.split_once('c') else {
        return false;
    };
    let Some((c, ns)) = rest.split_once('n') else {
        return false;
    };
    [s, c, ns]
        .iter()
        .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// (name, "MAJ:MIN") of every line of `/proc/diskstats`.
pub fn diskstats_numbers() -> Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string("/proc/diskstats").context("reading /proc/diskstats")?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (major, minor, name) = (f.next()?, f.next()?, f.next()?);
            Some((name.to_string(), format!("{major}:{minor}")))
        })
        .collect())
}

/// Reads completed on `name`, from `/proc/diskstats` (where the path disks
/// are, though they have no `stat`-bearing `dev`).
pub fn diskstats_reads(name: &str) -> Result<u64> {
    let text = std::fs::read_to_string("/proc/diskstats").context("reading /proc/diskstats")?;
    for l in text.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(2) == Some(&name) {
            return f
                .get(3)
                .and_then(|v| v.parse().ok())
                .with_context(|| format!("bad /proc/diskstats line {l:?}"));
        }
    }
    bail!("{name} is not in /proc/diskstats")
}

/// Modules, native multipath, configfs, loopback and `/dev/nvme-fabrics`.
fn prepare() -> Result<()> {
    for m in ["nvmet", "nvmet-tcp", "nvme-tcp"] {
        modprobe(m, &[])?;
    }
    let multipath = sys::read_sysfs("/sys/module/nvme_core/parameters/multipath")
        .context("nvme_core has no multipath parameter (CONFIG_NVME_MULTIPATH is off)")?;
    if multipath != "Y" {
        bail!("nvme_core.multipath is {multipath}: native NVMe multipath is off on this kernel");
    }
    if !Path::new(NVMET).is_dir() {
        let mounted = sys::mountinfo()?.iter().any(|m| m.fstype == "configfs");
        if !mounted {
            cmd::run("mount", &["-t", "configfs", "configfs", CONFIGFS])
                .context("mounting configfs for nvmet")?;
        }
        if !Path::new(NVMET).is_dir() {
            bail!("{NVMET} is missing with nvmet loaded and configfs mounted");
        }
    }
    // The guests of `cargo xtask vm` have no network: loopback is down.
    cmd::run("ip", &["link", "set", "lo", "up"])
        .context("bringing loopback up (package iproute2)")?;
    if !Path::new(FABRICS_DEV).exists() {
        let mm = sys::read_sysfs("/sys/class/misc/nvme-fabrics/dev")?;
        let (major, minor) = sys::parse_maj_min(&mm)?;
        nix::sys::stat::mknod(
            FABRICS_DEV,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            libc::makedev(major, minor),
        )
        .with_context(|| format!("mknod {FABRICS_DEV} c {mm}"))?;
    }
    Ok(())
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir(p).with_context(|| format!("mkdir {}", p.display()))
}

fn write(p: &Path, value: &str) -> Result<()> {
    std::fs::write(p, value).with_context(|| format!("writing {value} to {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_head_name("nvme0n1"));
        assert!(is_head_name("nvme12n3"));
        assert!(!is_head_name("nvme0c1n1"));
        assert!(!is_head_name("nvme0n1p1"));
        assert!(!is_head_name("nvme0"));
        assert!(is_path_name("nvme0c1n1"));
        assert!(!is_path_name("nvme0n1"));
        assert!(!is_path_name("nvme0c1n1p2"));
    }
}
