//! One `health-controller` replica as a child process: its command
//! line ([`Replica`]), its stderr collected as it comes, and its end by
//! SIGTERM or SIGKILL.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::CSI_NS;

/// How long a controller may take to exit after SIGTERM (it releases the
/// Lease and flushes its Events first, within a few seconds).
const EXIT_TIMEOUT: Duration = Duration::from_secs(20);

/// One controller replica's command line. The defaults make a test's
/// cycles fast: a cycle a second, 2 s node grace, a 3 s Lease, Event
/// updates at most once a second, CSI calls given up after a second.
#[derive(Clone, Debug)]
pub struct Replica {
    pub identity: String,
    pub csi_address: PathBuf,
    pub list_page_size: u32,
    pub call_timeout_secs: u32,
    pub lease_duration_secs: u32,
    pub monitor_interval_secs: u32,
    /// `--metrics-addr`: any free port unless a test reads the metrics.
    pub metrics_addr: String,
}

impl Replica {
    pub fn new(identity: &str, csi_address: &Path) -> Replica {
        Replica {
            identity: identity.to_string(),
            csi_address: csi_address.to_path_buf(),
            list_page_size: 500,
            call_timeout_secs: 1,
            lease_duration_secs: 3,
            monitor_interval_secs: 1,
            metrics_addr: "127.0.0.1:0".into(),
        }
    }

    /// `--lease-duration` (3 s by default).
    pub fn lease_duration(mut self, secs: u32) -> Replica {
        self.lease_duration_secs = secs;
        self
    }

    /// Serves `/metrics` on `addr`.
    pub fn metrics_addr(mut self, addr: std::net::SocketAddr) -> Replica {
        self.metrics_addr = addr.to_string();
        self
    }

    /// `--monitor-interval` (a cycle every second by default).
    pub fn monitor_interval(mut self, secs: u32) -> Replica {
        self.monitor_interval_secs = secs;
        self
    }

    pub fn list_page_size(mut self, n: u32) -> Replica {
        self.list_page_size = n;
        self
    }

    fn args(&self, kubeconfig: &Path) -> Vec<String> {
        let mut args: Vec<String> = vec!["--kubeconfig".into()];
        args.push(kubeconfig.display().to_string());
        args.push("--csi-address".into());
        args.push(self.csi_address.display().to_string());
        for (flag, value) in [
            ("--lease-namespace", CSI_NS.to_string()),
            ("--identity", self.identity.clone()),
            ("--monitor-interval", self.monitor_interval_secs.to_string()),
            ("--node-grace", "2".into()),
            ("--lease-duration", self.lease_duration_secs.to_string()),
            ("--metrics-addr", self.metrics_addr.clone()),
            ("--call-timeout", self.call_timeout_secs.to_string()),
            ("--list-page-size", self.list_page_size.to_string()),
            ("--event-update-interval", "1".into()),
        ] {
            args.push(flag.into());
            args.push(value);
        }
        args
    }
}

/// A running `health-controller`; its stderr is collected as it comes.
/// Dropped without [`ControllerProcess::terminate`], it is killed.
pub struct ControllerProcess {
    identity: String,
    child: Child,
    pub(super) log: Arc<Mutex<String>>,
    reader: Option<JoinHandle<()>>,
}

/// How a controller ended.
#[derive(Debug)]
pub struct Exited {
    pub status: ExitStatus,
    pub log: String,
}

impl ControllerProcess {
    pub(super) fn start(replica: &Replica, kubeconfig: &Path) -> Result<ControllerProcess> {
        let bin = crate::agent::controller_bin()?;
        let mut child = crate::agent::agent_command(&bin)
            .args(replica.args(kubeconfig))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("controller stderr")?;
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Ok(mut l) = sink.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        Ok(ControllerProcess {
            identity: replica.identity.clone(),
            child,
            log,
            reader: Some(reader),
        })
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Its stderr so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// SIGTERM (a pod's graceful stop): it releases the Lease and exits.
    pub fn terminate(self) -> Result<Exited> {
        self.signal(nix::sys::signal::Signal::SIGTERM)
    }

    /// SIGKILL (a node lost, the OOM killer): the Lease stays held until it
    /// expires.
    pub fn kill(self) -> Result<Exited> {
        self.signal(nix::sys::signal::Signal::SIGKILL)
    }

    fn signal(mut self, signal: nix::sys::signal::Signal) -> Result<Exited> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, signal)
            .with_context(|| format!("sending {signal} to controller {}", self.identity))?;
        let deadline = Instant::now() + EXIT_TIMEOUT;
        let status = loop {
            if let Some(s) = self
                .child
                .try_wait()
                .context("waiting for the controller")?
            {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                bail!(
                    "controller {} did not exit within {EXIT_TIMEOUT:?} of {signal}",
                    self.identity
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        Ok(Exited {
            status,
            log: self.log(),
        })
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        if self.reader.is_some() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
