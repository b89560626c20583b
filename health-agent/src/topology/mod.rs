//! Device topology: which block devices exist, how they stack, and where
//! their filesystems are mounted.
//!
//! Events name devices in different ways (see
//! /work/shared/notes/real-io-errors.md, "Which device number each event
//! carries"): block-layer tracepoints carry the whole disk plus an absolute
//! sector ([`Topology::partition_at`] finds the partition), filesystem
//! tracepoints carry the filesystem's device (the partition, or an
//! anonymous 0:N for btrfs, see [`btrfs`]), and an error low in a stack
//! reaches everything built on it ([`Topology::affected_mounts`]).
//!
//! A [`Topology`] is an immutable snapshot built by one scan; rebuild it when
//! [`MountWatcher`] reports a change (device hotplug is not watched here).
//! Scanning does blocking file I/O: call it from `spawn_blocking`.

mod btrfs;
mod mountinfo;
mod sysfs;
mod watcher;

#[cfg(test)]
mod real_tests;

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::path::{Component, Path, PathBuf};

pub use btrfs::BtrfsFilesystem;
pub use mountinfo::{parse_mountinfo, read_mounts, MountEntry};
pub use sysfs::{BlockDevice, Partition};
pub use watcher::MountWatcher;

use crate::dev::Dev;

/// Where the host's /proc and /sys are visible to the agent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostPaths {
    pub proc_root: PathBuf,
    pub sys_root: PathBuf,
}

impl Default for HostPaths {
    fn default() -> Self {
        Self {
            proc_root: PathBuf::from("/proc"),
            sys_root: PathBuf::from("/sys"),
        }
    }
}

impl HostPaths {
    /// Pid 1's mount table: the host's mount namespace when the agent runs
    /// with the host's pid namespace, wherever /proc is mounted.
    pub fn mountinfo(&self) -> PathBuf {
        self.proc_root.join("1/mountinfo")
    }

    /// The agent's own mount table, the fallback.
    pub fn self_mountinfo(&self) -> PathBuf {
        self.proc_root.join("self/mountinfo")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("reading {}: {source}", .path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error(
        "cannot read a mount table: {}: {primary_error}; {}: {source}",
        .primary.display(),
        .fallback.display()
    )]
    MountinfoUnreadable {
        primary: PathBuf,
        primary_error: io::Error,
        fallback: PathBuf,
        source: io::Error,
    },
    #[error("malformed mountinfo{} line {line}: {reason}", origin_suffix(.origin))]
    MalformedMountinfo {
        /// The file, when parsing one (not for [`parse_mountinfo`] on text).
        origin: Option<PathBuf>,
        /// 1-based.
        line: usize,
        reason: String,
    },
    #[error("watching {}: {source}", .path.display())]
    Watch { path: PathBuf, source: io::Error },
    #[error("MountWatcher::new must be called inside a tokio runtime")]
    NoRuntime,
}

fn origin_suffix(origin: &Option<PathBuf>) -> String {
    origin
        .as_ref()
        .map(|p| format!(" {}", p.display()))
        .unwrap_or_default()
}

/// A snapshot of block devices and mounts, indexed for the lookups the
/// event path makes per error.
#[derive(Clone, Debug, Default)]
pub struct Topology {
    /// Sorted by dev.
    devices: Vec<BlockDevice>,
    by_dev: HashMap<Dev, usize>,
    /// Disk -> its partitions, sorted by start.
    partitions: HashMap<Dev, Vec<Dev>>,
    mounts: Vec<MountEntry>,
    /// Filesystem dev -> indices into `mounts`, in mountinfo order.
    mounts_by_dev: HashMap<Dev, Vec<usize>>,
    /// (parent mount id, normalized mount point) -> indices into `mounts`,
    /// for walking a path down the mount tree.
    children: HashMap<(u32, PathBuf), Vec<usize>>,
    /// Normalized mount point -> indices into `mounts`.
    by_point: HashMap<PathBuf, Vec<usize>>,
    /// Index of the namespace's root mount, where path walks start.
    root_mount: Option<usize>,
    btrfs: Vec<BtrfsFilesystem>,
    /// Btrfs subvolume anonymous dev (what `stat` shows) -> filesystem dev
    /// (what mountinfo and tracepoints show).
    fs_alias: HashMap<Dev, Dev>,
    /// Btrfs filesystem dev -> member block devices.
    fs_members: HashMap<Dev, Vec<Dev>>,
    /// Block device -> btrfs filesystems (their fs devs) living on it.
    fs_on_device: HashMap<Dev, Vec<Dev>>,
}

impl Topology {
    /// Reads block devices from `<sys>/class/block` (or `<sys>/dev/block`)
    /// and the host mount table, and discovers btrfs filesystems. Fails only
    /// if the device list or every mount table is unreadable; odd single
    /// devices are skipped (debug log).
    pub fn scan(paths: &HostPaths) -> Result<Topology, TopologyError> {
        let devices = sysfs::scan_block_devices(&paths.sys_root)?;
        let table = mountinfo::read_mount_table(paths)?;
        let btrfs = btrfs::discover(&table.entries, &table.root, &paths.sys_root);
        Ok(Self::from_parts(devices, table.entries).with_btrfs(btrfs))
    }

    /// Builds a snapshot from given parts (unit tests, benchmarks). No
    /// btrfs information: add it with [`Topology::with_btrfs`].
    pub fn from_parts(devices: Vec<BlockDevice>, mounts: Vec<MountEntry>) -> Topology {
        let mut devices = devices;
        devices.sort_by_key(|d| d.dev);
        // A duplicate dev would make lookups ambiguous; keep the last given.
        devices.reverse();
        devices.dedup_by_key(|d| d.dev);
        devices.reverse();
        let by_dev: HashMap<Dev, usize> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.dev, i))
            .collect();

        let mut partitions: HashMap<Dev, Vec<Dev>> = HashMap::new();
        for d in &devices {
            if let (Some(disk), Some(_)) = (d.whole_disk, d.partition) {
                partitions.entry(disk).or_default().push(d.dev);
            }
        }
        let start_of = |dev: &Dev| {
            by_dev
                .get(dev)
                .and_then(|&i| devices[i].partition)
                .map_or(0, |p| p.start)
        };
        for parts in partitions.values_mut() {
            parts.sort_by_key(|p| (start_of(p), *p));
        }

        let mut mounts_by_dev: HashMap<Dev, Vec<usize>> = HashMap::new();
        let mut children: HashMap<(u32, PathBuf), Vec<usize>> = HashMap::new();
        let mut by_point: HashMap<PathBuf, Vec<usize>> = HashMap::new();
        for (i, m) in mounts.iter().enumerate() {
            mounts_by_dev.entry(m.dev).or_default().push(i);
            let point = normalize(&m.mount_point);
            children
                .entry((m.parent_id, point.clone()))
                .or_default()
                .push(i);
            by_point.entry(point).or_default().push(i);
        }

        let root_mount = find_root_mount(&mounts, &by_point);
        Topology {
            devices,
            by_dev,
            partitions,
            mounts,
            mounts_by_dev,
            children,
            by_point,
            root_mount,
            ..Default::default()
        }
    }

    /// Adds btrfs filesystems (as [`Topology::scan`] discovers them) so that
    /// subvolume devs and member devices find their mounts.
    pub fn with_btrfs(mut self, filesystems: Vec<BtrfsFilesystem>) -> Topology {
        for fs in &filesystems {
            for &sub in &fs.subvolume_devs {
                self.fs_alias.insert(sub, fs.fs_dev);
            }
            self.fs_members.insert(fs.fs_dev, fs.devices.clone());
            for &member in &fs.devices {
                let on = self.fs_on_device.entry(member).or_default();
                if !on.contains(&fs.fs_dev) {
                    on.push(fs.fs_dev);
                }
            }
        }
        self.btrfs = filesystems;
        self
    }

    pub fn device(&self, dev: Dev) -> Option<&BlockDevice> {
        self.by_dev.get(&dev).map(|&i| &self.devices[i])
    }

    /// Looks a device up by kernel name (`loop0p1`).
    pub fn device_by_name(&self, name: &str) -> Option<&BlockDevice> {
        self.devices.iter().find(|d| d.name == name)
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

    pub fn mounts(&self) -> &[MountEntry] {
        &self.mounts
    }

    /// Btrfs filesystems found by the scan.
    pub fn btrfs_filesystems(&self) -> &[BtrfsFilesystem] {
        &self.btrfs
    }

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
    /// [`Topology::partition_at`] first. Cycle-safe.
    pub fn stacked_above(&self, dev: Dev) -> Vec<Dev> {
        let mut seen = HashSet::from([dev]);
        let mut order = vec![dev];
        let mut queue = VecDeque::from([dev]);
        while let Some(d) = queue.pop_front() {
            let holders = self.device(d).map(|b| b.holders.as_slice()).unwrap_or(&[]);
            let parts = self.partitions.get(&d).map(Vec::as_slice).unwrap_or(&[]);
            for &up in parts.iter().chain(holders) {
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

    /// The mount at exactly `path` (lexically normalized, symlinks not
    /// followed): the topmost of the mounts stacked there, found by walking
    /// the mount tree from `/` so that mounts hidden under a later mount on
    /// a parent directory lose. If every mount at `path` is hidden, the last
    /// one in mountinfo order.
    pub fn mount_at(&self, path: &Path) -> Option<&MountEntry> {
        let path = normalize(path);
        if let Some(m) = self.resolve(&path) {
            if normalize(&m.mount_point) == path {
                return Some(m);
            }
        }
        self.by_point
            .get(&path)
            .and_then(|v| v.last())
            .map(|&i| &self.mounts[i])
    }

    /// The filesystem dev of the mount that `path` lies on (the mount at or
    /// above it), as mountinfo shows it. Lexical: `path` must be absolute
    /// and in the mount table's namespace; symlinks are not followed.
    pub fn device_of_path(&self, path: &Path) -> Option<Dev> {
        self.resolve(&normalize(path)).map(|m| m.dev)
    }

    /// Walks `path` down the mount tree: start at the root mount, and at each
    /// prefix descend into mounts whose parent is the current mount and
    /// whose mount point is that prefix (repeatedly, for stacked mounts).
    fn resolve(&self, path: &Path) -> Option<&MountEntry> {
        if !path.has_root() {
            return None;
        }
        let mut cur = self.root_mount?;
        let mut prefix = PathBuf::from("/");
        cur = self.descend(cur, &prefix);
        for c in path.components().skip(1) {
            prefix.push(c);
            cur = self.descend(cur, &prefix);
        }
        Some(&self.mounts[cur])
    }

    fn descend(&self, mut cur: usize, point: &Path) -> usize {
        // Bounded so that a malformed table with a parent cycle cannot loop.
        for _ in 0..self.mounts.len() {
            let key = (self.mounts[cur].mount_id, point.to_path_buf());
            match self.children.get(&key).and_then(|v| v.last()) {
                Some(&next) if next != cur => cur = next,
                _ => break,
            }
        }
        cur
    }
}

/// The namespace's root mount: mounted at `/` with a parent that is not in
/// the table (the parent lies outside the namespace or the process's root).
/// The first such in mountinfo order.
fn find_root_mount(
    mounts: &[MountEntry],
    by_point: &HashMap<PathBuf, Vec<usize>>,
) -> Option<usize> {
    let ids: HashSet<u32> = mounts.iter().map(|m| m.mount_id).collect();
    let at_root = by_point.get(Path::new("/"))?;
    at_root
        .iter()
        .copied()
        .find(|&i| {
            let m = &mounts[i];
            m.parent_id == m.mount_id || !ids.contains(&m.parent_id)
        })
        .or_else(|| at_root.first().copied())
}

/// Lexical normalization: drops `.`, empty and trailing components, applies
/// `..` textually. Mount points from the kernel are already canonical; this
/// is for caller-supplied paths.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::sysfs::fake::FakeSys;
    use super::*;

    fn disk(dev: Dev, name: &str, size: u64) -> BlockDevice {
        BlockDevice {
            dev,
            name: name.into(),
            whole_disk: None,
            partition: None,
            size_sectors: size,
            loop_backing_file: None,
            holders: vec![],
            slaves: vec![],
            read_only: false,
        }
    }

    fn part(dev: Dev, name: &str, disk: Dev, number: u32, start: u64, sectors: u64) -> BlockDevice {
        BlockDevice {
            whole_disk: Some(disk),
            partition: Some(Partition {
                number,
                start,
                sectors,
            }),
            ..self::disk(dev, name, sectors)
        }
    }

    const SDA: Dev = Dev::new(8, 0);
    const SDA1: Dev = Dev::new(8, 1);
    const SDA2: Dev = Dev::new(8, 2);

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

    #[test]
    fn mounts_of_and_lookups_by_path() {
        let mounts = parse_mountinfo(
            "\
1 0 254:0 / / rw - ext4 /dev/vda rw
20 1 8:1 / /data rw - ext4 /dev/sda1 rw
21 1 8:1 /sub /bind rw - ext4 /dev/sda1 rw
22 20 0:50 / /data/cache rw - tmpfs tmpfs rw
23 20 8:2 / /data rw - xfs /dev/sda2 rw
24 1 0:51 / /stack rw - tmpfs a rw
25 24 0:52 / /stack rw - tmpfs b rw
",
        )
        .unwrap();
        let t = Topology::from_parts(vec![], mounts);
        let ids = |v: Vec<&MountEntry>| v.iter().map(|m| m.mount_id).collect::<Vec<_>>();
        assert_eq!(ids(t.mounts_of(SDA1)), [20, 21]);
        assert_eq!(ids(t.mounts_of(Dev::new(7, 7))), Vec::<u32>::new());

        // /data is stacked: 23 (sda2) was mounted over 20 (sda1), which
        // hides 22 at /data/cache.
        assert_eq!(t.mount_at(Path::new("/data")).unwrap().mount_id, 23);
        assert_eq!(t.device_of_path(Path::new("/data/cache/x")), Some(SDA2));
        assert_eq!(t.mount_at(Path::new("/data/cache")).unwrap().mount_id, 22);
        assert_eq!(t.device_of_path(Path::new("/bind/a/b")), Some(SDA1));
        assert_eq!(
            t.device_of_path(Path::new("/bind/../etc")),
            Some(Dev::new(254, 0))
        );
        assert_eq!(t.device_of_path(Path::new("/")), Some(Dev::new(254, 0)));
        assert_eq!(t.device_of_path(Path::new("relative")), None);
        // Stacked on the same point with parent = the lower mount.
        assert_eq!(t.mount_at(Path::new("/stack/")).unwrap().mount_id, 25);
        assert_eq!(
            t.device_of_path(Path::new("/stack/f")),
            Some(Dev::new(0, 52))
        );
        assert!(t.mount_at(Path::new("/nothing")).is_none());
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

    #[test]
    fn scan_of_a_fake_host() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = FakeSys::new(&tmp.path().join("sys"));
        let loop0 = sys.disk("loop0", "7:0", 131072);
        std::fs::create_dir_all(loop0.join("loop")).unwrap();
        std::fs::write(loop0.join("loop/backing_file"), "/tmp/disk.img\n").unwrap();
        let p1 = sys.partition(&loop0, "loop0p1", "259:0", 1, 2048, 40960);
        let p2 = sys.partition(&loop0, "loop0p2", "259:1", 2, 43008, 61440);
        let dm0 = sys.disk("dm-0", "253:0", 40960);
        let dm1 = sys.disk("dm-1", "253:1", 40960);
        let dm2 = sys.disk("dm-2", "253:2", 1);
        let dm3 = sys.disk("dm-3", "253:3", 1);
        sys.stack(&p1, &dm0);
        sys.stack(&dm0, &dm1);
        // A cycle (impossible in a sane kernel, but must not hang us).
        sys.stack(&dm2, &dm3);
        sys.stack(&dm3, &dm2);
        sys.stack(&p2, &dm2);

        let proc_root = tmp.path().join("proc");
        std::fs::create_dir_all(proc_root.join("1")).unwrap();
        std::fs::write(
            proc_root.join("1/mountinfo"),
            "\
1 0 254:0 / / rw - ext4 /dev/vda rw
40 1 253:1 / /vol rw - ext4 /dev/dm-1 rw
41 1 253:3 / /cyc rw - xfs /dev/dm-3 rw
42 1 253:1 /d /vol-bind ro - ext4 /dev/dm-1 rw
",
        )
        .unwrap();
        let paths = HostPaths {
            proc_root,
            sys_root: sys.root.clone(),
        };
        assert!(paths.mountinfo().ends_with("proc/1/mountinfo"));
        let t = Topology::scan(&paths).unwrap();

        let l = t.device(Dev::new(7, 0)).unwrap();
        assert_eq!(
            l.loop_backing_file.as_deref(),
            Some(Path::new("/tmp/disk.img"))
        );
        assert_eq!(t.partition_at(l.dev, 2048), Dev::new(259, 0));
        assert_eq!(t.partition_at(l.dev, 43008), Dev::new(259, 1));
        assert_eq!(
            t.device(Dev::new(253, 1)).unwrap().slaves,
            [Dev::new(253, 0)]
        );
        let ids = |v: Vec<&MountEntry>| v.iter().map(|m| m.mount_id).collect::<Vec<_>>();
        assert_eq!(ids(t.affected_mounts(Dev::new(259, 0))), [40, 42]);
        assert_eq!(ids(t.affected_mounts(Dev::new(259, 1))), [41]);
        assert_eq!(ids(t.affected_mounts(Dev::new(7, 0))), [40, 41, 42]);
        assert_eq!(
            t.stacked_above(Dev::new(253, 2)),
            [Dev::new(253, 2), Dev::new(253, 3)]
        );
        assert!(t.btrfs_filesystems().is_empty());
        assert_eq!(t.mounts().len(), 4);
    }

    #[test]
    fn scan_fails_only_when_nothing_is_readable() {
        let tmp = tempfile::tempdir().unwrap();
        let paths = HostPaths {
            proc_root: tmp.path().join("proc"),
            sys_root: tmp.path().join("sys"),
        };
        assert!(matches!(
            Topology::scan(&paths),
            Err(TopologyError::Io { .. })
        ));
        FakeSys::new(&paths.sys_root);
        assert!(matches!(
            Topology::scan(&paths),
            Err(TopologyError::MountinfoUnreadable { .. })
        ));
    }
}
