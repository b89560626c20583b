//! Pod volumes while `watch` runs: the index that annotates events, kept
//! current, and the conditions of each volume from kernel errors, checks and
//! CSI, printed when they change.
//!
//! The agent loop (`crate::agent`) calls in at four points: after each topology rescan
//! ([`LiveVolumes::topology_changed`]), after a mount-table change
//! ([`LiveVolumes::rediscover`]), with each batch of kernel errors
//! ([`LiveVolumes::record`]), and in its select loop ([`next_wake`] then
//! [`LiveVolumes::handle`]). Checks and CSI probes run in spawned tasks so
//! that a hung volume never holds up the event stream. Each volume is
//! checked on its own schedule (`schedule`) and its report applied as soon
//! as it comes, so a hung volume never delays another's checks; a CSI round
//! (every volume's node health and each driver's storage health) runs in a
//! task of its own, at most one at a time.

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use health_core::conditions::{CheckKind, ConditionConfig, Source};
use health_core::dev::Dev;
use health_csi::DriverOverride;
use health_kernel::collector::KernelError;
use health_topology::stack::StackReader;
use health_topology::{MountEntry, Topology};
use tokio::sync::Mutex;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Interval, MissedTickBehavior};

use super::io::{self, VolumeIo};
use super::latency::{DeviceClass, LatencyConfig, LatencyJudge};
use super::schedule::{CheckSchedule, Checked};
use super::stalls::{Namers, StallJudge, StallSource};
use super::{
    CsiOutcome, CsiProber, IndexedVolume, StorageOutcome, VolumeChanges, VolumeIndex, VolumeKey,
    VolumeMonitor,
};
use crate::volumes::checks::stack::{check_stacks, stack_reader, volume_devices, StackOutcome};
use crate::volumes::checks::{CheckConfig, Checker};
use crate::volumes::kubelet::{self, KubeletVolume};

#[derive(Clone, Debug)]
pub struct LiveVolumesConfig {
    pub kubelet_root: PathBuf,
    pub check: CheckConfig,
    /// Checks and kubelet rediscovery.
    pub check_interval: Duration,
    /// CSI node health calls, per volume, and storage health calls, per
    /// driver. Longer than the check interval by default: each is a request
    /// to a driver, and kubelet itself asks only every minute or two.
    pub csi_interval: Duration,
    /// The stack check of every volume (`checks::stack`).
    pub stack_interval: Duration,
    pub csi_overrides: Vec<DriverOverride>,
    pub conditions: ConditionConfig,
}

/// Default interval of CSI node health calls.
pub const DEFAULT_CSI_INTERVAL: Duration = Duration::from_secs(60);
/// Kernel errors are handed to the condition machine at most this often, so
/// a flood costs one observation per volume per interval.
const KERNEL_FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What woke the volume side of the watch loop.
#[derive(Debug)]
pub enum Wake {
    /// Rediscovery, kernel quiet windows, a CSI round when due.
    CheckTick,
    FlushKernel,
    /// Some volume's check is due.
    CheckDue,
    /// One volume's check ended.
    Checked(Checked),
    /// A CSI round ended (`None`: no driver connection could be made).
    Csi(Result<Option<CsiRound>, tokio::task::JoinError>),
    /// The stack check is due.
    StackTick,
    /// A stack round ended.
    Stack(Result<Vec<StackOutcome>, tokio::task::JoinError>),
}

/// One CSI cycle: each volume's answer and each driver's storage answer.
#[derive(Debug)]
pub struct CsiRound {
    volumes: Vec<CsiOutcome>,
    storage: Vec<StorageOutcome>,
}

/// What one [`LiveVolumes::handle`] or [`LiveVolumes::record`] produced.
#[derive(Debug, Default)]
pub struct Handled {
    pub changes: Vec<VolumeChanges>,
    /// CSI answers of a finished round (for metrics).
    pub csi: Vec<CsiOutcome>,
    /// Storage answers of a finished round, one per driver (for metrics).
    pub storage: Vec<StorageOutcome>,
    /// Volumes whose stack changed (or was read for the first time), with
    /// its one-line summary (`checks::stack::summary`).
    pub stacks: Vec<(VolumeKey, String)>,
    /// What a stall poll or a latency window saw per volume (for metrics).
    pub io: Vec<(VolumeKey, VolumeIo)>,
}

pub struct LiveVolumes {
    cfg: LiveVolumesConfig,
    /// Volumes dropped from the index since the last [`LiveVolumes::take_gone`].
    gone: Vec<VolumeKey>,
    discovered: Vec<KubeletVolume>,
    monitor: VolumeMonitor,
    checker: Checker,
    csi: Arc<Mutex<Option<CsiProber>>>,
    check_tick: Interval,
    flush_tick: Interval,
    next_csi: Instant,
    csi_round: Option<JoinHandle<Option<CsiRound>>>,
    stack_tick: Interval,
    /// At most one stack round at a time: a round stuck on a locked md
    /// attribute delays the next, never piles threads up.
    stack_round: Option<JoinHandle<Vec<StackOutcome>>>,
    /// Each volume's last stack summary, to report changes only.
    stack_seen: HashMap<VolumeKey, String>,
    stack_reader: Arc<std::sync::Mutex<StackReader>>,
    /// Set at a kernel error: the next stack round reads the NVMe health
    /// logs (rate limited), so a drive's warning comes with its first error.
    nvme_health_trigger: Option<Arc<AtomicBool>>,
    schedule: CheckSchedule,
    /// The mount table the checks use, shared with their tasks; replaced
    /// with the index.
    mounts: Arc<[MountEntry]>,
    stalls: StallJudge,
    latency: LatencyJudge,
}

impl LiveVolumes {
    /// Discovers the volumes now; the first check round starts at once.
    pub fn new(cfg: LiveVolumesConfig, topo: &Topology) -> Self {
        let discovered = kubelet::discover(&cfg.kubelet_root);
        let index = VolumeIndex::build(topo, discovered.clone());
        tracing::info!(
            root = %cfg.kubelet_root.display(),
            volumes = index.len(),
            "watching pod volumes"
        );
        let mut check_tick = tokio::time::interval(cfg.check_interval);
        check_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut flush_tick = tokio::time::interval(KERNEL_FLUSH_EVERY);
        flush_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut schedule = CheckSchedule::new(cfg.check_interval);
        schedule.sync(index.volumes(), Instant::now());
        let mut stack_tick = tokio::time::interval(cfg.stack_interval);
        stack_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let (stack_reader, nvme_health_trigger) = stack_reader(&cfg.check);
        Self {
            monitor: VolumeMonitor::new(index, cfg.conditions.clone()),
            checker: Checker::new(cfg.check.clone()),
            cfg,
            gone: Vec::new(),
            discovered,
            csi: Arc::new(Mutex::new(None)),
            check_tick,
            flush_tick,
            next_csi: Instant::now(),
            csi_round: None,
            stack_tick,
            stack_round: None,
            stack_seen: HashMap::new(),
            stack_reader: Arc::new(std::sync::Mutex::new(stack_reader)),
            nvme_health_trigger,
            schedule,
            mounts: topo.mounts().into(),
            stalls: StallJudge::default(),
            latency: LatencyJudge::default(),
        }
    }

    /// Volume checks running now (each until its report or its timeout).
    pub fn checks_running(&self) -> usize {
        self.schedule.running()
    }

    /// Probes blocked in the kernel now (each holds a thread).
    pub fn stuck_probes(&self) -> usize {
        self.checker.stuck_probes()
    }

    pub fn index(&self) -> &VolumeIndex {
        self.monitor.index()
    }

    /// One volume's conditions and probe history.
    pub fn health(&self, key: &VolumeKey) -> Option<&health_core::conditions::VolumeHealth> {
        self.monitor.health(key)
    }

    /// Re-resolves the known volumes against a new topology.
    pub fn topology_changed(&mut self, topo: &Topology) {
        self.rebuild(topo);
    }

    /// Reads the kubelet tree again (a mount change usually means a volume
    /// came or went) and rebuilds the index.
    pub fn rediscover(&mut self, topo: &Topology) {
        self.discovered = kubelet::discover(&self.cfg.kubelet_root);
        self.rebuild(topo);
    }

    fn rebuild(&mut self, topo: &Topology) {
        let index = VolumeIndex::build(topo, self.discovered.clone());
        let before = self.monitor.index().len();
        let gone = self.monitor.replace_index(index);
        if before != self.monitor.index().len() || !gone.is_empty() {
            tracing::info!(
                volumes = self.monitor.index().len(),
                gone = gone.len(),
                "pod volumes changed"
            );
        }
        self.gone.extend(gone);
        let index = self.monitor.index();
        self.stack_seen.retain(|k, _| index.get(k).is_some());
        self.mounts = topo.mounts().into();
        self.schedule
            .sync(self.monitor.index().volumes(), Instant::now());
    }

    /// Volumes that left the index since the last call (pods deleted).
    pub fn take_gone(&mut self) -> Vec<VolumeKey> {
        std::mem::take(&mut self.gone)
    }

    /// Condition changes of volumes that joined with their driver's storage
    /// conditions since the last call (the index is rebuilt outside
    /// [`LiveVolumes::handle`] too, on mount changes).
    pub fn take_inherited(&mut self) -> Vec<VolumeChanges> {
        self.monitor.take_inherited()
    }

    /// Accounts a batch of kernel errors to their volumes. They reach the
    /// condition machine on the next flush tick, or at once when they would
    /// raise a condition not yet raised: the first report of a failure is
    /// never held back, a flood's updates are.
    /// `who` names the cgroup an error was returned to (returned errors'
    /// samples carry it).
    pub fn record(
        &mut self,
        batch: &[KernelError],
        who: &mut dyn FnMut(u64) -> Option<String>,
    ) -> Vec<VolumeChanges> {
        let now = SystemTime::now();
        for e in batch {
            self.monitor.record_told(e, now, who);
        }
        if let (Some(t), false) = (&self.nvme_health_trigger, batch.is_empty()) {
            t.store(true, Ordering::Relaxed);
        }
        if self.monitor.take_urgent() {
            self.monitor.flush_kernel(now)
        } else {
            Vec::new()
        }
    }

    /// The devices whose counters tell the volumes' stalls where no bio
    /// is followed ([`super::inflight`]): each volume's own and every one
    /// below it (to name where the I/O is stuck, `dm-0 on sdb`).
    pub fn stall_devices(&self, topo: &Topology) -> BTreeSet<Dev> {
        let mut out = BTreeSet::new();
        let mut queue: Vec<Dev> = self
            .monitor
            .index()
            .volumes()
            .iter()
            .filter_map(|v| v.device)
            .flat_map(|d| topo.filesystem_backing_devices(d))
            .collect();
        while let Some(d) = queue.pop() {
            if out.insert(d) {
                if let Some(b) = topo.device(d) {
                    queue.extend(b.slaves.iter().copied());
                }
            }
        }
        out
    }

    /// Judges every volume against what waits now (see [`super::stalls`]);
    /// `now_ns` is CLOCK_MONOTONIC; `waiter` names a cgroup by its id
    /// ([`super::waiters`]). The changes, and what waits on each volume.
    pub fn stalls(
        &mut self,
        topo: &Topology,
        waits: &[health_kernel::waiting::DeviceWait],
        now_ns: u64,
        (stall_after, source): (Duration, StallSource),
        waiter: &mut dyn FnMut(u64) -> Option<String>,
    ) -> Handled {
        let index = Arc::clone(self.monitor.index());
        let monitor = &self.monitor;
        // The stack check's conditions of a stalled volume, joined to its
        // stall (a full pool, every path down: why it waits).
        let mut explain = |key: &VolumeKey| -> Vec<String> {
            monitor.health(key).map_or_else(Vec::new, |h| {
                h.conditions()
                    .into_iter()
                    .filter(|c| c.source == Source::Check(CheckKind::Stack))
                    .map(|c| format!("{}: {}", c.reason, c.message))
                    .collect()
            })
        };
        let reports = self.stalls.judge(
            index.volumes(),
            topo,
            waits,
            now_ns,
            (stall_after, source),
            Namers {
                waiter,
                explain: &mut explain,
            },
        );
        Handled {
            changes: self.monitor.apply_checks(SystemTime::now(), reports),
            io: io::waiting(index.volumes(), topo, waits, now_ns),
            ..Handled::default()
        }
    }

    /// Judges every volume against one window of completion latencies
    /// (see [`super::latency`]); `class_of` says what storage a device is,
    /// `storage_class` a volume's StorageClass where known.
    /// The changes, and each volume's completions in the window.
    pub fn latency(
        &mut self,
        topo: &Topology,
        window: &[health_kernel::latency::DeviceLatency],
        cfg: &LatencyConfig,
        class_of: &mut dyn FnMut(health_core::dev::Dev) -> DeviceClass,
        storage_class: &mut dyn FnMut(&IndexedVolume) -> Option<String>,
    ) -> Handled {
        let index = Arc::clone(self.monitor.index());
        let reports =
            self.latency
                .judge(index.volumes(), topo, window, cfg, class_of, storage_class);
        Handled {
            changes: self.monitor.apply_checks(SystemTime::now(), reports),
            io: io::latency(index.volumes(), topo, window),
            ..Handled::default()
        }
    }

    /// Handles what [`next_wake`] returned.
    pub fn handle(&mut self, wake: Wake, topo: &Topology) -> Handled {
        let now = SystemTime::now();
        let mut csi_out = Vec::new();
        let mut storage_out = Vec::new();
        let mut stacks_out = Vec::new();
        let changes = match wake {
            Wake::FlushKernel => self.monitor.flush_kernel(now),
            Wake::CheckTick => {
                self.rediscover(topo);
                if self.csi_round.is_none() && Instant::now() >= self.next_csi {
                    self.start_csi_round();
                }
                let mut changes = self.monitor.flush_kernel(now);
                changes.extend(self.monitor.tick(now));
                changes
            }
            // Started below, with any other volume due by now.
            Wake::CheckDue => Vec::new(),
            Wake::Checked(Checked { key, report }) => match report {
                Ok(report) => self.monitor.apply_checks(now, vec![(key, report)]),
                // No evidence: the volume keeps what it had.
                Err(e) => {
                    tracing::warn!(pod = %key.pod_uid, volume = %key.name, "a volume check failed: {e}");
                    Vec::new()
                }
            },
            Wake::StackTick => {
                if self.stack_round.is_none() {
                    self.start_stack_round(topo);
                }
                Vec::new()
            }
            Wake::Stack(result) => {
                self.stack_round = None;
                match result {
                    Ok(outcomes) => {
                        let mut reports = Vec::with_capacity(outcomes.len());
                        for (key, report, summary) in outcomes {
                            if self.stack_seen.get(&key) != Some(&summary) {
                                self.stack_seen.insert(key.clone(), summary.clone());
                                stacks_out.push((key.clone(), summary));
                            }
                            reports.push((key, report));
                        }
                        self.monitor.apply_checks(now, reports)
                    }
                    Err(e) => {
                        tracing::warn!("a stack check round failed: {e}");
                        Vec::new()
                    }
                }
            }
            Wake::Csi(result) => {
                self.csi_round = None;
                match result {
                    Ok(Some(csi)) => {
                        let mut changes = self.monitor.apply_csi(now, &csi.volumes);
                        changes.extend(self.monitor.apply_storage(now, &csi.storage));
                        csi_out = csi.volumes;
                        storage_out = csi.storage;
                        changes
                    }
                    Ok(None) => Vec::new(),
                    Err(e) => {
                        tracing::warn!("a CSI probe round failed: {e}");
                        Vec::new()
                    }
                }
            }
        };
        self.schedule.start_due(
            Instant::now(),
            self.monitor.index(),
            &self.mounts,
            &self.checker,
        );
        Handled {
            changes,
            csi: csi_out,
            storage: storage_out,
            stacks: stacks_out,
            io: Vec::new(),
        }
    }

    fn start_stack_round(&mut self, topo: &Topology) {
        let volumes = volume_devices(topo, self.monitor.index().volumes());
        if volumes.is_empty() {
            return;
        }
        let reader = Arc::clone(&self.stack_reader);
        // The block devices without the mounts: all a round needs, and
        // cheap to hand to its thread.
        let topo = Topology::from_parts(topo.devices().to_vec(), Vec::new());
        let threshold = self.cfg.check.thin_pool_low_percent;
        self.stack_round = Some(tokio::task::spawn_blocking(move || {
            check_stacks(&reader, &topo, &volumes, threshold)
        }));
    }

    fn start_csi_round(&mut self) {
        let volumes: Vec<IndexedVolume> = self.monitor.index().volumes().to_vec();
        self.next_csi = Instant::now() + self.cfg.csi_interval;
        let csi = Arc::clone(&self.csi);
        let root = self.cfg.kubelet_root.clone();
        let overrides = self.cfg.csi_overrides.clone();
        let timeout = self.cfg.check.timeout;
        self.csi_round = Some(tokio::spawn(async move {
            let mut guard = csi.lock().await;
            match guard.as_mut() {
                Some(p) => p.refresh(Some(&root)).await,
                None => *guard = Some(CsiProber::connect(Some(&root), &overrides, timeout).await),
            }
            let p = guard.as_ref()?;
            // One storage call per driver beside the volume calls: both
            // bounded by the call timeout, so the cycle takes no longer
            // than before.
            let (volumes, storage) = tokio::join!(p.probe(&volumes), p.probe_storage());
            Some(CsiRound { volumes, storage })
        }));
    }
}

/// Waits for the next thing the volume side must do; never resolves when
/// volumes are not watched. Cancel-safe (ticks and the join handle are).
pub async fn next_wake(volumes: &mut Option<LiveVolumes>) -> Wake {
    let Some(v) = volumes else {
        return std::future::pending().await;
    };
    let has_pending = v.monitor.has_pending();
    let next_due = v.schedule.next_due();
    tokio::select! {
        _ = v.check_tick.tick() => Wake::CheckTick,
        _ = v.flush_tick.tick(), if has_pending => Wake::FlushKernel,
        _ = sleep_until(next_due) => Wake::CheckDue,
        c = v.schedule.next_checked() => Wake::Checked(c),
        r = wait_round(&mut v.csi_round) => Wake::Csi(r),
        _ = v.stack_tick.tick() => Wake::StackTick,
        r = wait_round(&mut v.stack_round) => Wake::Stack(r),
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn wait_round<T>(round: &mut Option<JoinHandle<T>>) -> Result<T, tokio::task::JoinError> {
    match round {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}
