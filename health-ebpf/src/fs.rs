//! The filesystem programs: ext4 errors and shutdowns, xfs shutdowns and
//! corruption markers, and writeback errors (tracepoint and fentry).

use super::*;

const NO_SECTOR: u64 = u64::MAX;

fn fs_details(dev: u32, flags: u32, ino: u64) -> Details {
    Details {
        raw_dev: dev,
        sector: NO_SECTOR,
        nr_sectors: 0,
        ino,
        flags,
    }
}

#[tracepoint]
pub fn ext4_error(ctx: TracePointContext) -> u32 {
    let _ = try_ext4_error(&ctx);
    0
}

fn try_ext4_error(ctx: &TracePointContext) -> Option<()> {
    let dev: u32 = read(ctx, field::EXT4_ERROR_DEV)?;
    let function: u64 = read(ctx, field::EXT4_ERROR_FUNCTION)?;
    let line: u32 = read(ctx, field::EXT4_ERROR_LINE)?;
    let key = CounterKey::new(dev, source::EXT4_ERROR, op::NONE, 0);
    let mut entry = record(ctx, key, fs_details(dev, line, 0))?;
    // The field is a pointer to the function name in kernel rodata.
    let _ =
        unsafe { bpf_probe_read_kernel_str_bytes(function as *const u8, detail_mut(&mut entry)) };
    entry.submit(0);
    Some(())
}

#[tracepoint]
pub fn ext4_shutdown(ctx: TracePointContext) -> u32 {
    let _ = try_ext4_shutdown(&ctx);
    0
}

fn try_ext4_shutdown(ctx: &TracePointContext) -> Option<()> {
    let dev: u32 = read(ctx, field::EXT4_SHUTDOWN_DEV)?;
    let flags: u32 = read(ctx, field::EXT4_SHUTDOWN_FLAGS)?;
    let key = CounterKey::new(dev, source::EXT4_SHUTDOWN, op::NONE, 0);
    record(ctx, key, fs_details(dev, flags, 0))?.submit(0);
    Some(())
}

#[tracepoint]
pub fn xfs_force_shutdown(ctx: TracePointContext) -> u32 {
    let _ = try_xfs_force_shutdown(&ctx);
    0
}

fn try_xfs_force_shutdown(ctx: &TracePointContext) -> Option<()> {
    let dev: u32 = read(ctx, field::XFS_SHUTDOWN_DEV)?;
    let flags: u32 = read(ctx, field::XFS_SHUTDOWN_FLAGS)?;
    // __data_loc: low 16 bits are the string's offset inside the record.
    let fname_loc: u32 = read(ctx, field::XFS_SHUTDOWN_FNAME)?;
    let line: u32 = read(ctx, field::XFS_SHUTDOWN_LINE)?;
    let key = CounterKey::new(dev, source::XFS_SHUTDOWN, op::NONE, 0);
    let mut entry = record(
        ctx,
        key,
        Details {
            ino: line as u64,
            ..fs_details(dev, flags, 0)
        },
    )?;
    let fname = unsafe { (ctx.as_ptr() as *const u8).add((fname_loc & 0xffff) as usize) };
    let _ = unsafe { bpf_probe_read_kernel_str_bytes(fname, detail_mut(&mut entry)) };
    entry.submit(0);
    Some(())
}

/// The three xfs corruption markers differ only in where their fields sit.
#[inline(always)]
fn xfs_corruption(
    ctx: &TracePointContext,
    dev_slot: usize,
    flags_slot: usize,
    ino_slot: Option<usize>,
    what: &[u8],
) -> Option<()> {
    let dev: u32 = read(ctx, dev_slot)?;
    let flags: u32 = read(ctx, flags_slot)?;
    let ino: u64 = match ino_slot {
        Some(slot) => read(ctx, slot)?,
        None => 0,
    };
    let key = CounterKey::new(dev, source::XFS_CORRUPTION, op::NONE, 0);
    let mut entry = record(ctx, key, fs_details(dev, flags, ino))?;
    let detail = detail_mut(&mut entry);
    let n = if what.len() < DETAIL_LEN {
        what.len()
    } else {
        DETAIL_LEN
    };
    detail[..n].copy_from_slice(&what[..n]);
    entry.submit(0);
    Some(())
}

#[tracepoint]
pub fn xfs_fs_mark_corrupt(ctx: TracePointContext) -> u32 {
    let _ = xfs_corruption(
        &ctx,
        field::XFS_FS_CORRUPT_DEV,
        field::XFS_FS_CORRUPT_FLAGS,
        None,
        b"filesystem",
    );
    0
}

#[tracepoint]
pub fn xfs_group_mark_corrupt(ctx: TracePointContext) -> u32 {
    let _ = xfs_corruption(
        &ctx,
        field::XFS_GROUP_CORRUPT_DEV,
        field::XFS_GROUP_CORRUPT_FLAGS,
        None,
        b"allocation group",
    );
    0
}

#[tracepoint]
pub fn xfs_inode_mark_corrupt(ctx: TracePointContext) -> u32 {
    let _ = xfs_corruption(
        &ctx,
        field::XFS_INODE_CORRUPT_DEV,
        field::XFS_INODE_CORRUPT_FLAGS,
        Some(field::XFS_INODE_CORRUPT_INO),
        b"inode",
    );
    0
}

#[fentry(function = "__filemap_set_wb_err")]
pub fn filemap_set_wb_err_entry(ctx: FEntryContext) -> u32 {
    let err: i32 = ctx.arg(1);
    if let Some(p) = WB_PENDING.get_ptr_mut(0) {
        let pending = WbPending {
            pid_tgid: bpf_get_current_pid_tgid(),
            errno: err.unsigned_abs(),
            _pad: 0,
        };
        // SAFETY: this CPU's slot.
        unsafe { *p = pending };
    }
    0
}

/// The errno `__filemap_set_wb_err` was called with, if its fentry program
/// ran just before on this CPU in this task; taken once.
#[inline(always)]
fn take_pending_errno() -> u32 {
    let Some(p) = WB_PENDING.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: this CPU's slot.
    let pending = unsafe { &mut *p };
    let errno = if pending.pid_tgid == bpf_get_current_pid_tgid() {
        pending.errno
    } else {
        0
    };
    pending.errno = 0;
    errno
}

#[tracepoint]
pub fn filemap_set_wb_err(ctx: TracePointContext) -> u32 {
    let _ = try_filemap_set_wb_err(&ctx);
    0
}

fn try_filemap_set_wb_err(ctx: &TracePointContext) -> Option<()> {
    let ino: u64 = read(ctx, field::WB_ERR_INO)?;
    let s_dev: u32 = read(ctx, field::WB_ERR_DEV)?;
    // The value before this error was recorded (see WB_PENDING).
    let old_errseq: u32 = read(ctx, field::WB_ERR_ERRSEQ)?;
    let pending_errno = take_pending_errno();
    // A block device's own buffers live in the bdev pseudo filesystem: an
    // anonymous s_dev, with the device number as the inode number.
    let dev = if kdev::major(s_dev) == 0
        && ino <= u32::MAX as u64
        && unsafe { BLOCK_DEVS.get(ino as u32) }.is_some()
    {
        ino as u32
    } else {
        s_dev
    };
    // The kernel calls this once per failed page; what an application can
    // learn (by fsync) is one error per errseq episode. A new episode starts
    // on a file with no error yet (old value 0) or once the previous error
    // was reported (SEEN); repeats inside an episode are merged.
    let inode = InodeKey {
        ino,
        dev: s_dev,
        _pad: 0,
    };
    let known = unsafe { WB_LAST.get(&inode) }.is_some();
    let _ = WB_LAST.insert(&inode, &old_errseq, 0);
    if known && old_errseq != 0 && old_errseq & ERRSEQ_SEEN == 0 {
        bump(stat::WRITEBACK_REPEATS);
        return Some(());
    }
    let (errno, how): (u32, &[u8]) = if pending_errno != 0 {
        (pending_errno, b"fentry")
    } else if old_errseq & ERRSEQ_ERRNO_MASK != 0 {
        (old_errseq & ERRSEQ_ERRNO_MASK, b"errseq")
    } else {
        match unsafe { LAST_WRITE_ERROR.get(dev) } {
            Some(last)
                if unsafe { bpf_ktime_get_ns() }.wrapping_sub(last.mono_ns)
                    < WRITE_ERRNO_WINDOW_NS =>
            {
                (last.errno, b"last-write")
            }
            _ => (0, b""),
        }
    };
    let key = CounterKey::new(dev, source::WRITEBACK_ERROR, op::WRITE, errno);
    let details = Details {
        raw_dev: s_dev,
        sector: NO_SECTOR,
        nr_sectors: 0,
        ino,
        flags: old_errseq,
    };
    let mut entry = record(ctx, key, details)?;
    detail_mut(&mut entry)[..how.len()].copy_from_slice(how);
    entry.submit(0);
    Some(())
}
