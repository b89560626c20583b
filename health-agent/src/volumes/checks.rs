//! Built-in per-volume checks, each bounded by a timeout.
//!
//! A check answers for one [`CheckKind`] with [`CheckResult::Pass`], findings,
//! or [`CheckResult::ProbeFailed`] when it could not tell (EACCES and the
//! like). A check that cannot run at all for this probe — capacity while the
//! path hangs, anything but the mount check while the mount is missing — is
//! left out of the report: no evidence, so `conditions.rs` keeps what it had.
//!
//! Probes that touch the volume run in `spawn_blocking` under
//! `tokio::time::timeout`. A syscall stuck on a dead NFS server or FUSE daemon
//! cannot be cancelled, so its thread stays blocked; the checker remembers
//! such in-flight probes per path and answers "still hung" instead of
//! blocking another thread on the same path.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use nix::errno::Errno;

use crate::dev::Dev;
use crate::topology::MountEntry;
use crate::volumes::conditions::{errno_name, CheckFinding, CheckKind, CheckResult, Observation};
use crate::volumes::kubelet::{KubeletVolume, VolumeMode};

#[derive(Clone, Debug)]
pub struct CheckConfig {
    /// How long one probe of a path may take before it counts as hung.
    pub timeout: Duration,
    /// Degraded below this percentage of free bytes (exhausted at 0).
    pub capacity_low_percent: f64,
    /// Degraded below this percentage of free inodes (exhausted at 0).
    pub inodes_low_percent: f64,
    /// Where the host's /sys is visible.
    pub sys_root: PathBuf,
}

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            capacity_low_percent: 5.0,
            inodes_low_percent: 5.0,
            sys_root: PathBuf::from("/sys"),
        }
    }
}

/// What one round of checks concluded about one volume.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CheckReport {
    pub results: Vec<(CheckKind, CheckResult)>,
}

impl CheckReport {
    pub fn result(&self, kind: CheckKind) -> Option<&CheckResult> {
        self.results
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, r)| r)
    }

    pub fn findings(&self) -> Vec<&CheckFinding> {
        self.results
            .iter()
            .flat_map(|(_, r)| match r {
                CheckResult::Found(f) => f.as_slice(),
                _ => &[],
            })
            .collect()
    }

    /// One observation per check that ran, for `VolumeHealth::apply`.
    pub fn into_observations(self) -> Vec<Observation> {
        self.results
            .into_iter()
            .map(|(check, result)| Observation::Check { check, result })
            .collect()
    }

    fn push(&mut self, kind: CheckKind, result: CheckResult) {
        self.results.push((kind, result));
    }
}

/// Space and inodes as `statvfs` reports them to unprivileged writers
/// (`f_bavail`/`f_favail`: what a pod can still use, without root reserves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

impl Usage {
    // The statvfs field types are u64 on 64-bit Linux but not everywhere.
    #[allow(clippy::unnecessary_cast)]
    pub fn from_statvfs(st: &nix::sys::statvfs::Statvfs) -> Usage {
        let unit = match st.fragment_size() as u64 {
            0 => st.block_size() as u64,
            f => f,
        };
        Usage {
            total_bytes: (st.blocks() as u64).saturating_mul(unit),
            free_bytes: (st.blocks_available() as u64).saturating_mul(unit),
            total_inodes: st.files() as u64,
            free_inodes: st.files_available() as u64,
        }
    }
}

/// Capacity and inode findings against the thresholds. Filesystems that do
/// not count (total 0: some FUSE filesystems, btrfs inodes) are not judged.
pub fn evaluate_usage(u: Usage, cfg: &CheckConfig) -> CheckResult {
    let mut findings = Vec::new();
    if u.total_bytes > 0 {
        if u.free_bytes == 0 {
            findings.push(CheckFinding::CapacityExhausted {
                total_bytes: u.total_bytes,
            });
        } else if below(u.free_bytes, u.total_bytes, cfg.capacity_low_percent) {
            findings.push(CheckFinding::CapacityLow {
                free_bytes: u.free_bytes,
                total_bytes: u.total_bytes,
                threshold_percent: cfg.capacity_low_percent,
            });
        }
    }
    if u.total_inodes > 0 {
        if u.free_inodes == 0 {
            findings.push(CheckFinding::InodesExhausted {
                total: u.total_inodes,
            });
        } else if below(u.free_inodes, u.total_inodes, cfg.inodes_low_percent) {
            findings.push(CheckFinding::InodesLow {
                free: u.free_inodes,
                total: u.total_inodes,
                threshold_percent: cfg.inodes_low_percent,
            });
        }
    }
    if findings.is_empty() {
        CheckResult::Pass
    } else {
        CheckResult::Found(findings)
    }
}

fn below(free: u64, total: u64, percent: f64) -> bool {
    (free as f64) * 100.0 < percent * (total as f64)
}

/// Errors that are evidence that the path cannot be used (as opposed to
/// errors that only say this probe could not look, like EACCES).
pub fn is_unreachable_errno(e: Errno) -> bool {
    use Errno::*;
    matches!(
        e,
        EIO | ENOTCONN
            | ESTALE
            | ENOENT
            | ENOTDIR
            | ENXIO
            | ENODEV
            | ENOMEDIUM
            | EHOSTDOWN
            | EHOSTUNREACH
            | ENETUNREACH
            | ENETDOWN
            | ETIMEDOUT
            | ECONNREFUSED
            | ECONNRESET
            | ECONNABORTED
            | ENOLINK
            | EREMOTEIO
            | ESHUTDOWN
            | EUCLEAN
    )
}

#[derive(Debug, thiserror::Error)]
enum ProbeError {
    #[error("{op} {}: {}", .path.display(), errno_name(*.errno as i32))]
    Sys {
        op: &'static str,
        path: PathBuf,
        errno: Errno,
    },
    #[error("reading {}: {source}", .path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: unexpected content {content:?}", .path.display())]
    Parse { path: PathBuf, content: String },
    #[error("probe thread failed: {0}")]
    Join(String),
}

/// How a bounded probe ended.
enum Probe<T> {
    Done(T),
    /// Timed out now, or an earlier probe of the same path is still stuck;
    /// `since` is when that stuck probe started.
    Hung {
        since: SystemTime,
    },
    Lost(ProbeError),
}

/// What the block probe learned about a block volume's device.
enum BlockState {
    Present,
    Missing(String),
    ZeroSize(Dev),
}

/// Paths with a probe still blocked in the kernel, and since when.
type InFlight = Arc<Mutex<HashMap<PathBuf, SystemTime>>>;

fn lock(m: &Mutex<HashMap<PathBuf, SystemTime>>) -> MutexGuard<'_, HashMap<PathBuf, SystemTime>> {
    // A panic elsewhere while holding the lock leaves a map that is still
    // consistent (single inserts/removes), so keep using it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes a path from the in-flight set when its blocking probe ends, even
/// by panic: only the probe thread knows when the kernel let go.
struct InFlightGuard {
    map: InFlight,
    path: PathBuf,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        lock(&self.map).remove(&self.path);
    }
}

/// Runs the checks; cheap to clone (clones share the in-flight probes).
#[derive(Clone, Debug)]
pub struct Checker {
    cfg: CheckConfig,
    in_flight: InFlight,
}

impl Checker {
    pub fn new(cfg: CheckConfig) -> Self {
        Self {
            cfg,
            in_flight: Arc::default(),
        }
    }

    pub fn config(&self) -> &CheckConfig {
        &self.cfg
    }

    /// Probes currently blocked in the kernel (each holds a thread).
    pub fn stuck_probes(&self) -> usize {
        lock(&self.in_flight).len()
    }

    /// Runs every check that applies to `vol`; `mounts` is a recent mount table.
    pub async fn check_volume(&self, vol: &KubeletVolume, mounts: &[MountEntry]) -> CheckReport {
        match vol.volume_mode {
            VolumeMode::Filesystem => self.check_filesystem(vol, mounts).await,
            VolumeMode::Block => self.check_block(vol).await,
        }
    }

    async fn check_filesystem(&self, vol: &KubeletVolume, mounts: &[MountEntry]) -> CheckReport {
        let mut report = CheckReport::default();
        // The topmost mount at the path is the one the pod sees.
        let Some(mount) = mounts.iter().rev().find(|m| m.mount_point == vol.path) else {
            // Without the mount, statvfs would describe the kubelet's own
            // filesystem: nothing else can be judged.
            report.push(
                CheckKind::Mount,
                CheckResult::Found(vec![CheckFinding::MountMissing {
                    path: vol.path.clone(),
                }]),
            );
            return report;
        };
        report.push(CheckKind::Mount, CheckResult::Pass);

        let ro = if mount.is_error_read_only() {
            CheckResult::Found(vec![CheckFinding::ReadOnlyRemount {
                mount_point: mount.mount_point.clone(),
                device: mount.dev,
                fs_type: mount.fs_type.clone(),
            }])
        } else {
            // Read-only on purpose (`readOnly: true`, `mount -o ro`) is fine.
            CheckResult::Pass
        };
        report.push(CheckKind::ReadOnly, ro);

        let path = vol.path.clone();
        let probe = self
            .bounded(&vol.path, move || {
                nix::sys::statvfs::statvfs(&path).map(|st| Usage::from_statvfs(&st))
            })
            .await;
        match probe {
            Probe::Done(Ok(usage)) => {
                report.push(CheckKind::Reachability, CheckResult::Pass);
                // Nobody can fill a read-only filesystem, and read-only media
                // (squashfs, iso9660) report 0 bytes free by design.
                let capacity = if mount.is_read_only() {
                    CheckResult::Pass
                } else {
                    evaluate_usage(usage, &self.cfg)
                };
                report.push(CheckKind::Capacity, capacity);
            }
            Probe::Done(Err(errno)) => {
                report.push(
                    CheckKind::Reachability,
                    unreachable_or_failed(&vol.path, "statvfs", errno),
                );
            }
            Probe::Hung { since } => report.push(
                CheckKind::Reachability,
                self.hung(&vol.path, "statvfs", since),
            ),
            Probe::Lost(e) => report.push(
                CheckKind::Reachability,
                CheckResult::ProbeFailed(e.to_string()),
            ),
        }
        report
    }

    async fn check_block(&self, vol: &KubeletVolume) -> CheckReport {
        let mut report = CheckReport::default();
        let path = vol.path.clone();
        let sys = self.cfg.sys_root.clone();
        match self
            .bounded(&vol.path, move || probe_block(&path, &sys))
            .await
        {
            Probe::Done(Ok(state)) => {
                report.push(CheckKind::Reachability, CheckResult::Pass);
                let device = match state {
                    BlockState::Present => CheckResult::Pass,
                    BlockState::Missing(detail) => {
                        CheckResult::Found(vec![CheckFinding::DeviceMissing {
                            path: vol.path.clone(),
                            detail,
                        }])
                    }
                    BlockState::ZeroSize(device) => {
                        CheckResult::Found(vec![CheckFinding::DeviceZeroSize {
                            path: vol.path.clone(),
                            device,
                        }])
                    }
                };
                report.push(CheckKind::Device, device);
            }
            Probe::Done(Err(ProbeError::Sys { op, errno, .. })) if is_unreachable_errno(errno) => {
                report.push(
                    CheckKind::Reachability,
                    unreachable_or_failed(&vol.path, op, errno),
                );
            }
            Probe::Done(Err(e)) | Probe::Lost(e) => {
                report.push(CheckKind::Device, CheckResult::ProbeFailed(e.to_string()));
            }
            Probe::Hung { since } => {
                report.push(CheckKind::Reachability, self.hung(&vol.path, "stat", since))
            }
        }
        report
    }

    fn hung(&self, path: &Path, op: &'static str, since: SystemTime) -> CheckResult {
        CheckResult::Found(vec![CheckFinding::PathHung {
            path: path.to_path_buf(),
            op,
            since,
            timeout: self.cfg.timeout,
        }])
    }

    /// Runs `f` on a blocking thread for at most the configured timeout,
    /// unless a probe of `path` is still stuck from before.
    async fn bounded<T, F>(&self, path: &Path, f: F) -> Probe<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let since = SystemTime::now();
        {
            let mut in_flight = lock(&self.in_flight);
            if let Some(since) = in_flight.get(path) {
                return Probe::Hung { since: *since };
            }
            in_flight.insert(path.to_path_buf(), since);
        }
        let guard = InFlightGuard {
            map: Arc::clone(&self.in_flight),
            path: path.to_path_buf(),
        };
        let task = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            f()
        });
        // On timeout the JoinHandle is dropped, which detaches the thread; it
        // clears its in-flight entry whenever the kernel lets it go.
        match tokio::time::timeout(self.cfg.timeout, task).await {
            Ok(Ok(out)) => Probe::Done(out),
            Ok(Err(join)) => Probe::Lost(ProbeError::Join(join.to_string())),
            Err(_elapsed) => Probe::Hung { since },
        }
    }
}

fn unreachable_or_failed(path: &Path, op: &'static str, errno: Errno) -> CheckResult {
    if is_unreachable_errno(errno) {
        CheckResult::Found(vec![CheckFinding::PathUnreachable {
            path: path.to_path_buf(),
            op,
            errno: errno as i32,
        }])
    } else {
        CheckResult::ProbeFailed(
            ProbeError::Sys {
                op,
                path: path.to_path_buf(),
                errno,
            }
            .to_string(),
        )
    }
}

/// stat the block volume's path (following the pod's symlink to the node),
/// then ask sysfs whether the kernel still has that device and its size.
/// Runs on a blocking thread.
fn probe_block(path: &Path, sys_root: &Path) -> Result<BlockState, ProbeError> {
    let st = match nix::sys::stat::stat(path) {
        Ok(st) => st,
        Err(errno @ (Errno::ENOENT | Errno::ENOTDIR)) => {
            return Ok(BlockState::Missing(format!(
                "the device node is gone ({})",
                errno_name(errno as i32)
            )))
        }
        Err(errno) => {
            return Err(ProbeError::Sys {
                op: "stat",
                path: path.to_path_buf(),
                errno,
            })
        }
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFBLK {
        return Ok(BlockState::Missing("not a block device node".into()));
    }
    if st.st_rdev == 0 {
        return Ok(BlockState::Missing("device number 0:0".into()));
    }
    let dev = Dev::from_stat(st.st_rdev);
    let dir = sys_root.join("dev/block").join(dev.to_string());
    match fs::metadata(&dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(BlockState::Missing(format!(
                "the kernel has no block device {dev} (no {})",
                dir.display()
            )))
        }
        Err(source) => return Err(ProbeError::Read { path: dir, source }),
    }
    let size_path = dir.join("size");
    let text = fs::read_to_string(&size_path).map_err(|source| ProbeError::Read {
        path: size_path.clone(),
        source,
    })?;
    match text.trim().parse::<u64>() {
        Ok(0) => Ok(BlockState::ZeroSize(dev)),
        Ok(_) => Ok(BlockState::Present),
        Err(_) => Err(ProbeError::Parse {
            path: size_path,
            content: text,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::conditions::{Status, VolumeHealth};
    use crate::volumes::kubelet::VolumeKind;

    fn cfg() -> CheckConfig {
        CheckConfig::default()
    }

    #[test]
    fn usage_thresholds() {
        let u = |free_bytes, free_inodes| Usage {
            total_bytes: 1000,
            free_bytes,
            total_inodes: 200,
            free_inodes,
        };
        assert_eq!(evaluate_usage(u(500, 100), &cfg()), CheckResult::Pass);
        // Exactly 5 % is not below 5 %.
        assert_eq!(evaluate_usage(u(50, 10), &cfg()), CheckResult::Pass);
        let reasons = |r: CheckResult| match r {
            CheckResult::Found(f) => f.iter().map(|f| f.reason()).collect::<Vec<_>>(),
            other => panic!("expected findings, got {other:?}"),
        };
        assert_eq!(
            reasons(evaluate_usage(u(49, 9), &cfg())),
            ["CapacityLow", "InodesLow"]
        );
        assert_eq!(
            reasons(evaluate_usage(u(0, 0), &cfg())),
            ["CapacityExhausted", "InodesExhausted"]
        );
        // Filesystems without inode accounting are not judged on inodes.
        let btrfs_like = Usage {
            total_inodes: 0,
            free_inodes: 0,
            ..u(500, 0)
        };
        assert_eq!(evaluate_usage(btrfs_like, &cfg()), CheckResult::Pass);
        match evaluate_usage(u(10, 100), &cfg()) {
            CheckResult::Found(f) => {
                assert_eq!(
                    f[0].message(),
                    "10 of 1000 bytes free (10 B of 1000 B, 1.00%), below 5%"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errno_classification_keeps_can_not_look_apart_from_broken() {
        for e in [Errno::EIO, Errno::ENOTCONN, Errno::ESTALE, Errno::ETIMEDOUT] {
            assert!(is_unreachable_errno(e), "{e}");
            assert!(matches!(
                unreachable_or_failed(Path::new("/v"), "statvfs", e),
                CheckResult::Found(_)
            ));
        }
        for e in [Errno::EACCES, Errno::EPERM, Errno::ENOMEM, Errno::EINTR] {
            assert!(!is_unreachable_errno(e), "{e}");
            match unreachable_or_failed(Path::new("/v"), "statvfs", e) {
                CheckResult::ProbeFailed(msg) => assert!(msg.contains("statvfs /v"), "{msg}"),
                other => panic!("{e}: {other:?}"),
            }
        }
        // A probe failure is no recovery for the machine either.
        let mut h = VolumeHealth::default();
        let t = SystemTime::UNIX_EPOCH;
        let unreachable = unreachable_or_failed(Path::new("/v"), "statvfs", Errno::EIO);
        h.apply(
            t,
            Observation::Check {
                check: CheckKind::Reachability,
                result: unreachable,
            },
        );
        let eacces = unreachable_or_failed(Path::new("/v"), "statvfs", Errno::EACCES);
        let changes = h.apply(
            t,
            Observation::Check {
                check: CheckKind::Reachability,
                result: eacces,
            },
        );
        assert!(changes.is_empty());
        assert_eq!(h.worst(), Some(Status::Inaccessible));
    }

    #[test]
    fn missing_mount_reports_only_the_mount() {
        let vol = fs_volume(PathBuf::from("/nonexistent/volume/mount"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let report = rt.block_on(Checker::new(cfg()).check_volume(&vol, &[]));
        assert_eq!(report.results.len(), 1, "{report:?}");
        assert_eq!(report.findings()[0].reason(), "MountMissing");
    }

    fn fs_volume(path: PathBuf) -> KubeletVolume {
        KubeletVolume {
            pod_uid: "pod".into(),
            pv: Some("pv".into()),
            pod_volume_dir_name: "pv".into(),
            driver: None,
            volume_handle: None,
            volume_mode: VolumeMode::Filesystem,
            kind: VolumeKind::LocalVolume,
            path,
            staging_path: None,
            node_name: None,
        }
    }

    fn block_volume(path: PathBuf) -> KubeletVolume {
        KubeletVolume {
            volume_mode: VolumeMode::Block,
            ..fs_volume(path)
        }
    }

    /// Real-kernel tests: loop devices, mounts, FUSE. They need root and fail
    /// (not skip) without it.
    mod real {
        use super::*;
        use std::os::fd::OwnedFd;
        use std::process::Command;
        use std::time::Instant;

        use nix::mount::{umount2, MntFlags};

        use crate::topology::{read_mounts, HostPaths};

        fn require_root() {
            assert!(
                nix::unistd::geteuid().is_root(),
                "checks::tests::real needs root (loop devices, mount, FUSE); run the tests as root"
            );
        }

        fn run(cmd: &str, args: &[&str]) -> String {
            let out = Command::new(cmd)
                .args(args)
                .output()
                .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
            assert!(
                out.status.success(),
                "{cmd} {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).trim().to_string()
        }

        fn mounts() -> Vec<MountEntry> {
            read_mounts(&HostPaths::default()).expect("read the mount table")
        }

        /// A loop device over a sparse image in a temp dir, optionally with a
        /// mounted ext4; torn down in reverse on drop, also after a failure.
        struct LoopFs {
            dir: tempfile::TempDir,
            device: Option<String>,
            mounted: bool,
        }

        impl LoopFs {
            fn device(size_mib: u64) -> LoopFs {
                require_root();
                let dir = tempfile::tempdir().unwrap();
                let image = dir.path().join("disk.img");
                fs::File::create(&image)
                    .and_then(|f| f.set_len(size_mib << 20))
                    .unwrap();
                let mut me = LoopFs {
                    dir,
                    device: None,
                    mounted: false,
                };
                me.device = Some(run("losetup", &["-f", "--show", image.to_str().unwrap()]));
                me
            }

            /// ext4 with 1 KiB blocks and no root reserve, so that statvfs
            /// numbers are simple; lazy init off so that nothing changes
            /// free counts behind the test's back.
            fn ext4(size_mib: u64, extra_mkfs: &[&str], options: &str) -> LoopFs {
                let mut me = LoopFs::device(size_mib);
                let dev = me.dev_path().to_string();
                let mut args = vec![
                    "-q",
                    "-F",
                    "-b",
                    "1024",
                    "-m",
                    "0",
                    "-E",
                    "lazy_itable_init=0,lazy_journal_init=0",
                ];
                args.extend_from_slice(extra_mkfs);
                args.push(&dev);
                run("mkfs.ext4", &args);
                let mnt = me.mount_point();
                fs::create_dir(&mnt).unwrap();
                run(
                    "mount",
                    &["-t", "ext4", "-o", options, &dev, mnt.to_str().unwrap()],
                );
                me.mounted = true;
                me
            }

            fn dev_path(&self) -> &str {
                self.device.as_deref().expect("loop device attached")
            }

            fn mount_point(&self) -> PathBuf {
                self.dir.path().join("mnt")
            }
        }

        impl Drop for LoopFs {
            fn drop(&mut self) {
                if self.mounted {
                    let mnt = self.mount_point();
                    if umount2(&mnt, MntFlags::empty()).is_err() {
                        let _ = umount2(&mnt, MntFlags::MNT_DETACH);
                    }
                }
                if let Some(dev) = &self.device {
                    let _ = Command::new("losetup").args(["-d", dev]).status();
                }
            }
        }

        fn statvfs_usage(path: &Path) -> Usage {
            Usage::from_statvfs(&nix::sys::statvfs::statvfs(path).unwrap())
        }

        /// Allocates `bytes` in a new file (rounded down to whole KiB).
        fn fallocate(path: &Path, bytes: u64) -> nix::Result<()> {
            let f = fs::File::create(path)
                .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
            nix::fcntl::fallocate(
                &f,
                nix::fcntl::FallocateFlags::empty(),
                0,
                (bytes & !1023) as libc::off_t,
            )
        }

        fn runtime() -> tokio::runtime::Runtime {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .unwrap()
        }

        #[test]
        fn healthy_ext4_has_no_findings() {
            let fs = LoopFs::ext4(16, &[], "errors=remount-ro");
            let vol = fs_volume(fs.mount_point());
            let report = runtime().block_on(Checker::new(cfg()).check_volume(&vol, &mounts()));
            let kinds: Vec<CheckKind> = report.results.iter().map(|(k, _)| *k).collect();
            assert_eq!(
                kinds,
                [
                    CheckKind::Mount,
                    CheckKind::ReadOnly,
                    CheckKind::Reachability,
                    CheckKind::Capacity
                ]
            );
            assert!(
                report.results.iter().all(|(_, r)| *r == CheckResult::Pass),
                "{report:#?}"
            );
        }

        #[test]
        fn filled_ext4_is_low_then_exhausted_with_exact_numbers() {
            let fs = LoopFs::ext4(16, &[], "errors=remount-ro");
            let mnt = fs.mount_point();
            let vol = fs_volume(mnt.clone());
            let checker = Checker::new(cfg());
            let rt = runtime();

            // Leave about 3 % free.
            let u = statvfs_usage(&mnt);
            let keep = u.total_bytes * 3 / 100;
            fallocate(&mnt.join("ballast"), u.free_bytes - keep).unwrap();
            let report = rt.block_on(checker.check_volume(&vol, &mounts()));
            let u = statvfs_usage(&mnt);
            assert!(
                u.free_bytes > 0 && u.free_bytes * 100 < u.total_bytes * 5,
                "{u:?}"
            );
            let expected = CheckFinding::CapacityLow {
                free_bytes: u.free_bytes,
                total_bytes: u.total_bytes,
                threshold_percent: 5.0,
            };
            assert_eq!(report.findings(), [&expected], "{report:#?}");
            let msg = expected.message();
            assert!(
                msg.starts_with(&format!("{} of {} bytes free", u.free_bytes, u.total_bytes)),
                "{msg}"
            );

            // To the brim: allocate until the filesystem says no.
            let mut chunk = u.free_bytes;
            let mut n = 0;
            while chunk >= 1024 {
                n += 1;
                if fallocate(&mnt.join(format!("brim{n}")), chunk).is_err() {
                    chunk /= 2;
                }
            }
            let report = rt.block_on(checker.check_volume(&vol, &mounts()));
            let u = statvfs_usage(&mnt);
            assert_eq!(u.free_bytes, 0, "{u:?}");
            let expected = CheckFinding::CapacityExhausted {
                total_bytes: u.total_bytes,
            };
            assert_eq!(report.findings(), [&expected], "{report:#?}");
            assert_eq!(
                expected.message(),
                format!(
                    "0 of {} bytes free ({}): no space left",
                    u.total_bytes,
                    crate::volumes::conditions::human_bytes(u.total_bytes)
                )
            );

            // Into the machine: one change, then silence.
            let mut health = VolumeHealth::default();
            let now = SystemTime::now();
            let raised: Vec<_> = report
                .clone()
                .into_observations()
                .into_iter()
                .flat_map(|o| health.apply(now, o))
                .collect();
            assert_eq!(raised.len(), 1, "{raised:?}");
            assert_eq!(health.worst(), Some(Status::Degraded));
            for o in report.into_observations() {
                assert!(health.apply(now, o).is_empty());
            }
        }

        #[test]
        fn inodes_exhausted() {
            let fs = LoopFs::ext4(8, &["-N", "64"], "errors=remount-ro");
            let mnt = fs.mount_point();
            let mut n = 0;
            while fs::File::create(mnt.join(format!("f{n}"))).is_ok() {
                n += 1;
                assert!(n < 10_000, "inodes never ran out");
            }
            let report = runtime()
                .block_on(Checker::new(cfg()).check_volume(&fs_volume(mnt.clone()), &mounts()));
            let u = statvfs_usage(&mnt);
            assert_eq!(
                report.findings(),
                [&CheckFinding::InodesExhausted {
                    total: u.total_inodes
                }],
                "{report:#?}"
            );
        }

        #[test]
        fn read_only_on_purpose_is_fine_but_an_error_remount_is_not() {
            let fs = LoopFs::ext4(16, &[], "errors=remount-ro");
            let mnt = fs.mount_point();
            let vol = fs_volume(mnt.clone());
            let checker = Checker::new(cfg());
            let rt = runtime();

            run("mount", &["-o", "remount,ro", mnt.to_str().unwrap()]);
            let report = rt.block_on(checker.check_volume(&vol, &mounts()));
            assert!(report.findings().is_empty(), "{report:#?}");
            assert_eq!(report.result(CheckKind::ReadOnly), Some(&CheckResult::Pass));
            run("mount", &["-o", "remount,rw", mnt.to_str().unwrap()]);

            // A real ext4 error, through the kernel's own error path.
            let name = fs.dev_path().trim_start_matches("/dev/");
            let trigger = format!("/sys/fs/ext4/{name}/trigger_fs_error");
            fs::write(&trigger, "1").unwrap_or_else(|e| panic!("{trigger}: {e}"));
            let table = mounts();
            let entry = table.iter().rev().find(|m| m.mount_point == mnt).unwrap();
            assert!(entry.is_error_read_only(), "{entry:?}");
            let report = rt.block_on(checker.check_volume(&vol, &table));
            let expected = CheckFinding::ReadOnlyRemount {
                mount_point: mnt.clone(),
                device: entry.dev,
                fs_type: "ext4".into(),
            };
            assert_eq!(report.findings(), [&expected], "{report:#?}");
            assert!(expected.message().contains(&entry.dev.to_string()));
            // Writes really fail with EROFS.
            let err = fs::write(mnt.join("x"), "x").unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EROFS));
        }

        /// A FUSE mount whose "server" never answers: the test opens
        /// /dev/fuse and mounts with that fd but never reads it, so the
        /// kernel's INIT stays unanswered and every request on the mount
        /// (statvfs, stat of the root) waits — exactly what a SIGSTOPped or
        /// wedged FUSE daemon does, without a daemon. Closing the fd aborts
        /// the connection: waiters get ENOTCONN and the mount can go.
        struct DeadFuse {
            dir: tempfile::TempDir,
            fd: Option<OwnedFd>,
            mounted: bool,
        }

        impl DeadFuse {
            fn new() -> DeadFuse {
                require_root();
                let dir = tempfile::tempdir().unwrap();
                let fd: OwnedFd = fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open("/dev/fuse")
                    .expect("open /dev/fuse")
                    .into();
                let mut me = DeadFuse {
                    dir,
                    fd: None,
                    mounted: false,
                };
                let data = format!(
                    "fd={},rootmode=40000,user_id=0,group_id=0",
                    std::os::fd::AsRawFd::as_raw_fd(&fd)
                );
                me.fd = Some(fd);
                nix::mount::mount(
                    Some("volume-health-test-hang"),
                    me.dir.path(),
                    Some("fuse"),
                    nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
                    Some(data.as_str()),
                )
                .expect("mount fuse");
                me.mounted = true;
                me
            }

            fn path(&self) -> PathBuf {
                self.dir.path().to_path_buf()
            }

            /// Like the daemon dying: abort the connection.
            fn abort(&mut self) {
                self.fd = None;
            }
        }

        impl Drop for DeadFuse {
            fn drop(&mut self) {
                self.abort();
                if self.mounted && umount2(self.dir.path(), MntFlags::empty()).is_err() {
                    let _ = umount2(self.dir.path(), MntFlags::MNT_DETACH);
                }
            }
        }

        #[test]
        fn hung_path_is_path_hung_and_never_probed_twice() {
            let mut fuse = DeadFuse::new();
            let vol = fs_volume(fuse.path());
            let timeout = Duration::from_millis(1500);
            let checker = Checker::new(CheckConfig { timeout, ..cfg() });
            let rt = runtime();
            let table = mounts();

            let started = Instant::now();
            let first = rt.block_on(checker.check_volume(&vol, &table));
            let took = started.elapsed();
            assert!(
                took >= timeout && took < timeout + Duration::from_secs(2),
                "{took:?}"
            );
            let hung = match first.result(CheckKind::Reachability) {
                Some(CheckResult::Found(f)) if f[0].reason() == "PathHung" => f[0].clone(),
                other => panic!("expected PathHung, got {other:?} in {first:#?}"),
            };
            assert!(hung.message().contains("statvfs of"), "{}", hung.message());
            // Capacity cannot be judged while the path hangs: no result.
            assert_eq!(first.result(CheckKind::Capacity), None);
            assert_eq!(first.result(CheckKind::Mount), Some(&CheckResult::Pass));
            assert_eq!(checker.stuck_probes(), 1);

            // The probe is still stuck: answered at once, no second thread,
            // the same finding (same message: no write churn).
            let started = Instant::now();
            let second = rt.block_on(checker.check_volume(&vol, &table));
            assert!(started.elapsed() < Duration::from_millis(200));
            assert_eq!(
                second.result(CheckKind::Reachability),
                Some(&CheckResult::Found(vec![hung]))
            );
            assert_eq!(checker.stuck_probes(), 1);

            // The daemon goes away: the stuck thread comes back...
            fuse.abort();
            let deadline = Instant::now() + Duration::from_secs(5);
            while checker.stuck_probes() > 0 {
                assert!(Instant::now() < deadline, "stuck probe never returned");
                std::thread::sleep(Duration::from_millis(20));
            }
            // ...and the path now fails outright.
            let third = rt.block_on(checker.check_volume(&vol, &table));
            match third.result(CheckKind::Reachability) {
                Some(CheckResult::Found(f)) => assert_eq!(
                    f[0],
                    CheckFinding::PathUnreachable {
                        path: fuse.path(),
                        op: "statvfs",
                        errno: libc::ENOTCONN
                    }
                ),
                other => panic!("expected PathUnreachable, got {other:?}"),
            }
            drop(fuse);
            rt.shutdown_timeout(Duration::from_secs(1));
        }

        #[test]
        fn block_volume_device_checks() {
            let disk = LoopFs::device(4);
            let tmp = tempfile::tempdir().unwrap();
            let checker = Checker::new(cfg());
            let rt = runtime();

            // Kubelet's shape: a symlink to the device node.
            let link = tmp.path().join("pv-blk");
            std::os::unix::fs::symlink(disk.dev_path(), &link).unwrap();
            let report = rt.block_on(checker.check_volume(&block_volume(link.clone()), &[]));
            assert_eq!(
                report.results,
                [
                    (CheckKind::Reachability, CheckResult::Pass),
                    (CheckKind::Device, CheckResult::Pass)
                ]
            );

            let device = |r: &CheckReport| match r.result(CheckKind::Device) {
                Some(CheckResult::Found(f)) => f[0].clone(),
                other => panic!("expected a device finding, got {other:?}"),
            };

            // A device number the kernel does not have.
            let ghost = tmp.path().join("ghost");
            nix::sys::stat::mknod(
                &ghost,
                nix::sys::stat::SFlag::S_IFBLK,
                nix::sys::stat::Mode::from_bits_truncate(0o600),
                libc::makedev(7, 1_000_000),
            )
            .unwrap();
            let f = device(&rt.block_on(checker.check_volume(&block_volume(ghost.clone()), &[])));
            assert_eq!(f.reason(), "DeviceMissing");
            assert!(
                f.message().contains("no block device 7:1000000"),
                "{}",
                f.message()
            );

            // Zero size, as sysfs says it (a fake sys root keeps this
            // deterministic: real loop devices get grabbed by others).
            let sys = tempfile::tempdir().unwrap();
            let ghost_dir = sys.path().join("dev/block/7:1000000");
            fs::create_dir_all(&ghost_dir).unwrap();
            fs::write(ghost_dir.join("size"), "0\n").unwrap();
            let fake = Checker::new(CheckConfig {
                sys_root: sys.path().to_path_buf(),
                ..cfg()
            });
            let f = device(&rt.block_on(fake.check_volume(&block_volume(ghost.clone()), &[])));
            assert_eq!(
                f,
                CheckFinding::DeviceZeroSize {
                    path: ghost.clone(),
                    device: Dev::new(7, 1_000_000)
                }
            );

            // The pod's link dangles, or points at something else.
            fs::remove_file(&ghost).unwrap();
            std::os::unix::fs::symlink(&ghost, tmp.path().join("dangling")).unwrap();
            let f = device(
                &rt.block_on(checker.check_volume(&block_volume(tmp.path().join("dangling")), &[])),
            );
            assert_eq!(f.reason(), "DeviceMissing");
            assert!(f.message().contains("ENOENT"), "{}", f.message());
            let file = tmp.path().join("file");
            fs::write(&file, "").unwrap();
            let f = device(&rt.block_on(checker.check_volume(&block_volume(file), &[])));
            assert!(
                f.message().contains("not a block device"),
                "{}",
                f.message()
            );
        }
    }
}
