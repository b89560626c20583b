//! One condition state machine ([`VolumeHealth`]) per monitored PV, fed one
//! observation per cycle; what changes is recorded on the PV's claim.
//!
//! A PV is keyed by its name and volume handle, not by its claim: a PV that
//! goes Bound -> Available -> Bound keeps its state (the List absence count,
//! when each condition began). While it has no claim, its changes still go
//! to the claim it last had (whose Events would otherwise stay open with no
//! end); bound to another claim, the old claim's Events end without a
//! recovery and the new claim is told the conditions that hold.
//! A PV deleted (even mid-cycle) takes its state with it, without a
//! recovery: a deleted volume has not recovered.
//!
//! Only unhealthy PVs have state: a state that holds no condition is
//! dropped ([`VolumeHealth::is_quiet`]: it would answer every observation
//! as a new one), so 100,000 healthy PVs cost nothing here.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::SystemTime;

use health_core::conditions::{
    Change, ConditionConfig, CsiEntry, CsiReport, Observation, Source, VolumeHealth,
};
use health_kube::events::{ObjectRef, Recorder, Unclaimed};
use health_kube::status::types::parse_time;
use health_kube::status::EntryKind;

use super::inventory::MonitoredVolume;
use super::pv_store::position;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PvKey {
    pv: Arc<str>,
    handle: Arc<str>,
}

impl PvKey {
    fn of(v: &MonitoredVolume) -> Self {
        PvKey {
            pv: Arc::clone(&v.pv),
            handle: Arc::clone(&v.handle),
        }
    }

    /// The volume of `current` (sorted by PV name) this key is, if still
    /// there with the same handle.
    fn find<'a>(&self, current: &'a [MonitoredVolume]) -> Option<&'a MonitoredVolume> {
        let i = position(current, &self.pv).ok()?;
        Some(&current[i]).filter(|v| v.handle == self.handle)
    }

    /// The recorder's name for this PV as a contributor.
    fn contributor(&self) -> String {
        format!("pv/{}/{}", self.pv, self.handle)
    }

    /// What Event messages name: `PV pv-1`.
    fn subject(&self) -> String {
        format!("PV {}", self.pv)
    }
}

#[derive(Debug)]
struct PvState {
    health: VolumeHealth,
    /// The claim its conditions were last reported to.
    reported_to: Option<ObjectRef>,
}

/// Every monitored PV's conditions.
#[derive(Debug, Default)]
pub struct PvHealth {
    config: ConditionConfig,
    states: BTreeMap<PvKey, PvState>,
}

impl PvHealth {
    pub fn new(config: ConditionConfig) -> Self {
        PvHealth {
            config,
            states: BTreeMap::new(),
        }
    }

    /// PVs with state (those with a condition).
    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// PVs with at least one condition.
    pub fn abnormal(&self) -> usize {
        self.states
            .values()
            .filter(|s| s.health.worst().is_some())
            .count()
    }

    /// The claims of the PVs with conditions, with their PV and the
    /// conditions the driver's controller service asserts now.
    pub fn claim_conditions(
        &self,
    ) -> Vec<(ObjectRef, String, Vec<health_core::conditions::Condition>)> {
        self.states
            .iter()
            .filter_map(|(key, s)| {
                let claim = s.reported_to.clone()?;
                Some((claim, key.pv.to_string(), s.health.conditions()))
            })
            .collect()
    }

    /// Applies one cycle: `observations[i]` is what was learnt of
    /// `probed[i]`. `current` is the inventory as it is now, after the
    /// calls (sorted by PV name): a PV no longer there was deleted
    /// meanwhile, and its observation is dropped with its state.
    pub fn apply(
        &mut self,
        probed: &[MonitoredVolume],
        observations: Vec<Observation>,
        current: &[MonitoredVolume],
        recorder: &mut Recorder,
        now: SystemTime,
    ) {
        self.drop_deleted(current, recorder);
        for (volume, observation) in probed.iter().zip(observations) {
            let key = PvKey::of(volume);
            let Some(now_volume) = key.find(current) else {
                continue;
            };
            let claim = now_volume.claim.as_deref();
            let (state, changes) = match self.states.remove(&key) {
                Some(mut state) => {
                    follow_claim(&key, &mut state, claim, recorder, now);
                    let changes = state.health.apply(now, observation);
                    (state, changes)
                }
                None => {
                    // No state: no condition. A new machine costs no
                    // allocation; quiet after the observation (a healthy
                    // PV's usual answer), there is nothing to keep or tell.
                    let mut health = VolumeHealth::new(self.config.clone());
                    let changes = health.apply(now, observation);
                    if health.is_quiet() {
                        continue;
                    }
                    let reported_to = claim.cloned();
                    (
                        PvState {
                            health,
                            reported_to,
                        },
                        changes,
                    )
                }
            };
            if let Some(claim) = &state.reported_to {
                let objects = std::slice::from_ref(claim);
                recorder.observe_on(&key.contributor(), &key.subject(), objects, &changes, now);
            }
            if !state.health.is_quiet() {
                self.states.insert(key, state);
            }
        }
    }

    fn drop_deleted(&mut self, current: &[MonitoredVolume], recorder: &mut Recorder) {
        let gone: Vec<PvKey> = self
            .states
            .keys()
            .filter(|k| k.find(current).is_none())
            .cloned()
            .collect();
        for key in gone {
            tracing::debug!(pv = %key.pv, "PV deleted; its conditions go without a recovery");
            self.states.remove(&key);
            recorder.forget_contributor(&key.contributor());
        }
    }

    /// Continues the open Warnings a previous leader wrote about these PVs
    /// (from [`Recorder::unclaimed`]): their conditions become this
    /// replica's state, as observed when the episode began (the Event's
    /// `firstTimestamp`), so the Events go on (same object, same count)
    /// instead of starting again. Returns how many were continued.
    pub fn seed(
        &mut self,
        adopted: &[Unclaimed],
        current: &[MonitoredVolume],
        recorder: &mut Recorder,
    ) -> usize {
        // By claim and subject once: the PVs are many, the open Warnings few.
        let mut by_claim: HashMap<(&ObjectRef, &str), Vec<&Unclaimed>> = HashMap::new();
        for u in adopted {
            by_claim.entry((&u.object, &u.subject)).or_default().push(u);
        }
        let mut seeded = 0;
        for volume in current {
            let Some(claim) = volume.claim.as_deref() else {
                continue;
            };
            let key = PvKey::of(volume);
            let subject = key.subject();
            let Some(open) = by_claim.get(&(claim, subject.as_str())) else {
                continue;
            };
            let mine: Vec<Seed> = open
                .iter()
                .map(|u| Seed {
                    entry: CsiEntry {
                        status: u.status,
                        reason: u.reason.clone(),
                        message: u.message.clone(),
                    },
                    since: u.first,
                })
                .collect();
            let changes = self.add_seeds(&key, claim, mine);
            seeded += changes.len();
            for (at, change) in changes {
                let objects = std::slice::from_ref(claim);
                recorder.observe_on(&key.contributor(), &key.subject(), objects, &[change], at);
            }
        }
        seeded
    }

    /// Continues what the claims' `VolumeHealth` objects say the driver
    /// asserted before this replica led (`stored`, their entry `CSIDriver`)
    /// and no open Event told: the episode keeps its start, and ends on
    /// this replica's own evidence (a healthy Get at once, absence from
    /// two complete lists), as it would have without the takeover. Nothing
    /// is told to the recorder: the Event of such an episode is gone
    /// (expired), and a new Warning for an old episode would be news to
    /// nobody. Returns how many were continued.
    pub fn seed_stored(&mut self, stored: &[Stored], current: &[MonitoredVolume]) -> usize {
        let mut by_claim: HashMap<(&str, &str), Vec<&Stored>> = HashMap::new();
        for s in stored {
            by_claim
                .entry((&s.namespace, &s.claim))
                .or_default()
                .push(s);
        }
        let mut seeded = 0;
        for volume in current {
            let Some(claim) = volume.claim.as_deref() else {
                continue;
            };
            let key = PvKey::of(volume);
            let Some(about) = by_claim.get(&(claim.namespace.as_str(), claim.name.as_str())) else {
                continue;
            };
            let mine: Vec<Seed> = about
                .iter()
                .filter(|s| s.is_about(claim, &volume.pv))
                .map(|s| Seed {
                    entry: s.entry.clone(),
                    since: s.since,
                })
                .collect();
            seeded += self.add_seeds(&key, claim, mine).len();
        }
        seeded
    }

    /// Adds conditions to a PV's state, each raised at its own start, and
    /// returns the changes with when they happened. The state's conditions
    /// already there stay as they are.
    fn add_seeds(
        &mut self,
        key: &PvKey,
        claim: &ObjectRef,
        mut seeds: Vec<Seed>,
    ) -> Vec<(SystemTime, Change)> {
        if seeds.is_empty() {
            return Vec::new();
        }
        let config = self.config.clone();
        let state = self.states.entry(key.clone()).or_insert_with(|| PvState {
            health: VolumeHealth::new(config),
            reported_to: None,
        });
        state.reported_to = Some(claim.clone());
        let mut entries: Vec<CsiEntry> = state
            .health
            .conditions()
            .into_iter()
            .filter(|c| c.source == Source::CsiController)
            .map(|c| CsiEntry {
                status: c.status,
                reason: c.reason,
                message: c.message,
            })
            .collect();
        seeds.retain(|s| {
            !entries
                .iter()
                .any(|e| e.status == s.entry.status && e.reason == s.entry.reason)
        });
        // One observation holds all of a source's conditions: each seed is
        // added to those before it, in the order the episodes began, so
        // that each keeps its own start.
        seeds.sort_by_key(|s| s.since);
        let mut changes = Vec::new();
        for seed in seeds {
            entries.push(seed.entry);
            let report = CsiReport::Health(entries.clone());
            let raised = state
                .health
                .apply(seed.since, Observation::CsiControllerGet(report));
            changes.extend(raised.into_iter().map(|c| (seed.since, c)));
        }
        changes
    }
}

/// A condition to continue, and when its episode began.
struct Seed {
    entry: CsiEntry,
    since: SystemTime,
}

/// A condition the `VolumeHealth` of a claim says the driver's controller
/// service asserted (the entry `CSIDriver`), as an earlier leader wrote it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub namespace: String,
    pub claim: String,
    /// The owning PVC's uid, when the object names one.
    pub uid: Option<String>,
    /// `spec.persistentVolumeName`.
    pub pv: Option<String>,
    pub entry: CsiEntry,
    pub since: SystemTime,
}

impl Stored {
    /// The driver's conditions in the listed objects. A condition whose
    /// start cannot be read is left out (outside input): the status
    /// writer's grace keeps it until this replica has evidence.
    pub fn from_objects(objects: &[health_kube::status::VolumeHealth]) -> Vec<Stored> {
        let driver_entry = EntryKind::CsiDriver.entry_name(None);
        let mut out = Vec::new();
        for o in objects {
            let Some(status) = &o.status else { continue };
            let uid = o
                .metadata
                .owner_references
                .iter()
                .flatten()
                .find(|r| r.kind == "PersistentVolumeClaim")
                .map(|r| r.uid.clone());
            let conditions = status
                .sources
                .iter()
                .filter(|e| e.name == driver_entry)
                .flat_map(|e| &e.conditions);
            for c in conditions {
                let Some(since) = parse_time(&c.since) else {
                    continue;
                };
                out.push(Stored {
                    namespace: o.metadata.namespace.clone().unwrap_or_default(),
                    claim: o.spec.persistent_volume_claim_name.clone(),
                    uid: uid.clone(),
                    pv: o.spec.persistent_volume_name.clone(),
                    entry: CsiEntry {
                        status: c.status,
                        reason: c.reason.clone(),
                        message: c.message.clone(),
                    },
                    since,
                });
            }
        }
        out
    }

    fn is_about(&self, claim: &ObjectRef, pv: &str) -> bool {
        self.namespace == claim.namespace
            && self.claim == claim.name
            && self
                .uid
                .as_deref()
                .is_none_or(|u| claim.uid.is_empty() || u == claim.uid)
            && self.pv.as_deref().is_none_or(|p| p == pv)
    }
}

/// Moves a PV's reporting to its current claim: the old claim's Events end
/// without a recovery, the new claim hears every condition that holds. No
/// claim (Available) changes nothing.
fn follow_claim(
    key: &PvKey,
    state: &mut PvState,
    claim: Option<&ObjectRef>,
    recorder: &mut Recorder,
    now: SystemTime,
) {
    let Some(claim) = claim else {
        return;
    };
    if state.reported_to.as_ref() == Some(claim) {
        return;
    }
    if state.reported_to.take().is_some() {
        recorder.forget_contributor(&key.contributor());
    }
    let holding: Vec<Change> = state
        .health
        .conditions()
        .into_iter()
        .filter(|c| c.source == Source::CsiController)
        .map(Change::Raised)
        .collect();
    let objects = std::slice::from_ref(claim);
    recorder.observe_on(&key.contributor(), &key.subject(), objects, &holding, now);
    state.reported_to = Some(claim.clone());
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use health_core::conditions::{CsiListSighting, Status};
    use health_core::testing::t;
    use health_kube::events::{ObjectKind, RecorderConfig};
    use health_kube::status::types::time;
    use health_kube::status::VolumeHealth as Object;
    use serde_json::json;

    use super::*;

    fn claim() -> ObjectRef {
        ObjectRef {
            kind: ObjectKind::PersistentVolumeClaim,
            namespace: "shop".into(),
            name: "data".into(),
            uid: "uid-data".into(),
        }
    }

    fn volume() -> MonitoredVolume {
        MonitoredVolume {
            pv: "pv-1".into(),
            handle: "h-1".into(),
            claim: Some(claim().into()),
        }
    }

    /// The claim's object as an earlier leader wrote it: the driver's
    /// entry and a node's, with their conditions' starts.
    fn object(owner: &str, driver_since: &str) -> Object {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "shop",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                              "name": "data", "uid": owner}]},
            "spec": {"persistentVolumeClaimName": "data", "persistentVolumeName": "pv-1"},
            "status": {"sources": [
                {"name": "CSIDriver", "kind": "CSIDriver", "updateTime": time(t(90)),
                 "conditions": [{"status": "Degraded", "reason": "ReplicaLost",
                                 "message": "replica 2 of 3 lost", "since": driver_since,
                                 "origin": "csi-controller"}]},
                {"name": "Node/node-1", "kind": "Node", "node": "node-1", "updateTime": time(t(90)),
                 "conditions": [{"status": "Degraded", "reason": "BlockIOErrors",
                                 "message": "3 errors", "since": time(t(5)), "origin": "kernel"}]}
            ]}
        }))
        .expect("a VolumeHealth")
    }

    #[test]
    fn only_pvs_with_a_condition_have_state_and_a_healthy_move_is_followed() {
        let mut pvs = PvHealth::new(ConditionConfig::default());
        let mut recorder = Recorder::new(RecorderConfig::new("ctl"));
        let pv = |n: u32, claim: &str| MonitoredVolume {
            pv: format!("pv-{n}").into(),
            handle: format!("h-{n}").into(),
            claim: Some(Arc::new(ObjectRef {
                name: claim.into(),
                uid: format!("uid-{claim}"),
                ..self::claim()
            })),
        };
        let get =
            |entries: Vec<CsiEntry>| Observation::CsiControllerGet(CsiReport::Health(entries));
        let lost = || CsiEntry {
            status: Status::Degraded,
            reason: "ReplicaLost".into(),
            message: "replica 2 of 3 lost".into(),
        };
        let volumes = [pv(1, "a"), pv(2, "b"), pv(3, "c")];
        let all_healthy = || vec![get(vec![]), get(vec![]), get(vec![])];
        pvs.apply(&volumes, all_healthy(), &volumes, &mut recorder, t(0));
        assert_eq!(pvs.len(), 0, "healthy PVs hold no state");
        assert!(recorder.is_empty());
        // A failed probe of a healthy PV is no news and no state either.
        let failed = || Observation::CsiControllerGet(CsiReport::ProbeFailed("timeout".into()));
        pvs.apply(
            &volumes,
            vec![failed(), failed(), failed()],
            &volumes,
            &mut recorder,
            t(1),
        );
        assert_eq!(pvs.len(), 0);
        // PV 2 moved to claim "d" while healthy, then degraded: its
        // condition goes to "d", the claim it has now.
        let moved = [pv(1, "a"), pv(2, "d"), pv(3, "c")];
        let one = vec![get(vec![]), get(vec![lost()]), get(vec![])];
        pvs.apply(&moved, one, &moved, &mut recorder, t(2));
        assert_eq!((pvs.len(), pvs.abnormal()), (1, 1));
        let held = pvs.claim_conditions();
        assert_eq!(held.len(), 1);
        assert_eq!((held[0].0.name.as_str(), held[0].1.as_str()), ("d", "pv-2"));
        assert_eq!(held[0].2[0].reason, "ReplicaLost");
        assert!(!recorder.is_empty(), "the Warning is on its way");
        // Healthy again: the state goes with its condition.
        pvs.apply(&moved, all_healthy(), &moved, &mut recorder, t(3));
        assert_eq!((pvs.len(), pvs.abnormal()), (0, 0));
        assert!(pvs.claim_conditions().is_empty());
    }

    #[test]
    fn stored_conditions_are_the_driver_entrys_with_a_start() {
        let stored =
            Stored::from_objects(&[object("uid-data", &time(t(10))), object("uid-data", "soon")]);
        assert_eq!(
            stored,
            [Stored {
                namespace: "shop".into(),
                claim: "data".into(),
                uid: Some("uid-data".into()),
                pv: Some("pv-1".into()),
                entry: CsiEntry {
                    status: Status::Degraded,
                    reason: "ReplicaLost".into(),
                    message: "replica 2 of 3 lost".into(),
                },
                since: t(10),
            }]
        );
    }

    #[test]
    fn a_stored_condition_goes_on_from_its_start_tells_no_event_and_ends_on_evidence() {
        let mut pvs = PvHealth::new(ConditionConfig::default());
        let mut recorder = Recorder::new(RecorderConfig::new("ctl-b"));
        // Another claim's object (a PVC recreated under the same name) is
        // not this one's.
        let stale = Stored::from_objects(&[object("uid-old", &time(t(3)))]);
        assert_eq!(pvs.seed_stored(&stale, &[volume()]), 0);
        let stored = Stored::from_objects(&[object("uid-data", &time(t(10)))]);
        assert_eq!(pvs.seed_stored(&stored, &[volume()]), 1);
        assert!(recorder.is_empty(), "no Event for an episode told before");
        let held = pvs.claim_conditions();
        assert_eq!(held.len(), 1);
        let (to, pv, conditions) = &held[0];
        assert_eq!((to, pv.as_str()), (&claim(), "pv-1"));
        assert_eq!(
            conditions
                .iter()
                .map(|c| (c.reason.as_str(), c.since))
                .collect::<Vec<_>>(),
            [("ReplicaLost", t(10))]
        );
        // Still listed abnormal: the episode goes on, nothing changes.
        let listed = CsiListSighting::Listed(vec![CsiEntry {
            status: Status::Degraded,
            reason: "ReplicaLost".into(),
            message: "replica 2 of 3 lost".into(),
        }]);
        let now = t(100);
        pvs.apply(
            &[volume()],
            vec![Observation::CsiControllerList(listed)],
            &[volume()],
            &mut recorder,
            now,
        );
        assert!(recorder.is_empty());
        assert_eq!(pvs.claim_conditions()[0].2[0].since, t(10));
        // A healthy Get: over at once.
        let healthy = Observation::CsiControllerGet(CsiReport::Health(vec![]));
        pvs.apply(
            &[volume()],
            vec![healthy],
            &[volume()],
            &mut recorder,
            now + Duration::from_secs(2),
        );
        // The state goes with its last condition.
        assert!(pvs.claim_conditions().is_empty());
        assert_eq!((pvs.abnormal(), pvs.len()), (0, 0));
        assert!(
            recorder.is_empty(),
            "no Warning was open: no recovery Event"
        );
    }
}
