//! The built-in volume checks (`health_node::volumes::checks`) against the
//! real kernel: loop devices, ext4 filled to the brim, error remounts, a hung
//! FUSE mount, block volumes. They need root and fail (not skip) without it.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use health_core::conditions::{CheckFinding, CheckKind, CheckResult, Status, VolumeHealth};
use health_core::dev::Dev;
use health_node::volumes::checks::{CheckConfig, CheckReport, Checker, Usage};
use health_node::volumes::kubelet::{KubeletVolume, VolumeKind, VolumeMode};
use health_tests::sys::require_root;
use health_topology::{read_mounts, HostPaths, MountEntry};
use nix::errno::Errno;
use nix::mount::{umount2, MntFlags};

fn cfg() -> CheckConfig {
    CheckConfig::default()
}

fn fs_volume(path: PathBuf) -> KubeletVolume {
    KubeletVolume {
        pod_uid: "pod".into(),
        pv: Some("pv".into()),
        pod_volume_dir_name: "pv".into(),
        driver: None,
        volume_handle: None,
        volume_mode: VolumeMode::Filesystem,
        kind: VolumeKind::LocalVolume,
        path,
        staging_path: None,
        node_name: None,
    }
}

fn block_volume(path: PathBuf) -> KubeletVolume {
    KubeletVolume {
        volume_mode: VolumeMode::Block,
        ..fs_volume(path)
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn mounts() -> Vec<MountEntry> {
    read_mounts(&HostPaths::default()).expect("read the mount table")
}

/// A loop device over a sparse image in a temp dir, optionally with a
/// mounted ext4; torn down in reverse on drop, also after a failure.
struct LoopFs {
    dir: tempfile::TempDir,
    device: Option<String>,
    mounted: bool,
}

impl LoopFs {
    fn device(size_mib: u64) -> LoopFs {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        fs::File::create(&image)
            .and_then(|f| f.set_len(size_mib << 20))
            .unwrap();
        let mut me = LoopFs {
            dir,
            device: None,
            mounted: false,
        };
        me.device = Some(run("losetup", &["-f", "--show", image.to_str().unwrap()]));
        me
    }

    /// ext4 with 1 KiB blocks and no root reserve, so that statvfs
    /// numbers are simple; lazy init off so that nothing changes
    /// free counts behind the test's back.
    fn ext4(size_mib: u64, extra_mkfs: &[&str], options: &str) -> LoopFs {
        let mut me = LoopFs::device(size_mib);
        let dev = me.dev_path().to_string();
        let mut args = vec![
            "-q",
            "-F",
            "-b",
            "1024",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=0,lazy_journal_init=0",
        ];
        args.extend_from_slice(extra_mkfs);
        args.push(&dev);
        run("mkfs.ext4", &args);
        let mnt = me.mount_point();
        fs::create_dir(&mnt).unwrap();
        run(
            "mount",
            &["-t", "ext4", "-o", options, &dev, mnt.to_str().unwrap()],
        );
        me.mounted = true;
        me
    }

    fn dev_path(&self) -> &str {
        self.device.as_deref().expect("loop device attached")
    }

    fn mount_point(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        if self.mounted {
            let mnt = self.mount_point();
            if umount2(&mnt, MntFlags::empty()).is_err() {
                let _ = umount2(&mnt, MntFlags::MNT_DETACH);
            }
        }
        if let Some(dev) = &self.device {
            let _ = Command::new("losetup").args(["-d", dev]).status();
        }
    }
}

fn statvfs_usage(path: &Path) -> Usage {
    Usage::from_statvfs(&nix::sys::statvfs::statvfs(path).unwrap())
}

/// Allocates `bytes` in a new file (rounded down to whole KiB).
fn fallocate(path: &Path, bytes: u64) -> nix::Result<()> {
    let f = fs::File::create(path).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(0)))?;
    nix::fcntl::fallocate(
        &f,
        nix::fcntl::FallocateFlags::empty(),
        0,
        (bytes & !1023) as libc::off_t,
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn healthy_ext4_has_no_findings() -> Result<()> {
    require_root()?;
    let fs = LoopFs::ext4(16, &[], "errors=remount-ro");
    let vol = fs_volume(fs.mount_point());
    let report = runtime().block_on(Checker::new(cfg()).check_volume(&vol, &mounts()));
    let kinds: Vec<CheckKind> = report.results.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        kinds,
        [
            CheckKind::Mount,
            CheckKind::ReadOnly,
            CheckKind::Reachability,
            CheckKind::Capacity
        ]
    );
    assert!(
        report.results.iter().all(|(_, r)| *r == CheckResult::Pass),
        "{report:#?}"
    );
    Ok(())
}

#[test]
fn filled_ext4_is_low_then_exhausted_with_exact_numbers() -> Result<()> {
    require_root()?;
    let fs = LoopFs::ext4(16, &[], "errors=remount-ro");
    let mnt = fs.mount_point();
    let vol = fs_volume(mnt.clone());
    let checker = Checker::new(cfg());
    let rt = runtime();

    // Leave about 3 % free.
    let u = statvfs_usage(&mnt);
    let keep = u.total_bytes * 3 / 100;
    fallocate(&mnt.join("ballast"), u.free_bytes - keep).unwrap();
    let report = rt.block_on(checker.check_volume(&vol, &mounts()));
    let u = statvfs_usage(&mnt);
    assert!(
        u.free_bytes > 0 && u.free_bytes * 100 < u.total_bytes * 5,
        "{u:?}"
    );
    let expected = CheckFinding::CapacityLow {
        free_bytes: u.free_bytes,
        total_bytes: u.total_bytes,
        threshold_percent: 5.0,
    };
    assert_eq!(report.findings(), [&expected], "{report:#?}");
    let msg = expected.message();
    assert!(
        msg.starts_with(&format!("{} of {} bytes free", u.free_bytes, u.total_bytes)),
        "{msg}"
    );

    // To the brim: allocate until the filesystem says no.
    let mut chunk = u.free_bytes;
    let mut n = 0;
    while chunk >= 1024 {
        n += 1;
        if fallocate(&mnt.join(format!("brim{n}")), chunk).is_err() {
            chunk /= 2;
        }
    }
    let report = rt.block_on(checker.check_volume(&vol, &mounts()));
    let u = statvfs_usage(&mnt);
    assert_eq!(u.free_bytes, 0, "{u:?}");
    let expected = CheckFinding::CapacityExhausted {
        total_bytes: u.total_bytes,
    };
    assert_eq!(report.findings(), [&expected], "{report:#?}");
    assert_eq!(
        expected.message(),
        format!(
            "0 of {} bytes free ({}): no space left",
            u.total_bytes,
            health_core::conditions::human_bytes(u.total_bytes)
        )
    );

    // Into the machine: one change, then silence.
    let mut health = VolumeHealth::default();
    let now = SystemTime::now();
    let raised: Vec<_> = report
        .clone()
        .into_observations()
        .into_iter()
        .flat_map(|o| health.apply(now, o))
        .collect();
    assert_eq!(raised.len(), 1, "{raised:?}");
    assert_eq!(health.worst(), Some(Status::Degraded));
    for o in report.into_observations() {
        assert!(health.apply(now, o).is_empty());
    }
    Ok(())
}

#[test]
fn inodes_exhausted() -> Result<()> {
    require_root()?;
    let fs = LoopFs::ext4(8, &["-N", "64"], "errors=remount-ro");
    let mnt = fs.mount_point();
    let mut n = 0;
    while fs::File::create(mnt.join(format!("f{n}"))).is_ok() {
        n += 1;
        assert!(n < 10_000, "inodes never ran out");
    }
    let report =
        runtime().block_on(Checker::new(cfg()).check_volume(&fs_volume(mnt.clone()), &mounts()));
    let u = statvfs_usage(&mnt);
    assert_eq!(
        report.findings(),
        [&CheckFinding::InodesExhausted {
            total: u.total_inodes
        }],
        "{report:#?}"
    );
    Ok(())
}

#[test]
fn hung_path_is_path_hung_and_never_probed_twice() -> Result<()> {
    require_root()?;
    let mut fuse = health_tests::HungFuse::in_temp_dir().unwrap();
    let vol = fs_volume(fuse.path().to_path_buf());
    let timeout = Duration::from_millis(1500);
    let checker = Checker::new(CheckConfig { timeout, ..cfg() });
    let rt = runtime();
    let table = mounts();

    let started = Instant::now();
    let first = rt.block_on(checker.check_volume(&vol, &table));
    let took = started.elapsed();
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "{took:?}"
    );
    let hung = match first.result(CheckKind::Reachability) {
        Some(CheckResult::Found(f)) if f[0].reason() == "PathHung" => f[0].clone(),
        other => panic!("expected PathHung, got {other:?} in {first:#?}"),
    };
    assert!(hung.message().contains("statvfs of"), "{}", hung.message());
    // Capacity cannot be judged while the path hangs: no result.
    assert_eq!(first.result(CheckKind::Capacity), None);
    assert_eq!(first.result(CheckKind::Mount), Some(&CheckResult::Pass));
    assert_eq!(checker.stuck_probes(), 1);

    // The probe is still stuck: answered at once, no second thread,
    // the same finding (same message: no write churn).
    let started = Instant::now();
    let second = rt.block_on(checker.check_volume(&vol, &table));
    assert!(started.elapsed() < Duration::from_millis(200));
    assert_eq!(
        second.result(CheckKind::Reachability),
        Some(&CheckResult::Found(vec![hung]))
    );
    assert_eq!(checker.stuck_probes(), 1);

    // The daemon goes away: the stuck thread comes back...
    fuse.abort();
    let deadline = Instant::now() + Duration::from_secs(5);
    while checker.stuck_probes() > 0 {
        assert!(Instant::now() < deadline, "stuck probe never returned");
        std::thread::sleep(Duration::from_millis(20));
    }
    // ...and the path now fails outright.
    let third = rt.block_on(checker.check_volume(&vol, &table));
    match third.result(CheckKind::Reachability) {
        Some(CheckResult::Found(f)) => assert_eq!(
            f[0],
            CheckFinding::PathUnreachable {
                path: fuse.path().to_path_buf(),
                op: "statvfs",
                errno: libc::ENOTCONN
            }
        ),
        other => panic!("expected PathUnreachable, got {other:?}"),
    }
    drop(fuse);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

#[test]
fn block_volume_device_checks() -> Result<()> {
    require_root()?;
    let disk = LoopFs::device(4);
    let tmp = tempfile::tempdir().unwrap();
    let checker = Checker::new(cfg());
    let rt = runtime();

    // Kubelet's shape: a symlink to the device node.
    let link = tmp.path().join("pv-blk");
    std::os::unix::fs::symlink(disk.dev_path(), &link).unwrap();
    let report = rt.block_on(checker.check_volume(&block_volume(link.clone()), &[]));
    assert_eq!(
        report.results,
        [
            (CheckKind::Reachability, CheckResult::Pass),
            (CheckKind::Device, CheckResult::Pass)
        ]
    );

    let device = |r: &CheckReport| match r.result(CheckKind::Device) {
        Some(CheckResult::Found(f)) => f[0].clone(),
        other => panic!("expected a device finding, got {other:?}"),
    };

    // A device number the kernel does not have.
    let ghost = tmp.path().join("ghost");
    nix::sys::stat::mknod(
        &ghost,
        nix::sys::stat::SFlag::S_IFBLK,
        nix::sys::stat::Mode::from_bits_truncate(0o600),
        libc::makedev(7, 1_000_000),
    )
    .unwrap();
    let f = device(&rt.block_on(checker.check_volume(&block_volume(ghost.clone()), &[])));
    assert_eq!(f.reason(), "DeviceMissing");
    assert!(
        f.message().contains("no block device 7:1000000"),
        "{}",
        f.message()
    );

    // Zero size, as sysfs says it (a fake sys root keeps this
    // deterministic: real loop devices get grabbed by others).
    let sys = tempfile::tempdir().unwrap();
    let ghost_dir = sys.path().join("dev/block/7:1000000");
    fs::create_dir_all(&ghost_dir).unwrap();
    fs::write(ghost_dir.join("size"), "0\n").unwrap();
    let fake = Checker::new(CheckConfig {
        sys_root: sys.path().to_path_buf(),
        ..cfg()
    });
    let f = device(&rt.block_on(fake.check_volume(&block_volume(ghost.clone()), &[])));
    assert_eq!(
        f,
        CheckFinding::DeviceZeroSize {
            path: ghost.clone(),
            device: Dev::new(7, 1_000_000)
        }
    );

    // The pod's link dangles, or points at something else.
    fs::remove_file(&ghost).unwrap();
    std::os::unix::fs::symlink(&ghost, tmp.path().join("dangling")).unwrap();
    let f =
        device(&rt.block_on(checker.check_volume(&block_volume(tmp.path().join("dangling")), &[])));
    assert_eq!(f.reason(), "DeviceMissing");
    assert!(f.message().contains("ENOENT"), "{}", f.message());
    let file = tmp.path().join("file");
    fs::write(&file, "").unwrap();
    let f = device(&rt.block_on(checker.check_volume(&block_volume(file), &[])));
    assert!(
        f.message().contains("not a block device"),
        "{}",
        f.message()
    );
    Ok(())
}
