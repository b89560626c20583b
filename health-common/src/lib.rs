//! Records shared by the kernel programs (`health-ebpf`) and the agent.
//!
//! Every type here is `#[repr(C)]` with explicit padding fields, because the
//! same bytes are written by BPF code and read by userspace: a hidden padding
//! byte in a hash-map key would make two equal keys hash differently.
#![no_std]

/// Which kernel tracepoint produced an error.
pub mod source {
    /// `block:block_rq_error`: a block request completed with an error.
    pub const BLOCK_RQ_ERROR: u8 = 1;
    /// `block:block_rq_complete` with error != 0: the fallback on kernels
    /// without `block_rq_error`, and the only place flush failures show.
    pub const BLOCK_RQ_COMPLETE: u8 = 2;
    /// `ext4:ext4_error`: ext4 found an inconsistency or an I/O failure.
    pub const EXT4_ERROR: u8 = 3;
    /// `ext4:ext4_shutdown`: the filesystem was shut down.
    pub const EXT4_SHUTDOWN: u8 = 4;
    /// `xfs:xfs_force_shutdown`.
    pub const XFS_SHUTDOWN: u8 = 5;
    /// `xfs:xfs_{fs,group,ag,inode}_mark_corrupt`: xfs marked metadata corrupt.
    pub const XFS_CORRUPTION: u8 = 6;
    /// `filemap:filemap_set_wb_err`: writeback failed; applications learn
    /// of it only if they fsync.
    pub const WRITEBACK_ERROR: u8 = 7;
    /// `block:block_bio_complete` with error != 0 on a bio-based stacking
    /// device (device-mapper, md): errors the layer raised itself (dm-flakey,
    /// dm-error, a full thin pool, a failed array), which never become a
    /// failed request. Errors passed up from a failed request below are not
    /// counted again (see `stat::BIO_PROPAGATED`).
    pub const BLOCK_BIO_ERROR: u8 = 8;
    /// A file operation returned an error to the application that called
    /// it (fexit on `vfs_read`, `vfs_write`, `vfs_readv`, `vfs_writev`,
    /// `vfs_fsync`), counted for the file's filesystem, or for the
    /// device itself where the file is a block device node. Only the
    /// errnos of [`super::returned_errno_counted`].
    pub const RETURNED_ERROR: u8 = 9;
    /// One past the highest source number.
    pub const COUNT: usize = 10;
}

/// Block operation, decoded from the tracepoint's `rwbs` string.
pub mod op {
    /// No operation applies (filesystem-level events).
    pub const NONE: u8 = 0;
    pub const READ: u8 = 1;
    pub const WRITE: u8 = 2;
    pub const FLUSH: u8 = 3;
    pub const DISCARD: u8 = 4;
    pub const SECURE_ERASE: u8 = 5;
    pub const WRITE_ZEROES: u8 = 6;
    /// `N` in rwbs: a driver-private or zone operation.
    pub const OTHER: u8 = 7;
    /// `fsync`, `fdatasync`, `sync_file_range`'s wait, `msync`
    /// ([`super::source::RETURNED_ERROR`] only).
    pub const FSYNC: u8 = 8;
}

/// The errnos an application's failed file operation is counted for: what
/// says the storage failed it (EIO; ENOSPC and EDQUOT; EROFS; ESTALE of a
/// network filesystem; ETIMEDOUT of a soft mount; ENOTCONN of a FUSE
/// daemon gone; EHOSTDOWN of an SMB mount whose server's connection is
/// down; EACCES on a file already open, which only the storage refuses:
/// failed opens are not seen). Errors of the call itself (EBADF, EFAULT, EINVAL, EINTR,
/// EAGAIN) are the application's own and not counted. Numbers of
/// include/uapi/asm-generic/errno-base.h and errno.h, the same on every
/// architecture the agent runs on (x86-64, arm64).
#[inline(always)]
pub fn returned_errno_counted(errno: u32) -> bool {
    matches!(
        errno,
        5 /* EIO */ | 28 /* ENOSPC */ | 122 /* EDQUOT */ | 30 /* EROFS */
            | 116 /* ESTALE */ | 110 /* ETIMEDOUT */ | 107 /* ENOTCONN */
            | 112 /* EHOSTDOWN */ | 13 /* EACCES */
    )
}

/// Decodes the operation from a block tracepoint's `rwbs` field.
///
/// The kernel writes an optional `F` (preflush), then the operation letter
/// (`W`, `R`, `D`, `DE`, `WZ`, `F` for a bare flush, `N`), then flag letters.
/// A leading `F` followed by another operation letter is a preflush on that
/// operation; an `F` with nothing after it (or only flag letters) is a flush.
#[inline(always)]
pub fn op_from_rwbs(rwbs: &[u8; RWBS_LEN]) -> u8 {
    let (first, second, third) = (rwbs[0], rwbs[1], rwbs[2]);
    let (letter, next) = if first == b'F' {
        match second {
            b'W' | b'R' | b'D' | b'N' => (second, third),
            _ => return op::FLUSH,
        }
    } else {
        (first, second)
    };
    match letter {
        b'R' => op::READ,
        b'W' if next == b'Z' => op::WRITE_ZEROES,
        b'W' => op::WRITE,
        b'D' if next == b'E' => op::SECURE_ERASE,
        b'D' => op::DISCARD,
        b'N' => op::OTHER,
        _ => op::NONE,
    }
}

/// Bytes of `rwbs` the kernel side copies (every kernel has at least 8).
pub const RWBS_LEN: usize = 8;

/// The [`op`] code of a request's `cmd_flags` or a bio's `bi_opf`
/// (`REQ_OP_*` in the low 8 bits; flags above them do not change it).
#[inline(always)]
pub fn op_from_opf(opf: u32) -> u8 {
    match opf & rq::OP_MASK {
        rq::OP_READ => op::READ,
        rq::OP_WRITE => op::WRITE,
        rq::OP_FLUSH => op::FLUSH,
        rq::OP_DISCARD => op::DISCARD,
        rq::OP_SECURE_ERASE => op::SECURE_ERASE,
        rq::OP_WRITE_ZEROES => op::WRITE_ZEROES,
        _ => op::OTHER,
    }
}

/// Key of the in-kernel error counters: one per-CPU `u64` per key.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CounterKey {
    /// Kernel-encoded dev_t (`major << 20 | minor`) of the device the error
    /// belongs to, after partition and block-device-inode resolution.
    pub dev: u32,
    /// Positive errno, 0 where the source carries none.
    pub errno: u32,
    /// One of [`source`].
    pub source: u8,
    /// One of [`op`].
    pub op: u8,
    pub _pad: [u8; 6],
    /// The failing disk's sequence number (`gendisk.diskseq`, Linux 5.15+),
    /// which the kernel never reuses while it runs, where the source has
    /// the disk at hand (the `tp_btf` request programs); 0 where it has
    /// not. A device number is reused (a loop device bound to another
    /// file, dm, md and NVMe numbers taken lowest-free), so errors counted
    /// while no agent ran are told for the device that failed them, not
    /// for the number's next holder.
    pub diskseq: u64,
}

impl CounterKey {
    #[inline(always)]
    pub const fn new(dev: u32, source: u8, op: u8, errno: u32) -> Self {
        Self {
            dev,
            errno,
            source,
            op,
            _pad: [0; 6],
            diskseq: 0,
        }
    }

    /// The same key, for the disk of sequence number `diskseq`.
    #[inline(always)]
    pub const fn of_disk(mut self, diskseq: u64) -> Self {
        self.diskseq = diskseq;
        self
    }
}

/// One error as streamed to userspace over the ring buffer.
///
/// Samples are rate-limited per device; `seq` lets userspace account for the
/// ones it never saw: it is this CPU's counter for `key` after counting this
/// error, so the gap to the previous sample of the same key and CPU is the
/// number of errors this sample stands for.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ErrorSample {
    pub key: CounterKey,
    pub seq: u64,
    /// `bpf_ktime_get_ns()`: CLOCK_MONOTONIC at the tracepoint.
    pub mono_ns: u64,
    /// Absolute sector on the whole disk (block sources), or `u64::MAX`.
    pub sector: u64,
    /// Inode number (writeback, xfs inode corruption, returned errors),
    /// else 0.
    pub ino: u64,
    /// The cgroup (v2) id of the task the program ran in, for returned
    /// errors (whose task is the application's); 0 for the others, whose
    /// task is whoever completed the request.
    pub cgroup: u64,
    /// CPU the program ran on (the per-CPU counter `seq` belongs to).
    pub cpu: u32,
    /// Device exactly as the tracepoint reported it (the whole disk for
    /// block sources; `0:N` for the block-device inode case).
    pub raw_dev: u32,
    pub nr_sectors: u32,
    /// Source-specific: xfs shutdown flags, ext4 shutdown flags, ext4_error
    /// line number, xfs sick-mask.
    pub flags: u32,
    /// Process context the tracepoint ran in; for block completions this is
    /// whoever completed the request, not the issuer.
    pub pid: u32,
    pub comm: [u8; 16],
    /// NUL-padded text: rwbs (block), function (ext4_error), source file
    /// (xfs shutdown), tracepoint name (xfs corruption).
    pub detail: [u8; DETAIL_LEN],
    pub _pad: u32,
}

pub const DETAIL_LEN: usize = 32;

/// When one CPU first and last counted an error of a key (kernel map
/// `TIMES`): `bpf_ktime_get_ns()`, CLOCK_MONOTONIC. Userspace takes the
/// earliest `first_ns` and the latest `last_ns` over CPUs; 0 means this CPU
/// never counted the key.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ErrorTimes {
    pub first_ns: u64,
    pub last_ns: u64,
}

/// Slots of the per-CPU `STATS` array: what the kernel side dropped or merged.
pub mod stat {
    /// Samples not sent because the device's rate limit was exhausted.
    pub const SAMPLES_SUPPRESSED: u32 = 0;
    /// Samples lost because the ring buffer was full.
    pub const RINGBUF_FULL: u32 = 1;
    /// Errors that could not be counted because the counter map was full.
    pub const COUNTER_MAP_FULL: u32 = 2;
    /// Repeated `filemap_set_wb_err` hits for an error already recorded.
    pub const WRITEBACK_REPEATS: u32 = 3;
    /// Failed bios of a stacking device that carried an error up from a
    /// device below it, already counted there.
    pub const BIO_PROPAGATED: u32 = 4;
    /// Written by userspace only (no program touches it): what the
    /// counters of pruned keys had counted under `block_rq_error`, so that
    /// the programs' count of that source stays whole across a restart.
    pub const PRUNED_RQ_ERRORS: u32 = 5;
    /// Written by userspace only: the programs' `block_rq_error` count when
    /// the pinned tracer witness was made (its baseline).
    pub const WITNESS_BASE: u32 = 6;
    /// Bios not followed while they wait because the `WAITING` map was
    /// full (see [`WAITING_MAX`]).
    pub const WAITING_FULL: u32 = 7;
    /// A device's first read or write latency found `LATENCY` full.
    pub const LATENCY_FULL: u32 = 8;
    pub const LEN: u32 = 9;
}

/// Slots of the kernel's `WAITING` array: at most this many bios are
/// followed from submission to completion at once. A stall is seen from
/// its oldest bios, which are in the array before the queue behind them
/// fills it; what did not fit is counted (`stat::WAITING_FULL`). A bio may
/// take one of [`WAITING_WAYS`] slots only, so a table can refuse a bio
/// before it is full: with 4,096 bios waiting (deeper than one device's
/// queue: NVMe's largest is 4095 per queue, SCSI's `can_queue` a few
/// thousand), one in about a thousand finds its 8 slots taken. The memory
/// is fixed at load: 16,384 slots of 24 bytes, 384 KiB.
pub const WAITING_MAX: u32 = 16384;

/// The slots one bio may take, consecutive from [`waiting_slots`].
pub const WAITING_WAYS: u32 = 8;

/// The first of the [`WAITING_WAYS`] slots of a bio whose key is `key`:
/// its address, or its address less a constant (the `tp_btf` programs
/// may only subtract from a typed pointer), hashed (Fibonacci hashing: the
/// multiplier is 2^64 divided by the golden ratio, which spreads addresses
/// that differ only in a few low or middle bits, as slab objects do, over
/// the whole table).
#[inline(always)]
pub fn waiting_slots(key: u64) -> u32 {
    // The product's top bits: the ones every bit of the address reaches.
    let h = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - WAITING_MAX.trailing_zeros())) as u32;
    h & !(WAITING_WAYS - 1)
}

/// One slot of `WAITING`: a bio the block layer has been handed and not
/// yet completed, or free (`bio` 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Waiting {
    /// The bio's address; 0: the slot is free.
    pub bio: u64,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) when `block_bio_queue` ran.
    pub queued_ns: u64,
    /// Kernel-encoded dev_t of the device it was submitted to: the
    /// partition where there is one.
    pub dev: u32,
    /// `bio.bi_opf`: the operation in its low 8 bits ([`rq::OP_MASK`]).
    pub opf: u32,
}

/// Entries of the kernel's `LATENCY` map: one per device, operation and
/// latency bucket that has seen a completion (a device uses a dozen or two
/// of the buckets); userspace removes the entries of devices that are
/// gone. One map for all CPUs (the counters are added to atomically), so
/// its memory (8192 entries of 8 + 16 bytes, about 0.8 MiB with the
/// kernel's element headers) does not grow with the CPUs.
pub const LATENCY_MAX: u32 = 8192;

/// Completion latency buckets: two per power of two of microseconds
/// ([`latency_bucket`]), from under 2 µs to 12.6 s and more.
pub const LATENCY_BUCKETS: usize = 48;

/// `LATENCY`'s key: a device (the partition where there is one),
/// [`op::READ`] or [`op::WRITE`], and a [`latency_bucket`]; the value
/// ([`LatencyCount`]) counts the completions there since the entry was
/// made. (A key per
/// bucket, not an array per device: a program may not index a map value
/// by a computed bucket on every verifier.)
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LatencyKey {
    pub dev: u32,
    pub op: u16,
    pub bucket: u16,
}

/// `LATENCY`'s value: the completions of one bucket and the sum of their
/// latencies, so that a histogram built from the buckets has an exact sum
/// (the mean latency), not one guessed from the bucket bounds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyCount {
    pub count: u64,
    pub sum_ns: u64,
}

/// The bucket of a latency of `us` microseconds: 0 under 2 µs, then two
/// per power of two (`2^k` and `1.5 × 2^k`), the last one open-ended.
#[inline(always)]
pub fn latency_bucket(us: u64) -> usize {
    if us < 2 {
        return 0;
    }
    let msb = 63 - us.leading_zeros() as u64;
    let half = (us >> (msb - 1)) & 1;
    let b = (2 * msb + half) as usize;
    if b < LATENCY_BUCKETS {
        b
    } else {
        LATENCY_BUCKETS - 1
    }
}

/// The smallest latency, in microseconds, that falls in bucket `b`.
pub fn latency_bucket_floor_us(b: usize) -> u64 {
    if b < 2 {
        return 0;
    }
    let msb = (b / 2) as u32;
    (1u64 << msb) + (b as u64 % 2) * (1u64 << (msb - 1))
}

/// Slots of the kernel global `BIO_LAYOUT`: what the `WAITING` programs
/// need to read a `struct bio`, from the kernel's BTF at load time.
/// [`rq::ABSENT`] marks a member this kernel does not have.
pub mod bio {
    /// 1 to follow bios (`--stall-after` not 0 and the layout complete).
    pub const ENABLED: usize = 0;
    /// Which raw tracepoint argument is the bio: `block_bio_queue` took
    /// `(q, bio)` before 5.11 and `(bio)` since (each has its program);
    /// `block_bio_complete` takes `(q, bio)` (1; its program reads that).
    pub const QUEUE_ARG: usize = 1;
    pub const COMPLETE_ARG: usize = 2;
    /// `bio.bi_opf`
    pub const OPF: usize = 3;
    /// `bio.bi_flags`, and the bit of `BIO_TRACE_COMPLETION` in it: set
    /// when `block_bio_queue` ran, cleared when `block_bio_complete` ran.
    pub const FLAGS: usize = 4;
    pub const BIT_TRACE_COMPLETION: usize = 5;
    /// `bio.bi_bdev` and `block_device.bd_dev` (kernels since 5.12).
    pub const BDEV: usize = 6;
    pub const BD_DEV: usize = 7;
    /// `bio.bi_disk` with `gendisk.major` and `.first_minor`, and the
    /// absolute sector `bio.bi_iter.bi_sector` (kernels before 5.12: the
    /// bio names the whole disk once the partition is remapped).
    pub const DISK: usize = 8;
    pub const DISK_MAJOR: usize = 9;
    pub const DISK_FIRST_MINOR: usize = 10;
    pub const SECTOR: usize = 11;
    /// A request's bios are completed by `block_rq_complete`, not
    /// `block_bio_complete` (blk-mq clears the bios' trace flag): the
    /// program there walks `request.bio` through `bio.bi_next`, each of
    /// `bio.bi_iter.bi_size` bytes.
    pub const RQ_BIO: usize = 12;
    pub const BI_NEXT: usize = 13;
    pub const BI_SIZE: usize = 14;
    /// Whose I/O it is, read only when userspace asks about an old bio
    /// (`bio_still_waiting`), never per request: the cgroup the block layer
    /// charges the bio to, which for writeback is the one that dirtied the
    /// pages, not the flusher's. `bio.bi_blkg`, `blkcg_gq.blkcg`, the
    /// offset of `blkcg.css` plus `cgroup_subsys_state.cgroup`,
    /// `cgroup.kn` and `kernfs_node.id` (the id cgroupfs shows as the
    /// directory's inode number). Absent without `CONFIG_BLK_CGROUP`.
    pub const BLKG: usize = 15;
    pub const BLKG_BLKCG: usize = 16;
    pub const BLKCG_CGROUP: usize = 17;
    pub const CGROUP_KN: usize = 18;
    pub const KN_ID: usize = 19;
    /// 1 to record each read's and write's latency in `LATENCY` as its
    /// entry leaves `WAITING` (`--latency-window` not 0).
    pub const LATENCY: usize = 20;
    pub const COUNT: usize = 21;
    /// At most this many bios of one request are removed at its
    /// completion; the rest (a request merged from more) are found
    /// completed by userspace's check and removed then.
    pub const RQ_BIOS_MAX: usize = 32;
}

/// Partitions of one disk, so that the kernel can attribute a block error
/// (which carries the whole disk and an absolute sector) to its partition.
pub const MAX_PARTITIONS: usize = 16;

#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PartRange {
    /// First sector of the partition on the disk (512-byte units).
    pub start: u64,
    /// One past its last sector.
    pub end: u64,
    /// Kernel-encoded dev_t of the partition.
    pub dev: u32,
    pub _pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartTable {
    pub count: u32,
    pub _pad: u32,
    pub parts: [PartRange; MAX_PARTITIONS],
}

impl PartTable {
    pub const EMPTY: PartTable = PartTable {
        count: 0,
        _pad: 0,
        parts: [PartRange {
            start: 0,
            end: 0,
            dev: 0,
            _pad: 0,
        }; MAX_PARTITIONS],
    };

    /// The partition holding `sector`, or `whole_disk` when none does.
    #[inline(always)]
    pub fn resolve(&self, whole_disk: u32, sector: u64) -> u32 {
        let mut i = 0;
        while i < MAX_PARTITIONS {
            if i as u32 >= self.count {
                break;
            }
            let p = &self.parts[i];
            if sector >= p.start && sector < p.end {
                return p.dev;
            }
            i += 1;
        }
        whole_disk
    }
}

/// Slots of the kernel side's `LAYOUT` table: the byte offset of each
/// tracepoint field the programs read. Userspace fills the table from the
/// running kernel's tracefs `format` files before loading, after checking
/// each field's name and size, so no program reads at a guessed offset.
pub mod field {
    // block:block_rq_error
    pub const RQ_ERROR_DEV: usize = 0;
    pub const RQ_ERROR_SECTOR: usize = 1;
    pub const RQ_ERROR_NR_SECTOR: usize = 2;
    pub const RQ_ERROR_ERROR: usize = 3;
    pub const RQ_ERROR_RWBS: usize = 4;
    // block:block_rq_complete
    pub const RQ_COMPLETE_DEV: usize = 5;
    pub const RQ_COMPLETE_SECTOR: usize = 6;
    pub const RQ_COMPLETE_NR_SECTOR: usize = 7;
    pub const RQ_COMPLETE_ERROR: usize = 8;
    pub const RQ_COMPLETE_RWBS: usize = 9;
    // ext4:ext4_error
    pub const EXT4_ERROR_DEV: usize = 10;
    pub const EXT4_ERROR_FUNCTION: usize = 11;
    pub const EXT4_ERROR_LINE: usize = 12;
    // ext4:ext4_shutdown
    pub const EXT4_SHUTDOWN_DEV: usize = 13;
    pub const EXT4_SHUTDOWN_FLAGS: usize = 14;
    // xfs:xfs_force_shutdown
    pub const XFS_SHUTDOWN_DEV: usize = 15;
    pub const XFS_SHUTDOWN_FLAGS: usize = 16;
    pub const XFS_SHUTDOWN_FNAME: usize = 17;
    pub const XFS_SHUTDOWN_LINE: usize = 18;
    // xfs:xfs_fs_mark_corrupt
    pub const XFS_FS_CORRUPT_DEV: usize = 19;
    pub const XFS_FS_CORRUPT_FLAGS: usize = 20;
    // xfs:xfs_group_mark_corrupt (xfs_ag_mark_corrupt on older kernels)
    pub const XFS_GROUP_CORRUPT_DEV: usize = 21;
    pub const XFS_GROUP_CORRUPT_FLAGS: usize = 22;
    // xfs:xfs_inode_mark_corrupt
    pub const XFS_INODE_CORRUPT_DEV: usize = 23;
    pub const XFS_INODE_CORRUPT_INO: usize = 24;
    pub const XFS_INODE_CORRUPT_FLAGS: usize = 25;
    // filemap:filemap_set_wb_err
    pub const WB_ERR_INO: usize = 26;
    pub const WB_ERR_DEV: usize = 27;
    pub const WB_ERR_ERRSEQ: usize = 28;
    // block:block_bio_complete
    pub const BIO_COMPLETE_DEV: usize = 29;
    pub const BIO_COMPLETE_SECTOR: usize = 30;
    pub const BIO_COMPLETE_NR_SECTOR: usize = 31;
    pub const BIO_COMPLETE_ERROR: usize = 32;
    pub const BIO_COMPLETE_RWBS: usize = 33;
    pub const COUNT: usize = 34;
}

/// Slots of the kernel global `RQ_LAYOUT`: what the `tp_btf` block programs
/// need to read a `struct request`, taken from the running kernel's BTF at
/// load time (byte offsets of members, bit numbers of request flags).
/// [`rq::ABSENT`] marks a member or flag this kernel does not have.
/// Length of `gendisk.disk_name` (`DISK_NAME_LEN`, 32 since 2.6) and of
/// the values of the `DISK_NAMES` map.
pub const DISK_NAME_LEN: usize = 32;

pub mod rq {
    /// `request.q`
    pub const Q: usize = 0;
    /// `request_queue.disk` (kernels since 5.16; older ones have `request.rq_disk`)
    pub const Q_DISK: usize = 1;
    /// `request.rq_disk` (kernels before 5.19)
    pub const RQ_DISK: usize = 2;
    /// `gendisk.major`
    pub const DISK_MAJOR: usize = 3;
    /// `gendisk.first_minor`
    pub const DISK_FIRST_MINOR: usize = 4;
    /// `request.__sector`
    pub const SECTOR: usize = 5;
    /// `request.cmd_flags`
    pub const CMD_FLAGS: usize = 6;
    /// Bit numbers in `cmd_flags` (`enum req_flag_bits`).
    pub const BIT_PREFLUSH: usize = 7;
    pub const BIT_FUA: usize = 8;
    pub const BIT_RAHEAD: usize = 9;
    pub const BIT_SYNC: usize = 10;
    pub const BIT_META: usize = 11;
    /// 1 when `block_rq_complete`'s raw error argument is already an errno
    /// (kernels before 5.14 pass `int`, later ones `blk_status_t`).
    pub const COMPLETE_ARG_ERRNO: usize = 12;
    /// What `blk_update_request` checks before it prints a failed request
    /// and runs `block_rq_error`, for counting the same requests earlier
    /// (`EARLY_ERRORS`): `request.rq_flags`, `request.bio`, `gendisk.state`,
    /// and the bit number of `RQF_QUIET` (`enum rqf_flags`; kernels that
    /// only `#define` it leave the four absent).
    pub const RQ_FLAGS: usize = 13;
    pub const RQ_BIO: usize = 14;
    pub const DISK_STATE: usize = 15;
    pub const BIT_RQF_QUIET: usize = 16;
    /// `gendisk.disk_name`, for `DISK_NAMES`.
    pub const DISK_NAME: usize = 17;
    /// `gendisk.diskseq` (Linux 5.15+), for [`super::CounterKey::diskseq`].
    pub const DISK_SEQ: usize = 18;
    pub const COUNT: usize = 19;
    pub const ABSENT: u32 = u32::MAX;
    /// Entries of the kernel global `STATUS_ERRNO` (errno per `blk_status_t`).
    pub const STATUS_COUNT: usize = 32;
    /// The operation's bits in `cmd_flags` (`REQ_OP_BITS`, 8 since 4.10).
    pub const OP_MASK: u32 = 0xff;
    /// `enum req_op` values (unchanged since 4.10).
    pub const OP_READ: u32 = 0;
    pub const OP_WRITE: u32 = 1;
    pub const OP_FLUSH: u32 = 2;
    pub const OP_DISCARD: u32 = 3;
    pub const OP_SECURE_ERASE: u32 = 5;
    pub const OP_WRITE_ZEROES: u32 = 9;
    /// Operations from 32 up are passthrough (`REQ_OP_SCSI_*` before 5.11,
    /// `REQ_OP_DRV_*`): the tracepoints show sector 0 for them.
    pub const OP_PASSTHROUGH: u32 = 32;
    /// `GD_DEAD` in `gendisk.state`: the disk is gone and its failures are
    /// neither printed nor traced (a `#define`, 2 since it appeared in 5.15).
    pub const GD_DEAD_BIT: u32 = 2;
}

/// Slots of the kernel global `FILE_LAYOUT`: where the returned-error
/// programs find a file's filesystem device, from the running kernel's BTF
/// ([`rq::ABSENT`] where it has no such member).
pub mod file {
    /// `file.f_inode`
    pub const F_INODE: usize = 0;
    /// `inode.i_sb`, `super_block.s_dev`
    pub const I_SB: usize = 1;
    pub const S_DEV: usize = 2;
    /// `inode.i_ino`, `inode.i_mode`, `inode.i_rdev` (a block device
    /// node's errors are the device's, not its directory's filesystem's).
    pub const I_INO: usize = 3;
    pub const I_MODE: usize = 4;
    pub const I_RDEV: usize = 5;
    pub const COUNT: usize = 6;
    /// `S_IFMT` and `S_IFBLK` of include/uapi/linux/stat.h.
    pub const S_IFMT: u16 = 0o170000;
    pub const S_IFBLK: u16 = 0o060000;
}

/// How `block_rq_complete` is used (kernel global `COMPLETE_MODE`).
pub mod complete_mode {
    /// Not attached.
    pub const OFF: u32 = 0;
    /// Only failed flushes: they never reach `block_rq_error`.
    pub const FLUSH_ONLY: u32 = 1;
    /// Every failed request: the fallback for kernels without `block_rq_error`.
    pub const ALL_ERRORS: u32 = 2;
}

/// Key of the kernel's `STACKED` set: `lower` is somewhere below `upper` in
/// the device stack (a dm target's device, an md member, or a partition or
/// disk beneath those), so a failed bio of `lower` can fail one of `upper`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StackPair {
    pub upper: u32,
    pub lower: u32,
}

/// Kernel dev_t helpers (`MAJOR`/`MINOR`/`MKDEV` of include/linux/kdev_t.h).
pub mod kdev {
    pub const MINOR_BITS: u32 = 20;
    #[inline(always)]
    pub const fn major(dev: u32) -> u32 {
        dev >> MINOR_BITS
    }
    #[inline(always)]
    pub const fn minor(dev: u32) -> u32 {
        dev & ((1 << MINOR_BITS) - 1)
    }
    #[inline(always)]
    pub const fn make(major: u32, minor: u32) -> u32 {
        (major << MINOR_BITS) | minor
    }
}

#[cfg(feature = "user")]
mod pod {
    // Each of these is plain #[repr(C)] data of integers with explicit
    // padding (the layout test below pins their sizes), valid for any bytes.
    // SAFETY: as said above.
    unsafe impl aya::Pod for super::CounterKey {}
    // SAFETY: as said above.
    unsafe impl aya::Pod for super::PartTable {}
    // SAFETY: as said above.
    unsafe impl aya::Pod for super::PartRange {}
    // SAFETY: as said above.
    unsafe impl aya::Pod for super::StackPair {}
    // SAFETY: as said above.
    unsafe impl aya::Pod for super::ErrorTimes {}
    // SAFETY: as said above.
    unsafe impl aya::Pod for super::LatencyKey {}
    // SAFETY: as said above.
    unsafe impl aya::Pod for super::LatencyCount {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rwbs(s: &str) -> [u8; RWBS_LEN] {
        let mut b = [0u8; RWBS_LEN];
        b[..s.len()].copy_from_slice(s.as_bytes());
        b
    }

    #[test]
    fn rwbs_decoding_follows_blk_fill_rwbs() {
        let cases = [
            ("R", op::READ),
            ("RA", op::READ),
            ("RM", op::READ),
            ("W", op::WRITE),
            ("WS", op::WRITE),
            ("WFS", op::WRITE),
            ("FWS", op::WRITE),
            ("FWFS", op::WRITE),
            ("F", op::FLUSH),
            ("FS", op::FLUSH),
            ("FF", op::FLUSH),
            ("D", op::DISCARD),
            ("DE", op::SECURE_ERASE),
            ("WZ", op::WRITE_ZEROES),
            ("N", op::OTHER),
            ("", op::NONE),
        ];
        for (text, want) in cases {
            assert_eq!(op_from_rwbs(&rwbs(text)), want, "rwbs {text:?}");
        }
    }

    #[test]
    fn operations_follow_enum_req_op() {
        let ops = [
            (0, op::READ),
            (1, op::WRITE),
            (2, op::FLUSH),
            (3, op::DISCARD),
        ];
        for (opf, want) in ops {
            assert_eq!(op_from_opf(opf), want);
        }
        assert_eq!(op_from_opf(5), op::SECURE_ERASE);
        assert_eq!(op_from_opf(9), op::WRITE_ZEROES);
        assert_eq!(op_from_opf(34), op::OTHER);
        // Flags above the operation's 8 bits do not change it.
        assert_eq!(op_from_opf(1 | 1 << 17), op::WRITE);
    }

    #[test]
    fn partition_lookup_uses_half_open_ranges() {
        let mut t = PartTable::EMPTY;
        t.count = 2;
        t.parts[0] = PartRange {
            start: 2048,
            end: 4096,
            dev: kdev::make(259, 1),
            _pad: 0,
        };
        t.parts[1] = PartRange {
            start: 4096,
            end: 8192,
            dev: kdev::make(259, 2),
            _pad: 0,
        };
        let disk = kdev::make(7, 3);
        assert_eq!(t.resolve(disk, 0), disk);
        assert_eq!(t.resolve(disk, 2048), kdev::make(259, 1));
        assert_eq!(t.resolve(disk, 4095), kdev::make(259, 1));
        assert_eq!(t.resolve(disk, 4096), kdev::make(259, 2));
        assert_eq!(t.resolve(disk, 8192), disk);
        assert_eq!(t.resolve(disk, u64::MAX), disk);
    }

    #[test]
    fn latency_buckets_are_half_powers_of_two() {
        let b = latency_bucket;
        assert_eq!(
            [b(0), b(1), b(2), b(3), b(4), b(5), b(6), b(7), b(8)],
            [0, 0, 2, 3, 4, 4, 5, 5, 6]
        );
        // 300 ms: in [2^18, 1.5 × 2^18) µs.
        assert_eq!(b(300_000), 36);
        assert_eq!(latency_bucket_floor_us(36), 262_144);
        assert_eq!(latency_bucket_floor_us(37), 393_216);
        assert_eq!(b(u64::MAX), LATENCY_BUCKETS - 1);
        // Every bucket's floor falls in that bucket, and one less in the
        // bucket before (bucket 1 is never used: 0 takes 0 and 1 µs).
        assert_eq!(b(latency_bucket_floor_us(2) - 1), 0);
        for i in 3..LATENCY_BUCKETS {
            let floor = latency_bucket_floor_us(i);
            assert_eq!(b(floor), i, "{floor}");
            assert_eq!(b(floor - 1), i - 1, "{floor}");
        }
    }

    /// Bios come from slabs: addresses a fixed stride apart. Their slots
    /// must spread over the table, each the first of its group.
    #[test]
    fn bios_of_one_slab_spread_over_the_waiting_slots() {
        let groups = (WAITING_MAX / WAITING_WAYS) as usize;
        for stride in [128u64, 256, 4096] {
            let mut used = [0u32; (WAITING_MAX / WAITING_WAYS) as usize];
            for i in 0..groups as u64 {
                let first = waiting_slots(0xffff_8881_0000_0000 + i * stride);
                assert_eq!(first % WAITING_WAYS, 0);
                assert!(first + WAITING_WAYS <= WAITING_MAX);
                used[(first / WAITING_WAYS) as usize] += 1;
            }
            // As many bios as groups: a random spread leaves about 1/e of
            // the groups empty and crowds none.
            let taken = used.iter().filter(|&&n| n > 0).count();
            assert!(
                taken * 2 > groups,
                "stride {stride}: {taken} groups of {groups}"
            );
            let crowded = used.iter().max().copied().unwrap_or(0);
            assert!(crowded <= 8, "stride {stride}: {crowded} bios in one group");
        }
    }

    #[test]
    fn record_layouts_are_stable() {
        assert_eq!(core::mem::size_of::<CounterKey>(), 24);
        assert_eq!(core::mem::size_of::<ErrorSample>(), 136);
        assert_eq!(core::mem::size_of::<ErrorTimes>(), 16);
        assert_eq!(core::mem::size_of::<Waiting>(), 24);
        assert_eq!(core::mem::size_of::<LatencyKey>(), 8);
        assert_eq!(core::mem::size_of::<PartTable>(), 8 + 24 * MAX_PARTITIONS);
        assert_eq!(kdev::make(7, 2), 0x700002);
        assert_eq!((kdev::major(0x700002), kdev::minor(0x700002)), (7, 2));
    }
}
