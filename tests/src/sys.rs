//! Small kernel-facing helpers: root check, mountinfo, loop devices in sysfs, unmounting.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use nix::errno::Errno;
use nix::mount::MntFlags;

/// Fails unless running as root, which every real-kernel test needs: the one
/// root check of the test tree (a test that lost its privileges fails, never
/// skips).
pub fn require_root() -> Result<()> {
    if nix::unistd::geteuid().is_root() {
        Ok(())
    } else {
        bail!(
            "must run as root: the real-kernel tests attach loop devices, mount \
             filesystems (FUSE included), and use tracefs and BPF (running as uid {}); \
             run them with `cargo xtask test`",
            nix::unistd::geteuid()
        )
    }
}

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    pub mount_id: u32,
    pub parent_id: u32,
    /// "MAJ:MIN" of the filesystem (st_dev); anonymous (0:N) for btrfs, tmpfs, FUSE...
    pub maj_min: String,
    pub root: PathBuf,
    pub mount_point: PathBuf,
    /// Per-mount options, e.g. "rw,relatime".
    pub mount_options: String,
    pub fstype: String,
    /// Mount source, e.g. "/dev/loop3".
    pub source: String,
    /// Superblock options, e.g. "rw,errors=remount-ro" (ext4 shows `emergency_ro` here
    /// after an error remount on 6.18 while mount_options still say rw).
    pub super_options: String,
}

impl MountInfo {
    /// Whether `opt` is among the superblock options (exact word match).
    pub fn has_super_option(&self, opt: &str) -> bool {
        self.super_options.split(',').any(|o| o == opt)
    }

    /// Whether `opt` is among the per-mount options (exact word match).
    pub fn has_mount_option(&self, opt: &str) -> bool {
        self.mount_options.split(',').any(|o| o == opt)
    }
}

/// Undoes mountinfo's octal escapes (`\040` for space, etc.).
fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = &b[i + 1..i + 4];
            if oct.iter().all(|c| (b'0'..=b'7').contains(c)) {
                // Three octal digits fit in 9 bits; mountinfo only escapes bytes.
                let v = oct
                    .iter()
                    .fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'));
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Parses one mountinfo line; `None` if it is not in the documented format.
pub fn parse_mountinfo_line(line: &str) -> Option<MountInfo> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let mount_id = l.next()?.parse().ok()?;
    let parent_id = l.next()?.parse().ok()?;
    let maj_min = l.next()?.to_string();
    let root = PathBuf::from(unescape(l.next()?));
    let mount_point = PathBuf::from(unescape(l.next()?));
    let mount_options = l.next()?.to_string();
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = unescape(r.next()?);
    let super_options = r.next().unwrap_or("").to_string();
    Some(MountInfo {
        mount_id,
        parent_id,
        maj_min,
        root,
        mount_point,
        mount_options,
        fstype,
        source,
        super_options,
    })
}

/// All mounts of this process's mount namespace, in mount order.
pub fn mountinfo() -> Result<Vec<MountInfo>> {
    let text =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    Ok(text.lines().filter_map(parse_mountinfo_line).collect())
}

/// The mount whose mount point is exactly `path` (the last one, if stacked).
pub fn mount_at(path: &Path) -> Result<Option<MountInfo>> {
    Ok(mountinfo()?
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path))
}

/// Mounts whose device is one of `maj_mins` ("7:3") or whose source is one of `sources`
/// ("/dev/loop3"), in mount order. Both are needed: btrfs reports an anonymous st_dev.
pub fn mounts_of_devices(maj_mins: &[String], sources: &[String]) -> Result<Vec<MountInfo>> {
    Ok(mountinfo()?
        .into_iter()
        .filter(|m| maj_mins.contains(&m.maj_min) || sources.contains(&m.source))
        .collect())
}

/// Unmounts `path`; with `lazy_fallback`, detaches it lazily if a plain unmount fails
/// because it is busy. Not being mounted is not an error.
pub fn unmount(path: &Path, lazy_fallback: bool) -> Result<()> {
    match nix::mount::umount2(path, MntFlags::empty()) {
        Ok(()) => Ok(()),
        // EINVAL: not a mount point (any more); ENOENT: gone.
        Err(Errno::EINVAL) | Err(Errno::ENOENT) => Ok(()),
        Err(Errno::EBUSY) if lazy_fallback => nix::mount::umount2(path, MntFlags::MNT_DETACH)
            .or_else(|e| match e {
                Errno::EINVAL | Errno::ENOENT => Ok(()),
                e => Err(e),
            })
            .with_context(|| format!("lazy unmount of {}", path.display())),
        Err(e) => Err(e).with_context(|| format!("unmounting {}", path.display())),
    }
}

/// Reads a sysfs attribute, trimmed.
pub fn read_sysfs(path: impl AsRef<Path>) -> Result<String> {
    let path = path.as_ref();
    Ok(std::fs::read_to_string(path)
        .with_context(|| format!("reading {}", path.display()))?
        .trim()
        .to_string())
}

/// "MAJ:MIN" of a block device by kernel name ("loop3", "loop3p1").
pub fn block_maj_min(name: &str) -> Result<String> {
    read_sysfs(format!("/sys/class/block/{name}/dev"))
}

/// Splits "7:3" into (7, 3).
pub fn parse_maj_min(s: &str) -> Result<(u32, u32)> {
    let (a, b) = s
        .split_once(':')
        .with_context(|| format!("bad device number {s:?}"))?;
    Ok((
        a.parse().with_context(|| format!("bad major in {s:?}"))?,
        b.parse().with_context(|| format!("bad minor in {s:?}"))?,
    ))
}

/// Completed request counters of a whole block device, from `/sys/block/<name>/stat`
/// (requests after merging, i.e. what the driver saw; partitions included).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockStat {
    pub reads: u64,
    pub read_sectors: u64,
    pub writes: u64,
    pub write_sectors: u64,
    pub discards: u64,
    pub flushes: u64,
}

/// Reads `/sys/block/<name>/stat`.
pub fn block_stat(name: &str) -> Result<BlockStat> {
    let p = format!("/sys/block/{name}/stat");
    let text = read_sysfs(&p)?;
    let f: Vec<u64> = text
        .split_whitespace()
        .map(|v| v.parse().with_context(|| format!("{p}: bad field {v:?}")))
        .collect::<Result<_>>()?;
    // Field order per Documentation/block/stat.rst; discard fields since 4.18, flush
    // fields since 5.5.
    let get = |i: usize| f.get(i).copied().unwrap_or(0);
    Ok(BlockStat {
        reads: get(0),
        read_sectors: get(2),
        writes: get(4),
        write_sectors: get(6),
        discards: get(11),
        flushes: get(15),
    })
}

/// Backing file of loop device `name`, if it is bound to one.
pub fn loop_backing_file(name: &str) -> Option<PathBuf> {
    let p = format!("/sys/block/{name}/loop/backing_file");
    std::fs::read_to_string(p)
        .ok()
        .map(|s| PathBuf::from(s.trim_end_matches('\n')))
}

/// Names ("loop3") of loop devices whose backing file is `image`.
pub fn loops_backed_by(image: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/sys/block").context("listing /sys/block")? {
        let entry = entry.context("listing /sys/block")?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        if loop_backing_file(&name).as_deref() == Some(image) {
            out.push(name);
        }
    }
    out.sort();
    Ok(out)
}

/// Kernel names of the partitions of block device `disk` ("loop3p1", ...), sorted by
/// partition number.
pub fn partitions_of(disk: &str) -> Result<Vec<String>> {
    let dir = format!("/sys/block/{disk}");
    let mut parts: Vec<(u32, String)> = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let entry = entry.with_context(|| format!("listing {dir}"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with(disk) {
            continue;
        }
        if let Ok(n) = read_sysfs(entry.path().join("partition")) {
            parts.push((n.parse().unwrap_or(0), name));
        }
    }
    parts.sort();
    Ok(parts.into_iter().map(|(_, n)| n).collect())
}

/// Identity of a file as the loop driver records it (device and inode of the backing
/// file), so a loop device can be checked to still be bound to *that* file even after
/// the file became unreachable (a dead FUSE server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    pub major: u32,
    pub minor: u32,
    pub ino: u64,
}

impl FileId {
    /// stat(2) of `path`.
    pub fn of(path: &Path) -> Result<FileId> {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
        Ok(FileId {
            major: libc::major(m.dev()),
            minor: libc::minor(m.dev()),
            ino: m.ino(),
        })
    }
}

/// struct loop_info64 from <linux/loop.h>.
#[repr(C)]
pub(crate) struct LoopInfo64 {
    pub(crate) lo_device: u64,
    pub(crate) lo_inode: u64,
    pub(crate) lo_rdevice: u64,
    pub(crate) lo_offset: u64,
    pub(crate) lo_sizelimit: u64,
    pub(crate) lo_number: u32,
    pub(crate) lo_encrypt_type: u32,
    pub(crate) lo_encrypt_key_size: u32,
    pub(crate) lo_flags: u32,
    pub(crate) lo_file_name: [u8; 64],
    pub(crate) lo_crypt_name: [u8; 64],
    pub(crate) lo_encrypt_key: [u8; 32],
    pub(crate) lo_init: [u64; 2],
}

nix::ioctl_read_bad!(loop_get_status64, 0x4C05, LoopInfo64);
nix::ioctl_none_bad!(loop_clr_fd, 0x4C01);

/// What a bound loop device shows: its backing file's identity and the
/// stretch of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoopBinding {
    pub file: FileId,
    pub offset: u64,
    /// 0: to the end of the file.
    pub sizelimit: u64,
}

/// LOOP_GET_STATUS64 of loop device `name`: `None` when it is bound to
/// nothing (or gone).
pub fn loop_binding(name: &str) -> Result<Option<LoopBinding>> {
    use std::os::fd::AsRawFd;
    let dev = format!("/dev/{name}");
    let file = match std::fs::File::open(&dev) {
        Ok(f) => f,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO) | Some(libc::ENOENT)) => {
            return Ok(None)
        }
        Err(e) => return Err(e).with_context(|| format!("opening {dev}")),
    };
    // SAFETY: LoopInfo64 is plain old data; all-zero is a valid value.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes one loop_info64 into `info`, which outlives the call.
    match unsafe { loop_get_status64(file.as_raw_fd(), &mut info) } {
        Ok(_) => {}
        Err(Errno::ENXIO) => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("LOOP_GET_STATUS64 on {dev}")),
    }
    let dev_t = info.lo_device as libc::dev_t;
    Ok(Some(LoopBinding {
        file: FileId {
            major: libc::major(dev_t),
            minor: libc::minor(dev_t),
            ino: info.lo_inode,
        },
        offset: info.lo_offset,
        sizelimit: info.lo_sizelimit,
    }))
}

/// Unmounts every filesystem on loop device `name` or its partitions (plain unmount,
/// lazy if busy), then detaches it (LOOP_CLR_FD) — but only if it is bound to the file
/// `expect` (any file with `None`). Returns whether it detached something.
///
/// Race-free against loop devices being freed and reused by other processes (tests run
/// in parallel, other people use loop devices on the same machine): the device is held
/// open from the ownership check to the detach, and an open device cannot be unbound and
/// rebound in between (a concurrent detach only marks it for autoclear on last close).
pub fn detach_loop_device(name: &str, expect: Option<FileId>) -> Result<bool> {
    use std::os::fd::AsRawFd;
    let dev = format!("/dev/{name}");
    let file = match std::fs::File::open(&dev) {
        Ok(f) => f,
        // ENXIO: being torn down; ENOENT: device removed.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENXIO) | Some(libc::ENOENT)) => {
            return Ok(false)
        }
        Err(e) => return Err(e).with_context(|| format!("opening {dev}")),
    };
    // SAFETY: LoopInfo64 is plain old data; all-zero is a valid value.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: the kernel writes one loop_info64 into `info`, which outlives the call.
    match unsafe { loop_get_status64(file.as_raw_fd(), &mut info) } {
        Ok(_) => {}
        Err(Errno::ENXIO) => return Ok(false), // not bound
        Err(e) => return Err(e).with_context(|| format!("LOOP_GET_STATUS64 on {dev}")),
    }
    if let Some(id) = expect {
        let dev_t = info.lo_device as libc::dev_t;
        let bound = FileId {
            major: libc::major(dev_t),
            minor: libc::minor(dev_t),
            ino: info.lo_inode,
        };
        if bound != id {
            return Ok(false); // someone else's now
        }
    }

    let mut devs = vec![name.to_string()];
    devs.extend(partitions_of(name).unwrap_or_default());
    let maj_mins: Vec<String> = devs.iter().filter_map(|d| block_maj_min(d).ok()).collect();
    let sources: Vec<String> = devs.iter().map(|d| format!("/dev/{d}")).collect();
    let mut errors = Vec::new();
    // Last mounted first, so stacked mounts come off in order.
    for m in mounts_of_devices(&maj_mins, &sources)?.iter().rev() {
        if let Err(e) = unmount(&m.mount_point, true) {
            errors.push(format!("{e:#}"));
        }
    }
    // LOOP_CLR_FD only marks the device for autoclear; the kernel unbinds it when the
    // last opener closes (our fd below, or a lazily unmounted filesystem later).
    // SAFETY: argument-less ioctl on an fd we own.
    match unsafe { loop_clr_fd(file.as_raw_fd()) } {
        Ok(_) | Err(Errno::ENXIO) => {}
        Err(e) => errors.push(format!("LOOP_CLR_FD on {dev}: {e}")),
    }
    drop(file);
    if errors.is_empty() {
        Ok(true)
    } else {
        bail!("cleaning up {dev}: {}", errors.join("; "))
    }
}

/// Whether `dir` looks like a work dir created for a faultdisk server (so removing it
/// recursively cannot hit anything else).
pub fn is_owned_work_dir(dir: &Path) -> bool {
    dir.join(crate::protocol::BACKING_NAME).is_file()
        && dir.join(crate::protocol::CONTROL_SOCKET).exists()
}

/// Waits until `cond` holds, checking every `step`, for at most `timeout`.
pub fn wait_for(timeout: Duration, step: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(step);
    }
}

/// Waits until 127.0.0.1:`port` accepts a connection (30 s at most): a
/// server the test started is listening. The servers' programs start from
/// the host's root, which a TCG guest reads slowly: rpcbind in a 5.10 guest
/// beside another guest did not listen within 10 s (2026-12-01).
pub fn wait_for_port(port: u16) -> Result<()> {
    use std::net::{Ipv4Addr, SocketAddr, TcpStream};
    const LIMIT: Duration = Duration::from_secs(30);
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let accepts = || TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok();
    if !wait_for(LIMIT, Duration::from_millis(100), accepts) {
        bail!("nothing accepts on {addr} after {} s", LIMIT.as_secs());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mountinfo() {
        let line = "36 35 7:3 / /tmp/mnt\\040x rw,relatime shared:1 - ext4 /dev/loop3 rw,errors=remount-ro";
        let m = parse_mountinfo_line(line).unwrap();
        assert_eq!(m.maj_min, "7:3");
        assert_eq!(m.mount_point, PathBuf::from("/tmp/mnt x"));
        assert_eq!(m.fstype, "ext4");
        assert_eq!(m.source, "/dev/loop3");
        assert!(m.has_super_option("errors=remount-ro"));
        assert!(m.has_mount_option("rw"));
        assert!(!m.has_mount_option("r"));
        assert!(parse_mountinfo_line("garbage").is_none());
        assert_eq!(unescape("a\\134b\\"), "a\\b\\");
    }

    #[test]
    fn maj_min() {
        assert_eq!(parse_maj_min("259:1").unwrap(), (259, 1));
        assert!(parse_maj_min("x").is_err());
    }

    #[test]
    fn own_mountinfo_readable() {
        assert!(!mountinfo().unwrap().is_empty());
    }
}
