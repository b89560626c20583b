//! Which errors of a probe are evidence that the path is broken, as opposed
//! to errors that only say this probe could not look.

use std::path::Path;

use health_core::conditions::{CheckFinding, CheckResult};
use nix::errno::Errno;

use super::probe::ProbeError;

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

pub(super) fn unreachable_or_failed(path: &Path, op: &'static str, errno: Errno) -> CheckResult {
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

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use health_core::conditions::{CheckKind, Observation, Status, VolumeHealth};

    use super::*;

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
}
