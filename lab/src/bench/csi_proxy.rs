//! `health-agent csi-proxy`: the latency it adds to a kubelet's CSI call.
//!
//! Two drivers: the lab cluster's CSI driver (`csi-loop-driver`, its own
//! process, as the kubelet meets it) and the project's in-process test
//! driver (served on a thread of this process, no process boundary between
//! the benchmark and the driver); the release agent's `csi-proxy` in front
//! of each as its own process, and the agent's conditions socket served
//! here. Each call is made alternately directly and through the
//! proxy (so that drift on the machine hits both alike), on one connection
//! reused and on a new connection per call (what the kubelet does); the
//! added latency is the proxied percentile minus the direct one.
//!
//! NodeGetInfo passes through untouched; NodeGetCapabilities is read and
//! extended; NodeGetVolumeHealth, which neither driver advertises, is
//! answered by the proxy after asking the agent (no direct figure).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_core::conditions::{Condition, Source, Status};
use health_csi::proto;
use health_csi::replay::RawClient;
use health_csi::testing::{DriverMode, TestDriver};
use health_node::conditions_socket;
use xtask::util::say;

use super::stats::Summary;
use super::Tools;

pub struct Config {
    /// Measured calls per (method, connection, path).
    pub calls: u32,
}

/// Calls before measuring: connections, caches and the allocator warm up.
const WARMUP: u32 = 200;
const DRIVER: &str = "loop.csi.volume-health.io";
const VOLUME: &str = "bench-volume";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Connection {
    Reused,
    PerCall,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DriverKind {
    LoopDriver,
    TestDriver,
}

struct Row {
    driver: DriverKind,
    method: &'static str,
    connection: Connection,
    /// Microseconds; `None` where the driver has no such call.
    direct: Option<Summary>,
    proxied: Summary,
}

pub struct ProxyResult {
    calls: u32,
    rows: Vec<Row>,
}

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_for(socket: &Path, child: &mut Child, what: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !socket.exists() {
        if let Some(status) = child.try_wait()? {
            bail!(
                "{what} exited ({status}) before listening on {}",
                socket.display()
            );
        }
        if Instant::now() > deadline {
            bail!("{what} did not listen on {} within 10 s", socket.display());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

pub fn run(tools: &Tools, cfg: &Config) -> Result<ProxyResult> {
    let mut rows = Vec::new();
    for driver in [DriverKind::LoopDriver, DriverKind::TestDriver] {
        rows.extend(run_with(tools, cfg, driver)?);
    }
    Ok(ProxyResult {
        calls: cfg.calls,
        rows,
    })
}

/// A driver serving `socket` until dropped: csi-loop-driver as a child
/// process, or the test driver on a thread and runtime of its own.
enum Driver {
    /// Killed when dropped.
    Process { _child: Proc },
    Thread {
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        thread: Option<std::thread::JoinHandle<Result<()>>>,
    },
}

impl Driver {
    fn start(kind: DriverKind, dir: &Path) -> Result<Driver> {
        let socket = dir.join("csi.sock");
        match kind {
            DriverKind::LoopDriver => {
                let bin = xtask::build::release_test_binary("csi-loop-driver")?;
                let mut child = Proc(
                    Command::new(&bin)
                        .arg(format!("--endpoint=unix://{}", socket.display()))
                        .arg("--node-id=bench")
                        .arg("--state-dir")
                        .arg(dir.join("state"))
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                        .with_context(|| format!("starting {}", bin.display()))?,
                );
                wait_for(&socket, &mut child.0, "csi-loop-driver")?;
                Ok(Driver::Process { _child: child })
            }
            DriverKind::TestDriver => {
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                let (ready, is_ready) = std::sync::mpsc::channel::<()>();
                let dir = dir.to_path_buf();
                let thread = std::thread::spawn(move || -> Result<()> {
                    let runtime = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?;
                    runtime.block_on(async {
                        let _driver = TestDriver::start_named(&dir, DRIVER, DriverMode::LegacyOnly)
                            .await
                            .context("starting the test driver")?;
                        let _ = ready.send(());
                        let _ = stopped.await;
                        Ok(())
                    })
                });
                if is_ready.recv_timeout(Duration::from_secs(10)).is_err() {
                    let outcome = thread.join();
                    bail!("the test driver did not start: {outcome:?}");
                }
                Ok(Driver::Thread {
                    stop: Some(stop),
                    thread: Some(thread),
                })
            }
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        if let Driver::Thread { stop, thread } = self {
            if let Some(stop) = stop.take() {
                let _ = stop.send(());
            }
            if let Some(thread) = thread.take() {
                let _ = thread.join();
            }
        }
    }
}

fn run_with(tools: &Tools, cfg: &Config, kind: DriverKind) -> Result<Vec<Row>> {
    let dir = tempfile::Builder::new()
        .prefix("csi-proxy-bench-")
        .tempdir()?;
    let driver_socket = dir.path().join("csi.sock");
    let proxy_socket = dir.path().join("proxy/csi.sock");
    let agent_socket = dir.path().join("run/conditions.sock");
    let _driver = Driver::start(kind, dir.path())?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the benchmark's runtime")?;
    runtime.block_on(async {
        let agent = conditions_socket::serve(&agent_socket).await?;
        agent.board().set([(
            Some(DRIVER),
            Some(VOLUME),
            vec![condition("BlockIOErrors", "3 write errors (EIO) on sdb")],
        )]);
        let mut proxy = Proc(
            Command::new(&tools.agent)
                .args(["--log", "warn", "csi-proxy", "--listen"])
                .arg(&proxy_socket)
                .arg("--csi-address")
                .arg(&driver_socket)
                .arg("--volume-health-socket")
                .arg(&agent_socket)
                .stdout(Stdio::null())
                .spawn()
                .with_context(|| format!("starting {} csi-proxy", tools.agent.display()))?,
        );
        wait_for(&proxy_socket, &mut proxy.0, "csi-proxy")?;
        let health = proto::NodeGetVolumeHealthRequest {
            volume_id: VOLUME.into(),
            volume_publish_path: "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv/mount"
                .into(),
            staging_target_path: String::new(),
        };
        let health = prost::Message::encode_to_vec(&health);
        let mut rows = Vec::new();
        for connection in [Connection::PerCall, Connection::Reused] {
            for (method, message, direct) in [
                ("NodeGetInfo", &[][..], true),
                ("NodeGetCapabilities", &[][..], true),
                ("NodeGetVolumeHealth", &health[..], false),
            ] {
                say(format!("csi-proxy: {kind:?}, {method}, {connection:?}"));
                let path = format!("/csi.v1.Node/{method}");
                let direct_socket = direct.then_some(driver_socket.as_path());
                let (d, p) = measure(
                    direct_socket,
                    &proxy_socket,
                    &path,
                    message,
                    connection,
                    cfg.calls,
                )
                .await?;
                rows.push(Row {
                    driver: kind,
                    method,
                    connection,
                    direct: d,
                    proxied: p,
                });
            }
        }
        drop(agent);
        Ok(rows)
    })
}

fn condition(reason: &str, message: &str) -> Condition {
    Condition {
        source: Source::Kernel,
        status: Status::DataLoss,
        reason: reason.into(),
        message: message.into(),
        since: std::time::SystemTime::now(),
        last_probe: std::time::SystemTime::now(),
        occurrences: None,
    }
}

/// Calls `path` alternately on `direct` (when given) and `proxy`, after a
/// warm-up; the durations in µs. Every answer must be grpc-status 0.
async fn measure(
    direct: Option<&Path>,
    proxy: &Path,
    path: &str,
    message: &[u8],
    connection: Connection,
    calls: u32,
) -> Result<(Option<Summary>, Summary)> {
    let mut direct_side = match direct {
        Some(socket) => Some(Side::new(socket, connection).await?),
        None => None,
    };
    let mut proxy_side = Side::new(proxy, connection).await?;
    let (mut d, mut p) = (Vec::new(), Vec::new());
    for i in 0..WARMUP + calls {
        if let Some(side) = direct_side.as_mut() {
            let took = side.call(path, message).await?;
            if i >= WARMUP {
                d.push(took);
            }
        }
        let took = proxy_side.call(path, message).await?;
        if i >= WARMUP {
            p.push(took);
        }
    }
    let proxied = Summary::of(&p).context("no proxied calls measured")?;
    Ok((Summary::of(&d), proxied))
}

/// One side of the comparison: a socket, and the connection when reused.
struct Side {
    socket: PathBuf,
    reused: Option<RawClient>,
}

impl Side {
    async fn new(socket: &Path, connection: Connection) -> Result<Side> {
        let reused = match connection {
            Connection::Reused => Some(RawClient::connect(socket).await?),
            Connection::PerCall => None,
        };
        Ok(Side {
            socket: socket.to_path_buf(),
            reused,
        })
    }

    /// One call, connecting first unless the connection is reused; µs.
    async fn call(&mut self, path: &str, message: &[u8]) -> Result<f64> {
        let started = Instant::now();
        let answer = match &self.reused {
            Some(client) => client.call(path, message).await?,
            None => {
                RawClient::connect(&self.socket)
                    .await?
                    .call(path, message)
                    .await?
            }
        };
        let took = started.elapsed().as_secs_f64() * 1e6;
        if answer.grpc_status() != Some("0") {
            bail!("{path} on {} answered {answer:?}", self.socket.display());
        }
        Ok(took)
    }
}

impl ProxyResult {
    /// The worst added p99 of the calls measured both ways, µs.
    fn worst_added_p99(&self) -> f64 {
        self.rows
            .iter()
            .filter_map(|r| r.direct.map(|d| r.proxied.p99 - d.p99))
            .fold(f64::MIN, f64::max)
    }

    pub fn headline(&self) -> String {
        format!(
            "csi-proxy: added latency per call at most {:.0} µs at p99 (goal: 1000 µs)",
            self.worst_added_p99()
        )
    }

    pub fn markdown(&self) -> String {
        let mut out = format!(
            "{} calls of each kind, each alternately directly and through the proxy after {WARMUP} of warm-up; \
             µs from the call to its whole answer (a new connection per call includes connecting and the HTTP/2 handshake, \
             as the kubelet pays them). Added = proxied − direct, percentile by percentile.\n\n\
             | driver | call | connection | direct p50 | direct p99 | proxied p50 | proxied p99 | added p50 | added p99 |\n\
             |---|---|---|---:|---:|---:|---:|---:|---:|\n",
            self.calls
        );
        for r in &self.rows {
            let connection = match r.connection {
                Connection::Reused => "reused",
                Connection::PerCall => "new per call",
            };
            let (dp50, dp99, ap50, ap99) = match r.direct {
                Some(d) => (
                    format!("{:.0}", d.p50),
                    format!("{:.0}", d.p99),
                    format!("{:.0}", r.proxied.p50 - d.p50),
                    format!("{:.0}", r.proxied.p99 - d.p99),
                ),
                None => ("—".into(), "—".into(), "—".into(), "—".into()),
            };
            let driver = match r.driver {
                DriverKind::LoopDriver => "csi-loop-driver",
                DriverKind::TestDriver => "test driver",
            };
            out.push_str(&format!(
                "| {driver} | {} | {connection} | {dp50} | {dp99} | {:.0} | {:.0} | {ap50} | {ap99} |\n",
                r.method, r.proxied.p50, r.proxied.p99
            ));
        }
        out.push_str(&format!(
            "\nWorst added p99: {:.0} µs (goal ≤ 1000 µs). NodeGetVolumeHealth has no direct figure: neither driver advertises it here, \
             and the proxy answers it after asking the agent's socket (a new HTTP/1.1 connection per question): \
             csi-loop-driver runs without --volume-health, the test driver in mode LegacyOnly.\n",
            self.worst_added_p99()
        ));
        out
    }
}
