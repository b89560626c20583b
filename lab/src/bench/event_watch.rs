//! What a user waits for in cluster mode: from a failed request to the
//! Warning Event arriving at a client that watches Events on the real
//! kube-apiserver (`health_tests::envtest`), as `kubectl get events -w`
//! would show it.
//!
//! The real agent in cluster mode as node-1's ServiceAccount under the
//! RBAC of deploy/, a PVC shared by two pods on node-1 on a fault disk
//! (`health_tests::real_cluster`). Each round fails one O_DIRECT write,
//! waits for the three Warnings (both pods, the PVC: new Event objects, a
//! new episode each round), then for the recovery Events, and lets the API
//! traffic settle. The watcher stamps each Event with CLOCK_MONOTONIC when
//! its watch line arrives; the fault disk stamps the failed request with the
//! same clock.
//!
//! With `load`, that many threads spin on the CPUs for the whole run: a busy
//! node. The API server, etcd and the watcher then run at SCHED_FIFO above
//! the agent's own priority, standing in for a control plane on other
//! machines, which a node's load does not slow.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::StreamExt as _;
use health_node::cluster::API_ACCESS;
use health_tests::envtest::Options;
use health_tests::kubelet::{free_port, wait_ready, CsiVolume};
use health_tests::real_cluster::{Cluster, AGENT_NS, AGENT_SA, APP_NS, DRIVER, PV};
use health_tests::{Op, Rule};
use k8s_openapi::api::core::v1::Event;
use kube::api::{Api, ListParams, WatchEvent, WatchParams};

use super::agent::{mono_ns, raise_fifo, AgentProc};
use super::dio::DirectIo;
use super::latency::Load;
use super::stats::Summary;
use super::{interrupt, Tools};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
/// Above the agent's own SCHED_FIFO priority (5).
const CONTROL_PLANE_PRIORITY: i32 = 10;
const OBJECTS: usize = 3;

pub struct Config {
    pub rounds: u32,
    pub load: u32,
}

pub struct EventWatchResult {
    pub rounds: u32,
    pub load: u32,
    /// Milliseconds from the failed request to the Warning at the watcher.
    pub to_pod: Summary,
    pub to_pvc: Summary,
    /// The agent's `event path priority` log line, when it has one.
    pub priority: String,
}

/// One Event as the watcher saw it arrive.
struct Seen {
    /// A new Event object (a create), not a patch of one.
    added: bool,
    kind: String,
    /// The object the Event is about.
    object: String,
    reason: String,
    count: i32,
    at_mono_ns: u64,
}

pub fn run(tools: &Tools, cfg: &Config) -> Result<EventWatchResult> {
    health_tests::require_env(&[])?;
    let server = Options::new()
        .service_account(AGENT_NS, AGENT_SA)
        .start()
        .context("starting the API server (HEALTH_K8S_ASSETS)")?;
    let cluster = Cluster::prepare(server, API_ACCESS)?;
    let [web_0, web_1] = cluster.workload()?;
    let root = tempfile::Builder::new()
        .prefix("kubelet-bench-")
        .tempdir()?;
    let volume = CsiVolume::publish(root.path(), PV, DRIVER, "node-1", &[&web_0, &web_1])?;
    let metrics = free_port()?;
    let who = cluster
        .server
        .service_account(AGENT_NS, AGENT_SA)
        .context("the agent's identity")?;
    let args: Vec<String> = [
        "--node-name",
        "node-1",
        "--kubeconfig",
        &cluster.server.kubeconfig(who).display().to_string(),
        "--kubelet-root",
        &root.path().display().to_string(),
        "--state-dir",
        &root
            .path()
            .join("volume-health-state")
            .display()
            .to_string(),
        "--metrics-addr",
        &metrics.to_string(),
        "--kernel-quiet-window",
        "1",
        "--check-interval",
        "0.2",
        // Each round writes two Events per object; the default cap (6 a
        // minute) would make later rounds wait for it, which is not latency.
        "--event-writes-per-minute",
        "1000",
        "--event-update-interval",
        "0.5",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let agent = AgentProc::start_mode(&tools.agent, "run", &args, None)?;
    wait_ready(metrics)?;
    let priority = agent
        .stderr_so_far()
        .lines()
        .find(|l| l.contains("event path priority"))
        .map(str::to_string)
        .unwrap_or_else(|| "(no event path priority line)".into());

    let load = if cfg.load > 0 {
        for pid in cluster.server.pids() {
            set_fifo_all_threads(pid, CONTROL_PLANE_PRIORITY)?;
        }
        Some(Load::start(cfg.load)?)
    } else {
        None
    };
    let (tx, rx) = mpsc::channel();
    let watcher = spawn_watcher(cluster.admin.clone(), cfg.load > 0, tx)?;
    let io = DirectIo::open(volume.loop_device().path(), BLOCK as usize)?;
    let disk = volume.disk();
    let (mut to_pod, mut to_pvc) = (Vec::new(), Vec::new());
    for round in 0..cfg.rounds {
        interrupt::check()?;
        let offset = 40 * MIB + u64::from(round) * BLOCK;
        let since = disk.injections()?.last().map_or(0, |i| i.seq + 1);
        let rule = disk.add_rule(Rule::new(Op::Write, libc::EIO).range(offset, BLOCK))?;
        match io.write_at(offset) {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {}
            other => bail!("round {round}: expected EIO, got {other:?}"),
        }
        // The episode's Warnings are new objects, created.
        let warnings = collect(&rx, round, |s| s.added && s.reason == "BlockIOErrors")?;
        disk.remove_rule(rule)?;
        let injected = disk.injections_since(since)?;
        let [inj] = injected.as_slice() else {
            bail!("round {round}: {} injections for one write", injected.len());
        };
        for s in warnings {
            let ms = (s.at_mono_ns as f64 - inj.mono_ns as f64) / 1e6;
            match s.kind.as_str() {
                "Pod" => to_pod.push(ms),
                _ => to_pvc.push(ms),
            }
        }
        // Recoveries of all rounds aggregate into one Normal Event per
        // object: its count is the number of rounds so far.
        let cleared = round as i32 + 1;
        collect(&rx, round, |s| {
            s.reason == "BlockIOErrorsCleared" && s.count == cleared
        })?;
        // The writes that follow the recovery (VolumeHealth, the label):
        // the next error must meet a quiet agent.
        std::thread::sleep(Duration::from_millis(300));
    }
    if let Some(load) = load {
        load.stop()?;
    }
    agent.stop_ok()?;
    drop(watcher);
    Ok(EventWatchResult {
        rounds: cfg.rounds,
        load: cfg.load,
        to_pod: Summary::of(&to_pod).context("no pod Events measured")?,
        to_pvc: Summary::of(&to_pvc).context("no PVC Events measured")?,
        priority,
    })
}

/// The next Events matching `want` on all three objects, the first one on
/// each.
fn collect(
    rx: &mpsc::Receiver<Seen>,
    round: u32,
    want: impl Fn(&Seen) -> bool,
) -> Result<Vec<Seen>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut found: Vec<Seen> = Vec::new();
    while found.len() < OBJECTS {
        interrupt::check()?;
        let left = deadline.saturating_duration_since(Instant::now());
        let seen = rx
            .recv_timeout(left)
            .with_context(|| format!("round {round}: {} of {OBJECTS} Events seen", found.len()))?;
        let first = !found
            .iter()
            .any(|f| (&f.kind, &f.object) == (&seen.kind, &seen.object));
        if want(&seen) && first {
            found.push(seen);
        }
    }
    Ok(found)
}

/// The watching client, on a thread of its own (at SCHED_FIFO above the
/// agent under load): every Event of the app namespace from now on, with
/// its arrival time.
fn spawn_watcher(
    admin: kube::Client,
    raised: bool,
    tx: mpsc::Sender<Seen>,
) -> Result<std::thread::JoinHandle<()>> {
    let (ready_tx, ready_rx) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("event-watcher".into())
        .spawn(move || {
            if raised {
                if let Err(e) = raise_fifo(CONTROL_PLANE_PRIORITY) {
                    let _ = ready_tx.send(Err(anyhow::anyhow!("raising the watcher: {e}")));
                    return;
                }
            }
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.into()));
                    return;
                }
            };
            rt.block_on(async move {
                let api = Api::<Event>::namespaced(admin, APP_NS);
                let version = match api.list(&ListParams::default().limit(1)).await {
                    Ok(list) => list.metadata.resource_version.unwrap_or_default(),
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                let stream = match api
                    .watch(&WatchParams::default().timeout(290), &version)
                    .await
                {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.into()));
                        return;
                    }
                };
                let _ = ready_tx.send(Ok(()));
                let mut stream = std::pin::pin!(stream);
                while let Some(item) = stream.next().await {
                    let at_mono_ns = mono_ns();
                    let (added, event) = match item {
                        Ok(WatchEvent::Added(e)) => (true, e),
                        Ok(WatchEvent::Modified(e)) => (false, e),
                        _ => continue,
                    };
                    let seen = Seen {
                        added,
                        kind: event.involved_object.kind.clone().unwrap_or_default(),
                        object: event.involved_object.name.clone().unwrap_or_default(),
                        reason: event.reason.clone().unwrap_or_default(),
                        count: event.count.unwrap_or(0),
                        at_mono_ns,
                    };
                    if tx.send(seen).is_err() {
                        return;
                    }
                }
            });
        })
        .context("starting the Event watcher")?;
    ready_rx
        .recv_timeout(Duration::from_secs(20))
        .context("the Event watcher did not start")??;
    Ok(thread)
}

/// `chrt -a -f -p PRIORITY PID`: every thread of the process at SCHED_FIFO.
fn set_fifo_all_threads(pid: u32, priority: i32) -> Result<()> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let tid: i32 = task?.file_name().to_string_lossy().parse()?;
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: a plain syscall with a valid parameter.
        if unsafe { libc::sched_setscheduler(tid, libc::SCHED_FIFO, &param) } != 0 {
            bail!(
                "SCHED_FIFO for thread {tid} of {pid}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

impl EventWatchResult {
    pub fn markdown(&self) -> String {
        let row = |name: &str, s: &Summary| {
            format!(
                "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                s.n, s.min, s.p50, s.p90, s.p99, s.max
            )
        };
        let load = match self.load {
            0 => "an idle machine".to_string(),
            n => format!(
                "{n} threads spinning on the CPUs (the API server, etcd and the watcher at SCHED_FIFO {CONTROL_PLANE_PRIORITY}, standing in for a control plane elsewhere)"
            ),
        };
        let mut out = format!(
            "{} rounds on {load}: one failed O_DIRECT write on a PVC used by two pods, then the three Warning Events \
             (a new episode each round), the recovery Events and 300 ms of quiet. Times from the fault disk failing the \
             request to the Event's watch line arriving at a client watching the namespace's Events on the real \
             kube-apiserver v1.26 (both CLOCK_MONOTONIC); the agent as its ServiceAccount under deploy/'s RBAC, the per-object \
             write cap raised to 1000/min so rounds never wait on it. The agent said: `{}`.\n\n",
            self.rounds,
            self.priority.trim()
        );
        out.push_str("| interval (ms) | n | min | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|\n");
        out.push_str(&row(
            "failed request → Warning on a pod, at the watcher",
            &self.to_pod,
        ));
        out.push_str(&row(
            "failed request → Warning on the PVC, at the watcher",
            &self.to_pvc,
        ));
        out
    }

    pub fn headline(&self) -> String {
        format!(
            "event-watch (load {}): failed request -> watched pod Warning p50 {:.1} ms, p99 {:.1} ms; PVC p50 {:.1} ms, p99 {:.1} ms ({} rounds)",
            self.load, self.to_pod.p50, self.to_pod.p99, self.to_pvc.p50, self.to_pvc.p99, self.rounds
        )
    }
}
