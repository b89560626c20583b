//! What applications were told: a read, write or fsync that returned an
//! error, at the return of the VFS function each of those system calls
//! goes through (fexit). The block layer does not see every error an
//! application gets: a network or FUSE filesystem has no block device, and
//! even on one a stacking layer may fail a read with no request failing.
//!
//! Only error returns cost more than the check of the return value: every
//! successful call on the node runs these programs (the trampoline and two
//! instructions; docs/benchmarks.md, "Returned errors" has what it costs).
//! Not seen here: io_uring and aio, which call the filesystem directly, and
//! faults on mapped files (SIGBUS).

use super::*;

use aya_ebpf::{helpers::bpf_get_current_cgroup_id, macros::fexit, programs::FExitContext};
use health_common::{file, returned_errno_counted};

/// Offsets into `struct file`, `inode` and `super_block` from the kernel's
/// BTF, indexed by [`file`] slots.
#[no_mangle]
static FILE_LAYOUT: [u32; file::COUNT] = [rq::ABSENT; file::COUNT];

/// `ssize_t vfs_read(struct file *, char __user *, size_t, loff_t *)`
#[fexit(function = "vfs_read")]
pub fn vfs_read_exit(ctx: FExitContext) -> u32 {
    let ret: i64 = ctx.arg(4);
    if ret < 0 {
        let _ = returned(&ctx, ctx.arg(0), ret, op::READ, b"vfs_read");
    }
    0
}

/// `ssize_t vfs_write(struct file *, const char __user *, size_t, loff_t *)`
#[fexit(function = "vfs_write")]
pub fn vfs_write_exit(ctx: FExitContext) -> u32 {
    let ret: i64 = ctx.arg(4);
    if ret < 0 {
        let _ = returned(&ctx, ctx.arg(0), ret, op::WRITE, b"vfs_write");
    }
    0
}

/// `ssize_t vfs_readv(struct file *, const struct iovec __user *,
/// unsigned long, loff_t *, rwf_t)`: readv, preadv, preadv2.
#[fexit(function = "vfs_readv")]
pub fn vfs_readv_exit(ctx: FExitContext) -> u32 {
    let ret: i64 = ctx.arg(5);
    if ret < 0 {
        let _ = returned(&ctx, ctx.arg(0), ret, op::READ, b"vfs_readv");
    }
    0
}

/// `ssize_t vfs_writev(...)`, as `vfs_readv`.
#[fexit(function = "vfs_writev")]
pub fn vfs_writev_exit(ctx: FExitContext) -> u32 {
    let ret: i64 = ctx.arg(5);
    if ret < 0 {
        let _ = returned(&ctx, ctx.arg(0), ret, op::WRITE, b"vfs_writev");
    }
    0
}

/// `int vfs_fsync(struct file *, int)`: fsync and fdatasync. Not
/// `vfs_fsync_range`, which a write to an `O_SYNC` file or a `sync` mount
/// calls inside `write()`: its error is the write's, counted there once.
/// An `int`: only the low half of the return register is the value.
#[fexit(function = "vfs_fsync")]
pub fn vfs_fsync_exit(ctx: FExitContext) -> u32 {
    let ret: i32 = ctx.arg(2);
    if ret < 0 {
        let _ = returned(&ctx, ctx.arg(0), ret as i64, op::FSYNC, b"vfs_fsync");
    }
    0
}

/// Counts one error return on `f`'s device and samples it with the
/// application's cgroup; errnos the storage has no part in are left out.
#[inline(always)]
fn returned<C: EbpfContext>(ctx: &C, f: u64, ret: i64, op: u8, function: &[u8]) -> Option<()> {
    let errno = ret.unsigned_abs();
    if errno > 4095 || !returned_errno_counted(errno as u32) {
        return None;
    }
    let errno = errno as u32;
    let inode: u64 = file_field(f, file::F_INODE)?;
    let mode: u16 = file_field(inode, file::I_MODE)?;
    let ino: u64 = file_field(inode, file::I_INO)?;
    let dev: u32 = if mode & file::S_IFMT == file::S_IFBLK {
        file_field(inode, file::I_RDEV)?
    } else {
        let sb: u64 = file_field(inode, file::I_SB)?;
        file_field(sb, file::S_DEV)?
    };
    let key = CounterKey::new(dev, source::RETURNED_ERROR, op, errno);
    let details = Details {
        raw_dev: dev,
        sector: u64::MAX,
        nr_sectors: 0,
        ino,
        flags: 0,
    };
    let mut entry = record(ctx, key, details)?;
    // SAFETY: `record` initialised the whole sample.
    unsafe { (*entry.as_mut_ptr()).cgroup = bpf_get_current_cgroup_id() };
    let len = function.len().min(DETAIL_LEN);
    detail_mut(&mut entry)[..len].copy_from_slice(&function[..len]);
    entry.submit(0);
    Some(())
}

/// The value at `base + FILE_LAYOUT[i]`, read with the helper (only error
/// returns get here, so a checked read costs nothing that matters).
#[inline(always)]
fn file_field<T>(base: u64, i: usize) -> Option<T> {
    // SAFETY: as for `offset` in main.rs.
    let off = unsafe { core::ptr::read_volatile(&FILE_LAYOUT[i]) };
    if off == rq::ABSENT || base == 0 {
        return None;
    }
    // SAFETY: a read the kernel checks; a bad address is an error, not a fault.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T).ok() }
}
