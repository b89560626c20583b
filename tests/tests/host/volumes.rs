//! Pod volumes against the real kernel: a kubelet-like tree in a temp root,
//! with real loop-mounted filesystems over fault disks bind-mounted where
//! kubelet puts them, a real block-mode device node, in-process CSI drivers
//! of every generation, and the real agent binary.
//!
//! Layout made here (relative to the temp kubelet root), as kubelet makes it:
//! - staging: `plugins/kubernetes.io/csi/pv/<pv>/globalmount` (the older
//!   layout, with `vol_data.json` beside it), the filesystem mounted there;
//! - filesystem volumes: `pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`, a
//!   bind mount of the staging mount, `vol_data.json` beside `mount`;
//! - block volumes: `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`, a
//!   device node, metadata in
//!   `plugins/kubernetes.io/csi/volumeDevices/<pv>/data/vol_data.json`;
//! - local PVs: `pods/<uid>/volumes/kubernetes.io~local-volume/<pv>`;
//! - CSI node plugins: `plugins/<driver>/csi.sock`.
//!
//! These tests need root and fail (not skip) without it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_csi::testing::{DriverMode, Rpc, TestDriver, TestDriverHandle};
use health_csi::{AccessType, HealthEntry, HealthStatus, StorageHealthEntry, StorageHealthStatus};
use health_tests::agent::{agent_bin, no_pins, volumes_json, Agent};
use health_tests::bpffs::Bpffs;
use health_tests::{fs, require_env, FaultDisk, HungFuse, LoopDevice, Mount, Op, Rule};
use serde_json::{json, Value};
use tempfile::TempDir;

const MIB: u64 = 1 << 20;
const EIO: i32 = libc::EIO;
const WAIT: Duration = Duration::from_secs(15);

const POD_A: &str = "0a0a0a0a-0000-4000-8000-00000000000a";
const POD_B: &str = "0b0b0b0b-0000-4000-8000-00000000000b";
const POD_C: &str = "0c0c0c0c-0000-4000-8000-00000000000c";
const POD_D: &str = "0d0d0d0d-0000-4000-8000-00000000000d";
const POD_E: &str = "0e0e0e0e-0000-4000-8000-00000000000e";
const POD_F: &str = "0f0f0f0f-0000-4000-8000-00000000000f";
const DRIVER: &str = "disk.csi.volume-health.test";

/// A kubelet-like tree and everything mounted in it. Torn down in reverse:
/// mounts, then loop devices, then fault disks, also after a failed test.
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

fn vol_data(pv: &str, handle: &str, driver: &str) -> String {
    json!({
        "attachmentID": format!("csi-{handle}"),
        "driverName": driver,
        "nodeName": "node-1",
        "specVolID": pv,
        "volumeHandle": handle,
        "volumeLifecycleMode": "Persistent",
    })
    .to_string()
}

impl Tree {
    fn new() -> Result<Tree> {
        let root = tempfile::Builder::new().prefix("kubelet-").tempdir()?;
        Ok(Tree {
            root,
            mounts: Vec::new(),
            loops: Vec::new(),
            disks: Vec::new(),
        })
    }

    fn root(&self) -> &Path {
        self.root.path()
    }

    fn root_arg(&self) -> &str {
        self.root().to_str().expect("temp paths are UTF-8")
    }

    /// A fault disk with a loop device over it; returns its index.
    fn disk(&mut self, size: u64) -> Result<usize> {
        let disk = FaultDisk::start(size)?;
        let lo = disk.attach_loop(false)?;
        self.disks.push(disk);
        self.loops.push(lo);
        Ok(self.loops.len() - 1)
    }

    fn lo(&self, i: usize) -> &LoopDevice {
        &self.loops[i]
    }

    fn fault(&self, i: usize) -> &FaultDisk {
        &self.disks[i]
    }

    /// mkfs on disk `i` and mount it at the PV's staging path.
    fn stage(
        &mut self,
        i: usize,
        fstype: &str,
        options: &str,
        pv: &str,
        handle: &str,
    ) -> Result<PathBuf> {
        let dev = self.lo(i).path().to_path_buf();
        match fstype {
            "ext4" => fs::mkfs_ext4(&dev)?,
            "xfs" => fs::mkfs_xfs(&dev)?,
            other => bail!("no mkfs for {other}"),
        }
        let dir = self.root().join("plugins/kubernetes.io/csi/pv").join(pv);
        let staging = dir.join("globalmount");
        std::fs::create_dir_all(&staging)?;
        std::fs::write(dir.join("vol_data.json"), vol_data(pv, handle, DRIVER))?;
        self.mounts
            .push(Mount::at(&dev, &staging, fstype, options)?);
        Ok(staging)
    }

    /// The pod's volume directory with `vol_data.json` and an empty `mount`.
    fn pod_volume_dir(&self, pod: &str, pv: &str, handle: &str, driver: &str) -> Result<PathBuf> {
        let dir = self
            .root()
            .join("pods")
            .join(pod)
            .join("volumes/kubernetes.io~csi")
            .join(pv);
        std::fs::create_dir_all(dir.join("mount"))?;
        std::fs::write(dir.join("vol_data.json"), vol_data(pv, handle, driver))?;
        Ok(dir.join("mount"))
    }

    /// Publishes a staged PV to a pod: a bind mount, as kubelet's CSI
    /// drivers make it.
    fn publish(&mut self, pod: &str, pv: &str, handle: &str, staging: &Path) -> Result<PathBuf> {
        let mount = self.pod_volume_dir(pod, pv, handle, DRIVER)?;
        self.mounts
            .push(Mount::at(staging, &mount, "none", "bind")?);
        Ok(mount)
    }

    /// A filesystem volume of `driver` on a small tmpfs (for CSI tests: the
    /// filesystem itself stays healthy).
    fn tmpfs_volume(&mut self, pod: &str, pv: &str, handle: &str, driver: &str) -> Result<PathBuf> {
        let mount = self.pod_volume_dir(pod, pv, handle, driver)?;
        self.mounts
            .push(Mount::at("tmpfs", &mount, "tmpfs", "size=8m")?);
        Ok(mount)
    }

    /// A block-mode volume: a device node for disk `i` in the pod's dir.
    fn block(&self, i: usize, pod: &str, pv: &str, handle: &str) -> Result<PathBuf> {
        self.block_of(i, pod, pv, handle, DRIVER)
    }

    /// [`Tree::block`] for a volume of `driver`.
    fn block_of(
        &self,
        i: usize,
        pod: &str,
        pv: &str,
        handle: &str,
        driver: &str,
    ) -> Result<PathBuf> {
        let node = self
            .root()
            .join("pods")
            .join(pod)
            .join("volumeDevices/kubernetes.io~csi")
            .join(pv);
        std::fs::create_dir_all(node.parent().context("node has a parent")?)?;
        let lo = self.lo(i);
        nix::sys::stat::mknod(
            &node,
            nix::sys::stat::SFlag::S_IFBLK,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
            libc::makedev(lo.major(), lo.minor()),
        )
        .with_context(|| format!("mknod {}", node.display()))?;
        let data = self
            .root()
            .join("plugins/kubernetes.io/csi/volumeDevices")
            .join(pv)
            .join("data");
        std::fs::create_dir_all(&data)?;
        std::fs::write(data.join("vol_data.json"), vol_data(pv, handle, driver))?;
        Ok(node)
    }
}

/// Writes a file, syncs it and makes the fault disk fail reads of its first
/// extent; reading it cold then fails with EIO. Returns the injected count.
fn fail_cold_read(tree: &Tree, disk: usize, dir: &Path, name: &str) -> Result<u64> {
    let file = dir.join(name);
    std::fs::write(&file, vec![0x5a; 256 * 1024])?;
    fs::sync_fs(dir)?;
    let extent = fs::file_extents(&file)?[0];
    assert!(extent.is_mapped(), "{extent:?}");
    let before = tree.fault(disk).stats()?.injected(Op::Read, EIO);
    fs::drop_caches()?;
    let rule = tree
        .fault(disk)
        .add_rule(Rule::new(Op::Read, EIO).range(extent.physical, extent.len))?;
    let err = std::fs::read(&file).expect_err("the read must fail");
    assert_eq!(err.raw_os_error(), Some(EIO));
    tree.fault(disk).remove_rule(rule)?;
    let injected = tree.fault(disk).stats()?.injected(Op::Read, EIO) - before;
    assert!(injected >= 1);
    Ok(injected)
}

/// O_DIRECT writes straight to a device that fail `n` times.
fn fail_direct_writes(tree: &Tree, disk: usize, n: u64) -> Result<u64> {
    let rule = tree
        .fault(disk)
        .add_rule(Rule::new(Op::Write, EIO).range(8 * MIB, 64 * 1024))?;
    for i in 0..n {
        let err = fs::o_direct_write(tree.lo(disk).path(), 8 * MIB + i * 4096, &[0xab; 4096])
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(EIO), "write {i}");
    }
    tree.fault(disk).remove_rule(rule)?;
    Ok(n)
}

/// Sum of `count` per (device, pod_uid): what each pod volume was told.
fn per_pod_volume(events: &[Value]) -> BTreeMap<(String, String), u64> {
    let mut out = BTreeMap::new();
    for e in events {
        let key = (
            e["device"].as_str().unwrap_or("?").to_string(),
            e["pod_uid"].as_str().unwrap_or("-").to_string(),
        );
        *out.entry(key).or_insert(0) += e["count"].as_u64().unwrap_or(0);
    }
    out
}

fn key(dev: &str, pod: &str) -> (String, String) {
    (dev.to_string(), pod.to_string())
}

fn assert_volume_fields(e: &Value, pv: &str, handle: &str, mode: &str) {
    assert_eq!(e["pv"], pv, "{e}");
    assert_eq!(e["driver"], DRIVER, "{e}");
    assert_eq!(e["volume_handle"], handle, "{e}");
    assert_eq!(e["volume_mode"], mode, "{e}");
}

#[test]
fn kernel_errors_reach_exactly_their_pod_volumes() -> Result<()> {
    require_env(&["mkfs.xfs"])?;
    // Its agent attaches programs: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let mut tree = Tree::new()?;
    // A PV shared by pods A and B (ext4), pod C on xfs, pod D's block
    // volume, pod E's healthy ext4 neighbour, and a disk backing no volume.
    let shared = tree.disk(128 * MIB)?;
    let staging = tree.stage(shared, "ext4", "errors=continue", "pv-shared", "vol-shared")?;
    let mount_a = tree.publish(POD_A, "pv-shared", "vol-shared", &staging)?;
    tree.publish(POD_B, "pv-shared", "vol-shared", &staging)?;
    let xfs = tree.disk(320 * MIB)?;
    let staging = tree.stage(xfs, "xfs", "", "pv-xfs", "vol-xfs")?;
    let mount_c = tree.publish(POD_C, "pv-xfs", "vol-xfs", &staging)?;
    let blk = tree.disk(64 * MIB)?;
    tree.block(blk, POD_D, "pv-blk", "vol-blk")?;
    let quiet = tree.disk(64 * MIB)?;
    let staging = tree.stage(quiet, "ext4", "errors=continue", "pv-quiet", "vol-quiet")?;
    let mount_e = tree.publish(POD_E, "pv-quiet", "vol-quiet", &staging)?;
    let loose = tree.disk(64 * MIB)?;

    let devs: Vec<String> = [shared, xfs, blk, quiet, loose]
        .iter()
        .map(|&i| tree.lo(i).maj_min().to_string())
        .collect();
    let mut args = vec!["--kubelet-root", tree.root_arg(), "--check-interval", "1"];
    for d in &devs {
        args.extend(["--device", d.as_str()]);
    }
    let mut agent = Agent::start(&args)?;

    let n_shared = fail_cold_read(&tree, shared, &mount_a, "a.bin")?;
    let n_xfs = fail_cold_read(&tree, xfs, &mount_c, "c.bin")?;
    let n_blk = fail_direct_writes(&tree, blk, 5)?;
    let n_loose = fail_direct_writes(&tree, loose, 2)?;
    // The neighbour does I/O too, successfully.
    std::fs::write(mount_e.join("fine.bin"), vec![1u8; 64 * 1024])?;
    fs::sync_fs(&mount_e)?;

    use health_tests::agent::EventFilter;
    // Two lines per error on the shared PV: one per pod.
    agent.wait_for_count(&EventFilter::device(&devs[0]), 2 * n_shared, WAIT);
    agent.wait_for_count(&EventFilter::device(&devs[1]), n_xfs, WAIT);
    agent.wait_for_count(&EventFilter::device(&devs[2]), n_blk, WAIT);
    agent.wait_for_count(&EventFilter::device(&devs[4]), n_loose, WAIT);
    // Kernel evidence reaches the conditions within a flush (1 s).
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;

    let want: BTreeMap<(String, String), u64> = [
        (key(&devs[0], POD_A), n_shared),
        (key(&devs[0], POD_B), n_shared),
        (key(&devs[1], POD_C), n_xfs),
        (key(&devs[2], POD_D), n_blk),
        (key(&devs[4], "-"), n_loose),
    ]
    .into();
    assert_eq!(per_pod_volume(&run.events), want, "{:#?}", run.events);

    for e in &run.events {
        let dev = e["device"].as_str().unwrap_or_default();
        let obj = e.as_object().expect("events are objects");
        for k in ["pod_uid", "pv", "driver", "volume_handle", "volume_mode"] {
            assert!(obj.contains_key(k), "{k} missing in {e}");
        }
        if dev == devs[0] {
            assert_volume_fields(e, "pv-shared", "vol-shared", "Filesystem");
            assert_eq!(e["kind"], "block_io_error", "{e}");
        } else if dev == devs[1] {
            assert_volume_fields(e, "pv-xfs", "vol-xfs", "Filesystem");
        } else if dev == devs[2] {
            assert_volume_fields(e, "pv-blk", "vol-blk", "Block");
            assert_eq!(e["op"], "write");
        } else {
            assert_eq!(dev, devs[4], "{e}");
            for k in ["pod_uid", "pv", "driver", "volume_handle", "volume_mode"] {
                assert!(e[k].is_null(), "{k} in {e}");
            }
        }
    }

    // The watch keeps conditions too (stderr in JSON mode).
    for (pod, pv) in [
        (POD_A, "pv-shared"),
        (POD_B, "pv-shared"),
        (POD_C, "pv-xfs"),
        (POD_D, "pv-blk"),
    ] {
        let line = format!("volume pod {pod} pv {pv}: raised Degraded BlockIOErrors [kernel]");
        assert!(
            run.stderr.contains(&line),
            "{line:?} not in:\n{}",
            run.stderr
        );
    }
    // Its stack is printed (`stack loop3`), never a condition.
    let neighbour: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(POD_E) && !l.contains(": stack "))
        .collect();
    assert!(
        neighbour.is_empty(),
        "the healthy neighbour got a condition: {neighbour:#?}\n{}",
        run.stderr
    );
    Ok(())
}

#[test]
fn a_running_watch_picks_up_new_volumes() -> Result<()> {
    require_env(&[])?;
    // Its agent attaches programs: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let mut tree = Tree::new()?;
    std::fs::create_dir_all(tree.root().join("pods"))?;
    let mut agent = Agent::start(&["--kubelet-root", tree.root_arg()])?;

    // kubelet sets a volume up after the agent started: new disk, staging
    // mount, bind mount into the pod.
    let disk = tree.disk(128 * MIB)?;
    let staging = tree.stage(disk, "ext4", "errors=continue", "pv-late", "vol-late")?;
    let mount = tree.publish(POD_F, "pv-late", "vol-late", &staging)?;
    let dev = tree.lo(disk).maj_min().to_string();
    // The mount-table wake-up is immediate; give the loop a moment.
    std::thread::sleep(Duration::from_millis(1000));

    let injected = fail_cold_read(&tree, disk, &mount, "late.bin")?;
    use health_tests::agent::EventFilter;
    agent.wait_for_count(&EventFilter::device(&dev), injected, WAIT);
    let run = agent.stop_cleanly()?;
    let mine: Vec<&Value> = run
        .events
        .iter()
        .filter(|e| e["device"] == dev.as_str())
        .collect();
    let sum: u64 = mine.iter().map(|e| e["count"].as_u64().unwrap_or(0)).sum();
    assert_eq!(sum, injected, "{mine:#?}");
    for e in mine {
        assert_eq!(e["pod_uid"], POD_F, "{e}");
        assert_volume_fields(e, "pv-late", "vol-late", "Filesystem");
    }
    Ok(())
}

#[test]
fn volumes_shows_the_kernel_evidence_of_the_running_watch() -> Result<()> {
    require_env(&[])?;
    // Its agent attaches programs: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let bpffs = Bpffs::mount()?;
    let pin = bpffs.pin_dir_arg();
    let mut tree = Tree::new()?;
    // A block volume shared by two pods: no filesystem writes of its own
    // can fail beside the test's, so the count is exact.
    let disk = tree.disk(64 * MIB)?;
    tree.block(disk, POD_A, "pv-blk", "vol-blk")?;
    tree.block(disk, POD_B, "pv-blk", "vol-blk")?;
    let dev = tree.lo(disk).maj_min().to_string();
    let mut agent = Agent::start(&["--kubelet-root", tree.root_arg(), "--pin-dir", &pin])?;

    let started = time::OffsetDateTime::now_utc();
    let n = fail_direct_writes(&tree, disk, 4)?;
    use health_tests::agent::EventFilter;
    // One line per pod volume an error reaches.
    assert_eq!(
        agent.wait_for_count(&EventFilter::device(&dev), 2 * n, WAIT),
        2 * n
    );
    let want: BTreeMap<_, _> = [(key(&dev, POD_A), n), (key(&dev, POD_B), n)].into();
    let mut seen = per_pod_volume(agent.events());
    seen.retain(|(d, _), _| *d == dev);
    assert_eq!(seen, want);
    for pod in [POD_A, POD_B] {
        let line = format!("volume pod {pod} pv pv-blk: raised Degraded BlockIOErrors [kernel]");
        assert!(agent.wait_for_log(&line, WAIT), "watch never said: {line}");
    }
    let (vols, _, stderr) = volumes_json(tree.root_arg(), &["--pin-dir", &pin])?;
    let run = agent.stop_cleanly()?;
    assert!(!stderr.contains("kernel errors are not shown"), "{stderr}");
    for pod in [POD_A, POD_B] {
        let v = find(&vols, pod);
        let kernel = v["kernel_errors"].as_array().context("kernel_errors")?;
        assert_eq!(kernel.len(), 1, "{v:#}");
        let k = &kernel[0];
        assert_eq!(k["reason"], "BlockIOErrors", "{k}");
        assert_eq!(k["status"], "Degraded", "{k}");
        assert_eq!(k["count"], n, "{k}");
        assert_eq!(k["device"], dev.as_str(), "{k}");
        assert_eq!(k["op"], "write", "{k}");
        assert_eq!(k["errno"], EIO, "{k}");
        let time = |f: &str| {
            time::OffsetDateTime::parse(
                k[f].as_str().unwrap(),
                &time::format_description::well_known::Rfc3339,
            )
            .unwrap()
        };
        // The kernel's own times, within the seconds the writes took.
        assert!(time("first") <= time("last"), "{k}");
        assert!(time("first") >= started - time::Duration::seconds(1), "{k}");
        assert!(time("last") <= time::OffsetDateTime::now_utc(), "{k}");
        // The conditions watch raised, from the same condition code.
        assert!(
            reasons(v).contains(&r("Degraded", "BlockIOErrors", "kernel")),
            "{v:#}"
        );
        // watch's condition messages count per update; its event lines
        // (checked above) add up to the same n.
        assert!(
            run.stderr.contains(&format!(
                "volume pod {pod} pv pv-blk: raised Degraded BlockIOErrors [kernel]"
            )),
            "{}",
            run.stderr
        );
    }

    // Nothing pinned: one line says so, and the checks still run.
    let empty = Bpffs::mount()?;
    let (vols, _, stderr) = volumes_json(tree.root_arg(), &["--pin-dir", &empty.pin_dir_arg()])?;
    assert_eq!(
        stderr,
        format!(
            "volume-health: no agent state pinned at {}: kernel errors are not shown (no agent ran here, it ran with --no-pin, or it was uninstalled)\n\
             volume-health: conditions: judged by this command alone, no agent answered (connecting to {}: No such file or directory (os error 2)); what only history shows (paths removed, errors within the quiet window) may be missing\n",
            empty.pin_dir_arg(),
            health_tests::agent::no_agent_socket().display()
        )
    );
    let v = find(&vols, POD_A);
    assert_eq!(v["kernel_errors"], json!([]), "{v:#}");
    assert_eq!(reasons(v), Vec::<(String, String, String)>::new(), "{v:#}");
    Ok(())
}

#[test]
fn a_hung_volume_is_a_finding_and_never_holds_up_the_watch() -> Result<()> {
    require_env(&[])?;
    // Its agent attaches programs: not beside a test that counts exactly.
    let _kernel = health_tests::shared_kernel();
    let tree = Tree::new()?;
    let hung_path = tree
        .root()
        .join("pods")
        .join(POD_F)
        .join("volumes/kubernetes.io~local-volume/local-hung");
    let hung = HungFuse::mount(&hung_path)?;
    let agent = Agent::start(&[
        "--kubelet-root",
        tree.root_arg(),
        "--check-interval",
        "1",
        "--check-timeout",
        "1",
    ])?;
    std::thread::sleep(Duration::from_millis(3000));
    // Stopped while the probe is still stuck in the kernel: the agent must
    // exit anyway, promptly.
    let started = Instant::now();
    let run = agent.stop_cleanly()?;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopping took {:?}",
        started.elapsed()
    );
    drop(hung);
    let line = format!(
        "volume pod {POD_F} pv local-hung: raised Inaccessible PathHung [check/reachability]"
    );
    assert!(
        run.stderr.contains(&line),
        "{line:?} not in:\n{}",
        run.stderr
    );
    assert_eq!(
        run.stderr.matches("PathHung").count(),
        1,
        "raised once, not per probe:\n{}",
        run.stderr
    );
    Ok(())
}

fn find<'a>(vols: &'a [Value], pod: &str) -> &'a Value {
    vols.iter()
        .find(|v| v["pod_uid"] == pod)
        .unwrap_or_else(|| panic!("no volume of pod {pod} in {vols:#?}"))
}

fn reasons(v: &Value) -> Vec<(String, String, String)> {
    v["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| {
                    (
                        c["status"].as_str().unwrap_or("?").to_string(),
                        c["reason"].as_str().unwrap_or("?").to_string(),
                        c["source"].as_str().unwrap_or("?").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn r(status: &str, reason: &str, source: &str) -> (String, String, String) {
    (status.into(), reason.into(), source.into())
}

/// Free bytes as statvfs tells a pod.
fn avail(path: &Path) -> Result<u64> {
    let st = nix::sys::statvfs::statvfs(path)?;
    Ok(st.blocks_available() * st.fragment_size())
}

fn fallocate(path: &Path, bytes: u64) -> std::io::Result<()> {
    let f = std::fs::File::create(path)?;
    nix::fcntl::fallocate(
        &f,
        nix::fcntl::FallocateFlags::empty(),
        0,
        bytes as libc::off_t,
    )
    .map_err(std::io::Error::from)
}

const MODERN: &str = "modern.csi.volume-health.test";
const LEGACY: &str = "legacy.csi.volume-health.test";
const HANG: &str = "hang.csi.volume-health.test";
const UNIMPL: &str = "unimpl.csi.volume-health.test";

/// CSI node plugins of the given names and generations, each on its
/// socket under `root/plugins/<name>/`, served by `rt`.
fn start_drivers(
    rt: &tokio::runtime::Runtime,
    root: &Path,
    drivers: &[(&str, DriverMode)],
) -> Result<Vec<TestDriverHandle>> {
    rt.block_on(async {
        let mut out = Vec::new();
        for &(name, mode) in drivers {
            let dir = root.join("plugins").join(name);
            std::fs::create_dir_all(&dir)?;
            out.push(TestDriver::start_named(&dir, name, mode).await?);
        }
        Ok(out)
    })
}

#[test]
fn one_shot_view_shows_each_volume_and_its_conditions() -> Result<()> {
    require_env(&[])?;
    let mut tree = Tree::new()?;

    // The read-only trip: a real ext4 error under errors=remount-ro.
    let trip = tree.disk(64 * MIB)?;
    let staging = tree.stage(trip, "ext4", "errors=remount-ro", "pv-trip", "vol-trip")?;
    let mount_trip = tree.publish(POD_A, "pv-trip", "vol-trip", &staging)?;
    let trigger = format!("/sys/fs/ext4/{}/trigger_fs_error", tree.lo(trip).name());
    std::fs::write(&trigger, "1").with_context(|| trigger.clone())?;
    let err = std::fs::write(mount_trip.join("x"), "x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS));

    // Full, and nearly full.
    let full = tree.disk(64 * MIB)?;
    let staging = tree.stage(full, "ext4", "errors=remount-ro", "pv-full", "vol-full")?;
    let mount_full = tree.publish(POD_B, "pv-full", "vol-full", &staging)?;
    let mut chunk = avail(&mount_full)?;
    let mut n = 0;
    while chunk >= 4096 {
        n += 1;
        if fallocate(&mount_full.join(format!("fill{n}")), chunk).is_err() {
            chunk /= 2;
        }
    }
    assert_eq!(avail(&mount_full)?, 0);
    let low = tree.disk(64 * MIB)?;
    let staging = tree.stage(low, "ext4", "errors=remount-ro", "pv-low", "vol-low")?;
    let mount_low = tree.publish(POD_C, "pv-low", "vol-low", &staging)?;
    let total = nix::sys::statvfs::statvfs(&mount_low)?;
    let total = total.blocks() * total.fragment_size();
    fallocate(
        &mount_low.join("ballast"),
        avail(&mount_low)? - total * 3 / 100,
    )?;

    // The healthy neighbour, and a healthy block volume.
    let healthy = tree.disk(64 * MIB)?;
    let staging = tree.stage(
        healthy,
        "ext4",
        "errors=remount-ro",
        "pv-healthy",
        "vol-healthy",
    )?;
    tree.publish(POD_D, "pv-healthy", "vol-healthy", &staging)?;
    let blk = tree.disk(16 * MIB)?;
    tree.block(blk, POD_E, "pv-blk", "vol-blk")?;

    // A local PV whose mount hangs.
    let hung_path = tree
        .root()
        .join("pods")
        .join(POD_F)
        .join("volumes/kubernetes.io~local-volume/local-hung");
    let hung = HungFuse::mount(&hung_path)?;

    // CSI node plugins of each generation, each with one volume.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let drivers = start_drivers(
        &rt,
        tree.root(),
        &[
            (MODERN, DriverMode::Modern),
            (LEGACY, DriverMode::LegacyOnly),
            (HANG, DriverMode::Hang),
            (UNIMPL, DriverMode::Unimplemented),
        ],
    )?;
    let sick = vec![HealthEntry::new(
        HealthStatus::DataLoss,
        "ChecksumMismatch",
        "3 blocks unreadable on the array",
    )];
    drivers[0].set_volume_health("vol-modern", sick.clone());
    drivers[1].set_volume_health("vol-legacy", sick);
    let csi_pods = [
        (
            "11111111-0000-4000-8000-000000000001",
            MODERN,
            "pv-modern",
            "vol-modern",
        ),
        (
            "11111111-0000-4000-8000-000000000002",
            LEGACY,
            "pv-legacy",
            "vol-legacy",
        ),
        (
            "11111111-0000-4000-8000-000000000003",
            HANG,
            "pv-hang",
            "vol-hang",
        ),
        (
            "11111111-0000-4000-8000-000000000004",
            UNIMPL,
            "pv-unimpl",
            "vol-unimpl",
        ),
    ];
    for (pod, driver, pv, handle) in csi_pods {
        tree.tmpfs_volume(pod, pv, handle, driver)?;
    }

    let timeout = 2.0;
    let (vols, took, stderr) = volumes_json(tree.root_arg(), &["--check-timeout", "2"])?;
    drop(hung);
    // Checks and CSI run concurrently: the hung path and the hung driver
    // each cost about one timeout (CSI at most three calls), not a sum.
    assert!(
        took < Duration::from_secs_f64(timeout * 3.0 + 2.0),
        "took {took:?}; stderr:\n{stderr}"
    );
    assert_eq!(vols.len(), 10, "{vols:#?}");

    let v = find(&vols, POD_A);
    assert_eq!(
        reasons(v),
        [
            r("Inaccessible", "ReadOnlyRemount", "check/read-only"),
            r("DataLoss", "FilesystemErrors", "ext4-superblock")
        ],
        "{v:#}"
    );
    assert_eq!(v["worst"], "Inaccessible");
    assert_eq!(v["pv"], "pv-trip");
    assert_eq!(v["driver"], DRIVER);
    assert_eq!(v["volume_handle"], "vol-trip");
    assert_eq!(v["volume_mode"], "Filesystem");
    assert_eq!(v["device"], tree.lo(trip).maj_min());
    assert_eq!(v["disk"], tree.lo(trip).name());
    // A loop device is a one-layer stack with no state of its own.
    assert_eq!(
        v["stack"],
        serde_json::json!([{
            "dev": tree.lo(trip).maj_min(),
            "name": tree.lo(trip).name(),
            "kind": "plain"
        }]),
        "{v:#}"
    );
    assert_eq!(v["mount"], mount_trip.to_str().unwrap());
    assert_eq!(v["fs_type"], "ext4");
    for c in v["conditions"].as_array().unwrap() {
        for k in ["status", "reason", "message", "since"] {
            assert!(c[k].is_string(), "{k} in {c}");
        }
    }
    // Its exact words differ per kernel (tests/read_only_remount.rs).
    let trip_prefix = format!(
        "ext4 on {} at {} ",
        tree.lo(trip).maj_min(),
        mount_trip.display()
    );
    assert!(
        v["conditions"][0]["message"]
            .as_str()
            .unwrap()
            .starts_with(&trip_prefix),
        "{v:#}"
    );
    // Its driver has no socket on this node: a failed probe, not health.
    assert_eq!(v["csi"]["result"], "probe_failed", "{v:#}");

    let v = find(&vols, POD_B);
    assert_eq!(
        reasons(v),
        [r("Degraded", "CapacityExhausted", "check/capacity")],
        "{v:#}"
    );
    let v = find(&vols, POD_C);
    assert_eq!(
        reasons(v),
        [r("Degraded", "CapacityLow", "check/capacity")],
        "{v:#}"
    );

    let v = find(&vols, POD_D);
    assert_eq!(v["conditions"], json!([]), "{v:#}");
    assert!(v["worst"].is_null());
    let v = find(&vols, POD_E);
    assert_eq!(v["conditions"], json!([]), "{v:#}");
    assert_eq!(v["volume_mode"], "Block");
    assert_eq!(v["device"], tree.lo(blk).maj_min());
    assert!(v["mount"].is_null());

    let v = find(&vols, POD_F);
    assert_eq!(
        reasons(v),
        [r("Inaccessible", "PathHung", "check/reachability")],
        "{v:#}"
    );
    assert_eq!(v["kind"], "LocalVolume");
    assert!(v["csi"].is_null(), "a local PV has no driver to ask: {v:#}");

    let v = find(&vols, csi_pods[0].0);
    assert_eq!(
        reasons(v),
        [r("DataLoss", "ChecksumMismatch", "csi-node")],
        "{v:#}"
    );
    assert_eq!(v["csi"]["rpc"], "NodeGetVolumeHealth");
    assert_eq!(
        v["csi"]["socket"],
        tree.root()
            .join("plugins")
            .join(MODERN)
            .join("csi.sock")
            .to_str()
            .unwrap()
    );
    let v = find(&vols, csi_pods[1].0);
    assert_eq!(
        reasons(v),
        [r("Degraded", "VolumeConditionAbnormal", "csi-node")],
        "{v:#}"
    );
    assert_eq!(v["csi"]["rpc"], "NodeGetVolumeStats");
    for (pod, wanted) in [
        (csi_pods[2].0, "timed out"),
        (csi_pods[3].0, "unusable CSI sockets"),
    ] {
        let v = find(&vols, pod);
        assert_eq!(v["conditions"], json!([]), "{v:#}");
        assert_eq!(v["csi"]["result"], "probe_failed", "{v:#}");
        let failures = v["probe_failures"].as_array().unwrap();
        assert!(
            failures.iter().any(|f| f["source"] == "csi-node" && f["error"].as_str().unwrap().contains(wanted)),
            "{v:#}"
        );
    }
    // Exactly one health call per volume, no retries.
    assert_eq!(
        drivers[0].calls(health_csi::testing::Rpc::NodeGetVolumeHealth),
        1
    );
    assert_eq!(
        drivers[1].calls(health_csi::testing::Rpc::NodeGetVolumeStats),
        1
    );

    // Named by an override, the UNIMPLEMENTED driver is asked its
    // capabilities, and their UNIMPLEMENTED is a failed probe, never health.
    let ov = format!("{UNIMPL}={}", drivers[3].socket_path().display());
    let (vols, _, _) = volumes_json(
        tree.root_arg(),
        &["--check-timeout", "2", "--csi-socket", &ov],
    )?;
    let v = find(&vols, csi_pods[3].0);
    assert_eq!(v["csi"]["result"], "probe_failed", "{v:#}");
    assert!(
        v["csi"]["error"]
            .as_str()
            .unwrap()
            .contains("does not support"),
        "{v:#}"
    );

    // The human view names every volume.
    let out = Command::new(agent_bin()?)
        .args([
            "volumes",
            "--kubelet-root",
            tree.root_arg(),
            "--check-timeout",
            "1",
            "--pin-dir",
            &no_pins(),
        ])
        .env("HEALTH_LOG", "error")
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        text.contains(&format!("pod {POD_D} pv pv-healthy ({DRIVER}, Filesystem)")),
        "{text}"
    );
    assert!(text.contains("Inaccessible ReadOnlyRemount"), "{text}");
    assert!(text.contains("\n  stack: loop"), "{text}");

    drop(drivers);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

const STORAGE: &str = "storage.csi.volume-health.test";
const NEIGHBOUR: &str = "neighbour.csi.volume-health.test";

/// `volumes --json` once: the conditions, the storage answer and the probe
/// failures of one volume.
fn storage_view(vols: &[Value], pod: &str) -> (Vec<(String, String, String)>, Value) {
    let v = find(vols, pod);
    (reasons(v), v["csi_storage"].clone())
}

#[test]
fn one_shot_view_spreads_storage_health_over_the_drivers_volumes() -> Result<()> {
    require_env(&[])?;
    let mut tree = Tree::new()?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let drivers = start_drivers(
        &rt,
        tree.root(),
        &[
            (STORAGE, DriverMode::Modern),
            (NEIGHBOUR, DriverMode::Modern),
            (LEGACY, DriverMode::LegacyOnly),
        ],
    )?;
    let (storage, neighbour, legacy) = (&drivers[0], &drivers[1], &drivers[2]);
    // The array behind every volume is unreachable; the block pool is
    // rebuilding as well.
    storage.set_storage_health(vec![
        StorageHealthEntry::new(
            StorageHealthStatus::StorageUnreachable,
            "ArrayOffline",
            "array a1: all paths down",
        ),
        StorageHealthEntry::new(
            StorageHealthStatus::StorageDegraded,
            "",
            "pool p2 rebuilding",
        )
        .for_access_type(AccessType::Block),
    ]);

    // Three filesystem volumes and one block volume of the sick driver, one
    // volume each of a healthy modern driver and of a legacy driver.
    let pod = |n: u32| format!("22222222-0000-4000-8000-00000000000{n}");
    for n in 1..=3 {
        tree.tmpfs_volume(&pod(n), &format!("pv-s{n}"), &format!("vol-s{n}"), STORAGE)?;
    }
    let disk = tree.disk(16 * MIB)?;
    tree.block_of(disk, &pod(4), "pv-s4", "vol-s4", STORAGE)?;
    tree.tmpfs_volume(&pod(5), "pv-n", "vol-n", NEIGHBOUR)?;
    tree.tmpfs_volume(&pod(6), "pv-l", "vol-l", LEGACY)?;
    for (driver, handle) in [
        (storage, "vol-s1"),
        (storage, "vol-s2"),
        (storage, "vol-s3"),
        (storage, "vol-s4"),
        (neighbour, "vol-n"),
        (legacy, "vol-l"),
    ] {
        driver.set_volume_health(handle, vec![]);
    }

    // No agent's pinned counters: other runs on this host must not add
    // kernel conditions to the loop device here.
    let pins = tempfile::tempdir()?;
    let pin_dir = pins.path().to_str().expect("temp paths are UTF-8");
    let args = |timeout| ["--check-timeout", timeout, "--pin-dir", pin_dir];
    let (vols, _, stderr) = volumes_json(tree.root_arg(), &args("2"))?;
    assert_eq!(vols.len(), 6, "{vols:#?}\n{stderr}");
    assert!(stderr.contains("kernel errors are not shown"), "{stderr}");
    let unreachable = r("Inaccessible", "ArrayOffline", "csi-storage");
    let storage_socket = tree.root().join("plugins").join(STORAGE).join("csi.sock");
    for n in 1..=3 {
        let (conditions, answer) = storage_view(&vols, &pod(n));
        assert_eq!(conditions, std::slice::from_ref(&unreachable), "{answer:#}");
        assert_eq!(answer["driver"], STORAGE);
        assert_eq!(answer["socket"], storage_socket.to_str().unwrap());
        assert_eq!(answer["result"], "health");
        assert_eq!(
            answer["entries"],
            json!([
                {"status": "StorageUnreachable", "reason": "ArrayOffline",
                 "message": "array a1: all paths down", "access_type": null},
                {"status": "StorageDegraded", "reason": "",
                 "message": "pool p2 rebuilding", "access_type": "block"},
            ])
        );
    }
    let v = find(&vols, &pod(1));
    assert_eq!(v["worst"], "Inaccessible");
    assert_eq!(
        v["conditions"][0]["message"],
        format!("CSI driver {STORAGE} reports its storage unreachable: array a1: all paths down")
    );
    // The block volume also gets the entry restricted to block volumes.
    let (conditions, _) = storage_view(&vols, &pod(4));
    assert_eq!(
        conditions,
        [
            unreachable.clone(),
            r("Degraded", "StorageDegraded", "csi-storage")
        ]
    );
    assert_eq!(
        find(&vols, &pod(4))["conditions"][1]["message"],
        format!(
            "CSI driver {STORAGE} reports its storage degraded (block volumes): pool p2 rebuilding"
        )
    );
    // Other drivers' volumes are untouched.
    let (conditions, answer) = storage_view(&vols, &pod(5));
    assert_eq!(conditions, [], "{answer:#}");
    assert_eq!(answer["result"], "health");
    assert_eq!(answer["entries"], json!([]));
    let (conditions, answer) = storage_view(&vols, &pod(6));
    assert_eq!(conditions, [], "{answer:#}");
    assert_eq!(answer["result"], "unsupported");
    for n in 1..=6 {
        let v = find(&vols, &pod(n));
        assert_eq!(v["probe_failures"], json!([]), "{v:#}");
    }
    // One storage call per driver for the whole run, however many volumes.
    assert_eq!(storage.calls(Rpc::NodeGetStorageHealth), 1);
    assert_eq!(storage.calls(Rpc::NodeGetVolumeHealth), 4);
    assert_eq!(neighbour.calls(Rpc::NodeGetStorageHealth), 1);
    // The legacy driver does not advertise GET_STORAGE_HEALTH: never asked.
    assert_eq!(legacy.calls(Rpc::NodeGetStorageHealth), 0);

    // The array is back: an empty answer clears every volume at once.
    storage.set_storage_health(vec![]);
    let (vols, _, _) = volumes_json(tree.root_arg(), &args("2"))?;
    for n in 1..=4 {
        let (conditions, answer) = storage_view(&vols, &pod(n));
        assert_eq!(conditions, [], "{answer:#}");
        assert_eq!(answer["entries"], json!([]));
    }
    assert_eq!(storage.calls(Rpc::NodeGetStorageHealth), 2);

    // A hung storage call is a failed probe on each of the driver's
    // volumes, never a recovery, and costs one timeout.
    storage.set_storage_health(vec![StorageHealthEntry::new(
        StorageHealthStatus::StorageUnreachable,
        "ArrayOffline",
        "again",
    )]);
    storage.set_mode(DriverMode::Hang);
    let (vols, took, _) = volumes_json(tree.root_arg(), &args("1"))?;
    assert!(took < Duration::from_secs(5), "{took:?}");
    for n in 1..=4 {
        let v = find(&vols, &pod(n));
        assert_eq!(v["csi_storage"]["result"], "probe_failed", "{v:#}");
        let failures = v["probe_failures"].as_array().unwrap();
        assert!(
            failures.iter().any(|f| f["source"] == "csi-storage"
                && f["error"] == "CSI NodeGetStorageHealth timed out after 1s"),
            "{v:#}"
        );
    }
    assert_eq!(storage.calls(Rpc::NodeGetStorageHealth), 3);

    drop(drivers);
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// Beside a running agent, `volumes` shows the agent's conditions (what its
/// Events say, every source), asked on the agent's conditions socket: here
/// one the agent's own server serves in-process, holding a path the
/// agent saw removed, which a fresh process cannot see. With no agent
/// there, its own judgement, and it says so.
#[test]
fn volumes_shows_the_running_agents_conditions_and_says_when_it_judged_alone() -> Result<()> {
    use health_core::conditions::{CheckKind, Condition, Source, Status};
    use health_node::conditions_socket;
    use health_node::volumes::kubelet::VolumeMode;
    use health_node::volumes::VolumeKey;

    require_env(&[])?;
    let mut tree = Tree::new()?;
    tree.tmpfs_volume(POD_A, "pv-a", "vol-a", DRIVER)?;
    tree.tmpfs_volume(POD_B, "pv-b", "vol-b", DRIVER)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let socket = tree.root().join("run/conditions.sock");
    let socket_arg = socket.to_str().context("UTF-8")?.to_string();
    let served = rt.block_on(conditions_socket::serve(&socket))?;
    let since = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let key = VolumeKey {
        pod_uid: POD_A.into(),
        name: "pv-a".into(),
        mode: VolumeMode::Filesystem,
    };
    let removed = "no path of dm-3 is up (down: nvme1c2n1 removed)";
    served.board().set_pod_volumes([(
        &key,
        vec![Condition {
            source: Source::Check(CheckKind::Stack),
            status: Status::Inaccessible,
            reason: "AllPathsDown".into(),
            message: removed.into(),
            since,
            last_probe: since + Duration::from_secs(30),
            occurrences: None,
        }],
    )]);

    let (vols, _, stderr) = volumes_json(tree.root_arg(), &["--agent-socket", &socket_arg])?;
    let a = find(&vols, POD_A);
    assert_eq!(a["conditions_from"], "agent", "{a:#}");
    assert_eq!(
        reasons(a),
        [r("Inaccessible", "AllPathsDown", "check/stack")]
    );
    assert_eq!(a["conditions"][0]["message"], removed);
    assert_eq!(a["conditions"][0]["since"], "2023-11-14T22:13:20Z");
    assert_eq!(a["conditions"][0]["last_probe"], "2023-11-14T22:13:50Z");
    assert_eq!(a["worst"], "Inaccessible");
    let b = find(&vols, POD_B);
    assert_eq!(b["conditions_from"], "agent", "{b:#}");
    assert_eq!(reasons(b), []);
    assert_eq!(b["worst"], Value::Null);
    assert!(!stderr.contains("judged by this command alone"), "{stderr}");

    let human = |socket: &str| -> Result<String> {
        let out = Command::new(agent_bin()?)
            .args(["volumes", "--kubelet-root", tree.root_arg()])
            .args(["--check-timeout", "1", "--pin-dir", &no_pins()])
            .args(["--agent-socket", socket])
            .env("HEALTH_LOG", "error")
            .output()?;
        assert!(out.status.success(), "{out:?}");
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let text = human(&socket_arg)?;
    assert_eq!(
        text.lines().next(),
        Some(format!("conditions: the running agent's (asked at {socket_arg})").as_str()),
        "{text}"
    );
    assert!(
        text.contains(&format!("pod {POD_A} pv pv-a ({DRIVER}, Filesystem) "))
            && text.contains(&format!(
            "\n  Inaccessible AllPathsDown since 2023-11-14T22:13:20Z [check/stack]: {removed}\n"
        )),
        "{text}"
    );

    // The agent gone: the command's own judgement (the tmpfs volumes are
    // healthy to it), said on stderr with why.
    drop(served);
    let (vols, _, stderr) = volumes_json(tree.root_arg(), &["--agent-socket", &socket_arg])?;
    for pod in [POD_A, POD_B] {
        let v = find(&vols, pod);
        assert_eq!(v["conditions_from"], "command", "{v:#}");
        assert_eq!(reasons(v), [], "{v:#}");
    }
    assert!(
        stderr.contains(&format!(
            "volume-health: conditions: judged by this command alone, no agent answered \
             (connecting to {socket_arg}: No such file or directory (os error 2)); \
             what only history shows (paths removed, errors within the quiet window) may be missing\n"
        )),
        "{stderr}"
    );
    assert!(human(&socket_arg)?
        .starts_with("conditions: judged by this command alone, no agent answered"));
    rt.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}
