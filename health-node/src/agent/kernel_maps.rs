//! The topology, written into the kernel maps after every scan: what the
//! programs need to attribute an error to the right device.

use std::collections::HashSet;

use health_common::{PartRange, PartTable, StackPair, MAX_PARTITIONS};
use health_kernel::device_maps::{DeviceTables, KernelMapsRest};
use health_topology::{is_bio_based_stack, HostPaths, Topology};

/// Writes the topology into the kernel maps: partition tables (so that the
/// kernel attributes errors to partitions), the set of block devices (to
/// recognise block-device inodes), the bio-based stacking devices and which
/// device sits below which (to count a layer's own failed bios once).
/// Stale entries are removed.
pub fn sync(topo: &Topology, host: &HostPaths, rest: &mut KernelMapsRest) -> Synced {
    let tables = tables(topo, host);
    rest.write(&tables);
    Synced {
        bio_based: tables.bio_devs.len(),
    }
}

/// What the topology held that the kernel side must know of.
pub struct Synced {
    /// Bio-based dm/md devices (with their partitions).
    pub bio_based: usize,
}

fn tables(topo: &Topology, host: &HostPaths) -> DeviceTables {
    let mut tables = DeviceTables::default();
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
        for (slot, (dev, part)) in parts
            .iter()
            .filter_map(|p| p.partition.as_ref().map(|x| (p.dev, x)))
            .take(MAX_PARTITIONS)
            .enumerate()
        {
            table.parts[slot] = PartRange {
                start: part.start,
                end: part.start.saturating_add(part.sectors),
                dev: dev.to_kernel(),
                _pad: 0,
            };
            table.count = slot as u32 + 1;
        }
        tables.partitions.insert(disk.dev.to_kernel(), table);
    }
    tables.block_devs = topo.devices().iter().map(|d| d.dev.to_kernel()).collect();
    tables.bio_devs = topo
        .devices()
        .iter()
        .filter(|d| {
            let disk = d.whole_disk.and_then(|w| topo.device(w)).unwrap_or(d);
            is_stacking_name(&disk.name) && is_bio_based_stack(&host.sys_root, &disk.name)
        })
        .map(|d| d.dev.to_kernel())
        .collect();
    let mut stacked = HashSet::new();
    for lower in topo.devices() {
        for upper in topo.stacked_above(lower.dev).into_iter().skip(1) {
            stacked.insert(StackPair {
                upper: upper.to_kernel(),
                lower: lower.dev.to_kernel(),
            });
        }
    }
    tables.stacked = stacked;
    tables
}

/// Only these names can be dm, md or an NVMe head; the sysfs check is for
/// those alone.
fn is_stacking_name(name: &str) -> bool {
    name.starts_with("dm-") || name.starts_with("md") || is_nvme_head_name(name)
}

/// `nvme<S>n<N>`: an NVMe namespace disk, which with native multipath is
/// the bio-based head over its path disks: when no path is left it fails
/// the application's bios itself ("no available path"), without a failed
/// request (`health_topology::nvme`). Without multipath it has a request
/// queue (`mq/`) and is not bio-based.
fn is_nvme_head_name(name: &str) -> bool {
    name.strip_prefix("nvme")
        .and_then(|r| r.split_once('n'))
        .is_some_and(|(s, n)| {
            !s.is_empty()
                && !n.is_empty()
                && s.bytes().all(|b| b.is_ascii_digit())
                && n.bytes().all(|b| b.is_ascii_digit())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacking_names() {
        for yes in ["dm-0", "md127", "nvme0n1", "nvme12n3"] {
            assert!(is_stacking_name(yes), "{yes}");
        }
        for no in ["sda", "nvme0c1n1", "nvme0n1p1", "nvme0n", "nvmen1", "loop0"] {
            assert!(!is_stacking_name(no), "{no}");
        }
    }
}
