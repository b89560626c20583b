//! The one retry backoff of the API writers (Events, `VolumeHealth`):
//! 500 ms, doubling up to 30 s, back to the start after a success. Built on
//! backon's exponential backoff (what kube-rs's own watchers use).

use std::time::Duration;

use backon::{BackoffBuilder as _, ExponentialBackoff, ExponentialBuilder};

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
    fn doubles_up_to_the_cap_and_restarts_after_a_success() {
        let mut b = Backoff::default();
        let ms: Vec<u128> = (0..9).map(|_| b.failed().as_millis()).collect();
        assert_eq!(
            ms,
            [500, 1000, 2000, 4000, 8000, 16000, 30000, 30000, 30000]
        );
        b.succeeded();
        assert_eq!(b.failed(), MIN);
    }
}
