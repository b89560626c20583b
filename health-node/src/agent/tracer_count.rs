//! The agent loop's use of the tracer witness ([`health_kernel::tracer_count`]):
//! started after the programs, checked at every reconcile tick, and read
//! a last time before the programs detach.

use std::path::Path;

use health_common::source;
use health_kernel::collector::{Collector, KernelStats};
use health_kernel::probes::Attached;
use health_kernel::tracefs::Tracefs;
use health_kernel::tracer_count::{self, Lifetime, TracerCount, TracerCountError};

/// Starts the witness, kept with the pinned state when there is one; says
/// in one line what it does or why there is none.
pub(super) fn start(
    sys_root: &Path,
    attached: &Attached,
    collector: &mut Collector,
) -> Option<TracerCount> {
    let counted = match collector.counted(source::BLOCK_RQ_ERROR) {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!("no tracer witness: {e}");
            return None;
        }
    };
    let tracefs = match Tracefs::locate(sys_root) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!("no tracer witness ({e}): {UNNOTICED}");
            return None;
        }
    };
    for &id in attached.replaced_pins() {
        match tracer_count::remove_pinned(tracefs.root(), id) {
            Ok(true) => tracing::info!("removed the tracer witness of the replaced pinned state"),
            Ok(false) => {}
            Err(e) => tracing::warn!("removing the replaced pinned state's tracer witness: {e}"),
        }
    }
    let lifetime = lifetime(attached, collector).unwrap_or_else(|e| {
        // Still a witness, only not one that outlives this process.
        tracing::warn!("the tracer witness will not outlive this agent ({e:#})");
        Lifetime::Process
    });
    match TracerCount::start(tracefs.root(), counted, lifetime) {
        Ok(w) => {
            if w.made() && lifetime != Lifetime::Process {
                if let Err(e) = collector.set_witness_base(counted) {
                    // The next process then takes 0: its figure falls short.
                    tracing::warn!("keeping the tracer witness's base: {e}");
                }
            }
            let how = match (lifetime, w.made()) {
                (Lifetime::Process, _) => "",
                (_, true) => " (kept with the pinned state)",
                (_, false) => " (adopted with the pinned state)",
            };
            tracing::info!(
                "tracer witness: {}{how} counts the failed requests the kernel traces at block_rq_error",
                w.dir().display()
            );
            Some(w)
        }
        // Kernels without it (5.10 among them) count failed requests at
        // block_rq_complete, which the tracer could only watch at a cost on
        // every healthy request.
        Err(TracerCountError::NoEvent) => {
            tracing::info!("no tracer witness: this kernel has no block:block_rq_error tracepoint");
            None
        }
        Err(e) => {
            tracing::warn!("no tracer witness ({e}): {UNNOTICED}");
            None
        }
    }
}

const UNNOTICED: &str = "failed requests the kernel runs no program for would go unnoticed";

/// The pinned state's lifetime (its `STATS` map's id and the kept base),
/// or the process's without pins.
fn lifetime(attached: &Attached, collector: &Collector) -> anyhow::Result<Lifetime> {
    use anyhow::Context as _;
    let Some(id) = attached.pinned_stats_id() else {
        return Ok(Lifetime::Process);
    };
    let map_id = id.context("the pinned STATS map's id")?;
    let base = collector.witness_base()?;
    Ok(Lifetime::Pins { map_id, base })
}

/// The witness's count, read before the programs' (see
/// [`health_kernel::tracer_count::Uncounted`]); a witness that cannot be read
/// any more is dropped with a warning.
pub(super) fn read(witness: &mut Option<TracerCount>) -> Option<u64> {
    let w = witness.as_ref()?;
    match w.traced() {
        Ok(n) => Some(n),
        Err(e) => {
            tracing::warn!("reading the tracer witness failed, dropping it: {e}");
            *witness = None;
            None
        }
    }
}

/// Compares `traced` (from [`read`]) with what the programs counted,
/// warns when failed requests went uncounted, and puts the figures into
/// `stats`.
pub(super) fn check(
    witness: &mut Option<TracerCount>,
    traced: Option<u64>,
    collector: &Collector,
    stats: &mut KernelStats,
) -> anyhow::Result<()> {
    let (Some(w), Some(traced)) = (witness.as_mut(), traced) else {
        return Ok(());
    };
    let counted = collector.counted(source::BLOCK_RQ_ERROR)?;
    let grew = w.observe(traced, counted);
    let figures = w.figures();
    if grew > 0 {
        tracing::warn!(
            uncounted = grew,
            total = figures.uncounted,
            "the kernel traced failed block requests that it ran none of the agent's programs for; they are not in the counts"
        );
    }
    stats.traced = Some(figures.traced);
    stats.uncounted = figures.uncounted;
    Ok(())
}
