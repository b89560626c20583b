//! Pod volumes and the evidence that bears on them.
//!
//! [`VolumeIndex`] answers, for the device number a kernel error carries,
//! which pod volumes it reaches: every volume whose device, or one of whose
//! filesystem's backing devices (btrfs members), is stacked on that device
//! ([`Topology::stacked_above`]). A PV mounted by two pods is two pod volumes,
//! and both are reached. The index is an immutable snapshot: rebuild it from a
//! fresh [`Topology`] and a fresh kubelet discovery whenever either changes.
//!
//! [`VolumeMonitor`] owns one [`VolumeHealth`] per pod volume and feeds it the
//! three kinds of evidence: kernel errors (aggregated per batch), the built-in
//! checks ([`run_checks`]) and CSI node health ([`CsiProber`]); it returns
//! the condition changes per volume.
//!
//! [`view`] is the one-shot `health-agent volumes`; [`WatchVolumes`] is what
//! `watch` uses to annotate events and keep conditions while it runs.

mod csi;
mod ext4;
pub mod view;
mod watch;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use health_common::source;
use serde::Serialize;

use crate::checks::{CheckReport, Checker};
use crate::collector::KernelError;
use crate::conditions::{
    Change, ConditionConfig, CsiReport, KernelErrorKind, KernelErrors, Observation, VolumeHealth,
};
use crate::dev::Dev;
use crate::event::{op_name, Clock};
use crate::kubelet::{self, KubeletVolume, VolumeMode};
use crate::topology::{MountEntry, Topology};

pub use csi::{CsiOutcome, CsiProber, CsiResult};
pub use ext4::{ext4_error_evidence, Ext4Errors};
pub use watch::{
    next_wake, print_changes, Handled, Wake, WatchVolumes, WatchVolumesConfig, DEFAULT_CSI_INTERVAL,
};

/// Identity of one pod volume, stable across rediscoveries: the pod, the
/// directory kubelet named the volume by under the pod, and the mode (a pod
/// may use one PV name in both `volumes/` and `volumeDevices/`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct VolumeKey {
    pub pod_uid: String,
    pub name: String,
    pub mode: VolumeMode,
}

impl VolumeKey {
    pub fn of(v: &KubeletVolume) -> VolumeKey {
        VolumeKey {
            pod_uid: v.pod_uid.clone(),
            name: v.pod_volume_dir_name.clone(),
            mode: v.volume_mode,
        }
    }
}

/// A discovered volume with the device it lives on right now.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexedVolume {
    pub key: VolumeKey,
    pub volume: KubeletVolume,
    /// Filesystem mode: the device of the topmost mount at the pod's path (a
    /// btrfs filesystem's anonymous dev, as mountinfo shows it). Block mode:
    /// the device node's number. `None`: not mounted / not a block device.
    pub device: Option<Dev>,
}

/// Device -> pod volumes, for the kernel event path.
#[derive(Clone, Debug, Default)]
pub struct VolumeIndex {
    /// Sorted by key.
    volumes: Vec<IndexedVolume>,
    by_key: HashMap<VolumeKey, u32>,
    /// Every device an error may name that reaches at least one volume ->
    /// indices into `volumes`, sorted and deduplicated. Boxed slices: exact
    /// size, no spare capacity across thousands of entries.
    by_dev: HashMap<Dev, Box<[u32]>>,
    /// Kernel names of the devices in `by_dev`, for messages.
    names: HashMap<Dev, String>,
}

impl VolumeIndex {
    /// Resolves each volume's device (filesystem mode from the topology's
    /// mount table, block mode by `stat` of the device node, which does no
    /// I/O on the device) and indexes the devices that reach it.
    pub fn build(topo: &Topology, volumes: Vec<KubeletVolume>) -> VolumeIndex {
        // The topmost mount at each point is the last in mountinfo order, as
        // in `kubelet::resolve_device`; one map instead of a scan of the
        // whole table per volume (thousands of mounts on a busy node, and
        // `Path` equality walks components). Mount points from the kernel and
        // kubelet paths under a canonical root are both canonical, so
        // comparing their bytes is comparing the paths.
        let mut topmost: HashMap<&OsStr, Dev> = HashMap::with_capacity(topo.mounts().len());
        for m in topo.mounts() {
            topmost.insert(m.mount_point.as_os_str(), m.dev);
        }
        let resolved = volumes
            .into_iter()
            .map(|volume| {
                let device = match volume.volume_mode {
                    VolumeMode::Filesystem => topmost.get(volume.path.as_os_str()).copied(),
                    VolumeMode::Block => kubelet::resolve_device(&volume, &[]),
                };
                (volume, device)
            })
            .collect();
        Self::from_resolved(topo, resolved)
    }

    /// Like [`VolumeIndex::build`] with devices already resolved (tests,
    /// benchmarks, and callers that must not stat).
    pub fn from_resolved(
        topo: &Topology,
        resolved: Vec<(KubeletVolume, Option<Dev>)>,
    ) -> VolumeIndex {
        let mut volumes: Vec<IndexedVolume> = resolved
            .into_iter()
            .map(|(volume, device)| IndexedVolume {
                key: VolumeKey::of(&volume),
                volume,
                device,
            })
            .collect();
        volumes.sort_by(|a, b| a.key.cmp(&b.key));
        volumes.dedup_by(|later, first| later.key == first.key);
        let by_key = volumes
            .iter()
            .enumerate()
            .map(|(i, v)| (v.key.clone(), i as u32))
            .collect();

        // The devices each volume lives on: its own, plus the member devices
        // of its filesystem (btrfs). An error reaches the volume when one of
        // these is stacked on the error's device.
        let mut targets: HashMap<Dev, Vec<u32>> = HashMap::new();
        for (i, v) in volumes.iter().enumerate() {
            let Some(dev) = v.device else { continue };
            let mut own = topo.filesystem_backing_devices(dev);
            own.push(dev);
            own.sort_unstable();
            own.dedup();
            for d in own {
                targets.entry(d).or_default().push(i as u32);
            }
        }

        // Inverting `stacked_above` per candidate device keeps the semantics
        // exactly those of the topology (partitions of a disk, holders,
        // cycles). Candidates: every block device, and every volume device
        // that is not one (a btrfs or NFS anonymous dev names itself).
        let mut candidates: Vec<Dev> = topo.devices().iter().map(|d| d.dev).collect();
        candidates.extend(
            targets
                .keys()
                .copied()
                .filter(|d| !topo.is_block_device(*d)),
        );
        let mut by_dev = HashMap::new();
        let mut reached: Vec<u32> = Vec::new();
        for dev in candidates {
            reached.clear();
            for up in topo.stacked_above(dev) {
                if let Some(v) = targets.get(&up) {
                    reached.extend_from_slice(v);
                }
            }
            if reached.is_empty() {
                continue;
            }
            reached.sort_unstable();
            reached.dedup();
            by_dev.insert(dev, reached.as_slice().into());
        }
        by_dev.shrink_to_fit();
        let names = by_dev
            .keys()
            .filter_map(|d| topo.device(*d).map(|info| (*d, info.name.clone())))
            .collect();
        VolumeIndex {
            volumes,
            by_key,
            by_dev,
            names,
        }
    }

    /// Indices (into [`VolumeIndex::volumes`]) of the volumes an error on
    /// `dev` reaches; empty when none. A hash lookup, no allocation.
    pub fn indices_for(&self, dev: Dev) -> &[u32] {
        self.by_dev.get(&dev).map_or(&[], |v| v)
    }

    /// The volumes an error on `dev` reaches, sorted by key.
    pub fn volumes_for(&self, dev: Dev) -> impl Iterator<Item = &IndexedVolume> + '_ {
        self.indices_for(dev)
            .iter()
            .filter_map(|&i| self.volumes.get(i as usize))
    }

    /// All volumes, sorted by key.
    pub fn volumes(&self) -> &[IndexedVolume] {
        &self.volumes
    }

    pub fn get(&self, key: &VolumeKey) -> Option<&IndexedVolume> {
        self.by_key
            .get(key)
            .and_then(|&i| self.volumes.get(i as usize))
    }

    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }

    /// The kernel name of a device that reaches a volume (`loop3`).
    pub fn device_name(&self, dev: Dev) -> Option<&str> {
        self.names.get(&dev).map(String::as_str)
    }

    /// How many distinct devices reach at least one volume.
    pub fn device_count(&self) -> usize {
        self.by_dev.len()
    }
}

/// The kind of kernel evidence behind a tracepoint.
pub fn kernel_error_kind(src: u8) -> KernelErrorKind {
    match src {
        source::BLOCK_RQ_ERROR | source::BLOCK_RQ_COMPLETE => KernelErrorKind::BlockIo,
        source::WRITEBACK_ERROR => KernelErrorKind::Writeback,
        source::XFS_CORRUPTION => KernelErrorKind::XfsCorruption,
        source::EXT4_SHUTDOWN | source::XFS_SHUTDOWN => KernelErrorKind::Shutdown,
        // EXT4_ERROR, and any source newer than this agent: a filesystem
        // reported something, which is the least it can mean.
        _ => KernelErrorKind::FilesystemError,
    }
}

/// Kernel errors of one (kind, op, errno, device) for one volume since the
/// last flush.
#[derive(Clone, Debug)]
struct Pending {
    kind: KernelErrorKind,
    op: Option<&'static str>,
    errno: u32,
    device: Dev,
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
        }
    }

    /// The current index; cheap to clone and hand to another task.
    pub fn index(&self) -> &Arc<VolumeIndex> {
        &self.index
    }

    /// Switches to a rebuilt index. Volumes still present keep their health
    /// and pending errors; volumes gone are dropped and returned (a reporter
    /// may want to say so), new ones start healthy.
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
            let state = old
                .remove(&v.key)
                .unwrap_or_else(|| new_state(&self.config));
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
        let dev = Dev::from_kernel(e.key.dev);
        let indices = self.index.indices_for(dev);
        if indices.is_empty() || e.count == 0 {
            return;
        }
        let kind = kernel_error_kind(e.key.source);
        let op = op_name(e.key.op);
        let when = e
            .sample
            .as_ref()
            .map_or(now, |s| self.clock.wall_time(s.mono_ns));
        for &i in indices {
            let Some(state) = self.states.get_mut(i as usize) else {
                continue;
            };
            if state.pending.is_empty() {
                self.dirty.push(i);
            }
            match state
                .pending
                .iter_mut()
                .find(|p| p.kind == kind && p.op == op && p.errno == e.key.errno && p.device == dev)
            {
                Some(p) => {
                    p.count = p.count.saturating_add(e.count);
                    p.first = p.first.min(when);
                    p.last = p.last.max(when);
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
                        count: e.count,
                        first: when,
                        last: when,
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
            let mount_point = match vol.volume.volume_mode {
                VolumeMode::Filesystem => Some(vol.volume.path.clone()),
                VolumeMode::Block => None,
            };
            let errors: Vec<KernelErrors> = state
                .pending
                .drain(..)
                .map(|p| KernelErrors {
                    kind: p.kind,
                    count: p.count,
                    first: p.first,
                    last: p.last,
                    device: Some(p.device),
                    mount_point: mount_point.clone(),
                    op: p.op.map(str::to_string),
                    errno: (p.errno != 0).then_some(p.errno as i32),
                    device_name: self.index.names.get(&p.device).cloned(),
                })
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

    /// Feeds a round of check reports (from [`run_checks`]).
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

    /// Feeds a round of CSI node answers (from [`CsiProber::probe`]).
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

    /// Periodic evaluation (kernel quiet windows).
    pub fn tick(&mut self, now: SystemTime) -> Vec<VolumeChanges> {
        let mut out = Vec::new();
        for (v, state) in self.index.volumes().iter().zip(&mut self.states) {
            push_changes(&mut out, &v.key, state.health.tick(now));
        }
        out
    }

    pub fn health(&self, key: &VolumeKey) -> Option<&VolumeHealth> {
        let i = *self.index.by_key.get(key)?;
        self.states.get(i as usize).map(|s| &s.health)
    }

    fn state_mut(&mut self, key: &VolumeKey) -> Option<&mut VolumeState> {
        let i = *self.index.by_key.get(key)?;
        self.states.get_mut(i as usize)
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

/// How many volume checks run at once. A hung path holds its slot for one
/// timeout (the checker answers at once for paths still stuck from before),
/// so this bounds both threads and the time a round can take.
pub const CHECK_CONCURRENCY: usize = 32;

/// Runs the built-in checks for every volume concurrently (at most
/// [`CHECK_CONCURRENCY`] at once), each bounded by the checker's timeout.
pub async fn run_checks(
    checker: &Checker,
    volumes: &[IndexedVolume],
    mounts: Arc<[MountEntry]>,
) -> Vec<(VolumeKey, CheckReport)> {
    let permits = Arc::new(tokio::sync::Semaphore::new(CHECK_CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for (i, v) in volumes.iter().enumerate() {
        let checker = checker.clone();
        let volume = v.volume.clone();
        let mounts = Arc::clone(&mounts);
        let permits = Arc::clone(&permits);
        tasks.spawn(async move {
            // The semaphore is never closed; without a permit the check
            // would merely run unthrottled.
            let _permit = permits.acquire_owned().await.ok();
            (i, checker.check_volume(&volume, &mounts).await)
        });
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

/// The kubelet root to use for `watch`: the given one, else the default if
/// this node has one. Canonicalized, because mountinfo shows real paths and
/// volume paths are compared with them.
pub fn kubelet_root(given: Option<&Path>) -> Option<PathBuf> {
    let root = match given {
        Some(p) => p.to_path_buf(),
        None => {
            let default = Path::new(kubelet::DEFAULT_KUBELET_ROOT);
            if !default.is_dir() {
                return None;
            }
            default.to_path_buf()
        }
    };
    Some(std::fs::canonicalize(&root).unwrap_or(root))
}

/// Default interval of checks and kubelet rediscovery.
pub const DEFAULT_CHECK_INTERVAL: Duration = Duration::from_secs(10);

#[cfg(test)]
mod tests;
