//! Backend condition -> Event rounds: a volume turns abnormal in the
//! driver, the Warning on its claim is timed on the Event watch, the volume
//! turns healthy, the Normal is timed (overlapping rounds: see the parent
//! module's doc).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::cluster::{claim_name, handle, EventLog};
use super::procs::DriverProc;
use super::{Latency, Started, REASON};
use crate::bench::interrupt;
use crate::bench::stats::Summary;

/// Distinct random volumes, none used twice in the whole run (an object's
/// Events would otherwise aggregate with an earlier round's).
pub struct Picker {
    rng: fastrand::Rng,
    volumes: usize,
    used: BTreeSet<usize>,
}

impl Picker {
    pub fn new(volumes: usize) -> Self {
        Picker {
            rng: fastrand::Rng::new(),
            volumes,
            used: BTreeSet::new(),
        }
    }

    fn pick(&mut self) -> Result<usize> {
        anyhow::ensure!(self.used.len() < self.volumes, "more rounds than volumes");
        loop {
            let i = self.rng.usize(..self.volumes);
            if self.used.insert(i) {
                return Ok(i);
            }
        }
    }
}

/// One round's times.
struct Round {
    volume: usize,
    start: Instant,
    warned: Option<Instant>,
    /// When the volume is to turn healthy: a random point of the cycle, as
    /// for the fault (right after the Warning would always be just after a
    /// cycle, the worst case for the recovery).
    healthy_due: Option<Instant>,
    healthy_at: Option<Instant>,
    cleared: Option<Instant>,
}

/// `count` rounds, overlapping (see the module doc).
pub async fn rounds(
    ctl: &mut Started<'_>,
    driver: &mut DriverProc,
    events: &EventLog,
    picker: &mut Picker,
    count: u32,
    interval: f64,
) -> Result<Latency> {
    let mark = ctl.audit.mark()?;
    let mut pending: Vec<Round> = Vec::new();
    let mut next_start = Instant::now();
    // A step not seen through within this is a failure, not a figure. A
    // recovery takes up to two cycles: a CSI 1.13 list omits healthy
    // volumes, and a volume absent from the list clears on its second
    // absence.
    let limit = Duration::from_secs_f64(3.0 * interval + 30.0);
    let random_point = |rng: &mut fastrand::Rng, of: f64| Duration::from_secs_f64(rng.f64() * of);
    let mut started = 0;
    loop {
        interrupt::check()?;
        ctl.proc.check_running()?;
        if started < count && Instant::now() >= next_start {
            let volume = picker.pick()?;
            let start = Instant::now();
            driver
                .command(&format!(
                    "health {} Degraded {REASON} bench round {started}: replica lost",
                    handle(volume)
                ))
                .await?;
            pending.push(Round {
                volume,
                start,
                warned: None,
                healthy_due: None,
                healthy_at: None,
                cleared: None,
            });
            started += 1;
            next_start = start + random_point(&mut picker.rng, interval / 2.0);
        }
        for round in pending.iter_mut() {
            let claim = claim_name(round.volume);
            if round.warned.is_none() {
                round.warned = events.seen(&claim, "Warning", REASON);
                round.healthy_due = round
                    .warned
                    .map(|w| w + random_point(&mut picker.rng, interval));
            }
            if round.healthy_at.is_none() && round.healthy_due.is_some_and(|d| Instant::now() >= d)
            {
                round.healthy_at = Some(Instant::now());
                driver
                    .command(&format!("healthy {}", handle(round.volume)))
                    .await?;
            }
            if round.healthy_at.is_some() && round.cleared.is_none() {
                round.cleared = events.seen(&claim, "Normal", &format!("{REASON}Cleared"));
            }
            let since = round.healthy_at.unwrap_or(round.start);
            if round.cleared.is_none() && since.elapsed() > limit {
                bail!(
                    "{} Event for claim {claim} not seen within {:.0} s ({} Events seen in all); the controller's log:\n{}",
                    if round.healthy_at.is_none() { "Warning" } else { "Normal" },
                    limit.as_secs_f64(),
                    events.count(),
                    ctl.proc.log_tail(30)
                );
            }
        }
        if started == count && pending.iter().all(|r| r.cleared.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let secs = |from: Instant, to: Option<Instant>| to.map(|t| (t - from).as_secs_f64());
    let warning: Vec<f64> = pending
        .iter()
        .filter_map(|r| secs(r.start, r.warned))
        .collect();
    let cleared: Vec<f64> = pending
        .iter()
        .filter_map(|r| secs(r.healthy_at?, r.cleared))
        .collect();
    // Writes finishing right after the last Event arrived are still
    // counted: the audit entry follows the response.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(Latency {
        interval,
        warning: Summary::of(&warning).context("no rounds")?,
        cleared: Summary::of(&cleared).context("no rounds")?,
        audited: ctl.audit.since(mark)?,
    })
}
