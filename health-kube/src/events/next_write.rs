//! Writes: which series is written next (oldest first, open series at most
//! once per `min_update_interval`, each object within its budget), the
//! request it becomes, and what the server's answer does to the series.

use std::time::SystemTime;

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use tokio::time::Instant;

use super::budget::budget_free_at;
use super::series::Series;
use super::{EventType, ObjectRef, Recorder, RecorderConfig, SeriesId, NORMAL_IDLE};

/// One request the writer is to make.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Create {
        series: SeriesId,
        event: Box<Event>,
    },
    /// A JSON merge patch of `count`, `lastTimestamp` and `message` (and of
    /// `reportingInstance` and `source.host` when the Event was another
    /// instance's).
    Patch {
        series: SeriesId,
        namespace: String,
        name: String,
        type_: EventType,
        reason: String,
        patch: serde_json::Value,
    },
}

impl Write {
    pub fn series(&self) -> SeriesId {
        match self {
            Write::Create { series, .. } | Write::Patch { series, .. } => *series,
        }
    }

    /// The Event's type and reason.
    pub fn kind(&self) -> (EventType, &str) {
        match self {
            Write::Create { event, .. } => (
                match event.type_.as_deref() {
                    Some("Normal") => EventType::Normal,
                    _ => EventType::Warning,
                },
                event.reason.as_deref().unwrap_or_default(),
            ),
            Write::Patch { type_, reason, .. } => (*type_, reason),
        }
    }
}

/// How a write ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// Patch of an Event the server no longer has (Events expire): the
    /// series is created again under a new name.
    NotFound,
    /// Create of a name that exists: retried under a new name.
    Conflict,
    /// The server could not take it now (unreachable, 5xx, 429): kept and
    /// retried after backoff.
    Retry,
    /// The server refused it for good (403, 422...): dropped, to keep the
    /// agent from retrying forever something that cannot succeed.
    Rejected,
}

/// What [`Recorder::next_write`] found.
#[derive(Debug, PartialEq)]
pub enum Next {
    Write(Write),
    /// Nothing due before this instant (`None`: nothing pending at all).
    Idle(Option<Instant>),
}

impl Recorder {
    /// The next write allowed at `now`, oldest series first (a Warning goes
    /// out before the recovery that follows it), or when to ask again.
    pub fn next_write(&mut self, now: Instant) -> Next {
        self.expire_normal(now);
        let mut wake: Option<Instant> = self.expire_unclaimed(now);
        let (waiting, waits_until) = self.waiting_for_status(now);
        if let Some(at) = waits_until {
            wake = earliest(wake, at);
        }
        let mut blocked: Vec<ObjectRef> = Vec::new();
        let mut found: Option<SeriesId> = None;
        let cap = self.config.writes_per_object_per_minute.max(1) as usize;
        // One write per object at a time: its writes keep their order (a
        // Warning's last patch before the recovery), and the cap counts
        // each before the next starts. Writes to different objects overlap.
        let busy: Vec<&ObjectRef> = self
            .series
            .values()
            .filter(|s| s.in_flight)
            .map(|s| &s.object)
            .collect();
        for (id, s) in &self.series {
            if s.in_flight
                || !s.dirty()
                || s.count == 0
                || blocked.contains(&s.object)
                || busy.contains(&&s.object)
            {
                continue;
            }
            // A recovery waiting for its claim's VolumeHealth, and what came
            // after it on the same object, keep their order behind it.
            if waiting
                .iter()
                .any(|(o, first)| *o == s.object && id >= first)
            {
                continue;
            }
            // Open series are patched at most once per interval.
            if s.written.is_some() && !s.closed {
                if let Some(at) = s.last_write {
                    let due = at + self.config.min_update_interval;
                    if due > now {
                        wake = earliest(wake, due);
                        continue;
                    }
                }
            }
            if let Some(free_at) = budget_free_at(&mut self.writes, cap, &s.object, now) {
                wake = earliest(wake, free_at);
                blocked.push(s.object.clone());
                continue;
            }
            found = Some(*id);
            break;
        }
        for object in blocked {
            let held = self.held.entry(object).or_insert(false);
            if !*held {
                *held = true;
                self.stats.deferred += 1;
            }
        }
        let Some(id) = found else {
            return Next::Idle(wake);
        };
        let Some(s) = self.series.get_mut(&id) else {
            return Next::Idle(wake);
        };
        s.in_flight = true;
        s.sending = Some(s.current());
        let write = match &s.written {
            None => Write::Create {
                series: id,
                event: Box::new(event_object(&self.config, s)),
            },
            Some(_) => {
                let mut patch = serde_json::json!({
                    "count": event_count(s.count),
                    "lastTimestamp": time(s.last),
                    "message": s.message,
                });
                if s.foreign_instance {
                    // Continued from a former leader: who reports it now.
                    patch["reportingInstance"] = serde_json::json!(self.config.host);
                    patch["source"] = serde_json::json!({ "host": self.config.host });
                }
                Write::Patch {
                    series: id,
                    namespace: s.object.namespace.clone(),
                    name: s.name.clone(),
                    type_: s.type_,
                    reason: s.reason.clone(),
                    patch,
                }
            }
        };
        Next::Write(write)
    }

    /// Lets go of recovery series written long ago and idle since.
    fn expire_normal(&mut self, now: Instant) {
        let idle: Vec<SeriesId> = self
            .series
            .iter()
            .filter(|(_, s)| {
                s.type_ == EventType::Normal
                    && !s.in_flight
                    && !s.dirty()
                    && s.last_write
                        .is_some_and(|at| now.saturating_duration_since(at) >= NORMAL_IDLE)
            })
            .map(|(id, _)| *id)
            .collect();
        if idle.is_empty() {
            return;
        }
        for id in idle {
            if let Some(s) = self.series.remove(&id) {
                self.normal.remove(&(s.object, s.reason));
            }
        }
        self.gc();
    }

    /// Reports how `write` ended. `sent` is the state it carried, taken by
    /// the writer from the write itself.
    pub fn finish(&mut self, write: &Write, outcome: Outcome, now: Instant) {
        let id = write.series();
        let Some(s) = self.series.get_mut(&id) else {
            return;
        };
        s.in_flight = false;
        let sent = s.sending.take();
        match outcome {
            Outcome::Done => {
                s.written = sent;
                s.last_write = Some(now);
                s.foreign_instance = false;
                let object = s.object.clone();
                self.writes
                    .entry(object.clone())
                    .or_default()
                    .push_back(now);
                self.held.insert(object, false);
            }
            Outcome::NotFound | Outcome::Conflict => {
                // Count the attempt against the cap: the server answered.
                let object = s.object.clone();
                s.written = None;
                s.last_write = Some(now);
                let first = s.first;
                let name = self.event_name(&object, first);
                if let Some(s) = self.series.get_mut(&id) {
                    s.name = name;
                }
                self.writes.entry(object).or_default().push_back(now);
            }
            Outcome::Retry => {}
            Outcome::Rejected => {
                // Pretend it was written: retrying cannot succeed.
                s.written = sent.or_else(|| Some(s.current()));
                s.last_write = Some(now);
            }
        }
        self.gc();
    }
}

fn earliest(a: Option<Instant>, b: Instant) -> Option<Instant> {
    Some(a.map_or(b, |a| a.min(b)))
}

impl ObjectRef {
    fn reference(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some(self.kind.as_str().to_string()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: (!self.uid.is_empty()).then(|| self.uid.clone()),
            ..ObjectReference::default()
        }
    }
}

fn event_object(config: &RecorderConfig, s: &Series) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.object.namespace.clone()),
            // A node's agent finds its own Events after a restart by this
            // label (`crate::node_label`); the controller's replicas take
            // over each other's, by component.
            labels: (!config.adopt_any_instance).then(|| {
                [(
                    crate::node_label::EVENT_NODE_LABEL.to_string(),
                    crate::node_label::node_label(&config.host),
                )]
                .into()
            }),
            ..ObjectMeta::default()
        },
        involved_object: s.object.reference(),
        reason: Some(s.reason.clone()),
        message: Some(s.message.clone()),
        type_: Some(s.type_.as_str().to_string()),
        count: Some(event_count(s.count)),
        first_timestamp: Some(time(s.first)),
        last_timestamp: Some(time(s.last)),
        source: Some(EventSource {
            component: Some(config.component.clone()),
            host: Some(config.host.clone()),
        }),
        reporting_component: Some(config.component.clone()),
        reporting_instance: Some(config.host.clone()),
        ..Event::default()
    }
}

fn event_count(n: u64) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

fn time(t: SystemTime) -> Time {
    // A time before 1970 or beyond jiff's range cannot come from the kernel
    // clock; the epoch is a visible, harmless fallback.
    Time(
        k8s_openapi::jiff::Timestamp::try_from(t)
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}
