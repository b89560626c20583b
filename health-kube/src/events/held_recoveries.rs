//! Recoveries that wait for the claim's `VolumeHealth`. A writer that also
//! keeps the claims' objects (the controller) asks for it with
//! [`Recorder::hold_recoveries`]: a `<Reason>Cleared` Event on a PVC then
//! goes out only once this writer's entries on the claim, as the server has
//! them, no longer assert the condition (and the label has followed: the
//! status writer reports after both). Whoever sees the recovery Event finds
//! the object and the label telling the same. Warnings do not wait: the
//! alarm goes first, the object a write later.
//!
//! The status writer's results come in through its
//! [`crate::observer::Observer`]; [`StatusFollower`] hands them to the
//! recorder of the current leadership. A status writer that keeps failing
//! holds a recovery for at most the time given, then the Event goes anyway
//! and the log says why.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::Shared;
use super::{ObjectKind, ObjectRef, Recorder, SeriesId};
use crate::status::types::{Claim, SourceEntry};

/// A recovery waiting for its claim's `VolumeHealth`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Awaiting {
    /// When the writer first found it due (`None`: not looked at yet).
    pub(super) since: Option<Instant>,
}

impl Recorder {
    /// From now on a recovery on a PVC waits, at most `max`, until this
    /// writer's `VolumeHealth` entries on the claim no longer assert the
    /// condition ([`Recorder::volume_health_written`]).
    pub fn hold_recoveries(&mut self, max: Duration) {
        self.status_hold = Some(max);
    }

    /// This writer's entries on `claim` as the server has them now (`None`:
    /// its writes there are refused): the recoveries on the claim whose
    /// condition they do not assert may go out. Returns whether any may.
    pub fn volume_health_written(
        &mut self,
        claim: &Claim,
        entries: Option<&[SourceEntry]>,
    ) -> bool {
        let mut released = false;
        for s in self.series.values_mut() {
            if s.awaiting_status.is_none() || !is_claim(&s.object, claim) {
                continue;
            }
            let (status, reason) = &s.condition;
            let still_asserted = entries.is_some_and(|entries| {
                entries
                    .iter()
                    .flat_map(|e| &e.conditions)
                    .any(|c| c.status == *status && &c.reason == reason)
            });
            if !still_asserted {
                s.awaiting_status = None;
                released = true;
            }
        }
        released
    }

    /// Whether some recovery waits for a `VolumeHealth` write.
    pub fn has_waiting_recoveries(&self) -> bool {
        self.series.values().any(|s| s.awaiting_status.is_some())
    }

    /// The first waiting recovery of each object (it and the object's later
    /// series are not written before it may go), and when the earliest
    /// wait ends. Starts the clock of recoveries seen for the first time;
    /// lets go of those that waited their time.
    pub(super) fn waiting_for_status(
        &mut self,
        now: Instant,
    ) -> (Vec<(ObjectRef, SeriesId)>, Option<Instant>) {
        let Some(max) = self.status_hold else {
            return (Vec::new(), None);
        };
        let mut waiting: Vec<(ObjectRef, SeriesId)> = Vec::new();
        let mut wake: Option<Instant> = None;
        for (id, s) in self.series.iter_mut() {
            let Some(awaiting) = &mut s.awaiting_status else {
                continue;
            };
            let ends = *awaiting.since.get_or_insert(now) + max;
            if ends <= now {
                tracing::warn!(
                    claim = %format!("{}/{}", s.object.namespace, s.object.name),
                    reason = %s.reason,
                    "the claim's VolumeHealth did not follow within {max:?} (its writes are failing); the recovery Event goes out before it"
                );
                s.awaiting_status = None;
                continue;
            }
            wake = Some(wake.map_or(ends, |w: Instant| w.min(ends)));
            if !waiting.iter().any(|(o, _)| *o == s.object) {
                waiting.push((s.object.clone(), *id));
            }
        }
        (waiting, wake)
    }
}

fn is_claim(o: &ObjectRef, claim: &Claim) -> bool {
    o.kind == ObjectKind::PersistentVolumeClaim
        && o.namespace == claim.namespace
        && o.name == claim.name
}

/// Hands the results of the `VolumeHealth` writes to the Event recorder of
/// the current leadership: the status writer reports through the process's
/// observer, which outlives each leadership's recorder.
#[derive(Debug, Default)]
pub struct StatusFollower {
    events: Mutex<Weak<Shared>>,
}

impl StatusFollower {
    /// From now on results go to `events` (a new leadership's recorder).
    pub fn follow(&self, events: &Arc<Shared>) {
        *self.lock() = Arc::downgrade(events);
    }

    /// One write's result (see [`crate::observer::Observer::volume_health_written`]).
    pub fn written(&self, claim: &Claim, entries: Option<&[SourceEntry]>) {
        let Some(events) = self.lock().upgrade() else {
            return;
        };
        let released = events.lock().volume_health_written(claim, entries);
        if released {
            events.wake();
        }
    }

    fn lock(&self) -> MutexGuard<'_, Weak<Shared>> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }
}
