//! The per-object budget: at most `writes_per_object_per_minute` writes to
//! one involved object in any rolling minute.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::ObjectRef;

const WINDOW: Duration = Duration::from_secs(60);

/// `None` when `object` may be written at `now`, else when it may.
pub(super) fn budget_free_at(
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
