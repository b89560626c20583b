//! The kernel maps that hold the device topology the programs need to
//! attribute an error to the right device: partition tables (errors of a
//! whole disk counted against the partition of the sector), the set of
//! block devices (block-device inodes), the bio-based stacking devices and
//! which device sits below which (a layer's own failed bios counted once).
//! The caller computes what they must hold ([`DeviceTables`]) from its
//! topology; this module only makes the maps hold exactly that.
//!
//! [`KernelMapsRest`] also carries the maps the agent reads back: the
//! latencies (`crate::latency`) and the bios waiting now, whose mapping and
//! reader are in [`crate::waiting`]; [`KernelMapsRest::waiting`] is here,
//! next to the field it reads, so that `waiting` need not know this struct.

use std::collections::{HashMap, HashSet};
use std::hash::Hash;

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::Pod;
use health_common::{LatencyCount, LatencyKey, PartTable, StackPair, DISK_NAME_LEN};
use health_core::dev::Dev;

use crate::probes::waiting::BioState;
use crate::waiting::{self, WaitingRead, WaitingSlots};

/// The maps the caller keeps current from the device topology.
pub struct KernelMapsRest {
    pub(crate) partitions: BpfHashMap<MapData, u32, PartTable>,
    pub(crate) block_devs: BpfHashMap<MapData, u32, u8>,
    /// Bio-based stacking devices whose failed bios are counted.
    pub(crate) bio_devs: BpfHashMap<MapData, u32, u8>,
    /// Which devices sit below which, to recognise a failure passed up.
    pub(crate) stacked: BpfHashMap<MapData, StackPair, u8>,
    /// The kernel's name of each disk a failed request was seen on (written
    /// by the programs).
    pub(crate) disk_names: BpfHashMap<MapData, u32, [u8; DISK_NAME_LEN]>,
    /// The bios waiting now (`crate::waiting`), where it could be mapped.
    pub(crate) waiting: Option<WaitingSlots>,
    /// Reads' and writes' latencies per device (`crate::latency`).
    pub(crate) latency: BpfHashMap<MapData, LatencyKey, LatencyCount>,
}

/// What the maps must hold, in the kernel's device encoding.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceTables {
    /// Each whole disk that has partitions, and its partition table.
    pub partitions: HashMap<u32, PartTable>,
    /// Every block device.
    pub block_devs: HashSet<u32>,
    /// Every bio-based dm or md device, and its partitions.
    pub bio_devs: HashSet<u32>,
    /// (upper, lower) for every device and each device built on it.
    pub stacked: HashSet<StackPair>,
}

impl KernelMapsRest {
    /// The kernel's name of the disk with number `dev` (kernel encoding),
    /// if a failed request on it was seen: the only place 5.10 gives the
    /// number of a hidden NVMe path disk.
    pub fn disk_name(&self, dev: u32) -> Option<String> {
        disk_name_text(&self.disk_names.get(&dev, 0).ok()?)
    }

    /// Makes every map hold exactly what `tables` says; stale entries are
    /// removed. A failed update is said and the rest carries on: the next
    /// scan tries again.
    pub fn write(&mut self, tables: &DeviceTables) {
        for (&disk, table) in &tables.partitions {
            if self.partitions.get(&disk, 0).ok() != Some(*table) {
                if let Err(e) = self.partitions.insert(disk, table, 0) {
                    tracing::warn!(disk = %Dev::from_kernel(disk), "updating the kernel partition table failed: {e}");
                }
            }
        }
        let stale: Vec<u32> = self
            .partitions
            .keys()
            .filter_map(Result::ok)
            .filter(|k| !tables.partitions.contains_key(k))
            .collect();
        for k in stale {
            let _ = self.partitions.remove(&k);
        }
        replace_set(&mut self.block_devs, &tables.block_devs, "device set");
        replace_set(&mut self.bio_devs, &tables.bio_devs, "bio-based device set");
        replace_set(&mut self.stacked, &tables.stacked, "device stack");
    }

    /// The bios waiting now, per device; see [`waiting::read`].
    pub fn waiting(
        &mut self,
        now_ns: u64,
        old_before_ns: u64,
        state: impl FnMut(u64) -> Result<BioState, String>,
    ) -> WaitingRead {
        match &self.waiting {
            Some(slots) => waiting::read(slots, now_ns, old_before_ns, state),
            None => WaitingRead::default(),
        }
    }
}

/// Makes a kernel set map hold exactly `wanted`.
fn replace_set<K>(map: &mut BpfHashMap<MapData, K, u8>, wanted: &HashSet<K>, what: &str)
where
    K: Pod + Eq + Hash,
{
    let present: HashSet<K> = map.keys().filter_map(Result::ok).collect();
    for k in wanted.difference(&present) {
        if let Err(e) = map.insert(*k, 1, 0) {
            tracing::warn!("updating the kernel {what} failed: {e}");
            break;
        }
    }
    for k in present.difference(wanted) {
        let _ = map.remove(k);
    }
}

/// A `DISK_NAMES` value as text: up to its first NUL, UTF-8, not empty.
pub(crate) fn disk_name_text(raw: &[u8; DISK_NAME_LEN]) -> Option<String> {
    let len = raw.iter().position(|&b| b == 0).unwrap_or(raw.len());
    let name = std::str::from_utf8(&raw[..len]).ok()?;
    (!name.is_empty()).then(|| name.to_string())
}

/// Every entry of a map the programs change while it is walked, once:
/// keys vanish (the kernel restarts a walk whose current key is gone) and
/// appear, so keys are deduplicated and the walk stops after four times
/// the map's size.
pub(crate) fn entries<K: Pod + Eq + Hash, V: Pod>(
    map: &BpfHashMap<MapData, K, V>,
    max_entries: u32,
) -> Result<Vec<(K, V)>, aya::maps::MapError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (steps, item) in map.iter().enumerate() {
        if steps >= 4 * max_entries as usize {
            break;
        }
        let (key, value) = item?;
        if seen.insert(key) {
            out.push((key, value));
        }
    }
    Ok(out)
}
