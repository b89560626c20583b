//! The block request programs as BTF raw tracepoints (`tp_btf`): the
//! kernel passes `struct request *` and the raw status, and the offsets to
//! read the request with come from the kernel's BTF (`RQ_LAYOUT`).

use super::*;

/// `block_rq_error` as a BTF raw tracepoint: the kernel calls it directly
/// with the tracepoint's arguments, without building the tracefs record and
/// without the perf path's check that no other BPF program is running on
/// the CPU, which skips tracefs programs (uncounted) whenever an interrupt
/// completes a request while the agent itself is inside a map syscall.
#[btf_tracepoint(function = "block_rq_error")]
pub fn block_rq_error_btf(ctx: BtfTracePointContext) -> u32 {
    let _ = request_error(&ctx, source::BLOCK_RQ_ERROR, false);
    0
}

/// `block_rq_complete` as a BTF raw tracepoint; on the healthy path it only
/// reads its error argument.
#[btf_tracepoint(function = "block_rq_complete")]
pub fn block_rq_complete_btf(ctx: BtfTracePointContext) -> u32 {
    let mode = global(&COMPLETE_MODE);
    let flushes = mode == complete_mode::FLUSH_ONLY;
    let (src, flush_only) = if global(&EARLY_ERRORS) != 0 {
        match early_source(&ctx, flushes) {
            Some(counted_as) => counted_as,
            None => return 0,
        }
    } else if mode == complete_mode::OFF {
        return 0;
    } else {
        (source::BLOCK_RQ_COMPLETE, flushes)
    };
    let _ = request_error(&ctx, src, flush_only);
    0
}

/// Where failed requests are counted by the tracefs `block_rq_complete`
/// program (kernels before 5.16: no `block_rq_error`, and a verifier that
/// refuses the `tp_btf` programs above), this records each failing disk's
/// name with its number in `DISK_NAMES`, as `request_dev` does for them.
/// Nothing else: a small program old verifiers take. Arguments are
/// `(struct request *rq, int error, unsigned int nr_bytes)` there.
#[raw_tracepoint(tracepoint = "block_rq_complete")]
pub fn block_rq_complete_names(ctx: RawTracePointContext) -> i32 {
    let error: u64 = ctx.arg(1);
    if error as u32 != 0 {
        let _ = request_dev(ctx.arg(0));
    }
    0
}

/// `--early-block-errors`: a failed request that `blk_update_request` will
/// print and trace with `block_rq_error` is counted here, as that
/// tracepoint's, before the print (on a serial console milliseconds); a
/// failed flush (which has no bio, so never reaches `block_rq_error`) as
/// `block_rq_complete`'s when flush errors are on. Returns the source and
/// flush filter to count with, `None` for a request not counted here.
/// The kernel's conditions: the request has a bio, is not passthrough, is
/// not `RQF_QUIET`, and its disk is not `GD_DEAD`.
#[inline(always)]
fn early_source(ctx: &BtfTracePointContext, flushes: bool) -> Option<(u8, bool)> {
    let raw: u64 = ctx.arg(1);
    if status_errno(raw as u8) == 0 {
        return None;
    }
    let req: u64 = ctx.arg(0);
    let opf: u32 = kread(req, rq::CMD_FLAGS)?;
    if traced_as_error(req, opf) {
        Some((source::BLOCK_RQ_ERROR, false))
    } else if flushes {
        Some((source::BLOCK_RQ_COMPLETE, true))
    } else {
        None
    }
}

/// Whether `blk_update_request` goes on to print and trace this failed
/// request. A field that cannot be read counts as "yes": an error counted
/// is better than one lost.
#[inline(always)]
fn traced_as_error(req: u64, opf: u32) -> bool {
    if opf & rq::OP_MASK >= rq::OP_PASSTHROUGH {
        return false;
    }
    if kread::<u64>(req, rq::RQ_BIO) == Some(0) {
        return false;
    }
    let flags: u32 = kread(req, rq::RQ_FLAGS).unwrap_or(0);
    if (flags >> (rq_slot(rq::BIT_RQF_QUIET) & 31)) & 1 != 0 {
        return false;
    }
    let state: u64 = kread(request_disk(req), rq::DISK_STATE).unwrap_or(0);
    (state >> rq::GD_DEAD_BIT) & 1 == 0
}

#[inline(always)]
fn rq_slot(slot: usize) -> u32 {
    // SAFETY: as for `offset`.
    unsafe { core::ptr::read_volatile(&RQ_LAYOUT[slot]) }
}

/// Reads a kernel value at `base + RQ_LAYOUT[slot]`.
#[inline(always)]
fn kread<T>(base: u64, slot: usize) -> Option<T> {
    let off = rq_slot(slot);
    if off == rq::ABSENT || base == 0 {
        return None;
    }
    // SAFETY: a read the kernel checks; a bad address is an error, not a fault.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T).ok() }
}

/// The errno the kernel would give for a `blk_status_t`.
#[inline(always)]
fn status_errno(status: u8) -> u32 {
    if status == 0 {
        return 0;
    }
    let i = status as usize;
    if i >= rq::STATUS_COUNT {
        return EIO;
    }
    // SAFETY: as for `offset`; the index is bounded above.
    match unsafe { core::ptr::read_volatile(&STATUS_ERRNO[i]) } {
        0 => EIO,
        errno => errno as u32,
    }
}

const EIO: u32 = 5;

/// The `struct gendisk *` of a request (0 if it cannot be read).
#[inline(always)]
fn request_disk(req: u64) -> u64 {
    if rq_slot(rq::RQ_DISK) != rq::ABSENT {
        kread(req, rq::RQ_DISK).unwrap_or(0)
    } else {
        kread::<u64>(req, rq::Q)
            .and_then(|q| kread(q, rq::Q_DISK))
            .unwrap_or(0)
    }
}

/// The device a request was for, as the tracepoints name it: its disk.
/// The disk's name goes to `DISK_NAMES` the first time it is seen.
#[inline(always)]
fn request_dev(req: u64) -> u32 {
    let disk = request_disk(req);
    let major: i32 = kread(disk, rq::DISK_MAJOR).unwrap_or(0);
    let minor: i32 = kread(disk, rq::DISK_FIRST_MINOR).unwrap_or(0);
    let dev = kdev::make(major as u32, minor as u32);
    // SAFETY: a map lookup; the value is not kept.
    if unsafe { DISK_NAMES.get(&dev) }.is_none() {
        if let Some(name) = kread::<[u8; DISK_NAME_LEN]>(disk, rq::DISK_NAME) {
            let _ = DISK_NAMES.insert(&dev, &name, 0);
        }
    }
    dev
}

/// `letter` if the request flag in `slot` is set, else 0, without a branch.
#[inline(always)]
fn flag_letter(opf: u32, slot: usize, letter: u8) -> u64 {
    // Userspace only writes bit numbers below 32 into these slots.
    ((opf >> (rq_slot(slot) & 31)) & 1) as u64 * letter as u64
}

/// The tracepoints' `rwbs` text for a request's operation and flags (at
/// most 7 letters of the 8 bytes). Built in a register and without a branch
/// per flag: older verifiers (6.1) give up on the paths a branch per letter
/// makes once the counting code follows.
#[inline(always)]
fn rwbs_from_opf(opf: u32) -> [u8; RWBS_LEN] {
    let op: u64 = match opf & rq::OP_MASK {
        rq::OP_WRITE => b'W' as u64,
        rq::OP_DISCARD => b'D' as u64,
        rq::OP_SECURE_ERASE => u64::from_le_bytes(*b"DE\0\0\0\0\0\0"),
        rq::OP_WRITE_ZEROES => u64::from_le_bytes(*b"WZ\0\0\0\0\0\0"),
        rq::OP_FLUSH => b'F' as u64,
        rq::OP_READ => b'R' as u64,
        _ => b'N' as u64,
    };
    let letters = [
        flag_letter(opf, rq::BIT_PREFLUSH, b'F'),
        op,
        flag_letter(opf, rq::BIT_FUA, b'F'),
        flag_letter(opf, rq::BIT_RAHEAD, b'A'),
        flag_letter(opf, rq::BIT_SYNC, b'S'),
        flag_letter(opf, rq::BIT_META, b'M'),
    ];
    let mut text: u64 = 0;
    let mut shift: u64 = 0;
    for l in letters {
        text |= l << shift;
        // 8 bits per letter present (two for "DE"/"WZ"): the byte length.
        shift += 8 * ((l > 0) as u64 + (l > 0xff) as u64);
    }
    text.to_le_bytes()
}

/// Shared body of the two `tp_btf` programs: arguments are
/// `(struct request *rq, blk_status_t error, unsigned int nr_bytes)`
/// (`int error`, an errno, for `block_rq_complete` before 5.14).
#[inline(always)]
fn request_error(ctx: &BtfTracePointContext, src: u8, flush_only: bool) -> Option<()> {
    let raw: u64 = ctx.arg(1);
    let errno = if src == source::BLOCK_RQ_COMPLETE && rq_slot(rq::COMPLETE_ARG_ERRNO) == 1 {
        (raw as u32 as i32).unsigned_abs()
    } else {
        status_errno(raw as u8)
    };
    if errno == 0 {
        return Some(());
    }
    let req: u64 = ctx.arg(0);
    let nr_bytes: u32 = ctx.arg(2);
    let opf: u32 = kread(req, rq::CMD_FLAGS)?;
    let sector = if opf & rq::OP_MASK >= rq::OP_PASSTHROUGH {
        0
    } else {
        kread(req, rq::SECTOR)?
    };
    let failed = FailedBlock {
        disk: request_dev(req),
        sector,
        nr_sectors: nr_bytes >> 9,
        opcode: op_from_opf(opf),
        errno,
        rwbs: rwbs_from_opf(opf),
        diskseq: kread(request_disk(req), rq::DISK_SEQ).unwrap_or(0),
    };
    failed_request(ctx, src, failed, flush_only)
}
