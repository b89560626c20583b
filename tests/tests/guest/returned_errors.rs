//! What applications were told (`--returned-errors`): reads that returned
//! an error to a process, counted for the volume the file is on, whether
//! or not a block device is under it, with the process's cgroup named.
//! The fexit programs this needs are refused on the development VMs' own
//! kernel (docs/kernels.md), so the suite runs in the guests:
//!
//! ```text
//! cargo xtask vm --kernel 6.12 --tests returned_errors [--filter NAME]
//! ```
//!
//! A FUSE volume (the fault disk's own mount, bind mounted as a pod's local
//! PV) whose daemon fails reads, then exits; and an ext4 volume on a loop
//! device whose failed read is both a failed request and an error returned
//! to the reader, said in one condition. Every test asserts exact counts
//! per (pod, disk, source, op, errno) and the condition's message.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use health_tests::agent::EventFilter;
use health_tests::cgroup::TestCgroup;
use health_tests::fs::{self, dev_of};
use health_tests::kubelet_tree::Kubelet;
use health_tests::vm_report::{key, last_message, raised, request_source, show, tally, Tally};
use health_tests::{kernel_alone, require_root, FaultDisk, Op, Rule};

const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(30);
const POD: &str = "7e70e000-0000-4000-8000-0000000000a1";
const PV: &str = "pv-returned";
const SOURCE: &str = "vfs_return";
const KERNEL: &str = "kernel";
const READER: &str = env!("CARGO_BIN_EXE_file-reader");

/// A FUSE volume: the fault disk's mount bind mounted as the pod's PV, and
/// the image file's path through it.
fn fuse_volume(disk: &FaultDisk, kubelet: &mut Kubelet) -> Result<(PathBuf, PathBuf)> {
    let pod_dir = kubelet.dir_volume(POD, PV, disk.mount_dir())?;
    let name = disk.image_path().file_name().context("the image's name")?;
    Ok((pod_dir.clone(), pod_dir.join(name)))
}

/// The daemon fails five reads with EIO: each is one error returned to the
/// reader, counted on the FUSE mount's anonymous device and said as
/// `Degraded ApplicationIOErrors` with the reader's cgroup; the read that
/// succeeds is not counted.
#[test]
fn a_fuse_volume_counts_the_eio_its_daemon_returned() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = FaultDisk::start(16 * MIB)?;
    let mut kubelet = Kubelet::new()?;
    let (pod_dir, file) = fuse_volume(&disk, &mut kubelet)?;
    let dev = dev_of(&pod_dir)?;
    let mut agent = kubelet.agent_counting_returned_errors()?;
    let cgroup = TestCgroup::new("returned")?;
    let mut reader = cgroup.reader(Path::new(READER), &file)?;
    assert_eq!(reader.pread(0)?, None, "a healthy read");
    disk.add_rule(Rule::new(Op::Read, libc::EIO).range(4 * MIB, 8 * MIB))?;
    // A megabyte apart: no read finds a page another one brought in.
    for i in 0..5 {
        assert_eq!(
            reader.pread(4 * MIB + i * MIB)?,
            Some(libc::EIO),
            "read {i}"
        );
    }
    let filter = EventFilter::device(&dev).kind("returned_error");
    agent.wait_for_count(&filter, 5, WAIT);
    let told = format!(
        "5 failed file operations (read, EIO) returned to cgroup {}",
        cgroup.path
    );
    agent.wait_for_log(&told, WAIT);
    drop(reader);
    disk.clear_rules()?;
    let run = agent.stop_cleanly()?;

    let want: Tally = [(key(POD, "-", SOURCE, "read", "EIO"), 5)].into();
    assert_eq!(tally(&run.events), want, "{}", show(&run));
    for e in &run.events {
        assert_eq!(e["device"], dev.as_str(), "{e}");
        assert_eq!(e["detail"], "vfs_read", "{e}");
        assert!(
            e["fs_type"].as_str().is_some_and(|t| t.starts_with("fuse")),
            "{e}"
        );
    }
    let message = last_message(&run, POD, PV, "Degraded ApplicationIOErrors", KERNEL)
        .with_context(|| format!("no ApplicationIOErrors line:\n{}", show(&run)))?;
    let head = format!("{told} on {dev} at {} in ", pod_dir.display());
    assert!(
        message.starts_with(&head),
        "{message:?} does not start with {head:?}"
    );
    Ok(())
}

/// The daemon exits (the mount stays, as when a FUSE driver's process
/// dies): every read of a file already open fails with ENOTCONN, counted
/// exactly and said as `Inaccessible NotConnected`.
#[test]
fn a_fuse_daemon_gone_is_not_connected() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = FaultDisk::start(16 * MIB)?;
    let mut kubelet = Kubelet::new()?;
    let (pod_dir, file) = fuse_volume(&disk, &mut kubelet)?;
    let dev = dev_of(&pod_dir)?;
    let mut agent = kubelet.agent_counting_returned_errors()?;
    let cgroup = TestCgroup::new("returned")?;
    let mut reader = cgroup.reader(Path::new(READER), &file)?;
    disk.vanish()?;
    for i in 0..3 {
        assert_eq!(
            reader.pread(4 * MIB + i * MIB)?,
            Some(libc::ENOTCONN),
            "read {i}"
        );
    }
    let filter = EventFilter::device(&dev).kind("returned_error");
    agent.wait_for_count(&filter, 3, WAIT);
    let told = format!(
        "3 failed file operations (read, ENOTCONN) returned to cgroup {}",
        cgroup.path
    );
    agent.wait_for_log(&told, WAIT);
    drop(reader);
    let run = agent.stop_cleanly()?;

    let want: Tally = [(key(POD, "-", SOURCE, "read", "ENOTCONN"), 3)].into();
    assert_eq!(tally(&run.events), want, "{}", show(&run));
    let message = last_message(&run, POD, PV, "Inaccessible NotConnected", KERNEL)
        .with_context(|| format!("no NotConnected line:\n{}", show(&run)))?;
    let head = format!("{told} on {dev} at {} ", pod_dir.display());
    assert!(
        message.starts_with(&head),
        "{message:?} does not start with {head:?}"
    );
    Ok(())
}

/// A cold read of an ext4 file on a failing loop device: the failed
/// requests and the one error returned to the reader are one failure, so
/// one condition, `Degraded BlockIOErrors`, whose message says both; no
/// `ApplicationIOErrors` is raised beside it.
#[test]
fn a_failed_read_on_a_block_volume_is_one_condition_saying_both() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = FaultDisk::start(64 * MIB)?;
    let lo = disk.attach_loop(false)?;
    let mut kubelet = Kubelet::new()?;
    let pod_dir = kubelet.fs_volume(POD, PV, lo.path())?;
    let file = pod_dir.join("data.bin");
    std::fs::write(&file, vec![0x5a; 256 * 1024])?;
    fs::sync_fs(&pod_dir)?;
    let extent = fs::file_extents(&file)?[0];
    let mut agent = kubelet.agent_counting_returned_errors()?;
    let cgroup = TestCgroup::new("returned")?;
    let mut reader = cgroup.reader(Path::new(READER), &file)?;
    fs::drop_caches()?;
    disk.add_rule(Rule::new(Op::Read, libc::EIO).range(extent.physical, extent.len))?;
    assert_eq!(reader.pread(0)?, Some(libc::EIO));
    let injected = disk.stats()?.injected(Op::Read, libc::EIO);
    assert!(injected >= 1);
    let dev = lo.maj_min();
    agent.wait_for_count(&EventFilter::device(dev), injected + 1, WAIT);
    let told = format!(
        "; 1 failed file operation (read, EIO) returned to cgroup {}",
        cgroup.path
    );
    agent.wait_for_log(&told, WAIT);
    drop(reader);
    disk.clear_rules()?;
    let run = agent.stop_cleanly()?;

    let want: Tally = [
        (
            key(POD, lo.name(), request_source(), "read", "EIO"),
            injected,
        ),
        (key(POD, lo.name(), SOURCE, "read", "EIO"), 1),
    ]
    .into();
    assert_eq!(tally(&run.events), want, "{}", show(&run));
    let message = last_message(&run, POD, PV, "Degraded BlockIOErrors", KERNEL)
        .with_context(|| format!("no BlockIOErrors line:\n{}", show(&run)))?;
    let head = format!("{injected} block I/O error");
    assert!(message.starts_with(&head), "{message:?}");
    assert!(
        message.ends_with(&told),
        "{message:?} does not end with {told:?}"
    );
    assert!(
        !run.stderr
            .contains(&raised(POD, PV, "Degraded ApplicationIOErrors", KERNEL)),
        "a second condition for one failure:\n{}",
        run.stderr
    );
    Ok(())
}

/// ext4 shut down under a mounted volume (`EXT4_IOC_SHUTDOWN` without a
/// log flush: what the kernel does itself when its journal aborts): every
/// read returns EIO to the application although no block request failed,
/// nor was one issued. The block layer has nothing to say, as of a
/// dm-multipath read failed while its paths were reinstated; the
/// application's own errors are the evidence: 3 failed reads counted
/// exactly with the reader's cgroup, said in the shutdown's condition,
/// `Inaccessible FilesystemShutdown` (one failure, one condition), and no
/// block error counted anywhere.
#[test]
fn reads_failed_with_no_block_request_failing_are_counted() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = FaultDisk::start(64 * MIB)?;
    let lo = disk.attach_loop(false)?;
    let mut kubelet = Kubelet::new()?;
    let pod_dir = kubelet.fs_volume(POD, PV, lo.path())?;
    let file = pod_dir.join("data.bin");
    std::fs::write(&file, vec![0x5a; 8 * MIB as usize])?;
    fs::sync_fs(&pod_dir)?;
    let mut agent = kubelet.agent_counting_returned_errors()?;
    let cgroup = TestCgroup::new("returned")?;
    let mut reader = cgroup.reader(Path::new(READER), &file)?;
    assert_eq!(reader.pread(0)?, None, "a healthy read");
    shut_down_ext4(&pod_dir)?;
    for i in 0..3 {
        assert_eq!(reader.pread(MIB + i * MIB)?, Some(libc::EIO), "read {i}");
    }
    let filter = EventFilter::device(lo.maj_min()).kind("returned_error");
    agent.wait_for_count(&filter, 3, WAIT);
    let told = format!(
        "; 3 failed file operations (read, EIO) returned to cgroup {}",
        cgroup.path
    );
    agent.wait_for_log(&told, WAIT);
    drop(reader);
    let run = agent.stop_cleanly()?;

    let of_kind = |kind: &str| -> Vec<&serde_json::Value> {
        run.events.iter().filter(|e| e["kind"] == kind).collect()
    };
    let want: Tally = [(key(POD, lo.name(), SOURCE, "read", "EIO"), 3)].into();
    assert_eq!(tally(of_kind("returned_error")), want, "{}", show(&run));
    assert_eq!(of_kind("block_io_error").len(), 0, "{}", show(&run));
    let shutdowns: u64 = of_kind("fs_shutdown")
        .iter()
        .map(|e| e["count"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(shutdowns, 1, "{}", show(&run));
    let reason = "Inaccessible FilesystemShutdown";
    let message = last_message(&run, POD, PV, reason, KERNEL)
        .with_context(|| format!("no {reason} line:\n{}", show(&run)))?;
    assert!(
        message.ends_with(&told),
        "{message:?} does not end with {told:?}"
    );
    for alone in ["Degraded ApplicationIOErrors", "Degraded BlockIOErrors"] {
        let line = raised(POD, PV, alone, KERNEL);
        assert!(!run.stderr.contains(&line), "{line:?}:\n{}", show(&run));
    }
    eprintln!("{}", show(&run));
    Ok(())
}

/// `EXT4_IOC_SHUTDOWN` (`_IOR('X', 125, __u32)`, fs/ext4/ext4.h) with
/// `EXT4_GOING_FLAGS_NOLOGFLUSH` (0x2) on the filesystem of `dir`.
fn shut_down_ext4(dir: &Path) -> Result<()> {
    use std::os::fd::AsRawFd as _;
    const EXT4_IOC_SHUTDOWN: libc::c_ulong = 0x8004_587d;
    const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 0x2;
    let d = std::fs::File::open(dir).with_context(|| format!("opening {}", dir.display()))?;
    let flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
    // SAFETY: the ioctl reads one u32 from the pointer, which outlives it.
    let r = unsafe { libc::ioctl(d.as_raw_fd(), EXT4_IOC_SHUTDOWN, &flags as *const u32) };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("EXT4_IOC_SHUTDOWN on {}", dir.display()));
    }
    Ok(())
}
