//! The agent on the disks a VM or a cloud instance has: an NVMe PCIe
//! controller and a virtio-blk disk, as QEMU emulates them for the guest's
//! real `nvme` and `virtio_blk` drivers, with errors injected under them
//! (QEMU's blkdebug fails every read of one sector and every write of
//! another), SMART critical warnings raised on the NVMe controller, and
//! QEMU's I/O throttling changed live (a slow, then a stuck cloud disk),
//! both through QMP (tests/src/qemu.rs).
//!
//! These need the devices `cargo xtask vm` emulates: the target is `test =
//! false` and runs in its guests,
//!
//! ```text
//! cargo xtask vm --kernel 6.1 --tests qemu_devices [--filter NAME]
//! ```
//!
//! Every test fails (never skips) outside such a guest, runs alone, and
//! asserts exact counts per (pod, disk, source, op, errno) and the
//! condition lines; the throttled disks print how long each condition took
//! (docs/benchmarks.md, "Stalls").

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use health_tests::agent::{Agent, EventFilter};
use health_tests::cgroup::TestCgroup;
use health_tests::devices::BlockDev;
use health_tests::kubelet_tree::Kubelet;
use health_tests::qemu::{self, NvmeWarning, WriteThrottle};
use health_tests::vm_report::{
    assert_logged, assert_slow_writes, cleared, condition_lines, kernel_release, key, message_of,
    raised, raised_and_cleared, request_source, show, tally, volume_lines, Tally,
};
use health_tests::{fs, kernel_alone, require_root};

const WAIT: Duration = Duration::from_secs(30);
/// For a stack condition: generous (TCG guests are slow); the figures are
/// printed.
const CONDITION_WAIT: Duration = Duration::from_secs(20);
const POD_A: &str = "9e3e0000-0000-4000-8000-0000000000a1";
const STACK: &str = "check/stack";
const HIGH_LATENCY: &str = "Degraded HighLatency";
const LATENCY: &str = "check/latency";
const IO_STALLED: &str = "Inaccessible IOStalled";
const STALL: &str = "check/stall";
/// What the agent promises past `--stall-after`: a poll (0.5 s) and a turn.
const STALL_TARGET: Duration = Duration::from_secs(2);
/// The throttled disks' writes: past the 32 MiB filesystem, before the bad
/// sectors (48.8 MiB).
const IO_AT: u64 = 40 << 20;

fn errno_name(e: &std::io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::EIO) => "EIO".into(),
        Some(libc::ENODATA) => "ENODATA".into(),
        other => format!("{other:?}: {e}"),
    }
}

/// `reads` O_DIRECT reads of the bad read sector and `writes` writes of
/// the bad write sector of `dev`: what the application saw, per (op,
/// errno name). Every one must fail.
fn fail_io(dev: &Path, reads: u64, writes: u64) -> Result<BTreeMap<(String, String), u64>> {
    let (r, w) = (qemu::bad_read_sector()?, qemu::bad_write_sector()?);
    let mut seen = BTreeMap::new();
    for i in 0..reads {
        match fs::o_direct_read(dev, r * 512, 4096) {
            Ok(_) => anyhow::bail!("read {i} of sector {r} of {} succeeded", dev.display()),
            Err(e) => *seen.entry(("read".into(), errno_name(&e))).or_default() += 1,
        }
    }
    for i in 0..writes {
        match fs::o_direct_write(dev, w * 512, &[0x5a; 4096]) {
            Ok(_) => anyhow::bail!("write {i} of sector {w} of {} succeeded", dev.display()),
            Err(e) => *seen.entry(("write".into(), errno_name(&e))).or_default() += 1,
        }
    }
    Ok(seen)
}

/// The pod's rows as the application saw them, on `disk`.
fn expected(disk: &str, pv_pod: &str, seen: &BTreeMap<(String, String), u64>) -> Tally {
    seen.iter()
        .map(|((op, errno), n)| (key(pv_pod, disk, request_source(), op, errno), *n))
        .collect()
}

/// The agent over a pod volume of ext4 on `dev`; waits for its first stack
/// line, so that what follows is a change it sees.
fn start_agent(kubelet: &mut Kubelet, dev: &BlockDev, pv: &str, extra: &[&str]) -> Result<Agent> {
    kubelet.fs_volume(POD_A, pv, &dev.path)?;
    let mut args = vec!["--stack-interval", "1"];
    args.extend_from_slice(extra);
    let agent = kubelet.agent(&args)?;
    let first = format!("volume pod {POD_A} pv {pv}: stack ");
    anyhow::ensure!(
        agent.wait_for_log(&first, WAIT),
        "no stack line for pv {pv} within {WAIT:?}"
    );
    Ok(agent)
}

/// `reads` and `writes` failing I/Os on `disk` under a pod volume: every
/// one failed with `errno` for the application, is one row of exactly that
/// on the disk for the pod (nothing else counted), and raised
/// `status_reason` from the kernel's evidence, the volume's only condition.
/// Returns the agent's run for the caller's own checks.
fn counted_exactly(
    disk: &BlockDev,
    pv: &str,
    (reads, writes): (u64, u64),
    errno: &str,
    status_reason: &str,
) -> Result<health_tests::agent::AgentRun> {
    let mut kubelet = Kubelet::new()?;
    let mut agent = start_agent(&mut kubelet, disk, pv, &[])?;
    let seen = fail_io(&disk.path, reads, writes)?;
    let got = agent.wait_for_count(&EventFilter::device(&disk.maj_min), reads + writes, WAIT);
    std::thread::sleep(Duration::from_secs(2));
    let run = agent.stop_cleanly()?;
    eprintln!(
        "{}: {} ({}): the application saw {seen:?}; the agent {got}",
        kernel_release(),
        disk.name,
        disk.maj_min
    );
    assert_eq!(
        seen,
        BTreeMap::from([
            (("read".into(), errno.into()), reads),
            (("write".into(), errno.into()), writes)
        ]),
        "what the application saw"
    );
    assert_eq!(
        tally(&run.events),
        expected(&disk.name, POD_A, &seen),
        "{}",
        show(&run)
    );
    for e in &run.events {
        assert_eq!(e["pv"], pv, "{e}");
    }
    assert_logged(&run, &raised(POD_A, pv, status_reason, "kernel"));
    let lines = condition_lines(&run, POD_A);
    assert_eq!(lines.len(), 1, "one condition: {lines:#?}");
    Ok(run)
}

/// Failed commands of the emulated NVMe controller: a read of the bad
/// sector completes with "Unrecovered Read Error", a write with "Write
/// Fault"; the kernel maps both to a medium error (ENODATA, after its own
/// retries), one failed request each on the namespace's disk. The pod's
/// volume gets exactly those, and DataLoss MediumErrors.
#[test]
fn nvme_pci_media_errors_are_counted_on_the_namespace_as_data_loss() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let (_, disk) = qemu::nvme_disk()?;
    let _healthy = NvmeWarning::cleared()?;
    let pv = "pv-nvme-pci";
    let run = counted_exactly(&disk, pv, (3, 2), "ENODATA", "DataLoss MediumErrors")?;
    assert_logged(
        &run,
        &format!("volume pod {POD_A} pv {pv}: stack {} live", disk.name),
    );
    Ok(())
}

/// Failed requests of a virtio-blk disk (VIRTIO_BLK_S_IOERR, a VM's disk
/// whose host storage failed): EIO for reads and writes, counted on the
/// disk for the pod, Degraded BlockIOErrors.
#[test]
fn virtio_blk_errors_are_counted_on_the_disk_as_block_io_errors() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = qemu::virtio_disk()?;
    counted_exactly(&disk, "pv-virtio", (4, 3), "EIO", "Degraded BlockIOErrors")?;
    Ok(())
}

/// SMART critical warnings of the emulated controller, read through the
/// admin passthrough:
/// 1. with a long schedule (an hour), a warning set while all is well is
///    not read yet; the first failed request reads the log at once:
///    Degraded NvmeCriticalWarning (bit 2, reliability degraded) within
///    seconds of the error, beside DataLoss MediumErrors;
/// 2. on a one-second schedule, media turned read-only (bit 3) is
///    Inaccessible NvmeCriticalWarning without any I/O, and clears once
///    the controller's log says nothing again.
#[test]
fn nvme_critical_warnings_are_conditions_on_the_namespaces_volumes() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let (ctrl, disk) = qemu::nvme_disk()?;
    let mut warning = NvmeWarning::cleared()?;
    let k = kernel_release();

    // 1. Read at the first error.
    let mut kubelet = Kubelet::new()?;
    let pv = "pv-nvme-smart";
    let agent = start_agent(&mut kubelet, &disk, pv, &["--nvme-health-interval", "3600"])?;
    warning.set(0x04)?;
    // Past the agent's spacing between two reads (5 s since its first).
    std::thread::sleep(Duration::from_secs(6));
    let degraded = raised(POD_A, pv, "Degraded NvmeCriticalWarning", STACK);
    let early = agent.wait_for_log(&degraded, Duration::ZERO);
    let t0 = Instant::now();
    let seen = fail_io(&disk.path, 1, 0)?;
    let came = agent.wait_for_log(&degraded, CONDITION_WAIT);
    let after_error = t0.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let run = agent.stop_cleanly()?;
    eprintln!(
        "{k}: {ctrl}: warning 0x04 raised {:.2} s after the first error",
        after_error.as_secs_f64()
    );
    assert!(
        !early,
        "raised before any error, on an hour's schedule:\n{}",
        run.stderr
    );
    assert!(
        came,
        "not raised within {CONDITION_WAIT:?} of the error:\n{}",
        run.stderr
    );
    assert_eq!(seen.values().sum::<u64>(), 1);
    let line = run
        .stderr
        .lines()
        .find(|l| l.starts_with(&degraded))
        .context("the raised line")?;
    assert!(
        line.ends_with(&format!(
            ": NVMe controller {ctrl} of disk {} reports a critical warning (0x04): reliability degraded by media or internal errors; available spare 0% (threshold 0%), 0% of rated life used",
            disk.name
        )),
        "{line}"
    );
    assert_logged(&run, &raised(POD_A, pv, "DataLoss MediumErrors", "kernel"));
    drop(kubelet);

    // 2. On a schedule, without I/O.
    warning.set(0)?;
    let mut kubelet = Kubelet::new()?;
    let pv = "pv-nvme-ro";
    let agent = start_agent(&mut kubelet, &disk, pv, &["--nvme-health-interval", "1"])?;
    let read_only = raised(POD_A, pv, "Inaccessible NvmeCriticalWarning", STACK);
    let t1 = Instant::now();
    warning.set(0x08)?;
    let came = agent.wait_for_log(&read_only, CONDITION_WAIT);
    let raise_delay = t1.elapsed();
    let back = cleared(POD_A, pv, "Inaccessible NvmeCriticalWarning", STACK);
    let t2 = Instant::now();
    warning.set(0)?;
    let gone = agent.wait_for_log(&back, CONDITION_WAIT);
    let clear_delay = t2.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let run = agent.stop_cleanly()?;
    eprintln!(
        "{k}: {ctrl}: warning 0x08 raised after {:.2} s, cleared {:.2} s after the warning went",
        raise_delay.as_secs_f64(),
        clear_delay.as_secs_f64()
    );
    assert!(
        came,
        "read-only media not raised within {CONDITION_WAIT:?}:\n{}",
        run.stderr
    );
    assert!(
        gone,
        "not cleared within {CONDITION_WAIT:?}:\n{}",
        run.stderr
    );
    assert!(run.events.is_empty(), "no I/O failed: {}", show(&run));
    let lines = condition_lines(&run, POD_A);
    assert_eq!(lines.len(), 2, "raised and cleared: {lines:#?}");
    assert_eq!(
        lines[0],
        format!("{read_only}: NVMe controller {ctrl} of disk {} reports a critical warning (0x08): media placed in read-only mode; available spare 0% (threshold 0%), 0% of rated life used", disk.name)
    );
    assert!(lines[1].starts_with(&back), "{lines:#?}");
    assert_logged(
        &run,
        &format!(
            "volume pod {POD_A} pv {pv}: stack {} live critical warning 0x08",
            disk.name
        ),
    );
    Ok(())
}

/// A slow and then a stuck cloud disk: QEMU's own I/O throttling, changed
/// live over QMP, under a mounted volume on `disk`, with `--stall-after 2`,
/// `--latency-window 2` and a 50 ms limit for every class:
/// 1. ten writes a second (each waits about 100 ms in QEMU), written one
///    after the other: HighLatency on the disk after three slow windows,
///    the p99 named by its bucket (65 ms, or above when the emulator adds
///    its own delay), no IOStalled; cleared three windows after the
///    throttle is lifted;
/// 2. one byte a second, after a write that spends QEMU's bucket: the next
///    write (dd, in a cgroup of its own) waits; IOStalled within the poll
///    past 2 s of the write reaching the driver (`inflight`), naming the
///    disk, one write and the cgroup; cleared once the throttle is lifted
///    and the write completes.
///
/// Each delay is printed (docs/benchmarks.md, "Stalls").
fn slow_then_stuck(disk: &BlockDev, mut throttle: WriteThrottle, pv: &str) -> Result<()> {
    let k = kernel_release();
    let mut kubelet = Kubelet::new()?;
    let agent = start_agent(
        &mut kubelet,
        disk,
        pv,
        &[
            "--stall-after",
            "2",
            "--latency-window",
            "2",
            "--latency-limit",
            "rotational=50",
            "--latency-limit",
            "ssd=50",
            "--latency-limit",
            "network=50",
            "--latency-relative",
            "0",
        ],
    )?;
    let slow = (
        raised(POD_A, pv, HIGH_LATENCY, LATENCY),
        cleared(POD_A, pv, HIGH_LATENCY, LATENCY),
    );
    let stuck = (
        raised(POD_A, pv, IO_STALLED, STALL),
        cleared(POD_A, pv, IO_STALLED, STALL),
    );

    // 1. Slow.
    throttle.set(0, 10)?;
    let t0 = Instant::now();
    let writes = fs::Writes::start(&disk.path, IO_AT);
    let slow_seen = agent.wait_for_log(&slow.0, CONDITION_WAIT);
    let slow_after = t0.elapsed();
    throttle.lift()?;
    let t1 = Instant::now();
    let fast_seen = agent.wait_for_log(&slow.1, CONDITION_WAIT);
    let fast_after = t1.elapsed();
    let written = writes.stop()?;

    // 2. Stuck.
    throttle.set(1, 0)?;
    fs::o_direct_write(&disk.path, IO_AT, &[0x11; 4096])?;
    let cgroup = TestCgroup::new("qemu-throttle")?;
    // Starting dd takes a while in an emulated guest (seconds on 5.10):
    // the write was submitted after `spawned` and by the time the driver
    // had it (`arrived`).
    let spawned = Instant::now();
    let mut writer = cgroup.o_direct_write(&disk.path, IO_AT)?;
    let arrived = disk.write_arrival(CONDITION_WAIT)?;
    let stuck_seen = agent.wait_for_log(&stuck.0, CONDITION_WAIT);
    let (stuck_after, since_spawn) = (arrived.elapsed(), spawned.elapsed());
    throttle.lift()?;
    let t3 = Instant::now();
    let done = writer.wait().context("waiting for dd")?;
    let moving_seen = agent.wait_for_log(&stuck.1, CONDITION_WAIT);
    let moving_after = t3.elapsed();
    std::thread::sleep(Duration::from_secs(1));
    let run = agent.stop_cleanly()?;
    eprintln!(
        "{k}: {}: QEMU throttle, 10 writes/s: HighLatency after {:.2} s, cleared {:.2} s after the throttle was lifted ({written} writes)",
        disk.name,
        slow_after.as_secs_f64(),
        fast_after.as_secs_f64()
    );
    eprintln!(
        "{k}: {}: QEMU throttle, 1 byte/s: IOStalled {:.2} s after the write reached the driver (--stall-after 2), cleared {:.2} s after the throttle was lifted",
        disk.name,
        stuck_after.as_secs_f64(),
        moving_after.as_secs_f64()
    );
    anyhow::ensure!(
        slow_seen && fast_seen && stuck_seen && moving_seen,
        "HighLatency raised {slow_seen}, cleared {fast_seen}; IOStalled raised {stuck_seen}, cleared {moving_seen}:\n{}",
        volume_lines(&run, POD_A)
    );
    anyhow::ensure!(done.success(), "dd: {done}");

    // QEMU's bucket lets a write through every 100 ms: the p99 write of a
    // window has waited at least into the 65 ms bucket (measured on every
    // kernel), or more where the emulator adds its own delay.
    let held = Duration::from_micros(65_536);
    assert_slow_writes(&run, &slow.0, (&disk.name, &disk.name, POD_A), 50, held)?;
    assert_eq!(
        message_of(&run, &stuck.0),
        Some(format!(
            "{}: I/O stalled, 1 waiting (1 write); the oldest, a write from cgroup {}, has waited 2s+ (--stall-after 2s)",
            disk.name,
            cgroup.path
        )),
        "{}",
        volume_lines(&run, POD_A)
    );
    for status_reason in [HIGH_LATENCY, IO_STALLED] {
        let source = if status_reason == HIGH_LATENCY {
            LATENCY
        } else {
            STALL
        };
        assert_eq!(
            raised_and_cleared(&run, POD_A, status_reason, source),
            ["raised", "cleared"],
            "{status_reason}: {}",
            volume_lines(&run, POD_A)
        );
    }
    assert!(run.events.is_empty(), "no I/O failed: {}", show(&run));
    assert!(
        since_spawn >= Duration::from_secs(2),
        "IOStalled {since_spawn:?} after dd started"
    );
    assert!(
        stuck_after <= Duration::from_secs(2) + STALL_TARGET,
        "IOStalled {stuck_after:?} after the write reached the driver"
    );
    Ok(())
}

/// [`slow_then_stuck`] on the NVMe namespace.
#[test]
fn nvme_pci_throttled_by_qemu_is_high_latency_then_io_stalled() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let (_, disk) = qemu::nvme_disk()?;
    slow_then_stuck(&disk, WriteThrottle::nvme()?, "pv-nvme-throttled")
}

/// [`slow_then_stuck`] on the virtio-blk disk.
#[test]
fn virtio_blk_throttled_by_qemu_is_high_latency_then_io_stalled() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = qemu::virtio_disk()?;
    slow_then_stuck(&disk, WriteThrottle::virtio()?, "pv-virtio-throttled")
}
