//! `faultdisk`: a FUSE server exporting one file, `disk.img`, whose reads, writes,
//! fallocates and fsyncs can be made to fail with any errno on command. A loop device over
//! that file turns those failures into real block-layer I/O errors.
//!
//! Usage: `faultdisk --dir DIR --size BYTES [--threads N] [--sync-dio]`
//!
//! In DIR it creates `backing.img` (sparse, BYTES long), mounts the FUSE filesystem on
//! `mnt/` and listens on `ctl.sock` (protocol in `health_tests::protocol`). When mounted it
//! prints one line `ready <ServerInfo JSON>` on stdout and nothing else there afterwards;
//! diagnostics go to stderr.
//!
//! How requests are served:
//! * N (default 4) threads read /dev/fuse (fuser's `n_threads`, one cloned fd each) and
//!   answer at once when no delay is set. Nothing polls: they block in read(2) on
//!   /dev/fuse, the control thread in accept(2), the delay thread on a condvar.
//! * A delay never sleeps in those threads: the request goes to the delay thread, which
//!   serves and answers it when due, so any number of delayed requests can be pending.
//! * FUSE_ASYNC_DIO is negotiated (unless `--sync-dio`), so the kernel keeps several
//!   loop requests in flight at once. Measured with a 50 ms delay, 8 parallel 4 KiB
//!   O_DIRECT reads take ~55 ms with it and ~400 ms without (the loop worker then
//!   waits for each FUSE request before sending the next).
//! * Requests are as large as the kernel allows: max_write is fuser's 16 MiB and the
//!   kernel clamps the connection to /proc/sys/fs/fuse/max_pages_limit pages (256 =
//!   1 MiB by default). Loop devices accept 1280 KiB requests, and one of those became
//!   two FUSE requests (1 MiB + 256 KiB); with synchronous DIO a failure in the second
//!   one came back as a short write that the loop driver completed as *success*. The
//!   client therefore lowers each loop device's max_sectors_kb to 1020 (one page of
//!   slack for unaligned buffers), after which loop and FUSE request counts match.
//! * fsync is acknowledged without syncing the backing file (scratch data).
//!
//! Lifetime: the server exits when the FUSE mount is unmounted (the kernel ends the
//! connection), on `vanish` (at once, without unmounting), or when its stdin reaches EOF,
//! which means the process that started it is gone: it then cleans up as the client
//! would have (unmounts filesystems on loop devices over its image, detaches them,
//! unmounts itself, deletes DIR).

use std::cell::RefCell;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::ffi::OsStr;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use fuser::{
    Config, Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    KernelConfig, LockOwner, MountOption, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request as FuseRequest, SessionACL,
    WriteFlags,
};
use health_tests::protocol::{
    mono_ns, ErrnoCount, Injection, Op, OpCounters, Request, Response, Rule, ServerInfo, Stats,
    TracedRequest, BACKING_NAME, CONTROL_SOCKET, DEFAULT_LOG_CAPACITY, IMAGE_NAME, MOUNT_DIR,
};

const IMAGE_INO: INodeNo = INodeNo(2);
/// Attributes never change behind the kernel's back (only through setattr, which answers
/// with the new ones), so they can be cached for long.
const TTL: Duration = Duration::from_secs(3600);
/// fuser's ceiling for max_write (its read buffer is sized for it).
const MAX_WRITE: u32 = 16 * 1024 * 1024;
const DEFAULT_THREADS: usize = 4;
/// FUSE_ASYNC_DIO: lets the kernel keep several direct-I/O requests in flight for the
/// loop driver's async kiocbs (without it every loop request waits for the previous
/// one, which serializes delays); `--sync-dio` turns it off.
static ASYNC_DIO: AtomicBool = AtomicBool::new(true);

fn main() {
    if let Err(e) = real_main() {
        eprintln!("faultdisk: error: {e:#}");
        std::process::exit(1);
    }
}

struct Args {
    dir: PathBuf,
    size: u64,
    threads: usize,
}

fn parse_args() -> Result<Args> {
    let mut dir = None;
    let mut size = None;
    let mut threads = DEFAULT_THREADS;
    let mut it = std::env::args_os().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .with_context(|| format!("{name} needs a value"))
                .map(|v| v.to_string_lossy().into_owned())
        };
        match a.to_str() {
            Some("--dir") => dir = Some(PathBuf::from(value("--dir")?)),
            Some("--size") => {
                let v = value("--size")?;
                size = Some(v.parse::<u64>().with_context(|| format!("bad --size {v}"))?);
            }
            Some("--sync-dio") => ASYNC_DIO.store(false, Ordering::Relaxed),
            Some("--threads") => {
                let v = value("--threads")?;
                threads = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .with_context(|| format!("bad --threads {v} (1..=64)"))?;
            }
            _ => bail!(
                "unknown argument {a:?}; usage: faultdisk --dir DIR --size BYTES [--threads N] [--sync-dio]"
            ),
        }
    }
    let dir = dir.context("--dir is required")?;
    let size = size.context("--size is required")?;
    if size == 0 || !size.is_multiple_of(512) {
        bail!("--size {size} must be a positive multiple of 512");
    }
    Ok(Args { dir, size, threads })
}

fn real_main() -> Result<()> {
    let args = parse_args()?;
    let dir = args
        .dir
        .canonicalize()
        .with_context(|| format!("work dir {}", args.dir.display()))?;
    let mount_dir = dir.join(MOUNT_DIR);
    let backing_path = dir.join(BACKING_NAME);
    let socket_path = dir.join(CONTROL_SOCKET);
    let image_path = mount_dir.join(IMAGE_NAME);

    std::fs::create_dir_all(&mount_dir)
        .with_context(|| format!("creating mount dir {}", mount_dir.display()))?;
    let backing = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&backing_path)
        .with_context(|| format!("creating backing file {}", backing_path.display()))?;
    backing
        .set_len(args.size)
        .with_context(|| format!("sizing backing file to {}", args.size))?;

    let disk = Arc::new(Disk::new(backing));
    disk.delayer.spawn().context("starting the delay thread")?;

    // The control socket exists before the mount, so a client that sees the ready line
    // can talk to us at once.
    let _ = std::fs::remove_file(&socket_path);
    let listener = UnixListener::bind(&socket_path)
        .with_context(|| format!("binding control socket {}", socket_path.display()))?;

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("faultdisk".into()),
        MountOption::NoAtime,
        MountOption::NoExec,
    ];
    // Loop workers are kernel threads; allow_other keeps fuser's per-uid filter out of
    // the way whatever credentials the kernel stamps on their requests.
    config.acl = SessionACL::All;
    config.n_threads = Some(args.threads);
    config.clone_fd = true;

    let session = fuser::Session::new(FuseFs(disk.clone()), &mount_dir, &config)
        .with_context(|| format!("mounting FUSE on {}", mount_dir.display()))?;

    let max_pages_limit = read_max_pages_limit();
    let page = page_size();
    let info = ServerInfo {
        pid: std::process::id(),
        size: args.size,
        mount_dir: mount_dir.display().to_string(),
        image_path: image_path.display().to_string(),
        control_socket: socket_path.display().to_string(),
        kernel_abi: disk.kernel_abi.get().cloned().unwrap_or_default(),
        max_write_requested: MAX_WRITE,
        max_pages_limit,
        max_request_bytes: u64::from(MAX_WRITE).min(u64::from(max_pages_limit) * page),
        threads: args.threads as u32,
    };
    let _ = disk.info.set(info.clone());

    {
        let disk = disk.clone();
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || control_loop(listener, disk))
            .context("starting control thread")?;
    }
    {
        let dir = dir.clone();
        let image = image_path.clone();
        let mnt = mount_dir.clone();
        std::thread::Builder::new()
            .name("orphan-watch".into())
            .spawn(move || orphan_watch(dir, image, mnt))
            .context("starting stdin watcher")?;
    }

    let line = format!(
        "ready {}\n",
        serde_json::to_string(&info).context("encoding ServerInfo")?
    );
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes())
        .and_then(|_| out.flush())
        .context("writing ready line")?;
    drop(out);
    eprintln!("faultdisk: ready: {}", line.trim_end());

    // Returns when the kernel ends the connection (unmount or abort).
    let res = session.run();
    eprintln!("faultdisk: session ended: {res:?}");
    if ORPHAN_CLEANUP.load(Ordering::SeqCst) {
        // The orphan cleanup unmounted us and still has files to delete; it exits the
        // process when done.
        loop {
            std::thread::park();
        }
    }
    // Exit without running destructors: fuser's would try to unmount again, which is
    // pointless once the connection is gone.
    std::process::exit(if res.is_ok() { 0 } else { 1 });
}

fn page_size() -> u64 {
    // sysconf(_SC_PAGESIZE) cannot fail on Linux; 4096 is the only size on x86-64.
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map(|v| v as u64)
        .unwrap_or(4096)
}

/// The kernel clamps a FUSE connection's max_pages to this sysctl (default 256, i.e.
/// 1 MiB per request); kernels before 6.13 have a fixed 256.
fn read_max_pages_limit() -> u32 {
    std::fs::read_to_string("/proc/sys/fs/fuse/max_pages_limit")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(256)
}

// ---------------------------------------------------------------------------------------
// State

struct ActiveRule {
    id: u64,
    rule: Rule,
    used: u64,
}

#[derive(Default)]
struct State {
    rules: Vec<ActiveRule>,
    next_rule_id: u64,
    counts: BTreeMap<(Op, i32), u64>,
    total: u64,
    requests: OpCounters,
    bytes: OpCounters,
    max_len: OpCounters,
    log: VecDeque<Injection>,
    log_dropped: u64,
    next_seq: u64,
    trace: VecDeque<TracedRequest>,
    trace_seq: u64,
}

struct Disk {
    backing: File,
    state: Mutex<State>,
    delay_us: AtomicU64,
    trace_on: AtomicBool,
    kernel_abi: OnceLock<String>,
    info: OnceLock<ServerInfo>,
    delayer: Delayer,
    uid: u32,
    gid: u32,
}

impl Disk {
    fn new(backing: File) -> Disk {
        Disk {
            backing,
            state: Mutex::new(State {
                next_rule_id: 1,
                ..State::default()
            }),
            delay_us: AtomicU64::new(0),
            trace_on: AtomicBool::new(false),
            kernel_abi: OnceLock::new(),
            info: OnceLock::new(),
            delayer: Delayer::default(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would only leave counters half-updated; keep
        // serving (and counting) rather than failing every later request.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a request as received.
    fn count(&self, op: Op, len: u64) {
        let mut st = self.lock();
        if let Some(c) = st.requests.get_mut(op) {
            *c += 1;
        }
        if let Some(c) = st.bytes.get_mut(op) {
            *c += len;
        }
        if let Some(c) = st.max_len.get_mut(op) {
            *c = (*c).max(len);
        }
    }

    /// Decides whether the request fails, after any delay. A failure is fully recorded
    /// (counters, log, trace) before this returns, so a client asking for stats once its
    /// syscall returned always sees it.
    fn decide(&self, op: Op, offset: u64, len: u64, mode: i32, received_ns: u64) -> Option<i32> {
        let mut st = self.lock();
        let hit = st.rules.iter_mut().find(|r| {
            r.rule.op.matches(op)
                && r.rule.limit.is_none_or(|l| r.used < l)
                && match r.rule.range {
                    None => true,
                    // Flushes have no range: only range-less rules apply to them.
                    Some(range) => op != Op::Flush && range.overlaps(offset, len),
                }
        })?;
        hit.used += 1;
        let errno = hit.rule.errno;
        let rule_id = hit.id;
        *st.counts.entry((op, errno)).or_insert(0) += 1;
        st.total += 1;
        let seq = st.next_seq;
        st.next_seq += 1;
        if st.log.len() >= DEFAULT_LOG_CAPACITY {
            st.log.pop_front();
            st.log_dropped += 1;
        }
        let now = mono_ns();
        st.log.push_back(Injection {
            seq,
            op,
            offset,
            len,
            errno,
            rule_id,
            mode,
            mono_ns: now,
        });
        if self.trace_on.load(Ordering::Relaxed) {
            push_trace(&mut st, op, offset, len, errno, received_ns, now);
        }
        Some(errno)
    }

    /// Runs `job` now, or after the configured delay on the delay thread (so a delay
    /// never blocks a thread reading /dev/fuse, and any number of delayed requests can
    /// be pending at once).
    fn after_delay(&self, job: Job) {
        let delay = self.delay_us.load(Ordering::Relaxed);
        if delay == 0 {
            job();
        } else {
            self.delayer
                .schedule(Instant::now() + Duration::from_micros(delay), job);
        }
    }

    /// Records a served (not injected) request in the trace, if tracing.
    fn finish(&self, op: Op, offset: u64, len: u64, errno: i32, received_ns: u64) {
        if self.trace_on.load(Ordering::Relaxed) {
            let now = mono_ns();
            let mut st = self.lock();
            push_trace(&mut st, op, offset, len, errno, received_ns, now);
        }
    }

    fn serve_read(&self, offset: u64, size: u32, received: u64, reply: ReplyData) {
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

    fn serve_write(&self, offset: u64, data: &[u8], received: u64, reply: ReplyWrite) {
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

    fn serve_fsync(&self, received: u64, reply: ReplyEmpty) {
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

    fn serve_fallocate(
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

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
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

    fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            total_injected: st.total,
            injected: st
                .counts
                .iter()
                .map(|(&(op, errno), &count)| ErrnoCount { op, errno, count })
                .collect(),
            requests: st.requests.clone(),
            bytes: st.bytes.clone(),
            max_len: st.max_len.clone(),
            log_len: st.log.len() as u64,
            log_dropped: st.log_dropped,
        }
    }
}

/// Work deferred by a delay: serve one request and answer it.
type Job = Box<dyn FnOnce() + Send>;

struct Delayed {
    due: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Delayed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: BinaryHeap is a max-heap and the earliest deadline must come first;
        // seq keeps requests with equal deadlines in arrival order.
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

#[derive(Default)]
struct DelayQueue {
    heap: BinaryHeap<Delayed>,
    next_seq: u64,
}

/// One thread running jobs at their deadlines; it sleeps on a condvar until the earliest
/// deadline or a new job, never polling.
#[derive(Default, Clone)]
struct Delayer {
    inner: Arc<(Mutex<DelayQueue>, Condvar)>,
}

impl Delayer {
    fn queue(&self) -> MutexGuard<'_, DelayQueue> {
        // Jobs run outside the lock, so poisoning cannot leave the heap half-updated.
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn schedule(&self, due: Instant, job: Job) {
        let mut q = self.queue();
        let seq = q.next_seq;
        q.next_seq += 1;
        q.heap.push(Delayed { due, seq, job });
        self.inner.1.notify_one();
    }

    fn spawn(&self) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("delay".into())
            .spawn(move || me.run())
            .map(|_| ())
    }

    fn run(&self) {
        let mut q = self.queue();
        loop {
            let now = Instant::now();
            match q.heap.peek().map(|d| d.due) {
                Some(due) if due <= now => {
                    if let Some(d) = q.heap.pop() {
                        drop(q);
                        (d.job)();
                        q = self.queue();
                    }
                }
                Some(due) => {
                    q = match self.inner.1.wait_timeout(q, due - now) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                }
                None => {
                    q = match self.inner.1.wait(q) {
                        Ok(g) => g,
                        Err(p) => p.into_inner(),
                    };
                }
            }
        }
    }
}

fn push_trace(
    st: &mut State,
    op: Op,
    offset: u64,
    len: u64,
    errno: i32,
    received_ns: u64,
    answered_ns: u64,
) {
    if st.trace.len() >= DEFAULT_LOG_CAPACITY {
        st.trace.pop_front();
    }
    let seq = st.trace_seq;
    st.trace_seq += 1;
    st.trace.push_back(TracedRequest {
        seq,
        op,
        offset,
        len,
        errno,
        received_ns,
        answered_ns,
    });
}

fn errno_of(e: &std::io::Error) -> i32 {
    e.raw_os_error().filter(|&n| n > 0).unwrap_or(libc::EIO)
}

// ---------------------------------------------------------------------------------------
// FUSE

struct FuseFs(Arc<Disk>);

thread_local! {
    /// Per-thread read buffer, reused so a 1 MiB read does not allocate each time.
    static READ_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

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

// ---------------------------------------------------------------------------------------
// Control socket

fn control_loop(listener: UnixListener, disk: Arc<Disk>) {
    for conn in listener.incoming() {
        match conn {
            Ok(stream) => {
                let disk = disk.clone();
                // One thread per client connection: a client that keeps its connection
                // open must not block others.
                let spawned = std::thread::Builder::new()
                    .name("control-conn".into())
                    .spawn(move || {
                        if let Err(e) = serve_conn(stream, &disk) {
                            eprintln!("faultdisk: control connection: {e:#}");
                        }
                    });
                if let Err(e) = spawned {
                    eprintln!("faultdisk: cannot start control thread: {e}");
                }
            }
            Err(e) => {
                eprintln!("faultdisk: accept on control socket: {e}");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

fn serve_conn(stream: UnixStream, disk: &Disk) -> Result<()> {
    let mut writer = stream.try_clone().context("cloning control stream")?;
    let reader = BufReader::new(stream);
    for line in reader.lines() {
        let line = line.context("reading request")?;
        if line.trim().is_empty() {
            continue;
        }
        let (resp, vanish) = match serde_json::from_str::<Request>(&line) {
            Ok(req) => handle(req, disk),
            Err(e) => (Response::err(format!("bad request: {e}")), false),
        };
        let mut text = serde_json::to_string(&resp).context("encoding response")?;
        text.push('\n');
        writer
            .write_all(text.as_bytes())
            .and_then(|_| writer.flush())
            .context("writing response")?;
        if vanish {
            eprintln!("faultdisk: vanish requested; exiting without unmounting");
            // _exit: no destructors, no unmount, no flushing of anything else. Closing the
            // /dev/fuse fds in the kernel's exit path aborts the connection, so every
            // pending and later request fails.
            // SAFETY: _exit never returns and touches no Rust state.
            unsafe { libc::_exit(0) };
        }
    }
    Ok(())
}

fn handle(req: Request, disk: &Disk) -> (Response, bool) {
    let resp = match req {
        Request::Ping => Response::ok(),
        Request::Info => Response {
            info: disk.info.get().cloned(),
            ..Response::ok()
        },
        Request::AddRule { rule } => match rule.validate() {
            Ok(()) => {
                let mut st = disk.lock();
                let id = st.next_rule_id;
                st.next_rule_id += 1;
                st.rules.push(ActiveRule { id, rule, used: 0 });
                Response {
                    rule_id: Some(id),
                    ..Response::ok()
                }
            }
            Err(e) => Response::err(format!("invalid rule: {e}")),
        },
        Request::RemoveRule { rule_id } => {
            let mut st = disk.lock();
            let before = st.rules.len();
            st.rules.retain(|r| r.id != rule_id);
            if st.rules.len() < before {
                Response::ok()
            } else {
                Response::err(format!("no rule with id {rule_id}"))
            }
        }
        Request::ClearRules => {
            disk.lock().rules.clear();
            Response::ok()
        }
        Request::SetDelay { delay_us } => {
            disk.delay_us.store(delay_us, Ordering::Relaxed);
            Response::ok()
        }
        Request::Stats => Response {
            stats: Some(disk.stats()),
            ..Response::ok()
        },
        Request::ResetStats => {
            let mut st = disk.lock();
            st.counts.clear();
            st.total = 0;
            st.requests = OpCounters::default();
            st.bytes = OpCounters::default();
            st.max_len = OpCounters::default();
            st.log.clear();
            st.log_dropped = 0;
            st.trace.clear();
            Response::ok()
        }
        Request::Injections { since } => {
            let since = since.unwrap_or(0);
            let st = disk.lock();
            Response {
                injections: Some(st.log.iter().filter(|i| i.seq >= since).cloned().collect()),
                ..Response::ok()
            }
        }
        Request::SetTrace { on } => {
            disk.trace_on.store(on, Ordering::Relaxed);
            Response::ok()
        }
        Request::Requests { since } => {
            let since = since.unwrap_or(0);
            let st = disk.lock();
            Response {
                requests: Some(
                    st.trace
                        .iter()
                        .filter(|t| t.seq >= since)
                        .cloned()
                        .collect(),
                ),
                ..Response::ok()
            }
        }
        Request::Vanish => return (Response::ok(), true),
    };
    (resp, false)
}

// ---------------------------------------------------------------------------------------
// Orphan handling

/// Set once the stdin watcher started cleaning up after a vanished client.
static ORPHAN_CLEANUP: AtomicBool = AtomicBool::new(false);

/// Blocks until stdin reaches EOF (the client closed it or died), then cleans up what a
/// dead client left behind and exits.
fn orphan_watch(dir: PathBuf, image: PathBuf, mnt: PathBuf) {
    let mut stdin = std::io::stdin().lock();
    let mut sink = [0u8; 64];
    loop {
        match stdin.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    drop(stdin);
    ORPHAN_CLEANUP.store(true, Ordering::SeqCst);
    if let Err(e) = orphan_cleanup(&dir, &image, &mnt) {
        eprintln!("faultdisk: orphan cleanup: {e:#}");
    }
    // The normal path (client unmounts us) ends in real_main; getting here means the
    // client is gone or closing: leave now.
    std::process::exit(0);
}

fn orphan_cleanup(dir: &Path, image: &Path, mnt: &Path) -> Result<()> {
    let loops = health_tests::sys::loops_backed_by(image)?;
    if !loops.is_empty() {
        eprintln!("faultdisk: stdin closed with loop devices still attached: {loops:?}");
    }
    // We serve the image, so stat works; it is the identity the loop driver recorded.
    let id = health_tests::sys::FileId::of(image)?;
    for name in &loops {
        if let Err(e) = health_tests::sys::detach_loop_device(name, Some(id)) {
            eprintln!("faultdisk: detaching {name}: {e:#}");
        }
    }
    // Unmounting ourselves ends the FUSE session; lazily if something still holds it.
    health_tests::sys::unmount(mnt, true)?;
    if health_tests::sys::is_owned_work_dir(dir) {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}
