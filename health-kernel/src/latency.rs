//! Reads' and writes' completion latencies per device over a window, from
//! the kernel's `LATENCY` map: cumulative counts per latency bucket
//! (`health_common::latency_bucket`), which the programs add to as each
//! followed bio completes. A window is the difference between two reads.

use std::collections::{BTreeMap, HashMap};

use aya::maps::MapError;
use health_common::{LatencyKey, LATENCY_BUCKETS, LATENCY_MAX};
use health_core::dev::Dev;

use crate::device_maps::{entries, KernelMapsRest};

/// The completions of one device and operation in a window, by bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLatency {
    pub dev: Dev,
    /// `health_common::op::READ` or `WRITE`.
    pub op: u8,
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl DeviceLatency {
    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// What the last read saw, so that the next one gives the window between.
#[derive(Debug, Default)]
pub struct LatencyWindows {
    last: HashMap<LatencyKey, u64>,
    primed: bool,
}

impl KernelMapsRest {
    /// The completions since the last call, per device and operation, for
    /// the devices with any; entries of devices `live` says are gone are
    /// removed from the map. The first call only takes the starting point
    /// (the map may hold counts from before this process: pinned).
    pub fn latency_window(
        &mut self,
        windows: &mut LatencyWindows,
        live: impl Fn(Dev) -> bool,
    ) -> Result<Vec<DeviceLatency>, MapError> {
        let entries = entries(&self.latency, LATENCY_MAX)?;
        let mut gone = Vec::new();
        let mut now = HashMap::with_capacity(entries.len());
        let mut out: BTreeMap<(Dev, u8), [u64; LATENCY_BUCKETS]> = BTreeMap::new();
        for (key, count) in entries {
            let dev = Dev::from_kernel(key.dev);
            if !live(dev) {
                gone.push(key);
                continue;
            }
            now.insert(key, count);
            let before = windows.last.get(&key).copied().unwrap_or(0);
            let bucket = usize::from(key.bucket).min(LATENCY_BUCKETS - 1);
            let added = count.saturating_sub(before);
            if windows.primed && added > 0 {
                out.entry((dev, key.op as u8))
                    .or_insert([0; LATENCY_BUCKETS])[bucket] += added;
            }
        }
        for key in gone {
            // Removed by a later read if this fails: the map stays bounded.
            let _ = self.latency.remove(&key);
        }
        windows.last = now;
        windows.primed = true;
        Ok(out
            .into_iter()
            .map(|((dev, op), buckets)| DeviceLatency { dev, op, buckets })
            .collect())
    }
}
