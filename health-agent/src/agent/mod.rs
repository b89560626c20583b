//! The agent's one loop, shared by `watch` and `run`: kernel errors in,
//! topology and volumes kept current, everything handed to a [`Reporter`].
//!
//! Stages, in the order an error meets them: [`crate::kernel`] (attach,
//! count, sample) → [`crate::topology`] (device, partitions, mounts) →
//! [`crate::volumes`] (pod volumes and their conditions) → a
//! [`Reporter`] (`report::watch::View` prints, `k8s::report` writes Events).

use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::future::BoxFuture;
use tokio::signal::unix::{signal, SignalKind};

use crate::dev::Dev;
use crate::kernel::clock::Clock;
use crate::kernel::collector::{Collector, KernelError, KernelMapsRest};
use crate::kernel::probes::{self, ProbeOptions, SourceState};
use crate::report::Reporter;

mod doorbell;
mod kernel_maps;
pub mod priority;
mod witness;
use crate::topology::{HostPaths, MountWatcher, Topology};
use crate::volumes::{self, Handled, LiveVolumes, LiveVolumesConfig};
pub use priority::EventPriority;
use priority::EventThread;

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
}

/// How often counters are reconciled with samples: errors whose samples
/// were rate-limited away show up as summaries within two of these.
const RECONCILE_EVERY: Duration = Duration::from_secs(1);
/// Block devices come and go without a mount-table change (a loop device
/// attached, a partition table re-read), so the topology is also rescanned
/// on this interval.
const RESCAN_EVERY: Duration = Duration::from_secs(5);
/// At most one extra rescan per this long, when an event names a device the
/// topology does not know yet.
const MIN_RESCAN_GAP: Duration = Duration::from_secs(1);

/// The name of the thread the loop runs on (`ps -L`, `top -H`).
pub const EVENT_THREAD: &str = "health-events";

/// A task the caller wants next to the loop, on the event thread's own
/// runtime, instead of on the caller's: cluster mode's Event writer, so that
/// the first Event of an episode is written by the thread that drained the
/// error, on the CPU it already runs on, without waking a thread of another
/// runtime (which the kernel may place on the CPU still busy printing the
/// failed request; BENCHMARKS.md section 5).
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
    mut reporter: R,
    prio: EventThread,
) -> anyhow::Result<()> {
    // Attaching and the first scans are bulk work too.
    let bulk = prio.bulk();
    let (mut attached, maps) = probes::attach(&opts.probes)?;
    for s in &attached.sources {
        let level_missing = matches!(s.state, SourceState::Missing { .. });
        if level_missing {
            tracing::warn!("{s}");
        } else {
            tracing::info!("{s}");
        }
    }
    let mut maps = Some(maps);
    let (mut collector, mut rest) =
        Collector::new(&mut maps, attached.pinned()).context("setting up the sample reader")?;
    if attached.adopted() {
        tracing::info!("adopted programs that kept counting since the previous agent stopped");
    }
    let mut witness = witness::start(&opts.probes.sys_root, &attached, &mut collector);
    let bells = match doorbell::Doorbells::start(collector.samples_fd(), opts.event_priority) {
        Ok(b) => Some(b),
        Err(e) => {
            tracing::info!("no doorbells: {e}");
            None
        }
    };
    let mut topo = Topology::scan(&opts.host).context("reading the device topology")?;
    reporter.input_errors(&topo.input_errors());
    if kernel_maps::sync(&topo, &opts.host, &mut rest).bio_based > 0 {
        attached.attach_bio_errors();
    }
    let mut mounts = MountWatcher::new(&opts.host).context("watching the mount table")?;
    let clock = Clock::new();
    let mut vols = opts.volumes.clone().map(|cfg| LiveVolumes::new(cfg, &topo));

    let active = attached
        .sources
        .iter()
        .filter(|s| matches!(s.state, SourceState::Active { .. }))
        .count();
    reporter.ready(active);
    // Tests and scripts wait for this line before causing errors, and may
    // ask the reporter's state (`/readyz`) at once: it is printed after the
    // reporter took note.
    eprintln!("volume-health: ready, {active} error sources attached");

    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let deadline = opts.duration.map(|d| tokio::time::Instant::now() + d);
    let mut reconcile = tokio::time::interval(RECONCILE_EVERY);
    let mut rescan = tokio::time::interval(RESCAN_EVERY);
    let mut totals = tokio::time::interval(opts.totals_interval);
    totals.tick().await;
    let mut last_rescan = Instant::now();
    let mut pruned_at = last_rescan;
    let mut batch = Vec::new();
    let mut handled = Handled::default();
    let mut misses = Misses::default();

    drop(bulk);

    loop {
        // Only the ring buffer's branch keeps the thread's raised priority;
        // every other one is periodic or bulk work and runs at normal
        // priority until the end of the turn (see `priority`).
        let _bulk = tokio::select! {
            r = collector.next_batch(&mut batch) => {
                if let Some(b) = &bells { b.settle() }
                r?;
                None
            }
            _ = reconcile.tick() => {
                let bulk = prio.bulk();
                if let Some(b) = &bells { b.settle() }
                let traced = witness::read(&mut witness);
                collector.reconcile(false, &mut batch)?;
                let mut stats = collector.kernel_stats()?;
                stats.program_misses = misses.read(&attached);
                witness::check(&mut witness, traced, &collector, &mut stats)?;
                reporter.kernel_stats(&stats);
                Some(bulk)
            }
            _ = rescan.tick() => {
                let bulk = prio.bulk();
                topo = rescan_topology(&opts.host, topo, &mut rest, &mut attached, &mut reporter);
                last_rescan = Instant::now();
                if let Some(v) = &mut vols { v.topology_changed(&topo) }
                Some(bulk)
            }
            r = mounts.changed() => {
                let bulk = prio.bulk();
                r.context("watching the mount table")?;
                topo = rescan_topology(&opts.host, topo, &mut rest, &mut attached, &mut reporter);
                last_rescan = Instant::now();
                // A mount change usually means kubelet set a volume up or tore one down.
                if let Some(v) = &mut vols { v.rediscover(&topo) }
                Some(bulk)
            }
            w = volumes::next_wake(&mut vols) => {
                let bulk = prio.bulk();
                if let Some(v) = &mut vols { handled = v.handle(w, &topo) }
                Some(bulk)
            }
            w = reporter.wake() => {
                let bulk = prio.bulk();
                reporter.handle(w, vols.as_ref());
                Some(bulk)
            }
            _ = totals.tick() => {
                let bulk = prio.bulk();
                reporter.totals(&collector.totals()?, &topo)?;
                Some(bulk)
            }
            _ = sigint.recv() => break,
            _ = sigterm.recv() => break,
            _ = sleep_until(deadline) => break,
        };
        attached.flush_kernel_log();
        if last_rescan != pruned_at {
            pruned_at = last_rescan;
            let pruned = collector.prune(&live_devices(&topo), &mut batch)?;
            if pruned > 0 {
                tracing::info!(
                    keys = pruned,
                    "pruned the counters of devices that are gone"
                );
            }
        }
        if batch.iter().any(|e| is_unknown_block_device(&topo, e))
            && last_rescan.elapsed() >= MIN_RESCAN_GAP
        {
            let _rescan = prio.bulk();
            topo = rescan_topology(&opts.host, topo, &mut rest, &mut attached, &mut reporter);
            last_rescan = Instant::now();
            if let Some(v) = &mut vols {
                v.topology_changed(&topo)
            }
        }
        deliver(
            &mut reporter,
            &mut vols,
            &mut batch,
            &mut handled,
            &topo,
            &clock,
        )?;
        collector.persist()?;
    }

    // Unpinned: detach first, then collect what the kernel counted up to
    // that point: the last lines printed make every total exact. (Skipped
    // runs are read before: they go with the programs.) Pinned: the
    // programs keep counting for the next process; what is reported now is
    // recorded as reported, and a sample of it still in the ring buffer is
    // a late one for the next process, not a second report.
    let _bulk = prio.bulk();
    let program_misses = misses.read(&attached);
    // Read before the programs detach: failures after it are traced but
    // were never going to be counted by this process.
    let traced = witness::read(&mut witness);
    if !attached.pinned() {
        drop(attached);
    }
    collector.drain(&mut batch);
    collector.reconcile(true, &mut batch)?;
    deliver(
        &mut reporter,
        &mut vols,
        &mut batch,
        &mut handled,
        &topo,
        &clock,
    )?;
    collector.persist()?;
    let mut stats = collector.kernel_stats()?;
    stats.program_misses = program_misses;
    witness::check(&mut witness, traced, &collector, &mut stats)?;
    reporter.kernel_stats(&stats);
    reporter.finish(&collector.totals()?, &topo, &stats)?;
    Ok(())
}

/// Follows the kernel's count of skipped program runs and says so, once per
/// increase, when it grows: each one is an error the totals cannot contain.
#[derive(Default)]
struct Misses {
    last: u64,
}

impl Misses {
    fn read(&mut self, attached: &probes::Attached) -> u64 {
        let now = attached.program_misses().unwrap_or(0);
        if now > self.last {
            tracing::warn!(
                skipped = now - self.last,
                total = now,
                "the kernel skipped error tracepoint programs while another BPF program ran on the same CPU; those errors are not in the counts"
            );
            self.last = now;
        }
        now
    }
}

/// Hands one loop turn's results to the reporter: the batch goes to the
/// volumes first (a new condition is raised at once), then the errors, then
/// what changed. Empties `batch` and `handled` for the next turn.
fn deliver<R: Reporter>(
    reporter: &mut R,
    vols: &mut Option<LiveVolumes>,
    batch: &mut Vec<KernelError>,
    handled: &mut Handled,
    topo: &Topology,
    clock: &Clock,
) -> anyhow::Result<()> {
    if let Some(v) = vols.as_mut() {
        handled.changes.extend(v.take_inherited());
        handled.changes.extend(v.record(batch));
    }
    reporter.errors(batch, topo, clock, vols.as_ref().map(LiveVolumes::index))?;
    batch.clear();
    if let Some(v) = vols.as_mut() {
        let gone = v.take_gone();
        if !handled.changes.is_empty()
            || !handled.csi.is_empty()
            || !handled.storage.is_empty()
            || !gone.is_empty()
        {
            reporter.changes(handled, &gone, v);
        }
    }
    handled.changes.clear();
    handled.csi.clear();
    handled.storage.clear();
    Ok(())
}

/// A block device the topology has not seen yet (attached after the last
/// scan). Anonymous devices (btrfs, the block-device pseudo filesystem) are
/// never in sysfs, so they must not trigger a rescan: a btrfs error flood
/// would otherwise rescan the whole host every second.
fn is_unknown_block_device(topo: &Topology, e: &KernelError) -> bool {
    let dev = Dev::from_kernel(e.key.dev);
    !dev.is_anonymous() && topo.device(dev).is_none()
}

/// Every device number an error key can carry that the topology still
/// knows: block devices with a medium and the devices of mounted
/// filesystems (btrfs and other anonymous ones). A device of size 0 (a
/// detached loop device, a drive without a medium) stays in sysfs but holds
/// nothing its old counters were about.
fn live_devices(topo: &Topology) -> std::collections::HashSet<u32> {
    topo.devices()
        .iter()
        .filter(|d| d.size_sectors > 0)
        .map(|d| d.dev.to_kernel())
        .chain(topo.mounts().iter().map(|m| m.dev.to_kernel()))
        .collect()
}

async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

fn rescan_topology<R: Reporter>(
    host: &HostPaths,
    old: Topology,
    rest: &mut KernelMapsRest,
    attached: &mut probes::Attached,
    reporter: &mut R,
) -> Topology {
    match Topology::scan(host) {
        Ok(t) => {
            reporter.input_errors(&t.input_errors());
            if kernel_maps::sync(&t, host, rest).bio_based > 0 {
                attached.attach_bio_errors();
            }
            t
        }
        Err(e) => {
            // Keep the last good view: a failed scan is not a topology change.
            tracing::warn!("rescanning the device topology failed, keeping the previous view: {e}");
            old
        }
    }
}
