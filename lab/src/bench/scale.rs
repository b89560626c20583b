//! The agent's and the controller's API footprint as the cluster grows
//! (issue 29): a real kube-apiserver and etcd populated like a busy
//! cluster (realistic CSI PVs, bound claims, 2,000 pods on 200 nodes,
//! other nodes' agent Events and `VolumeHealth` objects, kubelet Events),
//! the PVs growing from 1,000 to 10,000 to 100,000 between measurements.
//!
//! At each size:
//! 1. one release `health-agent run` (node-001's, 10 pods with a CSI
//!    volume each, as its ServiceAccount under deploy/'s RBAC) started
//!    from nothing: its requests (the audit log, kept for the agents' and
//!    the controller's users only), the bytes it received (a counting TCP
//!    proxy in front of the server: exact per client, watch streams and
//!    TLS included; `apiserver_response_sizes` gives the breakdown by
//!    resource but mixes clients and leaves watches out), its RSS once its
//!    traffic stopped, and its time to ready (/readyz: kernel programs
//!    attached, first lists done);
//! 2. at one size (`--scale-agents-at`), many agents at once, one per
//!    node identity (node-001 to node-NNN, each with its own kubelet tree),
//!    real processes with their kernel programs: the server's CPU seconds
//!    (/proc) over the start beyond what it spends idle, requests and
//!    bytes, per agent, and what 5,000 nodes would cost;
//! 3. the release `health-controller` with `csi-test-driver` serving every
//!    volume: its PV list, first and steady cycles, RSS, Node watch.

mod controller_at;
mod node;
mod populate;
mod proxy;
mod start;

use std::time::Duration;

use anyhow::{Context, Result};
use health_node::cluster::API_ACCESS;
use health_tests::envtest::{service_account_user, Options};
use health_tests::real_cluster::{Cluster, AGENT_NS, AGENT_SA};
use xtask::util::say;

use self::controller_at::ControllerAt;
use self::start::{Ctx, Start};
use super::controller::audit::{self, AuditLog};
use super::controller::{self, CONTROLLER_USER};
use super::interrupt;
use super::stats::Summary;

pub struct Config {
    /// PV counts, measured in this order (each a superset of the last).
    pub pvs: Vec<usize>,
    /// Starts of the single agent per size.
    pub starts: u32,
    /// Agents started at once, and at which PV count (0 agents: none).
    pub agents: usize,
    pub agents_at: usize,
    /// Creates in flight while populating.
    pub in_flight: usize,
    /// Also let the agents list and watch PVs (an agent built before issue
    /// 29 needs it; deploy/'s RBAC no longer grants it).
    pub grant_pv_list: bool,
}

pub struct Tools<'a> {
    pub agent: &'a std::path::Path,
    /// The controller is measured at each size when given.
    pub controller: Option<&'a controller::Tools>,
}

/// Everything measured at one PV count.
pub struct AtSize {
    pub pvs: usize,
    pub populate: Duration,
    pub pv_bytes: usize,
    pub starts: Vec<Start>,
    pub many: Option<Start>,
    pub controller: Option<ControllerAt>,
}

pub struct ScaleResult {
    /// The server's `gitVersion` (`/version`).
    pub apiserver_version: String,
    pub apiserver_startup: Duration,
    pub base: Vec<(&'static str, usize, Duration)>,
    pub in_flight: usize,
    pub sizes: Vec<AtSize>,
}

pub fn run(tools: &Tools<'_>, cfg: &Config) -> Result<ScaleResult> {
    let mut pvs = cfg.pvs.clone();
    pvs.sort_unstable();
    pvs.dedup();
    anyhow::ensure!(!pvs.is_empty(), "--scale-pvs names no size");
    anyhow::ensure!(
        cfg.agents < populate::FIRST_OTHER_NODE,
        "--scale-agents must be below {}: the nodes from there on are the other nodes",
        populate::FIRST_OTHER_NODE
    );
    let assets = controller::assets()?;
    say(format!(
        "scale: starting kube-apiserver and etcd ({})",
        assets.display()
    ));
    let audit_dir = tempfile::Builder::new()
        .prefix("scale-bench-audit-")
        .tempdir()?;
    let agent_user = service_account_user(AGENT_NS, AGENT_SA);
    let audit = AuditLog::for_users(audit_dir.path(), &[&agent_user, CONTROLLER_USER])?;
    let server = interrupt::spawn_shielded(|| {
        let [policy, log] = audit.apiserver_args();
        Options::new()
            .assets(&assets)
            .service_account(AGENT_NS, AGENT_SA)
            .user(CONTROLLER_USER, &["system:masters"])
            .apiserver_arg(&policy)
            .apiserver_arg(&log)
            .start()
            .map_err(|e| anyhow::anyhow!("{e:#}"))
            .context("starting kube-apiserver (HEALTH_K8S_ASSETS)")
    })?;
    let apiserver_startup = server.startup_time();
    // deploy/ as it ships, the agent's calls allowed.
    let cluster = Cluster::prepare(server, API_ACCESS)?;
    let apiserver_version = cluster
        .block_on(cluster.admin.apiserver_version())
        .context("asking the API server its version")?
        .git_version;
    let work = tempfile::Builder::new().prefix("scale-bench-").tempdir()?;
    let admin = cluster.admin.clone();
    let who = cluster
        .server
        .service_account(AGENT_NS, AGENT_SA)
        .context("the agent's identity")?;
    if cfg.grant_pv_list {
        say("scale: granting the agents list and watch of PVs (--scale-grant-pv-list)");
        cluster.block_on(grant_pv_list(&admin, who))?;
    }
    cluster.block_on(controller::cluster::create_namespace(&admin))?;
    say("scale: populating the cluster (namespaces, nodes, claims, pods, Events, VolumeHealth)");
    let base = cluster.block_on(populate::base(&admin, cfg.in_flight))?;
    for (what, n, took) in &base.took {
        say(format!("scale: {n} {what} in {:.1} s", took.as_secs_f64()));
    }
    let ctx = Ctx {
        cluster: &cluster,
        agent: tools.agent,
        audit: &audit,
        kubeconfig: cluster.server.kubeconfig(who).to_path_buf(),
        upstream: proxy::upstream(cluster.server.url())?,
        pod_uids: &base.pod_uids,
        work: work.path(),
    };
    let mut sizes = Vec::new();
    let mut have = 0;
    for &n in &pvs {
        interrupt::check()?;
        say(format!(
            "scale: PVs {have} -> {n}, {} creates in flight",
            cfg.in_flight
        ));
        let populate = cluster.block_on(populate::pvs(&admin, have, n, cfg.in_flight))?;
        say(format!(
            "scale: {} PVs in {:.1} s",
            n - have,
            populate.as_secs_f64()
        ));
        have = n;
        let pv_bytes = cluster.block_on(populate::pv_bytes(&admin, 0))?;
        let mut starts = Vec::new();
        for i in 0..cfg.starts {
            interrupt::check()?;
            let (s, running) = start::start(&ctx, &[1])?;
            start::stop(running)?;
            say(format!(
                "scale: {n} PVs, start {}: {} requests, {:.2} MB received, RSS {:.1} MB, ready in {:.2} s",
                i + 1,
                s.requests.values().sum::<u64>(),
                s.received[0] as f64 / 1e6,
                s.rss_kb[0] as f64 / 1024.0,
                s.ready[0].as_secs_f64()
            ));
            starts.push(s);
        }
        let many = if cfg.agents > 0 && n == cfg.agents_at {
            say(format!("scale: {} agents at once, {n} PVs", cfg.agents));
            let nodes: Vec<usize> = (1..=cfg.agents).collect();
            let (s, running) = start::start(&ctx, &nodes)?;
            start::stop(running)?;
            say(format!(
                "scale: {} agents: {} requests, {:.1} MB received, kube-apiserver {:.1} CPU-s",
                s.agents,
                s.requests.values().sum::<u64>(),
                s.received.iter().sum::<u64>() as f64 / 1e6,
                s.apiserver_cpu
            ));
            Some(s)
        } else {
            None
        };
        let controller = if let Some(bins) = tools.controller {
            say(format!("scale: the controller at {n} PVs"));
            let c = controller_at::run(&cluster, bins, &audit, n, work.path())?;
            say(format!(
                "scale: controller at {n} PVs: first cycle {:.2} s, PV list {:.2} s, cycle {:.3} s, RSS {:.1} MB",
                c.first_cycle.as_secs_f64(),
                c.pv_list.as_secs_f64(),
                Summary::of(&c.cycles).map_or(f64::NAN, |s| s.mean),
                c.rss_kb as f64 / 1024.0
            ));
            Some(c)
        } else {
            None
        };
        sizes.push(AtSize {
            pvs: n,
            populate,
            pv_bytes,
            starts,
            many,
            controller,
        });
    }
    Ok(ScaleResult {
        apiserver_version,
        apiserver_startup,
        base: base.took,
        in_flight: cfg.in_flight,
        sizes,
    })
}

/// A ClusterRole of its own letting the agents' ServiceAccount list and
/// watch PVs, bound to it, and waits until the server allows it.
async fn grant_pv_list(
    admin: &kube::Client,
    agent: &health_tests::envtest::Identity,
) -> Result<()> {
    let name = "volume-health-scale-bench-pv-list";
    let role = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": ["persistentvolumes"], "verbs": ["list", "watch"]}]
    });
    let binding = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "ServiceAccount", "namespace": AGENT_NS, "name": AGENT_SA}]
    });
    for doc in [role, binding] {
        health_tests::envtest::apply_manifest(admin, &doc)
            .await
            .with_context(|| format!("applying {}", doc["kind"]))?;
    }
    for verb in ["list", "watch"] {
        health_tests::envtest::wait_allowed(admin, agent, ("", "persistentvolumes", verb), None)
            .await?;
    }
    Ok(())
}

fn mb(bytes: f64) -> String {
    format!("{:.2} MB", bytes / 1e6)
}

fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `PVs 2.08, events 2.39` from `apiserver_response_sizes` (MB).
fn by_resource(s: &Start) -> String {
    let mut v: Vec<(&String, &f64)> = s
        .response_bytes
        .iter()
        .filter(|(_, b)| **b >= 1000.0)
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(a.1));
    v.iter()
        .map(|(r, b)| format!("{r} {:.2}", **b / 1e6))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `etcd: events 2,000; watch cache: pods 2,010`: the objects the server
/// evaluated for the start's lists (every client's in the window).
fn evaluated(s: &Start) -> String {
    let side = |m: &Option<std::collections::BTreeMap<String, f64>>| match m {
        None => "not reported by this server".to_string(),
        Some(m) => {
            let moved: Vec<String> = m
                .iter()
                .filter(|(_, n)| **n >= 1.0)
                .map(|(r, n)| format!("{r} {}", thousands(*n as usize)))
                .collect();
            if moved.is_empty() {
                "none".to_string()
            } else {
                moved.join(", ")
            }
        }
    };
    format!(
        "etcd: {}; watch cache: {}",
        side(&s.evaluated_etcd),
        side(&s.evaluated_cache)
    )
}

impl ScaleResult {
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "A real kube-apiserver {} and etcd (started in {:.1} s) with deploy/ applied; populated by the admin, {} creates in flight: ",
            self.apiserver_version,
            self.apiserver_startup.as_secs_f64(),
            self.in_flight
        );
        let base: Vec<String> = self
            .base
            .iter()
            .map(|(what, n, took)| {
                format!("{} {what} ({:.1} s)", thousands(*n), took.as_secs_f64())
            })
            .collect();
        out.push_str(&base.join(", "));
        out.push_str(
            ". Each PV as external-provisioner and the PV controller leave one (two requests each).\n\n\
             One agent (node-001: 10 pods, each with a bound CSI volume in its kubelet tree) started from nothing, \
             as the agents' ServiceAccount under deploy/'s RBAC; measured until no byte reached it for 3 s. \
             Requests from the audit log; bytes received through a counting proxy (exact for this client, TLS and watch streams included); \
             by resource from `apiserver_response_sizes` (MB, lists and gets of every client, watch streams not included); \
             objects the server evaluated for lists from `apiserver_storage_list_evaluated_objects_total` (etcd) and \
             `apiserver_cache_list_evaluated_objects_total` (its watch cache).\n\n\
             | PVs | PV as served | populate | requests at start | objects evaluated for them | bytes received at start (sent; connections) | by resource (MB) | RSS once quiet / peak | time to ready | traffic ends |\n\
             |---:|---:|---:|---|---|---:|---|---:|---:|---:|\n",
        );
        for size in &self.sizes {
            for s in &size.starts {
                out.push_str(&format!(
                    "| {} | {} B | {:.1} s | {} in all: {} | {} | {} ({}; {}) | {} | {:.1} / {:.1} MB | {:.2} s | {:.2} s |\n",
                    thousands(size.pvs),
                    size.pv_bytes,
                    size.populate.as_secs_f64(),
                    s.requests.values().sum::<u64>(),
                    audit::describe(&s.requests),
                    evaluated(s),
                    mb(s.received[0] as f64),
                    mb(s.sent as f64),
                    s.connections,
                    by_resource(s),
                    s.rss_kb[0] as f64 / 1024.0,
                    s.hwm_kb[0] as f64 / 1024.0,
                    s.ready[0].as_secs_f64(),
                    s.settled.as_secs_f64(),
                ));
            }
        }
        for size in &self.sizes {
            if let Some(m) = &size.many {
                out.push_str(&self.many_markdown(size.pvs, m));
            }
        }
        let controllers: Vec<&ControllerAt> = self
            .sizes
            .iter()
            .filter_map(|s| s.controller.as_ref())
            .collect();
        if !controllers.is_empty() {
            out.push_str(
                "\nThe release `health-controller` (`--monitor-interval 5`, `--list-page-size 500`; an admin under its own user, \
                 behind a counting proxy) with `csi-test-driver` serving every volume's health list, every 100th volume \
                 `Degraded` (its Warnings, `VolumeHealth` objects and `healthStatus` writes included): \
                 the PV and Node lists from the audit log (first page asked → last answered), steady cycles from its \
                 `cycle_duration_seconds`, RSS after them. Goal (issue 40): ≤ 1 s per listed cycle, ≤ 150 MB at 100,000 PVs \
                 with 1 % unhealthy.\n\n\
                 | PVs (unhealthy) | start → first complete cycle | PV list | Node list, watch | steady cycle mean (min–max) | RSS / peak | bytes received to the first cycle | its requests (audit log) |\n\
                 |---:|---:|---:|---|---:|---:|---:|---|\n",
            );
            for c in controllers {
                let cycle = Summary::of(&c.cycles);
                out.push_str(&format!(
                    "| {} ({}) | {:.2} s | {} pages, {:.2} s | {} page, {:.3} s; {} watch | {:.3} s ({:.3}–{:.3}) | {:.1} / {:.1} MB | {} | {} |\n",
                    thousands(c.volumes),
                    thousands(c.unhealthy),
                    c.first_cycle.as_secs_f64(),
                    c.pv_pages,
                    c.pv_list.as_secs_f64(),
                    c.node_pages,
                    c.node_list.as_secs_f64(),
                    c.node_watches,
                    cycle.as_ref().map_or(f64::NAN, |s| s.mean),
                    cycle.as_ref().map_or(f64::NAN, |s| s.min),
                    cycle.as_ref().map_or(f64::NAN, |s| s.max),
                    c.rss_kb as f64 / 1024.0,
                    c.hwm_kb as f64 / 1024.0,
                    mb(c.received as f64),
                    audit::describe(&c.requests),
                ));
            }
        }
        out
    }

    fn many_markdown(&self, pvs: usize, m: &Start) -> String {
        let k = m.agents as f64;
        let ready: Vec<f64> = m.ready.iter().map(Duration::as_secs_f64).collect();
        let ready = Summary::of(&ready);
        let received: u64 = m.received.iter().sum();
        let requests: u64 = m.requests.values().sum();
        let rss: Vec<f64> = m.rss_kb.iter().map(|kb| *kb as f64 / 1024.0).collect();
        let rss = Summary::of(&rss);
        let api_cpu = m.apiserver_cpu - m.apiserver_idle;
        let etcd_cpu = m.etcd_cpu - m.etcd_idle;
        let per = |x: f64| x / k;
        let nodes = 5000.0;
        let mut out = format!(
            "\n{} agents started at the same instant at {} PVs, one per node identity (node-001 to node-{:03}, each with its own \
             kubelet tree of 10 volumes and its own counting proxy; real processes with their kernel programs, all as the one \
             ServiceAccount). Server CPU from /proc (utime+stime) over the {:.1} s from the start to the last byte + 3 s, less what \
             the server spent idle over as long just before ({:.2} CPU-s kube-apiserver, {:.2} etcd).\n\n\
             | | all {} agents | per agent |\n|---|---:|---:|\n",
            m.agents,
            thousands(pvs),
            m.agents,
            m.window.as_secs_f64(),
            m.apiserver_idle,
            m.etcd_idle,
            m.agents,
        );
        out.push_str(&format!(
            "| time to ready p50 / max | | {:.2} / {:.2} s |\n",
            ready.as_ref().map_or(f64::NAN, |s| s.p50),
            ready.as_ref().map_or(f64::NAN, |s| s.max)
        ));
        out.push_str(&format!(
            "| traffic ends | {:.2} s | |\n",
            m.settled.as_secs_f64()
        ));
        out.push_str(&format!(
            "| requests (audit log) | {requests} | {:.1} |\n",
            per(requests as f64)
        ));
        out.push_str(&format!(
            "| bytes received (proxies) | {} | {} |\n",
            mb(received as f64),
            mb(per(received as f64))
        ));
        out.push_str(&format!(
            "| kube-apiserver CPU beyond idle | {api_cpu:.2} s | {:.3} s |\n",
            per(api_cpu)
        ));
        out.push_str(&format!(
            "| etcd CPU beyond idle | {etcd_cpu:.2} s | {:.3} s |\n",
            per(etcd_cpu)
        ));
        out.push_str(&format!(
            "| agent RSS once quiet, mean (max) | | {:.1} MB ({:.1}) |\n",
            rss.as_ref().map_or(f64::NAN, |s| s.mean),
            rss.as_ref().map_or(f64::NAN, |s| s.max)
        ));
        out.push_str(&format!("\nRequests: {}.\n", audit::describe(&m.requests)));
        out.push_str(&format!(
            "\nAt 5,000 nodes, every agent starting once (a DaemonSet rollout), per-agent figures × 5,000: \
             {:.1} × 5,000 = {:.0} requests; {} × 5,000 = {:.2} GB sent by the API servers; \
             {:.3} × 5,000 = {:.0} kube-apiserver CPU-s and {:.3} × 5,000 = {:.0} etcd CPU-s \
             (measured with {} PVs, 2,000 pods and 200 nodes on this server; list costs grow with what the server holds).\n",
            per(requests as f64),
            per(requests as f64) * nodes,
            mb(per(received as f64)),
            per(received as f64) * nodes / 1e9,
            per(api_cpu),
            per(api_cpu) * nodes,
            per(etcd_cpu),
            per(etcd_cpu) * nodes,
            thousands(pvs),
        ));
        out
    }

    pub fn headline(&self) -> String {
        let rows: Vec<String> = self
            .sizes
            .iter()
            .filter_map(|s| {
                let first = s.starts.first()?;
                Some(format!(
                    "{} PVs: {} requests, {:.2} MB, RSS {:.1} MB",
                    s.pvs,
                    first.requests.values().sum::<u64>(),
                    first.received[0] as f64 / 1e6,
                    first.rss_kb[0] as f64 / 1024.0
                ))
            })
            .collect();
        format!("scale: agent start at {}", rows.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }
}
