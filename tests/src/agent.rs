//! Running the real `health-agent watch --json` as a child process and
//! collecting what it reports.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::mount_ns::PrivateMounts;

/// How long the agent may take to load and attach its programs: a bound on
/// a hang, not a figure (docs/benchmarks.md has those). Under QEMU's TCG
/// with two guests busy, attaching the returned-error fexit programs took
/// 30.7 s in a 6.12 guest (2026-12-01); on the host it takes under 2 s.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The agent binary: `HEALTH_AGENT_BIN` (set by `cargo xtask test`), else
/// the workspace's release build.
pub fn agent_bin() -> Result<PathBuf> {
    release_bin("health-agent", "HEALTH_AGENT_BIN")
}

/// The controller binary: `HEALTH_CONTROLLER_BIN` (set by `cargo xtask
/// test`), else the workspace's release build.
pub fn controller_bin() -> Result<PathBuf> {
    release_bin("health-controller", "HEALTH_CONTROLLER_BIN")
}

fn release_bin(name: &str, env: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../target/release")
        .join(name);
    if !p.is_file() {
        bail!("{} is missing: run the tests with `cargo xtask test` (it builds {name}, the agent with its kernel programs)", p.display());
    }
    Ok(p)
}

/// `bin` with the environment every test gives the agent: no proxy (the
/// API servers of the tests are on loopback), `info` logs, no colour.
pub fn agent_command(bin: &Path) -> Command {
    let mut command = Command::new(bin);
    command
        .env_remove("HTTPS_PROXY")
        .env_remove("https_proxy")
        .env_remove("HTTP_PROXY")
        .env_remove("http_proxy")
        .env("HEALTH_LOG", "info")
        .env("NO_COLOR", "1");
    command
}

/// Runs the agent to its end with `args`: exit code (-1 when killed by a
/// signal), stdout, stderr.
pub fn agent_output(args: &[&str]) -> Result<(i32, String, String)> {
    let out = agent_command(&agent_bin()?).args(args).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// A running agent. Events are read on a thread as they arrive.
pub struct Agent {
    child: Child,
    events: mpsc::Receiver<Value>,
    seen: Vec<Value>,
    stdout_reader: Option<JoinHandle<Result<()>>>,
    stderr_reader: Option<JoinHandle<String>>,
    /// Everything printed on stderr so far, for waiting on a log line.
    stderr_live: Arc<Mutex<String>>,
}

/// What a stopped agent reported.
#[derive(Debug)]
pub struct AgentRun {
    pub events: Vec<Value>,
    pub stderr: String,
    pub status: ExitStatus,
}

impl Agent {
    /// Starts `health-agent watch --json <args>` and waits until it says it
    /// is attached.
    pub fn start(args: &[&str]) -> Result<Agent> {
        Self::start_mode(&["watch", "--json"], args, None)
    }

    /// [`Agent::start`] in a mount namespace of the test's own.
    pub fn start_in(mounts: &PrivateMounts, args: &[&str]) -> Result<Agent> {
        Self::start_mode(&["watch", "--json"], args, Some(mounts))
    }

    /// Starts `health-agent run <args>` (cluster mode, which prints no
    /// events on stdout) and waits until it says it is attached. Proxy
    /// variables are removed: the fake API server is on loopback.
    pub fn start_cluster(args: &[&str]) -> Result<Agent> {
        Self::start_mode(&["run"], args, None)
    }

    fn start_mode(mode: &[&str], args: &[&str], mounts: Option<&PrivateMounts>) -> Result<Agent> {
        let bin = agent_bin()?;
        // Pinned state outlives the agent: a test that does not ask for it
        // (with its own --pin-dir, see `crate::bpffs`) must leave nothing
        // behind for the next test to adopt.
        let no_pin: &[&str] = if args.contains(&"--pin-dir") {
            &[]
        } else {
            &["--no-pin"]
        };
        let mut command = agent_command(&bin);
        if let Some(mounts) = mounts {
            mounts.enter(&mut command)?;
        }
        let mut child = command
            .args(mode)
            .args(args)
            .args(no_pin)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().context("agent stdout")?;
        let stderr = child.stderr.take().context("agent stderr")?;

        let (tx, events) = mpsc::channel();
        let stdout_reader = std::thread::spawn(move || -> Result<()> {
            for line in BufReader::new(stdout).lines() {
                let line = line.context("reading agent stdout")?;
                let v: Value = serde_json::from_str(&line)
                    .with_context(|| format!("agent printed a non-JSON line: {line:?}"))?;
                if tx.send(v).is_err() {
                    break;
                }
            }
            Ok(())
        });
        let (ready_tx, ready_rx) = mpsc::channel();
        let stderr_live = Arc::new(Mutex::new(String::new()));
        let live = Arc::clone(&stderr_live);
        let stderr_reader = std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("volume-health: ready") {
                    let _ = ready_tx.send(());
                }
                text.push_str(&line);
                text.push('\n');
                if let Ok(mut l) = live.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
            text
        });
        let agent = Agent {
            child,
            events,
            seen: Vec::new(),
            stdout_reader: Some(stdout_reader),
            stderr_reader: Some(stderr_reader),
            stderr_live,
        };
        if ready_rx.recv_timeout(READY_TIMEOUT).is_err() {
            let run = agent.stop()?;
            bail!(
                "the agent did not become ready within {READY_TIMEOUT:?} ({}):\n{}",
                run.status,
                run.stderr
            );
        }
        Ok(agent)
    }

    fn pump(&mut self, wait: Duration) {
        if let Ok(v) = self.events.recv_timeout(wait) {
            self.seen.push(v);
            while let Ok(v) = self.events.try_recv() {
                self.seen.push(v);
            }
        }
    }

    /// Waits until the events matching `filter` add up to at least `count`
    /// (by their `count` field), or `timeout` passes; returns the sum.
    pub fn wait_for_count(&mut self, filter: &EventFilter, count: u64, timeout: Duration) -> u64 {
        let start = Instant::now();
        loop {
            let sum = filter.sum(&self.seen);
            if sum >= count || start.elapsed() >= timeout {
                return sum;
            }
            self.pump(Duration::from_millis(50));
        }
    }

    /// Waits until the agent's stderr contains `needle` (e.g. a source it
    /// attaches later), or `timeout` passes; returns whether it did.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            if self
                .stderr_live
                .lock()
                .map(|s| s.contains(needle))
                .unwrap_or(false)
            {
                return true;
            }
            if start.elapsed() >= timeout {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The agent's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Events received so far.
    pub fn events(&mut self) -> &[Value] {
        self.pump(Duration::ZERO);
        &self.seen
    }

    /// SIGTERM, then everything it printed. The agent detaches and reports
    /// its last exact counts before exiting.
    pub fn stop(self) -> Result<AgentRun> {
        self.signal(nix::sys::signal::Signal::SIGTERM)
    }

    /// SIGKILL (as the OOM killer or a forced pod deletion would), then
    /// everything it printed before it died.
    pub fn kill(self) -> Result<AgentRun> {
        self.signal(nix::sys::signal::Signal::SIGKILL)
    }

    fn signal(mut self, signal: nix::sys::signal::Signal) -> Result<AgentRun> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, signal);
        let deadline = Instant::now() + Duration::from_secs(20);
        let status = loop {
            if let Some(s) = self.child.try_wait().context("waiting for the agent")? {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                bail!("the agent did not exit within 20 s of {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(h) = self.stdout_reader.take() {
            h.join()
                .map_err(|_| anyhow::anyhow!("stdout reader panicked"))??;
        }
        while let Ok(v) = self.events.try_recv() {
            self.seen.push(v);
        }
        let stderr = self
            .stderr_reader
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        Ok(AgentRun {
            events: std::mem::take(&mut self.seen),
            stderr,
            status,
        })
    }
}

impl Agent {
    /// Lets in-flight completions land, stops the agent and checks that it
    /// exited cleanly (detached, final totals printed, status 0).
    pub fn stop_cleanly(self) -> Result<AgentRun> {
        std::thread::sleep(Duration::from_millis(200));
        let run = self.stop()?;
        if !run.status.success() {
            bail!("agent exited with {}:\n{}", run.status, run.stderr);
        }
        Ok(run)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if self.stdout_reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Selects events by their JSON fields; unset fields match anything.
#[derive(Clone, Debug, Default)]
pub struct EventFilter {
    pub device: Option<String>,
    pub kind: Option<&'static str>,
    pub op: Option<&'static str>,
    pub errno: Option<i64>,
}

impl EventFilter {
    pub fn device(dev: &str) -> Self {
        Self {
            device: Some(dev.to_string()),
            ..Self::default()
        }
    }
    pub fn kind(mut self, kind: &'static str) -> Self {
        self.kind = Some(kind);
        self
    }
    pub fn op(mut self, op: &'static str) -> Self {
        self.op = Some(op);
        self
    }
    pub fn errno(mut self, errno: i32) -> Self {
        self.errno = Some(errno as i64);
        self
    }

    pub fn matches(&self, e: &Value) -> bool {
        let is = |key: &str, want: Option<&str>| want.is_none_or(|w| e[key].as_str() == Some(w));
        is("device", self.device.as_deref())
            && is("kind", self.kind)
            && is("op", self.op)
            && self.errno.is_none_or(|w| e["errno"].as_i64() == Some(w))
    }

    /// Sum of `count` over the matching events: the number of kernel errors.
    pub fn sum(&self, events: &[Value]) -> u64 {
        events
            .iter()
            .filter(|e| self.matches(e))
            .map(|e| e["count"].as_u64().unwrap_or(0))
            .sum()
    }
}

/// Sum of `count` per (device, kind, op, errno): the shape tests assert on.
pub fn tally(events: &[Value]) -> BTreeMap<(String, String, String, i64), u64> {
    let mut out = BTreeMap::new();
    for e in events {
        let key = (
            e["device"].as_str().unwrap_or("?").to_string(),
            e["kind"].as_str().unwrap_or("?").to_string(),
            e["op"].as_str().unwrap_or("-").to_string(),
            e["errno"].as_i64().unwrap_or(0),
        );
        *out.entry(key).or_insert(0) += e["count"].as_u64().unwrap_or(0);
    }
    out
}

/// A pin directory no agent ever pinned in: what `volumes` reads when a
/// test gives it none, instead of whatever an agent left pinned on the host
/// (a developer's, or the README's `cargo xtask run`).
pub fn no_pins() -> String {
    std::env::temp_dir()
        .join("volume-health-tests-no-pins")
        .to_string_lossy()
        .into_owned()
}

/// Runs `health-agent volumes --json` and returns its array, bounded by a
/// generous deadline so that a hang fails the test instead of stalling it.
/// Without `--pin-dir` in `extra` it reads [`no_pins`].
/// Where [`volumes_json`] asks for a running agent unless told otherwise:
/// a path nothing serves.
pub fn no_agent_socket() -> PathBuf {
    std::env::temp_dir().join("volume-health-no-agent.sock")
}

pub fn volumes_json(root: &str, extra: &[&str]) -> Result<(Vec<Value>, Duration, String)> {
    let started = Instant::now();
    let no_pins = no_pins();
    let pins: &[&str] = if extra.contains(&"--pin-dir") {
        &[]
    } else {
        &["--pin-dir", &no_pins]
    };
    // Never an agent that happens to run on this host (its default socket).
    let no_agent = no_agent_socket();
    let no_agent = no_agent.to_string_lossy();
    let socket: &[&str] = if extra.contains(&"--agent-socket") {
        &[]
    } else {
        &["--agent-socket", &no_agent]
    };
    let mut child = agent_command(&agent_bin()?)
        .args(["volumes", "--json", "--kubelet-root", root])
        .args(extra)
        .args(pins)
        .args(socket)
        .env("HEALTH_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let deadline = started + Duration::from_secs(60);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("`health-agent volumes` did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let took = started.elapsed();
    let out = child.wait_with_output()?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "volumes failed ({}):\n{stderr}",
        out.status
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("not JSON: {}", String::from_utf8_lossy(&out.stdout)))?;
    let arr = v
        .as_array()
        .context("volumes --json prints an array")?
        .clone();
    Ok((arr, took, stderr))
}
