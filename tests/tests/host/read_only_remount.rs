//! `ReadOnlyRemount` on real kernels: ext4 made to fail for real under
//! `errors=remount-ro`, and xfs shut down by failed log writes, seen through
//! the built-in checks (`health_node::volumes::checks`) and `health-agent
//! volumes --json`; volumes read-only on purpose beside them stay healthy.
//!
//! Each kernel shows the error remount its own way (see
//! `volumes::checks::read_only` in health-node): [`ext4_evidence`] says
//! which evidence each kernel this suite runs on gives, and a kernel not
//! in it fails the suite until it is measured. Run in the guests with
//! `cargo xtask vm --kernel 6.1 --tests read_only_remount` (and 5.10, 6.12).
//! These tests need root and fail (not skip) without it.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use health_core::conditions::{CheckFinding, CheckKind, CheckResult, ReadOnlyEvidence};
use health_node::volumes::checks::mount_time::{ext4_mount_time, journal_thread_by_name};
use health_node::volumes::checks::{CheckConfig, CheckReport, Checker};
use health_node::volumes::kubelet::{KubeletVolume, VolumeKind, VolumeMode};
use health_tests::agent::volumes_json;
use health_tests::sys::{mount_at, wait_for};
use health_tests::vm_report::kernel_release;
use health_tests::{fs, require_env, FaultDisk, LoopDevice, Mount, Op, Rule};
use health_topology::{read_mounts, HostPaths, MountEntry};
use serde_json::Value;
use tempfile::TempDir;

const MIB: u64 = 1 << 20;
const EIO: i32 = libc::EIO;

const POD_RW: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
const POD_RO_BIND: &str = "0b0b0b0b-0000-4000-8000-00000000000b";
const POD_RO_MOUNT: &str = "0c0c0c0c-0000-4000-8000-00000000000c";

/// What this kernel shows after an ext4 error under errors=remount-ro,
/// by series (`major.minor` of the running kernel), as measured.
fn ext4_evidence() -> ReadOnlyEvidence {
    let release = kernel_release();
    let mut numbers = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|n| n.parse::<u32>().unwrap_or(0));
    let series = (numbers.next().unwrap_or(0), numbers.next().unwrap_or(0));
    match series {
        // Still sets SB_RDONLY (5.10.262).
        (5, 10) => ReadOnlyEvidence::SuperBlockReadOnly,
        // Debian's 6.1 is 6.1.113 or later: only the journal is aborted.
        (6, 1) => ReadOnlyEvidence::ErrorsSinceMount,
        // Shut down, no option printed (6.12.118).
        (6, 12) => ReadOnlyEvidence::ShutdownProbe { op: "getxattr" },
        (6, minor) if minor >= 15 => ReadOnlyEvidence::EmergencyRo,
        (7.., _) => ReadOnlyEvidence::EmergencyRo,
        _ => panic!(
            "no measured ext4 error-remount behaviour for kernel {release}: measure it \
             (health-node volumes::checks::read_only) and add it to ext4_evidence"
        ),
    }
}

/// The errno of a write once the error stopped the filesystem: EIO where
/// it is shut down (6.12), EROFS elsewhere.
fn refused_write_errno(evidence: ReadOnlyEvidence) -> i32 {
    match evidence {
        ReadOnlyEvidence::ShutdownProbe { .. } => EIO,
        _ => libc::EROFS,
    }
}

/// A kubelet-like tree of local PVs (`pods/<uid>/volumes/
/// kubernetes.io~local-volume/<pv>`, bind mounts of the PV's mount) over
/// fault disks. Torn down in reverse: mounts, loop devices, fault disks.
struct Tree {
    root: TempDir,
    mounts: Vec<Mount>,
    loops: Vec<LoopDevice>,
    disks: Vec<FaultDisk>,
}

impl Drop for Tree {
    fn drop(&mut self) {
        while let Some(m) = self.mounts.pop() {
            drop(m);
        }
        while let Some(l) = self.loops.pop() {
            drop(l);
        }
        self.disks.clear();
    }
}

impl Tree {
    fn new() -> Result<Tree> {
        Ok(Tree {
            root: tempfile::Builder::new().prefix("kubelet-").tempdir()?,
            mounts: Vec::new(),
            loops: Vec::new(),
            disks: Vec::new(),
        })
    }

    fn root_arg(&self) -> &str {
        self.root.path().to_str().expect("temp paths are UTF-8")
    }

    /// A fault disk with a loop device; returns its index.
    fn disk(&mut self, size: u64) -> Result<usize> {
        let disk = FaultDisk::start(size)?;
        self.loops.push(disk.attach_loop(false)?);
        self.disks.push(disk);
        Ok(self.loops.len() - 1)
    }

    /// A filesystem on disk `i` mounted with `options` at the PV's local
    /// path; returns that path.
    fn local_pv(&mut self, i: usize, fstype: &str, options: &str, pv: &str) -> Result<PathBuf> {
        let dev = self.loops[i].path().to_path_buf();
        match fstype {
            "ext4" => fs::mkfs_ext4(&dev)?,
            "xfs" => fs::mkfs_xfs(&dev)?,
            other => bail!("no mkfs for {other}"),
        }
        let local = self.root.path().join("local").join(pv);
        std::fs::create_dir_all(&local)?;
        self.mounts.push(Mount::at(&dev, &local, fstype, options)?);
        Ok(local)
    }

    /// The pod's volume: a bind mount of `local`, read-only as kubelet
    /// makes a `readOnly: true` volume when `read_only`.
    fn publish(&mut self, pod: &str, pv: &str, local: &Path, read_only: bool) -> Result<PathBuf> {
        let target = self
            .root
            .path()
            .join("pods")
            .join(pod)
            .join("volumes/kubernetes.io~local-volume")
            .join(pv);
        std::fs::create_dir_all(&target)?;
        let options = if read_only { "bind,ro" } else { "bind" };
        self.mounts
            .push(Mount::at(local, &target, "none", options)?);
        Ok(target)
    }
}

fn volume(path: &Path) -> KubeletVolume {
    KubeletVolume {
        pod_uid: "pod".into(),
        pv: Some("pv".into()),
        pod_volume_dir_name: "pv".into(),
        driver: None,
        volume_handle: None,
        volume_mode: VolumeMode::Filesystem,
        kind: VolumeKind::LocalVolume,
        path: path.to_path_buf(),
        staging_path: None,
        node_name: None,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

fn mounts() -> Vec<MountEntry> {
    read_mounts(&HostPaths::default()).expect("read the mount table")
}

/// The read-only check's result for the volume at `path`.
fn read_only_result(rt: &tokio::runtime::Runtime, checker: &Checker, path: &Path) -> CheckResult {
    let report: CheckReport = rt.block_on(checker.check_volume(&volume(path), &mounts()));
    report
        .result(CheckKind::ReadOnly)
        .cloned()
        .unwrap_or_else(|| panic!("no read-only result for {}: {report:#?}", path.display()))
}

/// The finding the check must give for the volume at `path`.
fn remount(path: &Path, fs_type: &str, evidence: ReadOnlyEvidence) -> Result<CheckFinding> {
    let entry = mounts()
        .into_iter()
        .rev()
        .find(|m| m.mount_point == path)
        .with_context(|| format!("{} is not mounted", path.display()))?;
    Ok(CheckFinding::ReadOnlyRemount {
        mount_point: path.to_path_buf(),
        device: entry.dev,
        fs_type: fs_type.into(),
        evidence,
    })
}

/// What userspace sees of the mount at `path`: its mountinfo line and the
/// statvfs flags (printed for the per-kernel record in the report).
fn seen(path: &Path) -> Result<String> {
    let info = mount_at(path)?.with_context(|| format!("{} is not mounted", path.display()))?;
    let flags = nix::sys::statvfs::statvfs(path)?.flags();
    Ok(format!(
        "mount {} super {} statvfs {}",
        info.mount_options,
        info.super_options,
        if flags.contains(nix::sys::statvfs::FsFlags::ST_RDONLY) {
            "ST_RDONLY"
        } else {
            "rw"
        }
    ))
}

/// What one round of checks costs on the healthy ext4 volume at `ext4`
/// and on a tmpfs (which the read-only check judges by its flags alone):
/// the difference is what steps 2 and 3 of the read-only check add.
fn round_cost(rt: &tokio::runtime::Runtime, checker: &Checker, ext4: &Path) -> Result<String> {
    let tmpfs = Mount::new("tmpfs", "tmpfs", "size=1m")?;
    let table = mounts();
    let per_round = |path: &Path| {
        let vol = volume(path);
        let rounds = 2000;
        let started = Instant::now();
        for _ in 0..rounds {
            let report = rt.block_on(checker.check_volume(&vol, &table));
            assert_eq!(report.result(CheckKind::ReadOnly), Some(&CheckResult::Pass));
        }
        started.elapsed() / rounds
    };
    let (on_ext4, on_tmpfs) = (per_round(ext4), per_round(tmpfs.path()));
    Ok(format!(
        "one round of checks (mount table read once): ext4 {on_ext4:?}, tmpfs {on_tmpfs:?}; \
         the read-only probes add {:?} per ext4 volume",
        on_ext4.saturating_sub(on_tmpfs)
    ))
}

fn find<'a>(vols: &'a [Value], pod: &str) -> &'a Value {
    vols.iter()
        .find(|v| v["pod_uid"] == pod)
        .unwrap_or_else(|| panic!("no volume of pod {pod} in {vols:#?}"))
}

/// (status, reason, source, message) of each condition of `v`.
fn conditions(v: &Value) -> Vec<[String; 4]> {
    let field = |c: &Value, k: &str| c[k].as_str().unwrap_or("?").to_string();
    v["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    [
                        field(c, "status"),
                        field(c, "reason"),
                        field(c, "source"),
                        field(c, "message"),
                    ]
                })
                .collect()
        })
        .unwrap_or_default()
}

fn read_only_condition(finding: &CheckFinding) -> [String; 4] {
    [
        "Inaccessible".into(),
        "ReadOnlyRemount".into(),
        "check/read-only".into(),
        finding.message(),
    ]
}

/// Fails every write of disk `i` until the filesystem on it gives up: a
/// write and fsync fail (the journal commit with them), later writes meet
/// the aborted journal. Writes until one is refused with `want`; returns
/// every refusal's errno in order. Where ext4 shuts down (6.6 to 6.14), a
/// write may meet the aborted journal (EROFS) before ext4's error handling
/// has set the shutdown flag (EIO from then on).
fn fail_writes_until_refused(tree: &Tree, i: usize, dir: &Path, want: i32) -> Result<Vec<i32>> {
    tree.disks[i].add_rule(Rule::new(Op::Write, EIO))?;
    let mut f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(dir.join("doomed"))?;
    f.write_all(&[0x5a; 64 * 1024])?;
    let err = f
        .sync_all()
        .expect_err("fsync onto a failing disk must fail");
    assert_eq!(err.raw_os_error(), Some(EIO), "{err}");
    drop(f);
    let mut refusals = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while refusals.last() != Some(&want) && Instant::now() < deadline {
        match std::fs::write(dir.join("after"), b"x") {
            Ok(()) => std::thread::sleep(Duration::from_millis(200)),
            Err(e) => {
                refusals.push(e.raw_os_error().unwrap_or(0));
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    tree.disks[i].clear_rules()?;
    anyhow::ensure!(
        refusals.last() == Some(&want),
        "no write refused with errno {want} within 20 s after the journal failed; refusals: {refusals:?}"
    );
    Ok(refusals)
}

#[test]
fn ext4_error_remount_is_read_only_remount_on_every_kernel() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    require_env(&[])?;
    let evidence = ext4_evidence();
    let mut tree = Tree::new()?;
    let sick = tree.disk(64 * MIB)?;
    let local = tree.local_pv(sick, "ext4", "errors=remount-ro", "pv-sick")?;
    let rw = tree.publish(POD_RW, "pv-sick", &local, false)?;
    let ro_bind = tree.publish(POD_RO_BIND, "pv-sick", &local, true)?;
    // Read-only on purpose from the start, on a disk of its own.
    let other = tree.disk(64 * MIB)?;
    let local_ro = tree.local_pv(other, "ext4", "ro,errors=remount-ro", "pv-ro")?;
    let ro_mount = tree.publish(POD_RO_MOUNT, "pv-ro", &local_ro, false)?;
    std::fs::write(rw.join("before"), b"data")?;
    fs::sync_fs(&rw)?;

    let rt = runtime();
    let checker = Checker::new(CheckConfig::default());
    for path in [&rw, &ro_bind, &ro_mount] {
        eprintln!("before: {}: {}", path.display(), seen(path)?);
        assert_eq!(read_only_result(&rt, &checker, path), CheckResult::Pass);
    }
    eprintln!("{}", round_cost(&rt, &checker, &rw)?);
    let (vols, _, stderr) = volumes_json(tree.root_arg(), &["--check-timeout", "5"])?;
    for pod in [POD_RW, POD_RO_BIND, POD_RO_MOUNT] {
        assert_eq!(
            conditions(find(&vols, pod)),
            Vec::<[String; 4]>::new(),
            "{stderr}"
        );
    }

    let want = refused_write_errno(evidence);
    let refusals = fail_writes_until_refused(&tree, sick, &rw, want)?;
    // Before the final errno, only the aborted journal's EROFS.
    assert!(
        refusals[..refusals.len() - 1]
            .iter()
            .all(|e| *e == libc::EROFS),
        "kernel {}: refusals {refusals:?}",
        kernel_release()
    );
    for path in [&rw, &ro_bind, &ro_mount] {
        eprintln!("after: {}: {}", path.display(), seen(path)?);
    }
    // The filesystem's own state, for each of its mounts; the volume that is
    // read-only on purpose stays healthy.
    let want_rw = remount(&rw, "ext4", evidence)?;
    let want_ro_bind = remount(&ro_bind, "ext4", evidence)?;
    let found = |f: &CheckFinding| CheckResult::Found(vec![f.clone()]);
    assert_eq!(read_only_result(&rt, &checker, &rw), found(&want_rw));
    assert_eq!(
        read_only_result(&rt, &checker, &ro_bind),
        // 5.10's SB_RDONLY under a read-only bind looks like `mount -o ro`.
        if evidence == ReadOnlyEvidence::SuperBlockReadOnly {
            CheckResult::Pass
        } else {
            found(&want_ro_bind)
        }
    );
    assert_eq!(
        read_only_result(&rt, &checker, &ro_mount),
        CheckResult::Pass
    );

    let (vols, _, stderr) = volumes_json(tree.root_arg(), &["--check-timeout", "5"])?;
    let v = find(&vols, POD_RW);
    let read_only: Vec<_> = conditions(v)
        .into_iter()
        .filter(|c| c[2] == "check/read-only")
        .collect();
    assert_eq!(
        read_only,
        [read_only_condition(&want_rw)],
        "{v:#}\n{stderr}"
    );
    assert_eq!(v["worst"], "Inaccessible");
    assert_eq!(
        conditions(find(&vols, POD_RO_MOUNT)),
        Vec::<[String; 4]>::new()
    );
    Ok(())
}

#[test]
fn xfs_shutdown_is_read_only_remount() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    require_env(&[])?;
    let mut tree = Tree::new()?;
    // mkfs.xfs refuses filesystems below 300 MB; the image is sparse.
    let sick = tree.disk(320 * MIB)?;
    let local = tree.local_pv(sick, "xfs", "", "pv-xfs")?;
    let rw = tree.publish(POD_RW, "pv-xfs", &local, false)?;
    let rt = runtime();
    let checker = Checker::new(CheckConfig::default());
    eprintln!("before: {}", seen(&rw)?);
    assert_eq!(read_only_result(&rt, &checker, &rw), CheckResult::Pass);

    // The log write fails: xfs shuts down at once.
    tree.disks[sick].add_rule(Rule::new(Op::Write, EIO))?;
    std::fs::write(rw.join("doomed"), b"x")?;
    let _ = fs::sync_fs(&rw);
    let down = wait_for(Duration::from_secs(30), Duration::from_millis(200), || {
        std::fs::write(rw.join("probe"), b"").is_err()
    });
    tree.disks[sick].clear_rules()?;
    assert!(down, "xfs still takes writes 30 s after its log failed");
    eprintln!("after: {}", seen(&rw)?);

    let want = remount(
        &rw,
        "xfs",
        ReadOnlyEvidence::ShutdownProbe { op: "getxattr" },
    )?;
    assert_eq!(
        read_only_result(&rt, &checker, &rw),
        CheckResult::Found(vec![want.clone()])
    );
    let (vols, _, stderr) = volumes_json(tree.root_arg(), &["--check-timeout", "5"])?;
    let v = find(&vols, POD_RW);
    let read_only: Vec<_> = conditions(v)
        .into_iter()
        .filter(|c| c[2] == "check/read-only")
        .collect();
    assert_eq!(read_only, [read_only_condition(&want)], "{v:#}\n{stderr}");
    Ok(())
}

#[test]
fn trigger_fs_error_and_remount_ro_on_purpose() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    require_env(&[])?;
    let evidence = ext4_evidence();
    let mut tree = Tree::new()?;
    let i = tree.disk(64 * MIB)?;
    let local = tree.local_pv(i, "ext4", "errors=remount-ro", "pv-trip")?;
    let rw = tree.publish(POD_RW, "pv-trip", &local, false)?;
    let rt = runtime();
    let checker = Checker::new(CheckConfig::default());

    // Remounted read-only by someone, and back: never a finding.
    for path in [&local, &rw] {
        let options = if path == &local {
            "remount,ro"
        } else {
            "remount,bind,ro"
        };
        health_tests::cmd::run("mount", &["-o", options, path.to_str().unwrap()])?;
        eprintln!(
            "remounted ro on purpose: {}: {}; the pod's bind: {}",
            path.display(),
            seen(path)?,
            seen(&rw)?
        );
        assert_eq!(read_only_result(&rt, &checker, &rw), CheckResult::Pass);
        let back = if path == &local {
            "remount,rw"
        } else {
            "remount,bind,rw"
        };
        health_tests::cmd::run("mount", &["-o", back, path.to_str().unwrap()])?;
    }

    // The kernel's own error path, without I/O errors.
    let trigger = format!("/sys/fs/ext4/{}/trigger_fs_error", tree.loops[i].name());
    std::fs::write(&trigger, "1").with_context(|| trigger.clone())?;
    eprintln!("after trigger_fs_error: {}", seen(&rw)?);
    assert_eq!(
        read_only_result(&rt, &checker, &rw),
        CheckResult::Found(vec![remount(&rw, "ext4", evidence)?])
    );
    let err = std::fs::write(rw.join("x"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(refused_write_errno(evidence)));
    Ok(())
}

#[test]
fn the_journal_thread_dates_the_mount() -> Result<()> {
    // It fails requests: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    require_env(&[])?;
    let mut tree = Tree::new()?;
    let i = tree.disk(64 * MIB)?;
    let before = SystemTime::now();
    let local = tree.local_pv(i, "ext4", "", "pv-clock")?;
    let after = SystemTime::now();
    let name = tree.loops[i].name().to_string();
    let (sys, proc_root) = (Path::new("/sys"), Path::new("/proc"));

    // Found by name, it is the thread journal_task names (same namespace).
    let by_name = journal_thread_by_name(proc_root, &name)?;
    let task = std::fs::read_to_string(format!("/sys/fs/ext4/{name}/journal_task"))?;
    assert_eq!(by_name.to_string(), task.trim());
    let mounted = ext4_mount_time(sys, proc_root, &name)?.context("ext4 has a journal")?;
    // Whole seconds, from boot time plus clock ticks.
    let floor = |t: SystemTime| {
        t - Duration::from_nanos(
            t.duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
                .into(),
        )
    };
    assert!(
        mounted >= floor(before) - Duration::from_secs(1) && mounted <= after,
        "mounted {mounted:?}, mount ran from {before:?} to {after:?}"
    );
    assert!(local.is_dir());
    Ok(())
}
