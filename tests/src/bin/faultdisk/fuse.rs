//! The FUSE filesystem the kernel talks to: a root directory holding `disk.img`, whose
//! I/O requests are counted and handed to the [`Disk`] (after any delay).

use std::ffi::OsStr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig,
    LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen,
    ReplyStatfs, ReplyWrite, Request as FuseRequest, WriteFlags,
};
use health_tests::protocol::{mono_ns, Op, IMAGE_NAME};

use crate::disk::Disk;
use crate::image::{errno_of, IMAGE_INO};
use crate::{ASYNC_DIO, MAX_WRITE};

/// Attributes never change behind the kernel's back (only through setattr, which answers
/// with the new ones), so they can be cached for long.
const TTL: Duration = Duration::from_secs(3600);

pub(super) struct FuseFs(pub(super) Arc<Disk>);

impl Filesystem for FuseFs {
    fn init(&mut self, _req: &FuseRequest, config: &mut KernelConfig) -> std::io::Result<()> {
        let abi = config.kernel_abi();
        let _ = self.0.kernel_abi.set(format!("{}.{}", abi.0, abi.1));
        // As large as the protocol allows: max_pages sent to the kernel follows
        // max(max_write, max_readahead); the kernel then clamps it to max_pages_limit.
        if let Err(nearest) = config.set_max_write(MAX_WRITE) {
            let _ = config.set_max_write(nearest);
        }
        let _ = config.set_max_background(64);
        if ASYNC_DIO.load(Ordering::Relaxed) {
            if let Err(missing) = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO) {
                eprintln!("faultdisk: kernel lacks {missing:?}; direct I/O stays synchronous");
            }
        }
        Ok(())
    }

    fn lookup(&self, _req: &FuseRequest, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT || name != OsStr::new(IMAGE_NAME) {
            reply.error(Errno::ENOENT);
            return;
        }
        match self.0.attr(IMAGE_INO) {
            Some(a) => reply.entry(&TTL, &a, Generation(0)),
            None => reply.error(Errno::EIO),
        }
    }

    fn getattr(&self, _req: &FuseRequest, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.0.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        _req: &FuseRequest,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if let Some(size) = size {
            if ino != IMAGE_INO {
                reply.error(Errno::EISDIR);
                return;
            }
            if let Err(e) = self.0.backing.set_len(size) {
                reply.error(Errno::from_i32(errno_of(&e)));
                return;
            }
        }
        // Mode/owner/time changes are accepted and ignored: nothing here depends on them.
        match self.0.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &FuseRequest, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != IMAGE_INO {
            reply.error(Errno::EISDIR);
            return;
        }
        // DIRECT_IO: no FUSE page cache, so every loop request reaches us as it is.
        // PARALLEL_DIRECT_WRITES: the kernel does not serialize writes on the inode lock,
        // so concurrent loop writes (and delays) overlap as they would on a disk.
        reply.opened(
            FileHandle(0),
            FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES,
        );
    }

    fn read(
        &self,
        _req: &FuseRequest,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != IMAGE_INO {
            reply.error(Errno::EISDIR);
            return;
        }
        let received = mono_ns();
        self.0.count(Op::Read, u64::from(size));
        let disk = self.0.clone();
        self.0.after_delay(Box::new(move || {
            disk.serve_read(offset, size, received, reply)
        }));
    }

    fn write(
        &self,
        _req: &FuseRequest,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != IMAGE_INO {
            reply.error(Errno::EISDIR);
            return;
        }
        let received = mono_ns();
        self.0.count(Op::Write, data.len() as u64);
        if self.0.delay_us.load(Ordering::Relaxed) == 0 {
            self.0.serve_write(offset, data, received, reply);
        } else {
            // The data lives in the reader thread's buffer, reused for the next request.
            let data = data.to_vec();
            let disk = self.0.clone();
            self.0.after_delay(Box::new(move || {
                disk.serve_write(offset, &data, received, reply)
            }));
        }
    }

    fn flush(
        &self,
        _req: &FuseRequest,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // FUSE_FLUSH is sent on close(2) of the FUSE file (e.g. losetup closing its fd),
        // not for block-layer flushes; those arrive as FSYNC.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &FuseRequest,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let received = mono_ns();
        self.0.count(Op::Flush, 0);
        let disk = self.0.clone();
        self.0
            .after_delay(Box::new(move || disk.serve_fsync(received, reply)));
    }

    fn fallocate(
        &self,
        _req: &FuseRequest,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != IMAGE_INO {
            reply.error(Errno::EISDIR);
            return;
        }
        let received = mono_ns();
        self.0.count(Op::Discard, length);
        let disk = self.0.clone();
        self.0.after_delay(Box::new(move || {
            disk.serve_fallocate(offset, length, mode, received, reply)
        }));
    }

    fn opendir(&self, _req: &FuseRequest, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == INodeNo::ROOT {
            reply.opened(FileHandle(0), FopenFlags::empty());
        } else {
            reply.error(Errno::ENOTDIR);
        }
    }

    fn readdir(
        &self,
        _req: &FuseRequest,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            reply.error(Errno::ENOTDIR);
            return;
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (IMAGE_INO, FileType::RegularFile, IMAGE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            // The offset given is the one to resume *after*, hence i + 1.
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &FuseRequest,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn statfs(&self, _req: &FuseRequest, _ino: INodeNo, reply: ReplyStatfs) {
        let size = self.0.info.get().map(|i| i.size).unwrap_or(0);
        let blocks = size / 4096;
        reply.statfs(blocks, 0, 0, 2, 0, 4096, 255, 4096);
    }
}
