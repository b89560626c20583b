//! Block devices and partitions: lookups by dev and name, and the
//! partition an absolute sector falls in.

use health_core::dev::Dev;

use super::{BlockDevice, Topology};

impl Topology {
    pub fn device(&self, dev: Dev) -> Option<&BlockDevice> {
        self.by_dev.get(&dev).map(|&i| &self.devices[i])
    }

    pub fn is_block_device(&self, dev: Dev) -> bool {
        self.by_dev.contains_key(&dev)
    }

    /// All block devices, sorted by dev.
    pub fn devices(&self) -> &[BlockDevice] {
        &self.devices
    }

    /// The partitions of `disk`, sorted by start sector.
    pub fn partitions(&self, disk: Dev) -> Vec<&BlockDevice> {
        self.partitions
            .get(&disk)
            .into_iter()
            .flatten()
            .filter_map(|&p| self.device(p))
            .collect()
    }

    /// Whole disks (everything that is not a partition: also loop, dm, md),
    /// sorted by dev.
    pub fn disks(&self) -> impl Iterator<Item = &BlockDevice> {
        self.devices.iter().filter(|d| d.partition.is_none())
    }

    /// The partition of `disk` holding the absolute 512-byte `sector` (as
    /// block-layer tracepoints report it), else `disk` itself: for sectors
    /// outside every partition (the partition table, gaps, a flush's
    /// sector 2^64-1) and for disks without partitions.
    pub fn partition_at(&self, disk: Dev, sector: u64) -> Dev {
        let parts = self.partitions(disk);
        // Partitions do not overlap in practice (an MBR extended partition
        // shows as 2 sectors in sysfs); if a table makes them, the one that
        // starts last is the most specific.
        let after = parts.partition_point(|d| d.partition.is_some_and(|p| p.start <= sector));
        parts[..after]
            .iter()
            .rev()
            .find(|d| d.partition.is_some_and(|p| p.contains(sector)))
            .map_or(disk, |d| d.dev)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{disk, part, SDA, SDA1, SDA2};

    #[test]
    fn partition_at_maps_absolute_sectors() {
        // Given out of order on purpose.
        let t = Topology::from_parts(
            vec![
                part(SDA2, "sda2", SDA, 2, 43008, 61440),
                disk(SDA, "sda", 131072),
                part(SDA1, "sda1", SDA, 1, 2048, 40960),
            ],
            vec![],
        );
        let starts: Vec<u64> = t
            .partitions(SDA)
            .iter()
            .map(|p| p.partition.unwrap().start)
            .collect();
        assert_eq!(starts, [2048, 43008]);
        for (sector, want) in [
            (0, SDA),
            (2047, SDA),
            (2048, SDA1),
            (43007, SDA1),
            (43008, SDA2),
            (104447, SDA2),
            (104448, SDA),
            (u64::MAX, SDA),
        ] {
            assert_eq!(t.partition_at(SDA, sector), want, "sector {sector}");
        }
        // A partition or unknown device has no partitions: itself.
        assert_eq!(t.partition_at(SDA1, 5000), SDA1);
        assert_eq!(t.partition_at(Dev::new(9, 9), 5000), Dev::new(9, 9));
        let disks: Vec<Dev> = t.disks().map(|d| d.dev).collect();
        assert_eq!(disks, [SDA]);
        assert!(t.is_block_device(SDA2));
        assert!(!t.is_block_device(Dev::new(0, 39)));
    }
}
