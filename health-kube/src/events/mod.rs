//! The event recorder: volume condition changes in, core/v1 Event writes out.
//! `series` aggregates the changes, `next_write` picks what to send and when
//! (within the per-object `budget`), `message` words it. Uses `volumes` only.
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
//! call takes `now`), so its rules are tested without a server; [`crate::writer`]
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
//! - Where the writer also keeps the claims' `VolumeHealth` (the controller),
//!   a recovery on a PVC waits until the object no longer asserts the
//!   condition (`held_recoveries`): whoever reads the `...Cleared` Event finds the
//!   object and the label already saying so.
//!
//! Why not kube-runtime's `events::Recorder` (kube 5.0): it is a best-effort
//! helper that cannot carry what these Events say, so adopting it would mean
//! rebuilding most of this on top of it anyway:
//! - a repeat patches its cached copy with `series.count + 1`: the message
//!   of the first write stays (ours changes with every update: "N block I/O
//!   errors ... (and M reported before the agent restarted)") and the count
//!   is the number of `publish` calls, where ours is the condition's
//!   occurrences, the largest of a claim's pod volumes;
//! - it writes `events.k8s.io/v1` only, without the core/v1 `count`,
//!   `firstTimestamp`/`lastTimestamp`, `source` and labels `kubectl describe`
//!   and this module's own lookups (the node label, `reportingComponent`)
//!   use;
//! - it has no episodes (a repeat within its 6-minute cache window after a
//!   recovery would patch the closed Warning), no per-object budget or
//!   update interval, no hold for the claim's `VolumeHealth`;
//! - its cache is private, starts empty and keys on the reporting instance,
//!   so a restarted agent or a controller replica that takes the lead
//!   cannot continue the Events already written ([`adopt`], [`LocalCopy`]);
//! - a patch answered 404 (the Event expired) is returned as an error and
//!   the stale entry is patched again until the cache forgets it, where the
//!   writer here creates a new Event and drops it from the node's copy;
//! - it reads the clock itself and hides the request and its answer, which
//!   the node's copy and the metrics are made from.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use health_core::conditions::Status;
use tokio::time::Instant;

mod adopt;
mod args;
mod budget;
mod held_recoveries;
mod local_copy;
mod message;
mod next_write;
mod series;
mod shared;

pub use adopt::{Adopted, Unclaimed};
pub use args::EventArgs;
pub use held_recoveries::StatusFollower;
pub use local_copy::{LocalCopy, LocalCopyError};
pub use next_write::{Next, Outcome, Write};
use series::Series;
pub use shared::Shared;

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

/// What contributes to a series: a node's pod volume, or a contributor
/// named by the caller of [`Recorder::observe_on`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum ContributorKey {
    Volume(health_core::volume::VolumeKey),
    Named(String),
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
    /// An open Event continued after a restart that no pod volume asserts
    /// again is cleared this long after its last report: the kernel quiet
    /// window (`--kernel-quiet-window`).
    pub unclaimed_clear_after: Duration,
    /// Continue Events of any `reportingInstance` of `component` after a
    /// start, not only this `host`'s: the controller's replicas hand Events
    /// over to each other through leadership, while a node agent continues
    /// only its own node's.
    pub adopt_any_instance: bool,
}

/// Default of [`RecorderConfig::writes_per_object_per_minute`] (and of
/// `--event-writes-per-minute`).
pub const DEFAULT_WRITES_PER_MINUTE: u32 = 6;
/// Default of [`RecorderConfig::min_update_interval`] (and of
/// `--event-update-interval`).
pub const DEFAULT_UPDATE_INTERVAL: Duration = Duration::from_secs(10);

impl RecorderConfig {
    pub fn new(host: &str) -> Self {
        RecorderConfig {
            writes_per_object_per_minute: DEFAULT_WRITES_PER_MINUTE,
            min_update_interval: DEFAULT_UPDATE_INTERVAL,
            component: COMPONENT.to_string(),
            host: host.to_string(),
            max_series: 10_000,
            unclaimed_clear_after: Duration::from_secs(300),
            adopt_any_instance: false,
        }
    }
}

/// `source.component` of every Event the agent writes.
pub const COMPONENT: &str = "volume-health-agent";
/// The API server's own limit on an Event message is generous; `kubectl
/// describe` is not. Longer messages are cut at a character boundary.
pub const MAX_MESSAGE_BYTES: usize = 1024;
/// A recovery Event idle this long is let go: the API server expires Events
/// after an hour by default, and keeping every pod's last recovery would
/// grow with pod churn. A later recovery starts a new Event.
pub const NORMAL_IDLE: Duration = Duration::from_secs(3600);

/// Identifies a series for the lifetime of the recorder.
pub type SeriesId = u64;

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
    /// How long a recovery on a PVC waits at most for the claim's
    /// `VolumeHealth` (`None`: it does not wait; see `held_recoveries`).
    status_hold: Option<Duration>,
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
            status_hold: None,
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
}
