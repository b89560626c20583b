//! Names for the numbers in the kernel's records: what kind of failure a
//! source reports, the tracepoint behind it, the request op and the errno.
//! Every stage after the collector prints or keys on these.

use health_common::{op, source};
use serde::Serialize;

/// What kind of failure an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// A block request failed (`block_rq_error`, or `block_rq_complete`), or
    /// a stacking device failed a bio itself (`block_bio_complete`).
    BlockIoError,
    /// The filesystem reported an error or marked metadata corrupt.
    FsError,
    /// The filesystem shut down: every further access fails.
    FsShutdown,
    /// Writeback of cached data failed; the writer may never learn of it.
    WritebackError,
    /// A read, write or fsync returned an error to the application.
    ReturnedError,
}

impl Kind {
    pub fn of_source(src: u8) -> Kind {
        match src {
            source::BLOCK_RQ_ERROR | source::BLOCK_RQ_COMPLETE | source::BLOCK_BIO_ERROR => {
                Kind::BlockIoError
            }
            source::EXT4_SHUTDOWN | source::XFS_SHUTDOWN => Kind::FsShutdown,
            source::WRITEBACK_ERROR => Kind::WritebackError,
            source::RETURNED_ERROR => Kind::ReturnedError,
            _ => Kind::FsError,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::BlockIoError => "block_io_error",
            Kind::FsError => "fs_error",
            Kind::FsShutdown => "fs_shutdown",
            Kind::WritebackError => "writeback_error",
            Kind::ReturnedError => "returned_error",
        }
    }
}

/// Name of the tracepoint behind a source number.
pub fn source_name(src: u8) -> &'static str {
    match src {
        source::BLOCK_RQ_ERROR => "block_rq_error",
        source::BLOCK_RQ_COMPLETE => "block_rq_complete",
        source::BLOCK_BIO_ERROR => "block_bio_complete",
        source::EXT4_ERROR => "ext4_error",
        source::EXT4_SHUTDOWN => "ext4_shutdown",
        source::XFS_SHUTDOWN => "xfs_force_shutdown",
        source::XFS_CORRUPTION => "xfs_mark_corrupt",
        source::WRITEBACK_ERROR => "filemap_set_wb_err",
        source::RETURNED_ERROR => "vfs_return",
        _ => "unknown",
    }
}

pub fn op_name(o: u8) -> Option<&'static str> {
    Some(match o {
        op::READ => "read",
        op::WRITE => "write",
        op::FLUSH => "flush",
        op::DISCARD => "discard",
        op::SECURE_ERASE => "secure_erase",
        op::WRITE_ZEROES => "write_zeroes",
        op::OTHER => "other",
        op::FSYNC => "fsync",
        _ => return None,
    })
}
