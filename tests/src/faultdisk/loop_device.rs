//! Loop devices over a [`FaultDisk`]'s image: attaching them (direct I/O, requests
//! fitted to FUSE's), their sysfs numbers and partitions, and detaching them once.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};

use super::{lock, FaultDisk};
use crate::cmd;
use crate::sys;

impl FaultDisk {
    /// Attaches a loop device over the image: `losetup -f --show --direct-io=on [-P]`.
    ///
    /// Fails if the kernel did not enable direct I/O on it (buffered loop I/O would hide
    /// errors behind a second page cache). The device's max_sectors_kb is lowered so one
    /// loop request always fits in one FUSE request (see [`LoopDevice::fuse_fit_kb`]).
    pub fn attach_loop(&self, partscan: bool) -> Result<LoopDevice> {
        self.attach_loop_with(LoopOptions {
            partscan,
            ..LoopOptions::default()
        })
    }

    /// [`attach_loop`](FaultDisk::attach_loop) with every option.
    pub fn attach_loop_with(&self, opts: LoopOptions) -> Result<LoopDevice> {
        self.check_alive()?;
        cmd::require_tools(&["losetup"])?;
        let image = self.image.to_string_lossy().into_owned();
        let at = opts.at.map(|n| format!("/dev/loop{n}"));
        let mut args = vec!["--show", "--direct-io=on"];
        if at.is_none() {
            args.push("-f");
        }
        if opts.partscan {
            args.push("-P");
        }
        let ss;
        if let Some(s) = opts.sector_size {
            ss = s.to_string();
            args.push("--sector-size");
            args.push(&ss);
        }
        if let Some(at) = &at {
            args.push(at);
        }
        args.push(&image);
        let out = cmd::run("losetup", &args)?;
        // `--show` prints the device only where `-f` chose it.
        let dev = at.unwrap_or_else(|| out.stdout.trim().to_string());
        let name = dev
            .strip_prefix("/dev/")
            .filter(|n| n.starts_with("loop"))
            .with_context(|| format!("losetup printed {dev:?}, not a /dev/loopN path"))?
            .to_string();
        let maj_min = sys::block_maj_min(&name)?;
        let (major, minor) = sys::parse_maj_min(&maj_min)?;
        let shared = Arc::new(LoopShared {
            name: name.clone(),
            path: PathBuf::from(&dev),
            maj_min,
            major,
            minor,
            partscan: opts.partscan,
            image: self.image.clone(),
            image_id: self.image_id,
            detached: Mutex::new(false),
        });
        // Registered before the checks below so Drop detaches it if they fail.
        lock(&self.loops).push(shared.clone());
        let lo = LoopDevice { shared };

        let dio = sys::read_sysfs(format!("/sys/block/{name}/loop/dio"))?;
        if dio != "1" {
            bail!(
                "{dev}: the kernel did not enable direct I/O on the loop device (dio={dio}); \
                 buffered loop I/O would not pass FUSE errors through reliably"
            );
        }
        if opts.fit_fuse_requests {
            let fit = LoopDevice::fuse_fit_kb(self.info.max_request_bytes);
            let current = lo.max_sectors_kb()?;
            if current > fit {
                lo.set_max_sectors_kb(fit)?;
            }
        }
        Ok(lo)
    }

    /// Loop devices attached through this disk and not detached yet.
    pub fn loop_names(&self) -> Vec<String> {
        lock(&self.loops)
            .iter()
            .filter(|l| !*lock(&l.detached))
            .map(|l| l.name.clone())
            .collect()
    }
}

/// Options for [`FaultDisk::attach_loop_with`].
#[derive(Debug, Clone, Copy)]
pub struct LoopOptions {
    /// `losetup -P`: scan for partitions (needed for [`crate::fs::partition`]).
    pub partscan: bool,
    /// Lower the loop device's max_sectors_kb so one loop request is never split into
    /// several FUSE requests (default true). With it off, a loop request larger than
    /// the FUSE limit becomes several FUSE requests, and a write failing in any but the
    /// first completes as a short write, which the loop driver reports as success.
    pub fit_fuse_requests: bool,
    /// `losetup --sector-size`: logical block size (default 512).
    pub sector_size: Option<u32>,
    /// Attach at `/dev/loop<N>` instead of the first free one (a number
    /// another device held before).
    pub at: Option<u32>,
}

impl Default for LoopOptions {
    fn default() -> Self {
        LoopOptions {
            partscan: false,
            fit_fuse_requests: true,
            sector_size: None,
            at: None,
        }
    }
}

pub(super) struct LoopShared {
    name: String,
    path: PathBuf,
    maj_min: String,
    major: u32,
    minor: u32,
    partscan: bool,
    image: PathBuf,
    image_id: sys::FileId,
    /// Set once detached, so the LoopDevice's and the FaultDisk's Drop detach once.
    detached: Mutex<bool>,
}

impl LoopShared {
    pub(super) fn detach(&self) -> Result<()> {
        let mut done = lock(&self.detached);
        if *done {
            return Ok(());
        }
        // Checks the backing file: if the device was already freed and reused by
        // someone else, it is left alone.
        let res = sys::detach_loop_device(&self.name, Some(self.image_id)).map(|_| ());
        *done = true;
        res
    }
}

/// A loop device attached over a [`FaultDisk`] image. Dropping it unmounts whatever is
/// mounted from it (or its partitions) and detaches it; the FaultDisk's Drop does the
/// same for devices still attached.
pub struct LoopDevice {
    shared: Arc<LoopShared>,
}

impl std::fmt::Debug for LoopDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopDevice")
            .field("path", &self.shared.path)
            .field("maj_min", &self.shared.maj_min)
            .finish()
    }
}

/// A partition of a loop device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Partition {
    /// 1-based partition number.
    pub number: u32,
    /// Kernel name, e.g. "loop3p1".
    pub name: String,
    /// Device node, e.g. "/dev/loop3p1".
    pub path: PathBuf,
    /// "MAJ:MIN", e.g. "259:0".
    pub maj_min: String,
    pub major: u32,
    pub minor: u32,
    /// Offset of the partition on the whole disk (= in the disk image), in bytes.
    pub start_bytes: u64,
    pub size_bytes: u64,
}

impl LoopDevice {
    /// Device node, e.g. `/dev/loop3`.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// Kernel name, e.g. `loop3`.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// "MAJ:MIN", e.g. "7:3".
    pub fn maj_min(&self) -> &str {
        &self.shared.maj_min
    }

    pub fn major(&self) -> u32 {
        self.shared.major
    }

    pub fn minor(&self) -> u32 {
        self.shared.minor
    }

    /// Whether it was attached with partition scanning.
    pub fn partscan(&self) -> bool {
        self.shared.partscan
    }

    /// The image it is attached to.
    pub fn image(&self) -> &Path {
        &self.shared.image
    }

    /// Its partitions as the kernel currently sees them.
    pub fn partitions(&self) -> Result<Vec<Partition>> {
        let mut out = Vec::new();
        for name in sys::partitions_of(&self.shared.name)? {
            out.push(partition_info(&self.shared.name, &name)?);
        }
        Ok(out)
    }

    /// `queue/max_sectors_kb`: the largest request the block layer builds for it.
    pub fn max_sectors_kb(&self) -> Result<u32> {
        let p = format!("/sys/block/{}/queue/max_sectors_kb", self.shared.name);
        let v = sys::read_sysfs(&p)?;
        v.parse().with_context(|| format!("{p}: bad value {v:?}"))
    }

    /// Sets `queue/max_sectors_kb` (at most max_hw_sectors_kb, 1280 for loop).
    pub fn set_max_sectors_kb(&self, kb: u32) -> Result<()> {
        let p = format!("/sys/block/{}/queue/max_sectors_kb", self.shared.name);
        std::fs::write(&p, kb.to_string()).with_context(|| format!("writing {kb} to {p}"))
    }

    /// Completed request counters of the whole device (partitions included).
    pub fn stat(&self) -> Result<sys::BlockStat> {
        sys::block_stat(&self.shared.name)
    }

    /// Largest max_sectors_kb that keeps every request within one FUSE request of at
    /// most `fuse_max` bytes: FUSE counts pages, and a buffer that does not start on a
    /// page boundary touches one page more than its length suggests, hence one page of
    /// slack (1 MiB -> 1020 KiB).
    pub fn fuse_fit_kb(fuse_max: u64) -> u32 {
        let slack = 4096;
        let kb = fuse_max.saturating_sub(slack) / 1024;
        u32::try_from(kb.max(4)).unwrap_or(u32::MAX)
    }

    /// Unmounts its filesystems and detaches it now, reporting errors.
    pub fn detach(self) -> Result<()> {
        self.shared.detach()
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        if let Err(e) = self.shared.detach() {
            eprintln!("LoopDevice {} cleanup: {e:#}", self.shared.name);
        }
    }
}

/// Reads a partition's numbers from sysfs.
pub(crate) fn partition_info(disk: &str, name: &str) -> Result<Partition> {
    let base = format!("/sys/block/{disk}/{name}");
    let number: u32 = sys::read_sysfs(format!("{base}/partition"))?
        .parse()
        .with_context(|| format!("{base}/partition"))?;
    let start: u64 = sys::read_sysfs(format!("{base}/start"))?
        .parse()
        .with_context(|| format!("{base}/start"))?;
    let size: u64 = sys::read_sysfs(format!("{base}/size"))?
        .parse()
        .with_context(|| format!("{base}/size"))?;
    let maj_min = sys::read_sysfs(format!("{base}/dev"))?;
    let (major, minor) = sys::parse_maj_min(&maj_min)?;
    Ok(Partition {
        number,
        name: name.to_string(),
        path: PathBuf::from(format!("/dev/{name}")),
        maj_min,
        major,
        minor,
        // sysfs start/size are always in 512-byte units, whatever the block size.
        start_bytes: start * 512,
        size_bytes: size * 512,
    })
}
