//! Kernel programs of volume-health.
//!
//! Each program is attached to one tracepoint and does three things, in this
//! order: resolve the device the error belongs to, count the error in a
//! per-CPU counter keyed by (device, source, op, errno), and, if the
//! device's sample budget allows, stream one [`ErrorSample`] to userspace.
//! Counting never depends on the budget, so userspace can report exact
//! totals however hard a dying disk floods.
//!
//! Field offsets are not compiled in: userspace reads them from the running
//! kernel's tracefs `format` files, checks names and sizes, and writes them
//! into `LAYOUT` before loading (it is read-only to the programs, so the
//! verifier sees each offset as a constant).
#![no_std]
#![no_main]
// The BPF target has no atomic types with read-modify-write in `core`, but
// LLVM emits BPF's atomic add for the intrinsic.
#![allow(internal_features)]
#![feature(core_intrinsics)]

use aya_ebpf::{
    bindings::{BPF_F_MMAPABLE, BPF_NOEXIST},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_kernel_str_bytes,
    },
    macros::{btf_tracepoint, fentry, map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, LruHashMap, LruPerCpuHashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{BtfTracePointContext, FEntryContext, RawTracePointContext, TracePointContext},
    EbpfContext,
};
use aya_log_ebpf::debug;

mod fs;
mod requests;
mod returns;
mod waiting;

// The records shared with userspace, compiled into this crate as a module
// rather than as a dependency: cargo hashes a path dependency outside this
// crate's workspace (health-common sits beside it) by its absolute path, and
// the hash ends up in symbol names, so the object would differ with the
// checkout's location. As a module it is the same from any checkout
// (xtask/src/ebpf/, docs/development.md, "The kernel object").
#[path = "../../health-common/src/lib.rs"]
#[allow(dead_code, unused_attributes)]
mod health_common;

use health_common::{
    complete_mode, field, kdev, op, op_from_opf, op_from_rwbs, rq, source, stat, CounterKey,
    ErrorSample, ErrorTimes, PartTable, StackPair, DETAIL_LEN, DISK_NAME_LEN, RWBS_LEN,
};

/// Byte offset of each tracepoint field, indexed by [`field`] slots.
#[no_mangle]
static LAYOUT: [u32; field::COUNT] = [0; field::COUNT];

/// Offsets into `struct request` and its disk, and request flag bits, from
/// the kernel's BTF, indexed by [`rq`] slots (for the `tp_btf` programs).
#[no_mangle]
static RQ_LAYOUT: [u32; rq::COUNT] = [rq::ABSENT; rq::COUNT];

/// errno per `blk_status_t` on this kernel (0: not known here, taken as EIO,
/// the kernel's own catch-all); userspace fills it for the kernel version.
#[no_mangle]
static STATUS_ERRNO: [u8; rq::STATUS_COUNT] = [0; rq::STATUS_COUNT];

/// One of [`complete_mode`].
#[no_mangle]
static COMPLETE_MODE: u32 = complete_mode::OFF;

/// 1: the `tp_btf` `block_rq_complete` program also counts every failed
/// request that `block_rq_error` would show, which is then not attached
/// (`--early-block-errors`). The kernel runs `block_rq_complete` before it
/// prints the failure to its console; `block_rq_error` only after.
#[no_mangle]
static EARLY_ERRORS: u32 = 0;

/// Samples a device may send per second, per CPU. Counting is not limited.
#[no_mangle]
static SAMPLES_PER_SEC: u32 = 100;

/// Exact error counts. The value is per CPU, so each CPU increments its own
/// slot; the increment is still atomic, because `tp_btf` programs may nest
/// on one CPU (a completion in a hardirq inside a softirq one runs another
/// program; the kernel only keeps a program from nesting inside itself, and
/// counts that as a miss, which userspace reads from the program's stats).
#[map]
static COUNTS: PerCpuHashMap<CounterKey, u64> = PerCpuHashMap::with_max_entries(8192, 0);

/// First and last error time per key, per CPU (no atomics, as `COUNTS`).
/// `health-agent volumes` shows them as a volume's kernel evidence.
#[map]
static TIMES: PerCpuHashMap<CounterKey, ErrorTimes> = PerCpuHashMap::with_max_entries(8192, 0);

/// Written by userspace only: per key and CPU, how many of `COUNTS` the
/// agent has already reported. Pinned with the counters, it lets a
/// restarted agent report exactly what it has not reported before. No
/// program touches it; it is declared here so that it lives and is pinned
/// with the object's other maps.
#[map]
static ACCOUNTED: PerCpuHashMap<CounterKey, u64> = PerCpuHashMap::with_max_entries(8192, 0);

/// Samples to userspace.
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// What was dropped or merged, indexed by [`stat`] slots.
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::LEN, 0);

/// Partition tables by whole-disk device, kept current by userspace: block
/// tracepoints report the disk and an absolute sector, and only the sector
/// tells which partition's filesystem was hit.
#[map]
static PARTITIONS: HashMap<u32, PartTable> = HashMap::with_max_entries(1024, 0);

/// Every block device number on the host, kept current by userspace. Used to
/// recognise writeback errors of a block device's own page cache (journal
/// and superblock buffers), which the kernel reports against the block
/// device pseudo filesystem (dev 0:N) with the real device in the inode
/// number.
#[map]
static BLOCK_DEVS: HashMap<u32, u8> = HashMap::with_max_entries(16384, 0);

/// The kernel's name of each disk a failed request was seen on, by device
/// number, written once per disk by the `tp_btf` request programs. The
/// number a request carries is not always one userspace can see: 5.10 gives
/// the hidden path disks of NVMe multipath no `dev` file and lists them as
/// `0 0` in /proc/diskstats, so userspace learns their numbers from here.
#[map]
static DISK_NAMES: LruHashMap<u32, [u8; DISK_NAME_LEN]> = LruHashMap::with_max_entries(1024, 0);

/// Bio-based stacking devices (device-mapper, md) and their partitions,
/// kept current by userspace: only their failed bios are counted from
/// `block_bio_complete`; every other device's failures are failed requests.
#[map]
static BIO_DEVS: HashMap<u32, u8> = HashMap::with_max_entries(4096, 0);

/// (upper, lower) pairs of the device stack, kept current by userspace, so
/// that a failed bio passed up from below is recognised as such.
#[map]
static STACKED: HashMap<StackPair, u8> = HashMap::with_max_entries(16384, 0);

/// The last failed request or bio seen on this CPU (see `note_failure`).
#[repr(C)]
#[derive(Clone, Copy)]
struct LastBioError {
    mono_ns: u64,
    pid_tgid: u64,
    dev: u32,
    _pad: u32,
}

#[map]
static LAST_BIO_ERROR: PerCpuArray<LastBioError> = PerCpuArray::with_max_entries(1, 0);

/// A stacking device completes the bio a failed lower bio belonged to in
/// the same call chain (same CPU, same task context); this bounds how long
/// after a lower failure an upper one counts as its echo. The chain
/// includes the kernel's `I/O error, dev ...` line, printed between the
/// request's completion and its bio's: on a 115200-baud serial console
/// about 9 ms, and 6.7 ms was seen in an emulated guest, so 5 ms counted
/// some echoes twice. Same CPU, same task and a stacked pair keep a wider
/// window from taking an unrelated failure for an echo.
const PROPAGATION_WINDOW_NS: u64 = 50_000_000;

/// Per-device, per-CPU sample budget for the current one-second window.
#[repr(C)]
#[derive(Clone, Copy)]
struct Budget {
    window_start_ns: u64,
    sent: u64,
}

#[map]
static BUDGETS: LruPerCpuHashMap<u32, Budget> = LruPerCpuHashMap::with_max_entries(4096, 0);

/// Key for recognising repeats of one writeback error.
#[repr(C)]
#[derive(Clone, Copy)]
struct InodeKey {
    ino: u64,
    dev: u32,
    _pad: u32,
}

/// Inodes with a writeback error recorded, and the errseq value last seen.
#[map]
static WB_LAST: LruHashMap<InodeKey, u32> = LruHashMap::with_max_entries(4096, 0);

/// The errno being recorded by `__filemap_set_wb_err` on this CPU. The
/// tracepoint inside that function only shows the errseq value from
/// before the update (errseq_set returns the old value), which for the
/// first error on a file holds no errno at all; the fentry program sees
/// the function's `err` argument and leaves it here for the tracepoint.
#[repr(C)]
#[derive(Clone, Copy)]
struct WbPending {
    pid_tgid: u64,
    errno: u32,
    _pad: u32,
}

#[map]
static WB_PENDING: PerCpuArray<WbPending> = PerCpuArray::with_max_entries(1, 0);

/// The last failed write per device, for writeback errors whose errno
/// nothing else reveals (where fentry is not allowed): a writeback failure
/// on a block device is the failed write that just completed there.
#[repr(C)]
#[derive(Clone, Copy)]
struct LastWriteError {
    mono_ns: u64,
    errno: u32,
    _pad: u32,
}

#[map]
static LAST_WRITE_ERROR: LruHashMap<u32, LastWriteError> = LruHashMap::with_max_entries(4096, 0);

/// How recent a failed write must be to lend its errno to a writeback error.
const WRITE_ERRNO_WINDOW_NS: u64 = 5 * NSEC_PER_SEC;

const NSEC_PER_SEC: u64 = 1_000_000_000;
/// `MAX_ERRNO`: errseq keeps the errno in its low 12 bits.
const ERRSEQ_ERRNO_MASK: u32 = 0xfff;
/// errseq's flag: someone (fsync) has reported the current error.
const ERRSEQ_SEEN: u32 = 1 << 12;

#[inline(always)]
fn offset(slot: usize) -> usize {
    // SAFETY: LAYOUT is a plain array; the volatile read keeps the compiler
    // from folding in the all-zero initialiser that userspace overwrites.
    unsafe { core::ptr::read_volatile(&LAYOUT[slot]) as usize }
}

#[inline(always)]
fn global(v: &'static u32) -> u32 {
    // SAFETY: as for `offset`.
    unsafe { core::ptr::read_volatile(v) }
}

#[inline(always)]
fn read<T>(ctx: &TracePointContext, slot: usize) -> Option<T> {
    // SAFETY: the offset was checked against the tracepoint's format file.
    unsafe { ctx.read_at::<T>(offset(slot)).ok() }
}

#[inline(always)]
fn bump(slot: u32) {
    if let Some(p) = STATS.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot of a map value, 8-byte aligned.
        unsafe { increment(p) };
    }
}

/// Adds one to a per-CPU slot and returns its value afterwards (a program
/// nested in between may have added one too, which only makes two samples
/// carry the same count; userspace takes the later one as already covered).
#[inline(always)]
unsafe fn increment(p: *mut u64) -> u64 {
    use core::intrinsics::{atomic_xadd, AtomicOrdering::Relaxed};
    // SAFETY: the caller's pointer is a live, aligned u64 of a map value.
    unsafe {
        atomic_xadd::<u64, u64, { Relaxed }>(p, 1);
        core::ptr::read_volatile(p)
    }
}

/// Counts one error and returns this CPU's count for the key afterwards
/// (0 when the counter map is full and the error could not be counted).
#[inline(always)]
fn count<C: EbpfContext>(ctx: &C, key: &CounterKey) -> u64 {
    if let Some(p) = COUNTS.get_ptr_mut(key) {
        // SAFETY: this CPU's slot.
        return unsafe { increment(p) };
    }
    if COUNTS.insert(key, &1, BPF_NOEXIST as u64).is_ok() {
        return 1;
    }
    // Another CPU inserted the key first, or the map is full.
    if let Some(p) = COUNTS.get_ptr_mut(key) {
        // SAFETY: this CPU's slot.
        return unsafe { increment(p) };
    }
    bump(stat::COUNTER_MAP_FULL);
    debug!(ctx, "counter map full, dev {} errno {}", key.dev, key.errno);
    0
}

/// Keeps this CPU's first and last error time of `key` (see `TIMES`).
#[inline(always)]
fn note_time(key: &CounterKey, now: u64) {
    if let Some(t) = TIMES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot.
        let t = unsafe { &mut *t };
        if t.first_ns == 0 {
            t.first_ns = now;
        }
        t.last_ns = now;
        return;
    }
    let fresh = ErrorTimes {
        first_ns: now,
        last_ns: now,
    };
    if TIMES.insert(key, &fresh, BPF_NOEXIST as u64).is_ok() {
        return;
    }
    // Another CPU inserted the key first (its zeroed slot for this CPU is
    // filled here), or the map is full (the time is lost, the count is not).
    if let Some(t) = TIMES.get_ptr_mut(key) {
        // SAFETY: this CPU's slot.
        let t = unsafe { &mut *t };
        if t.first_ns == 0 {
            t.first_ns = now;
        }
        t.last_ns = now;
    }
}

/// Takes one sample from the device's budget for this second.
#[inline(always)]
fn within_budget(dev: u32, now: u64) -> bool {
    let limit = global(&SAMPLES_PER_SEC) as u64;
    match BUDGETS.get_ptr_mut(dev) {
        Some(b) => {
            // SAFETY: this CPU's slot.
            let b = unsafe { &mut *b };
            if now.wrapping_sub(b.window_start_ns) >= NSEC_PER_SEC {
                b.window_start_ns = now;
                b.sent = 0;
            }
            if b.sent < limit {
                b.sent += 1;
                true
            } else {
                false
            }
        }
        None => {
            let fresh = Budget {
                window_start_ns: now,
                sent: 1,
            };
            // A failed insert only costs this one sample's budget check.
            let _ = BUDGETS.insert(dev, &fresh, 0);
            limit > 0
        }
    }
}

/// What a program knows about one error beyond its counter key.
struct Details {
    raw_dev: u32,
    sector: u64,
    nr_sectors: u32,
    ino: u64,
    flags: u32,
}

/// Counts the error, then sends a sample if the device's budget allows.
/// Returns the reserved sample slot so the caller can add its text detail.
#[inline(always)]
fn record<C: EbpfContext>(
    ctx: &C,
    key: CounterKey,
    d: Details,
) -> Option<aya_ebpf::maps::ring_buf::RingBufEntry<ErrorSample>> {
    let seq = count(ctx, &key);
    let now = unsafe { bpf_ktime_get_ns() };
    if seq != 0 {
        note_time(&key, now);
    }
    if !within_budget(key.dev, now) {
        bump(stat::SAMPLES_SUPPRESSED);
        return None;
    }
    let Some(mut entry) = SAMPLES.reserve::<ErrorSample>(0) else {
        bump(stat::RINGBUF_FULL);
        return None;
    };
    entry.write(ErrorSample {
        key,
        seq,
        mono_ns: now,
        sector: d.sector,
        ino: d.ino,
        cgroup: 0,
        cpu: unsafe { bpf_get_smp_processor_id() },
        raw_dev: d.raw_dev,
        nr_sectors: d.nr_sectors,
        flags: d.flags,
        pid: (bpf_get_current_pid_tgid() >> 32) as u32,
        comm: bpf_get_current_comm().unwrap_or([0; 16]),
        detail: [0; DETAIL_LEN],
        _pad: 0,
    });
    Some(entry)
}

#[inline(always)]
fn detail_mut(
    entry: &mut aya_ebpf::maps::ring_buf::RingBufEntry<ErrorSample>,
) -> &mut [u8; DETAIL_LEN] {
    // SAFETY: `record` initialised the whole sample before returning it.
    unsafe { &mut (*entry.as_mut_ptr()).detail }
}

/// Shared body of the two block tracepoints (same event class, own offsets).
#[inline(always)]
fn block_error(
    ctx: &TracePointContext,
    src: u8,
    slots: [usize; 5],
    flush_only: bool,
) -> Option<()> {
    let [dev_slot, sector_slot, nr_slot, error_slot, rwbs_slot] = slots;
    let error: i32 = read(ctx, error_slot)?;
    if error == 0 {
        return Some(());
    }
    let rwbs: [u8; RWBS_LEN] = read(ctx, rwbs_slot)?;
    let failed = FailedBlock {
        disk: read(ctx, dev_slot)?,
        sector: read(ctx, sector_slot)?,
        nr_sectors: read(ctx, nr_slot)?,
        opcode: op_from_rwbs(&rwbs),
        errno: error.unsigned_abs(),
        rwbs,
        diskseq: 0,
    };
    failed_request(ctx, src, failed, flush_only)
}

/// What both kinds of block request program do with a failed request: note
/// it for the stacking layers above, classify it, count it.
#[inline(always)]
fn failed_request<C: EbpfContext>(
    ctx: &C,
    src: u8,
    mut f: FailedBlock,
    flush_only: bool,
) -> Option<()> {
    if f.disk == 0 {
        // A request of no disk: an NVMe controller's admin command, which
        // 5.10's block_rq_complete (the fallback there) traces with dev
        // 0:0, e.g. failing with ENOLINK while a controller is removed.
        // No block device's I/O failed; block_rq_error leaves these out.
        return Some(());
    }
    // A failed request's bios complete without block_bio_complete (the
    // request was traced), so the request itself is what a stacking device
    // above may echo.
    note_failure(f.disk);
    let mut opcode = f.opcode;
    let nr_sectors = f.nr_sectors;
    if opcode == op::WRITE && nr_sectors == 0 {
        // A write without data is the carrier of a preflush (fsync on a
        // block device, a journal commit): its failure is a failed flush.
        // block_rq_complete sees the flush request itself, so where it
        // counts (flush errors on, or the fallback of kernels without
        // block_rq_error) the carrier is left out: each failure once.
        if src == source::BLOCK_RQ_COMPLETE || global(&COMPLETE_MODE) == complete_mode::FLUSH_ONLY {
            return Some(());
        }
        opcode = op::FLUSH;
    }
    if flush_only && opcode != op::FLUSH {
        return Some(());
    }
    f.opcode = opcode;
    count_block_error(ctx, src, f)
}

/// One failed request or bio, as its tracepoint showed it.
struct FailedBlock {
    disk: u32,
    sector: u64,
    nr_sectors: u32,
    opcode: u8,
    errno: u32,
    rwbs: [u8; RWBS_LEN],
    /// The disk's sequence number where the program has the disk (the
    /// `tp_btf` request programs), else 0 (see `CounterKey::diskseq`).
    diskseq: u64,
}

/// Resolves the partition, remembers a failed write's errno for writeback
/// errors, counts the error and samples it.
#[inline(always)]
fn count_block_error<C: EbpfContext>(ctx: &C, src: u8, f: FailedBlock) -> Option<()> {
    // The tracepoints name the whole disk with an absolute sector (bios of
    // kernels since 5.12 name the partition already, which resolves to itself).
    let dev = match unsafe { PARTITIONS.get(f.disk) } {
        Some(table) => table.resolve(f.disk, f.sector),
        None => f.disk,
    };
    let key = CounterKey::new(dev, src, f.opcode, f.errno).of_disk(f.diskseq);
    if f.opcode == op::WRITE {
        let last = LastWriteError {
            mono_ns: unsafe { bpf_ktime_get_ns() },
            errno: key.errno,
            _pad: 0,
        };
        let _ = LAST_WRITE_ERROR.insert(dev, &last, 0);
    }
    let details = Details {
        raw_dev: f.disk,
        sector: f.sector,
        nr_sectors: f.nr_sectors,
        ino: 0,
        flags: 0,
    };
    let mut entry = record(ctx, key, details)?;
    detail_mut(&mut entry)[..RWBS_LEN].copy_from_slice(&f.rwbs);
    entry.submit(0);
    Some(())
}

#[tracepoint]
pub fn block_rq_error(ctx: TracePointContext) -> u32 {
    let slots = [
        field::RQ_ERROR_DEV,
        field::RQ_ERROR_SECTOR,
        field::RQ_ERROR_NR_SECTOR,
        field::RQ_ERROR_ERROR,
        field::RQ_ERROR_RWBS,
    ];
    let _ = block_error(&ctx, source::BLOCK_RQ_ERROR, slots, false);
    0
}

/// Runs on every block completion when attached, so it leaves as soon as it
/// has read the error field: that is the whole cost on the healthy path.
#[tracepoint]
pub fn block_rq_complete(ctx: TracePointContext) -> u32 {
    let mode = global(&COMPLETE_MODE);
    if mode == complete_mode::OFF {
        return 0;
    }
    let slots = [
        field::RQ_COMPLETE_DEV,
        field::RQ_COMPLETE_SECTOR,
        field::RQ_COMPLETE_NR_SECTOR,
        field::RQ_COMPLETE_ERROR,
        field::RQ_COMPLETE_RWBS,
    ];
    let flush_only = mode == complete_mode::FLUSH_ONLY;
    let _ = block_error(&ctx, source::BLOCK_RQ_COMPLETE, slots, flush_only);
    0
}

/// Records a failed request or bio of `dev` as this CPU's last failure and
/// says whether it echoes the previous one: a failure of a device below
/// `dev`, completed in the same call chain (same CPU, same task, moments
/// before), which a stacking layer is now passing up.
#[inline(always)]
fn note_failure(dev: u32) -> bool {
    let now = unsafe { bpf_ktime_get_ns() };
    let pid_tgid = bpf_get_current_pid_tgid();
    let Some(last) = LAST_BIO_ERROR.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: this CPU's slot.
    let last = unsafe { &mut *last };
    let echo = now.wrapping_sub(last.mono_ns) < PROPAGATION_WINDOW_NS
        && last.pid_tgid == pid_tgid
        && unsafe {
            STACKED.get(&StackPair {
                upper: dev,
                lower: last.dev,
            })
        }
        .is_some();
    *last = LastBioError {
        mono_ns: now,
        pid_tgid,
        dev,
        _pad: 0,
    };
    echo
}

/// `A` among rwbs's flag letters: a readahead request.
#[inline(always)]
fn is_readahead(rwbs: &[u8; RWBS_LEN]) -> bool {
    let mut i = 1;
    while i < RWBS_LEN {
        if rwbs[i] == b'A' {
            return true;
        }
        i += 1;
    }
    false
}

/// Runs on every bio completion of every layer, so it leaves as soon as it
/// has read the error field: that is the whole cost on the healthy path.
#[tracepoint]
pub fn block_bio_complete(ctx: TracePointContext) -> u32 {
    let _ = try_block_bio_complete(&ctx);
    0
}

fn try_block_bio_complete(ctx: &TracePointContext) -> Option<()> {
    let error: i32 = read(ctx, field::BIO_COMPLETE_ERROR)?;
    if error == 0 {
        return Some(());
    }
    let disk: u32 = read(ctx, field::BIO_COMPLETE_DEV)?;
    let echo = note_failure(disk);
    if unsafe { BIO_DEVS.get(disk) }.is_none() {
        // A request-based device: its failure was a failed request.
        return Some(());
    }
    if echo {
        bump(stat::BIO_PROPAGATED);
        return Some(());
    }
    let rwbs: [u8; RWBS_LEN] = read(ctx, field::BIO_COMPLETE_RWBS)?;
    if is_readahead(&rwbs) {
        // Readahead is best effort: a layer may fail it by design (dm-zero)
        // and the kernel retries the pages as ordinary reads, which count.
        return Some(());
    }
    let nr_sectors: u32 = read(ctx, field::BIO_COMPLETE_NR_SECTOR)?;
    let sector: u64 = read(ctx, field::BIO_COMPLETE_SECTOR)?;
    let failed = FailedBlock {
        disk,
        sector,
        nr_sectors,
        opcode: op_from_rwbs(&rwbs),
        errno: error.unsigned_abs(),
        rwbs,
        diskseq: 0,
    };
    count_block_error(ctx, source::BLOCK_BIO_ERROR, failed)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
