//! [`VolumeMonitor`]: one condition state machine per pod volume, fed with
//! kernel errors (aggregated per flush), the built-in checks, CSI node
//! health and each driver's storage health; it returns what changed.
//! [`run_checks`] runs one round of checks (`health-agent volumes`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use health_core::conditions::{
    Change, ConditionConfig, CsiReport, KernelErrorKind, KernelErrors, Observation, VolumeHealth,
};
use health_core::dev::Dev;
use health_core::taxonomy::kernel_error_kind;
use health_kernel::clock::Clock;
use health_kernel::collector::KernelError;
use health_kernel::names::op_name;
use health_topology::MountEntry;

use super::index::{IndexedVolume, VolumeIndex};
use super::storage::{is_csi_volume_of, StorageOutcome, StorageResult};
use super::CsiOutcome;
use super::VolumeKey;
use crate::volumes::checks::{CheckReport, Checker};
use crate::volumes::kubelet::VolumeMode;

/// Kernel errors of one (kind, op, errno, device) for one volume since the
/// last flush.
#[derive(Clone, Debug)]
struct Pending {
    kind: KernelErrorKind,
    op: Option<&'static str>,
    errno: u32,
    device: Dev,
    /// Whom returned errors were told to (`pod ns/name (container c)`).
    who: Option<String>,
    count: u64,
    first: SystemTime,
    last: SystemTime,
}

#[derive(Clone, Debug)]
struct VolumeState {
    health: VolumeHealth,
    /// Kept between flushes so that steady-state recording does not allocate.
    pending: Vec<Pending>,
}

/// What changed for one volume.
#[derive(Clone, Debug, PartialEq)]
pub struct VolumeChanges {
    pub key: VolumeKey,
    pub changes: Vec<Change>,
}

/// Per-volume health from kernel errors, checks and CSI.
#[derive(Debug)]
pub struct VolumeMonitor {
    index: Arc<VolumeIndex>,
    /// Parallel to `index.volumes()`.
    states: Vec<VolumeState>,
    /// Indices with pending kernel errors, each once.
    dirty: Vec<u32>,
    /// A pending error would raise a condition not yet raised: flush now
    /// rather than on the next tick, so the first report is immediate.
    urgent: bool,
    config: ConditionConfig,
    clock: Clock,
    /// Each driver's last storage answer that carried health, and when it
    /// came: a volume of the driver that appears later starts with it.
    storage: BTreeMap<String, (SystemTime, StorageOutcome)>,
    /// Changes of volumes that inherited their driver's storage conditions
    /// when they joined the index, until [`VolumeMonitor::take_inherited`].
    inherited: Vec<VolumeChanges>,
}

impl VolumeMonitor {
    pub fn new(index: VolumeIndex, config: ConditionConfig) -> Self {
        let states = (0..index.len()).map(|_| new_state(&config)).collect();
        Self {
            index: Arc::new(index),
            states,
            dirty: Vec::new(),
            urgent: false,
            config,
            clock: Clock::new(),
            storage: BTreeMap::new(),
            inherited: Vec::new(),
        }
    }

    /// The current index; cheap to clone and hand to another task.
    pub fn index(&self) -> &Arc<VolumeIndex> {
        &self.index
    }

    /// Switches to a rebuilt index. Volumes still present keep their health
    /// and pending errors; volumes gone are dropped and returned (a reporter
    /// may want to say so), new ones start healthy except for their driver's
    /// storage conditions, which they inherit at once (the changes wait in
    /// [`VolumeMonitor::take_inherited`]).
    pub fn replace_index(&mut self, index: VolumeIndex) -> Vec<VolumeKey> {
        // Errors recorded against the old index belong to volumes by key;
        // carry them over rather than flushing at an arbitrary time.
        let mut old: HashMap<VolumeKey, VolumeState> = self
            .index
            .volumes()
            .iter()
            .map(|v| v.key.clone())
            .zip(std::mem::take(&mut self.states))
            .collect();
        let mut states = Vec::with_capacity(index.len());
        let mut dirty = Vec::new();
        for (i, v) in index.volumes().iter().enumerate() {
            let state = match old.remove(&v.key) {
                Some(state) => state,
                None => {
                    let mut state = new_state(&self.config);
                    self.inherit_storage(v, &mut state);
                    state
                }
            };
            if !state.pending.is_empty() {
                dirty.push(i as u32);
            }
            states.push(state);
        }
        let mut gone: Vec<VolumeKey> = old.into_keys().collect();
        gone.sort();
        self.index = Arc::new(index);
        self.states = states;
        self.dirty = dirty;
        gone
    }

    /// Accounts one kernel error (a sample or a summary) to every volume its
    /// device reaches. Hash lookup plus a short linear scan per volume; it
    /// allocates only when a volume sees a new (kind, op, errno, device)
    /// between two flushes.
    pub fn record(&mut self, e: &KernelError, now: SystemTime) {
        self.record_told(e, now, &mut |_| None);
    }

    /// As [`VolumeMonitor::record`], naming whom a returned error was told
    /// to: `name` turns its sample's cgroup id into a pod and container. It
    /// is asked only for a returned error that reaches a volume, so that
    /// an application's errors elsewhere on the node cost no lookup.
    pub fn record_told(
        &mut self,
        e: &KernelError,
        now: SystemTime,
        name: &mut dyn FnMut(u64) -> Option<String>,
    ) {
        let when = e
            .sample
            .as_ref()
            .map_or(now, |s| self.clock.wall_time(s.mono_ns));
        self.record_in(e, (when, when), name);
    }

    /// As [`VolumeMonitor::record`], for errors known to span `first` to
    /// `last` (the kernel's per-key times, read by `volumes`).
    pub fn record_span(&mut self, e: &KernelError, first: SystemTime, last: SystemTime) {
        self.record_in(e, (first, last), &mut |_| None);
    }

    fn record_in(
        &mut self,
        e: &KernelError,
        (first, last): (SystemTime, SystemTime),
        name: &mut dyn FnMut(u64) -> Option<String>,
    ) {
        let dev = Dev::from_kernel(e.key.dev);
        let indices = self.index.indices_for(dev);
        if indices.is_empty() || e.count == 0 {
            return;
        }
        // Counted and shown, but not evidence of ill health (EOPNOTSUPP of
        // a discard, EAGAIN of nowait I/O): no condition.
        let Some(kind) = kernel_error_kind(e.key.source, e.key.errno) else {
            return;
        };
        let op = op_name(e.key.op);
        let told = e
            .sample
            .as_ref()
            .filter(|s| kind.returned() && s.cgroup != 0)
            .and_then(|s| name(s.cgroup));
        let who = told.as_deref();
        for &i in indices {
            let Some(state) = self.states.get_mut(i as usize) else {
                continue;
            };
            let kind = if self.index.via_redundant_array(dev, i) {
                KernelErrorKind::ArrayMemberErrors
            } else {
                kind
            };
            if state.pending.is_empty() {
                self.dirty.push(i);
            }
            match state.pending.iter_mut().find(|p| {
                p.kind == kind
                    && p.op == op
                    && p.errno == e.key.errno
                    && p.device == dev
                    && p.who.as_deref() == who
            }) {
                Some(p) => {
                    p.count = p.count.saturating_add(e.count);
                    p.first = p.first.min(first);
                    p.last = p.last.max(last);
                }
                None => {
                    if !state.health.kernel_active(kind) {
                        self.urgent = true;
                    }
                    state.pending.push(Pending {
                        kind,
                        op,
                        errno: e.key.errno,
                        device: dev,
                        who: who.map(str::to_string),
                        count: e.count,
                        first,
                        last,
                    })
                }
            }
        }
    }

    /// Whether the errors recorded since the last flush would raise a new
    /// condition (see `urgent`); resets the flag.
    pub fn take_urgent(&mut self) -> bool {
        std::mem::take(&mut self.urgent)
    }

    /// Whether kernel errors wait for [`VolumeMonitor::flush_kernel`].
    pub fn has_pending(&self) -> bool {
        !self.dirty.is_empty()
    }

    /// Feeds the kernel errors recorded since the last flush, one
    /// `Observation::Kernel` per volume.
    pub fn flush_kernel(&mut self, now: SystemTime) -> Vec<VolumeChanges> {
        let mut out = Vec::new();
        self.urgent = false;
        let dirty = std::mem::take(&mut self.dirty);
        for &i in &dirty {
            let (Some(state), Some(vol)) = (
                self.states.get_mut(i as usize),
                self.index.volumes().get(i as usize),
            ) else {
                continue;
            };
            let errors: Vec<KernelErrors> = state
                .pending
                .drain(..)
                .map(|p| kernel_errors(&self.index, vol, &p))
                .collect();
            push_changes(
                &mut out,
                &vol.key,
                state.health.apply(now, Observation::Kernel(errors)),
            );
        }
        // Reuse the allocation.
        self.dirty = dirty;
        self.dirty.clear();
        out
    }

    /// The kernel errors recorded for `key` since the last flush.
    pub fn pending_errors(&self, key: &VolumeKey) -> Vec<KernelErrors> {
        let Some(i) = self.index.position(key) else {
            return Vec::new();
        };
        let (Some(state), Some(vol)) = (self.states.get(i), self.index.volumes().get(i)) else {
            return Vec::new();
        };
        state
            .pending
            .iter()
            .map(|p| kernel_errors(&self.index, vol, p))
            .collect()
    }

    /// Feeds check reports (a round from [`run_checks`], or one volume's).
    pub fn apply_checks(
        &mut self,
        now: SystemTime,
        reports: Vec<(VolumeKey, CheckReport)>,
    ) -> Vec<VolumeChanges> {
        let mut out = Vec::new();
        for (key, report) in reports {
            let Some(state) = self.state_mut(&key) else {
                continue;
            };
            let changes: Vec<Change> = report
                .into_observations()
                .into_iter()
                .flat_map(|o| state.health.apply(now, o))
                .collect();
            push_changes(&mut out, &key, changes);
        }
        out
    }

    /// Feeds a round of CSI node answers (from [`CsiProber::probe`](crate::volumes::CsiProber::probe)).
    pub fn apply_csi(&mut self, now: SystemTime, outcomes: &[CsiOutcome]) -> Vec<VolumeChanges> {
        let mut out = Vec::new();
        for o in outcomes {
            let Some(state) = self.state_mut(&o.key) else {
                continue;
            };
            let report: CsiReport = o.result.to_report();
            push_changes(
                &mut out,
                &o.key,
                state.health.apply(now, Observation::CsiNode(report)),
            );
        }
        out
    }

    /// Feeds a round of storage answers (from [`CsiProber::probe_storage`]):
    /// each driver's answer goes to every CSI volume of that driver, reduced
    /// to the entries that concern the volume's mode. An empty answer clears
    /// the driver's storage conditions on all its volumes at once; a failed
    /// probe is counted on each and clears nothing; UNIMPLEMENTED says
    /// nothing at all.
    ///
    /// [`CsiProber::probe_storage`]: super::CsiProber::probe_storage
    pub fn apply_storage(
        &mut self,
        now: SystemTime,
        outcomes: &[StorageOutcome],
    ) -> Vec<VolumeChanges> {
        let mut out = Vec::new();
        for o in outcomes {
            if matches!(o.result, StorageResult::Health { .. }) {
                self.storage.insert(o.driver.clone(), (now, o.clone()));
            }
            for (v, state) in self.index.volumes().iter().zip(&mut self.states) {
                if !is_csi_volume_of(v, &o.driver) {
                    continue;
                }
                if let Some(report) = o.report_for(v.volume.volume_mode) {
                    let changes = state.health.apply(now, Observation::CsiStorage(report));
                    push_changes(&mut out, &v.key, changes);
                }
            }
        }
        out
    }

    /// Changes of volumes that joined the index with their driver's storage
    /// conditions (see [`VolumeMonitor::replace_index`]).
    pub fn take_inherited(&mut self) -> Vec<VolumeChanges> {
        std::mem::take(&mut self.inherited)
    }

    /// A new volume gets its driver's last storage answer, as of the time
    /// that answer came (its `since` and last probe say when the evidence
    /// was had, not when the volume appeared).
    fn inherit_storage(&mut self, v: &IndexedVolume, state: &mut VolumeState) {
        let Some(driver) = v.volume.driver.as_deref() else {
            return;
        };
        let Some((when, outcome)) = self.storage.get(driver) else {
            return;
        };
        if !is_csi_volume_of(v, driver) {
            return;
        }
        if let Some(report) = outcome.report_for(v.volume.volume_mode) {
            let changes = state.health.apply(*when, Observation::CsiStorage(report));
            push_changes(&mut self.inherited, &v.key, changes);
        }
    }

    /// Periodic evaluation (kernel quiet windows).
    pub fn tick(&mut self, now: SystemTime) -> Vec<VolumeChanges> {
        let mut out = Vec::new();
        for (v, state) in self.index.volumes().iter().zip(&mut self.states) {
            push_changes(&mut out, &v.key, state.health.tick(now));
        }
        out
    }

    pub fn health(&self, key: &VolumeKey) -> Option<&VolumeHealth> {
        let i = self.index.position(key)?;
        self.states.get(i).map(|s| &s.health)
    }

    fn state_mut(&mut self, key: &VolumeKey) -> Option<&mut VolumeState> {
        let i = self.index.position(key)?;
        self.states.get_mut(i)
    }
}

fn kernel_errors(index: &VolumeIndex, vol: &IndexedVolume, p: &Pending) -> KernelErrors {
    KernelErrors {
        kind: p.kind,
        count: p.count,
        first: p.first,
        last: p.last,
        device: Some(p.device),
        mount_point: match vol.volume.volume_mode {
            VolumeMode::Filesystem => Some(vol.volume.path.clone()),
            VolumeMode::Block => None,
        },
        op: p.op.map(str::to_string),
        errno: (p.errno != 0).then_some(p.errno as i32),
        device_name: index.device_name(p.device).map(str::to_string),
        who: p.who.clone(),
    }
}

fn new_state(config: &ConditionConfig) -> VolumeState {
    VolumeState {
        health: VolumeHealth::new(config.clone()),
        pending: Vec::new(),
    }
}

fn push_changes(out: &mut Vec<VolumeChanges>, key: &VolumeKey, changes: Vec<Change>) {
    if !changes.is_empty() {
        out.push(VolumeChanges {
            key: key.clone(),
            changes,
        });
    }
}

/// Runs the built-in checks for every volume concurrently, each bounded by
/// the checker's timeout; the checker caps the probe threads
/// ([`crate::volumes::checks::MAX_PROBE_THREADS`]). For `health-agent
/// volumes`; while the agent runs, each volume is checked on its own
/// schedule instead (`schedule`).
pub async fn run_checks(
    checker: &Checker,
    volumes: &[IndexedVolume],
    mounts: Arc<[MountEntry]>,
) -> Vec<(VolumeKey, CheckReport)> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let checker = checker.clone();
        let volume = v.volume.clone();
        let mounts = Arc::clone(&mounts);
        tasks.spawn(async move { (i, checker.check_volume(&volume, &mounts).await) });
    }
    let mut reports: Vec<Option<CheckReport>> = (0..volumes.len()).map(|_| None).collect();
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((i, report)) => {
                if let Some(slot) = reports.get_mut(i) {
                    *slot = Some(report);
                }
            }
            // A check task that panicked yields no evidence: its volume
            // keeps what it had.
            Err(e) => tracing::warn!("a volume check task failed: {e}"),
        }
    }
    volumes
        .iter()
        .zip(reports)
        .filter_map(|(v, r)| r.map(|r| (v.key.clone(), r)))
        .collect()
}
