//! The controller at scale: one health cycle over 10,000 volumes, and the
//! time from a backend condition appearing to the Event on the PVC.
//!
//! Everything is real except the storage: a real kube-apiserver and etcd
//! (`health_tests::envtest`), the release `health-controller` as its
//! own process, and `csi-test-driver` as the CSI driver's controller plugin,
//! another process, driven over stdin. The controller runs with the admin's
//! kubeconfig: a benchmark shortcut (the deployed controller has the RBAC of
//! deploy/, which changes no request it makes).
//!
//! Three measurements:
//! 1. steady cycles with the CSI 1.13 list (ControllerListVolumeHealth,
//!    pages of 500): each cycle's wall time (the controller's
//!    `cycle_duration_seconds`), CSI calls per cycle (the driver's counts),
//!    the controller's memory, and the API requests meanwhile (its own
//!    count, and the API server's `apiserver_request_total`);
//! 2. the same with a driver without any list (both list RPCs
//!    UNIMPLEMENTED): one ControllerGetVolumeHealth per volume, 4 in flight;
//! 3. rounds: a random volume turns abnormal in the driver, the bench times
//!    the Warning Event on its claim arriving on a watch, turns the volume
//!    healthy and times the Normal `<Reason>Cleared`; with the default
//!    `--monitor-interval` (15 s) and with 1 s.
//!
//! Rounds overlap: a new one starts after a random pause of up to half an
//! interval instead of after the previous one ended, so the starts fall at
//! random points of the controller's cycle (what a real fault does) and 10
//! rounds at 15 s fit in about a minute. Each round has its own volume and
//! claim, so rounds never share an Event.

// `audit`, `cluster`, `procs` and `scrape` are shared with the scale
// benchmark (`super::scale`).
pub(crate) mod audit;
pub(crate) mod cluster;
pub(crate) mod procs;
mod report;
mod rounds;
pub(crate) mod scrape;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::envtest::{self, EnvtestError, Options, RealApiServer};
use xtask::build;
use xtask::util::{self, cargo, say, workspace_root};

use self::audit::{AuditLog, Requests};
use self::cluster::{EventLog, NAMESPACE};
use self::procs::{ControllerProc, DriverProc};
use self::rounds::{rounds, Picker};
use self::scrape::{MetricsEndpoint, Samples};
use super::interrupt;
use super::stats::Summary;

/// The driver's name (GetPluginInfo) and the PVs' `spec.csi.driver`.
pub(crate) const DRIVER: &str = "bench.csi.volume-health";
/// The controller's user: an administrator (`system:masters`), a bench
/// shortcut, under its own name so that the audit log tells its requests
/// apart.
pub(crate) const CONTROLLER_USER: &str = "volume-health-controller-bench";
/// The controller's default `--monitor-interval`, measured as such.
const DEFAULT_INTERVAL: f64 = 15.0;
const PAGE_SIZE: u32 = 500;
const GET_CONCURRENCY: usize = 4;
/// The existing controller (external-health-monitor) polls every minute.
const FLOOR_SECS: f64 = 60.0;
/// Reason of the rounds' condition (the Normal is `<Reason>Cleared`).
const REASON: &str = "BenchReplicaLost";
/// Longest wait for the first cycle after a controller starts (it lists
/// every PV first).
const FIRST_CYCLE_TIMEOUT: Duration = Duration::from_secs(180);
const SCRAPE_EVERY: Duration = Duration::from_millis(50);

/// The two binaries this part runs.
pub struct Tools {
    pub controller: PathBuf,
    pub driver: PathBuf,
}

/// Builds the release controller and `csi-test-driver`, or takes
/// HEALTH_CONTROLLER_BIN and CSI_TEST_DRIVER_BIN when both are set.
pub fn prepare() -> Result<Tools> {
    if let (Some(controller), Some(driver)) = (
        std::env::var_os("HEALTH_CONTROLLER_BIN"),
        std::env::var_os("CSI_TEST_DRIVER_BIN"),
    ) {
        let tools = Tools {
            controller: PathBuf::from(controller),
            driver: PathBuf::from(driver),
        };
        for bin in [&tools.controller, &tools.driver] {
            if !bin.is_file() {
                bail!(
                    "{} (from HEALTH_CONTROLLER_BIN / CSI_TEST_DRIVER_BIN) does not exist",
                    bin.display()
                );
            }
        }
        return Ok(tools);
    }
    say("building health-controller and csi-test-driver (release)");
    let controller = build::release_controller()?;
    // Its own build: the `testing` feature adds tonic's server side, which
    // the agent measured here must not be built with.
    util::run(cargo().current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "health-csi",
        "--features",
        "testing",
        "--bin",
        "csi-test-driver",
    ]))?;
    let release = xtask::util::target_dir().join("release");
    Ok(Tools {
        controller,
        driver: release.join("csi-test-driver"),
    })
}

pub struct Config {
    pub volumes: usize,
    pub rounds: u32,
    /// Steady cycles measured per driver.
    pub cycles: u32,
    /// PV creates in flight.
    pub in_flight: usize,
    /// `--monitor-interval` of the Get run (longer than its cycle, so that
    /// the driver's counts are read between two cycles).
    pub get_interval: f64,
}

/// Steady cycles of one controller.
pub struct Cycles {
    pub interval: f64,
    /// Controller start -> first complete cycle (lists every PV first).
    pub first_cycle: Duration,
    /// Seconds, per cycle.
    pub durations: Vec<f64>,
    /// How the measured cycles ended (`complete`...), counted.
    pub results: BTreeMap<String, f64>,
    /// CSI calls over the measured cycles, by RPC (the driver's counts).
    pub csi_calls: BTreeMap<String, f64>,
    /// The controller's `api_requests_total` over them, by verb/resource/code.
    pub controller_requests: BTreeMap<String, f64>,
    /// The controller's requests in the audit log over them.
    pub audited: Requests,
    /// The API server's `apiserver_request_total` over them, by verb and
    /// resource: every client's (the Event writes of anyone).
    pub apiserver_requests: BTreeMap<(String, String), f64>,
    /// From the first measured boundary to the last.
    pub window: Duration,
    pub rss_kb: u64,
    pub hwm_kb: u64,
}

/// Rounds at one interval, seconds.
pub struct Latency {
    pub interval: f64,
    pub warning: Summary,
    pub cleared: Summary,
    /// The controller's requests in the audit log during the rounds.
    pub audited: Requests,
}

pub struct ControllerResult {
    pub volumes: usize,
    pub in_flight: usize,
    pub pv_create: Duration,
    pub apiserver_startup: Duration,
    pub list: Cycles,
    pub get: Cycles,
    pub fast: Latency,
    pub slow: Latency,
}

/// Where kube-apiserver is: HEALTH_K8S_ASSETS, which xtask sets to the
/// project's build of Kubernetes before it runs the benchmarks.
pub(crate) fn assets() -> Result<PathBuf> {
    std::env::var_os(envtest::ASSETS_ENV)
        .map(PathBuf::from)
        .with_context(|| {
            format!(
                "{} is not set: run the benchmarks with `cargo xtask bench`, which builds \
                 Kubernetes and sets it",
                envtest::ASSETS_ENV
            )
        })
}

pub fn run(tools: &Tools, cfg: &Config) -> Result<ControllerResult> {
    let assets = assets()?;
    say(format!(
        "controller: starting kube-apiserver and etcd ({})",
        assets.display()
    ));
    let audit_dir = tempfile::Builder::new()
        .prefix("controller-bench-audit-")
        .tempdir()?;
    let audit = AuditLog::new(audit_dir.path(), CONTROLLER_USER)?;
    let server = interrupt::spawn_shielded(|| {
        let [policy, log] = audit.apiserver_args();
        Options::new()
            .assets(&assets)
            .user(CONTROLLER_USER, &["system:masters"])
            .apiserver_arg(&policy)
            .apiserver_arg(&log)
            .start()
            .map_err(|e| match e {
                EnvtestError::MissingAssets(why) => anyhow::anyhow!(
                    "{why} The controller benchmark needs a real kube-apiserver: set {} to a directory holding one.",
                    envtest::ASSETS_ENV
                ),
                EnvtestError::Failed(e) => e.context("starting kube-apiserver"),
            })
    })?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the benchmark's runtime")?;
    let result = runtime.block_on(measure(tools, cfg, &server, &audit));
    runtime.shutdown_timeout(Duration::from_secs(1));
    result
}

async fn measure(
    tools: &Tools,
    cfg: &Config,
    server: &RealApiServer,
    audit: &AuditLog,
) -> Result<ControllerResult> {
    let client = server.client(server.admin()).await?;
    let controller = server
        .identity(CONTROLLER_USER)
        .context("the controller's identity")?;
    let kubeconfig = server.kubeconfig(controller).to_path_buf();
    cluster::create_namespace(&client).await?;
    cluster::install_volume_health_crd(&client).await?;
    say(format!(
        "controller: creating {} PVs, {} at a time",
        cfg.volumes, cfg.in_flight
    ));
    let pv_create = cluster::create_pvs(&client, DRIVER, cfg.volumes, cfg.in_flight).await?;
    say(format!(
        "controller: {} PVs in {:.1} s",
        cfg.volumes,
        pv_create.as_secs_f64()
    ));
    let events = EventLog::start(&client).await?;
    let dir = tempfile::Builder::new()
        .prefix("controller-bench-")
        .tempdir()?;
    let mut picker = Picker::new(cfg.volumes);

    let list_dir = dir.path().join("list");
    std::fs::create_dir(&list_dir)?;
    let mut driver = DriverProc::start(&tools.driver, &list_dir, DRIVER, cfg.volumes, &[]).await?;
    let run = Run {
        tools,
        audit,
        kubeconfig: &kubeconfig,
        socket: driver.socket().to_path_buf(),
        logs: dir.path(),
        volumes: cfg.volumes,
    };

    say("controller: list driver, --monitor-interval 1: steady cycles, then rounds");
    let mut ctl = run.controller("list-1s", 1.0).await?;
    let list = steady(&mut ctl, &mut driver, &client, cfg.cycles, 1.0).await?;
    let fast = rounds(&mut ctl, &mut driver, &events, &mut picker, cfg.rounds, 1.0).await?;
    ctl.stop().await?;

    say(format!(
        "controller: list driver, --monitor-interval {DEFAULT_INTERVAL} (the default): rounds"
    ));
    let mut ctl = run.controller("list-15s", DEFAULT_INTERVAL).await?;
    let slow = rounds(
        &mut ctl,
        &mut driver,
        &events,
        &mut picker,
        cfg.rounds,
        DEFAULT_INTERVAL,
    )
    .await?;
    ctl.stop().await?;
    driver.stop().await?;

    say(format!(
        "controller: driver without lists, --get-concurrency {GET_CONCURRENCY}, --monitor-interval {}",
        cfg.get_interval
    ));
    let get_dir = dir.path().join("get");
    std::fs::create_dir(&get_dir)?;
    let mut driver = DriverProc::start(
        &tools.driver,
        &get_dir,
        DRIVER,
        cfg.volumes,
        &["ControllerListVolumeHealth", "ListVolumes"],
    )
    .await?;
    let run = Run {
        socket: driver.socket().to_path_buf(),
        ..run
    };
    let mut ctl = run.controller("get", cfg.get_interval).await?;
    let get = steady(&mut ctl, &mut driver, &client, cfg.cycles, cfg.get_interval).await?;
    ctl.stop().await?;
    driver.stop().await?;

    Ok(ControllerResult {
        volumes: cfg.volumes,
        in_flight: cfg.in_flight,
        pv_create,
        apiserver_startup: server.startup_time(),
        list,
        get,
        fast,
        slow,
    })
}

/// What every controller of the run shares.
struct Run<'a> {
    tools: &'a Tools,
    audit: &'a AuditLog,
    kubeconfig: &'a Path,
    socket: PathBuf,
    logs: &'a Path,
    volumes: usize,
}

impl<'a> Run<'a> {
    /// Starts a controller and waits for its first complete cycle over
    /// every volume.
    async fn controller(&self, name: &str, interval: f64) -> Result<Started<'a>> {
        let args: Vec<String> = [
            "--csi-address",
            &self.socket.display().to_string(),
            "--kubeconfig",
            &self.kubeconfig.display().to_string(),
            "--monitor-interval",
            &interval.to_string(),
            "--list-page-size",
            &PAGE_SIZE.to_string(),
            "--get-concurrency",
            &GET_CONCURRENCY.to_string(),
            "--lease-namespace",
            NAMESPACE,
            // One identity for every run: each stops gracefully, giving up
            // the Lease, so the next one leads at once.
            "--identity",
            "bench-controller",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let log = self.logs.join(format!("controller-{name}.log"));
        let mut proc = ControllerProc::start(&self.tools.controller, &args, &log)?;
        let metrics = MetricsEndpoint::new(proc.metrics);
        let deadline = Instant::now() + FIRST_CYCLE_TIMEOUT;
        let mut last = "no /metrics yet".to_string();
        loop {
            interrupt::check()?;
            proc.check_running()?;
            // Errors until its HTTP server is up.
            if let Ok(s) = metrics.scrape().await {
                let complete = s.sum(
                    "volume_health_controller_cycles_total",
                    &[("result", "complete")],
                );
                let monitored = s.sum("volume_health_controller_volumes_monitored", &[]);
                if complete >= 1.0 && monitored as usize == self.volumes {
                    break;
                }
                last = format!("{complete} complete cycles, {monitored} volumes monitored");
            }
            if Instant::now() >= deadline {
                bail!(
                    "no complete cycle over {} volumes within {FIRST_CYCLE_TIMEOUT:?} (last seen: {last}); the controller's log:\n{}",
                    self.volumes,
                    proc.log_tail(30)
                );
            }
            tokio::time::sleep(SCRAPE_EVERY).await;
        }
        Ok(Started {
            first_cycle: proc.started.elapsed(),
            proc,
            metrics,
            audit: self.audit,
        })
    }
}

/// A controller past its first cycle.
struct Started<'a> {
    proc: ControllerProc,
    metrics: MetricsEndpoint,
    first_cycle: Duration,
    audit: &'a AuditLog,
}

impl Started<'_> {
    async fn stop(self) -> Result<()> {
        self.proc.stop().await.map(drop)
    }

    /// Waits until a cycle ends after the one counted in `after` (or the
    /// current one): the scrape right after it.
    async fn next_cycle(&mut self, after: Option<f64>, interval: f64) -> Result<Samples> {
        let count =
            |s: &Samples| s.sum("volume_health_controller_cycle_duration_seconds_count", &[]);
        let after = match after {
            Some(c) => c,
            None => count(&self.metrics.scrape().await?),
        };
        // Two intervals and a slow cycle's worth of margin.
        let deadline = Instant::now() + Duration::from_secs_f64(2.0 * interval + 120.0);
        loop {
            interrupt::check()?;
            self.proc.check_running()?;
            let s = self.metrics.scrape().await?;
            if count(&s) > after {
                return Ok(s);
            }
            if Instant::now() >= deadline {
                bail!(
                    "no cycle ended within {:.0} s; the controller's log:\n{}",
                    2.0 * interval + 120.0,
                    self.proc.log_tail(30)
                );
            }
            tokio::time::sleep(SCRAPE_EVERY).await;
        }
    }
}

/// `cycles` steady cycles, each read right after it ended (so the driver's
/// counts fall between two cycles as long as a cycle is shorter than the
/// interval).
async fn steady(
    ctl: &mut Started<'_>,
    driver: &mut DriverProc,
    client: &kube::Client,
    cycles: u32,
    interval: f64,
) -> Result<Cycles> {
    let count = |s: &Samples| s.sum("volume_health_controller_cycle_duration_seconds_count", &[]);
    let sum = |s: &Samples| s.sum("volume_health_controller_cycle_duration_seconds_sum", &[]);
    let first = ctl.next_cycle(None, interval).await?;
    let began = Instant::now();
    let mark = ctl.audit.mark()?;
    let calls0 = driver.calls().await?;
    let api0 = cluster::requests_by_resource(&scrape::apiserver(client).await?);
    let mut durations = Vec::new();
    let mut prev = first.clone();
    while durations.len() < cycles as usize {
        let s = ctl.next_cycle(Some(count(&prev)), interval).await?;
        let n = count(&s) - count(&prev);
        // Polled every 50 ms: two cycles ending in between share their mean.
        let each = (sum(&s) - sum(&prev)) / n;
        durations.extend(std::iter::repeat_n(each, n as usize));
        prev = s;
    }
    let calls1 = driver.calls().await?;
    let api1 = cluster::requests_by_resource(&scrape::apiserver(client).await?);
    let window = began.elapsed();
    let audited = ctl.audit.since(mark)?;
    let by = |s: &Samples, name: &str, keys: &[&str]| -> BTreeMap<String, f64> {
        s.matching(name, &[])
            .map(|(labels, v)| {
                let key: Vec<&str> = keys
                    .iter()
                    .map(|k| labels.get(*k).map_or("", String::as_str))
                    .collect();
                (key.join(" "), v)
            })
            .collect()
    };
    let as_f64 = |m: &BTreeMap<String, u64>| -> BTreeMap<String, f64> {
        m.iter().map(|(k, v)| (k.clone(), *v as f64)).collect()
    };
    let results_name = "volume_health_controller_cycles_total";
    let requests_name = "volume_health_controller_api_requests_total";
    let request_keys = ["verb", "resource", "code"];
    Ok(Cycles {
        interval,
        first_cycle: ctl.first_cycle,
        results: cluster::diff(
            &by(&first, results_name, &["result"]),
            &by(&prev, results_name, &["result"]),
        ),
        csi_calls: cluster::diff(&as_f64(&calls0), &as_f64(&calls1)),
        controller_requests: cluster::diff(
            &by(&first, requests_name, &request_keys),
            &by(&prev, requests_name, &request_keys),
        ),
        audited,
        apiserver_requests: cluster::diff(&api0, &api1),
        durations,
        window,
        rss_kb: ctl.proc.status_kb("VmRSS")?,
        hwm_kb: ctl.proc.status_kb("VmHWM")?,
    })
}
