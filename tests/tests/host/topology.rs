//! Device topology against the running kernel: loop devices, partitions,
//! ext4, btrfs, mounts, the mount watcher, and a hung FUSE mount standing in
//! for a hung btrfs volume. They need root and fail (not skip) without it,
//! so a CI job that silently lost its privileges shows up red.
//!
//! Everything created is torn down by guards, also when an assertion fails.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Result;
use health_core::dev::Dev;
use health_tests::sys::require_root;
use health_topology::bounded::InFlight;
use health_topology::{
    discover_bounded, parse_mountinfo, probe_mount, read_mounts, BtrfsFilesystem, HostPaths,
    MountEntry, MountProbe, MountWatcher, Partition, ProbeBound, Topology,
};

fn run(cmd: &str, args: &[&str]) -> String {
    run_with_input(cmd, args, None)
}

fn run_with_input(cmd: &str, args: &[&str], input: Option<&str>) -> String {
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawning {cmd}: {e}"));
    if let Some(text) = input {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn rdev(path: &Path) -> Dev {
    Dev::from_stat(fs::metadata(path).unwrap().rdev())
}

fn st_dev(path: &Path) -> Dev {
    Dev::from_stat(fs::metadata(path).unwrap().dev())
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A loop device over a file, detached on drop.
struct Loop {
    node: PathBuf,
    dev: Dev,
}

impl Loop {
    fn attach(image: &Path, partscan: bool) -> Loop {
        let mut args = vec!["-f", "--show"];
        if partscan {
            args.push("-P");
        }
        args.push(p(image));
        let node = PathBuf::from(run("losetup", &args));
        let dev = rdev(&node);
        let lo = Loop { node, dev };
        if partscan {
            // This VM's kernel has no partition-table parsers
            // (CONFIG_MSDOS_PARTITION and CONFIG_EFI_PARTITION unset), so
            // `-P` only allows partitions; partx reads the table in
            // userspace and adds them with BLKPG. On a kernel that parsed
            // the table already, the partitions exist and we skip this.
            let name = lo.node.file_name().unwrap().to_str().unwrap();
            if !Path::new("/sys/class/block")
                .join(format!("{name}p1"))
                .exists()
            {
                run("partx", &["-a", p(&lo.node)]);
            }
        }
        lo
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let ok = Command::new("losetup")
            .arg("-d")
            .arg(&self.node)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("warning: could not detach {}", self.node.display());
        }
    }
}

/// A mount, unmounted on drop (lazily if it is busy).
struct Mounted {
    target: Option<PathBuf>,
}

impl Mounted {
    fn new(args: &[&str], target: &Path) -> Mounted {
        fs::create_dir_all(target).unwrap();
        let mut all = args.to_vec();
        all.push(p(target));
        run("mount", &all);
        Mounted {
            target: Some(target.to_path_buf()),
        }
    }

    fn unmount(mut self) {
        let target = self.target.take().unwrap();
        run("umount", &[p(&target)]);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Some(t) = self.target.take() {
            let ok = Command::new("umount")
                .arg(&t)
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                let _ = Command::new("umount").arg("-l").arg(&t).status();
            }
        }
    }
}

fn wait_for(path: &Path) {
    // devtmpfs creates partition nodes asynchronously after the partition
    // scan; it takes milliseconds.
    let deadline = Instant::now() + Duration::from_secs(3);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn points(v: &[&MountEntry]) -> BTreeSet<PathBuf> {
    v.iter().map(|m| m.mount_point.clone()).collect()
}

fn assert_sorted_by_id(v: &[&MountEntry]) {
    assert!(v.windows(2).all(|w| w[0].mount_id < w[1].mount_id), "{v:?}");
}

#[test]
fn real_loop_partitions_ext4_and_bind_mount() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    let image = root.join("disk.img");
    // 64 MiB = 131072 sectors: two partitions and gaps before, between
    // (none) and after them.
    fs::File::create(&image).unwrap().set_len(64 << 20).unwrap();
    run_with_input(
        "sfdisk",
        &["-q", "--no-reread", "--no-tell-kernel", p(&image)],
        Some("label: dos\nstart=2048, size=40960, type=83\nstart=43008, size=61440, type=83\n"),
    );
    let lo = Loop::attach(&image, true);

    let t = Topology::scan(&HostPaths::default()).unwrap();
    let disk = t.device(lo.dev).expect("loop device in the scan");
    assert_eq!(disk.size_sectors, 131072);
    assert_eq!(disk.partition, None);
    assert_eq!(disk.whole_disk, None);
    assert_eq!(disk.loop_backing_file.as_deref(), Some(image.as_path()));
    assert!(t.disks().any(|d| d.dev == lo.dev));

    let parts = t.partitions(lo.dev);
    let got: Vec<(String, Option<Dev>, Option<Partition>)> = parts
        .iter()
        .map(|d| (d.name.clone(), d.whole_disk, d.partition))
        .collect();
    let name = &disk.name;
    assert_eq!(
        got,
        vec![
            (
                format!("{name}p1"),
                Some(lo.dev),
                Some(Partition {
                    number: 1,
                    start: 2048,
                    sectors: 40960
                })
            ),
            (
                format!("{name}p2"),
                Some(lo.dev),
                Some(Partition {
                    number: 2,
                    start: 43008,
                    sectors: 61440
                })
            ),
        ]
    );
    let (p1, p2) = (parts[0].dev, parts[1].dev);
    // The devs the kernel gave the partitions, as their nodes show them.
    let p1_node = PathBuf::from(format!("/dev/{name}p1"));
    wait_for(&p1_node);
    assert_eq!(rdev(&p1_node), p1);
    for (sector, want) in [
        (0, lo.dev),
        (2047, lo.dev),
        (2048, p1),
        (43007, p1),
        (43008, p2),
        (104447, p2),
        (104448, lo.dev),
        (u64::MAX, lo.dev),
    ] {
        assert_eq!(t.partition_at(lo.dev, sector), want, "sector {sector}");
    }

    run("mkfs.ext4", &["-q", "-F", p(&p1_node)]);
    let m1 = root.join("m1");
    let m2 = root.join("m2");
    let _g1 = Mounted::new(&["-o", "errors=remount-ro", p(&p1_node)], &m1);
    let _g2 = Mounted::new(&["--bind", p(&m1)], &m2);

    let t = Topology::scan(&HostPaths::default()).unwrap();
    let on_p1 = t.mounts_of(p1);
    assert_eq!(points(&on_p1), BTreeSet::from([m1.clone(), m2.clone()]));
    assert_sorted_by_id(&on_p1);
    assert!(on_p1
        .iter()
        .all(|m| m.fs_type == "ext4" && !m.is_read_only()));
    assert!(t.mounts_of(p2).is_empty());
    // The disk reaches its partitions' mounts.
    assert_eq!(points(&t.affected_mounts(lo.dev)), points(&on_p1));
    assert_eq!(t.stacked_above(lo.dev), [lo.dev, p1, p2]);
    assert_eq!(t.mount_at(&m2).unwrap().dev, p1);
    assert_eq!(t.device_of_path(&m1.join("lost+found/x")), Some(p1));
    assert_eq!(t.device_of_path(&m2), Some(st_dev(&m2)));
    assert_eq!(t.filesystem_backing_devices(p1), [p1]);

    // Make ext4 hit an error (its own debug knob, no I/O failure needed)
    // and check that mountinfo's 6.18 shape is recognised as error-ro on
    // both mounts. This fires ext4_error for this loop partition only.
    fs::write(
        format!("/sys/fs/ext4/{name}p1/trigger_fs_error"),
        "topology test\n",
    )
    .unwrap();
    let t = Topology::scan(&HostPaths::default()).unwrap();
    let on_p1 = t.mounts_of(p1);
    assert_eq!(on_p1.len(), 2);
    for m in &on_p1 {
        assert!(m.is_error_read_only(), "{m:?}");
        assert!(m.is_read_only(), "{m:?}");
    }
    Ok(())
}

#[test]
fn real_btrfs_subvolumes_map_to_their_filesystem() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    let image = root.join("btrfs.img");
    fs::File::create(&image)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let lo = Loop::attach(&image, false);
    run("mkfs.btrfs", &["-q", "-f", p(&lo.node)]);
    let b1 = root.join("b1");
    let b2 = root.join("b2");
    let _g1 = Mounted::new(&[p(&lo.node)], &b1);
    run("btrfs", &["subvolume", "create", p(&b1.join("sv"))]);
    run("btrfs", &["subvolume", "create", p(&b1.join("unmounted"))]);
    let _g2 = Mounted::new(&["-o", "subvol=sv", p(&lo.node)], &b2);

    let t = Topology::scan(&HostPaths::default()).unwrap();
    let fs_dev = t.mount_at(&b1).unwrap().dev;
    assert!(fs_dev.is_anonymous(), "{fs_dev}");
    assert_eq!(t.mount_at(&b2).unwrap().dev, fs_dev);

    let top = st_dev(&b1);
    let sv = st_dev(&b2);
    assert_eq!(
        st_dev(&b1.join("sv")),
        sv,
        "a subvolume's dev is per subvolume, not per mount"
    );
    let unmounted = st_dev(&b1.join("unmounted"));
    eprintln!("btrfs on {}: mountinfo {fs_dev}, stat top-level {top}, stat sv {sv}, unmounted subvolume {unmounted}", lo.dev);

    let fs = t
        .btrfs_filesystems()
        .iter()
        .find(|f| f.fs_dev == fs_dev)
        .expect("btrfs filesystem discovered");
    assert_eq!(fs.devices, [lo.dev]);
    let fsid = fs.fsid.as_deref().expect("fsid from BTRFS_IOC_FS_INFO");
    assert!(Path::new("/sys/fs/btrfs").join(fsid).is_dir(), "{fsid}");
    for d in [top, sv] {
        if d != fs_dev {
            assert!(fs.subvolume_devs.contains(&d), "{d} not in {fs:?}");
        }
    }

    let both = BTreeSet::from([b1.clone(), b2.clone()]);
    for d in [fs_dev, top, sv, lo.dev] {
        let ms = t.mounts_of(d);
        assert_eq!(points(&ms), both, "mounts_of({d})");
        assert_sorted_by_id(&ms);
        assert_eq!(t.filesystem_backing_devices(d), [lo.dev], "backing of {d}");
        assert_eq!(t.filesystem_dev(d), if d == lo.dev { d } else { fs_dev });
    }
    assert_eq!(points(&t.affected_mounts(lo.dev)), both);

    // Documented gap: a subvolume only reachable through its parent's mount
    // is unknown by its stat dev, but found by path.
    if unmounted != fs_dev {
        assert!(t.mounts_of(unmounted).is_empty());
    }
    assert_eq!(t.device_of_path(&b1.join("unmounted/file")), Some(fs_dev));
    Ok(())
}

#[tokio::test(flavor = "current_thread")]
async fn real_mount_watcher_wakes_on_mount_and_umount() -> Result<()> {
    require_root()?;
    let dir = tempfile::tempdir().unwrap();
    let target = fs::canonicalize(dir.path()).unwrap().join("w");
    let paths = HostPaths::default();
    let mut watcher = MountWatcher::new(&paths).unwrap();
    assert_eq!(watcher.path(), paths.mountinfo());

    let present = |paths: &HostPaths, target: &Path| {
        read_mounts(paths)
            .unwrap()
            .iter()
            .any(|m| m.mount_point == target)
    };
    // Other mounts on this machine may wake us first; keep waiting until
    // the table shows ours, within the bound.
    async fn until(
        watcher: &mut MountWatcher,
        mut done: impl FnMut() -> bool,
    ) -> Result<(), tokio::time::error::Elapsed> {
        tokio::time::timeout(Duration::from_secs(1), async {
            loop {
                watcher.changed().await.unwrap();
                if done() {
                    return;
                }
            }
        })
        .await
    }

    let guard = Mounted::new(&["-t", "tmpfs", "topology-watch"], &target);
    until(&mut watcher, || present(&paths, &target))
        .await
        .expect("no wakeup within 1 s after mount");

    guard.unmount();
    until(&mut watcher, || !present(&paths, &target))
        .await
        .expect("no wakeup within 1 s after umount");
    Ok(())
}

#[test]
fn real_host_scan_sees_this_machine() -> Result<()> {
    require_root()?;
    let t = Topology::scan(&HostPaths::default()).unwrap();
    let root_dev = st_dev(Path::new("/"));
    assert_eq!(t.device_of_path(Path::new("/")), Some(root_dev));
    assert_eq!(t.mount_at(Path::new("/")).unwrap().dev, root_dev);
    assert!(t
        .device_of_path(Path::new("/proc/self"))
        .unwrap()
        .is_anonymous());
    Ok(())
}

/// A FUSE mount whose server never answers stands in for a hung btrfs
/// volume: a table line calls it btrfs, and statx, open and the ioctl
/// on it hang exactly as they would on a stuck btrfs. Needs root.
#[test]
fn a_hung_mount_point_is_bounded_remembered_and_falls_back_to_the_source() -> Result<()> {
    require_root()?;
    let mut fuse = health_tests::HungFuse::in_temp_dir().unwrap();
    let path = fuse.path().to_path_buf();
    let host = HostPaths::default();
    let (mount_id, fuse_dev) = read_mounts(&host)
        .unwrap()
        .iter()
        .rev()
        .find(|m| m.mount_point == path)
        .map(|m| (m.mount_id, m.dev))
        .expect("the FUSE mount is in the mount table");
    let tmp = tempfile::tempdir().unwrap();
    let sys = fake_sys_with_loop0(tmp.path());
    // Two mounts of the same (hung) filesystem: the second, a path
    // under the first, would hang as well.
    let table = parse_mountinfo(&format!(
        "{mount_id} 1 0:77 / {p} rw - btrfs /dev/loop0 rw,subvol=/\n\
         999999 1 0:77 /sv {p}/sv rw - btrfs /dev/loop0 rw,subvol=/sv\n",
        p = path.display()
    ))
    .unwrap();
    let bound = ProbeBound {
        in_flight: InFlight::default(),
        timeout: Duration::from_millis(300),
    };
    let expected = vec![BtrfsFilesystem {
        fsid: Some(FSID.into()),
        fs_dev: Dev::new(0, 77),
        devices: vec![Dev::new(7, 0)],
        subvolume_devs: vec![],
    }];
    assert_eq!(
        discover_bounded(&table, Path::new("/"), &sys, &bound),
        expected
    );
    // One thread stuck, on the first mount; the second was not probed.
    assert_eq!(bound.in_flight.len(), 1);
    let since = match probe_mount(&bound, Path::new("/"), &table[0], true) {
        MountProbe::Hung { since, new: false } => since,
        other => panic!("expected the remembered hang, got {other:?}"),
    };
    // The next scan is answered from the in-flight set: same result, no
    // new thread, the same stuck probe.
    assert_eq!(
        discover_bounded(&table, Path::new("/"), &sys, &bound),
        expected
    );
    assert_eq!(bound.in_flight.len(), 1);
    assert_eq!(
        probe_mount(&bound, Path::new("/"), &table[0], true),
        MountProbe::Hung { since, new: false }
    );

    // The server dies: the stuck thread returns (ENOTCONN) and ends
    // its claim; the mount point answers statx again (an aborted FUSE
    // connection keeps the root's attributes) but it is no btrfs, so
    // no fsid.
    fuse.abort();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !bound.in_flight.is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the probe never returned"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        probe_mount(&bound, Path::new("/"), &table[0], true),
        MountProbe::Reached {
            dev: fuse_dev,
            fsid: None
        }
    );
    Ok(())
}

const FSID: &str = "86d21f04-cbec-4a2a-8225-86cca36728f8";

/// A sysfs with block device loop0 (7:0), the one member of [`FSID`].
fn fake_sys_with_loop0(dir: &Path) -> PathBuf {
    let sys = dir.join("sys");
    let loop0 = sys.join("devices/virtual/block/loop0");
    fs::create_dir_all(&loop0).unwrap();
    fs::write(loop0.join("dev"), "7:0\n").unwrap();
    let members = sys.join("fs/btrfs").join(FSID).join("devices");
    fs::create_dir_all(&members).unwrap();
    std::os::unix::fs::symlink(&loop0, members.join("loop0")).unwrap();
    sys
}
