//! The words a condition is made of: its [`Status`], the [`Source`] that owns
//! it, the [`Condition`] itself and the [`Change`]s a reporter writes.

use std::fmt;
use std::time::SystemTime;

use serde::{Deserialize, Serialize, Serializer};

use super::format::serialize_time;

/// KEP-1432 volume status. `Ord` sorts worst first:
/// `Inaccessible < DataLoss < Degraded`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Status {
    Inaccessible,
    DataLoss,
    Degraded,
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Status::Inaccessible => "Inaccessible",
            Status::DataLoss => "DataLoss",
            Status::Degraded => "Degraded",
        })
    }
}

/// The built-in checks of `checks`; each one owns the conditions it raises,
/// so that one check being unable to run never clears another's findings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CheckKind {
    /// The volume's mount is still in the mount table.
    Mount,
    /// The path answers `statvfs`/`stat` within the timeout.
    Reachability,
    /// The filesystem was not remounted read-only by an error.
    ReadOnly,
    /// Free bytes and free inodes.
    Capacity,
    /// A block volume's device node, sysfs entry and size.
    Device,
    /// The layers under the volume's device: multipath paths, thin pool
    /// space, md array members, SCSI device state.
    Stack,
    /// How long the oldest I/O of the volume's devices has waited
    /// (`--stall-after`).
    Stall,
    /// The 99th percentile of the volume's read and write latencies over
    /// windows (`--latency-window`).
    Latency,
}

impl fmt::Display for CheckKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CheckKind::Mount => "mount",
            CheckKind::Reachability => "reachability",
            CheckKind::ReadOnly => "read-only",
            CheckKind::Capacity => "capacity",
            CheckKind::Device => "device",
            CheckKind::Stack => "stack",
            CheckKind::Stall => "stall",
            CheckKind::Latency => "latency",
        })
    }
}

/// Who owns a condition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    Kernel,
    Check(CheckKind),
    /// `Node.NodeGetVolumeHealth` (or the legacy `NodeGetVolumeStats`).
    CsiNode,
    /// `Controller.ControllerGetVolumeHealth` and `ControllerListVolumeHealth`.
    CsiController,
    /// `Node.NodeGetStorageHealth`: the driver's storage backend as seen from
    /// this node, one answer for every volume of the driver. Its own source so
    /// that a backend report and a volume's own report never clear each other.
    CsiStorage,
    /// The Ready condition of the node a pod runs on (the controller's
    /// node-down detection).
    NodeReady,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Kernel => f.write_str("kernel"),
            Source::Check(c) => write!(f, "check/{c}"),
            Source::CsiNode => f.write_str("csi-node"),
            Source::CsiController => f.write_str("csi-controller"),
            Source::CsiStorage => f.write_str("csi-storage"),
            Source::NodeReady => f.write_str("node-ready"),
        }
    }
}

impl Serialize for Source {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// One condition as reported.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    pub source: Source,
    pub status: Status,
    /// CamelCase, e.g. `BlockIOErrors`.
    pub reason: String,
    pub message: String,
    /// When this `(status, reason)` became true (lastTransitionTime).
    #[serde(serialize_with = "serialize_time")]
    pub since: SystemTime,
    /// When evidence last confirmed it (lastProbeTime).
    #[serde(serialize_with = "serialize_time")]
    pub last_probe: SystemTime,
    /// How many times it happened, where the source counts (kernel errors
    /// of this episode); reporters use it as an Event's count.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub occurrences: Option<u64>,
}

/// What `apply`/`tick` changed; a reporter writes only when this is non-empty.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "change", rename_all = "camelCase")]
pub enum Change {
    Raised(Condition),
    /// Same `(status, reason)`, new message; `since` is kept.
    Updated {
        previous_message: String,
        condition: Condition,
    },
    Cleared(Condition),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::testing::{check, read_only, t};
    use crate::conditions::{CheckKind, KernelErrorKind, VolumeHealth};

    #[test]
    fn vocabulary_serializes_as_kep_words() {
        assert_eq!(
            serde_json::to_string(&[Status::Inaccessible, Status::DataLoss, Status::Degraded])
                .unwrap(),
            r#"["Inaccessible","DataLoss","Degraded"]"#
        );
        assert_eq!(Status::DataLoss.to_string(), "DataLoss");
        assert_eq!(Source::CsiStorage.to_string(), "csi-storage");
        assert!(Status::Inaccessible < Status::DataLoss && Status::DataLoss < Status::Degraded);
        let kinds = [
            (KernelErrorKind::BlockIo, Status::Degraded, "BlockIOErrors"),
            (
                KernelErrorKind::Writeback,
                Status::DataLoss,
                "WritebackErrors",
            ),
            (
                KernelErrorKind::FilesystemError,
                Status::DataLoss,
                "FilesystemErrors",
            ),
            (
                KernelErrorKind::XfsCorruption,
                Status::DataLoss,
                "FilesystemCorruption",
            ),
            (
                KernelErrorKind::Shutdown,
                Status::Inaccessible,
                "FilesystemShutdown",
            ),
        ];
        for (kind, status, reason) in kinds {
            assert_eq!((kind.status(), kind.reason()), (status, reason));
        }
        let mut h = VolumeHealth::default();
        h.apply(t(0), check(CheckKind::ReadOnly, read_only()));
        let json = serde_json::to_value(&h.conditions()[0]).unwrap();
        assert_eq!(json["source"], "check/read-only");
        assert_eq!(json["status"], "Inaccessible");
        assert_eq!(json["reason"], "ReadOnlyRemount");
        assert_eq!(json["since"], "2027-01-15T08:00:00Z");
        assert_eq!(json["lastProbe"], "2027-01-15T08:00:00Z");
    }
}
