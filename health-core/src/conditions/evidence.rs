//! Evidence about one volume, one [`Observation`] at a time: kernel error
//! counts, findings of the built-in checks and what the CSI driver said.
//! Each kind of evidence knows the status, reason and message it stands for.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use serde::Serialize;

use super::format::{errno_name, human_bytes, human_duration, percent, rfc3339};
use super::vocabulary::{CheckKind, Status};
use crate::dev::Dev;

/// Kinds of kernel evidence the eBPF collector counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum KernelErrorKind {
    /// Failed block requests or bios (`block_rq_error`, `block_bio_complete`)
    /// without a more specific errno: `EIO`, a target error.
    BlockIo,
    /// `ENODATA`: the medium failed (unreadable or unwritable sectors).
    MediumError,
    /// `EILSEQ`: protection information did not match (DIF/DIX, dm-integrity).
    IntegrityError,
    /// `ETIMEDOUT`: commands timed out.
    Timeout,
    /// `ENOLINK`: the transport (link, path) failed.
    TransportError,
    /// `ENODEV`, `ENXIO`: the device went offline.
    DeviceOffline,
    /// `EBADE`: another initiator holds a reservation.
    ReservationConflict,
    /// `ENOSPC`: the backing store is out of space (a full thin pool).
    OutOfSpace,
    /// Any failure of a member of a redundant md array below the volume:
    /// the array keeps serving, with less redundancy.
    ArrayMemberErrors,
    /// Writeback errors recorded on a mapping (`filemap_set_wb_err`): data an
    /// application believed written is lost.
    Writeback,
    /// `ext4_error`.
    FilesystemError,
    /// XFS corruption reports.
    XfsCorruption,
    /// Filesystem shutdown (`xfs_force_shutdown`, `ext4_shutdown`).
    Shutdown,
    /// What applications were told: a read, write or fsync returned `EIO`.
    ReturnedIo,
    /// ... `ENOSPC` or `EDQUOT`: writes refused for want of space or quota.
    ReturnedNoSpace,
    /// ... `ESTALE`: the server no longer knows the file (an export
    /// removed and re-created, a file deleted on the server).
    ReturnedStale,
    /// ... `ETIMEDOUT`: a soft mount gave up waiting for its server.
    ReturnedTimeout,
    /// ... `ENOTCONN`: the filesystem's connection is gone (a FUSE daemon
    /// that exited).
    ReturnedNotConnected,
    /// ... `EHOSTDOWN`: an SMB mount's connection to its server is down
    /// and the client gave up reconnecting for this call (soft mounts).
    ReturnedHostDown,
    /// ... `EACCES` on a file the application already holds open: the
    /// storage refused it (an NFS export changed to squash or drop the
    /// client, a FUSE daemon's backend denying it); failed opens are not
    /// seen.
    ReturnedAccessDenied,
}

impl KernelErrorKind {
    pub fn status(self) -> Status {
        match self {
            KernelErrorKind::BlockIo
            | KernelErrorKind::OutOfSpace
            | KernelErrorKind::ArrayMemberErrors
            | KernelErrorKind::ReturnedIo
            | KernelErrorKind::ReturnedNoSpace => Status::Degraded,
            KernelErrorKind::Writeback
            | KernelErrorKind::FilesystemError
            | KernelErrorKind::XfsCorruption
            | KernelErrorKind::MediumError
            | KernelErrorKind::IntegrityError => Status::DataLoss,
            KernelErrorKind::Shutdown
            | KernelErrorKind::Timeout
            | KernelErrorKind::TransportError
            | KernelErrorKind::DeviceOffline
            | KernelErrorKind::ReservationConflict
            | KernelErrorKind::ReturnedStale
            | KernelErrorKind::ReturnedTimeout
            | KernelErrorKind::ReturnedNotConnected
            | KernelErrorKind::ReturnedHostDown
            | KernelErrorKind::ReturnedAccessDenied => Status::Inaccessible,
        }
    }

    /// Errors an application was told, rather than the device's or the
    /// filesystem's own: where the device's evidence is open too, they
    /// are said in its condition, not in one of their own (one failure,
    /// one condition).
    pub fn returned(self) -> bool {
        matches!(
            self,
            KernelErrorKind::ReturnedIo
                | KernelErrorKind::ReturnedNoSpace
                | KernelErrorKind::ReturnedStale
                | KernelErrorKind::ReturnedTimeout
                | KernelErrorKind::ReturnedNotConnected
                | KernelErrorKind::ReturnedHostDown
                | KernelErrorKind::ReturnedAccessDenied
        )
    }

    pub fn reason(self) -> &'static str {
        match self {
            KernelErrorKind::BlockIo => "BlockIOErrors",
            KernelErrorKind::MediumError => "MediumErrors",
            KernelErrorKind::IntegrityError => "IntegrityErrors",
            KernelErrorKind::Timeout => "IOTimeouts",
            KernelErrorKind::TransportError => "TransportErrors",
            KernelErrorKind::DeviceOffline => "DeviceOffline",
            KernelErrorKind::ReservationConflict => "ReservationConflict",
            KernelErrorKind::OutOfSpace => "OutOfSpace",
            KernelErrorKind::ArrayMemberErrors => "ArrayMemberErrors",
            KernelErrorKind::Writeback => "WritebackErrors",
            KernelErrorKind::FilesystemError => "FilesystemErrors",
            KernelErrorKind::XfsCorruption => "FilesystemCorruption",
            KernelErrorKind::Shutdown => "FilesystemShutdown",
            KernelErrorKind::ReturnedIo => "ApplicationIOErrors",
            KernelErrorKind::ReturnedNoSpace => "OutOfSpace",
            KernelErrorKind::ReturnedStale => "StaleFileHandle",
            KernelErrorKind::ReturnedTimeout => "IOTimeouts",
            KernelErrorKind::ReturnedNotConnected => "NotConnected",
            KernelErrorKind::ReturnedHostDown => "HostDown",
            KernelErrorKind::ReturnedAccessDenied => "AccessDenied",
        }
    }

    pub(super) fn noun(self, count: u64) -> &'static str {
        let one = count == 1;
        match self {
            KernelErrorKind::BlockIo if one => "block I/O error",
            KernelErrorKind::BlockIo => "block I/O errors",
            KernelErrorKind::MediumError if one => "medium error",
            KernelErrorKind::MediumError => "medium errors",
            KernelErrorKind::IntegrityError if one => "integrity error",
            KernelErrorKind::IntegrityError => "integrity errors",
            KernelErrorKind::Timeout if one => "I/O timeout",
            KernelErrorKind::Timeout => "I/O timeouts",
            KernelErrorKind::TransportError if one => "transport error",
            KernelErrorKind::TransportError => "transport errors",
            KernelErrorKind::DeviceOffline if one => "I/O error of an offline device",
            KernelErrorKind::DeviceOffline => "I/O errors of an offline device",
            KernelErrorKind::ReservationConflict if one => "reservation conflict",
            KernelErrorKind::ReservationConflict => "reservation conflicts",
            KernelErrorKind::OutOfSpace if one => "out-of-space error",
            KernelErrorKind::OutOfSpace => "out-of-space errors",
            KernelErrorKind::ArrayMemberErrors if one => "error of a redundant array's member",
            KernelErrorKind::ArrayMemberErrors => "errors of a redundant array's members",
            KernelErrorKind::Writeback if one => "writeback error",
            KernelErrorKind::Writeback => "writeback errors",
            KernelErrorKind::FilesystemError if one => "filesystem error",
            KernelErrorKind::FilesystemError => "filesystem errors",
            KernelErrorKind::XfsCorruption if one => "XFS corruption report",
            KernelErrorKind::XfsCorruption => "XFS corruption reports",
            KernelErrorKind::Shutdown if one => "filesystem shutdown",
            KernelErrorKind::Shutdown => "filesystem shutdowns",
            KernelErrorKind::ReturnedIo
            | KernelErrorKind::ReturnedNoSpace
            | KernelErrorKind::ReturnedStale
            | KernelErrorKind::ReturnedTimeout
            | KernelErrorKind::ReturnedNotConnected
            | KernelErrorKind::ReturnedHostDown
            | KernelErrorKind::ReturnedAccessDenied
                if one =>
            {
                "failed file operation"
            }
            KernelErrorKind::ReturnedIo
            | KernelErrorKind::ReturnedNoSpace
            | KernelErrorKind::ReturnedStale
            | KernelErrorKind::ReturnedTimeout
            | KernelErrorKind::ReturnedNotConnected
            | KernelErrorKind::ReturnedHostDown
            | KernelErrorKind::ReturnedAccessDenied => "failed file operations",
        }
    }
}

/// New kernel errors of one kind for one volume since the previous kernel
/// observation of that volume (a delta, not a running total).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelErrors {
    pub kind: KernelErrorKind,
    pub count: u64,
    /// Time of the first and the last of these errors.
    pub first: SystemTime,
    pub last: SystemTime,
    pub device: Option<Dev>,
    pub mount_point: Option<PathBuf>,
    /// `read`, `write`, `flush`, `discard`... where known.
    pub op: Option<String>,
    /// Positive errno (`libc::EIO`), where known.
    pub errno: Option<i32>,
    /// The device's kernel name (`loop3`), where known: messages name it.
    pub device_name: Option<String>,
    /// Whom the errors were returned to (`pod ns/name (container c)`,
    /// `cgroup /path`), for returned errors where known.
    pub who: Option<String>,
}

/// A finding of a built-in check: what `checks` saw, with the numbers the
/// message needs. Status and reason follow from the variant.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckFinding {
    MountMissing {
        path: PathBuf,
    },
    PathUnreachable {
        path: PathBuf,
        op: &'static str,
        errno: i32,
    },
    /// A probe did not return within `timeout`; it was started at `since` and
    /// may still be stuck (the message stays the same while it is, so that a
    /// stuck path does not cause a write per probe).
    PathHung {
        path: PathBuf,
        op: &'static str,
        since: SystemTime,
        timeout: Duration,
    },
    /// A network filesystem's probe waits or failed, and the client's own
    /// state says the server is what does not answer, not this node
    /// (`silence`: how the client shows it).
    ServerNotResponding {
        path: PathBuf,
        /// The server's address or name (an NFS mount's `addr=`, else its
        /// source's host; an SMB connection's host name).
        server: String,
        op: &'static str,
        /// Since when: the first look at the client's state while the
        /// probe failed (stable while the server stays silent).
        since: SystemTime,
        silence: ServerSilence,
        /// The probe's error on a soft mount; `None` while it waits (hard).
        errno: Option<i32>,
    },
    /// The kernel stopped the filesystem's writes after errors, or shut it
    /// down; `evidence` says how that showed (kernels differ).
    ReadOnlyRemount {
        mount_point: PathBuf,
        device: Dev,
        fs_type: String,
        evidence: ReadOnlyEvidence,
    },
    CapacityLow {
        free_bytes: u64,
        total_bytes: u64,
        threshold_percent: f64,
    },
    CapacityExhausted {
        total_bytes: u64,
    },
    InodesLow {
        free: u64,
        total: u64,
        threshold_percent: f64,
    },
    InodesExhausted {
        total: u64,
    },
    DeviceMissing {
        path: PathBuf,
        detail: String,
    },
    DeviceZeroSize {
        path: PathBuf,
        device: Dev,
    },
    /// A multipath device runs on fewer paths than it has.
    PathsDown {
        /// `dm-0 (mpatha)`-like: the kernel name, and what users call it.
        device: String,
        up: usize,
        total: usize,
        /// The paths down, each with why (`sdb failed`, `sdc offline`).
        down: Vec<String>,
    },
    /// A multipath device has no usable path: I/O fails, or queues when
    /// `queueing`.
    AllPathsDown {
        device: String,
        total: usize,
        queueing: bool,
    },
    /// An md array lacks members but serves I/O.
    ArrayDegraded {
        array: String,
        level: String,
        missing: u32,
        members: u32,
        /// `recover 40%`-like while a resync or recovery runs, in steps of
        /// 10 % so that progress does not rewrite the condition every poll.
        sync: Option<String>,
    },
    /// An md array serves no I/O (`inactive`, `broken`...).
    ArrayFailed {
        array: String,
        state: String,
    },
    /// A thin pool's data or metadata use is at or above the threshold.
    ThinPoolLow {
        pool: String,
        /// Whole percent, so that a filling pool is re-reported per percent
        /// at most.
        data_percent: u32,
        metadata_percent: u32,
        threshold_percent: f64,
    },
    /// A thin pool is out of data space: writes that need a new block
    /// queue (`queueing`) or fail.
    ThinPoolFull {
        pool: String,
        queueing: bool,
    },
    /// A thin pool stopped writing (`ro`), or failed (`Fail`).
    ThinPoolReadOnly {
        pool: String,
        needs_check: bool,
    },
    ThinPoolFailed {
        pool: String,
    },
    /// A disk under the volume is not running (`offline`,
    /// `transport-offline`, `blocked`); paths of a multipath device are
    /// reported as [`CheckFinding::PathsDown`] instead.
    DeviceNotRunning {
        device: String,
        state: String,
    },
    /// An NVMe controller under the volume sets critical warning bits in
    /// its SMART / health log: the drive says it is failing, whether or
    /// not a request has failed yet.
    NvmeCriticalWarning {
        /// The namespace's disk (`nvme0n1`) and its controller (`nvme0`).
        device: String,
        controller: String,
        /// The warning byte and its bits in words.
        warning: u8,
        words: Vec<String>,
        available_spare: u8,
        spare_threshold: u8,
        percentage_used: u8,
    },
    /// The oldest I/O submitted to a device of the volume has waited at
    /// least `stall_after` without completing.
    IoStalled {
        /// `dm-0 (vg-data)`-like, as for the stack findings.
        device: String,
        /// How long the oldest has waited, in the steps the caller reports
        /// (so that a stall that goes on is not re-reported every poll).
        waited: Duration,
        /// What the oldest is (`read`, `write`, `flush`...); `None` where
        /// the device's counters told the stall (nothing completed since),
        /// not the bios themselves.
        oldest_op: Option<&'static str>,
        reads: u32,
        writes: u32,
        other: u32,
        stall_after: Duration,
        /// Whose I/O the oldest is, as the block layer charges it (for
        /// writeback the cgroup that dirtied the pages): `pod ns/name
        /// (container c)` or `cgroup /path`, when known.
        waiter: Option<String>,
        /// What the stack's own state says of the volume meanwhile
        /// (`ThinPoolFull: ...`, `AllPathsDown: ...`): why it may wait.
        explained: Vec<String>,
    },
    /// The 99th percentile of the volume's reads or writes stayed at or
    /// above its limit for the windows the rule asks.
    HighLatency {
        /// As for [`CheckFinding::IoStalled`].
        device: String,
        /// `read` or `write`.
        op: &'static str,
        /// The smallest latency of the bucket the 99th percentile fell in
        /// (buckets are half powers of two: the p99 is at least this).
        p99: Duration,
        window: Duration,
        /// The limit it crossed and why that one: `the limit for ssd`,
        /// `10× its baseline of 2ms`.
        limit: Duration,
        rule: String,
    },
}

impl CheckFinding {
    pub fn status(&self) -> Status {
        match self {
            CheckFinding::MountMissing { .. }
            | CheckFinding::PathUnreachable { .. }
            | CheckFinding::PathHung { .. }
            | CheckFinding::ServerNotResponding { .. }
            | CheckFinding::ReadOnlyRemount { .. }
            | CheckFinding::DeviceMissing { .. }
            | CheckFinding::DeviceZeroSize { .. }
            | CheckFinding::AllPathsDown { .. }
            | CheckFinding::ArrayFailed { .. }
            | CheckFinding::ThinPoolFull { .. }
            | CheckFinding::ThinPoolReadOnly { .. }
            | CheckFinding::ThinPoolFailed { .. }
            | CheckFinding::DeviceNotRunning { .. }
            | CheckFinding::IoStalled { .. } => Status::Inaccessible,
            // Bit 3: the media is read-only, every write fails. The other
            // bits (spare used up, temperature, reliability, backup power)
            // warn of a drive that still serves I/O; data the kernel saw
            // lost is DataLoss MediumErrors from the kernel's evidence.
            CheckFinding::NvmeCriticalWarning { warning, .. } if warning & 0x08 != 0 => {
                Status::Inaccessible
            }
            CheckFinding::NvmeCriticalWarning { .. } => Status::Degraded,
            CheckFinding::CapacityLow { .. }
            | CheckFinding::CapacityExhausted { .. }
            | CheckFinding::InodesLow { .. }
            | CheckFinding::InodesExhausted { .. }
            | CheckFinding::PathsDown { .. }
            | CheckFinding::ArrayDegraded { .. }
            | CheckFinding::ThinPoolLow { .. }
            | CheckFinding::HighLatency { .. } => Status::Degraded,
        }
    }

    pub fn reason(&self) -> &'static str {
        match self {
            CheckFinding::MountMissing { .. } => "MountMissing",
            CheckFinding::PathUnreachable { .. } => "PathUnreachable",
            CheckFinding::PathHung { .. } => "PathHung",
            CheckFinding::ServerNotResponding { .. } => "ServerNotResponding",
            CheckFinding::ReadOnlyRemount { .. } => "ReadOnlyRemount",
            CheckFinding::CapacityLow { .. } => "CapacityLow",
            CheckFinding::CapacityExhausted { .. } => "CapacityExhausted",
            CheckFinding::InodesLow { .. } => "InodesLow",
            CheckFinding::InodesExhausted { .. } => "InodesExhausted",
            CheckFinding::DeviceMissing { .. } => "DeviceMissing",
            CheckFinding::DeviceZeroSize { .. } => "DeviceZeroSize",
            CheckFinding::PathsDown { .. } => "PathsDown",
            CheckFinding::AllPathsDown { .. } => "AllPathsDown",
            CheckFinding::ArrayDegraded { .. } => "ArrayDegraded",
            CheckFinding::ArrayFailed { .. } => "ArrayFailed",
            CheckFinding::ThinPoolLow { .. } => "ThinPoolLow",
            CheckFinding::ThinPoolFull { .. } => "ThinPoolFull",
            CheckFinding::ThinPoolReadOnly { .. } => "ThinPoolReadOnly",
            CheckFinding::ThinPoolFailed { .. } => "ThinPoolFailed",
            CheckFinding::DeviceNotRunning { state, .. } => match state.as_str() {
                "transport-offline" => "TransportOffline",
                "blocked" => "DeviceBlocked",
                "connecting" => "ControllerConnecting",
                _ => "DeviceOffline",
            },
            CheckFinding::NvmeCriticalWarning { .. } => "NvmeCriticalWarning",
            CheckFinding::IoStalled { .. } => "IOStalled",
            CheckFinding::HighLatency { .. } => "HighLatency",
        }
    }

    pub fn message(&self) -> String {
        match self {
            CheckFinding::MountMissing { path } => {
                format!("no mount at {}", path.display())
            }
            CheckFinding::PathUnreachable { path, op, errno } => {
                format!("{op} of {} failed: {}", path.display(), errno_name(*errno))
            }
            CheckFinding::PathHung {
                path,
                op,
                since,
                timeout,
            } => format!(
                "{op} of {} has not returned since {} (timeout {})",
                path.display(),
                rfc3339(*since),
                human_duration(*timeout)
            ),
            CheckFinding::ServerNotResponding {
                path,
                server,
                op,
                since,
                silence,
                errno,
            } => {
                let probe = match errno {
                    Some(errno) => format!("failed: {}", errno_name(*errno)),
                    None => "has not returned".to_string(),
                };
                let server = match silence {
                    ServerSilence::NfsNoReply { timeout } => format!(
                        "NFS server {server} has sent no reply since {} (the mount's timeout is {})",
                        rfc3339(*since),
                        human_duration(*timeout)
                    ),
                    ServerSilence::SmbConnectionLost { state } => format!(
                        "SMB server {server}: the client's connection is {state} since {}",
                        rfc3339(*since)
                    ),
                };
                format!("{server}; {op} of {} {probe}", path.display())
            }
            CheckFinding::ReadOnlyRemount {
                mount_point,
                device,
                fs_type,
                evidence,
            } => format!(
                "{fs_type} on {device} at {} {}",
                mount_point.display(),
                evidence.words()
            ),
            CheckFinding::CapacityLow {
                free_bytes,
                total_bytes,
                threshold_percent,
            } => format!(
                "{} of {} bytes free ({} of {}, {:.2}%), below {threshold_percent}%",
                free_bytes,
                total_bytes,
                human_bytes(*free_bytes),
                human_bytes(*total_bytes),
                percent(*free_bytes, *total_bytes)
            ),
            CheckFinding::CapacityExhausted { total_bytes } => format!(
                "0 of {total_bytes} bytes free ({}): no space left",
                human_bytes(*total_bytes)
            ),
            CheckFinding::InodesLow {
                free,
                total,
                threshold_percent,
            } => format!(
                "{free} of {total} inodes free ({:.2}%), below {threshold_percent}%",
                percent(*free, *total)
            ),
            CheckFinding::InodesExhausted { total } => {
                format!("0 of {total} inodes free: no inodes left")
            }
            CheckFinding::DeviceMissing { path, detail } => {
                format!("block device {} is gone: {detail}", path.display())
            }
            CheckFinding::DeviceZeroSize { path, device } => {
                format!("block device {} ({device}) has size 0", path.display())
            }
            CheckFinding::PathsDown {
                device,
                up,
                total,
                down,
            } => format!(
                "multipath device {device} runs on {up} of {total} paths; down: {}",
                down.join(", ")
            ),
            CheckFinding::AllPathsDown {
                device,
                total,
                queueing,
            } => format!(
                "multipath device {device} has none of its {total} paths up; I/O {}",
                if *queueing {
                    "is queued until a path returns"
                } else {
                    "fails"
                }
            ),
            CheckFinding::ArrayDegraded {
                array,
                level,
                missing,
                members,
                sync,
            } => {
                let mut m = format!(
                    "{level} array {array} runs without {missing} of its {members} members"
                );
                if let Some(s) = sync {
                    m.push_str(&format!("; {s}"));
                }
                m
            }
            CheckFinding::ArrayFailed { array, state } => {
                format!("md array {array} serves no I/O (array_state {state})")
            }
            CheckFinding::ThinPoolLow {
                pool,
                data_percent,
                metadata_percent,
                threshold_percent,
            } => format!(
                "thin pool {pool} is {data_percent}% full (data), {metadata_percent}% (metadata), at or above {threshold_percent}%"
            ),
            CheckFinding::ThinPoolFull { pool, queueing } => format!(
                "thin pool {pool} is out of data space: writes to new blocks {}",
                if *queueing {
                    "are queued until it grows (or no_space_timeout passes)"
                } else {
                    "fail with ENOSPC"
                }
            ),
            CheckFinding::ThinPoolReadOnly { pool, needs_check } => format!(
                "thin pool {pool} is read-only{}",
                if *needs_check {
                    "; its metadata needs thin_check"
                } else {
                    ""
                }
            ),
            CheckFinding::ThinPoolFailed { pool } => {
                format!("thin pool {pool} failed: every I/O to its volumes errors")
            }
            CheckFinding::DeviceNotRunning { device, state } => match state.as_str() {
                "blocked" => format!(
                    "disk {device} is blocked: its I/O is held while the transport recovers"
                ),
                "connecting" => format!(
                    "disk {device}'s controller is reconnecting: its I/O waits until it is back or the controller is removed"
                ),
                _ => format!("disk {device} is {state}: its I/O fails"),
            },
            CheckFinding::NvmeCriticalWarning {
                device,
                controller,
                warning,
                words,
                available_spare,
                spare_threshold,
                percentage_used,
            } => format!(
                "NVMe controller {controller} of disk {device} reports a critical warning ({warning:#04x}): {}; available spare {available_spare}% (threshold {spare_threshold}%), {percentage_used}% of rated life used",
                words.join(", ")
            ),
            CheckFinding::IoStalled {
                device,
                waited,
                oldest_op,
                reads,
                writes,
                other,
                stall_after,
                waiter,
                explained,
            } => {
                let counts: Vec<String> = [(*reads, "read"), (*writes, "write"), (*other, "other")]
                    .into_iter()
                    .filter(|(n, _)| *n > 0)
                    .map(|(n, what)| match (n, what) {
                        (1, w) => format!("1 {w}"),
                        (n, "other") => format!("{n} other"),
                        (n, w) => format!("{n} {w}s"),
                    })
                    .collect();
                let who = waiter
                    .as_ref()
                    .map(|w| format!(" from {w}"))
                    .unwrap_or_default();
                let oldest = match oldest_op {
                    Some(op) => format!("the oldest, a {op}{who}, has waited"),
                    None => "none has completed for".to_string(),
                };
                let mut text = format!(
                    "{device}: I/O stalled, {} waiting ({}); {oldest} {}+ (--stall-after {})",
                    reads + writes + other,
                    counts.join(", "),
                    human_duration(*waited),
                    human_duration(*stall_after),
                );
                for why in explained {
                    text.push_str("; the stack: ");
                    text.push_str(why);
                }
                text
            }
            CheckFinding::HighLatency {
                device,
                op,
                p99,
                window,
                limit,
                rule,
            } => format!(
                "{device}: {op} latency p99 at least {} over {} windows, above {} ({rule})",
                human_duration(*p99),
                human_duration(*window),
                human_duration(*limit),
            ),
        }
    }
}

/// How a filesystem shows that the kernel stopped its writes after errors
/// (or shut it down). Each kernel shows it its own way, and the per-mount
/// flags alone miss most of them (measured on Debian's 5.10, 6.1 and 6.12
/// and on 6.18; `volumes::checks::read_only` in health-node reads them).
/// How a network filesystem's client shows that its server does not
/// answer ([`CheckFinding::ServerNotResponding`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServerSilence {
    /// NFS: no reply on the mount's RPC transport (the client's per-mount
    /// counters) for the mount's `timeo`, this `timeout`.
    NfsNoReply { timeout: Duration },
    /// SMB: the client's connection to the server is lost (its TCP status,
    /// in words: `disconnected, reconnecting`).
    SmbConnectionLost { state: String },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadOnlyEvidence {
    /// The superblock is `ro` under a `rw` mount: ext4 that still sets
    /// SB_RDONLY on errors (5.10), btrfs.
    SuperBlockReadOnly,
    /// `emergency_ro` among the superblock options: ext4 since 6.15.
    EmergencyRo,
    /// `shutdown` among the superblock options: ext4 since 6.15.
    ShutdownOption,
    /// Reading the mount point's metadata with `op` fails with EIO while
    /// the flags say nothing: the filesystem is shut down (ext4 from 6.6 to
    /// 6.14 after an error, any ext4 after EXT4_IOC_SHUTDOWN, xfs).
    ShutdownProbe { op: &'static str },
    /// ext4 mounted with errors=remount-ro has recorded an error since the
    /// mount, and neither flags nor probes show it: 6.1 since 6.1.113 stops
    /// writes by aborting the journal only.
    ErrorsSinceMount,
}

impl ReadOnlyEvidence {
    /// What happened, the evidence in parentheses, and what it means for I/O.
    fn words(self) -> String {
        const REMOUNTED: &str = "was remounted read-only after errors";
        const WRITES_FAIL: &str = "writes fail with EROFS";
        const ALL_FAIL: &str = "reads and writes fail with EIO";
        match self {
            ReadOnlyEvidence::SuperBlockReadOnly => {
                format!("{REMOUNTED} (super block ro; mount rw); {WRITES_FAIL}")
            }
            ReadOnlyEvidence::EmergencyRo => {
                format!("{REMOUNTED} (emergency_ro); {WRITES_FAIL}")
            }
            ReadOnlyEvidence::ShutdownOption => format!("was shut down (shutdown); {ALL_FAIL}"),
            ReadOnlyEvidence::ShutdownProbe { op } => {
                format!("was shut down ({op} of the mount point fails with EIO); {ALL_FAIL}")
            }
            ReadOnlyEvidence::ErrorsSinceMount => format!(
                "{REMOUNTED} (errors=remount-ro and an error recorded since the mount; mount flags still rw); {WRITES_FAIL}"
            ),
        }
    }
}

/// What one run of one check concluded.
#[derive(Clone, Debug, PartialEq)]
pub enum CheckResult {
    /// Ran and found nothing: evidence of health, clears this check's conditions.
    Pass,
    /// Ran and found these (the complete set for this check).
    Found(Vec<CheckFinding>),
    /// Could not determine anything (EACCES, ...): never a recovery.
    ProbeFailed(String),
}

/// One CSI health entry as the driver said it; `driver_words::fit` makes it
/// fit (CamelCase reason, clean bounded message, few entries) before it is kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CsiEntry {
    pub status: Status,
    pub reason: String,
    pub message: String,
}

/// The answer of a Node or Controller Get call for one volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CsiReport {
    /// The driver's complete list; empty means healthy and clears at once.
    Health(Vec<CsiEntry>),
    /// The answer carried no health information: neither raise nor clear.
    NoHealthInfo,
    /// Error or timeout: never a recovery.
    ProbeFailed(String),
}

/// What one cycle of `ControllerListVolumeHealth` said about one volume. The
/// caller merges duplicates of the volume within a cycle into one `Listed`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CsiListSighting {
    Listed(Vec<CsiEntry>),
    /// A complete cycle ended without the volume. Drivers omit healthy
    /// volumes, but pages may also omit unhealthy ones, so it takes
    /// [`ConditionConfig::list_cycles_to_clear`](super::ConditionConfig::list_cycles_to_clear) of these in a row to clear.
    Absent,
    /// The cycle did not complete (error mid-pagination): no evidence.
    CycleFailed(String),
}

/// One piece of evidence about one volume.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    Kernel(Vec<KernelErrors>),
    Check {
        check: CheckKind,
        result: CheckResult,
    },
    CsiNode(CsiReport),
    /// The driver's NodeGetStorageHealth answer, reduced to the entries that
    /// concern this volume: `Health(vec![])` clears at once, as a Get does.
    CsiStorage(CsiReport),
    CsiControllerGet(CsiReport),
    CsiControllerList(CsiListSighting),
}
