//! Bios while they wait: every bio the block layer is handed is kept in
//! `WAITING` from `block_bio_queue` until `block_bio_complete`, so that
//! userspace sees, per device, how many wait and since when, while nothing
//! completes (`--stall-after`). `block_bio_queue` runs once per bio on
//! every layer; a bio-based device (dm, md, NVMe multipath) completes it at
//! `block_bio_complete`, a request-based one with its request at
//! `block_rq_complete` (blk-mq clears the bio's trace flag there), so each
//! entry is removed by its own completion.
//!
//! `WAITING` is an array, not a hash map: this runs twice for every I/O of
//! the node, and a hash map's insert and delete (a bucket lock, an element
//! taken from and given back to per-CPU free lists, on two CPUs) cost
//! about 600 ns a run here, where the verifier turns an array lookup into
//! a few instructions. A bio has [`WAITING_WAYS`] slots it may use, chosen
//! by its address; it takes the one that holds its address or the first
//! free one, and its completion frees the slot holding its address. No
//! slot free: the bio is counted (`stat::WAITING_FULL`), not followed. Two
//! CPUs may pick the same free slot at once; one bio is then not followed,
//! and its completion finds no slot: it can be missed, never reported
//! wrongly, since userspace asks the kernel before it reports a bio.
//!
//! Raw tracepoints, not tracefs ones: a tracefs program is skipped whenever
//! another BPF program runs on the CPU, and a skipped completion would
//! leave an entry behind. A raw tracepoint program is only kept from
//! nesting inside itself; an entry left behind that way is found by
//! userspace, which asks `bio_still_waiting` before it reports a stall.
//! Each program comes twice: as a BTF raw tracepoint (`tp_btf`), whose
//! arguments the verifier knows as `struct bio *` and `struct request *`,
//! so the fields are plain loads ([`Direct`]); and as a plain raw
//! tracepoint, for verifiers that refuse the first, reading each field
//! with a helper call ([`Probed`]). Userspace attaches one set.

use super::*;

use health_common::{
    bio, latency_bucket, waiting_slots, LatencyCount, LatencyKey, Waiting, LATENCY_MAX,
    WAITING_MAX, WAITING_WAYS,
};

/// Offsets into `struct bio` and the tracepoints' argument positions, from
/// the kernel's BTF, indexed by [`bio`] slots.
#[no_mangle]
static BIO_LAYOUT: [u32; bio::COUNT] = [rq::ABSENT; bio::COUNT];

/// The bios submitted and not yet completed: a bio's slot is one of the
/// [`WAITING_WAYS`] at [`waiting_slots`] of its key ([`Reads::key`]);
/// `bio` 0 is free.
/// Userspace maps it to read it whole without a call per slot
/// (`BPF_F_MMAPABLE`, kernels since 5.5).
#[map]
static WAITING: Array<Waiting> = Array::with_max_entries(WAITING_MAX, BPF_F_MMAPABLE);

/// Per device, reads and writes apart: how many completed within each
/// latency bucket (`--latency-window`), from their time in `WAITING`, and
/// the sum of those times.
#[map]
static LATENCY: HashMap<LatencyKey, LatencyCount> = HashMap::with_max_entries(LATENCY_MAX, 0);

/// Where `bio_still_waiting` leaves the cgroup id of the bio it was asked
/// about (0: none known), for userspace to read after the run. One entry:
/// userspace asks one bio at a time, from one thread.
#[map]
static WAITER: Array<u64> = Array::with_max_entries(1, 0);

/// `block_bio_queue(bio)`, kernels since 5.11, as a BTF raw tracepoint.
#[btf_tracepoint(function = "block_bio_queue")]
pub fn block_bio_queue_wait_btf(ctx: BtfTracePointContext) -> u32 {
    note_queued::<Direct>(ctx.arg(0));
    0
}

/// `block_bio_queue(q, bio)`, kernels before 5.11, as a BTF raw tracepoint.
#[btf_tracepoint(function = "block_bio_queue")]
pub fn block_bio_queue_wait_btf_q(ctx: BtfTracePointContext) -> u32 {
    note_queued::<Direct>(ctx.arg(1));
    0
}

/// `block_bio_queue(bio)`, kernels since 5.11. (A raw tracepoint program
/// may not read past the tracepoint's arguments, so each argument list has
/// its own program; userspace attaches the one this kernel's BTF names.)
#[raw_tracepoint(tracepoint = "block_bio_queue")]
pub fn block_bio_queue_wait(ctx: RawTracePointContext) -> i32 {
    note_queued::<Probed>(ctx.arg(0));
    0
}

/// `block_bio_queue(q, bio)`, kernels before 5.11.
#[raw_tracepoint(tracepoint = "block_bio_queue")]
pub fn block_bio_queue_wait_q(ctx: RawTracePointContext) -> i32 {
    note_queued::<Probed>(ctx.arg(1));
    0
}

/// How a program reads the kernel's memory, and what it hashes a bio by.
trait Reads {
    /// The value at `base + BIO_LAYOUT[i]`; `None` where this kernel has
    /// no such field or `base` is null.
    fn read<T>(base: u64, i: usize) -> Option<T>;
    /// The number a bio's [`waiting_slots`] are chosen by (`None`: the bio
    /// is not followed).
    fn key(bio: u64) -> Option<u64>;
}

/// `tp_btf` programs: `base` is a pointer the verifier knows the type of
/// and the offsets are constants to it (`BIO_LAYOUT` is frozen read-only
/// data), so a field is one load the kernel guards against faults: 262
/// instead of 431 ns a run here (docs/benchmarks.md, "Stalls").
struct Direct;

impl Reads for Direct {
    #[inline(always)]
    fn read<T>(base: u64, i: usize) -> Option<T> {
        let off = layout(i);
        if off == rq::ABSENT || base == 0 {
            return None;
        }
        // SAFETY: the verifier checks the load against the kernel's BTF and
        // turns it into one whose fault reads as 0.
        Some(unsafe { core::ptr::read_volatile((base + off as u64) as *const T) })
    }

    /// The verifier allows no arithmetic on a typed pointer but adding and
    /// subtracting, and a pointer minus another is a plain number: the
    /// bio's distance from `WAITING`'s first slot, which is the address
    /// moved by a constant, hashes as well as the address.
    #[inline(always)]
    fn key(bio: u64) -> Option<u64> {
        let base = WAITING.get_ptr_mut(0)? as u64;
        Some(bio.wrapping_sub(base))
    }
}

/// Plain raw tracepoint programs: arguments are numbers, and every field
/// is read with `bpf_probe_read_kernel`.
struct Probed;

impl Reads for Probed {
    #[inline(always)]
    fn read<T>(base: u64, i: usize) -> Option<T> {
        read_at(base, i)
    }

    #[inline(always)]
    fn key(bio: u64) -> Option<u64> {
        Some(bio)
    }
}

/// No slot chosen (beyond the array: a lookup of it finds nothing).
const NO_SLOT: u32 = u32::MAX;

#[inline(always)]
fn note_queued<R: Reads>(bio: u64) {
    if layout(bio::ENABLED) != 1 {
        return;
    }
    let Some(dev) = bio_dev::<R>(bio) else {
        return;
    };
    let Some(key) = R::key(bio) else {
        return;
    };
    let first = waiting_slots(key);
    // The slot's index, not its pointer, and no `Option`: 6.1's verifier
    // loses a map value pointer's type when it is kept on the stack across
    // the loop (`invalid mem access 'scalar'`), and 5.10's refuses to read
    // an `Option`'s payload that only some paths wrote (`invalid read from
    // stack`). The lookup again is inlined.
    let mut chosen = NO_SLOT;
    for way in 0..WAITING_WAYS {
        let Some(slot) = WAITING.get_ptr_mut(first + way) else {
            continue;
        };
        // SAFETY: a live array value; other CPUs write it too (see above).
        let holder = unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*slot).bio)) };
        if holder == bio {
            chosen = first + way;
            break;
        }
        if holder == 0 && chosen == NO_SLOT {
            chosen = first + way;
        }
    }
    let slot = match WAITING.get_ptr_mut(chosen) {
        Some(slot) if chosen != NO_SLOT => slot,
        _ => {
            bump(stat::WAITING_FULL);
            return;
        }
    };
    // SAFETY: as above. The address last, so that a reader that sees it
    // mostly sees the rest already written.
    unsafe {
        (*slot).queued_ns = bpf_ktime_get_ns();
        (*slot).dev = dev;
        (*slot).opf = R::read(bio, bio::OPF).unwrap_or(0);
        core::ptr::write_volatile(core::ptr::addr_of_mut!((*slot).bio), bio);
    }
}

/// `block_bio_complete(q, bio)` (every kernel since 4.x), as a BTF raw
/// tracepoint.
#[btf_tracepoint(function = "block_bio_complete")]
pub fn block_bio_complete_wait_btf(ctx: BtfTracePointContext) -> u32 {
    if layout(bio::ENABLED) == 1 {
        completed::<Direct>(ctx.arg(1));
    }
    0
}

/// The same as a plain raw tracepoint.
#[raw_tracepoint(tracepoint = "block_bio_complete")]
pub fn block_bio_complete_wait(ctx: RawTracePointContext) -> i32 {
    if layout(bio::ENABLED) == 1 {
        completed::<Probed>(ctx.arg(1));
    }
    0
}

/// `block_rq_complete(rq, error, nr_bytes)` on every kernel, as a BTF raw
/// tracepoint: the bios of a request-based device complete with their
/// request, whose bios the kernel no longer traces one by one.
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete_wait_btf(ctx: BtfTracePointContext) -> u32 {
    if layout(bio::ENABLED) == 1 {
        request_completed::<Direct>(ctx.arg(0), ctx.arg(2));
    }
    0
}

/// The same as a plain raw tracepoint.
#[raw_tracepoint(tracepoint = "block_rq_complete")]
pub fn block_rq_complete_wait(ctx: RawTracePointContext) -> i32 {
    if layout(bio::ENABLED) == 1 {
        request_completed::<Probed>(ctx.arg(0), ctx.arg(2));
    }
    0
}

/// Removes each bio of the request `rq` that `nr_bytes` covers (a partial
/// completion leaves the rest for the next call).
#[inline(always)]
fn request_completed<R: Reads>(rq: u64, nr_bytes: u64) {
    let mut left = nr_bytes as u32;
    let mut bio: u64 = R::read(rq, bio::RQ_BIO).unwrap_or(0);
    for _ in 0..bio::RQ_BIOS_MAX {
        if bio == 0 {
            break;
        }
        let size: u32 = R::read(bio, bio::BI_SIZE).unwrap_or(u32::MAX);
        if size > left {
            break;
        }
        left -= size;
        completed::<R>(bio);
        bio = R::read(bio, bio::BI_NEXT).unwrap_or(0);
    }
}

/// A bio's slot in `WAITING` is freed; with latency on, a read's or
/// write's time there is counted in `LATENCY` first.
#[inline(always)]
fn completed<R: Reads>(bio: u64) {
    let Some(key) = R::key(bio) else {
        return;
    };
    let first = waiting_slots(key);
    for way in 0..WAITING_WAYS {
        let Some(slot) = WAITING.get_ptr_mut(first + way) else {
            continue;
        };
        // SAFETY: a live array value. Only this bio's completion frees a
        // slot holding its address; the values are copied out first.
        unsafe {
            if core::ptr::read_volatile(core::ptr::addr_of!((*slot).bio)) != bio {
                continue;
            }
            let (queued_ns, dev, opf) = ((*slot).queued_ns, (*slot).dev, (*slot).opf);
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*slot).bio), 0);
            if layout(bio::LATENCY) == 1 {
                record_latency(dev, opf, queued_ns);
            }
        }
        return;
    }
}

#[inline(always)]
fn record_latency(dev: u32, opf: u32, queued_ns: u64) {
    let op = op_from_opf(opf);
    if op != op::READ && op != op::WRITE {
        return;
    }
    // SAFETY: a helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let ns = now.saturating_sub(queued_ns);
    let key = LatencyKey {
        dev,
        op: op as u16,
        bucket: latency_bucket(ns / 1000) as u16,
    };
    if let Some(c) = LATENCY.get_ptr_mut(&key) {
        // SAFETY: a live map value; every CPU adds to it atomically.
        unsafe { add(c, ns) };
        return;
    }
    let first = LatencyCount {
        count: 1,
        sum_ns: ns,
    };
    if LATENCY.insert(&key, &first, BPF_NOEXIST as u64).is_ok() {
        return;
    }
    // Another CPU made the entry first, or the map is full.
    match LATENCY.get_ptr_mut(&key) {
        // SAFETY: as above.
        Some(c) => unsafe { add(c, ns) },
        None => bump(stat::LATENCY_FULL),
    }
}

/// One completion of `ns` added to a bucket's count and sum. The two adds
/// are apart: a reader between them sees a count one ahead of its sum, as
/// it would see the next completion a moment early.
#[inline(always)]
unsafe fn add(c: *mut LatencyCount, ns: u64) {
    use core::intrinsics::{atomic_xadd, AtomicOrdering::Relaxed};
    // SAFETY: the caller's pointer is a live, aligned map value; both
    // fields are aligned u64s.
    unsafe {
        atomic_xadd::<u64, u64, { Relaxed }>(core::ptr::addr_of_mut!((*c).count), 1);
        atomic_xadd::<u64, u64, { Relaxed }>(core::ptr::addr_of_mut!((*c).sum_ns), ns);
    }
}

/// Never attached: userspace runs it (`BPF_PROG_TEST_RUN`) with a bio's
/// address before it reports that bio as waiting. Returns 1 while the
/// kernel still means to trace the bio's completion (it still waits), 0
/// once it has (an entry whose completion no program saw), 2 when the
/// flags cannot be read; and leaves the bio's cgroup id in `WAITER`.
/// Written without aya's `raw_tracepoint` macro, whose wrapper returns 0
/// whatever the function returns.
#[unsafe(no_mangle)]
#[unsafe(link_section = "raw_tp/block_bio_queue")]
pub fn bio_still_waiting(ctx: *mut core::ffi::c_void) -> u32 {
    let ctx = RawTracePointContext::new(ctx);
    let bio: u64 = ctx.arg(0);
    let Some(flags) = read_at::<u16>(bio, bio::FLAGS) else {
        return 2;
    };
    if let Some(waiter) = WAITER.get_ptr_mut(0) {
        // SAFETY: the map's own value, written by this program only.
        unsafe { *waiter = bio_cgroup(bio).unwrap_or(0) };
    }
    ((flags >> (layout(bio::BIT_TRACE_COMPLETION) & 15)) & 1) as u32
}

/// The id of the cgroup the block layer charges `bio` to:
/// `bio->bi_blkg->blkcg->css.cgroup->kn->id`.
#[inline(always)]
fn bio_cgroup(bio: u64) -> Option<u64> {
    let blkg: u64 = read_at(bio, bio::BLKG)?;
    let blkcg: u64 = read_at(blkg, bio::BLKG_BLKCG)?;
    let cgroup: u64 = read_at(blkcg, bio::BLKCG_CGROUP)?;
    let kn: u64 = read_at(cgroup, bio::CGROUP_KN)?;
    read_at(kn, bio::KN_ID)
}

#[inline(always)]
fn layout(i: usize) -> u32 {
    // SAFETY: as for `offset`.
    unsafe { core::ptr::read_volatile(&BIO_LAYOUT[i]) }
}

/// Reads a kernel value at `base + BIO_LAYOUT[i]`.
#[inline(always)]
fn read_at<T>(base: u64, i: usize) -> Option<T> {
    let off = layout(i);
    if off == rq::ABSENT || base == 0 {
        return None;
    }
    // SAFETY: a read the kernel checks; a bad address is an error, not a fault.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T).ok() }
}

/// The device a bio was submitted to: its `block_device` where bios have
/// one; before 5.12 its disk, narrowed to the partition by the sector.
#[inline(always)]
fn bio_dev<R: Reads>(bio: u64) -> Option<u32> {
    if layout(bio::BDEV) != rq::ABSENT {
        let bdev: u64 = R::read(bio, bio::BDEV)?;
        return R::read(bdev, bio::BD_DEV);
    }
    let disk: u64 = R::read(bio, bio::DISK)?;
    let major: i32 = R::read(disk, bio::DISK_MAJOR)?;
    let minor: i32 = R::read(disk, bio::DISK_FIRST_MINOR)?;
    let dev = kdev::make(major as u32, minor as u32);
    let sector: u64 = R::read(bio, bio::SECTOR).unwrap_or(0);
    // SAFETY: a map lookup; the value is only read here.
    Some(match unsafe { PARTITIONS.get(&dev) } {
        Some(table) => table.resolve(dev, sector),
        None => dev,
    })
}
