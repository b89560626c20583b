//! What an error on a device reaches: the devices stacked on it (holders,
//! partitions), the filesystems living on those (btrfs members and
//! subvolumes included) and their mounts.

use std::collections::{HashSet, VecDeque};

use health_core::dev::Dev;

use super::{MountEntry, Topology};

impl Topology {
    /// The device number mountinfo and filesystem tracepoints use for the
    /// filesystem `dev` belongs to: a btrfs subvolume's anonymous dev (from
    /// `stat`) maps to its filesystem's; anything else is returned as is.
    pub fn filesystem_dev(&self, dev: Dev) -> Dev {
        self.fs_alias.get(&dev).copied().unwrap_or(dev)
    }

    /// Block devices a filesystem lives on: a btrfs filesystem's members
    /// (`fs_dev` may be its superblock dev or a subvolume's), the device
    /// itself for a filesystem on a block device, nothing for filesystems
    /// without one (tmpfs, overlay, unknown anonymous devs).
    pub fn filesystem_backing_devices(&self, fs_dev: Dev) -> Vec<Dev> {
        let fs_dev = self.filesystem_dev(fs_dev);
        if let Some(members) = self.fs_members.get(&fs_dev) {
            return members.clone();
        }
        if self.is_block_device(fs_dev) {
            return vec![fs_dev];
        }
        Vec::new()
    }

    /// Every mount whose filesystem lives on `dev`, sorted by mount id. `dev`
    /// may be the filesystem's device (bind mounts of it included), a btrfs
    /// subvolume's anonymous dev, or a member device of a btrfs filesystem.
    pub fn mounts_of(&self, dev: Dev) -> Vec<&MountEntry> {
        let mut idx = Vec::new();
        self.collect_mounts_of(dev, &mut idx);
        self.sorted_mounts(idx)
    }

    fn collect_mounts_of(&self, dev: Dev, out: &mut Vec<usize>) {
        let mut fs_devs = vec![self.filesystem_dev(dev)];
        if let Some(on) = self.fs_on_device.get(&dev) {
            fs_devs.extend(on);
        }
        for fs in fs_devs {
            if let Some(v) = self.mounts_by_dev.get(&fs) {
                out.extend(v);
            }
        }
    }

    fn sorted_mounts(&self, mut idx: Vec<usize>) -> Vec<&MountEntry> {
        idx.sort_unstable();
        idx.dedup();
        let mut v: Vec<&MountEntry> = idx.into_iter().map(|i| &self.mounts[i]).collect();
        v.sort_by_key(|m| m.mount_id);
        v
    }

    /// `dev` and every device built on it, transitively, `dev` first
    /// (breadth-first): devices listing it in `holders` (dm, md, LVM) and,
    /// for a disk, its partitions, since an error reported against the
    /// whole disk without a usable sector (a failed flush) may hit any of
    /// them. Callers with a sector should narrow with
    /// [`Topology::partition_at`] first. Cycle-safe. A dm-multipath device
    /// is not above its paths here ([`Topology::is_multipath`]): what fails
    /// on a path is retried on another or failed again by the multipath
    /// device, where it counts once, on the layer the application sees.
    pub fn stacked_above(&self, dev: Dev) -> Vec<Dev> {
        let mut seen = HashSet::from([dev]);
        let mut order = vec![dev];
        let mut queue = VecDeque::from([dev]);
        while let Some(d) = queue.pop_front() {
            let holders = self.device(d).map(|b| b.holders.as_slice()).unwrap_or(&[]);
            let parts = self.partitions.get(&d).map(Vec::as_slice).unwrap_or(&[]);
            for &up in parts.iter().chain(holders) {
                if self.is_multipath(up) && !parts.contains(&up) {
                    continue;
                }
                if seen.insert(up) {
                    order.push(up);
                    queue.push_back(up);
                }
            }
        }
        order
    }

    /// Mounts of every device in [`Topology::stacked_above`]`(dev)`,
    /// deduplicated, sorted by mount id.
    pub fn affected_mounts(&self, dev: Dev) -> Vec<&MountEntry> {
        let mut idx = Vec::new();
        for d in self.stacked_above(dev) {
            self.collect_mounts_of(d, &mut idx);
        }
        self.sorted_mounts(idx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{disk, part, SDA, SDA1, SDA2};
    use crate::{parse_mountinfo, BtrfsFilesystem};

    #[test]
    fn a_multipath_device_is_not_above_its_paths() {
        let sdb = Dev::new(8, 16);
        let mp = Dev::new(253, 0);
        let lv = Dev::new(253, 1);
        let mut a = disk(SDA, "sda", 1000);
        let mut b = disk(sdb, "sdb", 1000);
        a.holders = vec![mp];
        b.holders = vec![mp];
        let mut m = disk(mp, "dm-0", 1000);
        m.slaves = vec![SDA, sdb];
        m.holders = vec![lv];
        let mut l = disk(lv, "dm-1", 100);
        l.slaves = vec![mp];
        let plain = Topology::from_parts(vec![a, b, m, l], vec![]);
        assert_eq!(plain.stacked_above(SDA), [SDA, mp, lv]);
        let t = plain.with_multipath(vec![mp]);
        assert!(t.is_multipath(mp) && !t.is_multipath(lv));
        assert_eq!(t.stacked_above(SDA), [SDA]);
        assert_eq!(t.stacked_above(sdb), [sdb]);
        assert_eq!(t.stacked_above(mp), [mp, lv]);
    }

    #[test]
    fn stacking_is_transitive_and_cycle_safe() {
        let dm0 = Dev::new(253, 0);
        let dm1 = Dev::new(253, 1);
        let md0 = Dev::new(9, 0);
        let c1 = Dev::new(253, 10);
        let c2 = Dev::new(253, 11);
        let mut p1 = part(SDA1, "sda1", SDA, 1, 2048, 100);
        p1.holders = vec![dm0];
        let mut d0 = disk(dm0, "dm-0", 100);
        d0.holders = vec![dm1, md0];
        let mut d1 = disk(dm1, "dm-1", 100);
        d1.holders = vec![c1];
        let mut k1 = disk(c1, "dm-10", 1);
        k1.holders = vec![c2];
        let mut k2 = disk(c2, "dm-11", 1);
        k2.holders = vec![c1, dm0];
        let mounts = parse_mountinfo(
            "\
1 0 254:0 / / rw - ext4 /dev/vda rw
30 1 253:1 / /lv rw - ext4 /dev/mapper/lv rw
31 1 9:0 / /md rw - xfs /dev/md0 rw
32 1 8:2 / /other rw - xfs /dev/sda2 rw
33 1 253:1 / /lv-bind rw - ext4 /dev/mapper/lv rw
",
        )
        .unwrap();
        let t = Topology::from_parts(
            vec![
                disk(SDA, "sda", 1000),
                p1,
                part(SDA2, "sda2", SDA, 2, 4096, 100),
                d0,
                d1,
                k1,
                k2,
                disk(md0, "md0", 1),
            ],
            mounts,
        );
        assert_eq!(t.stacked_above(SDA1), [SDA1, dm0, dm1, md0, c1, c2]);
        assert_eq!(t.stacked_above(c1), [c1, c2, dm0, dm1, md0]);
        let ids = |v: Vec<&MountEntry>| v.iter().map(|m| m.mount_id).collect::<Vec<_>>();
        assert_eq!(ids(t.affected_mounts(SDA1)), [30, 31, 33]);
        // The whole disk reaches both partitions.
        assert_eq!(ids(t.affected_mounts(SDA)), [30, 31, 32, 33]);
        assert_eq!(ids(t.affected_mounts(SDA2)), [32]);
        assert_eq!(t.stacked_above(Dev::new(1, 1)), [Dev::new(1, 1)]);
    }

    #[test]
    fn btrfs_aliases_and_members() {
        let loop0 = Dev::new(7, 0);
        let fs = Dev::new(0, 39);
        let mounts = parse_mountinfo(
            "\
1 0 254:0 / / rw - ext4 /dev/vda rw
44 1 0:39 / /mnt rw - btrfs /dev/loop0 rw,subvolid=5,subvol=/
45 1 0:39 /sv1 /mnt2 rw - btrfs /dev/loop0 rw,subvolid=256,subvol=/sv1
46 1 0:60 / /tmpfs rw - tmpfs tmpfs rw
",
        )
        .unwrap();
        let t = Topology::from_parts(vec![disk(loop0, "loop0", 1)], mounts).with_btrfs(vec![
            BtrfsFilesystem {
                fsid: Some("x".into()),
                fs_dev: fs,
                devices: vec![loop0],
                subvolume_devs: vec![Dev::new(0, 40), Dev::new(0, 41)],
            },
        ]);
        let ids = |v: Vec<&MountEntry>| v.iter().map(|m| m.mount_id).collect::<Vec<_>>();
        for d in [fs, Dev::new(0, 40), Dev::new(0, 41), loop0] {
            assert_eq!(ids(t.mounts_of(d)), [44, 45], "{d}");
            assert_eq!(t.filesystem_backing_devices(d), [loop0], "{d}");
        }
        assert_eq!(ids(t.affected_mounts(loop0)), [44, 45]);
        assert_eq!(t.filesystem_dev(Dev::new(0, 41)), fs);
        assert_eq!(
            t.filesystem_backing_devices(Dev::new(0, 60)),
            Vec::<Dev>::new()
        );
        assert_eq!(t.mounts_of(Dev::new(0, 42)).len(), 0);
    }
}
