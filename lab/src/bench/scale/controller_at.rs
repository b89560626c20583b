//! The controller at N PVs: the release `health-controller` (as the
//! controller benchmark runs it, behind a counting proxy) with
//! `csi-test-driver` serving the N volumes' health list, every 100th
//! volume `Degraded` (1 % unhealthy: Events, `VolumeHealth` objects and
//! `healthStatus` writes for those): how long its first list of every PV
//! takes, its first and steady cycles, its memory, and its Node watch.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::real_cluster::Cluster;

use super::proxy::CountingProxy;
use crate::bench::controller::audit::{AuditLog, Requests};
use crate::bench::controller::cluster::handle;
use crate::bench::controller::procs::{ControllerProc, DriverProc};
use crate::bench::controller::scrape::{MetricsEndpoint, Samples};
use crate::bench::controller::{Tools, CONTROLLER_USER, DRIVER};
use crate::bench::interrupt;

/// The controller bench's namespace for the Lease.
const LEASE_NAMESPACE: &str = "bench";
const INTERVAL: f64 = 5.0;
const CYCLES: usize = 3;
const FIRST_CYCLE_TIMEOUT: Duration = Duration::from_secs(600);
/// One volume in this many is unhealthy.
const UNHEALTHY_EVERY: usize = 100;

pub struct ControllerAt {
    pub volumes: usize,
    /// Volumes the driver says are `Degraded`, all seen abnormal by the
    /// controller before its steady cycles were measured.
    pub unhealthy: usize,
    /// Start -> first complete cycle over every volume.
    pub first_cycle: Duration,
    /// The PV list's pages (audit log) and from the first page asked to
    /// the last answered.
    pub pv_pages: usize,
    pub pv_list: Duration,
    /// The Node list's pages and time, and whether the Node watch started.
    pub node_pages: usize,
    pub node_list: Duration,
    pub node_watches: usize,
    /// Steady cycles (the controller's histogram), seconds.
    pub cycles: Vec<f64>,
    /// Bytes received from the API server up to the first cycle.
    pub received: u64,
    pub rss_kb: u64,
    pub hwm_kb: u64,
    /// Its requests from start to the last steady cycle.
    pub requests: Requests,
}

fn timestamp(v: &serde_json::Value) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(v.as_str()?, &time::format_description::well_known::Rfc3339).ok()
}

/// Pages, span and watches of one resource's list in audit entries.
fn list_of(entries: &[serde_json::Value], resource: &str) -> (usize, Duration, usize) {
    let of = |e: &&serde_json::Value| {
        e["objectRef"]["resource"].as_str() == Some(resource)
            && e["user"]["username"].as_str() == Some(CONTROLLER_USER)
    };
    let lists: Vec<&serde_json::Value> = entries
        .iter()
        .filter(of)
        .filter(|e| e["verb"] == "list" && e["stage"] == "ResponseComplete")
        .collect();
    let watches = entries
        .iter()
        .filter(of)
        .filter(|e| e["verb"] == "watch" && e["stage"] == "ResponseStarted")
        .count();
    let first = lists
        .iter()
        .filter_map(|e| timestamp(&e["requestReceivedTimestamp"]))
        .min();
    let last = lists
        .iter()
        .filter_map(|e| timestamp(&e["stageTimestamp"]))
        .max();
    let span = match (first, last) {
        (Some(a), Some(b)) => Duration::try_from(b - a).unwrap_or_default(),
        _ => Duration::ZERO,
    };
    (lists.len(), span, watches)
}

pub fn run(
    cluster: &Cluster,
    tools: &Tools,
    audit: &AuditLog,
    volumes: usize,
    work: &Path,
) -> Result<ControllerAt> {
    let dir = work.join(format!("controller-{volumes}"));
    std::fs::create_dir_all(&dir)?;
    let who = cluster
        .server
        .identity(CONTROLLER_USER)
        .context("the controller's identity")?;
    let upstream = super::proxy::upstream(cluster.server.url())?;
    cluster.block_on(async {
        let proxy = CountingProxy::start(upstream).await?;
        let kubeconfig =
            proxy.kubeconfig(cluster.server.kubeconfig(who), dir.join("controller.kubeconfig"))?;
        let mut driver = DriverProc::start(&tools.driver, &dir, DRIVER, volumes, &[]).await?;
        let unhealthy = (0..volumes).step_by(UNHEALTHY_EVERY).count();
        for i in (0..volumes).step_by(UNHEALTHY_EVERY) {
            let h = handle(i);
            driver
                .command(&format!("health {h} Degraded ReplicaLost replica 2 of 3 of {h} lost"))
                .await?;
        }
        let args: Vec<String> = [
            "--csi-address",
            &driver.socket().display().to_string(),
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--monitor-interval",
            &INTERVAL.to_string(),
            "--list-page-size",
            "500",
            "--lease-namespace",
            LEASE_NAMESPACE,
            "--identity",
            "scale-controller",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mark = audit.mark()?;
        let mut proc = ControllerProc::start(&tools.controller, &args, &dir.join("controller.log"))?;
        let metrics = MetricsEndpoint::new(proc.metrics);
        let count = |s: &Samples| s.sum("volume_health_controller_cycle_duration_seconds_count", &[]);
        let sum = |s: &Samples| s.sum("volume_health_controller_cycle_duration_seconds_sum", &[]);
        let deadline = Instant::now() + FIRST_CYCLE_TIMEOUT;
        let first = loop {
            interrupt::check()?;
            proc.check_running()?;
            if let Ok(s) = metrics.scrape().await {
                let complete = s.sum("volume_health_controller_cycles_total", &[("result", "complete")]);
                let monitored = s.sum("volume_health_controller_volumes_monitored", &[]);
                let abnormal = s.sum("volume_health_controller_volumes_abnormal", &[]);
                if complete >= 1.0 && monitored as usize == volumes && abnormal as usize == unhealthy {
                    break s;
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "no complete cycle over {volumes} volumes within {FIRST_CYCLE_TIMEOUT:?}; the controller's log:\n{}",
                    proc.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let first_cycle = proc.started.elapsed();
        let received = proxy.received();
        let mut cycles = Vec::new();
        let mut prev = first;
        while cycles.len() < CYCLES {
            interrupt::check()?;
            proc.check_running()?;
            let s = metrics.scrape().await?;
            let n = count(&s) - count(&prev);
            if n >= 1.0 {
                let each = (sum(&s) - sum(&prev)) / n;
                cycles.extend(std::iter::repeat_n(each, n as usize));
                prev = s;
            }
            if proc.started.elapsed() > FIRST_CYCLE_TIMEOUT + Duration::from_secs_f64(8.0 * INTERVAL) {
                bail!("the controller's steady cycles did not come; its log:\n{}", proc.log_tail(30));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let rss_kb = proc.status_kb("VmRSS")?;
        let hwm_kb = proc.status_kb("VmHWM")?;
        // Watches started are logged at once; the lists have ended.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let entries = audit.entries_since(mark)?;
        let requests = audit.since(mark)?;
        let (pv_pages, pv_list, _) = list_of(&entries, "persistentvolumes");
        let (node_pages, node_list, node_watches) = list_of(&entries, "nodes");
        proc.stop().await?;
        driver.stop().await?;
        drop(proxy);
        Ok(ControllerAt {
            volumes,
            unhealthy,
            first_cycle,
            pv_pages,
            pv_list,
            node_pages,
            node_list,
            node_watches,
            cycles,
            received,
            rss_kb,
            hwm_kb,
            requests,
        })
    })
}
