//! The bios waiting now, per device: read from the kernel's `WAITING` map
//! (every bio from `block_bio_queue` to `block_bio_complete`), with how many
//! reads and writes wait on each device and since when the oldest has.
//!
//! An entry can outlive its bio: the completion program is kept from
//! nesting inside itself, and a completion it missed leaves the entry. So
//! before a bio old enough to matter is reported, the kernel is asked
//! whether it still waits (`probes::waiting`), and an entry it has
//! completed is removed. Only old entries are asked about, oldest first,
//! and only until one still waits: a few calls per stalled device.

use std::collections::{BTreeMap, HashSet};

use aya::maps::{HashMap as BpfHashMap, MapData, MapError};
use health_common::{op, op_from_opf, Waiting, WAITING_MAX};
use health_core::dev::Dev;

use crate::device_maps::{entries, KernelMapsRest};
use crate::probes::waiting::BioState;

/// What waits on one device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceWait {
    pub dev: Dev,
    pub reads: u32,
    pub writes: u32,
    /// Flushes, discards and the rest.
    pub other: u32,
    /// The oldest bio: when it was queued (CLOCK_MONOTONIC ns) and its
    /// operation ([`op`]).
    pub oldest_ns: u64,
    pub oldest_op: u8,
    /// The id of the cgroup the oldest bio is charged to, where the kernel
    /// was asked about it (it is old enough) and records one.
    pub oldest_cgroup: Option<u64>,
}

impl DeviceWait {
    pub fn total(&self) -> u32 {
        self.reads + self.writes + self.other
    }
}

/// What one read of the map found and did.
#[derive(Debug, Default)]
pub struct WaitingRead {
    /// Devices with at least one bio waiting, by device number.
    pub devices: Vec<DeviceWait>,
    /// Entries the kernel had completed, removed from the map now.
    pub stale_removed: u64,
}

/// At most this many old entries are asked about per device per read.
const CHECKS_PER_DEVICE: usize = 64;

impl KernelMapsRest {
    /// The bios waiting now, per device; see [`read`].
    pub fn waiting(
        &mut self,
        now_ns: u64,
        old_before_ns: u64,
        state: impl FnMut(u64) -> Result<BioState, String>,
    ) -> Result<WaitingRead, MapError> {
        read(&mut self.waiting, now_ns, old_before_ns, state)
    }
}

/// Reads `map` at `now_ns`; bios queued at or before `old_before_ns` are
/// confirmed with `state` (oldest first, per device) before they count.
pub fn read(
    map: &mut BpfHashMap<MapData, u64, Waiting>,
    now_ns: u64,
    old_before_ns: u64,
    mut state: impl FnMut(u64) -> Result<BioState, String>,
) -> Result<WaitingRead, MapError> {
    let entries = entries(map, WAITING_MAX)?;
    let mut by_dev: BTreeMap<u32, Vec<(u64, Waiting)>> = BTreeMap::new();
    for (addr, w) in entries {
        by_dev.entry(w.dev).or_default().push((addr, w));
    }
    let mut out = WaitingRead::default();
    for (dev, mut bios) in by_dev {
        bios.sort_by_key(|(_, w)| w.queued_ns);
        let mut stale = HashSet::new();
        let mut cgroup = None;
        for (addr, w) in bios.iter().take(CHECKS_PER_DEVICE) {
            if w.queued_ns > old_before_ns {
                break;
            }
            match state(*addr) {
                Ok(BioState::Waiting { cgroup: c }) => {
                    cgroup = c;
                    break;
                }
                Ok(BioState::Completed | BioState::Unreadable) => {
                    if remove_if_same(map, *addr, w) {
                        out.stale_removed += 1;
                    }
                    stale.insert(*addr);
                }
                // Cannot ask: report what the map says.
                Err(why) => {
                    tracing::debug!("asking whether a bio still waits: {why}");
                    break;
                }
            }
        }
        bios.retain(|(addr, _)| !stale.contains(addr));
        if let Some(mut d) = summarize(dev, &bios, now_ns) {
            d.oldest_cgroup = cgroup;
            out.devices.push(d);
        }
    }
    Ok(out)
}

/// Removes a stale entry unless a new bio at the same address replaced it
/// since it was read.
fn remove_if_same(map: &mut BpfHashMap<MapData, u64, Waiting>, addr: u64, w: &Waiting) -> bool {
    match map.get(&addr, 0) {
        Ok(now) if now == *w => map.remove(&addr).is_ok(),
        _ => false,
    }
}

/// The device's counts by operation and its oldest bio; `None` for none.
fn summarize(dev: u32, bios: &[(u64, Waiting)], now_ns: u64) -> Option<DeviceWait> {
    let (_, oldest) = bios.first()?;
    let mut d = DeviceWait {
        dev: Dev::from_kernel(dev),
        reads: 0,
        writes: 0,
        other: 0,
        oldest_ns: oldest.queued_ns.min(now_ns),
        oldest_op: op_from_opf(oldest.opf),
        oldest_cgroup: None,
    };
    for (_, w) in bios {
        match op_from_opf(w.opf) {
            op::READ => d.reads += 1,
            op::WRITE => d.writes += 1,
            _ => d.other += 1,
        }
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_common::{kdev, rq};

    fn bio(dev: u32, queued_ns: u64, opf: u32) -> Waiting {
        Waiting {
            queued_ns,
            dev,
            opf,
        }
    }

    #[test]
    fn a_device_is_summed_by_operation_with_its_oldest_bio() {
        let dev = kdev::make(7, 3);
        let bios = [
            (0x10, bio(dev, 500, rq::OP_WRITE | 1 << 11)),
            (0x20, bio(dev, 300, rq::OP_READ)),
            (0x30, bio(dev, 900, rq::OP_FLUSH)),
            (0x40, bio(dev, 700, rq::OP_WRITE)),
        ];
        let mut sorted = bios.to_vec();
        sorted.sort_by_key(|(_, w)| w.queued_ns);
        let d = summarize(dev, &sorted, 1_000).unwrap();
        assert_eq!((d.reads, d.writes, d.other, d.total()), (1, 2, 1, 4));
        assert_eq!(
            (d.oldest_ns, d.oldest_op, d.oldest_cgroup),
            (300, op::READ, None)
        );
        assert_eq!(d.dev, Dev::from_kernel(dev));
        assert!(summarize(dev, &[], 1_000).is_none());
    }
}
