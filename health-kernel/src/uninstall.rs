//! Removing what agents pinned on a node: the programs, links and maps
//! ([`pins::uninstall`]) and the tracer witness kept with them
//! ([`tracer_count`]). `health-agent uninstall` runs it by hand; an agent
//! whose DaemonSet was removed runs it as it stops.

use std::path::Path;

use crate::probes::pins::{self, PinError, Removed};
use crate::tracefs::{Tracefs, TracefsError};
use crate::tracer_count::{self, TracerCountError};

/// What an uninstall removed.
#[derive(Debug)]
pub struct Uninstalled {
    /// The pins; `None` when nothing was pinned.
    pub removed: Option<Removed>,
    /// Whether a tracer witness was kept with them and removed, or why it
    /// may remain (the next agent removes a stale one).
    pub witness: Result<bool, WitnessError>,
}

#[derive(Debug, thiserror::Error)]
pub enum WitnessError {
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error(transparent)]
    Remove(#[from] TracerCountError),
}

/// Removes every pin under `root`, then the tracer witness kept with them
/// (named for their `STATS` map; tracefs is found under `sys_root`).
pub fn uninstall(root: &Path, sys_root: &Path) -> Result<Uninstalled, PinError> {
    // Not finding the map is not an error of its own: `pins::uninstall`
    // reports what is wrong with the pin directory.
    let stats_id = pins::committed_layout(root)
        .ok()
        .flatten()
        .and_then(|layout| pins::stats_map_id(&layout).ok());
    let removed = pins::uninstall(root)?;
    let witness = match stats_id {
        None => Ok(false),
        Some(id) => Tracefs::locate(sys_root)
            .map_err(WitnessError::from)
            .and_then(|t| Ok(tracer_count::remove_pinned(t.root(), id)?)),
    };
    Ok(Uninstalled { removed, witness })
}
