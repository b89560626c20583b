//! What the API writers and the client's counting layer report as they go:
//! metrics in the agent and the controller, nothing in tests that do not
//! care.

use crate::status::types::{Claim, SourceEntry};

/// What the writer reports as it goes (metrics in the agent, nothing in
/// tests that don't care).
pub trait Observer: Send + Sync {
    /// One API request: its verb, resource and HTTP status (`None`: no
    /// response). Called by the client's counting layer
    /// (`crate::request_metrics`) for every request, never at call sites.
    fn api_request(&self, verb: &str, resource: &str, code: Option<u16>);
    /// An Event write the server accepted.
    fn event_written(&self, type_: &str, reason: &str);
    /// A write held back by the per-object cap.
    fn event_write_deferred(&self);
    /// A claim's `VolumeHealth` write ended: `Some`, this writer's entries
    /// as the server has them now; `None`, refused and not retried soon.
    /// Recovery Events may wait for it ([`crate::events::StatusFollower`]).
    fn volume_health_written(&self, _claim: &Claim, _entries: Option<&[SourceEntry]>) {}
}
