//! What one writer (a node's agent, the controller) should have written on
//! each claim's `VolumeHealth`, what it last wrote, and when the next write
//! is due. Write on change only: a new or cleared `(status, reason)` goes
//! out at once, a new count or message at most every update interval, an
//! unchanged assertion never. The lock is held for bookkeeping only.
//!
//! After a restart the writer's entries are taken over from the listed
//! objects ([`WritePlan::adopt`]): a claim is left as it is until the writer
//! speaks of it, a condition it asserts again continues its episode, and
//! the start-up grace keeps only what the new process has not asserted
//! yet: once it has asserted a condition, it acts on its own evidence.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::types::{parse_time, Claim, EntryCondition, SourceEntry, VolumeHealth};
use crate::backoff::Backoff;

/// After a refusal no retry would change (RBAC, schema): try again this
/// much later, the error logged once per claim.
const REFUSED_RETRY: Duration = Duration::from_secs(300);
/// How long a condition taken over from before a restart is kept while the
/// new process has not asserted it, unless it is a kernel condition (kept
/// until the quiet window after it was last seen): long enough for the
/// checks and the CSI probes to have run once. A condition the new process
/// asserted once is its own from then on, and goes as soon as it stops
/// asserting it.
pub const STARTUP_GRACE: Duration = Duration::from_secs(60);

type Key = (String, String);

#[derive(Debug)]
struct ClaimState {
    claim: Claim,
    /// The entries as they should be, `None` when no pod here uses the claim.
    desired: Option<Vec<SourceEntry>>,
    /// Whether the caller said anything about the claim (set or released)
    /// since this process started: a claim only listed is left as it is.
    stated: bool,
    /// As the server has them from this writer (listed at start, or written).
    written: Vec<SourceEntry>,
    /// Conditions taken over from before a restart.
    carried: Vec<Carried>,
    last_write: Option<Instant>,
    retry_at: Option<Instant>,
    backoff: Backoff,
    /// When a change of `(status, reason)` not yet written was first seen.
    major_since: Option<Instant>,
}

/// A condition taken over from before a restart.
#[derive(Debug)]
struct Carried {
    /// The entry that asserted it.
    entry: String,
    condition: EntryCondition,
    /// Kept until then while the new process has not asserted it.
    until: SystemTime,
    /// The new process asserted it: it is the new process's evidence from
    /// then on, no longer the earlier one's.
    reasserted: bool,
}

impl Carried {
    fn asserted_in(&self, desired: &Option<Vec<SourceEntry>>) -> bool {
        asserted(desired, &self.entry, &self.condition)
    }
}

pub enum Next {
    Write(Claim, Vec<SourceEntry>),
    /// Nothing due before this (`None`: until told).
    Idle(Option<Instant>),
}

/// Why a write ended.
pub enum Done {
    Written,
    /// Worth retrying soon.
    Failed,
    /// Refused; retried much later.
    Refused,
}

#[derive(Debug)]
pub struct WritePlan {
    states: BTreeMap<Key, ClaimState>,
    update_interval: Duration,
    /// Kernel conditions carried across a restart stay this long after
    /// they were last seen.
    quiet_window: Duration,
    /// Until the writer's view of pods is complete, an entry of a claim it
    /// does not know yet is not removed.
    ready: bool,
    /// How long a new or cleared condition waits before it is written.
    settle: Duration,
}

impl WritePlan {
    pub fn new(update_interval: Duration, quiet_window: Duration) -> Self {
        WritePlan {
            states: BTreeMap::new(),
            update_interval,
            quiet_window,
            ready: false,
            settle: Duration::ZERO,
        }
    }

    /// New and cleared conditions wait `settle` after they are first seen
    /// (none by default). The node agent writes the Events of the same
    /// change at once, on the same connections and CPUs: a short wait keeps
    /// the status's read and apply from delaying the Warnings people see
    /// first, and gathers a burst of changes into one write. Seen first,
    /// not last: a stream of changes never postpones the write further.
    pub fn with_settle(mut self, settle: Duration) -> Self {
        self.settle = settle;
        self
    }

    /// The caller's view of which claims it uses is complete.
    pub fn set_ready(&mut self) {
        self.ready = true;
    }

    fn state(&mut self, claim: &Claim) -> &mut ClaimState {
        let key = (claim.namespace.clone(), claim.name.clone());
        let s = self.states.entry(key).or_insert_with(|| ClaimState {
            claim: claim.clone(),
            desired: None,
            stated: false,
            written: Vec::new(),
            carried: Vec::new(),
            last_write: None,
            retry_at: None,
            backoff: Backoff::default(),
            major_since: None,
        });
        s.claim = claim.clone();
        s
    }

    /// What this writer asserts on `claim` now (entries sorted by name).
    pub fn set(&mut self, claim: &Claim, mut entries: Vec<SourceEntry>) {
        entries.sort_by(|a, b| a.name.cmp(&b.name));
        let s = self.state(claim);
        s.desired = Some(entries);
        s.stated = true;
        // Marked here rather than when the next write is chosen: a condition
        // asserted and cleared again between two writes was still seen.
        for c in &mut s.carried {
            c.reasserted |= c.asserted_in(&s.desired);
        }
    }

    /// No pod here uses `claim` any more: its entries go (not a recovery).
    pub fn release(&mut self, namespace: &str, name: &str) {
        if let Some(s) = self
            .states
            .get_mut(&(namespace.to_string(), name.to_string()))
        {
            s.desired = None;
            s.stated = true;
            s.carried.clear();
        }
    }

    /// Releases every claim but `used` (the complete list of claims in use).
    pub fn release_others(&mut self, used: &[Claim]) {
        // A set: the controller passes every claim of the cluster, and a
        // scan of `used` per state was 10^10 comparisons at 100,000 PVs
        // (docs/benchmarks.md, "Scale").
        let used: std::collections::HashSet<(&str, &str)> = used
            .iter()
            .map(|c| (c.namespace.as_str(), c.name.as_str()))
            .collect();
        let others: Vec<Key> = self
            .states
            .keys()
            .filter(|k| !used.contains(&(k.0.as_str(), k.1.as_str())))
            .cloned()
            .collect();
        for (ns, name) in others {
            self.release(&ns, &name);
        }
    }

    /// Takes over this writer's entries from before a restart. Nothing is
    /// written for a claim taken over until the caller says what it asserts
    /// there ([`WritePlan::set`]) or that it no longer uses it
    /// ([`WritePlan::release`], [`WritePlan::release_others`]): until then the
    /// object stays as the earlier process left it.
    pub fn adopt(
        &mut self,
        objects: &[VolumeHealth],
        owned: &[String],
        started: SystemTime,
    ) -> usize {
        let mut adopted = 0;
        for o in objects {
            let Some(status) = &o.status else { continue };
            let mine: Vec<SourceEntry> = status
                .sources
                .iter()
                .filter(|e| owned.contains(&e.name))
                .cloned()
                .collect();
            if mine.is_empty() {
                continue;
            }
            let claim = Claim {
                namespace: o.metadata.namespace.clone().unwrap_or_default(),
                name: o.spec.persistent_volume_claim_name.clone(),
                uid: o
                    .metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|r| r.kind == "PersistentVolumeClaim")
                    .map(|r| r.uid.clone())
                    .unwrap_or_default(),
                pv: o.spec.persistent_volume_name.clone(),
            };
            let quiet = self.quiet_window;
            let s = self.state(&claim);
            let carried: Vec<Carried> = mine
                .iter()
                .flat_map(|e| {
                    e.conditions
                        .iter()
                        .map(move |c| (e.name.clone(), c.clone()))
                })
                .map(|(entry, condition)| {
                    let until = if condition.origin == "kernel" {
                        let seen = condition.last_seen.as_deref().unwrap_or(&condition.since);
                        parse_time(seen).unwrap_or(started) + quiet
                    } else {
                        started + STARTUP_GRACE
                    };
                    Carried {
                        // The caller may have spoken before the list came back.
                        reasserted: asserted(&s.desired, &entry, &condition),
                        entry,
                        condition,
                        until,
                    }
                })
                .collect();
            s.carried = carried;
            s.written = mine;
            adopted += 1;
        }
        adopted
    }

    /// The next write due, or when to look again.
    pub fn next(&mut self, now: Instant, wall: SystemTime) -> Next {
        let mut wake: Option<Instant> = None;
        let mut soonest = |at: Instant| wake = Some(wake.map_or(at, |w: Instant| w.min(at)));
        for s in self.states.values_mut() {
            if !s.stated || (s.desired.is_none() && !self.ready) {
                continue;
            }
            // A condition the new process asserts keeps what it carries (the
            // episode's count and start) for as long as it does; one it
            // asserted and no longer does is over, whatever the grace says.
            let desired = &s.desired;
            s.carried
                .retain(|c| c.asserted_in(desired) || (!c.reasserted && c.until > wall));
            let effective = effective(s);
            if effective.len() == s.written.len()
                && effective
                    .iter()
                    .zip(&s.written)
                    .all(|(a, b)| a.same_assertions(b))
            {
                s.major_since = None;
                let waiting = s.carried.iter().filter(|c| !c.reasserted);
                if let Some(until) = waiting.map(|c| c.until).filter(|u| *u > wall).min() {
                    let left = until.duration_since(wall).unwrap_or_default();
                    soonest(now + left);
                }
                continue;
            }
            let major = effective.len() != s.written.len()
                || effective
                    .iter()
                    .zip(&s.written)
                    .any(|(a, b)| a.name != b.name || a.keys() != b.keys());
            let mut due = if major {
                *s.major_since.get_or_insert(now) + self.settle
            } else {
                s.last_write.map_or(now, |t| t + self.update_interval)
            };
            if let Some(r) = s.retry_at {
                due = due.max(r);
            }
            if due <= now {
                return Next::Write(s.claim.clone(), effective);
            }
            soonest(due);
        }
        Next::Idle(wake)
    }

    /// Records how a write from [`WritePlan::next`] ended.
    pub fn finish(&mut self, claim: &Claim, entries: Vec<SourceEntry>, done: Done, now: Instant) {
        let key = (claim.namespace.clone(), claim.name.clone());
        let Some(s) = self.states.get_mut(&key) else {
            return;
        };
        match done {
            Done::Written => {
                s.written = entries;
                s.last_write = Some(now);
                s.retry_at = None;
                s.backoff.succeeded();
                s.major_since = None;
                if s.desired.is_none() && s.written.is_empty() {
                    self.states.remove(&key);
                }
            }
            Done::Failed => {
                s.retry_at = Some(now + s.backoff.failed());
            }
            Done::Refused => s.retry_at = Some(now + REFUSED_RETRY),
        }
    }

    /// The claims with state.
    pub fn claims(&self) -> Vec<Claim> {
        self.states.values().map(|s| s.claim.clone()).collect()
    }

    /// Claims with state (for metrics and tests).
    pub fn len(&self) -> usize {
        self.states.len()
    }

    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }
}

/// What should be on the server: the desired entries, with conditions
/// carried over from before a restart added, and an entry that asserted
/// something before kept with no conditions (the volume had a condition
/// here and is healthy now) until no pod here uses the claim.
fn effective(s: &ClaimState) -> Vec<SourceEntry> {
    let Some(desired) = &s.desired else {
        return Vec::new();
    };
    let mut out = desired.clone();
    for w in &s.written {
        if !out.iter().any(|e| e.name == w.name) {
            let mut kept = w.clone();
            kept.conditions.clear();
            out.push(kept);
        }
    }
    for Carried {
        entry: name,
        condition: c,
        ..
    } in &s.carried
    {
        let Some(e) = out.iter_mut().find(|e| &e.name == name) else {
            continue;
        };
        match e
            .conditions
            .iter_mut()
            .find(|d| d.status == c.status && d.reason == c.reason)
        {
            Some(d) => continue_episode(d, c),
            None => e.conditions.push(c.clone()),
        }
    }
    for e in &mut out {
        e.conditions
            .sort_by(|a, b| (a.status, &a.reason).cmp(&(b.status, &b.reason)));
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Whether `desired` has entry `name` asserting `c`'s status and reason.
fn asserted(desired: &Option<Vec<SourceEntry>>, name: &str, c: &EntryCondition) -> bool {
    desired.iter().flatten().any(|e| {
        e.name == name
            && e.conditions
                .iter()
                .any(|d| d.status == c.status && d.reason == c.reason)
    })
}

/// A condition taken over from before a restart that the new process
/// asserts again: one episode, as its Events are (`events::series`). It began
/// when the earlier one did, and its count goes on from what was written;
/// a condition raised before the earlier one was last seen (kernel counts
/// adopted from pinned maps) already includes those errors.
fn continue_episode(d: &mut EntryCondition, c: &EntryCondition) {
    let before = c.last_seen.as_deref().unwrap_or(&c.since);
    let raised_before = match (parse_time(&d.since), parse_time(before)) {
        (Some(new), Some(old)) => new < old,
        _ => false,
    };
    d.count = match (d.count, c.count) {
        (Some(new), Some(old)) if raised_before => Some(new.max(old)),
        // Counts come from the listed object: saturate, never overflow.
        (Some(new), Some(old)) => Some(new.saturating_add(old)),
        (new, old) => new.or(old),
    };
    if let (Some(old), Some(new)) = (parse_time(&c.since), parse_time(&d.since)) {
        if old < new {
            d.since = c.since.clone();
        }
    }
}

/// The board shared by the code that decides (the agent loop, the
/// controller's cycle) and the writer task.
pub struct SharedWritePlan {
    board: Mutex<WritePlan>,
    notify: Notify,
}

impl SharedWritePlan {
    pub fn new(board: WritePlan) -> std::sync::Arc<SharedWritePlan> {
        std::sync::Arc::new(SharedWritePlan {
            board: Mutex::new(board),
            notify: Notify::new(),
        })
    }

    pub fn lock(&self) -> MutexGuard<'_, WritePlan> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn wake(&self) {
        self.notify.notify_one();
    }

    pub async fn notified(&self) {
        self.notify.notified().await
    }
}
