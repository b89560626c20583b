//! The agent's one loop, shared by `watch` and `run`: kernel errors in,
//! topology and volumes kept current, everything handed to a [`Reporter`].
//!
//! Stages, in the order an error meets them: [`health_kernel`] (attach,
//! count, sample) → [`health_topology`] (device, partitions, mounts) →
//! [`crate::volumes`] (pod volumes and their conditions) → a
//! [`Reporter`] (`report::watch::View` prints, `cluster::report` writes Events).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use futures_util::future::BoxFuture;
use health_kernel::probes::ProbeOptions;
use health_topology::HostPaths;
use tokio::signal::unix::{signal, SignalKind};

use crate::report::Reporter;
use crate::volumes::{self, LiveVolumesConfig};

mod earlier_devices;
mod kernel_maps;
pub mod priority;
mod state;
mod tracer_count;

pub use priority::EventPriority;
use priority::EventThread;
use state::{Agent, Then};

#[derive(Clone, Debug)]
pub struct AgentOptions {
    pub probes: ProbeOptions,
    pub host: HostPaths,
    pub duration: Option<Duration>,
    /// How often the human view prints per-device totals.
    pub totals_interval: Duration,
    /// Annotate events with the pod volumes they reach and keep their
    /// conditions (`crate::volumes`); `None` when there is no kubelet tree.
    pub volumes: Option<LiveVolumesConfig>,
    /// The scheduling priority asked for the event thread ([`priority`]).
    pub event_priority: EventPriority,
    /// `IOStalled` once a volume's oldest I/O has waited this long
    /// (`--stall-after`); `None`: off (the kernel side follows no bios).
    pub stall_after: Option<Duration>,
    /// The host's cgroup filesystem (`--host-cgroup`), where a stalled
    /// bio's cgroup is looked up to name its pod and container.
    pub cgroup_root: PathBuf,
    /// `HighLatency` from each window of completion latencies
    /// (`--latency-window`); `None`: off.
    pub latency: Option<volumes::latency::LatencyConfig>,
}

/// How often counters are reconciled with samples: errors whose samples
/// were rate-limited away show up as summaries within two of these.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// Block devices come and go without a mount-table change (a loop device
/// attached, a partition table re-read), so the topology is also rescanned
/// on this interval.
const RESCAN_EVERY: Duration = Duration::from_secs(5);
/// How often the waiting bios are read for stalls: a stall is a condition
/// within this long (plus the turn) of its oldest bio reaching
/// `--stall-after`.
const STALL_POLL: Duration = Duration::from_millis(500);
/// At most one extra rescan per this long, when an event names a device the
/// topology does not know yet.
const MIN_RESCAN_GAP: Duration = Duration::from_secs(1);

/// The name of the thread the loop runs on (`ps -L`, `top -H`).
pub const EVENT_THREAD: &str = "health-events";

/// A task the caller wants next to the loop, on the event thread's own
/// runtime, instead of on the caller's: cluster mode's Event writer, so that
/// the first Event of an episode is written by the thread that drained the
/// error, which is running, without waking a thread of another runtime. On
/// a busy node that wake-up waits for a time slice: with the CPUs 2×
/// oversubscribed, failed request → Warning at a client watching the API
/// server took p99 33 ms with the writer elsewhere and 13 ms here (the same
/// at normal priority; docs/benchmarks.md, "Kernel error to Kubernetes Event").
pub struct Companion {
    /// Spawned on the event thread's runtime before the loop starts; it
    /// runs whenever the loop waits, at the thread's priority, so what it
    /// does per wake-up must be bounded (the Event writer's is: a few
    /// writes in flight, a per-object cap).
    pub task: BoxFuture<'static, ()>,
    /// Run on the same runtime after the loop ended, with `task` still
    /// alive (the writer's final flush); `task` is dropped after it.
    pub drain: BoxFuture<'static, ()>,
}

/// The agent loop: kernel errors, topology, volumes, and a reporter.
///
/// The loop runs on its own thread ([`EVENT_THREAD`]) with its own
/// single-threaded runtime, so that the wait on the sample ring buffer is
/// this thread's own and can be given a raised priority ([`priority`]):
/// tasks of the caller's runtime (HTTP, the API client) stay where they are,
/// at normal priority; only a [`Companion`] joins the loop there.
pub async fn run<R: Reporter + Send + 'static>(
    opts: AgentOptions,
    reporter: R,
    companion: Option<Companion>,
) -> anyhow::Result<()> {
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new()
        .name(EVENT_THREAD.into())
        .spawn(move || {
            // The receiver only goes away when the caller was dropped.
            let _ = done_tx.send(event_thread(opts, reporter, companion));
        })
        .context("starting the event thread")?;
    let result = done_rx.await;
    if thread.join().is_err() {
        anyhow::bail!("the event thread panicked");
    }
    result.context("the event thread ended without a result")?
}

fn event_thread<R: Reporter>(
    opts: AgentOptions,
    reporter: R,
    companion: Option<Companion>,
) -> anyhow::Result<()> {
    let (prio, outcome) = EventThread::raise(opts.event_priority);
    if let Some(why) = &outcome.fallback {
        tracing::warn!("{why}");
    }
    tracing::info!(
        thread = EVENT_THREAD,
        tid = nix::unistd::gettid().as_raw(),
        priority = %outcome.applied,
        "event path priority"
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the event thread's runtime")?;
    let (task, drain) = match companion {
        Some(c) => (Some(rt.spawn(c.task)), Some(c.drain)),
        None => (None, None),
    };
    let result = rt.block_on(agent_loop(opts, reporter, prio));
    if let Some(drain) = drain {
        rt.block_on(drain);
    }
    if let Some(task) = task {
        task.abort();
    }
    // A volume probe stuck on a hung mount holds a blocking thread that may
    // never return; dropping the runtime would wait for it.
    rt.shutdown_timeout(Duration::from_millis(200));
    result
}

async fn agent_loop<R: Reporter>(
    opts: AgentOptions,
    reporter: R,
    prio: EventThread,
) -> anyhow::Result<()> {
    // Before anything else: a SIGTERM during start (a rolling update right
    // after the pod came up) must end the agent cleanly, not kill it.
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    // Attaching and the first scans are bulk work too.
    let bulk = prio.bulk();
    let mut agent = Agent::start(&opts, reporter)?;
    let active = agent.active_sources();
    agent.reporter.ready(active, agent.vols.as_ref());
    // Tests and scripts wait for this line before causing errors, and may
    // ask the reporter's state (`/readyz`) at once: it is printed after the
    // reporter took note.
    eprintln!("volume-health: ready, {active} error sources attached");

    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    let mut rescan = tokio::time::interval(RESCAN_EVERY);
    let mut totals = tokio::time::interval(opts.totals_interval);
    let mut stall_poll = tokio::time::interval(STALL_POLL);
    stall_poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let window = opts
        .latency
        .as_ref()
        .map_or(Duration::from_secs(3600), |l| l.window);
    let mut latency_window = tokio::time::interval(window);
    latency_window.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    totals.tick().await;
    drop(bulk);

    loop {
        // Only the ring buffer's branch keeps the thread's raised priority;
        // every other one is periodic or bulk work and runs at normal
        // priority until the end of the turn (see `priority`).
        let _bulk = tokio::select! {
            r = agent.collector.next_batch(&mut agent.batch) => {
                r?;
                None
            }
            _ = reconcile.tick() => {
                let bulk = prio.bulk();
                agent.reconcile()?;
                Some(bulk)
            }
            _ = rescan.tick() => {
                let bulk = prio.bulk();
                agent.rescan(Then::TopologyChanged);
                Some(bulk)
            }
            r = agent.mounts.changed() => {
                let bulk = prio.bulk();
                r.context("watching the mount table")?;
                // A mount change usually means kubelet set a volume up or tore one down.
                agent.rescan(Then::Rediscover);
                Some(bulk)
            }
            w = volumes::next_wake(&mut agent.vols) => {
                let bulk = prio.bulk();
                agent.volumes_woke(w);
                Some(bulk)
            }
            w = agent.reporter.wake() => {
                let bulk = prio.bulk();
                agent.reporter.handle(w, agent.vols.as_ref());
                Some(bulk)
            }
            _ = stall_poll.tick(), if opts.stall_after.is_some() => {
                let bulk = prio.bulk();
                agent.poll_stalls(opts.stall_after)?;
                Some(bulk)
            }
            _ = latency_window.tick(), if opts.latency.is_some() => {
                let bulk = prio.bulk();
                agent.poll_latency(opts.latency.as_ref())?;
                Some(bulk)
            }
            _ = totals.tick() => {
                let bulk = prio.bulk();
                agent.reporter.totals(&agent.collector.totals()?, &agent.topo)?;
                Some(bulk)
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sleep_until(deadline) => break,
        };
        agent.end_turn(&prio)?;
    }
    let _bulk = prio.bulk();
    agent.finish()
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
