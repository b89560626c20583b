//! Device topology: which block devices exist, how they stack, and where
//! their filesystems are mounted. Uses only `health-core` (device numbers);
//! the node's later stages (volumes, report, cluster mode) and the agent
//! loop read it. [`bounded`] runs the syscalls that may hang on a broken
//! mount with a timeout, for this crate and the node's volume checks.
//!
//! Events name devices in different ways (measured on real kernels; the
//! team's notes on real I/O errors, "Which device number each event
//! carries"): block-layer tracepoints carry the whole disk plus an absolute
//! sector ([`Topology::partition_at`] finds the partition), filesystem
//! tracepoints carry the filesystem's device (the partition, or an
//! anonymous 0:N for btrfs, see `btrfs`), and an error low in a stack
//! reaches everything built on it ([`Topology::affected_mounts`]).
//!
//! A [`Topology`] is an immutable snapshot built by one scan; rebuild it when
//! [`MountWatcher`] reports a change (device hotplug is not watched here).
//! Scanning does blocking file I/O: call it from `spawn_blocking`.
//!
//! Here: [`Topology`] and the scan that builds it. `devices` answers for
//! block devices and partitions, `affected` for what an error on a device
//! reaches, `mount_tree` for paths; `sysfs`, `mountinfo` and `btrfs` read
//! the host, and [`MountWatcher`] tells when the mount table changed;
//! `mountstats` reads the NFS client's per-mount RPC counters, `smb_client`
//! the SMB client's connections to its servers.

mod affected;
pub mod bounded;
mod btrfs;
mod devices;
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod mount_table;
mod mount_tree;
pub(crate) mod mountinfo;
pub mod mountstats;
pub mod nvme;
pub mod smb_client;
pub mod stack;
pub(crate) mod sysfs;
mod watcher;

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::PathBuf;
use std::sync::Arc;

pub use btrfs::BtrfsFilesystem;
// The bounded btrfs probe, for tests/tests/host/topology.rs's hung mount point test.
#[doc(hidden)]
pub use btrfs::{discover_bounded, probe_mount, MountProbe, ProbeBound};
pub use devices::Incarnation;
use health_core::dev::Dev;
pub use mount_table::{parse_mountinfo, read_mounts};
use mount_tree::{find_root_mount, normalize};
pub use mountinfo::MountEntry;
pub use sysfs::{is_bio_based_stack, BlockDevice, Partition};
pub use watcher::MountWatcher;

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

/// Each message is complete on its own (the underlying error included), so
/// none is exposed as `source()` as well: anyhow's `{:#}` would print it twice.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("reading {}: {error}", .path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error(
        "cannot read a mount table: {}: {primary_error}; {}: {error}",
        .primary.display(),
        .fallback.display()
    )]
    MountinfoUnreadable {
        primary: PathBuf,
        primary_error: io::Error,
        fallback: PathBuf,
        error: io::Error,
    },
    #[error("malformed mountinfo{} line {line}: {reason}", origin_suffix(.origin))]
    MalformedMountinfo {
        /// The file, when parsing one (not for [`parse_mountinfo`] on text).
        origin: Option<PathBuf>,
        /// 1-based.
        line: usize,
        reason: String,
    },
    #[error("reading {} at line {line}: {error}", origin_name(.origin))]
    MountinfoRead {
        origin: Option<PathBuf>,
        line: usize,
        error: io::Error,
    },
    #[error("watching {}: {error}", .path.display())]
    Watch { path: PathBuf, error: io::Error },
    #[error("MountWatcher::new must be called inside a tokio runtime")]
    NoRuntime,
}

fn origin_name(origin: &Option<PathBuf>) -> String {
    origin
        .as_ref()
        .map_or_else(|| "mountinfo".to_string(), |p| p.display().to_string())
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
    /// Shared with the volume checks ([`Topology::shared_mounts`]) instead
    /// of copied: with 100,000 mounts each copy is tens of megabytes.
    mounts: Arc<[MountEntry]>,
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
    /// md arrays with redundancy (raid1/4/5/6/10): a member's failure is
    /// masked by the array, which keeps serving.
    redundant_arrays: HashSet<Dev>,
    /// dm-multipath devices: their paths' errors are not theirs (see
    /// [`Topology::stacked_above`]).
    multipath: HashSet<Dev>,
    input_errors: InputErrors,
}

/// What one scan skipped under the bad-line policies of the mount table
/// (`mount_table`) and sysfs (`sysfs`), for
/// `volume_health_input_errors_total`. Every rescan reads the files again,
/// so a line that stays bad is counted once per scan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InputErrors {
    /// mountinfo lines skipped.
    pub mountinfo_lines: usize,
    /// sysfs attribute values that did not parse.
    pub sysfs_values: usize,
}

impl Topology {
    /// Reads block devices from `<sys>/class/block` (or `<sys>/dev/block`)
    /// and the host mount table, and discovers btrfs filesystems. Fails only
    /// if the device list or every mount table is unreadable; odd single
    /// devices are skipped (debug log).
    pub fn scan(paths: &HostPaths) -> Result<Topology, TopologyError> {
        Self::scan_with_numbers(paths, &HashMap::new())
    }

    /// [`Topology::scan`], with numbers learned elsewhere for disks sysfs
    /// lists without one (`name → number`): 5.10 shows NVMe multipath's
    /// hidden path disks with neither a `dev` file nor a number in
    /// /proc/diskstats, and only a failed request on one tells its number
    /// (the agent's kernel side records the disk's name with it).
    pub fn scan_with_numbers(
        paths: &HostPaths,
        learned: &HashMap<String, Dev>,
    ) -> Result<Topology, TopologyError> {
        let mut hidden = learned.clone();
        hidden.extend(nvme::diskstats_numbers(&paths.proc_root));
        let mut scan = sysfs::scan_block_devices(&paths.sys_root, &hidden)?;
        nvme::link_paths(&mut scan.devices);
        let table = mount_table::read_mount_table(paths)?;
        let btrfs = btrfs::discover(&table.entries, &table.root, &paths.sys_root);
        let redundant = sysfs::redundant_arrays(&paths.sys_root, &scan.devices);
        let multipath = stack::multipath_devices(&paths.sys_root, &scan.devices);
        let input_errors = InputErrors {
            mountinfo_lines: table.bad_lines,
            sysfs_values: scan.bad_values,
        };
        let mut topo = Self::from_parts(scan.devices, table.entries)
            .with_btrfs(btrfs)
            .with_redundant_arrays(redundant)
            .with_multipath(multipath);
        topo.input_errors = input_errors;
        Ok(topo)
    }

    /// What the scan that built this snapshot skipped as malformed.
    pub fn input_errors(&self) -> InputErrors {
        self.input_errors
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
            mounts_by_dev,
            children,
            by_point,
            root_mount,
            mounts: mounts.into(),
            ..Default::default()
        }
    }

    /// Adds btrfs filesystems (as [`Topology::scan`] discovers them) so that
    /// subvolume devs and member devices find their mounts.
    /// Marks md arrays that survive a member's failure (see
    /// [`Topology::is_redundant_array`]).
    pub fn with_redundant_arrays(mut self, arrays: Vec<Dev>) -> Topology {
        self.redundant_arrays = arrays.into_iter().collect();
        self
    }

    /// Whether `dev` is an md array with redundancy: errors of its members
    /// are evidence of lost redundancy, not of lost data.
    pub fn is_redundant_array(&self, dev: Dev) -> bool {
        self.redundant_arrays.contains(&dev)
    }

    /// Marks dm-multipath devices (see [`Topology::is_multipath`]).
    pub fn with_multipath(mut self, devices: Vec<Dev>) -> Topology {
        self.multipath = devices.into_iter().collect();
        self
    }

    /// Whether `dev` is a dm-multipath device: a failed request on one of its
    /// paths is retried on another path, or failed again by the multipath
    /// device itself, where it is traced and counted; so path errors are
    /// not errors of what is built on it.
    pub fn is_multipath(&self, dev: Dev) -> bool {
        self.multipath.contains(&dev)
    }

    pub fn has_redundant_arrays(&self) -> bool {
        !self.redundant_arrays.is_empty()
    }

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

    pub fn mounts(&self) -> &[MountEntry] {
        &self.mounts
    }

    /// The mounts, shared (no copy).
    pub fn shared_mounts(&self) -> Arc<[MountEntry]> {
        Arc::clone(&self.mounts)
    }

    /// Btrfs filesystems found by the scan.
    pub fn btrfs_filesystems(&self) -> &[BtrfsFilesystem] {
        &self.btrfs
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::sysfs::fake::FakeSys;
    use super::*;

    pub(super) fn disk(dev: Dev, name: &str, size: u64) -> BlockDevice {
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
            diskseq: None,
        }
    }

    pub(super) fn part(
        dev: Dev,
        name: &str,
        disk: Dev,
        number: u32,
        start: u64,
        sectors: u64,
    ) -> BlockDevice {
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

    pub(super) const SDA: Dev = Dev::new(8, 0);
    pub(super) const SDA1: Dev = Dev::new(8, 1);
    pub(super) const SDA2: Dev = Dev::new(8, 2);

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
