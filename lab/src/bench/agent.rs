//! Running `health-agent watch` as a child, timestamping every line it
//! prints and reading its resource use from /proc.
//!
//! `health_tests::agent::Agent` is made for assertions; this runner adds
//! what measurements need: the CLOCK_MONOTONIC time each stdout line was
//! received (for latency), the pid (CPU time, peak RSS, BPF program stats)
//! and optional live echo (the demo).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::interrupt;

/// How long the agent may take to load and attach its programs.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long it may take to detach and print its totals after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

/// One line of the agent's stdout.
#[derive(Clone, Debug)]
pub struct Line {
    /// CLOCK_MONOTONIC ns when our reader got it from the pipe.
    pub recv_ns: u64,
    pub text: String,
}

/// What a stopped agent printed.
#[derive(Debug)]
pub struct Stopped {
    pub lines: Vec<Line>,
    pub stderr: String,
    pub status: ExitStatus,
}

pub struct AgentProc {
    child: Child,
    pid: i32,
    lines: Arc<Mutex<Vec<Line>>>,
    stderr_text: Arc<Mutex<String>>,
    stdout_reader: Option<JoinHandle<()>>,
    stderr_reader: Option<JoinHandle<()>>,
    stopped: bool,
}

/// Locks ignoring poisoning: the reader threads only push whole lines.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Puts the calling thread at SCHED_FIFO `priority`.
pub(super) fn raise_fifo(priority: i32) -> std::io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: plain syscall on the calling thread with a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// CLOCK_MONOTONIC in ns, the clock of the agent's `mono_ns` and of the
/// fault disk's injection log.
pub fn mono_ns() -> u64 {
    health_tests::protocol::mono_ns()
}

impl AgentProc {
    /// Starts `bin watch <args>` and waits for its ready line. With `echo`,
    /// stdout lines are also printed live, each after that prefix.
    pub fn start(bin: &Path, args: &[String], echo: Option<&'static str>) -> Result<AgentProc> {
        Self::start_mode(bin, "watch", args, echo)
    }

    /// Like [`AgentProc::start`] with another subcommand (`run`).
    pub fn start_mode(
        bin: &Path,
        mode: &str,
        args: &[String],
        echo: Option<&'static str>,
    ) -> Result<AgentProc> {
        Self::spawn(bin, mode, args, echo, None)
    }

    /// Like [`AgentProc::start`], with the stdout reader at SCHED_FIFO
    /// `reader_priority`: under CPU load (the latency benchmark's `--load`)
    /// a normal-priority reader would stamp lines late, and the figure would
    /// measure our own reader's wait for a CPU instead of the agent's.
    pub fn start_timed(bin: &Path, args: &[String], reader_priority: i32) -> Result<AgentProc> {
        Self::spawn(bin, "watch", args, None, Some(reader_priority))
    }

    fn spawn(
        bin: &Path,
        mode: &str,
        args: &[String],
        echo: Option<&'static str>,
        reader_priority: Option<i32>,
    ) -> Result<AgentProc> {
        interrupt::check()?;
        let mut cmd = Command::new(bin);
        cmd.arg(mode)
            .args(args)
            // Each run measures its own agent from a clean start: nothing
            // pinned by one run may be adopted by the next.
            .arg("--no-pin")
            .env_remove("HTTPS_PROXY")
            .env_remove("https_proxy")
            .env("HEALTH_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own process group: a terminal Ctrl-C reaches only us, and
            // we stop the agent ourselves so that it prints its totals.
            .process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| {
                // If we die without stopping it, it should not run on alone.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = i32::try_from(child.id()).context("agent pid out of range")?;
        let stdout = child.stdout.take().context("agent stdout")?;
        let stderr = child.stderr.take().context("agent stderr")?;

        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let (raised_tx, raised_rx) = mpsc::channel();
        let stdout_reader = std::thread::spawn(move || {
            let raised = reader_priority.map(raise_fifo).transpose();
            let _ = raised_tx.send(raised);
            let mut reader = BufReader::new(stdout);
            let mut buf = String::new();
            loop {
                buf.clear();
                match reader.read_line(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
                // Stamped before anything else is done with the line.
                let recv_ns = mono_ns();
                let text = buf.trim_end_matches('\n').to_string();
                if let Some(prefix) = echo {
                    let mut out = std::io::stdout().lock();
                    let _ = writeln!(out, "{prefix}{text}");
                    let _ = out.flush();
                }
                lock(&sink).push(Line { recv_ns, text });
            }
        });
        let stderr_text = Arc::new(Mutex::new(String::new()));
        let err_sink = Arc::clone(&stderr_text);
        let (ready_tx, ready_rx) = mpsc::channel();
        let stderr_reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                {
                    let mut t = lock(&err_sink);
                    t.push_str(&line);
                    t.push('\n');
                }
                // Signalled after storing, so whoever wakes up finds the line.
                if line.contains("volume-health: ready") {
                    let _ = ready_tx.send(());
                }
            }
        });
        let mut agent = AgentProc {
            child,
            pid,
            lines,
            stderr_text,
            stdout_reader: Some(stdout_reader),
            stderr_reader: Some(stderr_reader),
            stopped: false,
        };
        let raised = raised_rx
            .recv()
            .context("the stdout reader ended before starting")?;
        if let Err(e) = raised {
            agent.stop_inner()?;
            return Err(e).context("raising our stdout reader to SCHED_FIFO");
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            match ready_rx.recv_timeout(Duration::from_millis(100)) {
                Ok(()) => return Ok(agent),
                Err(mpsc::RecvTimeoutError::Timeout) if Instant::now() < deadline => {
                    // Dropping `agent` on the way out stops it.
                    interrupt::check()?;
                }
                Err(_) => {
                    let why = match agent.child.try_wait() {
                        Ok(Some(status)) => format!("it exited with {status}"),
                        _ => format!("no ready line within {READY_TIMEOUT:?}"),
                    };
                    let stopped = agent.stop_inner()?;
                    bail!(
                        "the agent did not become ready ({why}); its stderr:\n{}",
                        stopped.stderr.trim_end()
                    );
                }
            }
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// What it printed on stderr so far.
    pub fn stderr_so_far(&self) -> String {
        lock(&self.stderr_text).clone()
    }

    /// Fails unless the agent counts failed requests where the benchmark
    /// says it does (`--early-block-errors`: at `block_rq_complete`, before
    /// the kernel prints them), so that what is measured is what is named.
    pub fn expect_early_counting(&self, asked: bool) -> Result<()> {
        let stderr = self.stderr_so_far();
        let early = stderr.contains(
            "off      block_rq_error: its failed requests are counted at block_rq_complete",
        );
        if early != asked {
            let asked = if asked { "asked" } else { "not asked" };
            let counts = if early { "early" } else { "at block_rq_error" };
            bail!("--early-block-errors {asked}, but the agent counts failed requests {counts}:\n{stderr}");
        }
        Ok(())
    }

    pub fn line_count(&self) -> usize {
        lock(&self.lines).len()
    }

    /// Waits until `done` holds for the lines received so far, or `timeout`
    /// passes (false).
    pub fn wait_until(&self, timeout: Duration, done: impl Fn(&[Line]) -> bool) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if done(&lock(&self.lines)) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            interrupt::sleep(Duration::from_millis(20))?;
        }
    }

    /// utime + stime so far, in clock ticks.
    pub fn cpu_ticks(&self) -> Result<u64> {
        cpu_ticks_of(self.pid)
    }

    /// A `kB` field of `/proc/<pid>/status`, e.g. `VmHWM` (peak RSS).
    pub fn status_kb(&self, name: &str) -> Result<u64> {
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        let value = text
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .with_context(|| format!("{path}: no {name}"))?;
        value
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .with_context(|| format!("{path}: {name} {value:?}"))
    }

    /// Run count, run time and recursion misses summed over the agent's BPF
    /// programs, from /proc/<pid>/fdinfo (run count and time are non-zero
    /// only while kernel.bpf_stats_enabled=1).
    pub fn bpf_prog_stats(&self) -> Result<ProgStats> {
        let dir = format!("/proc/{}/fd", self.pid);
        let mut total = ProgStats::default();
        for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
            let entry = entry.with_context(|| format!("listing {dir}"))?;
            let Ok(target) = std::fs::read_link(entry.path()) else {
                continue;
            };
            if target.as_os_str() != "anon_inode:bpf-prog" {
                continue;
            }
            let info_path = format!(
                "/proc/{}/fdinfo/{}",
                self.pid,
                entry.file_name().to_string_lossy()
            );
            let Ok(info) = std::fs::read_to_string(&info_path) else {
                continue;
            };
            let get = |key: &str| -> u64 {
                info.lines()
                    .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            total.programs += 1;
            total.run_cnt += get("run_cnt");
            total.run_time_ns += get("run_time_ns");
            total.recursion_misses += get("recursion_misses");
        }
        Ok(total)
    }

    /// SIGTERM, then everything it printed. The agent detaches and prints
    /// its exact totals before exiting.
    pub fn stop(mut self) -> Result<Stopped> {
        self.stop_inner()
    }

    /// [`stop`](Self::stop), and an error carrying its stderr unless it
    /// exited successfully.
    pub fn stop_ok(self) -> Result<Stopped> {
        let stopped = self.stop()?;
        if !stopped.status.success() {
            bail!(
                "the agent exited with {}:\n{}",
                stopped.status,
                stopped.stderr
            );
        }
        Ok(stopped)
    }

    fn stop_inner(&mut self) -> Result<Stopped> {
        self.stopped = true;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            if let Some(s) = self.child.try_wait().context("waiting for the agent")? {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the agent did not exit within {STOP_TIMEOUT:?} of SIGTERM; killed it");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        // The pipes close when it exits, so the readers end by themselves.
        for h in [self.stdout_reader.take(), self.stderr_reader.take()]
            .into_iter()
            .flatten()
        {
            let _ = h.join();
        }
        Ok(Stopped {
            lines: std::mem::take(&mut *lock(&self.lines)),
            stderr: std::mem::take(&mut *lock(&self.stderr_text)),
            status,
        })
    }
}

impl Drop for AgentProc {
    fn drop(&mut self) {
        if !self.stopped {
            if let Err(e) = self.stop_inner() {
                eprintln!("xtask: stopping the agent: {e:#}");
            }
        }
    }
}

/// BPF program statistics of one agent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProgStats {
    pub programs: u32,
    pub run_cnt: u64,
    pub run_time_ns: u64,
    /// Times the kernel skipped a program because a BPF program was already
    /// running on that CPU (counted whether or not stats are enabled).
    pub recursion_misses: u64,
}

impl ProgStats {
    pub fn since(self, before: ProgStats) -> ProgStats {
        ProgStats {
            programs: self.programs,
            run_cnt: self.run_cnt.saturating_sub(before.run_cnt),
            run_time_ns: self.run_time_ns.saturating_sub(before.run_time_ns),
            recursion_misses: self
                .recursion_misses
                .saturating_sub(before.recursion_misses),
        }
    }
}

/// Sets kernel.bpf_stats_enabled for as long as it lives (it costs two clock
/// reads per program run, so it is only on while measuring programs).
pub struct BpfStatsGuard {
    old: String,
}

const BPF_STATS: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStatsGuard {
    pub fn enable() -> Result<BpfStatsGuard> {
        let old =
            std::fs::read_to_string(BPF_STATS).with_context(|| format!("reading {BPF_STATS}"))?;
        std::fs::write(BPF_STATS, "1").with_context(|| format!("writing 1 to {BPF_STATS}"))?;
        Ok(BpfStatsGuard {
            old: old.trim().to_string(),
        })
    }
}

impl Drop for BpfStatsGuard {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(BPF_STATS, &self.old) {
            eprintln!("xtask: restoring {BPF_STATS} to {}: {e}", self.old);
        }
    }
}

/// utime + stime of process `pid` so far, in clock ticks.
pub(crate) fn cpu_ticks_of(pid: impl std::fmt::Display) -> Result<u64> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    // comm (field 2) may contain spaces and parentheses: split after its
    // closing parenthesis, which is the last one on the line.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .with_context(|| format!("{path}: no comm field"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields after comm start at 3 (state); utime is 14 and stime 15.
    let field = |n: usize| -> Result<u64> {
        fields
            .get(n - 3)
            .with_context(|| format!("{path}: no field {n}"))?
            .parse()
            .with_context(|| format!("{path}: field {n}"))
    };
    Ok(field(14)? + field(15)?)
}
