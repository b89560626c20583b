//! Which pod volumes a kernel error reaches: [`VolumeIndex`] maps a device
//! number to every pod volume stacked on it. Rebuilt from a fresh topology
//! and kubelet discovery whenever either changes; read on every error.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;

use health_core::dev::Dev;
use health_topology::Topology;

use crate::volumes::kubelet::{self, KubeletVolume, VolumeMode};
use crate::volumes::VolumeKey;

/// A discovered volume with the device it lives on right now.
#[derive(Clone, Debug, PartialEq)]
pub struct IndexedVolume {
    pub key: VolumeKey,
    pub volume: KubeletVolume,
    /// Filesystem mode: the device of the topmost mount at the pod's path (a
    /// btrfs filesystem's anonymous dev, as mountinfo shows it). Block mode:
    /// the device node's number. `None`: not mounted / not a block device.
    pub device: Option<Dev>,
}

/// Device -> pod volumes, for the kernel event path.
#[derive(Clone, Debug, Default)]
pub struct VolumeIndex {
    /// Sorted by key.
    volumes: Vec<IndexedVolume>,
    by_key: HashMap<VolumeKey, u32>,
    /// Every device an error may name that reaches at least one volume ->
    /// indices into `volumes`, sorted and deduplicated. Boxed slices: exact
    /// size, no spare capacity across thousands of entries.
    by_dev: HashMap<Dev, Box<[u32]>>,
    /// Kernel names of the devices in `by_dev`, for messages.
    names: HashMap<Dev, String>,
    /// (error device, volume index) where the error reaches the volume
    /// through a redundant md array above the device: the array masks it.
    via_redundancy: HashSet<(Dev, u32)>,
}

impl VolumeIndex {
    /// Resolves each volume's device (filesystem mode from the topology's
    /// mount table, block mode by `stat` of the device node, which does no
    /// I/O on the device) and indexes the devices that reach it.
    pub fn build(topo: &Topology, volumes: Vec<KubeletVolume>) -> VolumeIndex {
        // The topmost mount at each point is the last in mountinfo order, as
        // in `kubelet::resolve_device`; one map instead of a scan of the
        // whole table per volume (thousands of mounts on a busy node, and
        // `Path` equality walks components). Mount points from the kernel and
        // kubelet paths under a canonical root are both canonical, so
        // comparing their bytes is comparing the paths.
        let mut topmost: HashMap<&OsStr, Dev> = HashMap::with_capacity(topo.mounts().len());
        for m in topo.mounts() {
            topmost.insert(m.mount_point.as_os_str(), m.dev);
        }
        let resolved = volumes
            .into_iter()
            .map(|volume| {
                let device = match volume.volume_mode {
                    VolumeMode::Filesystem => topmost.get(volume.path.as_os_str()).copied(),
                    VolumeMode::Block => kubelet::resolve_device(&volume, &[]),
                };
                (volume, device)
            })
            .collect();
        Self::from_resolved(topo, resolved)
    }

    /// Like [`VolumeIndex::build`] with devices already resolved (tests,
    /// benchmarks, and callers that must not stat).
    pub fn from_resolved(
        topo: &Topology,
        resolved: Vec<(KubeletVolume, Option<Dev>)>,
    ) -> VolumeIndex {
        let mut volumes: Vec<IndexedVolume> = resolved
            .into_iter()
            .map(|(volume, device)| IndexedVolume {
                key: volume.key(),
                volume,
                device,
            })
            .collect();
        volumes.sort_by(|a, b| a.key.cmp(&b.key));
        volumes.dedup_by(|later, first| later.key == first.key);
        let by_key = volumes
            .iter()
            .enumerate()
            .map(|(i, v)| (v.key.clone(), i as u32))
            .collect();

        // The devices each volume lives on: its own, plus the member devices
        // of its filesystem (btrfs). An error reaches the volume when one of
        // these is stacked on the error's device.
        let mut targets: HashMap<Dev, Vec<u32>> = HashMap::new();
        for (i, v) in volumes.iter().enumerate() {
            let Some(dev) = v.device else { continue };
            let mut own = topo.filesystem_backing_devices(dev);
            own.push(dev);
            own.sort_unstable();
            own.dedup();
            for d in own {
                targets.entry(d).or_default().push(i as u32);
            }
        }

        // Inverting `stacked_above` per candidate device keeps the semantics
        // exactly those of the topology (partitions of a disk, holders,
        // cycles). Candidates: every block device, and every volume device
        // that is not one (a btrfs or NFS anonymous dev names itself).
        let mut candidates: Vec<Dev> = topo.devices().iter().map(|d| d.dev).collect();
        candidates.extend(
            targets
                .keys()
                .copied()
                .filter(|d| !topo.is_block_device(*d)),
        );
        let mut by_dev = HashMap::new();
        let mut reached: Vec<u32> = Vec::new();
        for dev in candidates {
            reached.clear();
            for up in topo.stacked_above(dev) {
                if let Some(v) = targets.get(&up) {
                    reached.extend_from_slice(v);
                }
            }
            if reached.is_empty() {
                continue;
            }
            reached.sort_unstable();
            reached.dedup();
            by_dev.insert(dev, reached.as_slice().into());
        }
        by_dev.shrink_to_fit();
        let via_redundancy = masked_by_arrays(topo, &by_dev);
        let names = by_dev
            .keys()
            .filter_map(|d| topo.device(*d).map(|info| (*d, info.name.clone())))
            .collect();
        VolumeIndex {
            volumes,
            by_key,
            by_dev,
            names,
            via_redundancy,
        }
    }

    /// Whether an error on `dev` reaches volume `index` only through a
    /// redundant md array (a member failed, the array still serves).
    pub fn via_redundant_array(&self, dev: Dev, index: u32) -> bool {
        !self.via_redundancy.is_empty() && self.via_redundancy.contains(&(dev, index))
    }

    /// Indices (into [`VolumeIndex::volumes`]) of the volumes an error on
    /// `dev` reaches; empty when none. A hash lookup, no allocation.
    pub fn indices_for(&self, dev: Dev) -> &[u32] {
        self.by_dev.get(&dev).map_or(&[], |v| v)
    }

    /// The volumes an error on `dev` reaches, sorted by key.
    pub fn volumes_for(&self, dev: Dev) -> impl Iterator<Item = &IndexedVolume> + '_ {
        self.indices_for(dev)
            .iter()
            .filter_map(|&i| self.volumes.get(i as usize))
    }

    /// All volumes, sorted by key.
    pub fn volumes(&self) -> &[IndexedVolume] {
        &self.volumes
    }

    pub fn get(&self, key: &VolumeKey) -> Option<&IndexedVolume> {
        self.by_key
            .get(key)
            .and_then(|&i| self.volumes.get(i as usize))
    }

    /// Where `key` is in [`Self::volumes`] (the monitor keeps its states in
    /// the same order).
    pub fn position(&self, key: &VolumeKey) -> Option<usize> {
        self.by_key.get(key).map(|&i| i as usize)
    }

    pub fn len(&self) -> usize {
        self.volumes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.volumes.is_empty()
    }

    /// The kernel name of a device that reaches a volume (`loop3`).
    pub fn device_name(&self, dev: Dev) -> Option<&str> {
        self.names.get(&dev).map(String::as_str)
    }

    /// How many distinct devices reach at least one volume.
    pub fn device_count(&self) -> usize {
        self.by_dev.len()
    }
}

/// For every device below a redundant md array, the volumes on or above that
/// array. Empty (and free) on hosts without such arrays.
fn masked_by_arrays(topo: &Topology, by_dev: &HashMap<Dev, Box<[u32]>>) -> HashSet<(Dev, u32)> {
    let mut masked = HashSet::new();
    if !topo.has_redundant_arrays() {
        return masked;
    }
    for &dev in by_dev.keys() {
        for array in topo.stacked_above(dev).into_iter().skip(1) {
            if !topo.is_redundant_array(array) {
                continue;
            }
            for &i in by_dev.get(&array).map_or(&[][..], |v| v) {
                masked.insert((dev, i));
            }
        }
    }
    masked
}
