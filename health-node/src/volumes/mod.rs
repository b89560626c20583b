//! The volumes stage: pod volumes and the evidence that bears on them.
//! Uses `health_kernel` (the records), `health_topology` (devices, mounts)
//! and `health_core` (the condition machine); the report
//! stage and the agent loop use it, never the other way round.
//!
//! [`kubelet`] finds the pod volumes under kubelet's root. [`VolumeIndex`]
//! answers, for the device number a kernel error carries, which pod volumes
//! it reaches: every volume whose device, or one of whose filesystem's
//! backing devices (btrfs members), is stacked on that device
//! ([`health_topology::Topology::stacked_above`]). A PV mounted by two pods
//! is two pod volumes, and both are reached.
//!
//! [`VolumeMonitor`] owns one [`health_core::conditions::VolumeHealth`] per pod volume
//! and feeds it the three kinds of evidence: kernel errors (aggregated per
//! batch), the built-in [`checks`] and CSI node health ([`CsiProber`]: each
//! volume's own health, and each driver's storage backend health, which
//! [`StorageOutcome`] spreads over the driver's volumes); it returns the
//! condition changes per volume.
//!
//! [`stalls`] judges, on every poll of the agent loop, whether a volume's
//! oldest I/O has waited too long (`IOStalled`), and [`waiters`] names the
//! pod and container (or cgroup) the oldest I/O is charged to.
//! [`latency`] judges each window of completion latencies (`HighLatency`).
//! [`io`] hands what both saw per volume to the metrics.
//!
//! [`LiveVolumes`] keeps all of that current while the agent loop runs;
//! [`one_shot`] is the one-shot `health-agent volumes`.

pub mod checks;
mod csi;
mod ext4;
mod index;
pub mod inflight;
pub mod io;
pub mod kubelet;
pub mod latency;
mod live;
mod monitor;
pub mod one_shot;
mod schedule;
pub mod stalls;
mod storage;
#[cfg(test)]
pub(crate) mod testing;
pub mod waiters;

use std::path::{Path, PathBuf};
use std::time::Duration;

pub use csi::{CsiOutcome, CsiProber, CsiResult};
pub use ext4::{ext4_error_evidence, Ext4Errors};
pub use health_core::volume::VolumeKey;
pub use index::{IndexedVolume, VolumeIndex};
pub use live::{
    next_wake, CsiRound, Handled, LiveVolumes, LiveVolumesConfig, Wake, DEFAULT_CSI_INTERVAL,
};
pub use monitor::{run_checks, VolumeChanges, VolumeMonitor};
pub use schedule::Checked;
pub use storage::{StorageOutcome, StorageResult};

/// The kubelet root to use for `watch`: the given one, else the default if
/// this node has one. Canonicalized, because mountinfo shows real paths and
/// volume paths are compared with them.
pub fn kubelet_root(given: Option<&Path>) -> Option<PathBuf> {
    let root = match given {
        Some(p) => p.to_path_buf(),
        None => {
            let default = Path::new(kubelet::DEFAULT_KUBELET_ROOT);
            if !default.is_dir() {
                return None;
            }
            default.to_path_buf()
        }
    };
    Some(std::fs::canonicalize(&root).unwrap_or(root))
}

/// Default interval of checks and kubelet rediscovery.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(10);
/// Default interval of the stack check: a lost path, a full pool or a
/// degraded array is a condition within about this long of the kernel
/// knowing (issue 27 asks for 5 s). One round reads a few sysfs files per
/// layer and makes one device-mapper call per dm device.
pub const DEFAULT_STACK_INTERVAL: Duration = Duration::from_secs(1);
