//! Which kernel errors are evidence of ill health, and of which kind.
//!
//! Every error is counted and shown; only some say a volume is unwell. The
//! block layer turns its status codes into errnos (`blk_status_to_errno`),
//! and the errno says what failed: the medium (`ENODATA`), the path to the
//! device (`ENOLINK`, `ETIMEDOUT`), the device itself (`ENODEV`), the data's
//! protection information (`EILSEQ`), or nothing at all: an operation the
//! device does not offer (`EOPNOTSUPP`, after which the kernel falls back,
//! e.g. `mkfs` probing discard and write-zeroes on a loop device), a
//! non-blocking request that would have had to wait (`EAGAIN`), or a
//! resource shortage the kernel retries (`ENOMEM`, `EBUSY`).

use health_common::source;

use crate::conditions::KernelErrorKind;

/// The evidence behind one counter key, or `None` for errors that are
/// counted and shown but raise no condition.
pub fn kernel_error_kind(src: u8, errno: u32) -> Option<KernelErrorKind> {
    Some(match src {
        source::BLOCK_RQ_ERROR | source::BLOCK_RQ_COMPLETE | source::BLOCK_BIO_ERROR => {
            return block_error_kind(errno)
        }
        source::WRITEBACK_ERROR => KernelErrorKind::Writeback,
        source::RETURNED_ERROR => return returned_error_kind(errno),
        source::XFS_CORRUPTION => KernelErrorKind::XfsCorruption,
        source::EXT4_SHUTDOWN | source::XFS_SHUTDOWN => KernelErrorKind::Shutdown,
        // EXT4_ERROR, and any source newer than this agent: a filesystem
        // reported something, which is the least it can mean.
        _ => KernelErrorKind::FilesystemError,
    })
}

/// An error a file operation returned to an application, by its errno.
/// `EROFS` raises nothing of its own: a volume mounted read-only refuses
/// writes as it should, and one the kernel stopped writing to after
/// errors is the ReadOnlyRemount check's to say.
fn returned_error_kind(errno: u32) -> Option<KernelErrorKind> {
    let e = i32::try_from(errno).unwrap_or(i32::MAX);
    Some(match e {
        libc::EIO => KernelErrorKind::ReturnedIo,
        libc::ENOSPC | libc::EDQUOT => KernelErrorKind::ReturnedNoSpace,
        libc::ESTALE => KernelErrorKind::ReturnedStale,
        libc::ETIMEDOUT => KernelErrorKind::ReturnedTimeout,
        libc::ENOTCONN => KernelErrorKind::ReturnedNotConnected,
        libc::EHOSTDOWN => KernelErrorKind::ReturnedHostDown,
        libc::EACCES => KernelErrorKind::ReturnedAccessDenied,
        _ => return None,
    })
}

/// A failed block request or bio, by its errno.
fn block_error_kind(errno: u32) -> Option<KernelErrorKind> {
    let e = i32::try_from(errno).unwrap_or(i32::MAX);
    Some(match e {
        libc::EOPNOTSUPP | libc::EAGAIN | libc::ENOMEM | libc::EBUSY => return None,
        libc::ENODATA => KernelErrorKind::MediumError,
        libc::EILSEQ => KernelErrorKind::IntegrityError,
        libc::ETIMEDOUT => KernelErrorKind::Timeout,
        libc::ENOLINK => KernelErrorKind::TransportError,
        libc::ENODEV | libc::ENXIO => KernelErrorKind::DeviceOffline,
        libc::EBADE => KernelErrorKind::ReservationConflict,
        libc::ENOSPC => KernelErrorKind::OutOfSpace,
        // EIO (BLK_STS_IOERR), EREMOTEIO (a target error), anything new.
        _ => KernelErrorKind::BlockIo,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::Status;

    #[test]
    fn kernel_error_kinds() {
        assert_eq!(
            kernel_error_kind(source::BLOCK_RQ_COMPLETE, 5),
            Some(KernelErrorKind::BlockIo)
        );
        assert_eq!(
            kernel_error_kind(source::EXT4_ERROR, 5),
            Some(KernelErrorKind::FilesystemError)
        );
        assert_eq!(
            kernel_error_kind(source::XFS_SHUTDOWN, 5),
            Some(KernelErrorKind::Shutdown)
        );
        assert_eq!(
            kernel_error_kind(source::XFS_CORRUPTION, 5),
            Some(KernelErrorKind::XfsCorruption)
        );
        assert_eq!(
            kernel_error_kind(source::WRITEBACK_ERROR, 5),
            Some(KernelErrorKind::Writeback)
        );
    }

    fn block(errno: i32) -> Option<(Status, &'static str)> {
        kernel_error_kind(source::BLOCK_RQ_ERROR, errno as u32).map(|k| (k.status(), k.reason()))
    }

    #[test]
    fn block_errnos_map_to_kep_statuses() {
        assert_eq!(block(libc::EIO), Some((Status::Degraded, "BlockIOErrors")));
        assert_eq!(
            block(libc::EREMOTEIO),
            Some((Status::Degraded, "BlockIOErrors"))
        );
        assert_eq!(
            block(libc::ENODATA),
            Some((Status::DataLoss, "MediumErrors"))
        );
        assert_eq!(
            block(libc::EILSEQ),
            Some((Status::DataLoss, "IntegrityErrors"))
        );
        assert_eq!(
            block(libc::ETIMEDOUT),
            Some((Status::Inaccessible, "IOTimeouts"))
        );
        assert_eq!(
            block(libc::ENOLINK),
            Some((Status::Inaccessible, "TransportErrors"))
        );
        assert_eq!(
            block(libc::ENODEV),
            Some((Status::Inaccessible, "DeviceOffline"))
        );
        assert_eq!(
            block(libc::EBADE),
            Some((Status::Inaccessible, "ReservationConflict"))
        );
        assert_eq!(block(libc::ENOSPC), Some((Status::Degraded, "OutOfSpace")));
        assert_eq!(block(4000), Some((Status::Degraded, "BlockIOErrors")));
    }

    #[test]
    fn returned_errnos_map_to_kep_statuses() {
        let returned = |e: i32| {
            kernel_error_kind(source::RETURNED_ERROR, e as u32).map(|k| (k.status(), k.reason()))
        };
        assert_eq!(
            returned(libc::EIO),
            Some((Status::Degraded, "ApplicationIOErrors"))
        );
        assert_eq!(
            returned(libc::ENOSPC),
            Some((Status::Degraded, "OutOfSpace"))
        );
        assert_eq!(
            returned(libc::EDQUOT),
            Some((Status::Degraded, "OutOfSpace"))
        );
        assert_eq!(
            returned(libc::ESTALE),
            Some((Status::Inaccessible, "StaleFileHandle"))
        );
        assert_eq!(
            returned(libc::ETIMEDOUT),
            Some((Status::Inaccessible, "IOTimeouts"))
        );
        assert_eq!(
            returned(libc::ENOTCONN),
            Some((Status::Inaccessible, "NotConnected"))
        );
        assert_eq!(
            returned(libc::EHOSTDOWN),
            Some((Status::Inaccessible, "HostDown"))
        );
        assert_eq!(
            returned(libc::EACCES),
            Some((Status::Inaccessible, "AccessDenied"))
        );
        // Counted and shown; the ReadOnlyRemount check says the rest.
        assert_eq!(returned(libc::EROFS), None);
        assert_eq!(returned(libc::EINTR), None);
        // The kernel side counts exactly these.
        for e in [5, 28, 122, 30, 116, 110, 107, 112, 13] {
            assert!(health_common::returned_errno_counted(e), "{e}");
        }
        for e in [
            libc::EBADF,
            libc::EFAULT,
            libc::EINVAL,
            libc::EINTR,
            libc::EAGAIN,
        ] {
            assert!(!health_common::returned_errno_counted(e as u32), "{e}");
        }
        assert_eq!(
            [
                libc::EIO,
                libc::ENOSPC,
                libc::EDQUOT,
                libc::EROFS,
                libc::ESTALE,
                libc::ETIMEDOUT,
                libc::ENOTCONN,
                libc::EHOSTDOWN,
                libc::EACCES
            ],
            [5, 28, 122, 30, 116, 110, 107, 112, 13]
        );
    }

    #[test]
    fn unsupported_nowait_and_retried_requests_are_not_health() {
        for e in [libc::EOPNOTSUPP, libc::EAGAIN, libc::ENOMEM, libc::EBUSY] {
            assert_eq!(block(e), None, "errno {e}");
            assert_eq!(kernel_error_kind(source::BLOCK_BIO_ERROR, e as u32), None);
            assert_eq!(kernel_error_kind(source::BLOCK_RQ_COMPLETE, e as u32), None);
        }
    }

    #[test]
    fn filesystem_sources_ignore_the_errno() {
        let wb = kernel_error_kind(source::WRITEBACK_ERROR, libc::EOPNOTSUPP as u32);
        assert_eq!(wb, Some(KernelErrorKind::Writeback));
        assert_eq!(
            kernel_error_kind(source::XFS_SHUTDOWN, 0),
            Some(KernelErrorKind::Shutdown)
        );
        assert_eq!(
            kernel_error_kind(source::EXT4_ERROR, 0),
            Some(KernelErrorKind::FilesystemError)
        );
        assert_eq!(
            kernel_error_kind(source::XFS_CORRUPTION, 0),
            Some(KernelErrorKind::XfsCorruption)
        );
    }
}
