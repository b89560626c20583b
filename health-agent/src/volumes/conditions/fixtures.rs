//! Evidence and views the unit tests of this folder share: a fixed clock,
//! typical observations, and changes and conditions reduced to their words.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::*;
use crate::dev::Dev;

pub(super) fn t(secs: u64) -> SystemTime {
    // 2026-01-01T00:00:00Z
    UNIX_EPOCH + Duration::from_secs(1_767_225_600 + secs)
}

pub(super) fn block_errors(count: u64, first: u64, last: u64) -> Observation {
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
    }])
}

pub(super) fn check(check: CheckKind, result: CheckResult) -> Observation {
    Observation::Check { check, result }
}

pub(super) fn read_only() -> CheckResult {
    CheckResult::Found(vec![CheckFinding::ReadOnlyRemount {
        mount_point: "/mnt/v".into(),
        device: Dev::new(7, 2),
        fs_type: "ext4".into(),
    }])
}

pub(super) fn entry(status: Status, reason: &str, message: &str) -> CsiEntry {
    CsiEntry {
        status,
        reason: reason.into(),
        message: message.into(),
    }
}

pub(super) fn reasons(changes: &[Change]) -> Vec<String> {
    changes
        .iter()
        .map(|c| match c {
            Change::Raised(c) => format!("+{}", c.reason),
            Change::Updated { condition, .. } => format!("~{}", condition.reason),
            Change::Cleared(c) => format!("-{}", c.reason),
        })
        .collect()
}

pub(super) fn view(h: &VolumeHealth) -> Vec<(Status, String)> {
    h.conditions()
        .into_iter()
        .map(|c| (c.status, c.reason))
        .collect()
}
