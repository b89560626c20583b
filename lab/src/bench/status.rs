//! VolumeHealth writes under an error storm: what a burst of 10,000 block
//! I/O errors costs the API server, and how soon the PVC's `VolumeHealth`
//! says so.
//!
//! The setup of [`super::events`] (one pod, one PVC on the fault disk, the
//! agent in cluster mode with its defaults but a short quiet window and update
//! interval, the fake
//! API server recording every request with CLOCK_MONOTONIC). Each round
//! fails `errors` O_DIRECT writes as fast as they go, then waits for the
//! recovery (`status.health` Healthy, the label gone), and counts the
//! requests of the episode (up to the clearing status apply) and of the
//! recovery (from it to the end of the round) by verb and resource.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::apiserver::Recorded;
use health_tests::{Op, Rule};
use serde_json::Value;

use super::dio::DirectIo;
use super::events::OnePod;
use super::stats::Summary;
use super::{interrupt, Tools};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
const STATUS_PATH: &str =
    "/apis/volume-health.io/v1alpha1/namespaces/bench/volumehealths/data/status";
/// The agent's quiet window here: short rounds, one episode per storm. It
/// must outlast the update interval, or the episode clears before the
/// storm's count is written (the agent's defaults: 300 s and 10 s).
const QUIET_SECS: u64 = 5;
/// `--event-update-interval`, which also spaces the entry's count updates.
const UPDATE_SECS: u64 = 2;

pub struct Config {
    pub rounds: u32,
    pub errors: u64,
}

/// `verb resource` → requests.
type Counts = BTreeMap<String, usize>;

pub struct Round {
    injected: u64,
    /// The entry's count in the last status apply that asserted the condition.
    final_count: u64,
    storm_ms: f64,
    /// First failed request → first status apply of the episode.
    to_apply_ms: f64,
    episode: Counts,
    recovery: Counts,
}

pub struct StatusResult {
    rounds: Vec<Round>,
    to_apply: Summary,
    /// Rounds whose count equals the errors injected.
    exact: usize,
}

pub fn run(tools: &Tools, cfg: &Config) -> Result<StatusResult> {
    let (quiet, update) = (QUIET_SECS.to_string(), UPDATE_SECS.to_string());
    let fx = OnePod::start(
        tools,
        &[
            "--kernel-quiet-window",
            &quiet,
            "--event-update-interval",
            &update,
        ],
    )?;
    let io = DirectIo::open(fx.lo.path(), BLOCK as usize)?;
    let mut rounds = Vec::new();
    for round in 0..cfg.rounds {
        interrupt::check()?;
        let mark = fx.api.requests().len();
        let since = fx.disk.injections()?.last().map_or(0, |i| i.seq + 1);
        let rule = fx
            .disk
            .add_rule(Rule::new(Op::Write, libc::EIO).range(40 * MIB, 8 * MIB))?;
        let started = Instant::now();
        for i in 0..cfg.errors {
            match io.write_at(40 * MIB + (i % 2048) * BLOCK) {
                Err(e) if e.raw_os_error() == Some(libc::EIO) => {}
                other => bail!("round {round}, write {i}: expected EIO, got {other:?}"),
            }
        }
        let storm_ms = started.elapsed().as_secs_f64() * 1e3;
        fx.disk.remove_rule(rule)?;
        let injected = fx.disk.injections_since(since)?;
        let first = injected.first().context("no injection")?.mono_ns;
        // The recovery: Healthy, then the label removed, then a moment for
        // the recovery Events.
        fx.api
            .wait_for(Duration::from_secs(60 + QUIET_SECS), |api| {
                let healthy = api.volume_health("bench", "data")?["status"]["health"] == "Healthy";
                let unlabelled = api.pvc_labels("bench", "data")?.is_empty();
                (healthy && unlabelled).then_some(())
            })
            .with_context(|| format!("round {round}: the recovery"))?;
        std::thread::sleep(Duration::from_secs(1));
        let requests = fx.api.requests();
        let requests = &requests[mark..];
        let applies: Vec<&Recorded> = requests
            .iter()
            .filter(|r| r.method == "PATCH" && r.path == STATUS_PATH)
            .collect();
        let clear = applies
            .iter()
            .position(|r| count_in(r).is_none())
            .context("no clearing status apply")?;
        if clear == 0 {
            bail!("round {round}: the first status apply asserts nothing");
        }
        let final_count = count_in(applies[clear - 1]).unwrap_or(0);
        let split = requests
            .iter()
            .position(|r| std::ptr::eq(r, applies[clear]))
            .unwrap_or(requests.len());
        rounds.push(Round {
            injected: injected.len() as u64,
            final_count,
            storm_ms,
            to_apply_ms: (applies[0].at_mono_ns as f64 - first as f64) / 1e6,
            episode: counts(&requests[..split]),
            recovery: counts(&requests[split..]),
        });
    }
    fx.agent.stop_ok()?;
    // The figures must be real: a count above what was injected is a bug, and
    // the kernel's own loss (requests it never ran the program for, see
    // tests/src/program_runs.rs) stays far below 1%.
    for (i, r) in rounds.iter().enumerate() {
        if r.final_count > r.injected || r.final_count * 100 < r.injected * 99 {
            bail!(
                "round {}: the entry counts {} errors, {} were injected",
                i + 1,
                r.final_count,
                r.injected
            );
        }
    }
    let to_apply: Vec<f64> = rounds.iter().map(|r| r.to_apply_ms).collect();
    Ok(StatusResult {
        to_apply: Summary::of(&to_apply).context("no rounds")?,
        exact: rounds
            .iter()
            .filter(|r| r.final_count == r.injected)
            .count(),
        rounds,
    })
}

/// The count of the entry's one condition in a status apply, `None` when it
/// asserts none.
fn count_in(r: &Recorded) -> Option<u64> {
    let body: &Value = r.body.as_ref()?;
    let c = body["status"]["sources"][0]["conditions"]
        .as_array()?
        .first()?;
    Some(c["count"].as_u64().unwrap_or(0))
}

/// Writes and reads of VolumeHealths, PVCs and Events, by `verb resource`.
fn counts(requests: &[Recorded]) -> Counts {
    let mut out = Counts::new();
    for (_, resource, verb) in requests.iter().filter_map(Recorded::access) {
        if resource.starts_with("volumehealths")
            || resource == "persistentvolumeclaims"
            || resource == "events"
        {
            *out.entry(format!("{verb} {resource}")).or_default() += 1;
        }
    }
    out
}

fn show(c: &Counts) -> String {
    if c.is_empty() {
        return "none".into();
    }
    c.iter()
        .map(|(k, n)| format!("{n} {k}"))
        .collect::<Vec<_>>()
        .join(", ")
}

impl StatusResult {
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "{} rounds: a storm of failed O_DIRECT writes on a PVC's disk (as fast as they go), then the quiet window \
             ({QUIET_SECS} s) and the recovery. `--event-update-interval` {UPDATE_SECS} s (it also spaces the entry's count \
             updates); the agent's defaults otherwise (6 Event writes per object per minute). The entry's count equals the errors injected in {} of {} rounds \
             (the rest within 1%: requests the kernel never ran the program for).\n\n",
            self.rounds.len(),
            self.exact,
            self.rounds.len()
        );
        out.push_str("| round | errors injected | count in the entry | storm (ms) | failed request → status apply (ms) | episode: requests | recovery: requests |\n|---:|---:|---:|---:|---:|---|---|\n");
        for (i, r) in self.rounds.iter().enumerate() {
            out.push_str(&format!(
                "| {} | {} | {} | {:.0} | {:.1} | {} | {} |\n",
                i + 1,
                r.injected,
                r.final_count,
                r.storm_ms,
                r.to_apply_ms,
                show(&r.episode),
                show(&r.recovery)
            ));
        }
        let s = &self.to_apply;
        out.push_str(&format!(
            "\nFirst failed request → the VolumeHealth status apply arriving: p50 {:.1} ms, max {:.1} ms over {} rounds.\n",
            s.p50, s.max, s.n
        ));
        out
    }

    pub fn headline(&self) -> String {
        let r = &self.rounds[0];
        let applies = r
            .episode
            .get("patch volumehealths/status")
            .copied()
            .unwrap_or(0)
            + r.recovery
                .get("patch volumehealths/status")
                .copied()
                .unwrap_or(0);
        format!(
            "status: {} errors -> {applies} status applies, count {} (injected {}); failed request -> status apply p50 {:.1} ms",
            r.injected, r.final_count, r.injected, self.to_apply.p50
        )
    }
}
