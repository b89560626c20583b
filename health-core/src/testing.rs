//! What the tests of every crate share (the `testing` feature; always in
//! this crate's own tests): the fixed clock.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The instant `secs` seconds after 2027-01-15T08:00:00Z: the tests'
/// clock, so that times and the RFC 3339 text of them are exact.
pub fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}
