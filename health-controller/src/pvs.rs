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

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use health_core::conditions::{
    Change, ConditionConfig, CsiEntry, CsiReport, Observation, Source, VolumeHealth,
};
use health_kube::events::{ObjectRef, Recorder, Unclaimed};

use super::inventory::MonitoredVolume;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct PvKey {
    pv: String,
    handle: String,
}

impl PvKey {
    fn of(v: &MonitoredVolume) -> Self {
        PvKey {
            pv: v.pv.clone(),
            handle: v.handle.clone(),
        }
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

    /// PVs with state (seen in some cycle).
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

    /// The claims this PV state reports to, with their PV and the
    /// conditions the driver's controller service asserts now.
    pub fn claim_conditions(
        &self,
    ) -> Vec<(ObjectRef, String, Vec<health_core::conditions::Condition>)> {
        self.states
            .iter()
            .filter_map(|(key, s)| {
                let claim = s.reported_to.clone()?;
                Some((claim, key.pv.clone(), s.health.conditions()))
            })
            .collect()
    }

    /// Applies one cycle. `current` is the inventory as it is now, after
    /// the calls: a PV no longer there was deleted meanwhile, and its
    /// observation is dropped with its state.
    pub fn apply(
        &mut self,
        observed: Vec<(MonitoredVolume, Observation)>,
        current: &[MonitoredVolume],
        recorder: &mut Recorder,
        now: SystemTime,
    ) {
        let current: BTreeMap<PvKey, &MonitoredVolume> =
            current.iter().map(|v| (PvKey::of(v), v)).collect();
        self.drop_deleted(&current, recorder);
        for (volume, observation) in observed {
            let key = PvKey::of(&volume);
            let Some(now_volume) = current.get(&key) else {
                continue;
            };
            let config = self.config.clone();
            let state = self.states.entry(key.clone()).or_insert_with(|| PvState {
                health: VolumeHealth::new(config),
                reported_to: None,
            });
            follow_claim(&key, state, now_volume.claim.as_ref(), recorder, now);
            let changes = state.health.apply(now, observation);
            if let Some(claim) = &state.reported_to {
                let objects = std::slice::from_ref(claim);
                recorder.observe_on(&key.contributor(), &key.subject(), objects, &changes, now);
            }
        }
    }

    fn drop_deleted(
        &mut self,
        current: &BTreeMap<PvKey, &MonitoredVolume>,
        recorder: &mut Recorder,
    ) {
        let gone: Vec<PvKey> = self
            .states
            .keys()
            .filter(|k| !current.contains_key(*k))
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
    /// replica's state, as if observed when the episode began, so the
    /// Events go on (same object, same count) instead of starting again.
    /// Returns how many were continued.
    pub fn seed(
        &mut self,
        adopted: &[Unclaimed],
        current: &[MonitoredVolume],
        recorder: &mut Recorder,
    ) -> usize {
        let mut seeded = 0;
        for volume in current {
            let Some(claim) = &volume.claim else {
                continue;
            };
            let key = PvKey::of(volume);
            let mine: Vec<&Unclaimed> = adopted
                .iter()
                .filter(|u| &u.object == claim && u.subject == key.subject())
                .collect();
            if mine.is_empty() {
                continue;
            }
            let entries: Vec<CsiEntry> = mine
                .iter()
                .map(|u| CsiEntry {
                    status: u.status,
                    reason: u.reason.clone(),
                    message: u.message.clone(),
                })
                .collect();
            // Before the Event's last report: the recorder then takes the
            // count the Event already has instead of adding to it.
            let at = mine
                .iter()
                .map(|u| {
                    let before_last = u.last.checked_sub(Duration::from_secs(1)).unwrap_or(u.last);
                    u.first.min(before_last)
                })
                .min()
                .unwrap_or(SystemTime::UNIX_EPOCH);
            let config = self.config.clone();
            let state = self.states.entry(key.clone()).or_insert_with(|| PvState {
                health: VolumeHealth::new(config),
                reported_to: None,
            });
            state.reported_to = Some(claim.clone());
            let changes = state.health.apply(
                at,
                Observation::CsiControllerGet(CsiReport::Health(entries)),
            );
            let objects = std::slice::from_ref(claim);
            recorder.observe_on(&key.contributor(), &key.subject(), objects, &changes, at);
            seeded += mine.len();
        }
        seeded
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
