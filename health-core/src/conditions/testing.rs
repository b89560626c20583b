//! The crate's shared test helpers (the unit tests of `conditions` use
//! them): the fixed clock, typical observations and driver entries, and
//! changes and conditions reduced to their words.

use super::*;
use crate::dev::Dev;
pub(crate) use crate::testing::t;

pub(crate) fn block_errors(count: u64, first: u64, last: u64) -> Observation {
    Observation::Kernel(vec![KernelErrors {
        kind: KernelErrorKind::BlockIo,
        count,
        first: t(first),
        last: t(last),
        device: Some(Dev::new(7, 2)),
        mount_point: Some("/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv1/mount".into()),
        op: Some("write".into()),
        errno: Some(libc::EIO),
        device_name: None,
        who: None,
    }])
}

pub(crate) fn check(check: CheckKind, result: CheckResult) -> Observation {
    Observation::Check { check, result }
}

pub(crate) fn read_only() -> CheckResult {
    CheckResult::Found(vec![CheckFinding::ReadOnlyRemount {
        mount_point: "/mnt/v".into(),
        device: Dev::new(7, 2),
        fs_type: "ext4".into(),
        evidence: ReadOnlyEvidence::EmergencyRo,
    }])
}

pub(crate) fn entry(status: Status, reason: &str, message: &str) -> CsiEntry {
    CsiEntry {
        status,
        reason: reason.into(),
        message: message.into(),
    }
}

pub(crate) fn reasons(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match c {
            Change::Raised(c) => format!("+{}", c.reason),
            Change::Updated { condition, .. } => format!("~{}", condition.reason),
            Change::Cleared(c) => format!("-{}", c.reason),
        })
        .collect()
}

pub(crate) fn view(h: &VolumeHealth) -> Vec<(Status, String)> {
    h.conditions()
        .into_iter()
        .map(|c| (c.status, c.reason))
        .collect()
}
