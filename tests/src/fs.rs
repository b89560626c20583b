//! Filesystem helpers for real-kernel tests: mkfs, mounts, partitions, FIEMAP, caches,
//! XFS error tuning and O_DIRECT I/O.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tempfile::TempDir;

use crate::cmd;
use crate::faultdisk::{LoopDevice, Partition};
use crate::sys::{self, MountInfo};

// ---------------------------------------------------------------------------------------
// mkfs

/// `mkfs.ext4` with the inode tables and journal initialised up front (no lazy init
/// thread writing in the background during a test) and no discard pass.
pub fn mkfs_ext4(dev: &Path) -> Result<()> {
    mkfs(
        "mkfs.ext4",
        dev,
        &[
            "-q",
            "-F",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
        ],
    )
}

/// "MAJ:MIN" of the filesystem `path` is on, as the agent names devices.
pub fn dev_of(path: &Path) -> Result<String> {
    use std::os::unix::fs::MetadataExt as _;
    let dev = std::fs::metadata(path)
        .with_context(|| format!("stat {}", path.display()))?
        .dev();
    Ok(format!("{}:{}", libc::major(dev), libc::minor(dev)))
}

/// `mkfs.xfs -f` without a discard pass (XFS needs at least 300 MiB).
pub fn mkfs_xfs(dev: &Path) -> Result<()> {
    mkfs("mkfs.xfs", dev, &["-q", "-f", "-K"])
}

/// `mkfs.btrfs -f` without a discard pass (btrfs needs at least ~114 MiB).
pub fn mkfs_btrfs(dev: &Path) -> Result<()> {
    mkfs("mkfs.btrfs", dev, &["-q", "-f", "--nodiscard"])
}

/// Runs `tool args... dev`.
pub fn mkfs(tool: &str, dev: &Path, args: &[&str]) -> Result<()> {
    let mut all: Vec<&std::ffi::OsStr> = args.iter().map(std::ffi::OsStr::new).collect();
    all.push(dev.as_os_str());
    cmd::run(tool, &all).with_context(|| format!("creating a filesystem on {}", dev.display()))?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// Mounts

/// A mounted filesystem, unmounted on drop (lazily if busy).
#[derive(Debug)]
pub struct Mount {
    target: PathBuf,
    source: PathBuf,
    fstype: String,
    options: String,
    mounted: bool,
    /// The mount point when [`Mount::new`] made one; removed after unmounting.
    dir: Option<TempDir>,
}

impl Mount {
    /// Mounts `dev` on a fresh temporary directory: `mount -t fstype -o options`.
    /// `options` is what `mount -o` takes (e.g. "errors=remount-ro", "ro,norecovery");
    /// empty for none.
    pub fn new(dev: impl AsRef<Path>, fstype: &str, options: &str) -> Result<Mount> {
        let dir = tempfile::Builder::new()
            .prefix("health-mnt-")
            .tempdir()
            .context("creating a mount point")?;
        let target = dir.path().to_path_buf();
        let mut m = Self::at(dev, &target, fstype, options)?;
        m.dir = Some(dir);
        Ok(m)
    }

    /// Mounts `dev` on the existing directory `target`.
    pub fn at(
        dev: impl AsRef<Path>,
        target: impl AsRef<Path>,
        fstype: &str,
        options: &str,
    ) -> Result<Mount> {
        let dev = dev.as_ref();
        let target = target.as_ref();
        run_mount(dev, target, fstype, options)?;
        Ok(Mount {
            target: target.to_path_buf(),
            source: dev.to_path_buf(),
            fstype: fstype.to_string(),
            options: options.to_string(),
            mounted: true,
            dir: None,
        })
    }

    /// Unmounts and mounts again (same device, place and options), for a guaranteed cold
    /// cache: [`drop_caches`] cannot evict metadata blocks a filesystem still pins (ext4
    /// keeps journalled blocks until a checkpoint, which a sync does not force), so a
    /// cold *metadata* read needs this. Fails if the filesystem is busy.
    pub fn cycle(&mut self) -> Result<()> {
        if self.mounted {
            nix::mount::umount2(&self.target, nix::mount::MntFlags::empty()).with_context(
                || format!("unmounting {} to mount it again", self.target.display()),
            )?;
            self.mounted = false;
        }
        run_mount(&self.source, &self.target, &self.fstype, &self.options)?;
        self.mounted = true;
        Ok(())
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.target
    }

    /// The device mounted.
    pub fn source(&self) -> &Path {
        &self.source
    }

    pub fn fstype(&self) -> &str {
        &self.fstype
    }

    /// The current /proc/self/mountinfo line of this mount (e.g. to see `emergency_ro`).
    pub fn info(&self) -> Result<MountInfo> {
        sys::mount_at(&self.target)?
            .with_context(|| format!("{} is not mounted any more", self.target.display()))
    }

    /// Unmounts now (lazily if busy), reporting errors.
    pub fn unmount(mut self) -> Result<()> {
        self.do_unmount()
    }

    fn do_unmount(&mut self) -> Result<()> {
        if !self.mounted {
            return Ok(());
        }
        self.mounted = false;
        sys::unmount(&self.target, true)
            .with_context(|| format!("unmounting {}", self.source.display()))?;
        if let Some(dir) = self.dir.take() {
            dir.close()
                .with_context(|| format!("removing mount point {}", self.target.display()))?;
        }
        Ok(())
    }
}

/// `mount -t fstype [-o options] dev target`.
fn run_mount(dev: &Path, target: &Path, fstype: &str, options: &str) -> Result<()> {
    let mut args: Vec<&std::ffi::OsStr> = vec!["-t".as_ref(), fstype.as_ref()];
    if !options.is_empty() {
        args.push("-o".as_ref());
        args.push(options.as_ref());
    }
    args.push(dev.as_os_str());
    args.push(target.as_os_str());
    cmd::run("mount", &args).with_context(|| {
        format!(
            "mounting {} ({fstype}, options {options:?}) on {}",
            dev.display(),
            target.display()
        )
    })?;
    Ok(())
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Err(e) = self.do_unmount() {
            eprintln!("Mount cleanup: {e:#}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// Partitions

/// Linux filesystem data partition type GUID.
const LINUX_DATA_GUID: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// Writes a GPT with one Linux partition per entry of `sizes` (bytes, multiples of 512;
/// a 0 as the last entry takes the rest of the disk) using `sfdisk`, and makes the kernel
/// show them. The loop device must have been attached with partscan.
///
/// The partitions are registered with BLKPG_ADD_PARTITION from the layout sfdisk
/// reports, not left to the kernel's partition-table parsers: kernels built without
/// MSDOS/EFI partition support (like this project's VMs) accept BLKRRPART and then find
/// nothing. Where the kernel did parse the table, the partitions it added are kept.
///
/// The first partition starts at 1 MiB (sfdisk's alignment); each returned
/// [`Partition`] has its `start_bytes` on the disk, to turn partition offsets (such as
/// [`file_extents`] on a filesystem there) into disk-image offsets.
pub fn partition(lo: &LoopDevice, sizes: &[u64]) -> Result<Vec<Partition>> {
    if !lo.partscan() {
        bail!(
            "{} was attached without partition scanning: use attach_loop(true)",
            lo.path().display()
        );
    }
    if sizes.is_empty() {
        bail!("partition: no sizes given");
    }
    let mut script = String::from("label: gpt\n");
    for (i, &size) in sizes.iter().enumerate() {
        if size == 0 {
            if i + 1 != sizes.len() {
                bail!("partition: only the last size may be 0 (rest of the disk)");
            }
            script.push_str(&format!("type={LINUX_DATA_GUID}\n"));
        } else {
            if !size.is_multiple_of(512) {
                bail!("partition: size {size} is not a multiple of 512");
            }
            script.push_str(&format!("size={}, type={LINUX_DATA_GUID}\n", size / 512));
        }
    }
    let dev = lo.path().to_path_buf();
    let dev_s = dev.to_string_lossy().into_owned();
    cmd::run_input(
        "sfdisk",
        &["-q", "--wipe", "always", &dev_s],
        script.as_bytes(),
    )
    .with_context(|| format!("partitioning {dev_s} with sizes {sizes:?}"))?;

    let layout = sfdisk_layout(&dev_s)?;
    if layout.len() != sizes.len() {
        bail!(
            "{dev_s}: sfdisk reports {} partitions after writing {}",
            layout.len(),
            sizes.len()
        );
    }
    let file = File::open(&dev).with_context(|| format!("opening {dev_s}"))?;
    let present = sys::partitions_of(lo.name())?;
    for &(pno, start, len) in &layout {
        let name = format!("{}p{pno}", lo.name());
        if present.contains(&name) {
            continue;
        }
        blkpg_add_partition(&file, pno, start, len)
            .with_context(|| format!("adding partition {pno} ({start}+{len}) to {dev_s}"))?;
    }
    drop(file);

    // Device nodes come from devtmpfs shortly after the partitions exist.
    let want = sizes.len();
    let ok = sys::wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
        sys::partitions_of(lo.name())
            .map(|p| p.len() == want && p.iter().all(|n| Path::new("/dev").join(n).exists()))
            .unwrap_or(false)
    });
    let parts = lo.partitions()?;
    if !ok {
        bail!(
            "{dev_s}: kernel shows {} partitions (with device nodes) after partitioning, \
             expected {want}",
            parts.len()
        );
    }
    for (p, &(pno, start, len)) in parts.iter().zip(&layout) {
        if (p.number, p.start_bytes, p.size_bytes) != (pno, start, len) {
            bail!("{dev_s}: kernel partition {p:?} differs from the table ({pno}, {start}, {len})");
        }
    }
    Ok(parts)
}

/// (number, start bytes, size bytes) of each partition, from `sfdisk -J`.
fn sfdisk_layout(dev: &str) -> Result<Vec<(u32, u64, u64)>> {
    let out = cmd::run("sfdisk", &["-J", dev])?;
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .with_context(|| format!("parsing `sfdisk -J {dev}` output"))?;
    let table = &v["partitiontable"];
    let sector = table["sectorsize"].as_u64().unwrap_or(512);
    let parts = table["partitions"]
        .as_array()
        .with_context(|| format!("`sfdisk -J {dev}`: no partitions array"))?;
    let mut out = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let start = p["start"].as_u64().context("partition without start")?;
        let size = p["size"].as_u64().context("partition without size")?;
        // "/dev/loop3p2" -> 2; entries are in table order, so the index is the fallback.
        let pno = p["node"]
            .as_str()
            .and_then(|n| n.strip_prefix(dev))
            .and_then(|n| n.trim_start_matches('p').parse().ok())
            .unwrap_or(i as u32 + 1);
        out.push((pno, start * sector, size * sector));
    }
    Ok(out)
}

#[repr(C)]
struct BlkpgPartition {
    start: libc::c_longlong,
    length: libc::c_longlong,
    pno: libc::c_int,
    devname: [libc::c_char; 64],
    volname: [libc::c_char; 64],
}

#[repr(C)]
struct BlkpgIoctlArg {
    op: libc::c_int,
    flags: libc::c_int,
    datalen: libc::c_int,
    data: *mut libc::c_void,
}

const BLKPG_ADD_PARTITION: libc::c_int = 1;
// BLKPG = _IO(0x12, 105)
nix::ioctl_write_ptr_bad!(
    blkpg_ioctl,
    nix::request_code_none!(0x12, 105),
    BlkpgIoctlArg
);

fn blkpg_add_partition(disk: &File, pno: u32, start: u64, len: u64) -> Result<()> {
    let mut part = BlkpgPartition {
        start: i64::try_from(start).context("partition start too large")?,
        length: i64::try_from(len).context("partition length too large")?,
        pno: i32::try_from(pno).context("partition number too large")?,
        devname: [0; 64],
        volname: [0; 64],
    };
    let arg = BlkpgIoctlArg {
        op: BLKPG_ADD_PARTITION,
        flags: 0,
        datalen: std::mem::size_of::<BlkpgPartition>() as libc::c_int,
        data: (&mut part as *mut BlkpgPartition).cast(),
    };
    // SAFETY: `arg` points at a valid blkpg_partition that outlives the call.
    unsafe { blkpg_ioctl(disk.as_raw_fd(), &arg) }.context("BLKPG_ADD_PARTITION")?;
    Ok(())
}

// ---------------------------------------------------------------------------------------
// FIEMAP

/// A network filesystem's mount (NFS, SMB) the test made, unmounted on
/// drop: forced and lazy, since the server may be gone by then.
pub struct RemoteMount {
    path: PathBuf,
}

impl RemoteMount {
    /// Takes charge of the mount at `path`.
    pub fn new(path: &Path) -> RemoteMount {
        RemoteMount {
            path: path.to_path_buf(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RemoteMount {
    fn drop(&mut self) {
        let flags = nix::mount::MntFlags::MNT_FORCE | nix::mount::MntFlags::MNT_DETACH;
        if let Err(e) = nix::mount::umount2(&self.path, flags) {
            eprintln!("unmounting {}: {e}", self.path.display());
        }
    }
}

/// One extent of a file, from FIEMAP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// Byte offset in the file.
    pub logical: u64,
    /// Byte offset on the filesystem's block device (the partition, if it is on one).
    /// On btrfs this is a btrfs logical address, not a device offset.
    pub physical: u64,
    pub len: u64,
    /// FIEMAP_EXTENT_* flags.
    pub flags: u32,
}

impl Extent {
    pub const FLAG_LAST: u32 = 0x1;
    pub const FLAG_UNKNOWN: u32 = 0x2;
    pub const FLAG_DELALLOC: u32 = 0x4;
    pub const FLAG_ENCODED: u32 = 0x8;
    pub const FLAG_NOT_ALIGNED: u32 = 0x100;
    pub const FLAG_DATA_INLINE: u32 = 0x200;
    pub const FLAG_UNWRITTEN: u32 = 0x800;
    pub const FLAG_SHARED: u32 = 0x2000;

    /// Offset of the extent in the disk image when the filesystem sits on a partition
    /// starting `partition_start` bytes into the disk (0 for a whole-disk filesystem).
    pub fn disk_offset(&self, partition_start: u64) -> u64 {
        partition_start + self.physical
    }

    /// Whether the extent has a real, known location on disk (not delayed, inline,
    /// encoded or unknown).
    pub fn is_mapped(&self) -> bool {
        self.flags
            & (Self::FLAG_UNKNOWN
                | Self::FLAG_DELALLOC
                | Self::FLAG_ENCODED
                | Self::FLAG_DATA_INLINE
                | Self::FLAG_NOT_ALIGNED)
            == 0
    }
}

#[repr(C)]
struct FiemapHeader {
    fm_start: u64,
    fm_length: u64,
    fm_flags: u32,
    fm_mapped_extents: u32,
    fm_extent_count: u32,
    fm_reserved: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct FiemapExtent {
    fe_logical: u64,
    fe_physical: u64,
    fe_length: u64,
    fe_reserved64: [u64; 2],
    fe_flags: u32,
    fe_reserved: [u32; 3],
}

const FIEMAP_BATCH: usize = 128;

/// The header followed by room for a batch of extents, as the ioctl expects them laid
/// out in one buffer.
#[repr(C)]
struct FiemapBuf {
    hdr: FiemapHeader,
    ext: [FiemapExtent; FIEMAP_BATCH],
}

const FIEMAP_FLAG_SYNC: u32 = 0x1;

// FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap); struct fiemap is the 32-byte header.
nix::ioctl_readwrite!(fs_ioc_fiemap, b'f', 11, FiemapHeader);

/// Every extent of the file at `path` (FIEMAP with FIEMAP_FLAG_SYNC, so delayed
/// allocations are written out and get real locations first).
pub fn file_extents(path: &Path) -> Result<Vec<Extent>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        let mut buf = FiemapBuf {
            hdr: FiemapHeader {
                fm_start: start,
                fm_length: u64::MAX - start,
                fm_flags: FIEMAP_FLAG_SYNC,
                fm_mapped_extents: 0,
                fm_extent_count: FIEMAP_BATCH as u32,
                fm_reserved: 0,
            },
            ext: [FiemapExtent::default(); FIEMAP_BATCH],
        };
        // SAFETY: `buf` is a valid, properly aligned fiemap header followed by
        // fm_extent_count extent slots, which is all the kernel writes.
        unsafe { fs_ioc_fiemap(file.as_raw_fd(), &mut buf.hdr) }
            .with_context(|| format!("FIEMAP on {}", path.display()))?;
        let n = (buf.hdr.fm_mapped_extents as usize).min(FIEMAP_BATCH);
        if n == 0 {
            break;
        }
        let mut last = false;
        for e in &buf.ext[..n] {
            out.push(Extent {
                logical: e.fe_logical,
                physical: e.fe_physical,
                len: e.fe_length,
                flags: e.fe_flags,
            });
            last |= e.fe_flags & Extent::FLAG_LAST != 0;
        }
        let tail = &buf.ext[n - 1];
        let next = tail.fe_logical.saturating_add(tail.fe_length);
        if last || next <= start {
            break;
        }
        start = next;
    }
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// Caches and sync

/// `echo 3 > /proc/sys/vm/drop_caches`: drops clean page cache, dentries and inodes so
/// the next buffered read of file data goes to the device. Dirty pages stay: fsync or
/// [`sync_fs`] first. Metadata blocks a filesystem still pins (ext4 directory blocks
/// waiting for a journal checkpoint, measured to survive drop_caches after syncfs and
/// 15 s) stay too: use [`Mount::cycle`] for those. (No global sync(2) here: it could
/// block on someone else's stuck filesystem.)
pub fn drop_caches() -> Result<()> {
    std::fs::write("/proc/sys/vm/drop_caches", "3").context("writing 3 to /proc/sys/vm/drop_caches")
}

/// syncfs(2) on the filesystem containing `path`. The error, if any, is the kernel's
/// (downcast to `std::io::Error` to see the errno).
pub fn sync_fs(path: &Path) -> Result<()> {
    let f = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    // SAFETY: plain syscall on an fd we own.
    if unsafe { libc::syncfs(f.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error())
            .with_context(|| format!("syncfs on {}", path.display()));
    }
    Ok(())
}

/// Makes XFS on `dev` ("loop3", "loop3p1" or "/dev/loop3") shut down on the first failed
/// metadata write instead of retrying forever: writes 0 to
/// `/sys/fs/xfs/<dev>/error/metadata/EIO/max_retries`. The filesystem must be mounted.
pub fn xfs_fail_fast(dev: &str) -> Result<()> {
    let name = dev.strip_prefix("/dev/").unwrap_or(dev);
    let p = format!("/sys/fs/xfs/{name}/error/metadata/EIO/max_retries");
    std::fs::write(&p, "0").with_context(|| {
        format!("writing 0 to {p} (is an XFS filesystem mounted from /dev/{name}?)")
    })
}

// ---------------------------------------------------------------------------------------
// O_DIRECT

/// Alignment for O_DIRECT buffers: a page satisfies every logical block size.
const DIO_ALIGN: usize = 4096;

/// A heap buffer whose usable part starts on a DIO_ALIGN boundary.
struct AlignedBuf {
    storage: Vec<u8>,
    offset: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + DIO_ALIGN];
        // align_offset on a u8 pointer always returns a usable offset (< DIO_ALIGN).
        let offset = storage.as_ptr().align_offset(DIO_ALIGN).min(DIO_ALIGN);
        AlignedBuf {
            storage,
            offset,
            len,
        }
    }

    fn as_slice(&self) -> &[u8] {
        &self.storage[self.offset..self.offset + self.len]
    }

    fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.offset..self.offset + self.len]
    }
}

/// One O_DIRECT pwrite of `data` at `offset` into `path` (a block device or a file),
/// from a page-aligned copy. Returns the byte count or the kernel's error (e.g. EIO from
/// a failed loop request). `offset` and the length must be multiples of the device's
/// logical block size, else the kernel answers EINVAL.
pub fn o_direct_write(path: &Path, offset: u64, data: &[u8]) -> io::Result<usize> {
    let f = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let mut buf = AlignedBuf::new(data.len());
    buf.as_mut_slice().copy_from_slice(data);
    f.write_at(buf.as_slice(), offset)
}

/// O_DIRECT writes of 4 KiB at one offset, one after the other, on a
/// thread of their own until [`Writes::stop`] (a steady, measurable load).
pub struct Writes {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<io::Result<u64>>,
}

impl Writes {
    pub fn start(path: &Path, offset: u64) -> Writes {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (path, flag) = (path.to_path_buf(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut n = 0;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                o_direct_write(&path, offset, &[0x5a; 4096])?;
                n += 1;
            }
            Ok(n)
        });
        Writes { stop, thread }
    }

    /// Stops after the write under way; how many were written, or the
    /// first error.
    pub fn stop(self) -> io::Result<u64> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the writer thread")
    }
}

/// One O_DIRECT pread of `len` bytes at `offset` from `path` into a page-aligned buffer.
/// Returns the bytes read (shorter at end of device) or the kernel's error.
pub fn o_direct_read(path: &Path, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)?;
    let mut buf = AlignedBuf::new(len);
    let n = f.read_at(buf.as_mut_slice(), offset)?;
    Ok(buf.as_slice()[..n].to_vec())
}

/// Writes `fill.bin` in `dir` until its filesystem has no block left (the
/// server's side of a share or an export). In rounds: ext4 reserves
/// blocks for the extent tree of every page it delays, and gives back
/// what writeback did not use, so a filesystem that refused a write can
/// take more after a sync.
pub fn fill_until_full(dir: &Path) -> Result<()> {
    use std::io::Write as _;
    const MIB: usize = 1 << 20;
    let mut file = File::create(dir.join("fill.bin"))?;
    loop {
        let mut wrote = 0u64;
        for chunk in [MIB, 4096] {
            let block = vec![0xa5u8; chunk];
            loop {
                match file.write(&block) {
                    Ok(0) => break,
                    Ok(n) => wrote += n as u64,
                    Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                    Err(e) => return Err(e).with_context(|| format!("filling {}", dir.display())),
                }
            }
        }
        match file.sync_all() {
            Ok(()) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {}
            Err(e) => return Err(e).with_context(|| format!("syncing {}", dir.display())),
        }
        if wrote == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buffer() {
        for len in [0, 1, 512, 4096, 65536 + 17] {
            let b = AlignedBuf::new(len);
            assert_eq!(b.as_slice().len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % DIO_ALIGN, 0);
        }
    }

    #[test]
    fn fiemap_layout() {
        assert_eq!(std::mem::size_of::<FiemapHeader>(), 32);
        assert_eq!(std::mem::size_of::<FiemapExtent>(), 56);
    }

    #[test]
    fn extent_offsets() {
        let e = Extent {
            logical: 0,
            physical: 8192,
            len: 4096,
            flags: Extent::FLAG_LAST,
        };
        assert_eq!(e.disk_offset(1 << 20), (1 << 20) + 8192);
        assert!(e.is_mapped());
    }
}
