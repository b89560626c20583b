//! The Event flags of both command lines (`health-agent run`,
//! `health-controller`).

use std::time::Duration;

use super::{DEFAULT_UPDATE_INTERVAL, DEFAULT_WRITES_PER_MINUTE};

/// How Events are aggregated, the same for the node agent and the controller.
#[derive(Clone, Debug, clap::Args)]
pub struct EventArgs {
    /// Hard cap on Event writes per pod or PVC per rolling minute.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WRITES_PER_MINUTE)]
    pub event_writes_per_minute: u32,
    /// Seconds between two updates of one aggregated Event.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_UPDATE_INTERVAL.as_secs_f64())]
    pub event_update_interval: f64,
}

impl EventArgs {
    /// The cap and the update interval, checked.
    pub fn checked(&self) -> anyhow::Result<(u32, Duration)> {
        anyhow::ensure!(
            self.event_writes_per_minute > 0,
            "--event-writes-per-minute must be at least 1"
        );
        let update = Duration::try_from_secs_f64(self.event_update_interval).map_err(|_| {
            anyhow::anyhow!(
                "--event-update-interval must be a non-negative number of seconds, got {}",
                self.event_update_interval
            )
        })?;
        Ok((self.event_writes_per_minute, update))
    }
}
