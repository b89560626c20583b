//! `faultdisk`: a FUSE server exporting one file, `disk.img`, whose reads, writes,
//! fallocates and fsyncs can be made to fail with any errno on command. A loop device over
//! that file turns those failures into real block-layer I/O errors.
//!
//! Usage: `faultdisk --dir DIR --size BYTES [--threads N] [--sync-dio] [--no-stdin]`
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
//! unmounts itself, deletes DIR). With `--no-stdin` (a daemon, whose stdin is /dev/null)
//! stdin is ignored and SIGTERM, SIGINT or SIGHUP starts that cleanup instead.
//!
//! Layout: this file parses the arguments, mounts and reports ready; `disk` holds the
//! shared state and decides which requests fail, `image` serves them from the backing
//! file, `delay` runs delayed ones, `fuse` is the filesystem the kernel talks to,
//! `control` the control socket and `orphan` the cleanup after a vanished client or a
//! stop signal.

mod control;
mod delay;
mod disk;
mod fuse;
mod image;
mod orphan;

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use fuser::{Config, MountOption, SessionACL};
use health_tests::protocol::{ServerInfo, BACKING_NAME, CONTROL_SOCKET, IMAGE_NAME, MOUNT_DIR};

use crate::control::control_loop;
use crate::disk::Disk;
use crate::fuse::FuseFs;
use crate::orphan::{block_stop_signals, orphan_watch, signal_watch, WorkDir, ORPHAN_CLEANUP};

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
    /// Run as a daemon: stdin is not watched; a stop signal ends the server.
    no_stdin: bool,
}

const USAGE: &str =
    "usage: faultdisk --dir DIR --size BYTES [--threads N] [--sync-dio] [--no-stdin]";

fn parse_args() -> Result<Args> {
    let mut dir = None;
    let mut size = None;
    let mut threads = DEFAULT_THREADS;
    let mut no_stdin = false;
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
                size = Some(
                    v.parse::<u64>()
                        .with_context(|| format!("bad --size {v}"))?,
                );
            }
            Some("--sync-dio") => ASYNC_DIO.store(false, Ordering::Relaxed),
            Some("--no-stdin") => no_stdin = true,
            Some("--threads") => {
                let v = value("--threads")?;
                threads = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .with_context(|| format!("bad --threads {v} (1..=64)"))?;
            }
            _ => bail!("unknown argument {a:?}; {USAGE}"),
        }
    }
    let dir = dir.context("--dir is required")?;
    let size = size.context("--size is required")?;
    if size == 0 || !size.is_multiple_of(512) {
        bail!("--size {size} must be a positive multiple of 512");
    }
    Ok(Args {
        dir,
        size,
        threads,
        no_stdin,
    })
}

fn real_main() -> Result<()> {
    let args = parse_args()?;
    if args.no_stdin {
        // Before any thread starts, so that all of them inherit the mask and the
        // watcher alone receives the signals.
        block_stop_signals()?;
    }
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
        let work = WorkDir {
            dir: dir.clone(),
            image: image_path.clone(),
            mnt: mount_dir.clone(),
        };
        let (name, watch): (&str, fn(WorkDir)) = match args.no_stdin {
            true => ("signal-watch", signal_watch),
            false => ("orphan-watch", orphan_watch),
        };
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || watch(work))
            .with_context(|| format!("starting the {name} thread"))?;
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
