//! Reads' and writes' completion latencies per device over a window, from
//! the kernel's `LATENCY` map: cumulative counts per latency bucket
//! (`health_common::latency_bucket`) and the sum of their latencies, which
//! the programs add to as each followed bio completes. A window is the
//! difference between two reads.

use std::collections::{BTreeMap, HashMap};

use aya::maps::MapError;
use health_common::{LatencyCount, LatencyKey, LATENCY_BUCKETS, LATENCY_MAX};
use health_core::dev::Dev;

use crate::device_maps::{entries, KernelMapsRest};

/// The completions of one device and operation in a window, by bucket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceLatency {
    pub dev: Dev,
    /// `health_common::op::READ` or `WRITE`.
    pub op: u8,
    pub buckets: [u64; LATENCY_BUCKETS],
    /// The sum of their latencies.
    pub sum_ns: u64,
}

impl DeviceLatency {
    pub fn total(&self) -> u64 {
        self.buckets.iter().sum()
    }
}

/// What the last read saw, so that the next one gives the window between.
#[derive(Debug, Default)]
pub struct LatencyWindows {
    last: HashMap<LatencyKey, LatencyCount>,
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
        let mut out: BTreeMap<(Dev, u8), DeviceLatency> = BTreeMap::new();
        for (key, count) in entries {
            let dev = Dev::from_kernel(key.dev);
            if !live(dev) {
                gone.push(key);
                continue;
            }
            now.insert(key, count);
            let before = windows.last.get(&key).copied().unwrap_or_default();
            let bucket = usize::from(key.bucket).min(LATENCY_BUCKETS - 1);
            let added = count.count.saturating_sub(before.count);
            if windows.primed && added > 0 {
                let op = key.op as u8;
                let d = out.entry((dev, op)).or_insert(DeviceLatency {
                    dev,
                    op,
                    buckets: [0; LATENCY_BUCKETS],
                    sum_ns: 0,
                });
                d.buckets[bucket] += added;
                d.sum_ns += count.sum_ns.saturating_sub(before.sum_ns);
            }
        }
        for key in gone {
            // Removed by a later read if this fails: the map stays bounded.
            let _ = self.latency.remove(&key);
        }
        windows.last = now;
        windows.primed = true;
        Ok(out.into_values().collect())
    }
}
