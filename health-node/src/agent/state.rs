//! What the loop keeps between turns (the attached programs, the
//! collector, the topology, the volumes and the reporter), with one method
//! per kind of work the loop does: reconcile the counters, rescan the
//! topology, hand a turn's results on, and finish.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use health_core::dev::Dev;
use health_kernel::clock::{monotonic_ns, Clock};
use health_kernel::collector::{Collector, KernelError};
use health_kernel::device_maps::KernelMapsRest;
use health_kernel::latency::LatencyWindows;
use health_kernel::probes::{self, SourceState};
use health_kernel::tracer_count::TracerCount;
use health_topology::{HostPaths, Incarnation, MountWatcher, Topology};

use super::earlier_devices::{self, Said};
use super::priority::EventThread;
use super::{kernel_maps, tracer_count, AgentOptions, MIN_RESCAN_GAP};
use crate::report::Reporter;
use crate::volumes::inflight::InflightCounters;
use crate::volumes::latency::{classify, LatencyConfig};
use crate::volumes::stalls::StallSource;
use crate::volumes::waiters::Waiters;
use crate::volumes::{Handled, LiveVolumes, Wake};

/// What the volumes are told after a rescan.
pub(super) enum Then {
    /// Devices may have come or gone.
    TopologyChanged,
    /// The mount table changed: kubelet likely set a volume up or tore one
    /// down, so its directories are read again too.
    Rediscover,
}

pub(super) struct Agent<R> {
    host: HostPaths,
    attached: probes::Attached,
    pub(super) collector: Collector,
    rest: KernelMapsRest,
    witness: Option<TracerCount>,
    pub(super) topo: Topology,
    pub(super) mounts: MountWatcher,
    pub(super) vols: Option<LiveVolumes>,
    pub(super) reporter: R,
    clock: Clock,
    /// The turn's kernel errors, and the volumes' condition changes.
    pub(super) batch: Vec<KernelError>,
    handled: Handled,
    misses: Misses,
    last_rescan: Instant,
    pruned_at: Instant,
    /// Every device number a topology of this process listed.
    ever_known: HashSet<u32>,
    /// Devices whose errors could not be placed, warned about once.
    unplaced: HashSet<Dev>,
    /// Earlier holders of a device number whose errors were seen, said once.
    earlier: Said,
    /// Devices bound again since a scan, by number and sequence number,
    /// that made the agent rescan ([`Agent::rebound_since_the_scan`]).
    rebound: HashSet<(u32, u64)>,
    /// Numbers of disks sysfs lists without one, learned from the kernel
    /// side's record of failed requests (5.10's hidden NVMe path disks),
    /// by name; every scan uses them.
    learned_numbers: HashMap<String, Dev>,
    /// Unknown devices whose name was found there. One not found is
    /// looked up again with its next errors: the kernel side names a disk
    /// in a program of its own, which may run after the one whose sample
    /// brought the error (the tracepoint's programs run in the order they
    /// were attached, and an adopted one was attached first).
    named: HashSet<u32>,
    /// Names the cgroup a stalled bio is charged to.
    waiters: Waiters,
    /// The latency counts of the last window's end.
    latency_windows: LatencyWindows,
    /// The devices' own counters, where no bio is followed.
    inflight: InflightCounters,
}

impl<R: Reporter> Agent<R> {
    /// Attaches the programs and takes the first look at the host.
    pub(super) fn start(opts: &AgentOptions, mut reporter: R) -> anyhow::Result<Self> {
        let (mut attached, maps) = probes::attach(&opts.probes)?;
        for s in &attached.sources {
            if matches!(s.state, SourceState::Missing { .. }) {
                tracing::warn!("{s}");
            } else {
                tracing::info!("{s}");
            }
        }
        let waiters = Waiters::new(&opts.cgroup_root, &opts.host.proc_root);
        match &attached.waiting {
            Ok(programs) => {
                tracing::info!(
                    "stalls: following every bio from block_bio_queue to its completion with {programs}"
                );
                if let Some(l) = &opts.latency {
                    tracing::info!(
                        "latency: windows of {:?}; p99 limits rotational {:?}, ssd {:?}, network {:?}, and {}x a volume's baseline",
                        l.window,
                        l.limits.rotational,
                        l.limits.ssd,
                        l.limits.network,
                        l.relative
                    );
                }
                match waiters.root() {
                    Ok(root) => tracing::info!(
                        "stalls: the oldest bio's pod or cgroup looked up in {}",
                        root.display()
                    ),
                    Err(why) => tracing::warn!("stalls: no pod or cgroup named: {why}"),
                }
            }
            Err(why) => match opts.stall_after {
                None if opts.volumes.is_none() => tracing::info!("stalls: off (no pod volumes)"),
                None => tracing::info!("stalls: off (--stall-after 0)"),
                Some(after) if opts.probes.follow_bios => tracing::warn!(
                    "stalls: bios not followed ({why}); a volume is IOStalled once its devices have completed nothing for {after:?} while requests wait (their counters, read every 0.5 s), whose I/O waits not named"
                ),
                Some(after) => tracing::info!(
                    "stalls: a volume is IOStalled once its devices have completed nothing for {after:?} while requests wait (their counters, read every 0.5 s); no bio followed ({why}): --follow-bios names whose I/O waits"
                ),
            },
        }
        let mut maps = Some(maps);
        let (mut collector, mut rest) =
            Collector::new(&mut maps, attached.pinned()).context("setting up the sample reader")?;
        if attached.adopted() {
            tracing::info!("adopted programs that kept counting since the previous agent stopped");
        }
        let witness = tracer_count::start(&opts.probes.sys_root, &attached, &mut collector);
        let topo = Topology::scan(&opts.host).context("reading the device topology")?;
        reporter.input_errors(&topo.input_errors());
        if kernel_maps::sync(&topo, &opts.host, &mut rest).bio_based > 0 {
            attached.attach_bio_errors();
        }
        let mounts = MountWatcher::new(&opts.host).context("watching the mount table")?;
        let vols = opts.volumes.clone().map(|cfg| LiveVolumes::new(cfg, &topo));
        let now = Instant::now();
        Ok(Agent {
            host: opts.host.clone(),
            attached,
            collector,
            rest,
            witness,
            topo,
            mounts,
            vols,
            reporter,
            clock: Clock::new(),
            batch: Vec::new(),
            handled: Handled::default(),
            misses: Misses::default(),
            last_rescan: now,
            pruned_at: now,
            ever_known: HashSet::new(),
            unplaced: HashSet::new(),
            earlier: Said::default(),
            rebound: HashSet::new(),
            learned_numbers: HashMap::new(),
            named: HashSet::new(),
            waiters,
            latency_windows: LatencyWindows::default(),
            inflight: InflightCounters::default(),
        })
    }

    pub(super) fn active_sources(&self) -> usize {
        self.attached
            .sources
            .iter()
            .filter(|s| matches!(s.state, SourceState::Active { .. }))
            .count()
    }

    /// Counters against samples: errors whose samples were rate-limited
    /// away become summaries; the kernel side's own figures are reported.
    pub(super) fn reconcile(&mut self) -> anyhow::Result<()> {
        let traced = tracer_count::read(&mut self.witness);
        self.collector.reconcile(false, &mut self.batch)?;
        let mut stats = self.collector.kernel_stats()?;
        stats.program_misses = self.misses.read(&self.attached);
        tracer_count::check(&mut self.witness, traced, &self.collector, &mut stats)?;
        self.reporter.kernel_stats(&stats);
        Ok(())
    }

    /// A fresh topology, written into the kernel maps, and the volumes told.
    pub(super) fn rescan(&mut self, then: Then) {
        match Topology::scan_with_numbers(&self.host, &self.learned_numbers) {
            Ok(t) => {
                self.reporter.input_errors(&t.input_errors());
                if kernel_maps::sync(&t, &self.host, &mut self.rest).bio_based > 0 {
                    self.attached.attach_bio_errors();
                }
                self.topo = t;
            }
            // Keep the last good view: a failed scan is not a topology change.
            Err(e) => tracing::warn!(
                "rescanning the device topology failed, keeping the previous view: {e}"
            ),
        }
        self.last_rescan = Instant::now();
        if let Some(v) = &mut self.vols {
            match then {
                Then::TopologyChanged => v.topology_changed(&self.topo),
                Then::Rediscover => v.rediscover(&self.topo),
            }
        }
    }

    /// Reads what waits now and judges the volumes' stalls: the bios the
    /// kernel side follows (those old enough to matter confirmed with the
    /// kernel first) or, where none are, the devices' counters.
    pub(super) fn poll_stalls(&mut self, stall_after: Option<Duration>) -> anyhow::Result<()> {
        let (Some(stall_after), Some(vols)) = (stall_after, self.vols.as_mut()) else {
            return Ok(());
        };
        let now = monotonic_ns();
        let (waits, source) = if self.attached.waiting.is_ok() {
            let old_before = now.saturating_sub(stall_after.as_nanos() as u64);
            let attached = &self.attached;
            let read = self
                .rest
                .waiting(now, old_before, |addr| attached.bio_state(addr));
            if read.stale_removed > 0 {
                tracing::debug!(
                    entries = read.stale_removed,
                    "removed waiting-bio entries whose completion no program saw"
                );
            }
            (read.devices, StallSource::Bios)
        } else {
            let devices = vols.stall_devices(&self.topo);
            let waits = self.inflight.read(&self.host.sys_root, &devices, now);
            (waits, StallSource::Counters)
        };
        let (waiters, names) = (&mut self.waiters, self.reporter.pod_names());
        let seen = vols.stalls(&self.topo, &waits, now, (stall_after, source), &mut |id| {
            waiters.describe(id, names)
        });
        self.handled.changes.extend(seen.changes);
        self.handled.io.extend(seen.io);
        Ok(())
    }

    /// Reads one window of completion latencies and judges the volumes'.
    pub(super) fn poll_latency(&mut self, cfg: Option<&LatencyConfig>) -> anyhow::Result<()> {
        let (Some(cfg), Some(vols)) = (cfg, self.vols.as_mut()) else {
            return Ok(());
        };
        if self.attached.waiting.is_err() {
            return Ok(());
        }
        let topo = &self.topo;
        let window = self
            .rest
            .latency_window(&mut self.latency_windows, |d| topo.device(d).is_some())
            .context("reading the latency counts")?;
        // A few sysfs reads per volume per window: read each time, so that
        // a device number used again by other storage is not misjudged.
        let sys = &self.host.sys_root;
        let classes = self.reporter.storage_classes();
        let seen = vols.latency(
            topo,
            &window,
            cfg,
            &mut |d| classify(topo, d, sys),
            &mut |v| classes?.storage_class(&v.key).map(str::to_string),
        );
        self.handled.changes.extend(seen.changes);
        self.handled.io.extend(seen.io);
        Ok(())
    }

    /// A check, CSI call or rediscovery the volumes scheduled is due.
    pub(super) fn volumes_woke(&mut self, wake: Wake) {
        if let Some(v) = &mut self.vols {
            self.handled = v.handle(wake, &self.topo);
        }
    }

    /// After every turn: counters of devices gone are pruned, a device the
    /// topology does not know yet is looked for, and the turn's errors and
    /// changes go to the reporter.
    pub(super) fn end_turn(&mut self, prio: &EventThread) -> anyhow::Result<()> {
        self.attached.flush_kernel_log();
        if self.last_rescan != self.pruned_at {
            self.pruned_at = self.last_rescan;
            let live = live_devices(&self.topo);
            // Only devices a topology listed can be gone: the counters of
            // one that never was (a disk sysfs does not list) stay, named
            // by number, instead of vanishing from the totals. A detached
            // loop device stays listed (size 0), so it is known.
            let known = &mut self.ever_known;
            known.extend(live.iter().copied());
            known.extend(self.topo.devices().iter().map(|d| d.dev.to_kernel()));
            let topo = &self.topo;
            let pruned = self.collector.prune(
                |key| {
                    (known.contains(&key.dev) && !live.contains(&key.dev))
                        || topo.is_earlier(Dev::from_kernel(key.dev), key.diskseq)
                },
                &mut self.batch,
            )?;
            if pruned > 0 {
                tracing::info!(
                    keys = pruned,
                    "pruned the counters of devices that are gone"
                );
            }
        }
        // One pass over the turn's errors; almost always none is unknown.
        let mut unknown: Vec<u32> = self
            .batch
            .iter()
            .filter(|e| is_unknown_block_device(&self.topo, e))
            .map(|e| e.key.dev)
            .collect();
        if !unknown.is_empty() {
            unknown.sort_unstable();
            unknown.dedup();
            let learned = self.learn_numbers(&unknown);
            let rebound = self.rebound_since_the_scan();
            if learned || rebound || self.last_rescan.elapsed() >= MIN_RESCAN_GAP {
                let _rescan = prio.bulk();
                self.rescan(Then::TopologyChanged);
            }
            self.warn_unplaced(&unknown);
        }
        let earlier = self.earlier.take(&self.topo, &mut self.batch);
        self.deliver()?;
        earlier_devices::report(&mut self.reporter, &earlier, &self.clock)?;
        self.collector.persist()?;
        Ok(())
    }

    /// Whether a turn's errors name a device bound again since the last
    /// scan (a sequence number newer than the scan's: a loop device given
    /// another file, a number taken by a new disk) not seen before: the
    /// topology is then rescanned at once, whatever the gap, so that these
    /// very errors are told for the new device rather than the one the
    /// scan saw. Once per number and sequence number (bounded: forgotten
    /// past 1024), so a flood on a device sysfs shows otherwise cannot
    /// rescan every turn.
    fn rebound_since_the_scan(&mut self) -> bool {
        let mut any = false;
        for e in &self.batch {
            let dev = Dev::from_kernel(e.key.dev);
            if self.topo.incarnation(dev, e.key.diskseq) != Incarnation::Later {
                continue;
            }
            if self.rebound.len() >= 1024 {
                self.rebound.clear();
            }
            any |= self.rebound.insert((e.key.dev, e.key.diskseq));
        }
        any
    }

    /// For errors on a device the topology does not know, the disk's name
    /// as the kernel side recorded it; a name that sysfs lists without a
    /// number (5.10's hidden NVMe path disks) gets this one. Whether
    /// anything was learned: the topology is then rescanned at once, so
    /// that these very errors reach their volumes.
    fn learn_numbers(&mut self, unknown: &[u32]) -> bool {
        let mut seen = Vec::new();
        for &dev in unknown {
            if self.named.contains(&dev) {
                continue;
            }
            if let Some(name) = self.rest.disk_name(dev) {
                self.named.insert(dev);
                seen.push((Dev::from_kernel(dev), name));
            }
        }
        let found = health_topology::nvme::unnumbered_disks(&self.host.sys_root, seen);
        for (name, dev) in &found {
            tracing::info!(
                disk = %name,
                device = %dev,
                "a disk sysfs lists without a number failed a request: placed by the number the request carried"
            );
        }
        let learned = !found.is_empty();
        self.learned_numbers.extend(found);
        learned
    }

    /// Errors on a block device no scan lists (a disk sysfs hides, gone
    /// before it could be seen) are counted and printed by number, but
    /// reach no volume: said once per device, so it is never silent.
    /// `unknown` were unknown before a rescan that may have placed them.
    fn warn_unplaced(&mut self, unknown: &[u32]) {
        for &d in unknown {
            let dev = Dev::from_kernel(d);
            if self.topo.device(dev).is_none() && self.unplaced.insert(dev) {
                tracing::warn!(
                    device = %dev,
                    "errors on a block device that sysfs does not list: counted and shown by number, attributed to no volume"
                );
            }
        }
    }

    fn deliver(&mut self) -> anyhow::Result<()> {
        deliver(
            &mut self.reporter,
            &mut self.vols,
            &mut self.batch,
            &mut self.handled,
            &mut self.waiters,
            &self.topo,
            &self.clock,
        )
    }

    /// Unpinned: detach first, then collect what the kernel counted up to
    /// that point: the last lines printed make every total exact. (Skipped
    /// runs are read before: they go with the programs.) Pinned: the
    /// programs keep counting for the next process; what is reported now
    /// is recorded as reported, and a sample of it still in the ring buffer
    /// is a late one for the next process, not a second report.
    pub(super) fn finish(self) -> anyhow::Result<()> {
        let Agent {
            attached,
            mut collector,
            mut witness,
            topo,
            mut vols,
            mut reporter,
            clock,
            mut batch,
            mut handled,
            mut misses,
            mut waiters,
            earlier: mut said,
            ..
        } = self;
        let program_misses = misses.read(&attached);
        // Read before the programs detach: failures after it are traced but
        // were never going to be counted by this process.
        let traced = tracer_count::read(&mut witness);
        if !attached.pinned() {
            drop(attached);
        }
        collector.reconcile(true, &mut batch)?;
        let earlier = said.take(&topo, &mut batch);
        deliver(
            &mut reporter,
            &mut vols,
            &mut batch,
            &mut handled,
            &mut waiters,
            &topo,
            &clock,
        )?;
        earlier_devices::report(&mut reporter, &earlier, &clock)?;
        collector.persist()?;
        let mut stats = collector.kernel_stats()?;
        stats.program_misses = program_misses;
        tracer_count::check(&mut witness, traced, &collector, &mut stats)?;
        reporter.kernel_stats(&stats);
        reporter.finish(&collector.totals()?, &topo, &stats)
    }
}

/// Hands one turn's results to the reporter: the batch goes to the volumes
/// first (a new condition is raised at once), then the errors, then what
/// changed. Empties `batch` and `handled` for the next turn.
fn deliver<R: Reporter>(
    reporter: &mut R,
    vols: &mut Option<LiveVolumes>,
    batch: &mut Vec<KernelError>,
    handled: &mut Handled,
    waiters: &mut Waiters,
    topo: &Topology,
    clock: &Clock,
) -> anyhow::Result<()> {
    if let Some(v) = vols.as_mut() {
        handled.changes.extend(v.take_inherited());
        let names = reporter.pod_names();
        handled
            .changes
            .extend(v.record(batch, &mut |id| waiters.describe(id, names)));
    }
    reporter.errors(batch, topo, clock, vols.as_ref().map(LiveVolumes::index))?;
    batch.clear();
    if let Some(v) = vols.as_mut() {
        let gone = v.take_gone();
        if !handled.changes.is_empty()
            || !handled.csi.is_empty()
            || !handled.storage.is_empty()
            || !handled.stacks.is_empty()
            || !handled.io.is_empty()
            || !gone.is_empty()
        {
            reporter.changes(handled, &gone, v);
        }
    }
    handled.changes.clear();
    handled.csi.clear();
    handled.storage.clear();
    handled.stacks.clear();
    handled.io.clear();
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

/// A block device the topology has not seen yet (attached after the last
/// scan, or bound again: its sequence number is newer than the scan's). Anonymous devices (btrfs, the block-device pseudo filesystem) are
/// never in sysfs, so they must not trigger a rescan: a btrfs error flood
/// would otherwise rescan the whole host every second.
fn is_unknown_block_device(topo: &Topology, e: &KernelError) -> bool {
    let dev = Dev::from_kernel(e.key.dev);
    if dev.is_anonymous() {
        return false;
    }
    match topo.device(dev) {
        None => true,
        found => Incarnation::of(found, e.key.diskseq) == Incarnation::Later,
    }
}

/// Every device number an error key can carry that the topology still
/// knows: block devices with a medium and the devices of mounted
/// filesystems (btrfs and other anonymous ones). A device of size 0 (a
/// detached loop device, a drive without a medium) stays in sysfs but holds
/// nothing its old counters were about.
fn live_devices(topo: &Topology) -> HashSet<u32> {
    topo.devices()
        .iter()
        .filter(|d| d.size_sectors > 0)
        .map(|d| d.dev.to_kernel())
        .chain(topo.mounts().iter().map(|m| m.dev.to_kernel()))
        .collect()
}
