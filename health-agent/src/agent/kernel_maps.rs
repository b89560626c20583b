//! The topology, written into the kernel maps after every scan: what the
//! programs need to attribute an error to the right device.

use std::collections::HashSet;
use std::hash::Hash;

use aya::maps::{HashMap as BpfHashMap, MapData};
use aya::Pod;
use health_common::{PartRange, PartTable, StackPair, MAX_PARTITIONS};

use crate::kernel::collector::KernelMapsRest;
use crate::topology::{is_bio_based_stack, HostPaths, Topology};

/// Writes the topology into the kernel maps: partition tables (so that the
/// kernel attributes errors to partitions), the set of block devices (to
/// recognise block-device inodes), the bio-based stacking devices and which
/// device sits below which (to count a layer's own failed bios once).
/// Stale entries are removed.
pub fn sync(topo: &Topology, host: &HostPaths, rest: &mut KernelMapsRest) -> Synced {
    let mut wanted_disks = HashSet::new();
    for disk in topo.disks() {
        let parts = topo.partitions(disk.dev);
        if parts.is_empty() {
            continue;
        }
        if parts.len() > MAX_PARTITIONS {
            tracing::warn!(
                disk = %disk.name,
                partitions = parts.len(),
                "more partitions than the kernel table holds; errors beyond the first {MAX_PARTITIONS} count against the whole disk"
            );
        }
        let mut table = PartTable::EMPTY;
        for (slot, p) in parts
            .iter()
            .filter_map(|p| p.partition.as_ref().map(|x| (p.dev, x)))
            .take(MAX_PARTITIONS)
            .enumerate()
        {
            let (dev, part) = p;
            table.parts[slot] = PartRange {
                start: part.start,
                end: part.start.saturating_add(part.sectors),
                dev: dev.to_kernel(),
                _pad: 0,
            };
            table.count = slot as u32 + 1;
        }
        let key = disk.dev.to_kernel();
        wanted_disks.insert(key);
        if rest.partitions.get(&key, 0).ok() != Some(table) {
            if let Err(e) = rest.partitions.insert(key, table, 0) {
                tracing::warn!(disk = %disk.name, "updating the kernel partition table failed: {e}");
            }
        }
    }
    let stale: Vec<u32> = rest
        .partitions
        .keys()
        .filter_map(Result::ok)
        .filter(|k| !wanted_disks.contains(k))
        .collect();
    for k in stale {
        let _ = rest.partitions.remove(&k);
    }

    let wanted_devs: HashSet<u32> = topo.devices().iter().map(|d| d.dev.to_kernel()).collect();
    replace_set(&mut rest.block_devs, &wanted_devs, "device set");
    Synced {
        bio_based: sync_stacks(topo, host, rest),
    }
}

/// What the topology held that the kernel side must know of.
pub struct Synced {
    /// Bio-based dm/md devices (with their partitions).
    pub bio_based: usize,
}

/// `BIO_DEVS`: every bio-based dm/md device and its partitions. `STACKED`:
/// (upper, lower) for every device and each device built on it.
fn sync_stacks(topo: &Topology, host: &HostPaths, rest: &mut KernelMapsRest) -> usize {
    let bio_based: HashSet<u32> = topo
        .devices()
        .iter()
        .filter(|d| {
            let disk = d.whole_disk.and_then(|w| topo.device(w)).unwrap_or(d);
            is_stacking_name(&disk.name) && is_bio_based_stack(&host.sys_root, &disk.name)
        })
        .map(|d| d.dev.to_kernel())
        .collect();
    replace_set(&mut rest.bio_devs, &bio_based, "bio-based device set");

    let mut pairs = HashSet::new();
    for lower in topo.devices() {
        for upper in topo.stacked_above(lower.dev).into_iter().skip(1) {
            pairs.insert(StackPair {
                upper: upper.to_kernel(),
                lower: lower.dev.to_kernel(),
            });
        }
    }
    replace_set(&mut rest.stacked, &pairs, "device stack");
    bio_based.len()
}

/// Only these names can be dm or md; the sysfs check is for those alone.
fn is_stacking_name(name: &str) -> bool {
    name.starts_with("dm-") || name.starts_with("md")
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
