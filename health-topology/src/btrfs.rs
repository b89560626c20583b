//! Btrfs: which anonymous device numbers belong to which filesystem, and
//! which block devices it lives on.
//!
//! Measured on 6.18 (mkfs.btrfs on /dev/loop0 = 7:0, mounted at /mnt,
//! subvolume `sv1` created in it and also mounted with `-o subvol=sv1` at /mnt2):
//!
//! | what | device number |
//! |---|---|
//! | mountinfo MAJ:MIN of both mounts | 0:39 (the superblock's anonymous dev) |
//! | `stat /mnt` (top-level subvolume, id 5), files in it | 0:40 |
//! | `stat /mnt/sv1`, `stat /mnt2`, files in sv1 | 0:41 |
//! | `mm_filemap_add_to_page_cache` for reads and writes of files in sv1 | 0:39 |
//! | `/sys/fs/btrfs/<fsid>/devices/loop0/dev` | 7:0 |
//!
//! So every subvolume, the top-level one included, has its own anonymous
//! dev that only `stat` shows, while tracepoints that take `i_sb->s_dev`
//! (filemap_*, what the notes call "an anonymous dev") carry the
//! superblock's, which is the one mountinfo prints. Nothing in sysfs or
//! mountinfo names the per-subvolume numbers.
//!
//! What the scan does per btrfs filesystem (grouped by mountinfo dev):
//! - `statx` each of its mount points (through `<proc>/<pid>/root`) and keep
//!   the result only if `stx_mnt_id` is that mount's id, i.e. the path really
//!   leads to that mount and not to something mounted over it. That yields
//!   the anonymous dev of each *mounted* subvolume.
//! - `BTRFS_IOC_FS_INFO` on one such mount point gives the fsid, and
//!   `/sys/fs/btrfs/<fsid>/devices/*/dev` the member devices. If no mount
//!   point is reachable, the mount source's device name (or the `st_rdev` of
//!   the source path) is looked up among all `/sys/fs/btrfs/*/devices`.
//!
//! Left unresolved: a subvolume that is only reached through its parent's
//! mount (e.g. `/mnt/sv1` when nothing is mounted with `subvol=sv1`) has an
//! anonymous dev we only learn by stat-ing a path inside it; enumerating
//! subvolumes and stat-ing each would cost a tree search and a path walk per
//! subvolume on every scan, so we do not. Callers holding such a `st_dev`
//! should ask by path ([`super::Topology::device_of_path`]) instead.
//!
//! Bounded: the statx, open and ioctl on a mount point run on a thread of
//! their own (one per mount, [`crate::bounded`]) and the scan waits at most
//! [`PROBE_TIMEOUT`] for it. A mount whose probe times out counts as not
//! reachable (the fallback by source name above applies), its path is
//! remembered while the thread stays blocked, and later scans answer for it
//! at once without a new thread; the filesystem's other mounts are not
//! probed in that scan (they share the stuck superblock). So a hung btrfs
//! volume (or a hung network mount below a btrfs mount point) delays a scan
//! by at most one timeout per hung filesystem, once, and holds one thread
//! per hung mount point.

use std::ffi::CString;
use std::fs;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use health_core::dev::Dev;

use super::mountinfo::MountEntry;
use super::sysfs::read_dev_attr;
use crate::bounded::{spawn_claimed, Bounded, InFlight};

/// One mounted btrfs filesystem.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BtrfsFilesystem {
    /// Filesystem UUID (`/sys/fs/btrfs/<fsid>`), if found.
    pub fsid: Option<String>,
    /// The superblock's device number: what mountinfo and the filemap
    /// tracepoints show.
    pub fs_dev: Dev,
    /// Member block devices.
    pub devices: Vec<Dev>,
    /// Anonymous devs of mounted subvolumes as `stat` reports them.
    pub subvolume_devs: Vec<Dev>,
}

/// How long the scan waits for one mount point's statx, open and ioctl.
/// They take microseconds on a healthy btrfs.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Mount points whose probe is still blocked in the kernel, across scans.
static IN_FLIGHT: LazyLock<InFlight> = LazyLock::new(InFlight::default);

/// The bound on mount point probes: the in-flight set and the timeout.
// Public for tests/tests/host/topology.rs (a hung mount point, with a short bound).
#[doc(hidden)]
#[derive(Clone, Debug)]
pub struct ProbeBound {
    pub in_flight: InFlight,
    pub timeout: Duration,
}

impl Default for ProbeBound {
    fn default() -> Self {
        Self {
            in_flight: IN_FLIGHT.clone(),
            timeout: PROBE_TIMEOUT,
        }
    }
}

/// Discovers every btrfs filesystem in `mounts`. `host_root` is the
/// directory through which the table's mount points are reachable.
pub(crate) fn discover(
    mounts: &[MountEntry],
    host_root: &Path,
    sys_root: &Path,
) -> Vec<BtrfsFilesystem> {
    discover_bounded(mounts, host_root, sys_root, &ProbeBound::default())
}

// Public for tests/tests/host/topology.rs (a hung mount point, with a short bound).
#[doc(hidden)]
pub fn discover_bounded(
    mounts: &[MountEntry],
    host_root: &Path,
    sys_root: &Path,
    bound: &ProbeBound,
) -> Vec<BtrfsFilesystem> {
    let mut fs_devs: Vec<Dev> = mounts
        .iter()
        .filter(|m| m.fs_type == "btrfs")
        .map(|m| m.dev)
        .collect();
    fs_devs.sort();
    fs_devs.dedup();

    let mut out = Vec::with_capacity(fs_devs.len());
    for fs_dev in fs_devs {
        let mut subvolume_devs = Vec::new();
        let mut fsid = None;
        let mut sources = Vec::new();
        let mut hung = false;
        for m in mounts.iter().filter(|m| m.dev == fs_dev) {
            sources.push(m.source.as_str());
            if hung {
                continue;
            }
            let (dev, id) = match probe_mount(bound, host_root, m, fsid.is_none()) {
                MountProbe::Reached { dev, fsid } => (dev, fsid),
                MountProbe::Unreached => continue,
                MountProbe::Hung { since, new } => {
                    // Warned once, when it timed out; later scans answer
                    // from the in-flight set.
                    if new {
                        tracing::warn!(
                            mount_point = %m.mount_point.display(),
                            timeout_ms = bound.timeout.as_millis() as u64,
                            "btrfs mount point does not answer; its members are found by the mount source"
                        );
                    } else {
                        tracing::debug!(
                            mount_point = %m.mount_point.display(),
                            stuck_for_ms = since.elapsed().map_or(0, |d| d.as_millis() as u64),
                            "btrfs mount point still does not answer"
                        );
                    }
                    hung = true;
                    continue;
                }
            };
            if dev != fs_dev && !subvolume_devs.contains(&dev) {
                subvolume_devs.push(dev);
            }
            if fsid.is_none() {
                fsid = id;
            }
        }
        subvolume_devs.sort();

        let mut devices = fsid
            .as_deref()
            .map(|id| member_devices(&sys_root.join("fs/btrfs").join(id)))
            .unwrap_or_default();
        if devices.is_empty() {
            if let Some((id, devs)) = find_by_source(sys_root, host_root, &sources) {
                fsid = Some(id);
                devices = devs;
            }
        }
        if devices.is_empty() {
            tracing::debug!(%fs_dev, "btrfs filesystem without known member devices");
        }
        out.push(BtrfsFilesystem {
            fsid,
            fs_dev,
            devices,
            subvolume_devs,
        });
    }
    out
}

/// What the bounded probe of one mount point found.
// Public for tests/tests/host/topology.rs (a hung mount point is remembered).
#[doc(hidden)]
#[derive(Debug, PartialEq)]
pub enum MountProbe {
    /// The mount's `st_dev`, and its fsid when asked for and answered.
    Reached {
        dev: Dev,
        fsid: Option<String>,
    },
    Unreached,
    /// The probe did not end within the timeout (`new`), or an earlier one
    /// of the same mount point is still blocked.
    Hung {
        since: std::time::SystemTime,
        new: bool,
    },
}

/// [`reach_mount`] and, with `want_fsid`, [`fs_info_fsid`] on a thread of
/// their own, bounded by `bound`.
// Public for tests/tests/host/topology.rs (a hung mount point is remembered).
#[doc(hidden)]
pub fn probe_mount(
    bound: &ProbeBound,
    host_root: &Path,
    m: &MountEntry,
    want_fsid: bool,
) -> MountProbe {
    let key = under_root(host_root, &m.mount_point);
    let claim = match bound.in_flight.claim(&key) {
        Ok(claim) => claim,
        Err(since) => return MountProbe::Hung { since, new: false },
    };
    let deadline = Instant::now() + bound.timeout;
    let (host_root, m) = (host_root.to_path_buf(), m.clone());
    let pending = spawn_claimed(claim, "btrfs-probe", move || {
        let (path, dev) = reach_mount(&host_root, &m)?;
        let fsid = want_fsid
            .then(|| {
                fs_info_fsid(&path)
                    .map_err(|e| tracing::debug!(path = %path.display(), error = %e, "BTRFS_IOC_FS_INFO failed"))
                    .ok()
            })
            .flatten();
        Some((dev, fsid))
    });
    match pending.wait_until(deadline) {
        Bounded::Done(Some((dev, fsid))) => MountProbe::Reached { dev, fsid },
        Bounded::Done(None) => MountProbe::Unreached,
        Bounded::Hung { since } => MountProbe::Hung { since, new: true },
        Bounded::Lost(e) => {
            tracing::debug!(mount_point = %key.display(), "btrfs mount probe lost: {e}");
            MountProbe::Unreached
        }
    }
}

/// A path that leads to mount `m` and the `st_dev` seen there.
///
/// First through `<proc>/<pid>/root` (the table's own namespace), then the
/// mount point as-is in the agent's namespace: `<proc>/1/root` needs ptrace
/// access to pid 1, which root lacks on this VM (EACCES; pid 1 holds a
/// capability we do not). Mount ids are unique system-wide, so a matching
/// `stx_mnt_id` proves the path reached that very mount whichever namespace
/// it went through, and rules out a path covered by a later mount.
fn reach_mount(host_root: &Path, m: &MountEntry) -> Option<(PathBuf, Dev)> {
    let candidates = [under_root(host_root, &m.mount_point), m.mount_point.clone()];
    for path in candidates {
        match statx_dev_and_mount(&path) {
            Ok((dev, mnt_id)) if mnt_id == u64::from(m.mount_id) => return Some((path, dev)),
            Ok(_) => {
                tracing::debug!(path = %path.display(), mount_id = m.mount_id, "path leads to another mount")
            }
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "cannot stat btrfs mount point")
            }
        }
    }
    None
}

/// `root` + absolute `path` (PathBuf::join would replace root).
pub(crate) fn under_root(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn member_devices(fs_dir: &Path) -> Vec<Dev> {
    let Ok(rd) = fs::read_dir(fs_dir.join("devices")) else {
        return Vec::new();
    };
    let mut devs: Vec<Dev> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| read_dev_attr(&e.path().join("dev")))
        .collect();
    devs.sort();
    devs.dedup();
    devs
}

/// Fallback without a reachable mount point: which `/sys/fs/btrfs/<fsid>`
/// lists the mount source as a member, by kernel name (`/dev/loop0` ->
/// `loop0`) or by the device number of the source's device node.
fn find_by_source(
    sys_root: &Path,
    host_root: &Path,
    sources: &[&str],
) -> Option<(String, Vec<Dev>)> {
    let rdevs: Vec<Dev> = sources
        .iter()
        .filter(|s| s.starts_with('/'))
        .filter_map(|s| {
            fs::metadata(under_root(host_root, Path::new(s)))
                .or_else(|_| fs::metadata(s))
                .ok()
        })
        .filter(|md| md.file_type().is_block_device())
        .map(|md| Dev::from_stat(md.rdev()))
        .collect();
    let names: Vec<&str> = sources
        .iter()
        .filter_map(|s| Path::new(s).file_name().and_then(|n| n.to_str()))
        .collect();
    for fs_dir in fs::read_dir(sys_root.join("fs/btrfs"))
        .ok()?
        .filter_map(|e| e.ok())
    {
        let Ok(members) = fs::read_dir(fs_dir.path().join("devices")) else {
            continue;
        };
        let hit = members.filter_map(|e| e.ok()).any(|m| {
            let name = m.file_name();
            names.iter().any(|n| name.as_bytes() == n.as_bytes())
                || read_dev_attr(&m.path().join("dev")).is_some_and(|d| rdevs.contains(&d))
        });
        if hit {
            let id = fs_dir.file_name().to_string_lossy().into_owned();
            return Some((id, member_devices(&fs_dir.path())));
        }
    }
    None
}

/// `st_dev` and mount id of `path`, without triggering automounts or
/// syncing (network filesystems).
fn statx_dev_and_mount(path: &Path) -> std::io::Result<(Dev, u64)> {
    let c = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: a zeroed statx is a valid value of a plain-data struct.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `stx` a writable statx that
    // outlives the call.
    let rc = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_NO_AUTOMOUNT | libc::AT_STATX_DONT_SYNC,
            libc::STATX_MNT_ID,
            &mut stx,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if stx.stx_mask & libc::STATX_MNT_ID == 0 {
        // Kernels before 5.8: we cannot verify which mount we reached.
        return Err(std::io::Error::from(std::io::ErrorKind::Unsupported));
    }
    Ok((
        Dev::new(stx.stx_dev_major, stx.stx_dev_minor),
        stx.stx_mnt_id,
    ))
}

/// `struct btrfs_ioctl_fs_info_args` from linux/btrfs.h (1024 bytes). Only
/// `fsid` is read; the rest mirrors the kernel layout.
#[repr(C)]
#[allow(dead_code)]
struct BtrfsFsInfoArgs {
    max_id: u64,
    num_devices: u64,
    fsid: [u8; 16],
    nodesize: u32,
    sectorsize: u32,
    clone_alignment: u32,
    csum_type: u16,
    csum_size: u16,
    flags: u64,
    generation: u64,
    metadata_uuid: [u8; 16],
    reserved: [u8; 944],
}

const _: () = assert!(std::mem::size_of::<BtrfsFsInfoArgs>() == 1024);

// BTRFS_IOC_FS_INFO = _IOR(BTRFS_IOCTL_MAGIC = 0x94, 31, struct btrfs_ioctl_fs_info_args)
nix::ioctl_read!(btrfs_ioc_fs_info, 0x94, 31, BtrfsFsInfoArgs);

/// The fsid (as named under /sys/fs/btrfs) of the btrfs mounted at `path`.
/// FS_INFO needs no privilege.
fn fs_info_fsid(path: &Path) -> std::io::Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOCTTY)
        .open(path)?;
    // SAFETY: all-zero is a valid BtrfsFsInfoArgs (integers and byte
    // arrays); flags = 0 asks for no optional fields.
    let mut args: BtrfsFsInfoArgs = unsafe { std::mem::zeroed() };
    // SAFETY: `dir` is an open fd for the duration of the call and `args`
    // has the exact size and layout the request code encodes.
    unsafe { btrfs_ioc_fs_info(dir.as_raw_fd(), &mut args) }.map_err(std::io::Error::from)?;
    Ok(format_uuid(&args.fsid))
}

fn format_uuid(b: &[u8; 16]) -> String {
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_mountinfo;

    #[test]
    fn uuid_formatting() {
        let b = [
            0x86, 0xd2, 0x1f, 0x04, 0xcb, 0xec, 0x4a, 0x2a, 0x82, 0x25, 0x86, 0xcc, 0xa3, 0x67,
            0x28, 0xf8,
        ];
        assert_eq!(format_uuid(&b), "86d21f04-cbec-4a2a-8225-86cca36728f8");
    }

    #[test]
    fn unreachable_mounts_fall_back_to_the_source_name() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = fake_sys_with_loop0(tmp.path());

        let mounts = parse_mountinfo(
            "44 27 0:39 / /nowhere/a rw - btrfs /dev/loop0 rw,subvol=/\n\
             45 27 0:39 /sv1 /nowhere/b rw - btrfs /dev/loop0 rw,subvol=/sv1\n\
             46 27 0:50 / /nowhere/c rw - btrfs /dev/unknown rw,subvol=/\n\
             47 27 7:1 / /nowhere/d rw - ext4 /dev/loop1 rw\n",
        )
        .unwrap();
        let found = discover(&mounts, &tmp.path().join("root"), &sys);
        assert_eq!(
            found,
            vec![
                BtrfsFilesystem {
                    fsid: Some("86d21f04-cbec-4a2a-8225-86cca36728f8".into()),
                    fs_dev: Dev::new(0, 39),
                    devices: vec![Dev::new(7, 0)],
                    subvolume_devs: vec![],
                },
                BtrfsFilesystem {
                    fsid: None,
                    fs_dev: Dev::new(0, 50),
                    devices: vec![],
                    subvolume_devs: vec![],
                },
            ]
        );
    }

    const FSID: &str = "86d21f04-cbec-4a2a-8225-86cca36728f8";

    /// A sysfs with block device loop0 (7:0), the one member of [`FSID`].
    fn fake_sys_with_loop0(dir: &Path) -> PathBuf {
        let sys = dir.join("sys");
        let loop0 = sys.join("devices/virtual/block/loop0");
        fs::create_dir_all(&loop0).unwrap();
        fs::write(loop0.join("dev"), "7:0\n").unwrap();
        let members = sys.join("fs/btrfs").join(FSID).join("devices");
        fs::create_dir_all(&members).unwrap();
        std::os::unix::fs::symlink(&loop0, members.join("loop0")).unwrap();
        sys
    }

    #[test]
    fn under_root_keeps_the_root() {
        assert_eq!(
            under_root(Path::new("/proc/1/root"), Path::new("/var/lib")),
            Path::new("/proc/1/root/var/lib")
        );
    }
}
