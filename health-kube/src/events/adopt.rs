//! Continuing after a restart. The agent keeps no state file: what it needs
//! to go on with the Events an earlier process on this node wrote is on the
//! API server. The writer lists them once before its first write, and
//! [`Recorder::adopt`] seeds the series from them:
//! - the newest Warning per (object, reason) that no later `<Reason>Cleared`
//!   followed is an open episode: the same Event object is patched from now
//!   on, its `count` going on from what it says;
//! - the newest Normal per (object, reason) takes later recoveries, as it
//!   would have without the restart;
//! - an Event another instance wrote (a former leader of the controller)
//!   names this one as its `reportingInstance` from its next write on;
//! - an open episode no pod volume claims again (the condition did not come
//!   back after the restart) is cleared once the quiet window after its
//!   last report has passed, so a recovery during or after a restart is
//!   still reported.

use std::collections::BTreeMap;
use std::time::SystemTime;

use health_core::conditions::Status;
use k8s_openapi::api::core::v1::Event;
use tokio::time::Instant;

use super::message::strip_subject;
use super::series::{refresh, unix_secs, Carried, Snapshot};
use super::{EventType, ObjectKind, ObjectRef, Recorder, RecorderConfig, SeriesId};

/// What an Event from before the restart says, as the recorder uses it.
#[derive(Clone, Debug)]
struct Recovered {
    object: ObjectRef,
    type_: EventType,
    reason: String,
    /// The condition's status and reason, from the message.
    condition: (Status, String),
    name: String,
    count: u64,
    first: SystemTime,
    last: SystemTime,
    message: String,
    /// Its `reportingInstance` (or `source.host`).
    instance: String,
}

impl Recovered {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            count: self.count,
            message: self.message.clone(),
            last_secs: unix_secs(self.last),
        }
    }
}

/// An open Warning continued from an earlier process that no contributor
/// claims yet (see [`Recorder::unclaimed`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unclaimed {
    pub object: ObjectRef,
    pub status: Status,
    pub reason: String,
    /// What the Event's message names before the condition (`PV pv-1`).
    pub subject: String,
    /// The condition's own message (after `<Status> <Reason>: `).
    pub message: String,
    /// The Event's `firstTimestamp` and `lastTimestamp`.
    pub first: SystemTime,
    pub last: SystemTime,
}

/// What [`Recorder::adopt`] took over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Open Warning Events continued.
    pub warnings: usize,
    /// Recovery Events that later recoveries aggregate into.
    pub normals: usize,
    /// Events listed that this node's agent wrote (of any age or state).
    pub own: usize,
}

impl Recorder {
    /// Seeds the series from `events` (the API server's list, see the
    /// module doc). Call before the first write; `now` and `at` are the same
    /// moment on the two clocks. Events of other nodes or components, and
    /// Events this agent would not have written, are ignored.
    pub fn adopt(&mut self, events: &[Event], now: SystemTime, at: Instant) -> Adopted {
        let own: Vec<Recovered> = events
            .iter()
            .filter_map(|e| recovered(&self.config, e))
            .collect();
        let mut newest: BTreeMap<(ObjectRef, EventType, String), Recovered> = BTreeMap::new();
        for r in &own {
            let key = (r.object.clone(), r.type_, r.reason.clone());
            match newest.get(&key) {
                Some(have) if (have.last, &have.name) >= (r.last, &r.name) => {}
                _ => {
                    newest.insert(key, r.clone());
                }
            }
        }
        let mut adopted = Adopted {
            own: own.len(),
            ..Adopted::default()
        };
        for r in newest.values() {
            match r.type_ {
                EventType::Normal => adopted.normals += usize::from(self.adopt_normal(r, at)),
                EventType::Warning => {
                    let cleared = newest
                        .get(&(
                            r.object.clone(),
                            EventType::Normal,
                            format!("{}Cleared", r.reason),
                        ))
                        .is_some_and(|n| n.last >= r.last);
                    if !cleared {
                        adopted.warnings += usize::from(self.adopt_warning(r, now, at));
                    }
                }
            }
        }
        adopted
    }

    fn adopt_warning(&mut self, r: &Recovered, now: SystemTime, at: Instant) -> bool {
        let foreign = r.instance != self.config.host;
        let carried = Carried {
            count: r.count,
            last: r.last,
        };
        let open_key = (r.object.clone(), r.condition.0, r.condition.1.clone());
        if let Some(&id) = self.open.get(&open_key) {
            // The condition came back before the list did: its series has
            // not been written yet and becomes the continued Event.
            let Some(s) = self.series.get_mut(&id) else {
                return false;
            };
            if s.written.is_some() || s.in_flight {
                return false;
            }
            s.name = r.name.clone();
            s.first = r.first;
            s.carried = Some(carried);
            s.written = Some(r.snapshot());
            s.foreign_instance = foreign;
            refresh(s);
            return true;
        }
        let Some(id) = self.start(
            &r.object,
            EventType::Warning,
            &r.reason,
            r.condition.clone(),
            r.first,
        ) else {
            return false;
        };
        // Cleared when the quiet window after its last report ends, as it
        // would have been without the restart (at once if that is past).
        let clear_at = (r.last + self.config.unclaimed_clear_after).max(now);
        let clear_in = clear_at.duration_since(now).unwrap_or_default();
        self.open.insert(open_key, id);
        let Some(s) = self.series.get_mut(&id) else {
            return false;
        };
        s.name = r.name.clone();
        s.count = r.count;
        s.message = r.message.clone();
        s.last = r.last;
        s.carried = Some(carried);
        s.written = Some(r.snapshot());
        s.foreign_instance = foreign;
        s.unclaimed_until = Some((at + clear_in, clear_at));
        true
    }

    fn adopt_normal(&mut self, r: &Recovered, at: Instant) -> bool {
        let foreign = r.instance != self.config.host;
        let key = (r.object.clone(), r.reason.clone());
        let id = match self.normal.get(&key) {
            Some(&id) => id,
            None => {
                let Some(id) = self.start(
                    &r.object,
                    EventType::Normal,
                    &r.reason,
                    r.condition.clone(),
                    r.first,
                ) else {
                    return false;
                };
                self.normal.insert(key, id);
                id
            }
        };
        let Some(s) = self.series.get_mut(&id) else {
            return false;
        };
        if s.written.is_some() || s.in_flight {
            return false;
        }
        // Recoveries recorded before the list came back add to its count.
        s.count += r.count;
        s.last = s.last.max(r.last);
        if s.message.is_empty() {
            s.message = r.message.clone();
        }
        s.name = r.name.clone();
        s.first = r.first;
        s.written = Some(r.snapshot());
        s.foreign_instance = foreign;
        // Let go of it after NORMAL_IDLE from now, like one written now.
        s.last_write = Some(at);
        true
    }

    /// Lets go, without a recovery, of continued Events on objects `keep`
    /// rejects (a pod deleted while no agent ran is not a recovery, as
    /// [`Recorder::forget_volume`] has it); returns how many.
    pub fn drop_unclaimed(&mut self, keep: impl Fn(&ObjectRef) -> bool) -> usize {
        let gone: Vec<SeriesId> = self
            .series
            .iter()
            .filter(|(_, s)| {
                !s.closed && s.unclaimed() && s.unclaimed_until.is_some() && !keep(&s.object)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &gone {
            self.close(*id);
        }
        if !gone.is_empty() {
            self.gc();
        }
        gone.len()
    }

    /// The continued open Warnings nothing claims yet, for a caller that
    /// decides itself when they are confirmed or over (the controller).
    pub fn unclaimed(&self) -> Vec<Unclaimed> {
        self.series
            .values()
            .filter(|s| {
                s.type_ == EventType::Warning
                    && !s.closed
                    && s.unclaimed()
                    && s.unclaimed_until.is_some()
            })
            .map(|s| Unclaimed {
                object: s.object.clone(),
                status: s.condition.0,
                reason: s.condition.1.clone(),
                subject: s
                    .message
                    .split_once(": ")
                    .map_or("", |(subject, _)| subject)
                    .to_string(),
                message: strip_subject(&s.message).to_string(),
                first: s.first,
                last: s.last,
            })
            .collect()
    }

    /// Ends a continued open Warning nothing claims with a recovery (the
    /// caller has evidence the condition is over); false if there is none.
    pub fn clear_unclaimed(
        &mut self,
        object: &ObjectRef,
        status: Status,
        reason: &str,
        now: SystemTime,
    ) -> bool {
        let key = (object.clone(), status, reason.to_string());
        let Some(&id) = self.open.get(&key) else {
            return false;
        };
        let Some(s) = self.series.get(&id) else {
            return false;
        };
        if !s.unclaimed() || s.unclaimed_until.is_none() {
            return false;
        }
        let was = s.message.clone();
        let subject = was.split_once(": ").map_or("", |(s, _)| s).to_string();
        self.close(id);
        self.recovered(object, &subject, (status, reason), &was, now);
        self.gc();
        true
    }

    /// Some continued Event is still unclaimed.
    pub fn has_unclaimed(&self) -> bool {
        self.series
            .values()
            .any(|s| !s.closed && s.unclaimed() && s.unclaimed_until.is_some())
    }

    /// Clears continued Events that no pod volume claimed by their time;
    /// returns when the next one is due.
    pub(super) fn expire_unclaimed(&mut self, now: Instant) -> Option<Instant> {
        let due: Vec<SeriesId> = self
            .series
            .iter()
            .filter(|(_, s)| {
                !s.closed && s.unclaimed() && s.unclaimed_until.is_some_and(|(at, _)| at <= now)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &due {
            let Some(s) = self.series.get(id) else {
                continue;
            };
            let object = s.object.clone();
            let (status, reason) = s.condition.clone();
            let was = s.message.clone();
            // The subject is what the Warning named (a volume on a pod, the
            // pods on a PVC): the first part of its message.
            let subject = was.split_once(": ").map_or("", |(s, _)| s).to_string();
            let when = s.unclaimed_until.map_or(SystemTime::UNIX_EPOCH, |(_, w)| w);
            self.close(*id);
            self.recovered(&object, &subject, (status, &reason), &was, when);
        }
        if !due.is_empty() {
            self.gc();
        }
        self.series
            .values()
            .filter(|s| !s.closed && s.unclaimed())
            .filter_map(|s| s.unclaimed_until.map(|(at, _)| at))
            .min()
    }
}

/// An Event this node's agent wrote, in the terms of a series; `None` for
/// anything else.
fn recovered(config: &RecorderConfig, e: &Event) -> Option<Recovered> {
    let component = e
        .reporting_component
        .as_deref()
        .or(e.source.as_ref().and_then(|s| s.component.as_deref()));
    let host = e
        .reporting_instance
        .as_deref()
        .or(e.source.as_ref().and_then(|s| s.host.as_deref()));
    if component != Some(config.component.as_str())
        || (!config.adopt_any_instance && host != Some(config.host.as_str()))
    {
        return None;
    }
    let instance = host.unwrap_or_default().to_string();
    let o = &e.involved_object;
    let kind = match o.kind.as_deref()? {
        "Pod" => ObjectKind::Pod,
        "PersistentVolumeClaim" => ObjectKind::PersistentVolumeClaim,
        _ => return None,
    };
    let type_ = match e.type_.as_deref()? {
        "Warning" => EventType::Warning,
        "Normal" => EventType::Normal,
        _ => return None,
    };
    let reason = e.reason.clone()?;
    let message = e.message.clone().unwrap_or_default();
    let condition = condition_of(&message, type_, &reason)?;
    let last = e.last_timestamp.as_ref()?.0;
    let first = e.first_timestamp.as_ref().map_or(last, |t| t.0);
    Some(Recovered {
        object: ObjectRef {
            kind,
            namespace: o.namespace.clone()?,
            name: o.name.clone()?,
            uid: o.uid.clone().unwrap_or_default(),
        },
        type_,
        reason,
        condition,
        name: e.metadata.name.clone()?,
        count: u64::try_from(e.count.unwrap_or(1)).unwrap_or(0),
        first: SystemTime::from(first),
        last: SystemTime::from(last),
        message,
        instance,
    })
}

/// The condition an Event of ours reports, from its message
/// (`<subject>: <Status> <Reason>...`): the reason must agree with the
/// Event's (a Normal's is `<Reason>Cleared`).
fn condition_of(message: &str, type_: EventType, reason: &str) -> Option<(Status, String)> {
    let (_, rest) = message.split_once(": ")?;
    let mut words = rest.split(' ');
    let status = match words.next()? {
        "Inaccessible" => Status::Inaccessible,
        "DataLoss" => Status::DataLoss,
        "Degraded" => Status::Degraded,
        _ => return None,
    };
    let said = words.next()?.trim_end_matches(':');
    let condition = match type_ {
        EventType::Warning => reason,
        EventType::Normal => reason.strip_suffix("Cleared")?,
    };
    (said == condition).then(|| (status, condition.to_string()))
}
