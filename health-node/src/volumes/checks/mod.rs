//! Built-in per-volume checks, each bounded by a timeout: [`Checker`] runs
//! them; `usage`, `reachability`, `block` and `probe` hold what they judge and
//! how they probe. Uses `topology` (mounts), `kubelet` and `conditions`.
//!
//! A check answers for one [`CheckKind`] with [`CheckResult::Pass`], findings,
//! or [`CheckResult::ProbeFailed`] when it could not tell (EACCES and the
//! like). A check that cannot run at all for this probe — capacity while the
//! path hangs, anything but the mount check while the mount is missing — is
//! left out of the report: no evidence, so `conditions` keeps what it had.
//!
//! Probes that touch the volume run in `spawn_blocking` under
//! `tokio::time::timeout`. A syscall stuck on a dead NFS server or FUSE daemon
//! cannot be cancelled, so its thread stays blocked; the checker remembers
//! such in-flight probes per path ([`health_topology::bounded::InFlight`]) and answers
//! "still hung" instead of blocking another thread on the same path, and it
//! caps the probe threads at [`MAX_PROBE_THREADS`], stuck ones included.
//!
//! What a check may do below a volume's mount point, which belongs to the
//! tenant: today only `statvfs` of the mount point itself (filesystem mode)
//! and `stat` of the device path (block mode, which kubelet made). No check
//! opens, reads, lists or writes anything inside a volume. A future check
//! that must write (a write probe) writes only its own probe file, created
//! relative to a directory fd of the mount point (`openat`) with
//! `O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`, so that a
//! tenant's symlink, FIFO or pre-created file under that name is refused
//! instead of followed, waited on or overwritten; it removes the file with
//! `unlinkat` on the same directory fd, and runs under `Checker::bounded`
//! like every other probe.

mod block;
mod probe;
mod reachability;
pub mod stack;
mod usage;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use block::{probe_block, BlockState};
use health_core::conditions::{CheckFinding, CheckKind, CheckResult, Observation};
use health_topology::bounded::InFlight;
use health_topology::MountEntry;
pub use probe::MAX_PROBE_THREADS;
use probe::{Probe, ProbeError};
pub use reachability::is_unreachable_errno;
use reachability::unreachable_or_failed;
pub use usage::{evaluate_usage, Usage};

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
    /// Degraded when a thin pool under the volume uses this percentage of
    /// its data or metadata space or more (the stack check).
    pub thin_pool_low_percent: f64,
    /// How often each NVMe controller's SMART / health log is read by the
    /// stack check (sooner after a kernel error); zero: never.
    pub nvme_health_interval: Duration,
}

/// Default of `--nvme-health-interval`: a drive's warnings change over
/// hours; an error on its disks reads the log at once anyway.
pub const DEFAULT_NVME_HEALTH_INTERVAL: Duration = Duration::from_secs(60);

impl Default for CheckConfig {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(5),
            capacity_low_percent: 5.0,
            inodes_low_percent: 5.0,
            sys_root: PathBuf::from("/sys"),
            thin_pool_low_percent: stack::DEFAULT_THIN_POOL_LOW_PERCENT,
            nvme_health_interval: DEFAULT_NVME_HEALTH_INTERVAL,
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

/// Runs the checks; cheap to clone (clones share the in-flight probes and
/// the cap on probe threads).
#[derive(Clone, Debug)]
pub struct Checker {
    cfg: CheckConfig,
    in_flight: InFlight,
    /// One permit per probe thread, held by the thread until the kernel
    /// lets it go.
    probe_threads: Arc<tokio::sync::Semaphore>,
}

impl Checker {
    pub fn new(cfg: CheckConfig) -> Self {
        Self {
            cfg,
            in_flight: InFlight::default(),
            probe_threads: Arc::new(tokio::sync::Semaphore::new(MAX_PROBE_THREADS)),
        }
    }

    pub fn config(&self) -> &CheckConfig {
        &self.cfg
    }

    /// Probes currently blocked in the kernel (each holds a thread).
    pub fn stuck_probes(&self) -> usize {
        self.in_flight.len()
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::kubelet::VolumeKind;

    pub(super) fn cfg() -> CheckConfig {
        CheckConfig::default()
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
}
