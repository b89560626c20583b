//! Series: one per (involved object, reason, episode). Condition changes
//! become contributors to open Warning series; the last one to clear closes
//! it and records the recovery in a Normal series.

use std::collections::BTreeMap;
use std::time::SystemTime;

use health_core::conditions::{Change, Condition, Status};
use health_core::volume::VolumeKey;
use tokio::time::Instant;

use super::held_recoveries::Awaiting;
use super::message::{clip, pods_phrase, strip_subject, subject as phrase_of};
use super::{ContributorKey, EventType, ObjectKind, ObjectRef, Recorder, SeriesId, Targets};

/// Who a contributor's message names: a node's pod volume (phrased per
/// object kind, pods aggregated on a PVC), or a fixed phrase given by the
/// caller (the controller's `PV pv-1`, `node node-1`).
#[derive(Clone, Debug)]
pub(super) enum Subject {
    Volume(Targets),
    Named(String),
}

/// What the server holds of a series. Event times have whole seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub(super) count: u64,
    pub(super) message: String,
    pub(super) last_secs: u64,
}

#[derive(Clone, Debug)]
struct Contributor {
    count: u64,
    /// When the condition was raised (its episode began, as this process
    /// knows it).
    since: SystemTime,
    /// Raised/updated changes seen, the count of conditions that carry none.
    changes: u64,
    message: String,
    last: SystemTime,
    subject: Subject,
}

#[derive(Clone, Debug)]
pub(super) struct Series {
    pub(super) object: ObjectRef,
    pub(super) type_: EventType,
    pub(super) reason: String,
    /// The condition a Warning series reports (Normal: the one cleared).
    pub(super) condition: (Status, String),
    /// Open Warning series: pod volumes currently asserting the condition.
    contributors: BTreeMap<ContributorKey, Contributor>,
    pub(super) count: u64,
    pub(super) message: String,
    pub(super) first: SystemTime,
    pub(super) last: SystemTime,
    /// The Event's name, fixed when the series starts.
    pub(super) name: String,
    /// What the server has, once a create succeeded.
    pub(super) written: Option<Snapshot>,
    /// What the write in flight carries.
    pub(super) sending: Option<Snapshot>,
    pub(super) last_write: Option<Instant>,
    /// No further updates: removed once the server has its last state.
    pub(super) closed: bool,
    pub(super) in_flight: bool,
    /// The count an earlier agent process wrote to this Event before a
    /// restart (see `adopt`).
    pub(super) carried: Option<Carried>,
    /// An Event continued from before a restart that no pod volume has
    /// claimed yet: cleared at this instant (and this wall time) unless one
    /// does.
    pub(super) unclaimed_until: Option<(Instant, SystemTime)>,
    /// An Event continued from another instance (a former leader) whose
    /// `reportingInstance` the next write makes this one's.
    pub(super) foreign_instance: bool,
    /// A recovery waiting for the claim's `VolumeHealth` (see `held_recoveries`).
    pub(super) awaiting_status: Option<Awaiting>,
}

/// What an earlier agent process wrote to a continued Event.
#[derive(Clone, Debug)]
pub(super) struct Carried {
    pub(super) count: u64,
    /// Its `lastTimestamp` (whole seconds).
    pub(super) last: SystemTime,
}

impl Series {
    pub(super) fn current(&self) -> Snapshot {
        Snapshot {
            count: self.count,
            message: self.message.clone(),
            last_secs: unix_secs(self.last),
        }
    }

    /// No pod volume asserts it (yet): a series continued from before a
    /// restart until the condition comes back.
    pub(super) fn unclaimed(&self) -> bool {
        self.contributors.is_empty()
    }

    pub(super) fn dirty(&self) -> bool {
        self.written.as_ref() != Some(&self.current())
    }
}

impl Recorder {
    /// Takes one pod volume's condition changes: its pod gets them, and so
    /// does its PVC (aggregated over the pods using it).
    pub fn observe(
        &mut self,
        key: &VolumeKey,
        targets: &Targets,
        changes: &[Change],
        now: SystemTime,
    ) {
        let objects: Vec<ObjectRef> = std::iter::once(&targets.pod)
            .chain(targets.pvc.as_ref())
            .cloned()
            .collect();
        let subject = Subject::Volume(targets.clone());
        let key = ContributorKey::Volume(key.clone());
        self.observe_changes(&key, &objects, &subject, changes, now);
    }

    /// Takes condition changes from a contributor that is not a node's pod
    /// volume (the controller's PV, a down node): each of `objects` gets
    /// them, and messages name `subject` (`PV pv-1`). A contributor is
    /// identified by `contributor` across calls.
    pub fn observe_on(
        &mut self,
        contributor: &str,
        subject: &str,
        objects: &[ObjectRef],
        changes: &[Change],
        now: SystemTime,
    ) {
        let key = ContributorKey::Named(contributor.to_string());
        let subject = Subject::Named(subject.to_string());
        self.observe_changes(&key, objects, &subject, changes, now);
    }

    fn observe_changes(
        &mut self,
        key: &ContributorKey,
        objects: &[ObjectRef],
        subject: &Subject,
        changes: &[Change],
        now: SystemTime,
    ) {
        for change in changes {
            match change {
                Change::Raised(c) | Change::Updated { condition: c, .. } => {
                    self.assert(key, objects, subject, c)
                }
                Change::Cleared(c) => self.clear(key, objects, subject, c, now),
            }
        }
    }

    /// A pod volume is gone (its pod was deleted): it stops contributing,
    /// and no recovery is claimed for it.
    pub fn forget_volume(&mut self, key: &VolumeKey) {
        self.forget(&ContributorKey::Volume(key.clone()));
    }

    /// Like [`Recorder::forget_volume`] for a contributor of
    /// [`Recorder::observe_on`] (a PV deleted): no recovery is claimed.
    pub fn forget_contributor(&mut self, contributor: &str) {
        self.forget(&ContributorKey::Named(contributor.to_string()));
    }

    fn forget(&mut self, key: &ContributorKey) {
        let ids: Vec<SeriesId> = self
            .series
            .iter()
            .filter(|(_, s)| s.contributors.contains_key(key))
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            if let Some(s) = self.series.get_mut(&id) {
                // The other pods' view stands as written: a pod leaving is
                // not news worth a write.
                s.contributors.remove(key);
                if s.contributors.is_empty() {
                    // What the server has is final. Errors never written
                    // (the pod left before the first create) still go out.
                    if s.written.is_some() {
                        s.written = Some(s.current());
                    }
                    self.close(id);
                }
            }
        }
        self.gc();
    }

    fn assert(
        &mut self,
        key: &ContributorKey,
        objects: &[ObjectRef],
        subject: &Subject,
        c: &Condition,
    ) {
        for object in objects {
            let open_key = (object.clone(), c.status, c.reason.clone());
            let id = match self.open.get(&open_key) {
                Some(id) => *id,
                None => {
                    let Some(id) = self.start(
                        object,
                        EventType::Warning,
                        &c.reason,
                        (c.status, c.reason.clone()),
                        c.since,
                    ) else {
                        continue;
                    };
                    self.open.insert(open_key, id);
                    id
                }
            };
            let Some(s) = self.series.get_mut(&id) else {
                continue;
            };
            // A continued Event is this episode's from now on.
            s.unclaimed_until = None;
            let entry = s
                .contributors
                .entry(key.clone())
                .or_insert_with(|| Contributor {
                    count: 0,
                    since: c.since,
                    changes: 0,
                    message: String::new(),
                    last: c.last_probe,
                    subject: subject.clone(),
                });
            entry.changes += 1;
            entry.count = c.occurrences.unwrap_or(entry.changes);
            entry.message = c.message.clone();
            entry.last = c.last_probe;
            entry.subject = subject.clone();
            refresh(s);
        }
    }

    fn clear(
        &mut self,
        key: &ContributorKey,
        objects: &[ObjectRef],
        subject: &Subject,
        c: &Condition,
        now: SystemTime,
    ) {
        for object in objects {
            let open_key = (object.clone(), c.status, c.reason.clone());
            let Some(&id) = self.open.get(&open_key) else {
                continue;
            };
            let Some(s) = self.series.get_mut(&id) else {
                continue;
            };
            if s.contributors.remove(key).is_none() {
                continue;
            }
            if !s.contributors.is_empty() {
                // Another pod still sees it: the PVC has not recovered.
                refresh(s);
                continue;
            }
            let was = s.message.clone();
            self.close(id);
            let phrase = match subject {
                Subject::Volume(targets) => phrase_of(object, targets),
                Subject::Named(phrase) => phrase.clone(),
            };
            self.recovered(object, &phrase, (c.status, &c.reason), &was, now);
        }
        self.gc();
    }

    /// Records a recovery of `condition` on `object` in its Normal series.
    pub(super) fn recovered(
        &mut self,
        object: &ObjectRef,
        subject: &str,
        condition: (Status, &str),
        was: &str,
        now: SystemTime,
    ) {
        let (status, cleared) = condition;
        let reason = format!("{cleared}Cleared");
        let id = match self.normal.get(&(object.clone(), reason.clone())) {
            Some(id) => *id,
            None => {
                let Some(id) = self.start(
                    object,
                    EventType::Normal,
                    &reason,
                    (status, cleared.to_string()),
                    now,
                ) else {
                    return;
                };
                self.normal.insert((object.clone(), reason.clone()), id);
                id
            }
        };
        let waits = self.status_hold.is_some() && object.kind == ObjectKind::PersistentVolumeClaim;
        let Some(s) = self.series.get_mut(&id) else {
            return;
        };
        s.count += 1;
        s.last = s.last.max(now);
        if waits {
            s.awaiting_status.get_or_insert(Awaiting { since: None });
        }
        s.message = clip(format!(
            "{subject}: {status} {cleared} cleared; it was: {}",
            strip_subject(was)
        ));
    }

    /// Starts a series; `None` when `max_series` is reached.
    pub(super) fn start(
        &mut self,
        object: &ObjectRef,
        type_: EventType,
        reason: &str,
        condition: (Status, String),
        first: SystemTime,
    ) -> Option<SeriesId> {
        if self.series.len() >= self.config.max_series {
            self.stats.dropped_series += 1;
            tracing::warn!(
                object = %object.name,
                reason,
                "event series limit reached; this event is not recorded"
            );
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let name = self.event_name(object, first);
        self.series.insert(
            id,
            Series {
                object: object.clone(),
                type_,
                reason: reason.to_string(),
                condition,
                contributors: BTreeMap::new(),
                count: 0,
                message: String::new(),
                first,
                last: first,
                name,
                written: None,
                sending: None,
                last_write: None,
                closed: false,
                in_flight: false,
                carried: None,
                unclaimed_until: None,
                foreign_instance: false,
                awaiting_status: None,
            },
        );
        Some(id)
    }

    /// `<object>.<hex nanoseconds>` like client-go, unique per recorder.
    pub(super) fn event_name(&mut self, object: &ObjectRef, at: SystemTime) -> String {
        self.name_seq += 1;
        let nanos = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        format!("{}.{:x}", object.name, nanos.wrapping_add(self.name_seq))
    }

    pub(super) fn close(&mut self, id: SeriesId) {
        let Some(s) = self.series.get_mut(&id) else {
            return;
        };
        s.closed = true;
        let key = (s.object.clone(), s.condition.0, s.condition.1.clone());
        if self.open.get(&key) == Some(&id) {
            self.open.remove(&key);
        }
    }

    /// Drops closed series the server has in full, and series that never
    /// got anything to say.
    pub(super) fn gc(&mut self) {
        let done: Vec<SeriesId> = self
            .series
            .iter()
            .filter(|(_, s)| s.closed && !s.in_flight && (!s.dirty() || s.count == 0))
            .map(|(id, _)| *id)
            .collect();
        for id in done {
            self.series.remove(&id);
        }
        let live: std::collections::HashSet<&ObjectRef> =
            self.series.values().map(|s| &s.object).collect();
        self.writes.retain(|o, _| live.contains(o));
        self.held.retain(|o, _| live.contains(o));
    }
}

/// Recomputes an open Warning series from its contributors: the largest
/// count, and the message of the contributor that has it.
pub(super) fn refresh(s: &mut Series) {
    let Some(top) = s
        .contributors
        .values()
        .max_by(|a, b| (a.count, a.last).cmp(&(b.count, b.last)))
    else {
        return;
    };
    // After a restart the episode's count goes on from what the earlier
    // process wrote. A condition raised before that Event's last write
    // (kernel counts adopted from pinned maps), or no later than the Event
    // began (the controller seeds its state at the Event's start), is the
    // episode the Event tells and already has its count; one raised since
    // counts only the new ones.
    let (count, before_restart) = match &s.carried {
        Some(c) if top.since < c.last || top.since <= s.first => (top.count.max(c.count), None),
        Some(c) => (c.count + top.count, Some(c.count)),
        None => (top.count, None),
    };
    s.count = count;
    s.last = s
        .contributors
        .values()
        .map(|c| c.last)
        .chain(s.carried.as_ref().map(|c| c.last))
        .max()
        .unwrap_or(s.last)
        .max(s.first);
    let targets: Vec<&Targets> = s
        .contributors
        .values()
        .filter_map(|c| match &c.subject {
            Subject::Volume(t) => Some(t),
            Subject::Named(_) => None,
        })
        .collect();
    s.message = clip(format!(
        "{}: {} {}: {}",
        match (&top.subject, s.object.kind) {
            (Subject::Named(phrase), _) => phrase.clone(),
            (Subject::Volume(t), ObjectKind::Pod) => t.volume_phrase(),
            (Subject::Volume(_), ObjectKind::PersistentVolumeClaim) => pods_phrase(&targets),
        },
        s.condition.0,
        s.condition.1,
        top.message
    ));
    if let Some(n) = before_restart {
        s.message = clip(format!(
            "{} (and {n} reported before the agent restarted)",
            s.message
        ));
    }
}

pub(super) fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
