//! The read-only check: has the kernel stopped the writes of the filesystem
//! behind a volume after errors, or shut it down, as opposed to a volume
//! mounted read-only on purpose?
//!
//! The per-mount flags miss most of it. What userspace sees once ext4,
//! mounted `errors=remount-ro`, hits an error (measured with
//! `trigger_fs_error` and with real I/O errors on Debian's 5.10.262,
//! 6.1.192 and 6.12.118 and on 6.18; /proc/fs/ext4/<dev>/options says what
//! mountinfo's superblock options say):
//!
//! | kernel | ext4 sets | superblock options | statvfs | writes | reads |
//! |---|---|---|---|---|---|
//! | 5.10 | SB_RDONLY | `ro` (mount `rw`) | ST_RDONLY | EROFS | ok |
//! | 6.1 (since 6.1.113) | an aborted journal | `rw` | rw | EROFS | ok |
//! | 6.6 to 6.14 (6.12) | EXT4_FLAGS_SHUTDOWN | `rw` | rw | EIO | EIO |
//! | 6.15 on (6.18) | EXT4_FLAGS_EMERGENCY_RO | `rw,emergency_ro` | rw | EROFS | ok |
//!
//! The upstream changes behind it: 95257987a638 ("ext4: drop
//! EXT4_MF_FS_ABORTED flag", 6.6) made the error path set the shutdown
//! flag; d3476f3dad4a ("ext4: don't set SB_RDONLY after filesystem
//! errors", 6.11, backported to 6.1.113 where no shutdown flag is set);
//! 8f984530c242 ("ext4: correct behavior under errors=remount-ro mode",
//! 6.15, also in 6.14.3) added EXT4_FLAGS_EMERGENCY_RO, and 6b76715d5e41
//! prints it (and `shutdown`) with the options. An xfs shutdown shows in no
//! flag on any kernel: statvfs still answers, every other metadata call
//! fails with EIO.
//!
//! So, in order, each step only when the one before found nothing:
//! 1. the mount table (free): `emergency_ro` or (ext4) `shutdown` among the
//!    superblock options, or a `ro` superblock under a `rw` mount. ext4
//!    must also have recorded an error for that last one: a superblock
//!    remounted `ro` on purpose shows the same through a `rw` bind mount;
//! 2. ext2/3/4 and xfs: `getxattr` of a name nobody sets on the mount point
//!    ([`PROBE_XATTR`]). Both filesystems test for a shutdown first there
//!    (`ext4_xattr_get`, `xfs_attr_get`) and answer EIO; a healthy one
//!    answers ENODATA. `security.*` because it needs no capability (a
//!    `trusted.*` read without CAP_SYS_ADMIN is answered ENODATA by the VFS
//!    without asking the filesystem) and no LSM answers a foreign name;
//! 3. ext4 with a `rw` superblock: its error record in /sys/fs/ext4/<dev>/
//!    (one small read while the count is 0). Under errors=remount-ro an
//!    error recorded after the mount ([`super::mount_time`]) has stopped
//!    the writes. The record's times are whole seconds: an error less than a
//!    second before the mount counts as after it.
//!
//! Read-only on purpose is no finding: `mount -o ro` makes the superblock
//! `ro` (step 1 wants a `rw` mount over it, step 3 a `rw` superblock), a
//! kubelet `readOnly` bind mount only the mount, and a healthy filesystem
//! passes step 2. What steps 2 and 3 see is the filesystem's own state,
//! reported for every mount of it (read-only bind mounts too): the volume
//! behind them is broken. Not seen: a journal aborted under errors=continue
//! on 6.1, which refuses writes while nothing readable records it.

use std::ffi::{CStr, CString};
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use health_core::conditions::{CheckFinding, CheckResult, ReadOnlyEvidence};
use health_core::dev::Dev;
use health_topology::MountEntry;
use nix::errno::Errno;

use super::mount_time::ext4_mount_time;
use super::probe::{Probe, ProbeError};
use super::Checker;
use crate::volumes::kubelet::KubeletVolume;

/// The extended attribute step 2 asks for; nobody sets it.
const PROBE_XATTR: &CStr = c"security.volume-health-probe";

impl Checker {
    /// The read-only check of `vol` mounted by `mount`; `None` when it
    /// cannot tell (step 2 cannot run on a path that does not answer, or
    /// its probe hangs: the reachability check reports that).
    pub(super) async fn read_only(
        &self,
        vol: &KubeletVolume,
        mount: &MountEntry,
        reachable: bool,
    ) -> Option<CheckResult> {
        match from_mount_table(mount) {
            // A superblock remounted `ro` on purpose looks the same through
            // a `rw` bind mount of it; ext4's error remount recorded an error
            // (sysfs, in memory: read here, it cannot block).
            Some(ReadOnlyEvidence::SuperBlockReadOnly) if is_ext4(&mount.fs_type) => {
                let recorded = block_device_name(&self.cfg.sys_root, mount.dev)
                    .and_then(|name| ext4_errors_recorded(&self.cfg.sys_root, &name));
                return Some(match recorded {
                    Ok(true) => found(mount, ReadOnlyEvidence::SuperBlockReadOnly),
                    Ok(false) => CheckResult::Pass,
                    Err(e) => CheckResult::ProbeFailed(e.to_string()),
                });
            }
            Some(evidence) => return Some(found(mount, evidence)),
            None => {}
        }
        if !has_state_probes(&mount.fs_type) {
            return Some(CheckResult::Pass);
        }
        if !reachable {
            return None;
        }
        let (path, entry) = (vol.path.clone(), mount.clone());
        let (sys_root, proc_root) = (self.cfg.sys_root.clone(), self.cfg.proc_root.clone());
        let probe = self
            .bounded(&vol.path, move || {
                probe_state(&path, &entry, &sys_root, &proc_root)
            })
            .await;
        match probe {
            Probe::Done(Ok(None)) => Some(CheckResult::Pass),
            Probe::Done(Ok(Some(evidence))) => Some(found(mount, evidence)),
            Probe::Done(Err(e)) | Probe::Lost(e) => Some(CheckResult::ProbeFailed(e.to_string())),
            Probe::Hung { .. } => None,
        }
    }
}

fn found(mount: &MountEntry, evidence: ReadOnlyEvidence) -> CheckResult {
    CheckResult::Found(vec![CheckFinding::ReadOnlyRemount {
        mount_point: mount.mount_point.clone(),
        device: mount.dev,
        fs_type: mount.fs_type.clone(),
        evidence,
    }])
}

/// Step 1: what the mount table shows.
pub(super) fn from_mount_table(mount: &MountEntry) -> Option<ReadOnlyEvidence> {
    if mount.has_super_option("emergency_ro") {
        Some(ReadOnlyEvidence::EmergencyRo)
    } else if is_ext4(&mount.fs_type) && mount.has_super_option("shutdown") {
        Some(ReadOnlyEvidence::ShutdownOption)
    } else if mount.has_super_option("ro") && mount.has_mount_option("rw") {
        Some(ReadOnlyEvidence::SuperBlockReadOnly)
    } else {
        None
    }
}

/// Whether steps 2 and 3 know what this filesystem's answers mean.
fn has_state_probes(fs_type: &str) -> bool {
    is_ext4(fs_type) || fs_type == "xfs"
}

/// ext2 and ext3 mounts are served by the ext4 driver (and named by it in
/// /sys/fs/ext4).
fn is_ext4(fs_type: &str) -> bool {
    matches!(fs_type, "ext4" | "ext3" | "ext2")
}

/// Steps 2 and 3; blocking (step 2 reads the root inode's attributes, which
/// a dying disk can hold up).
fn probe_state(
    path: &Path,
    mount: &MountEntry,
    sys_root: &Path,
    proc_root: &Path,
) -> Result<Option<ReadOnlyEvidence>, ProbeError> {
    match xattr_size(path, PROBE_XATTR) {
        Ok(_) | Err(Errno::ENODATA) => {}
        Err(Errno::EIO) => return Ok(Some(ReadOnlyEvidence::ShutdownProbe { op: "getxattr" })),
        Err(errno) => {
            return Err(ProbeError::Sys {
                op: "getxattr",
                path: path.to_path_buf(),
                errno,
            })
        }
    }
    if !is_ext4(&mount.fs_type) || mount.has_super_option("ro") {
        return Ok(None);
    }
    let name = block_device_name(sys_root, mount.dev)?;
    Ok(ext4_errors_since_mount(sys_root, proc_root, &name)?
        .then_some(ReadOnlyEvidence::ErrorsSinceMount))
}

/// `lgetxattr(path, name, NULL, 0)`: the size of the value, or the errno.
fn xattr_size(path: &Path, name: &CStr) -> Result<usize, Errno> {
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: both strings are NUL-terminated and outlive the call; a NULL
    // buffer of size 0 only asks for the size, so nothing is written.
    let n = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) };
    usize::try_from(n).map_err(|_| Errno::last())
}

/// The kernel's name of block device `dev` (`loop0`, `dm-3`, `nvme0n1p1`):
/// what ext4 calls the filesystem in /sys/fs/ext4 and /proc/fs/ext4.
fn block_device_name(sys_root: &Path, dev: Dev) -> Result<String, ProbeError> {
    let link = sys_root.join("dev/block").join(dev.to_string());
    let target = fs::read_link(&link).map_err(|error| ProbeError::Read {
        path: link.clone(),
        error,
    })?;
    target
        .file_name()
        .and_then(|n| n.to_str())
        .map(str::to_string)
        .ok_or_else(|| ProbeError::Parse {
            path: link,
            content: target.display().to_string(),
        })
}

/// Step 3: whether ext4 on `name`, with errors=remount-ro, recorded an
/// error since it was mounted.
fn ext4_errors_since_mount(
    sys_root: &Path,
    proc_root: &Path,
    name: &str,
) -> Result<bool, ProbeError> {
    if !ext4_errors_recorded(sys_root, name)? {
        return Ok(false);
    }
    // /proc/fs/ext4 prints every option, defaults from the superblock too
    // (mountinfo leaves those out).
    let options_path = proc_root.join("fs/ext4").join(name).join("options");
    let options = read(&options_path)?;
    if !options.lines().any(|o| o.trim() == "errors=remount-ro") {
        return Ok(false);
    }
    let last_error = read_number(&sys_root.join("fs/ext4").join(name).join("last_error_time"))?;
    if last_error == 0 {
        return Ok(false);
    }
    let Some(mounted) = ext4_mount_time(sys_root, proc_root, name)? else {
        // No journal, no thread to date the mount: no verdict (a rare
        // setup; the error record still shows as FilesystemErrors).
        return Ok(false);
    };
    Ok(UNIX_EPOCH + Duration::from_secs(last_error) >= mounted)
}

/// Whether ext4 on `name` has recorded errors since its last fsck (a
/// field of its superblock in memory: no I/O).
fn ext4_errors_recorded(sys_root: &Path, name: &str) -> Result<bool, ProbeError> {
    let count = sys_root.join("fs/ext4").join(name).join("errors_count");
    Ok(read_number(&count)? > 0)
}

fn read(path: &Path) -> Result<String, ProbeError> {
    fs::read_to_string(path).map_err(|error| ProbeError::Read {
        path: path.to_path_buf(),
        error,
    })
}

fn read_number(path: &Path) -> Result<u64, ProbeError> {
    let text = read(path)?;
    text.trim().parse().map_err(|_| ProbeError::Parse {
        path: path.to_path_buf(),
        content: text,
    })
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use health_topology::parse_mountinfo;

    use super::super::mount_time::tests::fake_proc;
    use super::*;

    fn entry(line: &str) -> MountEntry {
        parse_mountinfo(line).unwrap().remove(0)
    }

    #[test]
    fn the_mount_table_tells_errors_from_read_only_on_purpose() {
        let cases = [
            // 6.15+: the mount and the superblock still say rw.
            (
                "43 27 7:1 / /a rw,relatime - ext4 /dev/loop1 rw,errors=remount-ro,emergency_ro",
                Some(ReadOnlyEvidence::EmergencyRo),
            ),
            // The same superblock seen through a read-only bind mount.
            (
                "44 27 7:1 / /b ro,relatime - ext4 /dev/loop1 rw,errors=remount-ro,emergency_ro",
                Some(ReadOnlyEvidence::EmergencyRo),
            ),
            (
                "45 27 7:2 / /c rw,relatime - ext4 /dev/loop2 rw,shutdown",
                Some(ReadOnlyEvidence::ShutdownOption),
            ),
            // Only ext4 prints `shutdown` for that.
            ("46 27 7:3 / /d rw,relatime - fuse.x x rw,shutdown", None),
            // 5.10 ext4, btrfs: SB_RDONLY under a rw mount.
            (
                "47 27 7:4 / /e rw,relatime - ext4 /dev/loop4 ro,errors=remount-ro",
                Some(ReadOnlyEvidence::SuperBlockReadOnly),
            ),
            // mount -o ro, and kubelet's readOnly bind mount.
            ("48 27 7:5 / /f ro,relatime - ext4 /dev/loop5 ro", None),
            ("49 27 7:6 / /g ro,relatime - ext4 /dev/loop6 rw", None),
            (
                "50 27 7:7 / /h rw,relatime - xfs /dev/loop7 rw,inode64",
                None,
            ),
        ];
        for (line, want) in cases {
            assert_eq!(from_mount_table(&entry(line)), want, "{line}");
        }
    }

    #[test]
    fn each_evidence_has_its_words() {
        let finding = |fs_type: &str, evidence| CheckFinding::ReadOnlyRemount {
            mount_point: "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount".into(),
            device: Dev::new(7, 2),
            fs_type: fs_type.into(),
            evidence,
        };
        let at = "on 7:2 at /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount";
        let cases = [
            (
                "ext4",
                ReadOnlyEvidence::SuperBlockReadOnly,
                format!("ext4 {at} was remounted read-only after errors (super block ro; mount rw); writes fail with EROFS"),
            ),
            (
                "ext4",
                ReadOnlyEvidence::EmergencyRo,
                format!("ext4 {at} was remounted read-only after errors (emergency_ro); writes fail with EROFS"),
            ),
            (
                "ext4",
                ReadOnlyEvidence::ShutdownOption,
                format!("ext4 {at} was shut down (shutdown); reads and writes fail with EIO"),
            ),
            (
                "xfs",
                ReadOnlyEvidence::ShutdownProbe { op: "getxattr" },
                format!("xfs {at} was shut down (getxattr of the mount point fails with EIO); reads and writes fail with EIO"),
            ),
            (
                "ext4",
                ReadOnlyEvidence::ErrorsSinceMount,
                format!("ext4 {at} was remounted read-only after errors (errors=remount-ro and an error recorded since the mount; mount flags still rw); writes fail with EROFS"),
            ),
        ];
        for (fs_type, evidence, want) in cases {
            let f = finding(fs_type, evidence);
            assert_eq!(f.message(), want);
            assert_eq!(f.reason(), "ReadOnlyRemount");
            assert_eq!(f.status(), health_core::conditions::Status::Inaccessible);
        }
    }

    /// /sys and /proc of one ext4 on loop0 mounted at 1_700_000_012 (its
    /// journal thread started 12.5 s after the boot at 1_700_000_000).
    struct Record {
        _tmp: tempfile::TempDir,
        sys: PathBuf,
        proc_root: PathBuf,
    }

    impl Record {
        fn new(errors: &str) -> Record {
            let tmp = tempfile::tempdir().unwrap();
            let (sys, proc_root) = (tmp.path().join("sys"), tmp.path().join("proc"));
            let ext4 = sys.join("fs/ext4/loop0");
            fs::create_dir_all(&ext4).unwrap();
            fs::write(ext4.join("journal_task"), "0\n").unwrap();
            fs::create_dir_all(sys.join("devices/virtual/block/loop0")).unwrap();
            fs::create_dir_all(sys.join("dev/block")).unwrap();
            std::os::unix::fs::symlink(
                "../../devices/virtual/block/loop0",
                sys.join("dev/block/7:0"),
            )
            .unwrap();
            let options = proc_root.join("fs/ext4/loop0");
            fs::create_dir_all(&options).unwrap();
            fs::write(
                options.join("options"),
                format!("rw\nbsddf\n{errors}\ncommit=5\n"),
            )
            .unwrap();
            fake_proc(&proc_root, &[(290, "jbd2/loop0-8", 1250)]);
            let me = Record {
                _tmp: tmp,
                sys,
                proc_root,
            };
            me.errors(0, 0);
            me
        }

        fn errors(&self, count: u64, last: u64) {
            let dir = self.sys.join("fs/ext4/loop0");
            fs::write(dir.join("errors_count"), format!("{count}\n")).unwrap();
            fs::write(dir.join("last_error_time"), format!("{last}\n")).unwrap();
        }

        fn since_mount(&self) -> Result<bool, ProbeError> {
            let name = block_device_name(&self.sys, Dev::new(7, 0))?;
            assert_eq!(name, "loop0");
            ext4_errors_since_mount(&self.sys, &self.proc_root, &name)
        }
    }

    #[test]
    fn errors_since_the_mount_under_remount_ro_stop_the_writes() {
        let r = Record::new("errors=remount-ro");
        assert!(!r.since_mount().unwrap(), "no errors");
        // Recorded by an earlier mount and never checked by fsck: writable.
        r.errors(2, 1_699_999_000);
        assert!(!r.since_mount().unwrap());
        // The mount's own second counts (both clocks are whole seconds).
        r.errors(3, 1_700_000_012);
        assert!(r.since_mount().unwrap());
        r.errors(3, 1_700_000_600);
        assert!(r.since_mount().unwrap());

        // errors=continue: an error leaves the filesystem writable.
        let r = Record::new("errors=continue");
        r.errors(1, 1_700_000_600);
        assert!(!r.since_mount().unwrap());

        // No journal: nothing dates the mount, no verdict.
        let r = Record::new("errors=remount-ro");
        fs::write(r.sys.join("fs/ext4/loop0/journal_task"), "<none>\n").unwrap();
        r.errors(1, 1_700_000_600);
        assert!(!r.since_mount().unwrap());

        // A record it cannot read is a failed probe, never health.
        fs::remove_file(r.sys.join("fs/ext4/loop0/errors_count")).unwrap();
        let err = r.since_mount().unwrap_err().to_string();
        assert!(
            err.starts_with("reading ") && err.contains("errors_count"),
            "{err}"
        );
    }
}
