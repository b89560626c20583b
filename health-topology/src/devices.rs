//! Block devices and partitions: lookups by dev and name, and the
//! partition an absolute sector falls in.

use health_core::dev::Dev;

use super::{BlockDevice, Topology};

impl Topology {
    pub fn device(&self, dev: Dev) -> Option<&BlockDevice> {
        self.by_dev.get(&dev).map(|&i| &self.devices[i])
    }

    /// Whether errors counted on `dev` while its disk had sequence number
    /// `diskseq` (0: the kernel side recorded none) belong to the device
    /// holding that number now. Device numbers are reused (loop devices
    /// rebound, dm, md and NVMe numbers taken lowest-free), sequence
    /// numbers never are while the kernel runs.
    pub fn incarnation(&self, dev: Dev, diskseq: u64) -> Incarnation {
        Incarnation::of(self.device(dev), diskseq)
    }

    /// Whether errors of `dev` at sequence number `diskseq` are of a
    /// device gone, an earlier holder of the number (see
    /// [`Topology::incarnation`]).
    pub fn is_earlier(&self, dev: Dev, diskseq: u64) -> bool {
        matches!(self.incarnation(dev, diskseq), Incarnation::Earlier { .. })
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

/// Which device an error's number and sequence number name, against this
/// topology (see [`Topology::incarnation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Incarnation {
    /// The device holding the number now.
    Current,
    /// A device that held the number before the current one (sequence
    /// number `now`): gone, whatever holds the number now.
    Earlier { now: u64 },
    /// A device newer than this topology's scan: rescan.
    Later,
    /// No sequence number on one side (a kernel before 5.15, a source
    /// that records none, a device the topology does not list): the
    /// number is all there is, as before sequence numbers.
    Unknown,
}

impl Incarnation {
    /// [`Topology::incarnation`] for the device a lookup already found
    /// (`None`: the topology lists none of that number).
    pub fn of(device: Option<&BlockDevice>, diskseq: u64) -> Incarnation {
        match device.and_then(|d| d.diskseq) {
            _ if diskseq == 0 => Incarnation::Unknown,
            None => Incarnation::Unknown,
            Some(now) if now == diskseq => Incarnation::Current,
            Some(now) if diskseq < now => Incarnation::Earlier { now },
            Some(_) => Incarnation::Later,
        }
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

    /// An error's sequence number against the device holding its number.
    #[test]
    fn errors_are_of_the_current_an_earlier_or_a_later_holder() {
        let mut loop0 = disk(Dev::new(7, 0), "loop0", 8);
        loop0.diskseq = Some(13);
        let mut old_kernel = disk(Dev::new(8, 0), "sda", 8);
        old_kernel.diskseq = None;
        let topo = Topology::from_parts(vec![loop0, old_kernel], vec![]);
        let loop0 = Dev::new(7, 0);
        assert_eq!(topo.incarnation(loop0, 13), Incarnation::Current);
        assert_eq!(
            topo.incarnation(loop0, 11),
            Incarnation::Earlier { now: 13 }
        );
        assert!(topo.is_earlier(loop0, 11));
        assert_eq!(topo.incarnation(loop0, 15), Incarnation::Later);
        assert_eq!(topo.incarnation(loop0, 0), Incarnation::Unknown);
        assert!(!topo.is_earlier(loop0, 0));
        assert_eq!(topo.incarnation(Dev::new(8, 0), 4), Incarnation::Unknown);
        assert_eq!(topo.incarnation(Dev::new(9, 0), 4), Incarnation::Unknown);
    }
}
