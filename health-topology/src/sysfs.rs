//! Block devices from sysfs.
//!
//! Every block device, partitions included, has a directory reachable as
//! `<sys>/class/block/<name>` (and `<sys>/dev/block/MAJ:MIN`), both symlinks
//! into `<sys>/devices/...`. A partition's directory sits inside its disk's,
//! which is how we find the disk. Attributes used (sizes in 512-byte sectors
//! whatever the logical block size):
//!
//! | file | meaning |
//! |---|---|
//! | `dev` | `MAJ:MIN` |
//! | `size` | size in sectors |
//! | `ro` | `1` if read-only |
//! | `partition`, `start` | partitions only: number and start on the disk |
//! | `loop/backing_file` | bound loop devices only |
//! | `holders/*`, `slaves/*` | symlinks to the devices stacked above / below (dm, md) |
//!
//! Bad-value policy: a device whose `dev` does not parse is skipped, and an
//! optional attribute that does not parse takes its default; both log a
//! warning and are counted (`volume_health_input_errors_total{source="sysfs"}`).
//! Never fatal: these files are the kernel's, so a value we cannot read
//! means a driver that prints it in a way we do not know, and that one
//! device must not take the whole topology (every other device's error
//! attribution) with it. A missing file is normal (a device that vanished
//! mid-scan, an attribute this driver lacks): a debug log, not counted.
//! Reads are bounded: sysfs attributes are at most a page, and a longer
//! file is a bad value, never read whole.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io::{self, Read};
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

use health_core::dev::Dev;

use super::TopologyError;

/// Where a partition lies on its disk, in 512-byte sectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Partition {
    pub number: u32,
    pub start: u64,
    pub sectors: u64,
}

impl Partition {
    /// Whether the absolute disk sector lies inside this partition.
    pub fn contains(&self, sector: u64) -> bool {
        sector >= self.start && sector - self.start < self.sectors
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockDevice {
    pub dev: Dev,
    /// Kernel name (`sda1`, `loop0p2`, `dm-0`, `nvme0n1`).
    pub name: String,
    /// The disk a partition belongs to; `None` for whole disks.
    pub whole_disk: Option<Dev>,
    pub partition: Option<Partition>,
    /// In 512-byte sectors.
    pub size_sectors: u64,
    /// The file behind a bound loop device, as the kernel prints it (in the
    /// mount namespace of whoever set it up; ` (deleted)` if unlinked).
    pub loop_backing_file: Option<PathBuf>,
    /// Devices built on top of this one (dm/md/LVM above a disk or partition).
    pub holders: Vec<Dev>,
    /// Devices this one is built from.
    pub slaves: Vec<Dev>,
    pub read_only: bool,
    /// The disk's sequence number (`diskseq`, Linux 5.15+): never reused
    /// while the kernel runs, so it tells a device from an earlier one that
    /// held the same number (a loop device bound to another file, a dm or
    /// NVMe number reused). A partition has its disk's. `None` on kernels
    /// without it.
    pub diskseq: Option<u64>,
}

/// Longest attribute file read: sysfs prints at most a page.
const MAX_ATTRIBUTE_BYTES: u64 = 4096;

/// The block devices of one scan, and how many attribute values could not
/// be parsed (see the bad-value policy above).
#[derive(Debug, Default)]
pub(crate) struct DeviceScan {
    pub devices: Vec<BlockDevice>,
    pub bad_values: usize,
}

/// Reads every block device. Only an unreadable device list fails the scan;
/// a device that vanishes midway is skipped, and a missing optional
/// attribute takes its default (see the policy above). A hidden disk (an
/// NVMe multipath path, see `nvme`) has no `dev` file: its number comes
/// from `hidden_numbers` (`/proc/diskstats`), and without it the disk is
/// skipped as a bad value (counted, warned: its errors cannot be placed).
pub(crate) fn scan_block_devices(
    sys_root: &Path,
    hidden_numbers: &HashMap<String, Dev>,
) -> Result<DeviceScan, TopologyError> {
    let mut scan = DeviceScan::default();
    for (name, dir) in list_devices(sys_root)? {
        match read_device(&name, &dir, hidden_numbers, &mut scan.bad_values) {
            Ok(d) => scan.devices.push(d),
            Err(e) => note(&mut scan.bad_values, &name, &e, "skipping block device"),
        }
    }
    scan.devices.sort_by_key(|d| d.dev);
    inherit_diskseq(&mut scan.devices);
    Ok(scan)
}

/// `diskseq` of a whole disk; partitions have no such file (see
/// [`inherit_diskseq`]), nor has any device before Linux 5.15.
fn read_diskseq(dir: &Path, name: &str, bad: &mut usize) -> Option<u64> {
    match read_u64(&dir.join("diskseq")) {
        Ok(seq) => Some(seq),
        Err(DeviceError::Io { error, .. }) if error.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            note(bad, name, &e, "ignoring the disk sequence number");
            None
        }
    }
}

/// A partition is its disk's incarnation: the kernel gives partitions no
/// sequence number of their own and re-creates them when the disk changes.
fn inherit_diskseq(devices: &mut [BlockDevice]) {
    let seqs: HashMap<Dev, u64> = devices
        .iter()
        .filter_map(|d| Some((d.dev, d.diskseq?)))
        .collect();
    for d in devices.iter_mut() {
        if let Some(disk) = d.whole_disk {
            d.diskseq = seqs.get(&disk).copied();
        }
    }
}

/// Logs why a value was not used, and counts it when it was there but did
/// not parse.
fn note(bad: &mut usize, name: &str, e: &DeviceError, what: &str) {
    match e {
        DeviceError::Parse { .. } => {
            *bad += 1;
            tracing::warn!(device = %name, error = %e, "{what}");
        }
        DeviceError::Io { .. } => tracing::debug!(device = %name, error = %e, "{what}"),
    }
}

/// `(name, directory)` of every block device. `class/block` is named by
/// device; `dev/block` is the fallback for a sysfs where the former is
/// missing or unreadable (odd kernels, partial sysfs mounts), and is named
/// by number, so the name comes from the link target.
fn list_devices(sys_root: &Path) -> Result<Vec<(String, PathBuf)>, TopologyError> {
    let class = sys_root.join("class/block");
    let class_err = match fs::read_dir(&class) {
        Ok(rd) => {
            return Ok(rd
                .filter_map(|e| e.ok())
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect())
        }
        Err(e) => e,
    };
    let by_number = sys_root.join("dev/block");
    tracing::debug!(path = %class.display(), error = %class_err, "trying dev/block instead");
    let rd = fs::read_dir(&by_number).map_err(|error| TopologyError::Io {
        path: by_number.clone(),
        error,
    })?;
    Ok(rd
        .filter_map(|e| e.ok())
        .map(|e| {
            let path = e.path();
            let name = fs::read_link(&path)
                .ok()
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| e.file_name().to_string_lossy().into_owned());
            (name, path)
        })
        .collect())
}

/// Why one device could not be read (logged, never returned from a scan).
#[derive(Debug, thiserror::Error)]
enum DeviceError {
    #[error("reading {}: {error}", .path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{}: unexpected content {value:?}", .path.display())]
    Parse { path: PathBuf, value: String },
}

fn read_device(
    name: &str,
    dir: &Path,
    hidden_numbers: &HashMap<String, Dev>,
    bad: &mut usize,
) -> Result<BlockDevice, DeviceError> {
    let dev = match read_dev(&dir.join("dev")) {
        Ok(d) => d,
        Err(DeviceError::Io { path, error }) if error.kind() == io::ErrorKind::NotFound => {
            match hidden_numbers.get(name) {
                Some(&d) => d,
                // Listed, so not vanished: a disk without a number we can read.
                None if dir.is_dir() => {
                    return Err(DeviceError::Parse {
                        path,
                        value: "no dev file, and not in /proc/diskstats".into(),
                    })
                }
                None => return Err(DeviceError::Io { path, error }),
            }
        }
        Err(e) => return Err(e),
    };
    let size_sectors = optional(read_u64(&dir.join("size")), name, 0, bad);
    let read_only = optional(read_trimmed(&dir.join("ro")), name, String::new(), bad) == "1";

    let (partition, whole_disk) = match read_partition(dir) {
        Ok(Some(number_start)) => {
            let (number, start) = number_start;
            // The partition's directory is inside its disk's; resolve the
            // class/block symlink first so ".." means the disk.
            let disk = fs::canonicalize(dir)
                .map_err(|error| DeviceError::Io {
                    path: dir.to_path_buf(),
                    error,
                })
                .and_then(|real| match real.parent() {
                    Some(p) => read_dev(&p.join("dev")),
                    None => Err(DeviceError::Parse {
                        path: real.clone(),
                        value: String::new(),
                    }),
                });
            match disk {
                Ok(disk) => (
                    Some(Partition {
                        number,
                        start,
                        sectors: size_sectors,
                    }),
                    Some(disk),
                ),
                Err(e) => {
                    // Without its disk a partition cannot be mapped from
                    // block-layer events; keep it as a standalone device.
                    note(bad, name, &e, "partition without a readable disk");
                    (None, None)
                }
            }
        }
        Ok(None) => (None, None),
        Err(e) => {
            note(bad, name, &e, "unreadable partition attributes");
            (None, None)
        }
    };

    let loop_backing_file = match read_bounded(&dir.join("loop/backing_file")) {
        Ok(mut bytes) => {
            while bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            Some(PathBuf::from(OsString::from_vec(bytes)))
        }
        // Absent for unbound loops and every other driver.
        Err(e) => {
            note(bad, name, &e, "ignoring the loop backing file");
            None
        }
    };

    Ok(BlockDevice {
        dev,
        name: name.to_string(),
        whole_disk,
        partition,
        size_sectors,
        loop_backing_file,
        holders: read_links(&dir.join("holders"), name),
        slaves: read_links(&dir.join("slaves"), name),
        read_only,
        diskseq: read_diskseq(dir, name, bad),
    })
}

/// Whether a whole disk is a bio-based stacking device: device-mapper, md
/// or an NVMe multipath head without a request queue of its own (`mq/`).
/// Such a layer can fail a bio by itself (dm-flakey, dm-error, a full thin
/// pool, a failed array, a head without a path) without any request
/// failing, so the kernel side watches its bios. Request-based dm
/// (multipath) fails requests, which are seen already. The caller picks
/// the candidates by name; an NVMe head has neither `dm/` nor `md/`.
pub fn is_bio_based_stack(sys_root: &Path, disk_name: &str) -> bool {
    let dir = sys_root.join("class/block").join(disk_name);
    let stacking =
        dir.join("dm").is_dir() || dir.join("md").is_dir() || disk_name.starts_with("nvme");
    stacking && dir.is_dir() && !dir.join("mq").exists()
}

/// The md arrays among `devices` whose level keeps data available when a
/// member fails (`md/level` is raid1, raid4, raid5, raid6 or raid10).
pub(crate) fn redundant_arrays(sys_root: &Path, devices: &[BlockDevice]) -> Vec<Dev> {
    devices
        .iter()
        .filter(|d| d.whole_disk.is_none() && d.name.starts_with("md"))
        .filter(|d| {
            let level = sys_root.join("class/block").join(&d.name).join("md/level");
            let level = read_trimmed(&level).unwrap_or_default();
            matches!(
                level.as_str(),
                "raid1" | "raid4" | "raid5" | "raid6" | "raid10"
            )
        })
        .map(|d| d.dev)
        .collect()
}

/// `Some((number, start))` when the device is a partition.
fn read_partition(dir: &Path) -> Result<Option<(u32, u64)>, DeviceError> {
    let number = match read_trimmed(&dir.join("partition")) {
        Ok(s) => s,
        Err(DeviceError::Io { error, .. }) if error.kind() == io::ErrorKind::NotFound => {
            return Ok(None)
        }
        Err(e) => return Err(e),
    };
    let number = number.parse().map_err(|_| DeviceError::Parse {
        path: dir.join("partition"),
        value: number,
    })?;
    let start = read_u64(&dir.join("start"))?;
    Ok(Some((number, start)))
}

/// Device numbers of the entries of `holders/` or `slaves/`. Each entry is a
/// symlink to the other device's directory, so its `dev` is read through the
/// link rather than looked up by name: that also works for a device that
/// appeared after we listed `class/block`.
fn read_links(dir: &Path, name: &str) -> Vec<Dev> {
    let rd = match fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::debug!(device = %name, path = %dir.display(), error = %e, "unreadable");
            }
            return Vec::new();
        }
    };
    let mut out: Vec<Dev> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| match read_dev(&e.path().join("dev")) {
            Ok(d) => Some(d),
            Err(err) => {
                tracing::debug!(device = %name, error = %err, "skipping stacked device");
                None
            }
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

fn optional<T>(r: Result<T, DeviceError>, name: &str, default: T, bad: &mut usize) -> T {
    r.unwrap_or_else(|e| {
        note(bad, name, &e, "attribute not used, using the default");
        default
    })
}

/// The bytes of an attribute file, at most [`MAX_ATTRIBUTE_BYTES`].
fn read_bounded(path: &Path) -> Result<Vec<u8>, DeviceError> {
    let io_error = |error| DeviceError::Io {
        path: path.to_path_buf(),
        error,
    };
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|f| f.take(MAX_ATTRIBUTE_BYTES + 1).read_to_end(&mut bytes))
        .map_err(io_error)?;
    if bytes.len() as u64 > MAX_ATTRIBUTE_BYTES {
        return Err(DeviceError::Parse {
            path: path.to_path_buf(),
            value: format!("more than {MAX_ATTRIBUTE_BYTES} bytes"),
        });
    }
    Ok(bytes)
}

fn read_trimmed(path: &Path) -> Result<String, DeviceError> {
    let bytes = read_bounded(path)?;
    match String::from_utf8(bytes) {
        Ok(s) => Ok(s.trim().to_string()),
        Err(e) => Err(DeviceError::Parse {
            path: path.to_path_buf(),
            value: String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }),
    }
}

fn read_u64(path: &Path) -> Result<u64, DeviceError> {
    let s = read_trimmed(path)?;
    s.parse().map_err(|_| DeviceError::Parse {
        path: path.to_path_buf(),
        value: s,
    })
}

pub(crate) fn read_dev_attr(path: &Path) -> Option<Dev> {
    read_dev(path).ok()
}

fn read_dev(path: &Path) -> Result<Dev, DeviceError> {
    let s = read_trimmed(path)?;
    s.parse().map_err(|_| DeviceError::Parse {
        path: path.to_path_buf(),
        value: s,
    })
}

#[cfg(test)]
pub(crate) mod fake {
    //! A fake sysfs tree with the same symlink layout as the kernel's, so
    //! the scan code walks it exactly as it walks /sys.

    use std::fs;
    use std::os::unix::fs::symlink;
    use std::path::{Path, PathBuf};

    pub struct FakeSys {
        pub root: PathBuf,
    }

    impl FakeSys {
        pub fn new(root: &Path) -> Self {
            fs::create_dir_all(root.join("class/block")).unwrap();
            fs::create_dir_all(root.join("devices/virtual/block")).unwrap();
            Self {
                root: root.to_path_buf(),
            }
        }

        /// Adds a disk; returns its real directory.
        pub fn disk(&self, name: &str, dev: &str, size: u64) -> PathBuf {
            let dir = self.root.join("devices/virtual/block").join(name);
            self.device_dir(&dir, name, dev, size);
            dir
        }

        /// Adds a partition inside `disk_dir`.
        pub fn partition(
            &self,
            disk_dir: &Path,
            name: &str,
            dev: &str,
            number: u32,
            start: u64,
            size: u64,
        ) -> PathBuf {
            let dir = disk_dir.join(name);
            self.device_dir(&dir, name, dev, size);
            fs::write(dir.join("partition"), format!("{number}\n")).unwrap();
            fs::write(dir.join("start"), format!("{start}\n")).unwrap();
            dir
        }

        fn device_dir(&self, dir: &Path, name: &str, dev: &str, size: u64) {
            fs::create_dir_all(dir.join("holders")).unwrap();
            fs::create_dir_all(dir.join("slaves")).unwrap();
            fs::write(dir.join("dev"), format!("{dev}\n")).unwrap();
            fs::write(dir.join("size"), format!("{size}\n")).unwrap();
            fs::write(dir.join("ro"), "0\n").unwrap();
            symlink(dir, self.root.join("class/block").join(name)).unwrap();
            let by_num = self.root.join("dev/block");
            fs::create_dir_all(&by_num).unwrap();
            symlink(dir, by_num.join(dev)).unwrap();
        }

        /// `upper` is built on `lower` (as dm does): holders/slaves links.
        pub fn stack(&self, lower: &Path, upper: &Path) {
            let lname = lower.file_name().unwrap();
            let uname = upper.file_name().unwrap();
            symlink(upper, lower.join("holders").join(uname)).unwrap();
            symlink(lower, upper.join("slaves").join(lname)).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::fake::FakeSys;
    use super::*;

    #[test]
    fn reads_disks_partitions_loops_and_stacking() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = FakeSys::new(tmp.path());
        let loop0 = sys.disk("loop0", "7:0", 131072);
        fs::create_dir_all(loop0.join("loop")).unwrap();
        fs::write(loop0.join("loop/backing_file"), "/var/img with space\n").unwrap();
        let p1 = sys.partition(&loop0, "loop0p1", "259:0", 1, 2048, 40960);
        let p2 = sys.partition(&loop0, "loop0p2", "259:1", 2, 43008, 61440);
        let dm0 = sys.disk("dm-0", "253:0", 40960);
        sys.stack(&p1, &dm0);
        fs::write(p2.join("ro"), "1\n").unwrap();

        let devs = scan_block_devices(tmp.path(), &HashMap::new())
            .unwrap()
            .devices;
        let by_name = |n: &str| devs.iter().find(|d| d.name == n).unwrap();
        assert_eq!(devs.len(), 4);

        let l = by_name("loop0");
        assert_eq!(l.dev, Dev::new(7, 0));
        assert_eq!(l.size_sectors, 131072);
        assert_eq!(l.whole_disk, None);
        assert_eq!(l.partition, None);
        assert_eq!(
            l.loop_backing_file.as_deref(),
            Some(Path::new("/var/img with space"))
        );

        let p = by_name("loop0p1");
        assert_eq!(p.whole_disk, Some(Dev::new(7, 0)));
        assert_eq!(
            p.partition,
            Some(Partition {
                number: 1,
                start: 2048,
                sectors: 40960
            })
        );
        assert_eq!(p.holders, vec![Dev::new(253, 0)]);
        assert!(!p.read_only);
        assert!(by_name("loop0p2").read_only);
        assert_eq!(by_name("dm-0").slaves, vec![Dev::new(259, 0)]);
    }

    /// Disks carry their sequence number, partitions their disk's; a
    /// kernel before 5.15 has none, and a garbled one is counted.
    #[test]
    fn disks_and_their_partitions_carry_the_disk_sequence_number() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = FakeSys::new(tmp.path());
        let loop0 = sys.disk("loop0", "7:0", 131072);
        fs::write(loop0.join("diskseq"), "13\n").unwrap();
        sys.partition(&loop0, "loop0p1", "259:0", 1, 2048, 40960);
        sys.disk("vda", "254:0", 100);
        let bad = sys.disk("vdb", "254:16", 100);
        fs::write(bad.join("diskseq"), "thirteen\n").unwrap();

        let scan = scan_block_devices(tmp.path(), &HashMap::new()).unwrap();
        let seq = |n: &str| scan.devices.iter().find(|d| d.name == n).unwrap().diskseq;
        assert_eq!(seq("loop0"), Some(13));
        assert_eq!(seq("loop0p1"), Some(13));
        assert_eq!(seq("vda"), None);
        assert_eq!(seq("vdb"), None);
        assert_eq!(scan.bad_values, 1);
    }

    #[test]
    fn odd_devices_are_skipped_or_defaulted_not_fatal() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = FakeSys::new(tmp.path());
        let good = sys.disk("vda", "254:0", 100);
        // Vanished between listing and reading: a dangling class symlink.
        symlink(
            tmp.path().join("devices/virtual/block/gone"),
            tmp.path().join("class/block/gone"),
        )
        .unwrap();
        // No dev file, garbage dev file.
        let nodev = sys.disk("nodev", "1:1", 1);
        fs::remove_file(nodev.join("dev")).unwrap();
        let bad = sys.disk("bad", "1:2", 1);
        fs::write(bad.join("dev"), "eleven\n").unwrap();
        // Missing size and ro: defaults.
        let nosize = sys.disk("nosize", "1:3", 1);
        fs::remove_file(nosize.join("size")).unwrap();
        fs::remove_file(nosize.join("ro")).unwrap();
        // Partition without start: kept as a plain device.
        let odd = sys.partition(&good, "vda1", "254:1", 1, 0, 10);
        fs::remove_file(odd.join("start")).unwrap();
        // A holder that vanished: its link dangles.
        symlink(
            tmp.path().join("devices/virtual/block/dm-9"),
            good.join("holders/dm-9"),
        )
        .unwrap();

        let scan = scan_block_devices(tmp.path(), &HashMap::new()).unwrap();
        let devs = scan.devices;
        let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["nosize", "vda", "vda1"]);
        // The garbage `dev` and the disk without a number are bad values
        // (their errors could not be placed); missing optional files are not.
        assert_eq!(scan.bad_values, 2);
        assert_eq!(devs[0].size_sectors, 0);
        assert!(!devs[0].read_only);
        assert_eq!(devs[2].partition, None);
        assert!(devs[1].holders.is_empty());
        // A hidden disk's number from /proc/diskstats places it.
        let hidden = HashMap::from([("nodev".to_string(), Dev::new(1, 1))]);
        let scan = scan_block_devices(tmp.path(), &hidden).unwrap();
        let names: Vec<&str> = scan.devices.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["nodev", "nosize", "vda", "vda1"]);
        assert_eq!(scan.bad_values, 1);
    }

    #[test]
    fn oversized_and_non_utf8_values_are_bad_values_not_read_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = FakeSys::new(tmp.path());
        let vda = sys.disk("vda", "254:0", 100);
        fs::write(vda.join("size"), "1".repeat(5000)).unwrap();
        fs::write(vda.join("ro"), b"\xff\n").unwrap();
        let scan = scan_block_devices(tmp.path(), &HashMap::new()).unwrap();
        assert_eq!(scan.bad_values, 2);
        assert_eq!(scan.devices[0].size_sectors, 0);
        assert!(!scan.devices[0].read_only);
        let err = read_u64(&vda.join("size")).unwrap_err().to_string();
        assert!(
            err.ends_with("size: unexpected content \"more than 4096 bytes\""),
            "{err}"
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config::with_cases(48))]
        /// Numbers written the way the kernel writes them read back; any
        /// other bytes in `dev` skip the device and count one bad value,
        /// and the scan itself never fails.
        #[test]
        fn attribute_values_read_back_or_count_as_bad(
            major in 0u32..4096,
            minor in 0u32..1_048_576,
            size in proptest::num::u64::ANY,
            junk in proptest::collection::vec(proptest::num::u8::ANY, 0..40),
        ) {
            let tmp = tempfile::tempdir().unwrap();
            let sys = FakeSys::new(tmp.path());
            let good = sys.disk("good", &format!("{major}:{minor}"), size);
            let bad = sys.disk("bad", "1:1", 1);
            fs::write(bad.join("dev"), &junk).unwrap();
            let scan = scan_block_devices(tmp.path(), &HashMap::new()).unwrap();
            let g = scan.devices.iter().find(|d| d.name == "good").unwrap();
            proptest::prop_assert_eq!((g.dev, g.size_sectors), (Dev::new(major, minor), size));
            let junk_parses = std::str::from_utf8(&junk)
                .ok()
                .and_then(|s| s.parse::<Dev>().ok())
                .is_some();
            let b = scan.devices.iter().any(|d| d.name == "bad");
            proptest::prop_assert_eq!(b, junk_parses);
            proptest::prop_assert_eq!(scan.bad_values, usize::from(!junk_parses));
            let _ = good;
        }
    }

    #[test]
    fn falls_back_to_dev_block() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = FakeSys::new(tmp.path());
        let sda = sys.disk("sda", "8:0", 1000);
        sys.partition(&sda, "sda1", "8:1", 1, 10, 90);
        fs::remove_dir_all(tmp.path().join("class")).unwrap();
        let devs = scan_block_devices(tmp.path(), &HashMap::new())
            .unwrap()
            .devices;
        let names: Vec<&str> = devs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["sda", "sda1"]);
        assert_eq!(devs[1].whole_disk, Some(Dev::new(8, 0)));

        fs::remove_dir_all(tmp.path().join("dev")).unwrap();
        let err = scan_block_devices(tmp.path(), &HashMap::new())
            .unwrap_err()
            .to_string();
        assert!(err.contains("dev/block"), "{err}");
    }
}
