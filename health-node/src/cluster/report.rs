//! Cluster mode's [`Reporter`]: condition changes become Events (through
//! the `health_kube::events::Recorder` and the writer task), kernel errors and conditions
//! become metrics. Nothing here waits on the API server: the loop records
//! and returns.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use health_common::CounterKey;
use health_core::conditions::Change;
use health_core::dev::Dev;
use health_kernel::clock::Clock;
use health_kernel::collector::{KernelError, KernelStats};
use health_kube::events::Shared;
use health_kube::events::Targets;
use health_kube::http::Health;
use health_kube::status::{self, Claim, SharedWritePlan};
use health_topology::Topology;

use super::pod_volumes::ClusterView;
use crate::report::metrics::{Metrics, VolumeRef};
use crate::report::Reporter;
use crate::volumes::{Handled, LiveVolumes, VolumeIndex, VolumeKey};

/// Changes kept per volume while its pod is not yet known to the agent.
const MAX_PARKED_PER_VOLUME: usize = 64;

pub struct ClusterReporter {
    view: ClusterView,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    health: Health,
    /// Where each volume reports, once resolved.
    known: HashMap<VolumeKey, Targets>,
    /// The StorageClass of each resolved volume's PV, where it has one.
    storage_classes: HashMap<VolumeKey, String>,
    /// Changes of volumes whose pod is not in the store yet (the agent
    /// started before the API server answered, or kubelet was quicker than
    /// the watch). Delivered in order once the pod is known.
    parked: BTreeMap<VolumeKey, Vec<Change>>,
    /// Kernel errors on devices that hold a volume not attributable yet
    /// (before the first pod list, or while its PV is being read), summed
    /// per counter key with the device's name: recorded in the metrics once
    /// the volume is known, so that a restarted agent credits the errors of
    /// the gap to their claim as its Events do. Bounded by the keys.
    waiting_errors: BTreeMap<CounterKey, (u64, Option<String>)>,
    /// Programs attached; readiness also waits for the first lists.
    attached: bool,
    /// The `VolumeHealth` entries of this node (`None`: not written).
    status: Option<StatusSink>,
}

/// Where this node's `VolumeHealth` entries go.
pub struct StatusSink {
    pub node: String,
    pub board: Arc<SharedWritePlan>,
}

impl ClusterReporter {
    pub fn new(
        view: ClusterView,
        shared: Arc<Shared>,
        metrics: Arc<Metrics>,
        health: Health,
        status: Option<StatusSink>,
    ) -> Self {
        ClusterReporter {
            view,
            shared,
            metrics,
            health,
            known: HashMap::new(),
            storage_classes: HashMap::new(),
            parked: BTreeMap::new(),
            waiting_errors: BTreeMap::new(),
            attached: false,
            status,
        }
    }

    /// Hands the board this node's entries for `claims` (every claim a
    /// volume here uses when `None`), from the conditions of all pod volumes
    /// here on each. A claim none of them uses any more is released.
    fn sync_status(&mut self, volumes: &LiveVolumes, claims: Option<&[Claim]>) {
        if !self.view.is_ready() {
            return;
        }
        let index = volumes.index();
        if claims.is_none() {
            // Pods came or went: resolve every volume here once (cached in
            // `known`); on the error path only resolved volumes matter.
            for v in index.volumes() {
                if !self.known.contains_key(&v.key) {
                    self.targets(&v.key, index);
                }
            }
            self.view
                .forget_pvs_except(index.volumes().iter().map(|v| &v.volume));
        }
        if self.status.is_none() {
            return;
        }
        let mut by_claim: BTreeMap<Claim, Vec<&VolumeKey>> = BTreeMap::new();
        for (key, t) in &self.known {
            let asked = match claims {
                None => true,
                Some(c) => c.iter().any(|c| is_claim(t, c)),
            };
            if !asked || index.get(key).is_none() {
                continue;
            }
            if let Some(claim) = claim_of(t) {
                by_claim.entry(claim).or_default().push(key);
            }
        }
        let Some(sink) = &self.status else { return };
        let now = SystemTime::now();
        let mut board = sink.board.lock();
        let wanted: Vec<Claim> = match claims {
            Some(c) => c.to_vec(),
            None => by_claim.keys().cloned().collect(),
        };
        for claim in &wanted {
            let Some(keys) = by_claim.get(claim) else {
                board.release(&claim.namespace, &claim.name);
                continue;
            };
            let members: Vec<status::Member<'_>> = keys
                .iter()
                .copied()
                .filter_map(|k| {
                    let t = self.known.get(k)?;
                    Some(status::Member {
                        pod: format!("{}/{}", t.pod.namespace, t.pod.name),
                        driver: index.get(k).and_then(|v| v.volume.driver.as_deref()),
                        conditions: volumes
                            .health(k)
                            .map(|h| h.conditions())
                            .unwrap_or_default(),
                    })
                })
                .collect();
            board.set(claim, status::entries_for_node(&sink.node, &members, now));
        }
        // Claims are released only with the whole picture: while a PV is
        // being read, its volume's claim is not yet among `wanted`.
        if claims.is_none() && !self.view.resolving() {
            board.release_others(&wanted);
            board.set_ready();
        }
        drop(board);
        sink.board.wake();
    }

    /// Whether errors on `dev` must wait for the cluster view: a volume on
    /// it is not resolvable yet while the pods are not listed or PVs are
    /// being read (once the view is settled, an unresolvable volume belongs
    /// to no pod here and its errors count without a claim).
    fn must_wait(&mut self, dev: Dev, ix: &VolumeIndex) -> bool {
        let settled = self.view.is_ready() && !self.view.resolving();
        if settled {
            return false;
        }
        let keys: Vec<VolumeKey> = ix.volumes_for(dev).map(|v| v.key.clone()).collect();
        keys.iter()
            .any(|k| !self.known.contains_key(k) && self.targets(k, ix).is_none())
    }

    /// Records the errors that waited for volumes now attributable (all of
    /// them once the view is settled).
    fn record_waiting_errors(&mut self, ix: &VolumeIndex) {
        if self.waiting_errors.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut self.waiting_errors);
        for (key, (count, name)) in waiting {
            if self.must_wait(Dev::from_kernel(key.dev), ix) {
                self.waiting_errors.insert(key, (count, name));
            } else {
                self.record_errors(key, count, name.as_deref(), Some(ix));
            }
        }
    }

    /// One counter key's errors in the metrics: once per PVC (or PV, or pod
    /// volume without either) on the device, since the same error reaches
    /// every pod using the volume; without a claim when no volume here is
    /// on it.
    fn record_errors(
        &mut self,
        key: CounterKey,
        count: u64,
        name: Option<&str>,
        volumes: Option<&VolumeIndex>,
    ) {
        let dev = Dev::from_kernel(key.dev);
        let mut seen: Vec<VolumeRef> = Vec::new();
        if let Some(ix) = volumes {
            for v in ix.volumes_for(dev) {
                if !self.known.contains_key(&v.key) && self.targets(&v.key, ix).is_none() {
                    continue;
                }
                let Some(t) = self.known.get(&v.key) else {
                    continue;
                };
                let r = volume_ref(t);
                let dup = seen.iter().any(|s| {
                    s.namespace == r.namespace
                        && match (&s.pvc, &r.pvc, &s.pv, &r.pv) {
                            (Some(a), Some(b), _, _) => a == b,
                            (None, None, Some(a), Some(b)) => a == b,
                            _ => false,
                        }
                });
                if !dup {
                    seen.push(r);
                }
            }
        }
        let e = KernelError {
            key,
            count,
            sample: None,
        };
        if seen.is_empty() {
            self.metrics.record_kernel_error(&e, name, None);
        }
        for r in &seen {
            self.metrics.record_kernel_error(&e, name, Some(r));
        }
    }

    fn targets(&mut self, key: &VolumeKey, volumes: &VolumeIndex) -> Option<Targets> {
        if !self.view.is_ready() {
            return None;
        }
        let v = volumes.get(key)?;
        let t = self.view.targets(&v.volume)?;
        // Read while the PV's answer is fresh: a latency window asks for
        // it later without another GET.
        match t.pv.as_deref().and_then(|pv| self.view.storage_class(pv)) {
            Some(sc) => self.storage_classes.insert(key.clone(), sc),
            None => self.storage_classes.remove(key),
        };
        self.known.insert(key.clone(), t.clone());
        Some(t)
    }

    /// Hands parked changes over for volumes now resolvable.
    fn unpark(&mut self, volumes: &VolumeIndex) {
        if self.parked.is_empty() || !self.view.is_ready() {
            return;
        }
        let keys: Vec<VolumeKey> = self.parked.keys().cloned().collect();
        let now = SystemTime::now();
        let mut any = false;
        for key in keys {
            if volumes.get(&key).is_none() {
                // The volume left before its pod was ever seen.
                self.parked.remove(&key);
                continue;
            }
            let Some(t) = self.targets(&key, volumes) else {
                continue;
            };
            if let Some(changes) = self.parked.remove(&key) {
                self.shared.lock().observe(&key, &t, &changes, now);
                any = true;
            }
        }
        if any {
            self.shared.wake();
        }
    }

    /// Events continued from before a restart on pods no longer here (or
    /// PVCs none of them uses) end without a recovery. Checked on the
    /// reconcile tick (every second) while any is unclaimed.
    fn drop_unclaimed(&self) {
        if !self.view.is_ready() || !self.shared.lock().has_unclaimed() {
            return;
        }
        let dropped = self
            .shared
            .lock()
            .drop_unclaimed(|o| self.view.reports_on(o));
        if dropped > 0 {
            tracing::info!(
                dropped,
                "Events from before the restart are about objects no longer on this node; left as they are"
            );
        }
    }

    fn update_readiness(&mut self) {
        if !self.attached {
            self.health
                .set_not_ready("kernel programs not attached yet".to_string());
        } else if !self.view.is_ready() {
            self.health
                .set_not_ready("waiting for the first list of this node's pods".to_string());
        } else if self.view.resolving() {
            self.health
                .set_not_ready("reading the PVs this node's volumes use".to_string());
        } else {
            self.health.set_ready(true);
        }
    }
}

fn park(parked: &mut BTreeMap<VolumeKey, Vec<Change>>, key: &VolumeKey, changes: &[Change]) {
    let list = parked.entry(key.clone()).or_default();
    list.extend(changes.iter().cloned());
    if list.len() > MAX_PARKED_PER_VOLUME {
        // Raised/Updated of one condition are superseded by later ones; drop
        // the oldest update first. The recorder counts from the condition's
        // own occurrences, so nothing numeric is lost.
        let excess = list.len() - MAX_PARKED_PER_VOLUME;
        let mut dropped = 0;
        list.retain(|c| {
            if dropped < excess && matches!(c, Change::Updated { .. }) {
                dropped += 1;
                false
            } else {
                true
            }
        });
        let over = list.len().saturating_sub(MAX_PARKED_PER_VOLUME);
        list.drain(..over);
    }
}

/// The claim a volume's conditions go to, when it has one with a uid (an
/// owner reference needs it).
fn claim_of(t: &Targets) -> Option<Claim> {
    let pvc = t.pvc.as_ref()?;
    if pvc.uid.is_empty() {
        return None;
    }
    Some(Claim {
        namespace: pvc.namespace.clone(),
        name: pvc.name.clone(),
        uid: pvc.uid.clone(),
        pv: t.pv.clone(),
    })
}

/// Whether `t` reports to `claim` (compared without allocating: this runs
/// for every condition change).
fn is_claim(t: &Targets, claim: &Claim) -> bool {
    t.pvc
        .as_ref()
        .is_some_and(|p| p.namespace == claim.namespace && p.name == claim.name)
}

fn volume_ref(t: &Targets) -> VolumeRef {
    VolumeRef {
        namespace: t.pod.namespace.clone(),
        pod: t.pod.name.clone(),
        volume: t.pod_volume.clone(),
        pvc: t.pvc.as_ref().map(|p| p.name.clone()),
        pv: t.pv.clone(),
    }
}

impl crate::volumes::latency::StorageClasses for ClusterReporter {
    fn storage_class(&self, volume: &VolumeKey) -> Option<&str> {
        self.storage_classes.get(volume).map(String::as_str)
    }
}

impl Reporter for ClusterReporter {
    type Wake = ();

    fn pod_names(&self) -> Option<&dyn crate::volumes::waiters::PodNames> {
        Some(&self.view)
    }

    fn storage_classes(&self) -> Option<&dyn crate::volumes::latency::StorageClasses> {
        Some(self)
    }

    fn ready(&mut self, active: usize, volumes: Option<&LiveVolumes>) {
        tracing::info!(sources = active, "kernel programs attached");
        self.attached = true;
        // The pods may be listed already: the volumes found at start are
        // resolved now (their PVs asked for), not at their first error.
        if let Some(v) = volumes {
            self.sync_status(v, None);
        }
        self.update_readiness();
    }

    fn errors(
        &mut self,
        batch: &[KernelError],
        topo: &Topology,
        _clock: &Clock,
        volumes: Option<&VolumeIndex>,
    ) -> anyhow::Result<()> {
        self.health.beat();
        // Samples of one key differ only in their details, which metrics do
        // not carry: resolve volumes once per key and batch, not per sample.
        let mut per_key: BTreeMap<CounterKey, u64> = BTreeMap::new();
        for e in batch {
            *per_key.entry(e.key).or_default() += e.count;
        }
        for (key, count) in per_key {
            let dev = Dev::from_kernel(key.dev);
            let name = topo.device(dev).map(|d| d.name.as_str());
            match volumes {
                Some(ix) if self.must_wait(dev, ix) => {
                    // The name is copied only for errors that wait.
                    let slot = self
                        .waiting_errors
                        .entry(key)
                        .or_insert_with(|| (0, name.map(str::to_owned)));
                    slot.0 += count;
                }
                _ => self.record_errors(key, count, name, volumes),
            }
        }
        Ok(())
    }

    fn changes(&mut self, handled: &Handled, gone: &[VolumeKey], volumes: &LiveVolumes) {
        let index = volumes.index();
        let now = SystemTime::now();
        let mut wrote = false;
        let mut claims: Vec<Claim> = Vec::new();
        for vc in &handled.changes {
            match self.targets(&vc.key, index) {
                Some(t) if !self.parked.contains_key(&vc.key) => {
                    claims.extend(claim_of(&t));
                    self.shared.lock().observe(&vc.key, &t, &vc.changes, now);
                    wrote = true;
                    if let Some(h) = volumes.health(&vc.key) {
                        self.metrics
                            .set_volume_conditions(&volume_ref(&t), &h.conditions());
                    }
                }
                // Unknown pod, or earlier changes still parked: keep order.
                _ => park(&mut self.parked, &vc.key, &vc.changes),
            }
        }
        for (key, io) in &handled.io {
            // Known once the volume had a change or an error; resolved now
            // otherwise (the pod may not be listed yet: nothing then).
            let t = match self.known.get(key) {
                Some(t) => Some(volume_ref(t)),
                None => self.targets(key, index).as_ref().map(volume_ref),
            };
            if let Some(r) = t {
                self.metrics.observe_io(&r, io);
            }
        }
        for o in &handled.csi {
            self.metrics.csi_probe(o);
        }
        for o in &handled.storage {
            self.metrics.csi_storage_probe(o);
        }
        for key in gone {
            self.parked.remove(key);
            self.storage_classes.remove(key);
            self.shared.lock().forget_volume(key);
            if let Some(t) = self.known.remove(key) {
                claims.extend(claim_of(&t));
                let r = volume_ref(&t);
                self.metrics.remove_volume(&r);
                // The claim's error counters go when no pod here uses it:
                // series of claims long gone would otherwise fill the cap.
                let still_used = self
                    .known
                    .values()
                    .any(|o| o.pod.namespace == t.pod.namespace && o.pvc == t.pvc && o.pv == t.pv);
                if !still_used {
                    self.metrics.remove_kernel_errors(&r);
                }
            }
            wrote = true;
        }
        self.metrics.set_volumes(index.len());
        self.unpark(index);
        if wrote {
            self.shared.wake();
        }
        if !claims.is_empty() {
            claims.sort();
            claims.dedup();
            self.sync_status(volumes, Some(&claims));
        }
    }

    fn input_errors(&mut self, errors: &health_topology::InputErrors) {
        self.metrics.input_errors(errors);
    }

    fn kernel_stats(&mut self, stats: &KernelStats) {
        self.health.beat();
        self.metrics.kernel_stats(stats);
        self.update_readiness();
        self.drop_unclaimed();
    }

    async fn wake(&mut self) {
        self.view.changed().await
    }

    fn handle(&mut self, _wake: (), volumes: Option<&LiveVolumes>) {
        if let Some(v) = volumes {
            self.unpark(v.index());
            // Pods came or went: every claim's entries (pods named, claims
            // no longer used here released). Resolving the volumes asks for
            // the PVs not yet read.
            self.sync_status(v, None);
            self.record_waiting_errors(v.index());
        }
        // After the PV reads were asked for: ready means attributable.
        self.update_readiness();
    }

    fn finish(
        &mut self,
        totals: &BTreeMap<CounterKey, u64>,
        _topo: &Topology,
        stats: &KernelStats,
    ) -> anyhow::Result<()> {
        let errors: u64 = totals.values().sum();
        tracing::info!(
            errors,
            samples_suppressed = stats.samples_suppressed,
            ringbuf_full = stats.ringbuf_full,
            program_misses = stats.program_misses,
            traced = stats.traced,
            uncounted = stats.uncounted,
            "stopping"
        );
        Ok(())
    }
}
