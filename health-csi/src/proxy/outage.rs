//! Logging of a peer that keeps failing, without a line per failure: the
//! kubelet asks per volume and retries, so an agent or driver that is down
//! would otherwise fill the log. The first failure is a warning, then at
//! most one summary per [`REPEAT_EVERY`], and the recovery one info line.

use std::fmt::Display;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const REPEAT_EVERY: Duration = Duration::from_secs(60);

pub(super) struct Outage {
    peer: &'static str,
    state: Mutex<Option<Down>>,
}

struct Down {
    since: Instant,
    failures: u64,
    logged_at: Instant,
}

impl Outage {
    pub(super) fn new(peer: &'static str) -> Self {
        Outage {
            peer,
            state: Mutex::new(None),
        }
    }

    /// One more failure; `consequence` says what the kubelet gets instead.
    pub(super) fn failed(&self, error: &dyn Display, consequence: &str) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        match state.as_mut() {
            None => {
                tracing::warn!(peer = self.peer, error = %error, "{} failed: {consequence}", self.peer);
                *state = Some(Down {
                    since: now,
                    failures: 1,
                    logged_at: now,
                });
            }
            Some(down) => {
                down.failures += 1;
                if now.duration_since(down.logged_at) >= REPEAT_EVERY {
                    tracing::warn!(
                        peer = self.peer,
                        failures = down.failures,
                        down_for = ?now.duration_since(down.since),
                        error = %error,
                        "{} still failing: {consequence}",
                        self.peer
                    );
                    down.logged_at = now;
                }
            }
        }
    }

    /// A success: ends the outage, if there was one.
    pub(super) fn ok(&self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(down) = state.take() {
            tracing::info!(
                peer = self.peer,
                failures = down.failures,
                down_for = ?down.since.elapsed(),
                "{} answers again",
                self.peer
            );
        }
    }
}
