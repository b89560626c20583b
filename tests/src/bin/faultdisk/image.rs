//! Serving requests from the backing file once [`Disk::decide`] let them through:
//! reads, writes, fsyncs, fallocates, and the attributes of the root and the image.

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::{SystemTime, UNIX_EPOCH};

use fuser::{Errno, FileAttr, FileType, INodeNo, ReplyData, ReplyEmpty, ReplyWrite};
use health_tests::protocol::Op;

use crate::disk::Disk;

pub(super) const IMAGE_INO: INodeNo = INodeNo(2);

thread_local! {
    /// Per-thread read buffer, reused so a 1 MiB read does not allocate each time.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

impl Disk {
    pub(super) fn serve_read(&self, offset: u64, size: u32, received: u64, reply: ReplyData) {
        let len = u64::from(size);
        if let Some(errno) = self.decide(Op::Read, offset, len, 0, received) {
            reply.error(Errno::from_i32(errno));
            return;
        }
        READ_BUF.with(|cell| {
            let mut buf = cell.borrow_mut();
            buf.resize(size as usize, 0);
            match read_full(&self.backing, &mut buf, offset) {
                Ok(n) => {
                    self.finish(Op::Read, offset, len, 0, received);
                    reply.data(&buf[..n]);
                }
                Err(e) => {
                    eprintln!("faultdisk: backing read at {offset}+{size}: {e}");
                    let errno = errno_of(&e);
                    self.finish(Op::Read, offset, len, errno, received);
                    reply.error(Errno::from_i32(errno));
                }
            }
        });
    }

    pub(super) fn serve_write(&self, offset: u64, data: &[u8], received: u64, reply: ReplyWrite) {
        let len = data.len() as u64;
        if let Some(errno) = self.decide(Op::Write, offset, len, 0, received) {
            reply.error(Errno::from_i32(errno));
            return;
        }
        match self.backing.write_all_at(data, offset) {
            Ok(()) => {
                self.finish(Op::Write, offset, len, 0, received);
                // A FUSE write carries at most max_write (16 MiB) bytes, far below u32.
                reply.written(data.len() as u32);
            }
            Err(e) => {
                eprintln!("faultdisk: backing write at {offset}+{len}: {e}");
                let errno = errno_of(&e);
                self.finish(Op::Write, offset, len, errno, received);
                reply.error(Errno::from_i32(errno));
            }
        }
    }

    pub(super) fn serve_fsync(&self, received: u64, reply: ReplyEmpty) {
        if let Some(errno) = self.decide(Op::Flush, 0, 0, 0, received) {
            reply.error(Errno::from_i32(errno));
            return;
        }
        // The backing file is scratch space thrown away with the work dir, so it is not
        // synced: an fdatasync per journal commit would only slow the tests down (and
        // contend with everyone else on the host disk). Written data already sits in the
        // host's page cache, which survives this process.
        self.finish(Op::Flush, 0, 0, 0, received);
        reply.ok();
    }

    pub(super) fn serve_fallocate(
        &self,
        offset: u64,
        length: u64,
        mode: i32,
        received: u64,
        reply: ReplyEmpty,
    ) {
        if let Some(errno) = self.decide(Op::Discard, offset, length, mode, received) {
            reply.error(Errno::from_i32(errno));
            return;
        }
        let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(length)) else {
            self.finish(Op::Discard, offset, length, libc::EINVAL, received);
            reply.error(Errno::EINVAL);
            return;
        };
        // Loop passes the mode through: PUNCH_HOLE|KEEP_SIZE for DISCARD,
        // ZERO_RANGE|KEEP_SIZE or PUNCH_HOLE|KEEP_SIZE for WRITE_ZEROES.
        // SAFETY: plain syscall on a file descriptor we own for the process lifetime.
        let rc = unsafe { libc::fallocate(self.backing.as_raw_fd(), mode, off, len) };
        if rc == 0 {
            self.finish(Op::Discard, offset, length, 0, received);
            reply.ok();
        } else {
            let e = std::io::Error::last_os_error();
            eprintln!("faultdisk: backing fallocate mode {mode:#x} at {offset}+{length}: {e}");
            let errno = errno_of(&e);
            self.finish(Op::Discard, offset, length, errno, received);
            reply.error(Errno::from_i32(errno));
        }
    }

    pub(super) fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let now = SystemTime::now();
        let base = FileAttr {
            ino,
            size: 0,
            blocks: 0,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: UNIX_EPOCH,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        };
        if ino == INodeNo::ROOT {
            return Some(base);
        }
        if ino != IMAGE_INO {
            return None;
        }
        let meta = self.backing.metadata().ok()?;
        use std::os::unix::fs::MetadataExt;
        Some(FileAttr {
            size: meta.len(),
            blocks: meta.blocks(),
            kind: FileType::RegularFile,
            perm: 0o600,
            nlink: 1,
            ..base
        })
    }
}

fn read_full(f: &File, buf: &mut [u8], offset: u64) -> std::io::Result<usize> {
    let mut done = 0;
    while done < buf.len() {
        match f.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break, // end of file: a short read is the right answer
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

pub(super) fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().filter(|&n| n > 0).unwrap_or(libc::EIO)
}
