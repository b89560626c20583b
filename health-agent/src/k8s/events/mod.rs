//! The event recorder: volume condition changes in, core/v1 Event writes out.
//!
//! It aggregates the way client-go's recorder does, and then some:
//! - one Event object per (involved object, reason, episode): a condition
//!   that keeps changing (a flood of kernel errors) updates that object's
//!   `count`, `lastTimestamp` and `message` instead of creating new ones;
//! - a PVC used by two pods on this node gets one Event, not two: each pod
//!   volume is a *contributor* to the PVC's series, and the count is the
//!   largest of theirs (the same kernel error reaches every pod volume on
//!   the device, so adding them up would double count);
//! - writes per object are capped per rolling minute, and an open series is
//!   patched at most once per `min_update_interval`, so a disk failing 10,000
//!   times a second costs a handful of requests; what is held back stays
//!   aggregated in place and goes out with exact counts when allowed;
//! - while the API server is unreachable nothing is queued: the series keep
//!   aggregating, and once writes succeed again the final counts go out.
//!
//! The recorder is plain data with no I/O and no clock of its own (every
//! call takes `now`), so its rules are tested without a server; [`writer`]
//! drives it against the API.
//!
//! Series and counts:
//! - Warning series: reason = the condition's reason (`BlockIOErrors`), count
//!   = the condition's occurrences (kernel errors in the episode) or, for
//!   conditions without a count, how many times it was raised or updated.
//! - When the last contributor clears it, the Warning series is closed
//!   (patched one last time if needed) and a Normal series with reason
//!   `<Reason>Cleared` records the recovery; the next episode starts a new
//!   Warning object.
//! - A pod volume that disappears (pod deleted) leaves its series without a
//!   recovery event: that is not a recovery.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use tokio::time::Instant;

use crate::volumes::conditions::{Change, Condition, Status};
use crate::volumes::VolumeKey;

/// Kinds of objects the agent reports on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ObjectKind {
    Pod,
    PersistentVolumeClaim,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Pod => "Pod",
            ObjectKind::PersistentVolumeClaim => "PersistentVolumeClaim",
        }
    }
}

/// An object an Event is about.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectRef {
    pub kind: ObjectKind,
    pub namespace: String,
    pub name: String,
    pub uid: String,
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

/// Where one pod volume's conditions are reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Targets {
    pub pod: ObjectRef,
    /// The pod's name for the volume (`spec.volumes[].name`).
    pub pod_volume: String,
    pub pvc: Option<ObjectRef>,
    pub pv: Option<String>,
}

impl Targets {
    /// `PVC shop/data (PV pv-1, volume "data")`, or for volumes without a
    /// claim `volume "scratch"`.
    fn volume_phrase(&self) -> String {
        match (&self.pvc, &self.pv) {
            (Some(pvc), Some(pv)) => format!(
                "PVC {}/{} (PV {pv}, volume \"{}\")",
                pvc.namespace, pvc.name, self.pod_volume
            ),
            (Some(pvc), None) => format!(
                "PVC {}/{} (volume \"{}\")",
                pvc.namespace, pvc.name, self.pod_volume
            ),
            (None, Some(pv)) => format!("PV {pv} (volume \"{}\")", self.pod_volume),
            (None, None) => format!("volume \"{}\"", self.pod_volume),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventType {
    Warning,
    Normal,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Warning => "Warning",
            EventType::Normal => "Normal",
        }
    }
}

#[derive(Clone, Debug)]
pub struct RecorderConfig {
    /// Hard cap on Event writes (creates and patches) per involved object
    /// per rolling minute.
    pub writes_per_object_per_minute: u32,
    /// An open series is patched at most this often; creates and final
    /// patches are not delayed by it.
    pub min_update_interval: Duration,
    /// `source.component` and `reportingComponent`.
    pub component: String,
    /// This node: `source.host` and `reportingInstance`.
    pub host: String,
    /// Series kept at most (bounded memory whatever happens); beyond it new
    /// series are dropped and counted.
    pub max_series: usize,
}

impl RecorderConfig {
    pub fn new(host: &str) -> Self {
        RecorderConfig {
            writes_per_object_per_minute: 6,
            min_update_interval: Duration::from_secs(10),
            component: COMPONENT.to_string(),
            host: host.to_string(),
            max_series: 10_000,
        }
    }
}

/// `source.component` of every Event the agent writes.
pub const COMPONENT: &str = "volume-health-agent";
/// The API server's own limit on an Event message is generous; `kubectl
/// describe` is not. Longer messages are cut at a character boundary.
pub const MAX_MESSAGE_BYTES: usize = 1024;
const WINDOW: Duration = Duration::from_secs(60);
/// A recovery Event idle this long is let go: the API server expires Events
/// after an hour by default, and keeping every pod's last recovery would
/// grow with pod churn. A later recovery starts a new Event.
pub const NORMAL_IDLE: Duration = Duration::from_secs(3600);

/// Identifies a series for the lifetime of the recorder.
pub type SeriesId = u64;

/// What the server holds of a series. Event times have whole seconds.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Snapshot {
    count: u64,
    message: String,
    last_secs: u64,
}

#[derive(Clone, Debug)]
struct Contributor {
    count: u64,
    /// Raised/updated changes seen, the count of conditions that carry none.
    changes: u64,
    message: String,
    last: SystemTime,
    targets: Targets,
}

#[derive(Clone, Debug)]
struct Series {
    object: ObjectRef,
    type_: EventType,
    reason: String,
    /// The condition a Warning series reports (Normal: the one cleared).
    condition: (Status, String),
    /// Open Warning series: pod volumes currently asserting the condition.
    contributors: BTreeMap<VolumeKey, Contributor>,
    count: u64,
    message: String,
    first: SystemTime,
    last: SystemTime,
    /// The Event's name, fixed when the series starts.
    name: String,
    /// What the server has, once a create succeeded.
    written: Option<Snapshot>,
    /// What the write in flight carries.
    sending: Option<Snapshot>,
    last_write: Option<Instant>,
    /// No further updates: removed once the server has its last state.
    closed: bool,
    in_flight: bool,
}

impl Series {
    fn current(&self) -> Snapshot {
        Snapshot {
            count: self.count,
            message: self.message.clone(),
            last_secs: unix_secs(self.last),
        }
    }

    fn dirty(&self) -> bool {
        self.written.as_ref() != Some(&self.current())
    }
}

/// One request the writer is to make.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    Create {
        series: SeriesId,
        event: Box<Event>,
    },
    /// A JSON merge patch of `count`, `lastTimestamp` and `message`.
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

/// Counters the writer turns into metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecorderStats {
    /// Writes held back by the per-object cap (counted once per episode of
    /// being held).
    pub deferred: u64,
    /// Series not started because `max_series` was reached.
    pub dropped_series: u64,
}

#[derive(Debug)]
pub struct Recorder {
    config: RecorderConfig,
    series: BTreeMap<SeriesId, Series>,
    /// Open Warning series by (object, status, reason).
    open: HashMap<(ObjectRef, Status, String), SeriesId>,
    /// Normal series by (object, reason): repeated recoveries aggregate.
    normal: HashMap<(ObjectRef, String), SeriesId>,
    /// Instants of recent writes per object (at most the cap, within a minute).
    writes: HashMap<ObjectRef, VecDeque<Instant>>,
    /// Objects currently held back by the cap (for `deferred`).
    held: HashMap<ObjectRef, bool>,
    next_id: SeriesId,
    /// Makes names unique when two series start in the same nanosecond.
    name_seq: u64,
    stats: RecorderStats,
}

impl Recorder {
    pub fn new(config: RecorderConfig) -> Self {
        Recorder {
            config,
            series: BTreeMap::new(),
            open: HashMap::new(),
            normal: HashMap::new(),
            writes: HashMap::new(),
            held: HashMap::new(),
            next_id: 1,
            name_seq: 0,
            stats: RecorderStats::default(),
        }
    }

    pub fn config(&self) -> &RecorderConfig {
        &self.config
    }

    pub fn stats(&self) -> RecorderStats {
        self.stats
    }

    /// Series held (open, or waiting to be written).
    pub fn len(&self) -> usize {
        self.series.len()
    }

    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }

    /// Whether some series has state the server does not have yet.
    pub fn has_pending(&self) -> bool {
        self.series.values().any(Series::dirty)
    }

    /// Takes one pod volume's condition changes: its pod gets them, and so
    /// does its PVC (aggregated over the pods using it).
    pub fn observe(
        &mut self,
        key: &VolumeKey,
        targets: &Targets,
        changes: &[Change],
        now: SystemTime,
    ) {
        for change in changes {
            match change {
                Change::Raised(c) | Change::Updated { condition: c, .. } => {
                    self.assert(key, targets, c)
                }
                Change::Cleared(c) => self.clear(key, targets, c, now),
            }
        }
    }

    /// A pod volume is gone (its pod was deleted): it stops contributing,
    /// and no recovery is claimed for it.
    pub fn forget_volume(&mut self, key: &VolumeKey) {
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

    fn assert(&mut self, key: &VolumeKey, targets: &Targets, c: &Condition) {
        let objects = std::iter::once(&targets.pod).chain(targets.pvc.as_ref());
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
            let entry = s
                .contributors
                .entry(key.clone())
                .or_insert_with(|| Contributor {
                    count: 0,
                    changes: 0,
                    message: String::new(),
                    last: c.last_probe,
                    targets: targets.clone(),
                });
            entry.changes += 1;
            entry.count = c.occurrences.unwrap_or(entry.changes);
            entry.message = c.message.clone();
            entry.last = c.last_probe;
            entry.targets = targets.clone();
            refresh(s);
        }
    }

    fn clear(&mut self, key: &VolumeKey, targets: &Targets, c: &Condition, now: SystemTime) {
        let objects = std::iter::once(&targets.pod).chain(targets.pvc.as_ref());
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
            self.recovered(object, targets, c, &was, now);
        }
        self.gc();
    }

    /// Records a recovery on `object` in its Normal series.
    fn recovered(
        &mut self,
        object: &ObjectRef,
        targets: &Targets,
        c: &Condition,
        was: &str,
        now: SystemTime,
    ) {
        let reason = format!("{}Cleared", c.reason);
        let id = match self.normal.get(&(object.clone(), reason.clone())) {
            Some(id) => *id,
            None => {
                let Some(id) = self.start(
                    object,
                    EventType::Normal,
                    &reason,
                    (c.status, c.reason.clone()),
                    now,
                ) else {
                    return;
                };
                self.normal.insert((object.clone(), reason.clone()), id);
                id
            }
        };
        let Some(s) = self.series.get_mut(&id) else {
            return;
        };
        s.count += 1;
        s.last = s.last.max(now);
        s.message = clip(format!(
            "{}: {} {} cleared; it was: {}",
            subject(object, targets),
            c.status,
            c.reason,
            strip_subject(was)
        ));
    }

    /// Starts a series; `None` when `max_series` is reached.
    fn start(
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
            },
        );
        Some(id)
    }

    /// `<object>.<hex nanoseconds>` like client-go, unique per recorder.
    fn event_name(&mut self, object: &ObjectRef, at: SystemTime) -> String {
        self.name_seq += 1;
        let nanos = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        format!("{}.{:x}", object.name, nanos.wrapping_add(self.name_seq))
    }

    fn close(&mut self, id: SeriesId) {
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
    fn gc(&mut self) {
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

    /// The next write allowed at `now`, oldest series first (a Warning goes
    /// out before the recovery that follows it), or when to ask again.
    pub fn next_write(&mut self, now: Instant) -> Next {
        self.expire_normal(now);
        let mut wake: Option<Instant> = None;
        let mut blocked: Vec<ObjectRef> = Vec::new();
        let mut found: Option<SeriesId> = None;
        let cap = self.config.writes_per_object_per_minute.max(1) as usize;
        for (id, s) in &self.series {
            if s.in_flight || !s.dirty() || s.count == 0 || blocked.contains(&s.object) {
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
            Some(_) => Write::Patch {
                series: id,
                namespace: s.object.namespace.clone(),
                name: s.name.clone(),
                type_: s.type_,
                reason: s.reason.clone(),
                patch: serde_json::json!({
                    "count": event_count(s.count),
                    "lastTimestamp": time(s.last),
                    "message": s.message,
                }),
            },
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

/// Recomputes an open Warning series from its contributors: the largest
/// count, and the message of the contributor that has it.
fn refresh(s: &mut Series) {
    let Some(top) = s
        .contributors
        .values()
        .max_by(|a, b| (a.count, a.last).cmp(&(b.count, b.last)))
    else {
        return;
    };
    s.count = top.count;
    s.last = s
        .contributors
        .values()
        .map(|c| c.last)
        .max()
        .unwrap_or(s.last)
        .max(s.first);
    let targets: Vec<&Targets> = s.contributors.values().map(|c| &c.targets).collect();
    s.message = clip(format!(
        "{}: {} {}: {}",
        match s.object.kind {
            ObjectKind::Pod => top.targets.volume_phrase(),
            ObjectKind::PersistentVolumeClaim => pods_phrase(&targets),
        },
        s.condition.0,
        s.condition.1,
        top.message
    ));
}

/// `pod shop/web-0`, `pods shop/web-0, shop/web-1`.
fn pods_phrase(targets: &[&Targets]) -> String {
    let mut names: Vec<String> = targets
        .iter()
        .map(|t| format!("{}/{}", t.pod.namespace, t.pod.name))
        .collect();
    names.sort();
    names.dedup();
    let pv = targets
        .iter()
        .find_map(|t| t.pv.as_deref())
        .map(|pv| format!(" (PV {pv})"))
        .unwrap_or_default();
    if names.len() == 1 {
        format!("pod {}{pv}", names[0])
    } else {
        format!("pods {}{pv}", names.join(", "))
    }
}

/// What a recovery message names on each kind of object.
fn subject(object: &ObjectRef, targets: &Targets) -> String {
    match object.kind {
        ObjectKind::Pod => targets.volume_phrase(),
        ObjectKind::PersistentVolumeClaim => pods_phrase(&[targets]),
    }
}

/// The condition part of a series message (after the subject and status).
fn strip_subject(message: &str) -> &str {
    message.splitn(3, ": ").nth(2).unwrap_or(message)
}

fn clip(mut s: String) -> String {
    if s.len() > MAX_MESSAGE_BYTES {
        let mut end = MAX_MESSAGE_BYTES - 3;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
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

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn event_object(config: &RecorderConfig, s: &Series) -> Event {
    Event {
        metadata: ObjectMeta {
            name: Some(s.name.clone()),
            namespace: Some(s.object.namespace.clone()),
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

/// `None` when `object` may be written at `now`, else when it may.
fn budget_free_at(
    writes: &mut HashMap<ObjectRef, VecDeque<Instant>>,
    cap: usize,
    object: &ObjectRef,
    now: Instant,
) -> Option<Instant> {
    let recent = writes.entry(object.clone()).or_default();
    while recent
        .front()
        .is_some_and(|t| now.saturating_duration_since(*t) >= WINDOW)
    {
        recent.pop_front();
    }
    if recent.len() < cap {
        return None;
    }
    recent.front().map(|t| *t + WINDOW)
}
