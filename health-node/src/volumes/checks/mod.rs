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
//! tenant: today only `statvfs` of the mount point itself (filesystem mode),
//! `getxattr` of one attribute nobody sets on it (ext4 and xfs, see
//! `read_only`) and `stat` of the device path (block mode, which kubelet
//! made). No check opens, reads, lists or writes anything inside a volume.
//! A future check that must write (a write probe) writes only its own probe
//! file, created relative to a directory fd of the mount point (`openat`)
//! with `O_CREAT | O_EXCL | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC`, so that a
//! tenant's symlink, FIFO or pre-created file under that name is refused
//! instead of followed, waited on or overwritten; it removes the file with
//! `unlinkat` on the same directory fd, and runs under `Checker::bounded`
//! like every other probe.

mod block;
pub mod mount_time;
mod nfs_server;
mod probe;
mod reachability;
mod read_only;
mod server_state;
mod smb_server;
pub mod stack;
mod usage;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use block::{probe_block, BlockState};
use health_core::conditions::{CheckFinding, CheckKind, CheckResult, Observation};
use health_topology::bounded::InFlight;
use health_topology::MountEntry;
use nfs_server::ServerReplies;
use probe::Probe;
pub use probe::{ProbeError, MAX_PROBE_THREADS};
pub use reachability::is_unreachable_errno;
use reachability::unreachable_or_failed;
use server_state::Failed;
use smb_server::SmbConnections;
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
    /// Where the host's /proc is visible (ext4's options and journal
    /// threads, for the read-only check).
    pub proc_root: PathBuf,
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
            proc_root: PathBuf::from("/proc"),
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
    /// NFS mounts whose probe fails, and their servers' replies.
    servers: Arc<ServerReplies>,
    /// SMB mounts whose probe fails, and their connections.
    smb: Arc<SmbConnections>,
}

impl Checker {
    pub fn new(cfg: CheckConfig) -> Self {
        Self {
            cfg,
            in_flight: InFlight::default(),
            probe_threads: Arc::new(tokio::sync::Semaphore::new(MAX_PROBE_THREADS)),
            servers: Arc::default(),
            smb: Arc::default(),
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

        let path = vol.path.clone();
        let probe = self
            .bounded(&vol.path, move || {
                nix::sys::statvfs::statvfs(&path).map(|st| Usage::from_statvfs(&st))
            })
            .await;
        let (reachability, usage) = match probe {
            Probe::Done(Ok(usage)) => (CheckResult::Pass, Some(usage)),
            Probe::Done(Err(errno)) => (unreachable_or_failed(&vol.path, "statvfs", errno), None),
            Probe::Hung { since } => (self.hung(&vol.path, "statvfs", since), None),
            Probe::Lost(e) => (CheckResult::ProbeFailed(e.to_string()), None),
        };
        let reachability = self.server(vol, mount, reachability);
        let read_only = self.read_only(vol, mount, usage.is_some()).await;
        let stopped = matches!(read_only, Some(CheckResult::Found(_)));
        if let Some(result) = read_only {
            report.push(CheckKind::ReadOnly, result);
        }
        report.push(CheckKind::Reachability, reachability);
        if let Some(usage) = usage {
            // Nobody can fill a filesystem that takes no writes, and
            // read-only media (squashfs, iso9660) report 0 bytes free by
            // design.
            let capacity = if mount.is_read_only() || stopped {
                CheckResult::Pass
            } else {
                evaluate_usage(usage, &self.cfg)
            };
            report.push(CheckKind::Capacity, capacity);
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

    /// A network filesystem's probe that hung or failed is its server's
    /// silence when the client's own state says so ([`nfs_server`],
    /// [`smb_server`]); other mounts keep the probe's result.
    fn server(&self, vol: &KubeletVolume, mount: &MountEntry, probe: CheckResult) -> CheckResult {
        let nfs = ServerReplies::applies(mount);
        if !nfs && !SmbConnections::applies(mount) {
            return probe;
        }
        let errno = match &probe {
            CheckResult::Pass => {
                match nfs {
                    true => self.servers.answered(&mount.mount_point),
                    false => self.smb.answered(&mount.mount_point),
                }
                return probe;
            }
            CheckResult::Found(f) => match f.as_slice() {
                [CheckFinding::PathHung { .. }] => None,
                [CheckFinding::PathUnreachable { errno, .. }] => Some(*errno),
                _ => return probe,
            },
            CheckResult::ProbeFailed(_) => return probe,
        };
        let failed = Failed {
            path: &vol.path,
            op: "statvfs",
            errno,
        };
        let (proc_root, now) = (&self.cfg.proc_root, SystemTime::now());
        let judged = match nfs {
            true => self.servers.judge(proc_root, mount, failed, now),
            false => self.smb.judge(proc_root, mount, failed, now),
        };
        match judged {
            Ok(Some(finding)) => CheckResult::Found(vec![finding]),
            Ok(None) => probe,
            Err(e) => {
                tracing::warn!(path = %vol.path.display(), fs = %mount.fs_type, "cannot read the client's state of the mount's server: {e}");
                probe
            }
        }
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
