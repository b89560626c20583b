//! Client side of the `faultdisk` server: start it, attach loop devices over its image,
//! steer fault injection, read what was injected, and clean everything up on drop.
//!
//! The server process and its control socket are here; the loop devices attached over
//! its image are in `loop_device`.

mod loop_device;

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tempfile::TempDir;

use self::loop_device::LoopShared;
pub use self::loop_device::{LoopDevice, LoopOptions, Partition};
use crate::protocol::{
    Injection, Request, Response, Rule, ServerInfo, Stats, TracedRequest, CONTROL_SOCKET,
    IMAGE_NAME, LOG_NAME, MOUNT_DIR,
};
use crate::sys;

/// How long the server may take to mount and report ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Socket timeout for one control request (the injection log can be tens of MB).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long Drop waits for the server to exit by itself after its unmount.
const EXIT_GRACE: Duration = Duration::from_secs(5);

/// Locks a mutex, ignoring poisoning: the data guarded here (child handle, loop list)
/// stays consistent even if a panic happened while it was held, and Drop must still run.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A running `faultdisk` server with its FUSE mount, serving `disk.img`.
///
/// Dropping it unmounts filesystems on its loop devices, detaches them, unmounts the
/// FUSE mount, stops the server and deletes the work dir, also after [`vanish`] or
/// during a panic.
///
/// [`vanish`]: FaultDisk::vanish
pub struct FaultDisk {
    /// `Some` until Drop removes it (last).
    dir: Option<TempDir>,
    work_dir: PathBuf,
    mount_dir: PathBuf,
    image: PathBuf,
    /// Recorded at start: the image cannot be stat'ed once the server is gone.
    image_id: sys::FileId,
    socket: PathBuf,
    info: ServerInfo,
    child: Mutex<Option<Child>>,
    /// Held open for the server's lifetime: EOF tells it we are gone.
    stdin: Mutex<Option<ChildStdin>>,
    loops: Mutex<Vec<Arc<LoopShared>>>,
    vanished: AtomicBool,
}

impl std::fmt::Debug for FaultDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultDisk")
            .field("work_dir", &self.work_dir)
            .field("image", &self.image)
            .field("pid", &self.info.pid)
            .finish_non_exhaustive()
    }
}

impl FaultDisk {
    /// Starts a server for a `size_bytes` disk with the default server binary
    /// ([`FaultDisk::default_bin`]).
    pub fn start(size_bytes: u64) -> Result<FaultDisk> {
        let bin = Self::default_bin()?;
        Self::start_with(&bin, size_bytes)
    }

    /// Where the `faultdisk` binary is: `$FAULTDISK_BIN`, else next to the running
    /// executable (`target/<profile>/faultdisk` for a test in `target/<profile>/deps/`).
    pub fn default_bin() -> Result<PathBuf> {
        if let Some(p) = std::env::var_os("FAULTDISK_BIN") {
            let p = PathBuf::from(p);
            if p.is_file() {
                return Ok(p);
            }
            bail!("FAULTDISK_BIN={} does not name a file", p.display());
        }
        let exe = std::env::current_exe().context("finding the current executable")?;
        let mut tried = Vec::new();
        let mut dir = exe.parent();
        // The executable's own dir, then its parent (deps/ -> <profile>/).
        for _ in 0..2 {
            let Some(d) = dir else { break };
            let candidate = d.join("faultdisk");
            if candidate.is_file() {
                return Ok(candidate);
            }
            tried.push(candidate.display().to_string());
            dir = d.parent();
        }
        bail!(
            "cannot find the faultdisk server binary (tried {}): build it with \
             `cargo build -p health-tests --bin faultdisk` or set FAULTDISK_BIN",
            tried.join(", ")
        )
    }

    /// Starts the server binary `bin` for a disk of `size_bytes` (a positive multiple of
    /// 512) in a fresh temp dir and waits until its FUSE mount is up.
    pub fn start_with(bin: &Path, size_bytes: u64) -> Result<FaultDisk> {
        sys::require_root()?;
        if size_bytes == 0 || !size_bytes.is_multiple_of(512) {
            bail!("fault disk size {size_bytes} must be a positive multiple of 512");
        }
        if !bin.is_file() {
            bail!("faultdisk server binary {} does not exist", bin.display());
        }
        let dir = tempfile::Builder::new()
            .prefix("faultdisk-")
            .tempdir()
            .context("creating the fault disk work dir")?;
        let work_dir = dir.path().to_path_buf();
        let log_path = work_dir.join(LOG_NAME);
        let log = File::create(&log_path)
            .with_context(|| format!("creating server log {}", log_path.display()))?;
        let mut child = Command::new(bin)
            // Own process group: a Ctrl-C aimed at the test run must not kill the server
            // before it can clean up (it notices its client is gone by stdin EOF).
            .process_group(0)
            .arg("--dir")
            .arg(&work_dir)
            .arg("--size")
            .arg(size_bytes.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();

        // The ready line is read on a helper thread so we can stop waiting after a
        // timeout without polling.
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let res = match stdout {
                Some(out) => BufReader::new(out).read_line(&mut line).map(|_| line),
                None => Err(std::io::Error::other("no stdout pipe")),
            };
            let _ = tx.send(res);
        });
        let ready = rx.recv_timeout(READY_TIMEOUT);

        let fail = |child: &mut Child, why: String| -> anyhow::Error {
            let _ = child.kill();
            let _ = child.wait();
            anyhow!(
                "faultdisk server {} did not become ready: {why}; server log: {}",
                bin.display(),
                log_tail(&log_path)
            )
        };
        let line = match ready {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => return Err(fail(&mut child, format!("reading its stdout: {e}"))),
            Err(_) => return Err(fail(&mut child, format!("no answer in {READY_TIMEOUT:?}"))),
        };
        let Some(json) = line.trim_end().strip_prefix("ready ") else {
            let why = if line.is_empty() {
                "it exited before mounting".to_string()
            } else {
                format!("unexpected first line {line:?}")
            };
            return Err(fail(&mut child, why));
        };
        let info: ServerInfo = match serde_json::from_str(json) {
            Ok(i) => i,
            Err(e) => return Err(fail(&mut child, format!("bad ready line {json:?}: {e}"))),
        };

        let image = work_dir.join(MOUNT_DIR).join(IMAGE_NAME);
        let image_id = match sys::FileId::of(&image) {
            Ok(id) => id,
            Err(e) => return Err(fail(&mut child, format!("{e:#}"))),
        };
        let disk = FaultDisk {
            dir: Some(dir),
            mount_dir: work_dir.join(MOUNT_DIR),
            image,
            image_id,
            socket: work_dir.join(CONTROL_SOCKET),
            work_dir,
            info,
            child: Mutex::new(Some(child)),
            stdin: Mutex::new(stdin),
            loops: Mutex::new(Vec::new()),
            vanished: AtomicBool::new(false),
        };
        // From here on Drop cleans up whatever goes wrong.
        disk.call(&Request::Ping)
            .context("faultdisk server does not answer on its control socket")?;
        let meta = std::fs::metadata(&disk.image)
            .with_context(|| format!("stat of {} on the FUSE mount", disk.image.display()))?;
        if meta.len() != size_bytes {
            bail!(
                "{} has size {} instead of {size_bytes}",
                disk.image.display(),
                meta.len()
            );
        }
        Ok(disk)
    }

    /// The disk image on the FUSE mount (what loop devices are attached to).
    pub fn image_path(&self) -> &Path {
        &self.image
    }

    /// The server's work dir (backing file, socket, mount point, `faultdisk.log`).
    pub fn work_dir(&self) -> &Path {
        &self.work_dir
    }

    /// The FUSE mount point.
    pub fn mount_dir(&self) -> &Path {
        &self.mount_dir
    }

    /// What the server reported when it became ready.
    pub fn info(&self) -> &ServerInfo {
        &self.info
    }

    /// Size of the disk in bytes.
    pub fn size(&self) -> u64 {
        self.info.size
    }

    /// The server's pid.
    pub fn server_pid(&self) -> u32 {
        self.info.pid
    }

    /// The last lines of the server's log, for diagnostics.
    pub fn server_log_tail(&self) -> String {
        log_tail(&self.work_dir.join(LOG_NAME))
    }

    /// Adds a rule; returns its id (for [`remove_rule`](FaultDisk::remove_rule)).
    pub fn add_rule(&self, rule: Rule) -> Result<u64> {
        let shown = format!("{rule:?}");
        let resp = self
            .call(&Request::AddRule { rule })
            .with_context(|| format!("adding rule {shown}"))?;
        resp.rule_id
            .with_context(|| format!("server answered add_rule without a rule id: {resp:?}"))
    }

    /// Removes one rule.
    pub fn remove_rule(&self, rule_id: u64) -> Result<()> {
        self.call(&Request::RemoveRule { rule_id })
            .with_context(|| format!("removing rule {rule_id}"))?;
        Ok(())
    }

    /// Removes every rule: the disk works again.
    pub fn clear_rules(&self) -> Result<()> {
        self.call(&Request::ClearRules).context("clearing rules")?;
        Ok(())
    }

    /// Delays every read/write/discard/flush by `delay` (zero: off). Resolution: 1 µs.
    pub fn set_delay(&self, delay: Duration) -> Result<()> {
        let delay_us = u64::try_from(delay.as_micros()).unwrap_or(u64::MAX);
        self.call(&Request::SetDelay { delay_us })
            .with_context(|| format!("setting delay {delay:?}"))?;
        Ok(())
    }

    /// Stops the server (SIGSTOP), as a wedged or descheduled FUSE daemon:
    /// every request on the mount waits, and so does every call of this
    /// handle until [`cont`](FaultDisk::cont).
    pub fn stop_server(&self) -> Result<()> {
        self.signal_server(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Lets a stopped server run again (SIGCONT).
    pub fn cont(&self) -> Result<()> {
        self.signal_server(nix::sys::signal::Signal::SIGCONT)
    }

    fn signal_server(&self, signal: nix::sys::signal::Signal) -> Result<()> {
        self.check_alive()?;
        let guard = lock(&self.child);
        let child = guard.as_ref().context("the faultdisk server has exited")?;
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        nix::sys::signal::kill(pid, signal)
            .with_context(|| format!("sending {signal} to the faultdisk server {pid}"))
    }

    /// Counters since start (or the last [`reset_stats`](FaultDisk::reset_stats)).
    pub fn stats(&self) -> Result<Stats> {
        self.call(&Request::Stats)
            .context("reading stats")?
            .stats
            .context("server answered stats without stats")
    }

    /// Zeroes the counters and empties the injection log (sequence numbers go on).
    pub fn reset_stats(&self) -> Result<()> {
        self.call(&Request::ResetStats).context("resetting stats")?;
        Ok(())
    }

    /// The whole injection log (at most the last 200 000 failures).
    pub fn injections(&self) -> Result<Vec<Injection>> {
        self.injections_since(0)
    }

    /// Injection log entries with `seq >= since`.
    pub fn injections_since(&self, since: u64) -> Result<Vec<Injection>> {
        self.call(&Request::Injections { since: Some(since) })
            .context("reading the injection log")?
            .injections
            .context("server answered without injections")
    }

    /// Records every request (failed or not) from now on, or stops doing so.
    pub fn set_trace(&self, on: bool) -> Result<()> {
        self.call(&Request::SetTrace { on })
            .context("switching the request trace")?;
        Ok(())
    }

    /// Traced requests with `seq >= since`.
    pub fn traced_requests(&self, since: u64) -> Result<Vec<TracedRequest>> {
        self.call(&Request::Requests { since: Some(since) })
            .context("reading the request trace")?
            .requests
            .context("server answered without requests")
    }

    /// Makes the server exit at once without unmounting, and waits until it is gone:
    /// every later I/O on the loop devices fails (with EIO), like a vanished disk.
    ///
    /// The FUSE mount is detached from the mount namespace first (the loop devices keep
    /// their open file, so they keep working until the server exits): a mount whose
    /// server is dead answers ENOTCONN to anyone stat'ing it, and tools that walk the
    /// mount table (mkfs.btrfs checking whether its device is mounted, df, ...) would
    /// fail in every other test running meanwhile. [`image_path`](FaultDisk::image_path)
    /// no longer resolves afterwards.
    pub fn vanish(&self) -> Result<()> {
        self.check_alive()?;
        nix::mount::umount2(&self.mount_dir, nix::mount::MntFlags::MNT_DETACH)
            .with_context(|| format!("detaching the FUSE mount {}", self.mount_dir.display()))?;
        self.call(&Request::Vanish)
            .context("asking the server to vanish")?;
        self.vanished.store(true, Ordering::SeqCst);
        let mut guard = lock(&self.child);
        if let Some(child) = guard.as_mut() {
            if !wait_child(child, EXIT_GRACE)? {
                let _ = child.kill();
                child.wait().context("waiting for the vanished server")?;
            }
        }
        *guard = None;
        Ok(())
    }

    /// Whether [`vanish`](FaultDisk::vanish) was called.
    pub fn has_vanished(&self) -> bool {
        self.vanished.load(Ordering::SeqCst)
    }

    fn check_alive(&self) -> Result<()> {
        if self.has_vanished() {
            bail!("the faultdisk server has vanished (vanish() was called)");
        }
        Ok(())
    }

    /// One request/answer on a fresh connection (cheap, and no shared stream state
    /// between threads using the same disk).
    fn call(&self, req: &Request) -> Result<Response> {
        self.check_alive()?;
        let resp = self.call_raw(req, CONTROL_TIMEOUT).map_err(|e| {
            e.context(format!(
                "control request to {} failed; server log: {}",
                self.socket.display(),
                self.server_log_tail()
            ))
        })?;
        if !resp.ok {
            bail!(
                "faultdisk server refused: {}",
                resp.error.as_deref().unwrap_or("(no reason given)")
            );
        }
        Ok(resp)
    }

    fn call_raw(&self, req: &Request, timeout: Duration) -> Result<Response> {
        exchange(&self.socket, req, timeout)
    }

    /// Everything Drop does, reporting problems instead of printing them.
    fn cleanup(&mut self) -> Result<()> {
        let mut errors: Vec<String> = Vec::new();
        let alive = !self.has_vanished();
        if alive {
            // A large delay would make every unmount below crawl.
            let _ = self.call_raw(&Request::SetDelay { delay_us: 0 }, Duration::from_secs(5));
        }
        // Loop devices first: their filesystems still need the server to write back.
        let loops: Vec<Arc<LoopShared>> = lock(&self.loops).clone();
        for l in &loops {
            if let Err(e) = l.detach() {
                errors.push(format!("{e:#}"));
            }
        }
        // Also loops someone attached by hand to our image.
        if let Ok(names) = sys::loops_backed_by(&self.image) {
            for name in names {
                if let Err(e) = sys::detach_loop_device(&name, Some(self.image_id)) {
                    errors.push(format!("{e:#}"));
                }
            }
        }
        // Unmounting the FUSE mount ends the server's session and it exits by itself.
        // Lazily if busy: a loop still held open by a lazily unmounted filesystem keeps
        // the image open until the kill below aborts the connection.
        if let Err(e) = sys::unmount(&self.mount_dir, true) {
            errors.push(format!("{e:#}"));
        }
        if let Some(mut child) = lock(&self.child).take() {
            match wait_child(&mut child, EXIT_GRACE) {
                Ok(true) => {}
                _ => {
                    // Killing it aborts the FUSE connection, failing whatever a lazily
                    // unmounted filesystem still has in flight instead of hanging on it.
                    errors.push(format!(
                        "faultdisk server {} did not exit within {EXIT_GRACE:?} after its \
                         unmount; killed it",
                        self.info.pid
                    ));
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        // Only now, with the server gone, close its stdin (closing it earlier would
        // start its orphan cleanup, racing with ours).
        drop(lock(&self.stdin).take());
        if let Some(dir) = self.dir.take() {
            // FUSE may still be attached if everything above failed; a lazy detach lets
            // the directory go in any case.
            if sys::mount_at(&self.mount_dir).ok().flatten().is_some() {
                let _ = nix::mount::umount2(&self.mount_dir, nix::mount::MntFlags::MNT_DETACH);
            }
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                errors.push(format!("removing work dir {}: {e}", path.display()));
            }
        }
        if errors.is_empty() {
            Ok(())
        } else {
            bail!("{}", errors.join("; "))
        }
    }
}

impl Drop for FaultDisk {
    fn drop(&mut self) {
        if let Err(e) = self.cleanup() {
            eprintln!("FaultDisk cleanup: {e:#}");
        }
    }
}

/// Waits up to `timeout` for `child` to exit; `Ok(false)` if it is still running.
fn wait_child(child: &mut Child, timeout: Duration) -> Result<bool> {
    let mut exited = false;
    let mut err = None;
    sys::wait_for(timeout, Duration::from_millis(10), || {
        match child.try_wait() {
            Ok(Some(_)) => {
                exited = true;
                true
            }
            Ok(None) => false,
            Err(e) => {
                err = Some(e);
                true
            }
        }
    });
    match err {
        Some(e) => Err(e).context("waiting for the faultdisk server"),
        None => Ok(exited),
    }
}

/// Last lines of a log file, or why it could not be read.
fn log_tail(path: &Path) -> String {
    let mut text = String::new();
    match File::open(path).and_then(|mut f| f.read_to_string(&mut text)) {
        Ok(_) => {
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(10);
            if lines.is_empty() {
                "(empty)".to_string()
            } else {
                lines[start..].join(" | ")
            }
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

/// One request and its answer on a fresh connection to a faultdisk server's
/// control socket `socket`, whatever the answer says (`ok` or not). The
/// server's control protocol is tests/src/protocol.rs.
pub fn exchange(socket: &Path, req: &Request, timeout: Duration) -> Result<Response> {
    let stream = UnixStream::connect(socket)
        .with_context(|| format!("connecting to {}", socket.display()))?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    let mut line = serde_json::to_string(req).context("encoding request")?;
    line.push('\n');
    (&stream)
        .write_all(line.as_bytes())
        .context("sending request")?;
    let mut answer = String::new();
    BufReader::new(&stream)
        .read_line(&mut answer)
        .context("reading answer")?;
    if answer.is_empty() {
        bail!("server closed the connection without answering");
    }
    serde_json::from_str(&answer).with_context(|| {
        format!(
            "bad answer {:?}",
            answer.chars().take(200).collect::<String>()
        )
    })
}

/// [`exchange`] with the control timeout, for a server this process did not
/// start (a daemon, a server on a kind node): an answer with `ok: false` is
/// an error naming the request.
pub fn call(socket: &Path, req: &Request) -> Result<Response> {
    let resp = exchange(socket, req, CONTROL_TIMEOUT)
        .with_context(|| format!("the fault disk at {}", socket.display()))?;
    if !resp.ok {
        bail!(
            "the fault disk refused {req:?}: {}",
            resp.error.as_deref().unwrap_or("no reason given")
        );
    }
    Ok(resp)
}
