//! The two processes the controller benchmark runs beside the API server:
//! `csi-test-driver` (driven over stdin) and `health-controller`
//! (read through /metrics and /proc).
//!
//! Both get their own process group, so a terminal Ctrl-C reaches only
//! xtask, which stops them from the Drop guards; both die with xtask
//! (PR_SET_PDEATHSIG) if it dies without stopping them.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt as _, AsyncWriteExt as _, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};

/// How long a driver command may take to be answered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the controller may take to give up its lease and exit.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// Makes `cmd` a child that dies with us and that the terminal's signals
/// miss.
fn detach(cmd: &mut Command) {
    cmd.process_group(0);
    // SAFETY: prctl is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The last `lines` lines of a log file.
fn tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `csi-test-driver`, serving `volumes` healthy volumes on `DIR/csi.sock`.
pub struct DriverProc {
    child: tokio::process::Child,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
    socket: PathBuf,
    log: PathBuf,
}

impl DriverProc {
    /// Starts it (GetPluginInfo answers `name`) and waits for its `ready`
    /// line. `unimplemented` RPCs
    /// answer UNIMPLEMENTED whatever the mode.
    pub async fn start(
        bin: &Path,
        dir: &Path,
        name: &str,
        volumes: usize,
        unimplemented: &[&str],
    ) -> Result<DriverProc> {
        let log = dir.join("csi-test-driver.log");
        let mut cmd = Command::new(bin);
        cmd.arg("--dir")
            .arg(dir)
            .args(["--name", name, "--mode", "modern"])
            .args(["--volumes", &volumes.to_string()]);
        if !unimplemented.is_empty() {
            cmd.args(["--unimplemented", &unimplemented.join(",")]);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(
            std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?,
        );
        detach(&mut cmd);
        let mut cmd = tokio::process::Command::from(cmd);
        cmd.kill_on_drop(true);
        let mut child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdin = child.stdin.take().context("driver stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("driver stdout")?).lines();
        let mut driver = DriverProc {
            child,
            stdin,
            stdout,
            socket: dir.join("csi.sock"),
            log,
        };
        let ready = driver.line().await?;
        let expected = format!("ready {}", driver.socket.display());
        if ready != expected {
            bail!("csi-test-driver said {ready:?}, not {expected:?}");
        }
        Ok(driver)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    async fn line(&mut self) -> Result<String> {
        match tokio::time::timeout(ANSWER_TIMEOUT, self.stdout.next_line()).await {
            Ok(Ok(Some(line))) => Ok(line),
            Ok(Ok(None)) => bail!(
                "csi-test-driver closed its stdout; its stderr:\n{}",
                tail(&self.log, 20)
            ),
            Ok(Err(e)) => Err(e).context("reading csi-test-driver's stdout"),
            Err(_) => bail!("csi-test-driver did not answer within {ANSWER_TIMEOUT:?}"),
        }
    }

    /// One command, one answer line.
    pub async fn ask(&mut self, command: &str) -> Result<String> {
        self.stdin
            .write_all(format!("{command}\n").as_bytes())
            .await
            .context("writing to csi-test-driver")?;
        self.stdin
            .flush()
            .await
            .context("writing to csi-test-driver")?;
        self.line().await
    }

    /// A command answered `ok`, or an error naming the answer.
    pub async fn command(&mut self, command: &str) -> Result<()> {
        match self.ask(command).await?.as_str() {
            "ok" => Ok(()),
            other => bail!("csi-test-driver answered {other:?} to {command:?}"),
        }
    }

    /// Every RPC's count since the driver started.
    pub async fn calls(&mut self) -> Result<BTreeMap<String, u64>> {
        let answer = self.ask("calls").await?;
        serde_json::from_str(&answer).with_context(|| format!("csi-test-driver's calls {answer:?}"))
    }

    pub async fn stop(mut self) -> Result<()> {
        // End of input stops it; `quit` says so explicitly.
        let _ = self.stdin.write_all(b"quit\n").await;
        match tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await {
            Ok(status) => {
                let status = status.context("waiting for csi-test-driver")?;
                if !status.success() {
                    bail!(
                        "csi-test-driver exited with {status}:\n{}",
                        tail(&self.log, 20)
                    );
                }
                Ok(())
            }
            Err(_) => bail!("csi-test-driver did not exit within 5 s of `quit`"),
        }
    }
}

/// `health-controller`, its output in a log file.
pub struct ControllerProc {
    child: Child,
    pid: i32,
    log: PathBuf,
    pub metrics: SocketAddr,
    pub started: Instant,
    stopped: bool,
}

impl ControllerProc {
    /// Starts `bin <args> --metrics-addr 127.0.0.1:<free port>`.
    pub fn start(bin: &Path, args: &[String], log: &Path) -> Result<ControllerProc> {
        // A port the kernel just handed out and we let go: nothing else on
        // this machine binds loopback ports at random in between.
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .context("finding a free port for the controller's /metrics")?;
        let out =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .args(["--metrics-addr", &metrics.to_string()])
            .env("HEALTH_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        detach(&mut cmd);
        let started = Instant::now();
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = i32::try_from(child.id()).context("controller pid out of range")?;
        Ok(ControllerProc {
            child,
            pid,
            log: log.to_path_buf(),
            metrics,
            started,
            stopped: false,
        })
    }

    /// A `kB` field of /proc/<pid>/status (`VmRSS`, `VmHWM`).
    pub fn status_kb(&self, name: &str) -> Result<u64> {
        let path = format!("/proc/{}/status", self.pid);
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .with_context(|| format!("{path}: no {name}"))
    }

    /// Its log so far, the last `lines` lines.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.log, lines)
    }

    /// An error if it exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait().context("polling the controller")? {
            self.stopped = true;
            bail!(
                "the controller exited with {status}; its log:\n{}",
                self.log_tail(30)
            );
        }
        Ok(())
    }

    /// SIGTERM (it gives up its lease), then its exit status.
    pub async fn stop(mut self) -> Result<ExitStatus> {
        let status = self.terminate().await?;
        if !status.success() {
            bail!(
                "the controller exited with {status}; its log:\n{}",
                self.log_tail(30)
            );
        }
        Ok(status)
    }

    async fn terminate(&mut self) -> Result<ExitStatus> {
        self.stopped = true;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .try_wait()
                .context("waiting for the controller")?
            {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("the controller did not exit within {STOP_TIMEOUT:?} of SIGTERM; killed it");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for ControllerProc {
    fn drop(&mut self) {
        if !self.stopped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
