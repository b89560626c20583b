//! The one retry backoff of the API writers (Events, `VolumeHealth`):
//! 500 ms, doubling up to 30 s, back to the start after a success, each
//! delay stretched by a random part of itself (up to twice as long): the
//! agents of a whole fleet lose the API server together, and without the
//! jitter they would come back together, in the same 500 ms. Built on
//! backon's exponential backoff (what kube-rs's own watchers use, with the
//! same jitter). And how long one of their requests may take before it
//! counts as failed.

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};

/// How long one request of the API writers (Events, `VolumeHealth`, the
/// controller's PVC status) may take before it counts as failed and the
/// writer backs off.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub const MIN: Duration = Duration::from_millis(500);
pub const MAX: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct Backoff {
    delays: ExponentialBackoff,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            delays: ExponentialBuilder::new()
                .with_min_delay(MIN)
                .with_max_delay(MAX)
                .with_jitter()
                .without_max_times()
                .build(),
        }
    }
}

impl Backoff {
    /// After a failed write: how long to wait before trying again.
    pub fn failed(&mut self) -> Duration {
        self.delays.next().unwrap_or(MAX)
    }

    /// After a success: the next failure waits the least again.
    pub fn succeeded(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_with_jitter_and_restarts_after_a_success() {
        let base = [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000];
        // Two agents failing together: each delay between its base and
        // twice that, and the two sequences apart.
        let mut a = Backoff::default();
        let mut b = Backoff::default();
        let ours: Vec<u128> = (0..9).map(|_| a.failed().as_millis()).collect();
        let theirs: Vec<u128> = (0..9).map(|_| b.failed().as_millis()).collect();
        for (delays, who) in [(&ours, "a"), (&theirs, "b")] {
            for (d, base) in delays.iter().zip(base) {
                assert!((base..2 * base).contains(d), "{who}: {delays:?}");
            }
        }
        assert_ne!(ours, theirs);
        a.succeeded();
        assert!((MIN..2 * MIN).contains(&a.failed()));
    }
}
