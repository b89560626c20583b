//! iSCSI on one machine, for the VM tests (tests/guest/iscsi.rs): the kernel's LIO
//! target (configfs, `iscsi_target_mod`, `target_core_iblock`) exports a
//! backend block device over TCP on 127.0.0.1, and the open-iscsi initiator
//! (`iscsid` and `iscsiadm`, run here) logs in to it: a SCSI disk `sdX` whose
//! every request crosses a real iSCSI session.
//!
//! The backend is a device-mapper device over a loop device over a sparse
//! file in `$TMPDIR` (the VM's scratch ext4, which offers what the sd disk
//! passes down: write-zeroes included), so a test can fail part of it by
//! swapping its table ([`Backend::fail_range`]).
//!
//! What Debian's 6.1 shows (measured, replacement_timeout 10 s, NOP-Out
//! every 2 s with a 2 s timeout):
//! - a backend bio that fails (dm `error`) comes back to the initiator as
//!   CHECK CONDITION, sense key Not Ready, "Logical unit communication
//!   failure" (08/00): one `block_rq_error` on the sd disk with -EIO per
//!   failed read (`8,0 RS () 81920 + 8 [-5]`), EIO for the application; the
//!   failed bio under the target is also seen on the backend's dm device
//!   (`block_bio_complete`);
//! - with loopback down, the session's NOP-Out ping times out after ~4 s
//!   ("ping timeout of 2 secs expired", "detected conn error (1022)"): the
//!   session goes `FAILED` and the disk's `device/state` `blocked` (same
//!   poll, or up to 0.4 s later); I/O waits. After `replacement_timeout`
//!   ("session recovery timed out after 10 secs") the session is `FREE`,
//!   the disk `transport-offline`, the waiting request fails once with EIO
//!   ("rejecting I/O to offline device", one `block_rq_error`, ~14 s after
//!   loopback went down), later reads through an open descriptor fail at
//!   once with EIO (each one failed request), and every new open of the
//!   disk fails with ENXIO;
//! - iscsid keeps reconnecting: with loopback up again, the session is
//!   `LOGGED_IN` and the disk `running` within 1-1.5 s, no new login needed.
//!
//! Gotchas: iscsid must not share the test's process group (stopped in the
//! foreground, it was seen to take its shell down with it), so it gets one
//! of its own. The initiator's state directories are tmpfs mounts made here.
//!
//! Nothing here skips: a missing module or tool is an error naming it. Every
//! handle tears its part down on drop (logout, iscsid stopped, configfs
//! entries removed, dm device and loop device removed, loopback back up).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tempfile::TempDir;

use crate::cmd;
use crate::devices::{modprobe, BlockDev, DmDevice};
use crate::fs::Mount;
use crate::sys;

const CONFIGFS: &str = "/sys/kernel/config";
const TARGET: &str = "/sys/kernel/config/target";

/// The portal everything uses.
pub const PORTAL_ADDR: &str = "127.0.0.1";
pub const PORTAL_PORT: u16 = 3260;

/// The initiator's name (with generated node ACLs any name is let in).
pub const INITIATOR_NAME: &str = "iqn.2005-03.org.open-iscsi:volume-health-tests";

/// Kernel modules of both ends.
pub const MODULES: &[&str] = &[
    "target_core_mod",
    "target_core_iblock",
    "iscsi_target_mod",
    "scsi_transport_iscsi",
    "iscsi_tcp",
    "sd_mod",
    "dm-mod",
];

/// Tools the stack runs, with the Debian packages that ship them.
pub const TOOLS: &[(&str, &str)] = &[
    ("iscsid", "open-iscsi"),
    ("iscsiadm", "open-iscsi"),
    ("ip", "iproute2"),
    ("dmsetup", "dmsetup"),
    ("losetup", "mount"),
    ("mkfs.ext4", "e2fsprogs"),
];

/// Fails naming every missing tool and its package.
pub fn require_tools() -> Result<()> {
    let missing: Vec<String> = TOOLS
        .iter()
        .filter(|(t, _)| cmd::find_tool(t).is_err())
        .map(|(t, p)| format!("`{t}` (Debian package {p})"))
        .collect();
    if !missing.is_empty() {
        bail!(
            "the iSCSI tests need {}: install them on the host (the VM uses the host's /usr; \
             `cargo xtask vm` installs open-iscsi)",
            missing.join(", ")
        );
    }
    Ok(())
}

/// Modules, configfs, loopback up.
pub fn prepare() -> Result<()> {
    require_tools()?;
    // A module in Debian's kernels, mounted by nobody in the VM.
    modprobe("configfs", &[])?;
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    if !mounts.contains(&format!(" {CONFIGFS} configfs ")) {
        cmd::run("mount", &["-t", "configfs", "configfs", CONFIGFS])
            .context("mounting configfs")?;
    }
    for m in MODULES {
        modprobe(m, &[])?;
    }
    if !Path::new(TARGET).is_dir() {
        bail!("{TARGET} is missing after loading target_core_mod");
    }
    loopback_up()
}

/// `ip link set lo up`.
pub fn loopback_up() -> Result<()> {
    cmd::run("ip", &["link", "set", "lo", "up"]).context("bringing loopback up")?;
    Ok(())
}

/// Loopback taken down; up again on drop (or [`LoopbackDown::up`]), so a
/// failed test never leaves the machine without it.
pub struct LoopbackDown {
    up: bool,
}

impl LoopbackDown {
    /// `ip link set lo down`: every TCP connection on 127.0.0.1 goes quiet
    /// (no reset: the peers notice by their own timers).
    pub fn take_down() -> Result<LoopbackDown> {
        cmd::run("ip", &["link", "set", "lo", "down"]).context("taking loopback down")?;
        Ok(LoopbackDown { up: false })
    }

    pub fn up(mut self) -> Result<()> {
        self.up = true;
        loopback_up()
    }
}

impl Drop for LoopbackDown {
    fn drop(&mut self) {
        if !self.up {
            if let Err(e) = loopback_up() {
                eprintln!("LoopbackDown cleanup: {e:#}");
            }
        }
    }
}

fn write(p: &Path, value: &str) -> Result<()> {
    std::fs::write(p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
}

fn mkdir(p: &Path) -> Result<()> {
    std::fs::create_dir(p).with_context(|| format!("mkdir {}", p.display()))
}

// ---------------------------------------------------------------------------------------
// Backend

/// A loop device over a sparse file in `$TMPDIR`; detached on drop.
pub struct FileLoop {
    pub dev: BlockDev,
    _dir: TempDir,
}

impl FileLoop {
    pub fn new(size_mb: u64) -> Result<FileLoop> {
        let dir = tempfile::Builder::new()
            .prefix("health-iscsi-backend-")
            .tempdir()?;
        let img = dir.path().join("backend.img");
        File::create(&img)?.set_len(size_mb << 20)?;
        let out = cmd::run("losetup", &["-f", "--show", &img.to_string_lossy()])?;
        let path = out.stdout.trim().to_string();
        let name = path.trim_start_matches("/dev/").to_string();
        let dev = match BlockDev::of(&name) {
            Ok(dev) => dev,
            Err(e) => {
                let _ = cmd::run("losetup", &["-d", &path]);
                return Err(e);
            }
        };
        Ok(FileLoop { dev, _dir: dir })
    }
}

impl Drop for FileLoop {
    fn drop(&mut self) {
        let path = self.dev.path.display().to_string();
        if let Err(e) = cmd::run("losetup", &["-d", &path]) {
            eprintln!("FileLoop cleanup of {path}: {e:#}");
        }
    }
}

/// dm-linear over a [`FileLoop`]; the table can be swapped to fail ranges.
pub struct Backend {
    // The dm device before the loop device under it.
    pub dm: DmDevice,
    pub lo: FileLoop,
    sectors: u64,
}

impl Backend {
    pub fn new(name: &str, size_mb: u64) -> Result<Backend> {
        let lo = FileLoop::new(size_mb)?;
        let sectors = lo.dev.sectors()?;
        let dm = DmDevice::create(
            name,
            &format!("0 {sectors} linear {} 0", lo.dev.path.display()),
        )?;
        Ok(Backend { dm, lo, sectors })
    }

    /// The node LIO opens.
    pub fn path(&self) -> PathBuf {
        self.dm.mapper_path()
    }

    /// Fails `count` sectors from `start` (dm `error` there, linear
    /// elsewhere): suspend without flushing, load, resume (no udev).
    pub fn fail_range(&self, start: u64, count: u64) -> Result<()> {
        let lo = self.lo.dev.path.display();
        let end = start + count;
        let mut table = String::new();
        if start > 0 {
            table.push_str(&format!("0 {start} linear {lo} 0\n"));
        }
        table.push_str(&format!("{start} {count} error\n"));
        if end < self.sectors {
            table.push_str(&format!("{end} {} linear {lo} {end}\n", self.sectors - end));
        }
        self.dm.replace_table(table.trim_end())
    }

    /// All linear again.
    pub fn heal(&self) -> Result<()> {
        self.dm.replace_table(&format!(
            "0 {} linear {} 0",
            self.sectors,
            self.lo.dev.path.display()
        ))
    }
}

// ---------------------------------------------------------------------------------------
// LIO target

/// One LIO iSCSI target: an iblock backstore over a block device, one TPG
/// with LUN 0 and a portal on 127.0.0.1:3260, no authentication, generated
/// node ACLs. Removed from configfs on drop (log the initiator out first).
pub struct LioTarget {
    pub iqn: String,
    hba: PathBuf,
    backstore: PathBuf,
    tpg: PathBuf,
    made: Vec<PathBuf>,
}

impl LioTarget {
    pub fn create(iqn: &str, backend: &Path) -> Result<LioTarget> {
        let target = Path::new(TARGET);
        // A free iblock HBA index.
        let index = (0..1000)
            .find(|i| !target.join(format!("core/iblock_{i}")).exists())
            .context("no free iblock HBA index")?;
        let hba = target.join(format!("core/iblock_{index}"));
        let backstore = hba.join("health");
        let iscsi = target.join("iscsi");
        let tpg = iscsi.join(iqn).join("tpgt_1");
        let mut me = LioTarget {
            iqn: iqn.to_string(),
            hba: hba.clone(),
            backstore: backstore.clone(),
            tpg: tpg.clone(),
            made: Vec::new(),
        };
        mkdir(&hba)?;
        me.made.push(hba.clone());
        mkdir(&backstore)?;
        me.made.push(backstore.clone());
        write(
            &backstore.join("control"),
            &format!("udev_path={}", backend.display()),
        )?;
        write(&backstore.join("enable"), "1")?;
        if !iscsi.is_dir() {
            // Registers the iSCSI fabric (iscsi_target_mod).
            mkdir(&iscsi)?;
        }
        mkdir(&iscsi.join(iqn))?;
        me.made.push(iscsi.join(iqn));
        mkdir(&tpg)?;
        me.made.push(tpg.clone());
        let lun = tpg.join("lun/lun_0");
        mkdir(&lun)?;
        me.made.push(lun.clone());
        std::os::unix::fs::symlink(&backstore, lun.join("health"))
            .with_context(|| format!("linking {} into {}", backstore.display(), lun.display()))?;
        me.made.push(lun.join("health"));
        let np = tpg.join(format!("np/{PORTAL_ADDR}:{PORTAL_PORT}"));
        mkdir(&np)?;
        me.made.push(np);
        let attrib = tpg.join("attrib");
        write(&attrib.join("authentication"), "0")?;
        write(&attrib.join("generate_node_acls"), "1")?;
        write(&attrib.join("demo_mode_write_protect"), "0")?;
        write(&attrib.join("cache_dynamic_acls"), "1")?;
        write(&tpg.join("enable"), "1")?;
        Ok(me)
    }

    /// The backstore's configfs directory.
    pub fn backstore(&self) -> &Path {
        &self.backstore
    }
}

impl Drop for LioTarget {
    fn drop(&mut self) {
        let _ = std::fs::write(self.tpg.join("enable"), "0");
        // Reverse order of making: link, portal, LUN, TPG, target, backstore, HBA.
        while let Some(p) = self.made.pop() {
            let res = if p.is_symlink() {
                std::fs::remove_file(&p)
            } else {
                std::fs::remove_dir(&p)
            };
            if let Err(e) = res {
                eprintln!("LioTarget cleanup of {}: {e}", p.display());
            }
        }
        if self.hba.exists() {
            eprintln!("LioTarget cleanup: {} is still there", self.hba.display());
        }
    }
}

// ---------------------------------------------------------------------------------------
// open-iscsi initiator

/// How the initiator treats a lost connection (`iscsid.conf`).
#[derive(Clone, Copy, Debug)]
pub struct Timeouts {
    /// `node.session.timeo.replacement_timeout`: seconds I/O waits for the
    /// session to come back before it fails (the disk goes
    /// `transport-offline`).
    pub replacement_timeout: u32,
    /// `node.conn[0].timeo.noop_out_interval` and `noop_out_timeout`: how a
    /// silent connection is found dead.
    pub noop_out_interval: u32,
    pub noop_out_timeout: u32,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            replacement_timeout: 10,
            noop_out_interval: 2,
            noop_out_timeout: 2,
        }
    }
}

/// `iscsid -f` with its own configuration (tmpfs over /etc/iscsi and
/// /var/lib/iscsi), in a process group of its own. Logs out of every target
/// it logged in to and stops on drop.
pub struct Initiator {
    iscsid: Option<Child>,
    log: PathBuf,
    logged_in: Vec<String>,
    // Unmounted last, after iscsid is gone.
    mounts: Vec<Mount>,
    _work: TempDir,
    pub timeouts: Timeouts,
}

impl Initiator {
    pub fn start(timeouts: Timeouts) -> Result<Initiator> {
        let work = tempfile::Builder::new()
            .prefix("health-iscsid-")
            .tempdir()?;
        let log = work.path().join("iscsid.log");
        let mut me = Initiator {
            iscsid: None,
            log: log.clone(),
            logged_in: Vec::new(),
            mounts: Vec::new(),
            _work: work,
            timeouts,
        };
        for dir in ["/etc/iscsi", "/var/lib/iscsi"] {
            std::fs::create_dir_all(dir).with_context(|| format!("mkdir -p {dir}"))?;
            me.mounts
                .push(Mount::at("tmpfs", dir, "tmpfs", "mode=0700,size=16m")?);
        }
        std::fs::create_dir_all("/run/lock/iscsi").context("mkdir -p /run/lock/iscsi")?;
        write(
            Path::new("/etc/iscsi/initiatorname.iscsi"),
            &format!("InitiatorName={INITIATOR_NAME}\n"),
        )?;
        write(
            Path::new("/etc/iscsi/iscsid.conf"),
            &format!(
                "node.startup = manual\n\
                 node.session.timeo.replacement_timeout = {}\n\
                 node.conn[0].timeo.noop_out_interval = {}\n\
                 node.conn[0].timeo.noop_out_timeout = {}\n\
                 node.conn[0].timeo.login_timeout = 5\n\
                 node.session.initial_login_retry_max = 2\n",
                timeouts.replacement_timeout, timeouts.noop_out_interval, timeouts.noop_out_timeout
            ),
        )?;
        let bin = cmd::find_tool("iscsid")?;
        let out = File::create(&log)?;
        let child = Command::new(&bin)
            .args(["-f", "-c", "/etc/iscsi/iscsid.conf"])
            .args(["-i", "/etc/iscsi/initiatorname.iscsi"])
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            // Its own group: iscsid stopping in the foreground signals its
            // process group.
            .process_group(0)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        me.iscsid = Some(child);
        // Ready once iscsiadm reaches it ("No active sessions" is exit 21).
        let start = Instant::now();
        loop {
            let out = Command::new(cmd::find_tool("iscsiadm")?)
                .args(["-m", "session"])
                .stdin(Stdio::null())
                .output()?;
            let text = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            if out.status.success() || text.contains("No active sessions") {
                break;
            }
            if let Some(status) = me.iscsid.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!("iscsid exited ({status}): {}", me.log_text());
            }
            if start.elapsed() > Duration::from_secs(20) {
                bail!(
                    "iscsid did not answer within 20 s: {} / {}",
                    text.trim(),
                    me.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(me)
    }

    /// What iscsid printed.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn iscsiadm(&self, args: &[&str]) -> Result<cmd::Output> {
        cmd::run_timeout("iscsiadm", args, Duration::from_secs(60))
            .with_context(|| format!("iscsid said: {}", cmd::first_lines(&self.log_text())))
    }

    /// SendTargets discovery on the portal, then login to `iqn`.
    pub fn login(&mut self, iqn: &str) -> Result<()> {
        let portal = format!("{PORTAL_ADDR}:{PORTAL_PORT}");
        let found = self.iscsiadm(&["-m", "discovery", "-t", "st", "-p", &portal])?;
        if !found.stdout.contains(iqn) {
            bail!("discovery on {portal} did not list {iqn}: {}", found.stdout);
        }
        self.iscsiadm(&["-m", "node", "-T", iqn, "-p", &portal, "--login"])?;
        self.logged_in.push(iqn.to_string());
        Ok(())
    }

    pub fn logout(&mut self, iqn: &str) -> Result<()> {
        let portal = format!("{PORTAL_ADDR}:{PORTAL_PORT}");
        self.logged_in.retain(|t| t != iqn);
        self.iscsiadm(&["-m", "node", "-T", iqn, "-p", &portal, "--logout"])?;
        Ok(())
    }
}

impl Drop for Initiator {
    fn drop(&mut self) {
        for iqn in std::mem::take(&mut self.logged_in) {
            let portal = format!("{PORTAL_ADDR}:{PORTAL_PORT}");
            if let Err(e) = cmd::run_timeout(
                "iscsiadm",
                &["-m", "node", "-T", &iqn, "-p", &portal, "--logout"],
                Duration::from_secs(60),
            ) {
                eprintln!("Initiator cleanup: logout of {iqn}: {e:#}");
            }
        }
        if let Some(mut child) = self.iscsid.take() {
            // SIGTERM to iscsid alone (its own group), then SIGKILL.
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let stopped = sys::wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
                child.try_wait().ok().flatten().is_some()
            });
            if !stopped {
                eprintln!("Initiator cleanup: iscsid ignored SIGTERM; killing it");
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        while let Some(m) = self.mounts.pop() {
            drop(m);
        }
    }
}

/// `/sys/class/iscsi_session/sessionN` of the session to `iqn`, if any.
pub fn session_of(iqn: &str) -> Option<PathBuf> {
    let dir = std::fs::read_dir("/sys/class/iscsi_session").ok()?;
    dir.flatten().map(|e| e.path()).find(|p| {
        sys::read_sysfs(p.join("targetname"))
            .map(|t| t == iqn)
            .unwrap_or(false)
    })
}

/// The sd disk of a session (`session*/device/target*/*/block/sdX`).
fn session_disk(session: &Path) -> Option<String> {
    for t in std::fs::read_dir(session.join("device")).ok()?.flatten() {
        if !t.file_name().to_string_lossy().starts_with("target") {
            continue;
        }
        for lun in std::fs::read_dir(t.path()).ok()?.flatten() {
            if let Ok(mut blocks) = std::fs::read_dir(lun.path().join("block")) {
                if let Some(Ok(b)) = blocks.next() {
                    return Some(b.file_name().to_string_lossy().into_owned());
                }
            }
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// The whole stack

/// Backend → LIO target → iSCSI session over loopback → sd disk.
pub struct IscsiStack {
    /// The initiator's disk (`sdX`).
    pub disk: BlockDev,
    /// `/sys/class/iscsi_session/sessionN`.
    pub session: PathBuf,
    // Dropped in this order: logout and iscsid first, then the target, then
    // the backend.
    pub initiator: Initiator,
    pub target: LioTarget,
    pub backend: Backend,
}

impl IscsiStack {
    /// A backend of `size_mb` MiB exported as `iqn.2003-01.org.linux-iscsi.health:<name>`
    /// and logged in to.
    pub fn start(name: &str, size_mb: u64, timeouts: Timeouts) -> Result<IscsiStack> {
        prepare()?;
        let iqn = format!("iqn.2003-01.org.linux-iscsi.health:{name}");
        if session_of(&iqn).is_some() {
            bail!("a session to {iqn} exists already: another test's stack is still there");
        }
        let backend = Backend::new(&format!("health-iscsi-{name}"), size_mb)?;
        let target = LioTarget::create(&iqn, &backend.path())?;
        let mut initiator = Initiator::start(timeouts)?;
        initiator.login(&iqn)?;
        let mut found = None;
        sys::wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
            found = session_of(&iqn).and_then(|s| session_disk(&s).map(|d| (s, d)));
            found.is_some()
        });
        let (session, disk) = found.with_context(|| {
            format!(
                "logged in to {iqn} but no sd disk under its session within 30 s; iscsid: {}",
                initiator.log_text()
            )
        })?;
        let disk = BlockDev::of(&disk)?;
        Ok(IscsiStack {
            disk,
            session,
            initiator,
            target,
            backend,
        })
    }

    /// `/sys/block/sdX/device/state` (`running`, `blocked`,
    /// `transport-offline`, ...).
    pub fn device_state(&self) -> String {
        sys::read_sysfs(format!("/sys/block/{}/device/state", self.disk.name))
            .unwrap_or_else(|e| format!("<{e:#}>"))
    }

    /// The session's `state` (`LOGGED_IN`, `FAILED`, `FREE`).
    pub fn session_state(&self) -> String {
        sys::read_sysfs(self.session.join("state")).unwrap_or_else(|e| format!("<{e:#}>"))
    }
}

// ---------------------------------------------------------------------------------------
// An application's reads

/// One file opened with O_DIRECT, read again and again through the same
/// descriptor (a disk that goes `transport-offline` refuses new opens with
/// ENXIO, but fails each read of an open descriptor with EIO).
pub struct DirectReader {
    file: File,
    storage: Vec<u8>,
}

const DIO_ALIGN: usize = 4096;

impl DirectReader {
    pub fn open(path: &Path) -> io::Result<DirectReader> {
        let file = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)?;
        Ok(DirectReader {
            file,
            storage: Vec::new(),
        })
    }

    /// One pread of `len` bytes (a multiple of the logical block size) at
    /// `offset`.
    pub fn read_at(&mut self, offset: u64, len: usize) -> io::Result<usize> {
        self.storage.resize(len + DIO_ALIGN, 0);
        let start = self.storage.as_ptr().align_offset(DIO_ALIGN).min(DIO_ALIGN);
        self.file
            .read_at(&mut self.storage[start..start + len], offset)
    }
}
