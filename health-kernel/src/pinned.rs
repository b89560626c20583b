//! The counters a running (or stopped, pinned) agent holds, read without
//! taking anything from it: `health-agent volumes` shows them. Only the
//! counter and time maps are opened, never the sample ring buffer, whose
//! reader is the agent.

use std::path::Path;

use aya::maps::{Map, MapData, PerCpuHashMap};
use health_common::{CounterKey, ErrorTimes, DISK_NAME_LEN};

use crate::probes::pins;

/// One counter key: errors counted so far, first and last (CLOCK_MONOTONIC
/// ns; 0 where the time map had no room).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PinnedCount {
    pub key: CounterKey,
    pub count: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}

/// What `volumes` can say about kernel errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KernelEvidence {
    Pinned(Vec<PinnedCount>),
    /// Why there is none: one line for the user.
    Unavailable(String),
}

/// Reads the counters pinned under `root`.
pub fn read(root: &Path) -> KernelEvidence {
    let layout = match pins::committed_layout(root) {
        Ok(Some(dir)) => dir,
        Ok(None) => {
            return KernelEvidence::Unavailable(format!(
                "no agent state pinned at {}: kernel errors are not shown (no agent ran here, it ran with --no-pin, or it was uninstalled)",
                root.display()
            ))
        }
        Err(e) => {
            return KernelEvidence::Unavailable(format!("kernel errors are not shown: {e}"))
        }
    };
    match read_layout(&layout) {
        Ok(counts) => KernelEvidence::Pinned(counts),
        Err(e) => KernelEvidence::Unavailable(format!(
            "kernel errors are not shown: reading {}: {e}",
            layout.display()
        )),
    }
}

fn open<V: aya::Pod>(
    layout: &Path,
    name: &str,
) -> Result<PerCpuHashMap<MapData, CounterKey, V>, aya::maps::MapError> {
    let data = MapData::from_pin(pins::map_path(layout, name))?;
    PerCpuHashMap::try_from(Map::from_map_data(data)?)
}

fn read_layout(layout: &Path) -> Result<Vec<PinnedCount>, aya::maps::MapError> {
    let counts = open::<u64>(layout, "COUNTS")?;
    let times = open::<ErrorTimes>(layout, "TIMES")?;
    let mut out = Vec::new();
    for entry in counts.iter() {
        let (key, per_cpu) = entry?;
        let count: u64 = per_cpu.iter().sum();
        if count == 0 {
            continue;
        }
        let (mut first_ns, mut last_ns) = (0u64, 0u64);
        if let Ok(t) = times.get(&key, 0) {
            for t in t.iter().filter(|t| t.first_ns != 0) {
                first_ns = if first_ns == 0 {
                    t.first_ns
                } else {
                    first_ns.min(t.first_ns)
                };
                last_ns = last_ns.max(t.last_ns);
            }
        }
        out.push(PinnedCount {
            key,
            count,
            first_ns,
            last_ns,
        });
    }
    out.sort_by_key(|c| c.key);
    Ok(out)
}

/// The disks' names the programs recorded with the numbers of failed
/// requests (`DISK_NAMES`), pinned under `root`; empty when there are none
/// or they cannot be read (said at debug level: only hidden disks need them).
pub fn disk_names(root: &Path) -> Vec<(u32, String)> {
    let read = || -> Result<Vec<(u32, String)>, String> {
        let layout = pins::committed_layout(root)
            .map_err(|e| e.to_string())?
            .ok_or("nothing pinned")?;
        let data =
            MapData::from_pin(pins::map_path(&layout, "DISK_NAMES")).map_err(|e| e.to_string())?;
        let map: aya::maps::HashMap<MapData, u32, [u8; DISK_NAME_LEN]> =
            aya::maps::HashMap::try_from(Map::from_map_data(data).map_err(|e| e.to_string())?)
                .map_err(|e| e.to_string())?;
        Ok(map
            .iter()
            .filter_map(Result::ok)
            .filter_map(|(dev, raw)| Some((dev, crate::device_maps::disk_name_text(&raw)?)))
            .collect())
    };
    read().unwrap_or_else(|e| {
        tracing::debug!(root = %root.display(), "no pinned disk names: {e}");
        Vec::new()
    })
}
