//! Real faulty devices from the kernel's own test drivers, for the VM tests
//! (tests/guest/device_faults.rs): scsi_debug disks with medium errors or command
//! timeouts, device-mapper targets (linear, flakey, error), md raid1 arrays,
//! null_blk disks with bad blocks, and loop devices over tmpfs files.
//!
//! Nothing here skips: a missing module or tool is an error naming it. Every
//! handle tears its device down on drop (`dmsetup remove`, `mdadm --stop`,
//! `rmmod`, ...), so a failed assertion leaves the kernel clean for the next
//! test. Drop order matters for stacks: declare the lower device first, so
//! that it is dropped last.
//!
//! The guest these run in has no udev: device nodes come from devtmpfs, and
//! [`block_node`] makes one by hand where it is missing.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::cmd;
use crate::sys;

/// `modprobe MODULE PARAMS...`; fails naming the module when it is missing.
pub fn modprobe(module: &str, params: &[&str]) -> Result<()> {
    let mut args = vec![module];
    args.extend_from_slice(params);
    cmd::run("modprobe", &args).with_context(|| {
        format!(
            "loading the kernel module {module} (this kernel must ship it: the VM's Debian \
             kernels do, the host kernel may not)"
        )
    })?;
    Ok(())
}

/// Whether `module` is loaded (or built in with a sysfs directory).
pub fn module_loaded(module: &str) -> bool {
    Path::new("/sys/module").join(module).exists()
}

/// `rmmod MODULE`, retried for a few seconds while the module is busy (a
/// device node still open by a finishing process, a udev-less scan).
pub fn rmmod(module: &str) -> Result<()> {
    if !module_loaded(module) {
        return Ok(());
    }
    let mut last = None;
    for _ in 0..50 {
        match cmd::run("rmmod", &[module]) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last.expect("tried at least once")).with_context(|| format!("unloading {module}"))
}

/// `/dev/NAME` for the block device `NAME`, made with mknod when devtmpfs
/// did not (or made it with another number).
pub fn block_node(name: &str) -> Result<PathBuf> {
    let maj_min = sys::block_maj_min(name)?;
    let (major, minor) = sys::parse_maj_min(&maj_min)?;
    let path = Path::new("/dev").join(name);
    let ok = sys::wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
        nix::sys::stat::stat(&path)
            .map(|st| {
                st.st_mode & libc::S_IFMT == libc::S_IFBLK
                    && st.st_rdev == libc::makedev(major, minor)
            })
            .unwrap_or(false)
    });
    if !ok {
        let _ = std::fs::remove_file(&path);
        nix::sys::stat::mknod(
            &path,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o660),
            libc::makedev(major, minor),
        )
        .with_context(|| format!("mknod {} {major}:{minor}", path.display()))?;
    }
    Ok(path)
}

/// Waits for udev to finish with new devices, where it runs (virtme-ng
/// starts systemd-udevd in the guest): its probes read new disks, and a
/// probe of a faulty one is an error the test did not make. Best effort: no
/// udevadm, or a timeout, is no failure.
pub fn settle() {
    if cmd::find_tool("udevadm").is_ok() {
        let _ = cmd::run("udevadm", &["settle", "--timeout=10"]);
    }
}

/// A block device: kernel name, `MAJ:MIN` and node.
#[derive(Clone, Debug)]
pub struct BlockDev {
    pub name: String,
    pub maj_min: String,
    pub path: PathBuf,
}

impl BlockDev {
    pub fn of(name: &str) -> Result<BlockDev> {
        Ok(BlockDev {
            name: name.to_string(),
            maj_min: sys::block_maj_min(name)?,
            path: block_node(name)?,
        })
    }

    /// (major, minor).
    pub fn numbers(&self) -> Result<(u32, u32)> {
        sys::parse_maj_min(&self.maj_min)
    }

    /// Requests of a request-based disk the driver has now (reads,
    /// writes): `/sys/block/NAME/inflight`.
    pub fn inflight(&self) -> Result<(u64, u64)> {
        let s = sys::read_sysfs(format!("/sys/class/block/{}/inflight", self.name))?;
        let mut n = s.split_whitespace().map(str::parse::<u64>);
        match (n.next(), n.next()) {
            (Some(Ok(r)), Some(Ok(w))) => Ok((r, w)),
            _ => anyhow::bail!("inflight of {}: {s:?}", self.name),
        }
    }

    /// When a write is first in flight on the disk, polled every 5 ms for
    /// at most `timeout`: the moment a write a test started (a `dd` in an
    /// emulated guest can take seconds to start) reaches the driver.
    pub fn write_arrival(&self, timeout: std::time::Duration) -> Result<std::time::Instant> {
        let start = std::time::Instant::now();
        while start.elapsed() < timeout {
            if self.inflight()?.1 > 0 {
                return Ok(std::time::Instant::now());
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        anyhow::bail!("no write in flight on {} within {timeout:?}", self.name)
    }

    /// Size in 512-byte sectors.
    pub fn sectors(&self) -> Result<u64> {
        let s = sys::read_sysfs(format!("/sys/class/block/{}/size", self.name))?;
        s.trim()
            .parse()
            .with_context(|| format!("size of {}: {s:?}", self.name))
    }
}

// ---------------------------------------------------------------------------------------
// scsi_debug

/// The scsi_debug module with one disk; unloaded on drop.
pub struct ScsiDebug {
    pub disk: BlockDev,
}

/// scsi_debug's driver directory (module parameters that can change live).
pub const SCSI_DEBUG_SYSFS: &str = "/sys/bus/pseudo/drivers/scsi_debug";

impl ScsiDebug {
    /// `modprobe scsi_debug PARAMS` and waits for its disk. Fails if
    /// scsi_debug is already loaded (a disk of someone else's).
    pub fn load(params: &[&str]) -> Result<ScsiDebug> {
        if module_loaded("scsi_debug") {
            bail!("scsi_debug is already loaded: another test's disk is still there");
        }
        modprobe("sd_mod", &[])?;
        modprobe("scsi_debug", params)?;
        // From here on, drop unloads the module whatever happens.
        let mut me = ScsiDebug {
            disk: BlockDev {
                name: String::new(),
                maj_min: String::new(),
                path: PathBuf::new(),
            },
        };
        let mut name = None;
        let found = sys::wait_for(Duration::from_secs(30), Duration::from_millis(50), || {
            name = scsi_debug_disk();
            name.is_some()
        });
        if !found {
            bail!("scsi_debug loaded ({params:?}) but no sd disk appeared within 30 s");
        }
        me.disk = BlockDev::of(&name.expect("found"))?;
        Ok(me)
    }

    /// Writes a live module parameter (`opts`, `every_nth`, ...).
    pub fn set(&self, param: &str, value: &str) -> Result<()> {
        let p = Path::new(SCSI_DEBUG_SYSFS).join(param);
        std::fs::write(&p, value).with_context(|| format!("writing {value} to {}", p.display()))
    }

    /// Writes `/sys/block/<disk>/device/<attr>` (e.g. `timeout`, `eh_timeout`).
    pub fn set_device_attr(&self, attr: &str, value: &str) -> Result<()> {
        let p = Path::new("/sys/block")
            .join(&self.disk.name)
            .join("device")
            .join(attr);
        std::fs::write(&p, value).with_context(|| format!("writing {value} to {}", p.display()))
    }
}

impl Drop for ScsiDebug {
    fn drop(&mut self) {
        if let Err(e) = rmmod("scsi_debug") {
            eprintln!("ScsiDebug cleanup: {e:#}");
        }
    }
}

/// The sd disk of the scsi_debug host, if it is there yet.
fn scsi_debug_disk() -> Option<String> {
    let adapters = std::fs::read_dir(SCSI_DEBUG_SYSFS).ok()?;
    for adapter in adapters.flatten() {
        if !adapter.file_name().to_string_lossy().starts_with("adapter") {
            continue;
        }
        // adapterN/hostH/targetH:C:T/H:C:T:L/block/sdX
        let mut stack = vec![adapter.path()];
        let mut depth = 0;
        while !stack.is_empty() && depth < 5 {
            let mut next = Vec::new();
            for dir in stack {
                let block = dir.join("block");
                if let Ok(mut entries) = std::fs::read_dir(&block) {
                    if let Some(Ok(e)) = entries.next() {
                        return Some(e.file_name().to_string_lossy().into_owned());
                    }
                }
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let n = e.file_name().to_string_lossy().into_owned();
                    if n.starts_with("host") || n.starts_with("target") || n.contains(':') {
                        next.push(e.path());
                    }
                }
            }
            stack = next;
            depth += 1;
        }
    }
    None
}

/// A GPT with one Linux partition of `sectors` 512-byte sectors (starting
/// at 1 MiB) on `disk`, read by the kernel; returns the partition.
pub fn one_partition(disk: &BlockDev, sectors: u64) -> Result<BlockDev> {
    let script = format!("label: gpt\nsize={sectors}, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4\n");
    let dev = disk.path.to_string_lossy().into_owned();
    cmd::run_input(
        "sfdisk",
        &["-q", "--wipe", "always", &dev],
        script.as_bytes(),
    )
    .with_context(|| format!("partitioning {dev}"))?;
    settle();
    // sfdisk asks the kernel to re-read the table (which drops and adds the
    // partitions again, and udev may do the same): wait for the partition
    // to be there with its size; if it never comes, partx adds it.
    let find = || -> Option<BlockDev> {
        let name = sys::partitions_of(&disk.name).ok()?.into_iter().next()?;
        let part = BlockDev::of(&name).ok()?;
        (part.sectors().ok()? == sectors).then_some(part)
    };
    let mut found = None;
    sys::wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
        found = find();
        found.is_some()
    });
    if found.is_none() {
        cmd::run("partx", &["-a", &dev]).with_context(|| format!("partx -a {dev}"))?;
        settle();
        sys::wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
            found = find();
            found.is_some()
        });
    }
    found
        .with_context(|| format!("{dev}: no partition of {sectors} sectors after sfdisk and partx"))
}

/// First sector of partition `part` on its disk.
pub fn partition_start(part: &BlockDev) -> Result<u64> {
    let s = sys::read_sysfs(format!("/sys/class/block/{}/start", part.name))?;
    s.trim()
        .parse()
        .with_context(|| format!("start of {}: {s:?}", part.name))
}

// ---------------------------------------------------------------------------------------
// device-mapper

/// A device-mapper device made with `dmsetup create --noudevsync`; removed
/// on drop.
pub struct DmDevice {
    pub name: String,
    pub dev: BlockDev,
}

impl DmDevice {
    /// `dmsetup create NAME` with `table` (lines of `start length target
    /// args`), its /dev/mapper node and dm-N.
    pub fn create(name: &str, table: &str) -> Result<DmDevice> {
        modprobe("dm-mod", &[])?;
        // The table on stdin: one line per segment.
        cmd::run_input(
            "dmsetup",
            &["create", "--noudevsync", name],
            format!("{table}\n").as_bytes(),
        )
        .with_context(|| format!("creating the dm device {name} ({table:?})"))?;
        let mut me = DmDevice {
            name: name.to_string(),
            dev: BlockDev {
                name: String::new(),
                maj_min: String::new(),
                path: PathBuf::new(),
            },
        };
        cmd::run("dmsetup", &["mknodes", name])?;
        settle();
        let out = cmd::run(
            "dmsetup",
            &["info", "-c", "--noheadings", "-o", "major,minor", name],
        )?;
        let maj_min = out.stdout.trim().replace(' ', "");
        let kname = std::fs::read_link(format!("/sys/dev/block/{maj_min}"))
            .with_context(|| format!("/sys/dev/block/{maj_min}"))?
            .file_name()
            .context("sysfs link without a name")?
            .to_string_lossy()
            .into_owned();
        me.dev = BlockDev::of(&kname)?;
        Ok(me)
    }

    /// /dev/mapper/NAME.
    pub fn mapper_path(&self) -> PathBuf {
        Path::new("/dev/mapper").join(&self.name)
    }

    /// Swaps the live table: suspend without freezing the filesystem on it
    /// (a thaw would write its superblock through the new table), load,
    /// resume.
    pub fn replace_table(&self, table: &str) -> Result<()> {
        cmd::run(
            "dmsetup",
            &["suspend", "--nolockfs", "--noudevsync", &self.name],
        )?;
        let loaded = cmd::run_input(
            "dmsetup",
            &["load", &self.name],
            format!("{table}\n").as_bytes(),
        );
        let resumed = cmd::run("dmsetup", &["resume", "--noudevsync", &self.name]);
        loaded.with_context(|| format!("loading {table:?} into {}", self.name))?;
        resumed?;
        Ok(())
    }
}

impl Drop for DmDevice {
    fn drop(&mut self) {
        let mut last = None;
        for _ in 0..30 {
            match cmd::run("dmsetup", &["remove", "--noudevsync", &self.name]) {
                Ok(_) => return,
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(e) = last {
            eprintln!("DmDevice cleanup of {}: {e:#}", self.name);
        }
    }
}

// ---------------------------------------------------------------------------------------
// md

/// An md array made with `mdadm --create`; stopped on drop.
pub struct MdArray {
    pub dev: BlockDev,
}

impl MdArray {
    /// A raid1 of `members` (metadata 1.2, no initial resync); the members in
    /// `write_mostly` are marked so, which makes md read from the others.
    pub fn raid1(path: &str, members: &[&Path], write_mostly: &[&Path]) -> Result<MdArray> {
        cmd::require_tools(&["mdadm"]).context("install the Debian package `mdadm`")?;
        modprobe("raid1", &[])?;
        let n = (members.len() + write_mostly.len()).to_string();
        let mut args: Vec<String> = [
            "--create",
            path,
            "--run",
            "--assume-clean",
            "--metadata=1.2",
            "--level=1",
            "--raid-devices",
            &n,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(members.iter().map(|m| m.display().to_string()));
        if !write_mostly.is_empty() {
            args.push("--write-mostly".into());
            args.extend(write_mostly.iter().map(|m| m.display().to_string()));
        }
        cmd::run("mdadm", &args).with_context(|| format!("creating the md array {path}"))?;
        settle();
        let name = Path::new(path)
            .file_name()
            .context("md path without a name")?
            .to_string_lossy()
            .into_owned();
        let dev = BlockDev::of(&name);
        match dev {
            Ok(dev) => Ok(MdArray { dev }),
            Err(e) => {
                let _ = cmd::run("mdadm", &["--stop", path]);
                Err(e)
            }
        }
    }

    /// `/sys/block/mdN/md/<attr>`.
    pub fn attr(&self, attr: &str) -> Result<String> {
        sys::read_sysfs(format!("/sys/block/{}/md/{attr}", self.dev.name))
    }

    /// Where a member's data starts on it, in sectors.
    pub fn data_offset(&self, member: &str) -> Result<u64> {
        let s = self.attr(&format!("dev-{member}/offset"))?;
        s.trim()
            .parse()
            .with_context(|| format!("data offset of {member}: {s:?}"))
    }
}

impl Drop for MdArray {
    fn drop(&mut self) {
        let path = self.dev.path.display().to_string();
        let mut last = None;
        for _ in 0..30 {
            match cmd::run("mdadm", &["--stop", &path]) {
                Ok(_) => return,
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Some(e) = last {
            eprintln!("MdArray cleanup of {path}: {e:#}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// null_blk

const CONFIGFS: &str = "/sys/kernel/config";

/// A null_blk disk made through configfs; powered off, removed and the
/// module unloaded on drop.
pub struct NullBlk {
    dir: PathBuf,
    pub dev: BlockDev,
}

impl NullBlk {
    /// A memory-backed null_blk disk of `size_mb` MiB with the bad sector
    /// ranges `badblocks` (configfs syntax, e.g. `+8192-8199`).
    pub fn with_badblocks(name: &str, size_mb: u64, badblocks: &[&str]) -> Result<NullBlk> {
        if module_loaded("null_blk") {
            bail!("null_blk is already loaded: another test's disk is still there");
        }
        modprobe("null_blk", &["nr_devices=0"])?;
        if !Path::new(CONFIGFS).join("nullb").is_dir() {
            std::fs::create_dir_all(CONFIGFS).ok();
            cmd::run("mount", &["-t", "configfs", "configfs", CONFIGFS])
                .context("mounting configfs for null_blk")?;
        }
        let features = sys::read_sysfs(format!("{CONFIGFS}/nullb/features"))?;
        if !features.split(',').any(|f| f.trim() == "badblocks") {
            bail!("this kernel's null_blk has no badblocks (features: {features})");
        }
        let dir = Path::new(CONFIGFS).join("nullb").join(name);
        std::fs::create_dir(&dir).with_context(|| format!("mkdir {}", dir.display()))?;
        let mut me = NullBlk {
            dir: dir.clone(),
            dev: BlockDev {
                name: String::new(),
                maj_min: String::new(),
                path: PathBuf::new(),
            },
        };
        let set = |attr: &str, value: &str| -> Result<()> {
            std::fs::write(dir.join(attr), value)
                .with_context(|| format!("writing {value} to {}", dir.join(attr).display()))
        };
        set("size", &size_mb.to_string())?;
        set("memory_backed", "1")?;
        for bb in badblocks {
            set("badblocks", bb)?;
        }
        set("power", "1")?;
        settle();
        // Recent kernels name the disk after the configfs directory, older
        // ones nullb<index>.
        let index = sys::read_sysfs(dir.join("index"))?;
        let candidates = [name.to_string(), format!("nullb{}", index.trim())];
        let mut disk = None;
        sys::wait_for(Duration::from_secs(10), Duration::from_millis(50), || {
            disk = candidates
                .iter()
                .find(|c| Path::new("/sys/block").join(c).exists())
                .cloned();
            disk.is_some()
        });
        let disk = disk.with_context(|| {
            format!("null_blk {name} powered on, but none of {candidates:?} is in /sys/block")
        })?;
        me.dev = BlockDev::of(&disk)?;
        Ok(me)
    }
}

impl Drop for NullBlk {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("power"), "0");
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("NullBlk cleanup of {}: {e}", self.dir.display());
        }
        if let Err(e) = rmmod("null_blk") {
            eprintln!("NullBlk cleanup: {e:#}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// loop over tmpfs

/// A loop device over a sparse file on a private tmpfs: a healthy disk of
/// RAM (tmpfs punches holes but has no FALLOC_FL_ZERO_RANGE, so the loop
/// device's write-zeroes requests fail with EOPNOTSUPP). Detached and
/// unmounted on drop.
pub struct TmpfsLoop {
    pub dev: BlockDev,
    mount: Option<crate::fs::Mount>,
}

impl TmpfsLoop {
    pub fn new(size_mb: u64) -> Result<TmpfsLoop> {
        let opts = format!("size={}m", size_mb + 8);
        let mount = crate::fs::Mount::new("tmpfs", "tmpfs", &opts)?;
        let img = mount.path().join("disk.img");
        let f = std::fs::File::create(&img)?;
        f.set_len(size_mb << 20)?;
        drop(f);
        let out = cmd::run("losetup", &["-f", "--show", &img.to_string_lossy()])?;
        let path = out.stdout.trim().to_string();
        settle();
        let name = path.trim_start_matches("/dev/").to_string();
        let mut me = TmpfsLoop {
            dev: BlockDev {
                name: name.clone(),
                maj_min: String::new(),
                path: PathBuf::from(&path),
            },
            mount: Some(mount),
        };
        me.dev = BlockDev::of(&name)?;
        Ok(me)
    }
}

impl Drop for TmpfsLoop {
    fn drop(&mut self) {
        let path = self.dev.path.display().to_string();
        if let Err(e) = cmd::run("losetup", &["-d", &path]) {
            eprintln!("TmpfsLoop cleanup of {path}: {e:#}");
        }
        drop(self.mount.take());
    }
}
