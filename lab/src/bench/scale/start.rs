//! Agent starts: one or many `health-agent run` processes started at the
//! same instant against the populated server, each behind its own
//! counting proxy, measured until every one is ready and the API traffic
//! of all of them has stopped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::kubelet::http_get;
use health_tests::real_cluster::Cluster;

use super::node::NodeTree;
use super::proxy::CountingProxy;
use crate::bench::agent::AgentProc;
use crate::bench::controller::audit::{AuditLog, Requests};
use crate::bench::controller::cluster::diff;
use crate::bench::controller::scrape::{self, Samples};
use crate::bench::interrupt;

/// No byte to any agent for this long: the start is over.
const QUIET: Duration = Duration::from_secs(3);
/// Longest a start may take (ready and quiet).
const START_TIMEOUT: Duration = Duration::from_secs(240);

/// What every start shares.
pub struct Ctx<'a> {
    pub cluster: &'a Cluster,
    pub agent: &'a Path,
    pub audit: &'a AuditLog,
    /// The agents' ServiceAccount kubeconfig (pointed at a proxy per agent).
    pub kubeconfig: PathBuf,
    pub upstream: SocketAddr,
    pub pod_uids: &'a [String],
    pub work: &'a Path,
}

/// One measured start of `agents` agents.
pub struct Start {
    pub agents: usize,
    /// Per agent, from the common start instant to its /readyz answering 200.
    pub ready: Vec<Duration>,
    /// From the start to the last byte any agent received.
    pub settled: Duration,
    /// Over all agents (the proxies): bytes received and sent, connections.
    pub received: Vec<u64>,
    pub sent: u64,
    pub connections: u64,
    /// The agents' requests in the audit log.
    pub requests: Requests,
    /// `apiserver_response_sizes_sum` moved by resource (every client's;
    /// watch streams not included).
    pub response_bytes: BTreeMap<String, f64>,
    /// Objects the API server evaluated to answer lists over the window, by
    /// resource: read from etcd (`apiserver_storage_list_evaluated_objects_total`)
    /// and from its watch cache (`apiserver_cache_list_evaluated_objects_total`);
    /// `None` where the server has no such family.
    pub evaluated_etcd: Option<BTreeMap<String, f64>>,
    pub evaluated_cache: Option<BTreeMap<String, f64>>,
    /// Per agent, once quiet.
    pub rss_kb: Vec<u64>,
    pub hwm_kb: Vec<u64>,
    /// CPU seconds of kube-apiserver and etcd over the window, and what
    /// they spend idle in as long (measured just before).
    pub apiserver_cpu: f64,
    pub etcd_cpu: f64,
    pub apiserver_idle: f64,
    pub etcd_idle: f64,
    pub window: Duration,
}

/// utime + stime of `pid` in seconds.
fn cpu_seconds(pid: u32) -> Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok(crate::bench::agent::cpu_ticks_of(pid)? as f64 / ticks)
}

fn server_cpu(cluster: &Cluster) -> Result<(f64, f64)> {
    let [apiserver, etcd] = cluster.server.pids();
    Ok((cpu_seconds(apiserver)?, cpu_seconds(etcd)?))
}

/// `apiserver_response_sizes_sum` by resource.
fn response_bytes(s: &Samples) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for (labels, v) in s.matching("apiserver_response_sizes_sum", &[]) {
        let resource = labels.get("resource").cloned().unwrap_or_default();
        if resource.is_empty() {
            continue;
        }
        *out.entry(resource).or_insert(0.0) += v;
    }
    out
}

/// Family `name` (a counter by `resource`) moved from `m0` to `m1`; `None`
/// when the server does not have it.
fn by_resource_moved(m0: &Samples, m1: &Samples, name: &str) -> Option<BTreeMap<String, f64>> {
    let of = |s: &Samples| -> Option<BTreeMap<String, f64>> {
        let mut out = BTreeMap::new();
        let mut any = false;
        for (labels, v) in s.matching(name, &[]) {
            any = true;
            let resource = labels.get("resource").cloned().unwrap_or_default();
            *out.entry(resource).or_insert(0.0) += v;
        }
        any.then_some(out)
    };
    let after = of(m1)?;
    Some(diff(&of(m0).unwrap_or_default(), &after))
}

/// An agent running on a thread of its own: `PR_SET_PDEATHSIG` stops a
/// child when the thread that spawned it ends, so the thread that started
/// it stays until [`stop`].
pub struct Running {
    pid: i32,
    stop_tx: mpsc::Sender<()>,
    thread: std::thread::JoinHandle<Result<()>>,
    pub proxy: CountingProxy,
    tree: NodeTree,
}

/// A loopback port for node `n`'s agent's /metrics, below the kernel's
/// ephemeral range: a port picked from that range and let go (as
/// `free_port` does) can be taken by any outgoing connection before the
/// agent binds it, which 50 agents and their proxies' connections made
/// happen.
fn metrics_port(n: usize) -> Result<SocketAddr> {
    for port in (21_000 + 100 * n..).take(100) {
        let addr = SocketAddr::from(([127, 0, 0, 1], port as u16));
        if std::net::TcpListener::bind(addr).is_ok() {
            return Ok(addr);
        }
    }
    bail!("no free loopback port for node {n}'s agent's /metrics")
}

/// A `kB` field of `/proc/<pid>/status`.
fn status_kb(pid: i32, name: &str) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{path}: no {name} (did the agent exit?)"))
}

/// Starts `bin run <args>` on its own thread; the thread says when the
/// agent is ready (or why not), then waits to be told to stop it.
fn spawn_agent(
    bin: PathBuf,
    args: Vec<String>,
    metrics: SocketAddr,
    t0: Instant,
    ready_tx: mpsc::Sender<Result<(i32, Duration)>>,
) -> (mpsc::Sender<()>, std::thread::JoinHandle<Result<()>>) {
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    let thread = std::thread::spawn(move || -> Result<()> {
        let agent = match AgentProc::start_mode(&bin, "run", &args, None) {
            Ok(a) => a,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return Ok(());
            }
        };
        match wait_ready(&agent, metrics, t0) {
            Ok(at) => {
                let _ = ready_tx.send(Ok((agent.pid(), at)));
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return agent.stop().map(drop);
            }
        }
        // Told to stop, or the bench went away.
        let _ = stop_rx.recv();
        agent.stop_ok().map(drop)
    });
    (stop_tx, thread)
}

/// Starts the agents of `nodes` at once and measures the start; returns
/// them running (stop them with [`stop`]).
pub fn start(ctx: &Ctx<'_>, nodes: &[usize]) -> Result<(Start, Vec<Running>)> {
    let mut prepared = Vec::new();
    for &n in nodes {
        let tree = NodeTree::new(n, ctx.pod_uids)?;
        let proxy = ctx.cluster.block_on(CountingProxy::start(ctx.upstream))?;
        let kubeconfig = proxy.kubeconfig(
            &ctx.kubeconfig,
            ctx.work.join(format!("{}.kubeconfig", tree.node)),
        )?;
        let metrics = metrics_port(n)?;
        let args: Vec<String> = [
            "--node-name",
            &tree.node,
            "--kubeconfig",
            &kubeconfig.display().to_string(),
            "--kubelet-root",
            &tree.root().display().to_string(),
            "--state-dir",
            &tree
                .root()
                .join("volume-health-state")
                .display()
                .to_string(),
            "--metrics-addr",
            &metrics.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        prepared.push((tree, proxy, metrics, args));
    }
    // The servers' idle CPU, to tell the agents' cost from their own
    // background work (lease renewals, the bench's scrapes).
    let idle_for = Duration::from_secs(3);
    let (a0, e0) = server_cpu(ctx.cluster)?;
    interrupt::sleep(idle_for)?;
    let (a1, e1) = server_cpu(ctx.cluster)?;
    let (apiserver_rate, etcd_rate) = (
        (a1 - a0) / idle_for.as_secs_f64(),
        (e1 - e0) / idle_for.as_secs_f64(),
    );

    let admin = &ctx.cluster.admin;
    let mark = ctx.audit.mark()?;
    let m0 = ctx.cluster.block_on(scrape::apiserver(admin))?;
    let (a0, e0) = server_cpu(ctx.cluster)?;
    let t0 = Instant::now();
    let mut pending = Vec::new();
    for (tree, proxy, metrics, args) in prepared {
        let (ready_tx, ready_rx) = mpsc::channel();
        let (stop_tx, thread) = spawn_agent(ctx.agent.to_path_buf(), args, metrics, t0, ready_tx);
        pending.push((tree, proxy, stop_tx, thread, ready_rx));
    }
    let mut running = Vec::new();
    let mut ready = Vec::new();
    let mut first_error = None;
    for (tree, proxy, stop_tx, thread, ready_rx) in pending {
        let answer = ready_rx
            .recv()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("the start thread ended without an answer")));
        match answer {
            Ok((pid, at)) => {
                ready.push(at);
                running.push(Running {
                    pid,
                    stop_tx,
                    thread,
                    proxy,
                    tree,
                });
            }
            Err(e) => {
                let _ = thread.join();
                first_error
                    .get_or_insert(e.context(format!("starting the agent of {}", tree.node)));
            }
        }
    }
    if let Some(e) = first_error {
        stop(running)?;
        return Err(e);
    }
    let settled = wait_quiet(&running, t0)?;
    let window = t0.elapsed();
    let (a1, e1) = server_cpu(ctx.cluster)?;
    let m1 = ctx.cluster.block_on(scrape::apiserver(admin))?;
    let requests = ctx.audit.since(mark)?;
    let status = |name: &str| -> Result<Vec<u64>> {
        running
            .iter()
            .map(|r| {
                status_kb(r.pid, name).with_context(|| format!("the agent of {}", r.tree.node))
            })
            .collect()
    };
    let start = Start {
        agents: running.len(),
        ready,
        settled,
        received: running.iter().map(|r| r.proxy.received()).collect(),
        sent: running.iter().map(|r| r.proxy.sent()).sum(),
        connections: running.iter().map(|r| r.proxy.connections()).sum(),
        requests,
        response_bytes: diff(&response_bytes(&m0), &response_bytes(&m1)),
        evaluated_etcd: by_resource_moved(
            &m0,
            &m1,
            "apiserver_storage_list_evaluated_objects_total",
        ),
        evaluated_cache: by_resource_moved(
            &m0,
            &m1,
            "apiserver_cache_list_evaluated_objects_total",
        ),
        rss_kb: status("VmRSS")?,
        hwm_kb: status("VmHWM")?,
        apiserver_cpu: a1 - a0,
        etcd_cpu: e1 - e0,
        apiserver_idle: apiserver_rate * window.as_secs_f64(),
        etcd_idle: etcd_rate * window.as_secs_f64(),
        window,
    };
    Ok((start, running))
}

/// Polls the agent's /readyz (ready: its kernel programs attached and its
/// first pod and PV lists done) until it answers 200.
fn wait_ready(agent: &AgentProc, metrics: SocketAddr, t0: Instant) -> Result<Duration> {
    loop {
        if let Ok((200, _)) = http_get(metrics, "/readyz") {
            return Ok(t0.elapsed());
        }
        if t0.elapsed() > START_TIMEOUT {
            bail!(
                "not ready within {START_TIMEOUT:?}: {:?}; its stderr:\n{}",
                http_get(metrics, "/readyz"),
                agent.stderr_so_far()
            );
        }
        interrupt::sleep(Duration::from_millis(20))?;
    }
}

/// Waits until no agent received a byte for [`QUIET`]; returns when the
/// last byte came, after `t0`.
fn wait_quiet(running: &[Running], t0: Instant) -> Result<Duration> {
    let total = || running.iter().map(|r| r.proxy.received()).sum::<u64>();
    let mut last = total();
    let mut last_change = Instant::now();
    loop {
        interrupt::sleep(Duration::from_millis(50))?;
        let now = total();
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        if last_change.elapsed() >= QUIET {
            return Ok(last_change - t0);
        }
        if t0.elapsed() > START_TIMEOUT {
            bail!("the agents' API traffic did not stop within {START_TIMEOUT:?}");
        }
    }
}

/// Stops every agent (all told at once: each takes up to seconds to
/// detach) and waits for them.
pub fn stop(running: Vec<Running>) -> Result<()> {
    for r in &running {
        let _ = r.stop_tx.send(());
    }
    let mut first_error = None;
    for r in running {
        let result = r
            .thread
            .join()
            .unwrap_or_else(|_| Err(anyhow::anyhow!("a start thread panicked")));
        if let Err(e) = result {
            first_error.get_or_insert(e.context(format!("stopping the agent of {}", r.tree.node)));
        }
        drop(r.proxy);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
