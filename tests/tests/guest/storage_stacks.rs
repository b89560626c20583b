//! The agent's stack check (`check/stack`) and its counting through
//! stacks, against real storage stacks given to pod volumes of a
//! kubelet-like tree: dm-multipath over two scsi_debug paths to one LUN,
//! an md raid1 losing and regaining a member, and dm-thin pools that fill
//! up in queue and in error mode (tests/src/stacks.rs builds them).
//!
//! These need scsi_debug, dm-multipath, dm-thin-pool and raid1, which the
//! development host lacks: the target is `test = false` and runs in the VMs
//! of Debian's kernels,
//!
//! ```text
//! cargo xtask vm --kernel 6.1 --tests storage_stacks [--filter NAME]
//! ```
//!
//! Every test fails (never skips) when a module or tool is missing, runs
//! alone (they share modules), asserts exact counts per (pod, disk, source,
//! op, errno) and the condition lines, and tears its devices down even when
//! it fails. The agent is asked to raise each stack condition within 5 s of
//! the kernel's change; the tests wait longer (TCG guests are slow and
//! share the machine) and print the delays they measured instead of
//! asserting them.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use health_tests::agent::{Agent, AgentRun, EventFilter};
use health_tests::cgroup::TestCgroup;
use health_tests::devices::{BlockDev, DmDevice};
use health_tests::kubelet_tree::Kubelet;
use health_tests::stacks::{
    self, poll_until, Multipath, NoSpaceTimeout, Raid1, ThinConfig, ThinStack,
};
use health_tests::vm_report::{
    assert_logged, assert_slow_writes, kernel_release, key, message_of, raised_and_cleared,
    request_source, show, tally, transitions, volume_lines, Tally,
};
use health_tests::{cmd, fs, kernel_alone, require_root, FaultDisk};
use serde_json::Value;

/// For failed requests to reach the agent's output.
const WAIT: Duration = Duration::from_secs(30);
/// For a stack condition to be raised or cleared: generous, see the module
/// comment; [`TARGET`] is what the agent promises.
const CONDITION_WAIT: Duration = Duration::from_secs(15);
const TARGET: Duration = Duration::from_secs(5);

const POD_A: &str = "57ac0000-0000-4000-8000-00000000000a";

/// The stack check's source, as condition lines name it.
const STACK: &str = "check/stack";
const IO_STALLED: &str = "Inaccessible IOStalled";
const STALL: &str = "check/stall";
/// The agent's arguments for the stall scenarios: bios followed, so that
/// the message names the oldest write and whose it is, and I/O a
/// suspended or full dm device holds above its accounting is seen.
const FOLLOWED_STALLS: &[&str] = &["--stall-after", "2", "--follow-bios"];

/// scsi_debug's unreadable sectors (512 bytes each) on its 64 MiB store:
/// 48.8 MiB in, beyond the 32 MiB filesystems and the I/O region below.
const BAD_SECTOR: u64 = 100_000;
const BAD_COUNT: u64 = 16;
/// Where the tests' own O_DIRECT I/O on a 64 MiB device goes: past the
/// filesystem on it, before the bad sectors.
const IO_BASE: u64 = 40 << 20;
const MIB: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------
// What the kernel and the agent said.

/// The errno names the agent prints, for the errnos these stacks return.
fn errno_name(errno: i32) -> String {
    match errno {
        libc::EIO => "EIO".into(),
        libc::ENODATA => "ENODATA".into(),
        libc::ENOSPC => "ENOSPC".into(),
        libc::ENOLINK => "ENOLINK".into(),
        libc::ETIMEDOUT => "ETIMEDOUT".into(),
        other => format!("errno {other}"),
    }
}

/// The lines of a pod volume: with and without a pod.
fn split_by_pod(run: &AgentRun, pod: &str) -> (Tally, Tally) {
    let (mine, rest): (Vec<&Value>, Vec<&Value>) =
        run.events.iter().partition(|e| e["pod_uid"] == pod);
    (tally(mine), tally(rest))
}

/// `volume pod <pod> pv <pv>: <verb> <status> <reason> [<source>]`, the
/// start of a condition line (raised and updated lines go on with `: `
/// and the message).
fn condition(pod: &str, pv: &str, verb: &str, status_reason: &str, source: &str) -> String {
    format!("volume pod {pod} pv {pv}: {verb} {status_reason} [{source}]")
}

fn kernel_side(run: &AgentRun) -> &str {
    run.stderr
        .lines()
        .find(|l| l.starts_with("kernel side:"))
        .unwrap_or("<no kernel side: line>")
}

/// No condition from the kernel's evidence on the pod: the stack alone
/// changed, no I/O the application made failed.
fn assert_no_kernel_condition(run: &AgentRun, pod: &str) {
    let head = format!("volume pod {pod} ");
    let kernel: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with(&head) && l.contains(": raised ") && l.contains("[kernel]"))
        .collect();
    assert!(
        kernel.is_empty(),
        "kernel conditions on pod {pod}: {kernel:#?}\n{}",
        run.stderr
    );
}

/// The agent, watching the tree with stack checks every second (the
/// default, said out loud) and `extra`; returns once it has printed the
/// volume's first stack line, so that what follows is a change it sees.
fn start_agent(kubelet: &Kubelet, pod: &str, pv: &str, extra: &[&str]) -> Result<Agent> {
    let mut args = vec!["--stack-interval", "1"];
    args.extend_from_slice(extra);
    let agent = kubelet.agent(&args)?;
    let first = format!("volume pod {pod} pv {pv}: stack ");
    ensure!(
        agent.wait_for_log(&first, WAIT),
        "the agent printed no stack line for pod {pod} pv {pv} within {WAIT:?}"
    );
    // A few more stack rounds on the healthy stack: nothing to say.
    std::thread::sleep(Duration::from_secs(2));
    let raised = format!("volume pod {pod} pv {pv}: raised ");
    ensure!(
        !agent.wait_for_log(&raised, Duration::ZERO),
        "a condition was raised on the healthy stack"
    );
    Ok(agent)
}

/// How long each awaited condition line took after the kernel's change.
#[derive(Default)]
struct Delays(Vec<(String, Option<Duration>)>);

impl Delays {
    /// Waits for `line` on the agent's stderr and records the time since
    /// `since` (the kernel's change); whether it came.
    fn wait(&mut self, agent: &Agent, what: &str, line: &str, since: Instant) -> bool {
        let seen = agent.wait_for_log(line, CONDITION_WAIT);
        self.0
            .push((what.to_string(), seen.then(|| since.elapsed())));
        seen
    }

    fn report(&self) {
        for (what, d) in &self.0 {
            match d {
                Some(d) => eprintln!(
                    "{}: {what}: {:.2} s{}",
                    kernel_release(),
                    d.as_secs_f64(),
                    if *d > TARGET {
                        " (over the 5 s target)"
                    } else {
                        ""
                    }
                ),
                None => eprintln!(
                    "{}: {what}: NOT within {:?}",
                    kernel_release(),
                    CONDITION_WAIT
                ),
            }
        }
    }
}

/// Waits until the events of the disks named `disks` add up to `n`.
fn wait_for_disks(agent: &mut Agent, disks: &[&str], n: u64) -> u64 {
    let start = Instant::now();
    loop {
        let sum: u64 = agent
            .events()
            .iter()
            .filter(|e| disks.iter().any(|d| e["disk"] == *d))
            .map(|e| e["count"].as_u64().unwrap_or(0))
            .sum();
        if sum >= n || start.elapsed() >= WAIT {
            return sum;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------------------
// 1. dm-multipath over two scsi_debug paths to one LUN.

/// Two paths to one 64 MiB LUN with medium errors at [`BAD_SECTOR`] (opts=2
/// reports them), and a multipath device `name` over both.
fn multipath(name: &str) -> Result<Multipath> {
    cmd::require_tools(&["dmsetup", "mkfs.ext4"])?;
    Multipath::over_scsi_debug(
        name,
        &[
            "dev_size_mb=64",
            "opts=2",
            &format!("medium_error_start={BAD_SECTOR}"),
            &format!("medium_error_count={BAD_COUNT}"),
        ],
    )
}

/// 1a. One path offline: the SCSI midlayer rejects its requests at
///     dispatch (not a failed request: nothing is traced) and dm-multipath
///     fails the path over to the other one, so the application's O_DIRECT
///     reads and writes and its file writes succeed. The volume is
///     Degraded PathsDown from the moment the disk leaves `running` (before
///     dm-multipath notices, at the next I/O), and still while the disk is
///     running again but dm-multipath has the path failed (no multipathd
///     here to reinstate it), until it is reinstated; no kernel condition,
///     nothing counted anywhere.
#[test]
fn multipath_one_path_offline_is_paths_down_and_io_goes_on() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let mp = multipath("health-mp-one")?;
    let mut kubelet = Kubelet::new()?;
    let pv = "pv-mp-one";
    let dir = kubelet.fs_volume(POD_A, pv, &mp.dm.mapper_path())?;
    let agent = start_agent(&kubelet, POD_A, pv, &[])?;
    let mut delays = Delays::default();
    let (lost, kept) = (mp.path(0).clone(), mp.path(1).clone());
    let healthy = mp.status()?;

    let down = condition(POD_A, pv, "raised", "Degraded PathsDown", STACK);
    let t0 = Instant::now();
    mp.offline(0)?;
    delays.wait(
        &agent,
        &format!("PathsDown raised after {} went offline", lost.name),
        &down,
        t0,
    );
    let after_offline = mp.status()?;

    // The application's I/O, over the remaining path.
    const N: u64 = 8;
    for i in 0..N {
        let at = IO_BASE + i * 4096;
        let data = [0xa0 + i as u8; 4096];
        fs::o_direct_write(&mp.dm.dev.path, at, &data)
            .with_context(|| format!("O_DIRECT write {i} over one path"))?;
        let back = fs::o_direct_read(&mp.dm.dev.path, at, 4096)
            .with_context(|| format!("O_DIRECT read {i} over one path"))?;
        assert!(back == data, "read {i} did not return what was written");
    }
    let file = dir.join("one-path-is-enough");
    std::fs::write(&file, b"written over the remaining path")?;
    std::fs::File::open(&file)?.sync_all()?;
    let during = mp.path_states()?;
    let during_line = mp.status()?;
    let lost_state = stacks::scsi_state(&lost)?;

    // The disk running again, the path still failed in dm: a few stack
    // rounds, the condition stays.
    let up = condition(POD_A, pv, "cleared", "Degraded PathsDown", STACK);
    stacks::set_scsi_state(&lost, "running")?;
    std::thread::sleep(Duration::from_secs(3));
    let cleared_early = agent.wait_for_log(&up, Duration::ZERO);
    let failed_in_dm = mp.path_states()?;

    let t1 = Instant::now();
    mp.restore(0)?;
    delays.wait(
        &agent,
        &format!("PathsDown cleared after {} was reinstated", lost.name),
        &up,
        t1,
    );
    let restored = mp.path_states()?;
    let restored_line = mp.status()?;
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;

    let k = kernel_release();
    eprintln!("{k}: dm status healthy:        {healthy}");
    eprintln!(
        "{k}: dm status {} offline:    {after_offline} (dm-multipath has not noticed yet)",
        lost.name
    );
    eprintln!(
        "{k}: dm status after {N} I/Os: {during_line} ({} {lost_state})",
        lost.name
    );
    eprintln!("{k}: dm status reinstated:     {restored_line}");
    eprintln!(
        "{k}: traced: {:?}; {}",
        tally(&run.events),
        kernel_side(&run)
    );
    eprintln!("{k}: volume lines:\n{}", volume_lines(&run, POD_A));
    delays.report();

    assert_eq!(lost_state, "offline");
    let by_dev = |p: &BlockDev| during.iter().find(|s| s.dev == p.maj_min).cloned();
    let lost_path = by_dev(&lost).with_context(|| format!("{} not in {during:?}", lost.maj_min))?;
    let kept_path = by_dev(&kept).with_context(|| format!("{} not in {during:?}", kept.maj_min))?;
    assert!(
        !lost_path.active && lost_path.fail_count >= 1,
        "dm-multipath did not fail {} over: {during:?}",
        lost.name
    );
    assert!(kept_path.active, "{} not active: {during:?}", kept.name);
    assert!(
        failed_in_dm
            .iter()
            .any(|p| p.dev == lost.maj_min && !p.active),
        "{} was reinstated without a message: {failed_in_dm:?}",
        lost.name
    );
    assert!(restored.iter().all(|p| p.active), "{restored:?}");
    // A path failure dm-multipath retried on the other path fails nothing:
    // no failed request, no failed bio, on any layer.
    assert!(
        run.events.is_empty(),
        "losing one path failed I/O: {}",
        show(&run)
    );
    assert_no_kernel_condition(&run, POD_A);
    assert!(!run.stderr.contains("AllPathsDown"), "{}", run.stderr);
    assert_logged(&run, &down);
    let msg = message_of(&run, &down).context("PathsDown without a message")?;
    assert!(
        msg.contains("runs on 1 of 2 paths") && msg.contains(&lost.name),
        "PathsDown message {msg:?} should name 1 of 2 paths up and {}",
        lost.name
    );
    assert!(!msg.contains(&kept.name), "{msg:?} names the path still up");
    assert!(
        !cleared_early,
        "PathsDown cleared while dm-multipath had {} failed:\n{}",
        lost.name, run.stderr
    );
    // By then the message says why, from dm's status.
    let failed = format!("down: {} failed", lost.name);
    let pathsdown = format!("Degraded PathsDown [{STACK}]: ");
    assert!(
        run.stderr
            .lines()
            .any(|l| l.contains(&pathsdown) && l.contains(&failed)),
        "no PathsDown message with {failed:?}:\n{}",
        run.stderr
    );
    assert_logged(&run, &up);
    assert_eq!(
        raised_and_cleared(&run, POD_A, "Degraded PathsDown", STACK),
        ["raised", "cleared"],
        "{}",
        run.stderr
    );
    Ok(())
}

/// 1b. Both paths offline, no `queue_if_no_path`: dm-multipath has no path
///     left and fails each request itself. Every failed O_DIRECT read is one
///     failed request of the multipath device (request-based: traced with
///     its number), nothing on the sd paths (their clones are rejected at
///     dispatch, untraced), counted for the pod once. The volume is
///     Inaccessible AllPathsDown until both paths are back.
#[test]
fn multipath_all_paths_offline_fails_reads_once_on_the_dm_device() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let mp = multipath("health-mp-all")?;
    let mut kubelet = Kubelet::new()?;
    let pv = "pv-mp-all";
    kubelet.fs_volume(POD_A, pv, &mp.dm.mapper_path())?;
    let mut agent = start_agent(&kubelet, POD_A, pv, &[])?;
    let mut delays = Delays::default();
    let healthy = mp.status()?;

    let down = condition(POD_A, pv, "raised", "Inaccessible AllPathsDown", STACK);
    let t0 = Instant::now();
    mp.offline(0)?;
    mp.offline(1)?;
    delays.wait(
        &agent,
        "AllPathsDown raised after both paths went offline",
        &down,
        t0,
    );
    let after_offline = mp.status()?;

    const N: u64 = 3;
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..N {
        match fs::o_direct_read(&mp.dm.dev.path, IO_BASE + i * 4096, 4096) {
            Ok(b) => panic!("read {i} with no path returned {} bytes", b.len()),
            Err(e) => {
                let errno = e.raw_os_error().context("an OS error")?;
                *seen.entry(errno_name(errno)).or_default() += 1;
            }
        }
    }
    let failed_line = mp.status()?;
    let got = agent.wait_for_count(&EventFilter::device(&mp.dm.dev.maj_min), N, WAIT);

    let up = condition(POD_A, pv, "cleared", "Inaccessible AllPathsDown", STACK);
    let t1 = Instant::now();
    mp.restore(0)?;
    mp.restore(1)?;
    delays.wait(
        &agent,
        "AllPathsDown cleared after both paths were reinstated",
        &up,
        t1,
    );
    let restored_line = mp.status()?;
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;

    let k = kernel_release();
    eprintln!("{k}: dm status healthy:           {healthy}");
    eprintln!("{k}: dm status both offline:      {after_offline}");
    eprintln!("{k}: dm status after {N} reads:     {failed_line}");
    eprintln!("{k}: dm status both reinstated:   {restored_line}");
    eprintln!("{k}: the application saw {seen:?}");
    eprintln!(
        "{k}: the kernel traced ({got} of {N} awaited on {}): {:#?}; {}",
        mp.dm.dev.name,
        tally(&run.events),
        kernel_side(&run)
    );
    eprintln!("{k}: volume lines:\n{}", volume_lines(&run, POD_A));
    delays.report();

    assert_eq!(
        seen,
        BTreeMap::from([("EIO".to_string(), N)]),
        "what the reads returned"
    );
    let want: Tally = [(
        key(POD_A, &mp.dm.dev.name, request_source(), "read", "EIO"),
        N,
    )]
    .into();
    let (mine, rest) = split_by_pod(&run, POD_A);
    assert_eq!(mine, want, "{}", show(&run));
    // Nothing on the paths, with or without a pod.
    assert!(rest.is_empty(), "{rest:?}\n{}", show(&run));
    assert_logged(&run, &down);
    let msg = message_of(&run, &down).context("AllPathsDown without a message")?;
    assert!(
        msg.contains("none of its 2 paths up") && msg.contains("fails"),
        "AllPathsDown message {msg:?}: 2 paths, I/O fails (no queue_if_no_path)"
    );
    assert_logged(&run, &up);
    assert_eq!(
        raised_and_cleared(&run, POD_A, "Inaccessible AllPathsDown", STACK),
        ["raised", "cleared"],
        "{}",
        run.stderr
    );
    Ok(())
}

/// 1c. Medium errors through both paths: a medium error is the LUN's, not a
///     path's, so dm-multipath neither retries it on the other path nor
///     fails the path; it fails the request. Each failed read is a failed
///     request on the path that carried it and then on the multipath
///     device: the pod's volume is counted once, on the multipath device,
///     with what the application saw; the path disks' lines carry no pod.
///     Consecutive reads alternate paths (round-robin, one request each),
///     so both paths see errors. No stack condition: every path is up.
#[test]
fn multipath_medium_errors_are_counted_once_on_the_dm_device() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let mp = multipath("health-mp-medium")?;
    let mut kubelet = Kubelet::new()?;
    let pv = "pv-mp-medium";
    kubelet.fs_volume(POD_A, pv, &mp.dm.mapper_path())?;
    let mut agent = start_agent(&kubelet, POD_A, pv, &[])?;
    let healthy = mp.status()?;

    const N: u64 = 4;
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    for i in 0..N {
        match fs::o_direct_read(&mp.dm.dev.path, BAD_SECTOR * 512, 4096) {
            Ok(b) => panic!("read {i} of the bad sectors returned {} bytes", b.len()),
            Err(e) => {
                let errno = e.raw_os_error().context("an OS error")?;
                *seen.entry(errno_name(errno)).or_default() += 1;
            }
        }
    }
    let after = mp.path_states()?;
    let after_line = mp.status()?;
    let on_dm = agent.wait_for_count(&EventFilter::device(&mp.dm.dev.maj_min), N, WAIT);
    let names = [mp.path(0).name.as_str(), mp.path(1).name.as_str()];
    let on_paths = wait_for_disks(&mut agent, &names, N);
    // Kernel evidence reaches the conditions within a flush (1 s).
    std::thread::sleep(Duration::from_secs(2));
    let run = agent.stop_cleanly()?;

    let k = kernel_release();
    eprintln!("{k}: dm status before: {healthy}");
    eprintln!("{k}: dm status after:  {after_line}");
    eprintln!("{k}: the application saw {seen:?}");
    eprintln!(
        "{k}: the kernel traced ({on_dm} on {}, {on_paths} on the paths of {N} awaited): {:#?}; {}",
        mp.dm.dev.name,
        tally(&run.events),
        kernel_side(&run)
    );
    eprintln!("{k}: volume lines:\n{}", volume_lines(&run, POD_A));

    assert_eq!(seen.values().sum::<u64>(), N);
    let src = request_source();
    let want: Tally = seen
        .iter()
        .map(|(errno, n)| (key(POD_A, &mp.dm.dev.name, src, "read", errno), *n))
        .collect();
    let (mine, rest) = split_by_pod(&run, POD_A);
    assert_eq!(mine, want, "the pod's lines: {}", show(&run));
    for e in run.events.iter().filter(|e| e["pod_uid"] == POD_A) {
        assert_eq!(e["pv"], pv, "{e}");
        assert_eq!(e["volume_mode"], "Filesystem", "{e}");
        assert_eq!(e["sector"], BAD_SECTOR, "{e}");
    }
    // The paths' own failed requests: as many, with no pod, each path some.
    let mut per_path: BTreeMap<String, u64> = BTreeMap::new();
    for ((pod, disk, source, op, _), n) in &rest {
        assert_eq!(pod, "-", "a line of another pod: {rest:?}");
        assert!(
            names.contains(&disk.as_str()) && source == src && op == "read",
            "{rest:?}"
        );
        *per_path.entry(disk.clone()).or_default() += n;
    }
    assert_eq!(per_path.values().sum::<u64>(), N, "{rest:?}");
    assert_eq!(
        per_path.len(),
        2,
        "round-robin used one path only: {rest:?}"
    );
    assert!(
        after.iter().all(|p| p.active),
        "a medium error failed a path: {after:?}"
    );
    if seen.contains_key("ENODATA") {
        assert_logged(
            &run,
            &condition(POD_A, pv, "raised", "DataLoss MediumErrors", "kernel"),
        );
    }
    let stack_raised: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(": raised ") && l.contains(&format!("[{STACK}]")))
        .collect();
    assert!(
        stack_raised.is_empty(),
        "every path is up: {stack_raised:#?}"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 2. md raid1.

/// 2. A member failed with `mdadm --fail`: the array serves on one mirror
///    and the volume is Degraded ArrayDegraded (no I/O failed, so no kernel
///    condition). The member removed and added back, md recovers onto it
///    (capped at 4 MiB/s here so that the recovery lasts long enough to be
///    seen: the condition's message says how far it is); whole again, the
///    condition clears.
#[test]
fn md_member_failed_is_array_degraded_until_recovered() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    cmd::require_tools(&["mdadm", "mkfs.ext4"])?;
    let r = Raid1::new("/dev/md5", 2, 64)?;
    let md = r.md.dev.clone();
    let mut kubelet = Kubelet::new()?;
    let pv = "pv-md-degraded";
    let dir = kubelet.fs_volume(POD_A, pv, &md.path)?;
    let agent = start_agent(&kubelet, POD_A, pv, &[])?;
    let mut delays = Delays::default();
    let whole = r.describe();

    let down = condition(POD_A, pv, "raised", "Degraded ArrayDegraded", STACK);
    let t0 = Instant::now();
    r.fail(1)?;
    delays.wait(&agent, "ArrayDegraded raised after mdadm --fail", &down, t0);
    let failed = r.describe();

    // The application goes on, on one mirror.
    let data = [0x3d; 4096];
    fs::o_direct_write(&md.path, IO_BASE, &data).context("O_DIRECT write to the array")?;
    let back = fs::o_direct_read(&md.path, IO_BASE, 4096).context("O_DIRECT read")?;
    assert!(back == data, "the array returned other data");
    let file = dir.join("one-mirror-is-enough");
    std::fs::write(&file, b"written to a degraded array")?;
    std::fs::File::open(&file)?.sync_all()?;

    r.remove(1)?;
    let removed = r.describe();
    r.set_sync_speed_max(Some(4000))?;
    r.add(1)?;
    let recovering = poll_until(WAIT, || {
        (r.attr("sync_action").ok()? == "recover").then(|| r.describe())
    });
    let (recovering, t_recover) = recovering.context("md never started recovering")?;
    // The condition's message follows the recovery.
    let progress = format!(
        "Degraded ArrayDegraded [{STACK}]: raid1 array {} runs without 1 of its 2 members; recover",
        md.name
    );
    delays.wait(
        &agent,
        "ArrayDegraded message with the recovery's progress",
        &progress,
        t_recover,
    );
    let still_recovering = r.attr("sync_action")? == "recover";
    r.set_sync_speed_max(None)?;
    let done = poll_until(Duration::from_secs(120), || {
        (r.attr("degraded").ok()? == "0").then(|| r.describe())
    });
    let (done, t_whole) = done.context("md did not finish recovering within 120 s")?;
    let up = condition(POD_A, pv, "cleared", "Degraded ArrayDegraded", STACK);
    delays.wait(&agent, "ArrayDegraded cleared after recovery", &up, t_whole);
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;

    let k = kernel_release();
    eprintln!("{k}: md whole:       {whole}");
    eprintln!("{k}: md --fail:      {failed}");
    eprintln!("{k}: md --remove:    {removed}");
    eprintln!("{k}: md --add:       {recovering}");
    eprintln!("{k}: md recovered:   {done}");
    eprintln!(
        "{k}: traced: {:?}; {}",
        tally(&run.events),
        kernel_side(&run)
    );
    eprintln!("{k}: volume lines:\n{}", volume_lines(&run, POD_A));
    delays.report();

    assert!(
        run.events.is_empty(),
        "failing a member by hand failed I/O: {}",
        show(&run)
    );
    assert_no_kernel_condition(&run, POD_A);
    assert_logged(&run, &down);
    let msg = message_of(&run, &down).context("ArrayDegraded without a message")?;
    assert_eq!(
        msg,
        format!("raid1 array {} runs without 1 of its 2 members", md.name),
        "the message when the member failed (no recovery yet)"
    );
    assert!(
        still_recovering,
        "the recovery ended before its progress could be checked"
    );
    assert_logged(&run, &progress);
    assert_logged(&run, &up);
    assert_eq!(
        raised_and_cleared(&run, POD_A, "Degraded ArrayDegraded", STACK),
        ["raised", "cleared"],
        "{}",
        run.stderr
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 3. dm-thin.

/// A 64 MiB pool of 64 KiB blocks (1024 blocks), 4 MiB of metadata, and a
/// 256 MiB thin volume in it: thin provisioning, four times over.
fn thin_config(max_data_mb: u64, error_if_no_space: bool) -> ThinConfig {
    ThinConfig {
        data_mb: 64,
        max_data_mb,
        meta_mb: 4,
        block_sectors: 128,
        thin_mb: 256,
        error_if_no_space,
    }
}

/// 1 MiB O_DIRECT writes over [from, to) of `dev`.
fn write_mib(dev: &Path, from: u64, to: u64) -> Result<()> {
    let chunk = vec![0x7e; MIB as usize];
    let mut at = from;
    while at < to {
        fs::o_direct_write(dev, at, &chunk)
            .with_context(|| format!("O_DIRECT write of 1 MiB at {} MiB", at / MIB))?;
        at += MIB;
    }
    Ok(())
}

/// 3a. The pool filling past `--thin-pool-low-percent` (50 here): Degraded
///     ThinPoolLow once it is at 50 % exactly, with that percent in the
///     message; not at 48 %. Discarding the thin volume gives its blocks back to the pool
///     and the condition clears.
#[test]
fn thin_pool_past_the_threshold_is_thin_pool_low() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    cmd::require_tools(&["dmsetup", "blkdiscard"])?;
    let stack = ThinStack::new("health-thin-low", thin_config(64, false))?;
    let thin = stack.thin.dev.clone();
    let kubelet = Kubelet::new()?;
    let pv = "pv-thin-low";
    kubelet.block_volume(POD_A, pv, &thin)?;
    let agent = start_agent(&kubelet, POD_A, pv, &["--thin-pool-low-percent", "50"])?;
    let mut delays = Delays::default();
    let empty = stack.status()?;
    let low = condition(POD_A, pv, "raised", "Degraded ThinPoolLow", STACK);

    // 31 MiB of 64 (496 blocks): 48.4 %, under the threshold for a few
    // stack rounds.
    write_mib(&thin.path, 0, 31 * MIB)?;
    let below = stack.status()?;
    std::thread::sleep(Duration::from_secs(3));
    let early = agent.wait_for_log(&low, Duration::ZERO);

    // 1 MiB more: 512 blocks, exactly 50 % ("at or above").
    write_mib(&thin.path, 31 * MIB, 32 * MIB)?;
    let t0 = Instant::now();
    let above = stack.status()?;
    delays.wait(
        &agent,
        "ThinPoolLow raised after the pool reached 50 %",
        &low,
        t0,
    );

    let t1 = Instant::now();
    cmd::run("blkdiscard", &[thin.path.to_string_lossy().as_ref()])
        .context("discarding the thin volume")?;
    let freed = poll_until(WAIT, || stack.status().ok().filter(|s| s.used_data == 0));
    let cleared = condition(POD_A, pv, "cleared", "Degraded ThinPoolLow", STACK);
    delays.wait(
        &agent,
        "ThinPoolLow cleared after the discard",
        &cleared,
        t1,
    );
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;

    let k = kernel_release();
    eprintln!("{k}: pool empty:     {}", empty.line);
    eprintln!("{k}: pool at 31 MiB: {}", below.line);
    eprintln!("{k}: pool at 32 MiB: {}", above.line);
    match &freed {
        Some((s, _)) => eprintln!("{k}: pool discarded: {}", s.line),
        None => eprintln!("{k}: pool discarded: blocks still used after {WAIT:?}"),
    }
    eprintln!(
        "{k}: traced: {:?}; {}",
        tally(&run.events),
        kernel_side(&run)
    );
    eprintln!("{k}: volume lines:\n{}", volume_lines(&run, POD_A));
    delays.report();

    assert!(below.data_percent() < 50.0, "{}", below.line);
    assert_eq!(above.data_percent(), 50.0, "{}", above.line);
    assert!(above.meta_percent() < 50.0, "{}", above.line);
    assert!(
        !early,
        "ThinPoolLow raised below the threshold:\n{}",
        run.stderr
    );
    assert!(run.events.is_empty(), "{}", show(&run));
    assert_no_kernel_condition(&run, POD_A);
    assert_logged(&run, &low);
    let msg = message_of(&run, &low).context("ThinPoolLow without a message")?;
    let percent = above.data_percent().floor() as u64;
    assert!(
        msg.contains(&format!("is {percent}% full (data)")) && msg.contains("50%"),
        "ThinPoolLow message {msg:?}: data {percent}%, threshold 50%"
    );
    assert!(freed.is_some(), "the discard freed nothing");
    assert_logged(&run, &cleared);
    assert_eq!(
        raised_and_cleared(&run, POD_A, "Degraded ThinPoolLow", STACK),
        ["raised", "cleared"],
        "{}",
        run.stderr
    );
    Ok(())
}

/// A writer thread blocked on a full pool: if the test fails while it
/// waits, dropping this fails its queued writes (the pool switched to
/// error mode) and joins it, so the devices can be removed.
struct QueuedWriter<'a> {
    stack: &'a ThinStack,
    done: Arc<AtomicBool>,
    /// Bytes written so far.
    progress: Arc<AtomicU64>,
    result: mpsc::Receiver<(Result<u64, i32>, Duration)>,
    handle: Option<JoinHandle<()>>,
}

impl<'a> QueuedWriter<'a> {
    /// 1 MiB O_DIRECT writes over [0, `to`) of the thin volume; stops at the
    /// first failure (its errno).
    fn start(stack: &'a ThinStack, to: u64) -> QueuedWriter<'a> {
        let (tx, result) = mpsc::channel();
        let done = Arc::new(AtomicBool::new(false));
        let progress = Arc::new(AtomicU64::new(0));
        let path = stack.thin.dev.path.clone();
        let (d, p) = (Arc::clone(&done), Arc::clone(&progress));
        let handle = std::thread::spawn(move || {
            let started = Instant::now();
            let chunk = vec![0x5c; MIB as usize];
            let mut res = Ok(0);
            let mut at = 0;
            while at < to {
                if let Err(e) = fs::o_direct_write(&path, at, &chunk) {
                    res = Err(e.raw_os_error().unwrap_or(-1));
                    break;
                }
                at += MIB;
                p.store(at, Ordering::SeqCst);
                res = Ok(at);
            }
            d.store(true, Ordering::SeqCst);
            let _ = tx.send((res, started.elapsed()));
        });
        QueuedWriter {
            stack,
            done,
            progress,
            result,
            handle: Some(handle),
        }
    }

    fn finished(&self) -> bool {
        self.done.load(Ordering::SeqCst)
    }

    fn written(&self) -> u64 {
        self.progress.load(Ordering::SeqCst)
    }

    /// What the writer got: bytes written or the errno, and how long it
    /// took; `None` if it is still blocked after `timeout`.
    fn wait(&mut self, timeout: Duration) -> Option<(Result<u64, i32>, Duration)> {
        let r = self.result.recv_timeout(timeout).ok()?;
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        Some(r)
    }
}

impl Drop for QueuedWriter<'_> {
    fn drop(&mut self) {
        let Some(h) = self.handle.take() else {
            return;
        };
        if !self.finished() {
            if let Err(e) = self.stack.set_error_if_no_space(true) {
                eprintln!("QueuedWriter cleanup: switching the pool to error mode: {e:#}");
            }
        }
        let _ = h.join();
    }
}

/// 3b. The pool full in queue mode (no `error_if_no_space`,
///     `no_space_timeout` 0: forever): a writer's O_DIRECT writes past the
///     pool's 64 MiB block in the kernel. While it waits, the volume is
///     Inaccessible ThinPoolFull (its message says the writes are queued)
///     and, with `--stall-after 2`, Inaccessible IOStalled on the thin
///     device, writes only, its message joined by the pool's ThinPoolFull;
///     the pool grown to 128 MiB (as `lvextend` does: the data device,
///     then the pool's table), the queued writes go on, all of them
///     succeed, nothing is counted as failed, and both conditions clear.
#[test]
fn thin_pool_full_in_queue_mode_is_thin_pool_full_while_writes_wait() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    cmd::require_tools(&["dmsetup"])?;
    // Declared first: restored after the pool is gone.
    let timeout = NoSpaceTimeout::set(0)?;
    let stack = ThinStack::new("health-thin-queue", thin_config(128, false))?;
    let thin = stack.thin.dev.clone();
    let kubelet = Kubelet::new()?;
    let pv = "pv-thin-queue";
    kubelet.block_volume(POD_A, pv, &thin)?;
    let agent = start_agent(&kubelet, POD_A, pv, FOLLOWED_STALLS)?;
    let mut delays = Delays::default();
    let empty = stack.status()?;

    const TOTAL: u64 = 96 * MIB;
    let mut writer = QueuedWriter::start(&stack, TOTAL);
    let full = poll_until(WAIT, || {
        stack
            .status()
            .ok()
            .filter(|s| s.mode == "out_of_data_space")
    });
    let (full, t_full) = full.context("the pool never ran out of data space")?;
    let at_full = writer.written();
    let raised = condition(POD_A, pv, "raised", "Inaccessible ThinPoolFull", STACK);
    delays.wait(
        &agent,
        "ThinPoolFull raised after the pool ran out of space",
        &raised,
        t_full,
    );
    let stalled = condition(POD_A, pv, "raised", IO_STALLED, STALL);
    delays.wait(
        &agent,
        "IOStalled raised after the pool ran out of space",
        &stalled,
        t_full,
    );
    // Joined by the pool's state, at the raise or in an update after it
    // (only a stall's message says "the stack:").
    let joined = "; the stack: ThinPoolFull: ";
    let join_seen = agent.wait_for_log(joined, CONDITION_WAIT);
    // Still waiting, and not a byte further.
    let blocked = !writer.finished();
    let at_raise = writer.written();
    let still_full = stack.status()?;

    // The pool resumes with its new size when grow returns.
    stack.grow(128)?;
    let t_grow = Instant::now();
    let cleared = condition(POD_A, pv, "cleared", "Inaccessible ThinPoolFull", STACK);
    delays.wait(
        &agent,
        "ThinPoolFull cleared after the pool grew",
        &cleared,
        t_grow,
    );
    let moving = condition(POD_A, pv, "cleared", IO_STALLED, STALL);
    delays.wait(
        &agent,
        "IOStalled cleared after the pool grew",
        &moving,
        t_grow,
    );
    let got = writer.wait(WAIT);
    let grown = stack.status()?;
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;

    let k = kernel_release();
    eprintln!("{k}: no_space_timeout was {}, set to 0", timeout.old());
    eprintln!("{k}: pool empty:  {}", empty.line);
    eprintln!(
        "{k}: pool full:   {} (writer at {} MiB)",
        full.line,
        at_full / MIB
    );
    eprintln!(
        "{k}: when raised: {} (writer at {} MiB, {})",
        still_full.line,
        at_raise / MIB,
        if blocked { "blocked" } else { "finished" }
    );
    eprintln!("{k}: pool grown:  {}", grown.line);
    eprintln!("{k}: the writer got {got:?}");
    eprintln!(
        "{k}: traced: {:?}; {}",
        tally(&run.events),
        kernel_side(&run)
    );
    eprintln!("{k}: volume lines:\n{}", volume_lines(&run, POD_A));
    eprintln!(
        "{k}: ThinPoolLow around it: {:?}",
        transitions(&run, POD_A, "Degraded ThinPoolLow", STACK)
    );
    delays.report();

    assert_eq!(full.used_data, full.total_data, "{}", full.line);
    assert_eq!(full.no_space, "queue_if_no_space", "{}", full.line);
    assert_logged(&run, &raised);
    assert!(
        blocked,
        "the writer was not blocked when ThinPoolFull was raised"
    );
    assert_eq!(
        at_full, at_raise,
        "the writer moved while the pool was full"
    );
    assert!(at_raise < TOTAL, "{at_raise}");
    let msg = message_of(&run, &raised).context("ThinPoolFull without a message")?;
    assert!(
        msg.contains("out of data space") && msg.contains("queued"),
        "ThinPoolFull message {msg:?}: out of data space, writes queued"
    );
    let (res, _) = got.context("the writer was still blocked after the pool grew")?;
    assert_eq!(res, Ok(TOTAL), "what the queued writer got");
    assert_eq!(grown.mode, "rw", "{}", grown.line);
    assert!(
        run.events.is_empty(),
        "queued writes failed: {}",
        show(&run)
    );
    assert_no_kernel_condition(&run, POD_A);
    assert_logged(&run, &cleared);
    assert_eq!(
        raised_and_cleared(&run, POD_A, "Inaccessible ThinPoolFull", STACK),
        ["raised", "cleared"],
        "{}",
        run.stderr
    );
    // The stall: the thin device, writes only, the pool's state joined.
    assert!(
        join_seen,
        "no stall joined by ThinPoolFull:\n{}",
        volume_lines(&run, POD_A)
    );
    let pool_says = message_of(&run, &raised).unwrap_or_default();
    let stall = run
        .stderr
        .lines()
        .filter_map(|l| l.split_once(&format!(" {IO_STALLED} [{STALL}]: ")))
        .map(|(_, message)| message)
        .find(|m| m.contains(joined))
        .context("the joined stall line")?;
    let (head, tail) = stall.split_once(joined).context("split at the join")?;
    assert!(
        head.starts_with(&format!("{}: I/O stalled, ", thin.name)),
        "{stall}"
    );
    let counts = head
        .split_once(" waiting (")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map(|(counts, _)| counts)
        .context("the stall's counts")?;
    assert!(
        counts.ends_with(" writes") || counts == "1 write",
        "writes only wait: {stall}"
    );
    assert!(
        head.contains("; the oldest, a write") && head.ends_with("(--stall-after 2s)"),
        "{stall}"
    );
    assert_eq!(
        tail, pool_says,
        "the pool's ThinPoolFull joined as it said it"
    );
    assert_eq!(
        raised_and_cleared(&run, POD_A, IO_STALLED, STALL),
        ["raised", "cleared"],
        "{}",
        volume_lines(&run, POD_A)
    );
    drop(writer);
    Ok(())
}

/// 3c. The pool full in error mode (`error_if_no_space`): the pool filled
///     to its last block, each O_DIRECT write of one pool block (64 KiB,
///     one bio) to an unprovisioned place fails with ENOSPC. The thin
///     device is bio-based: each failure is one failed bio on it
///     (`block_bio_complete`), counted for the pod once; the volume is
///     Degraded OutOfSpace from the kernel's evidence and Inaccessible
///     ThinPoolFull from the pool's state.
#[test]
fn thin_pool_full_in_error_mode_fails_writes_with_enospc() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    cmd::require_tools(&["dmsetup"])?;
    let stack = ThinStack::new("health-thin-error", thin_config(64, true))?;
    let thin = stack.thin.dev.clone();
    let kubelet = Kubelet::new()?;
    let pv = "pv-thin-error";
    kubelet.block_volume(POD_A, pv, &thin)?;
    let mut agent = start_agent(&kubelet, POD_A, pv, &[])?;
    let mut delays = Delays::default();
    let empty = stack.status()?;

    // Every block of the pool.
    write_mib(&thin.path, 0, 64 * MIB)?;
    let filled = stack.status()?;

    const N: u64 = 3;
    let block = stack.block_bytes();
    let mut seen: BTreeMap<String, u64> = BTreeMap::new();
    let t0 = Instant::now();
    for i in 0..N {
        let at = 100 * MIB + i * block;
        match fs::o_direct_write(&thin.path, at, &vec![0x11; block as usize]) {
            Ok(n) => panic!("write {i} to a full pool wrote {n} bytes"),
            Err(e) => {
                let errno = e.raw_os_error().context("an OS error")?;
                *seen.entry(errno_name(errno)).or_default() += 1;
            }
        }
    }
    let after = stack.status()?;
    let raised = condition(POD_A, pv, "raised", "Inaccessible ThinPoolFull", STACK);
    delays.wait(
        &agent,
        "ThinPoolFull raised after the first failed write",
        &raised,
        t0,
    );
    let got = agent.wait_for_count(&EventFilter::device(&thin.maj_min), N, WAIT);
    std::thread::sleep(Duration::from_secs(2));
    let run = agent.stop_cleanly()?;

    let k = kernel_release();
    eprintln!("{k}: pool empty:  {}", empty.line);
    eprintln!("{k}: pool filled: {}", filled.line);
    eprintln!("{k}: after {N} writes: {}", after.line);
    eprintln!("{k}: the application saw {seen:?}");
    eprintln!(
        "{k}: traced ({got} of {N} awaited): {:#?}; {}",
        tally(&run.events),
        kernel_side(&run)
    );
    eprintln!("{k}: volume lines:\n{}", volume_lines(&run, POD_A));
    delays.report();

    assert_eq!(filled.used_data, filled.total_data, "{}", filled.line);
    assert_eq!(after.mode, "out_of_data_space", "{}", after.line);
    assert_eq!(after.no_space, "error_if_no_space", "{}", after.line);
    assert_eq!(
        seen,
        BTreeMap::from([("ENOSPC".to_string(), N)]),
        "what the writes returned"
    );
    let want: Tally = [(
        key(POD_A, &thin.name, "block_bio_complete", "write", "ENOSPC"),
        N,
    )]
    .into();
    assert_eq!(tally(&run.events), want, "{}", show(&run));
    assert_logged(
        &run,
        &condition(POD_A, pv, "raised", "Degraded OutOfSpace", "kernel"),
    );
    assert_logged(&run, &raised);
    let msg = message_of(&run, &raised).context("ThinPoolFull without a message")?;
    assert!(
        msg.contains("out of data space") && msg.contains("ENOSPC"),
        "ThinPoolFull message {msg:?}: out of data space, writes fail with ENOSPC"
    );
    Ok(())
}

// ---------------------------------------------------------------------------------------
// 4. A suspended device-mapper device: I/O queues in dm until it resumes.

/// dm-delay holding every request of a mounted volume's device 300 ms
/// (a slow disk, none stuck), written by six writers one write after the
/// other each (30-odd completions a window) with `--latency-window 2` and
/// a 150 ms limit: HighLatency (Degraded) on the dm device after three
/// slow windows, the p99 named by its bucket (262 ms, or above where the
/// emulator adds its own delay), no IOStalled (`--stall-after 10`);
/// cleared three windows after the table is swapped for a linear one.
/// The limit is far above what the emulator itself costs a write (a
/// loaded TCG guest's p99 reached 60 ms on dm-linear over a loop device,
/// which a 50 ms limit could not tell from a slow disk).
#[test]
fn a_dm_delay_device_is_high_latency_not_stalled_until_it_is_fast() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let pv = "pv-delayed";
    let disk = FaultDisk::start(64 * 1024 * 1024)?;
    let lo = disk.attach_loop(false)?;
    let lo_path = lo.path().display().to_string();
    let held = Duration::from_millis(300);
    let dm = DmDevice::create(
        "latency-delay",
        &format!("0 131072 delay {lo_path} 0 {}", held.as_millis()),
    )?;
    let mut kubelet = Kubelet::new()?;
    kubelet.fs_volume(POD_A, pv, &dm.mapper_path())?;
    let agent = start_agent(
        &kubelet,
        POD_A,
        pv,
        &[
            "--stall-after",
            "10",
            "--latency-window",
            "2",
            "--latency-limit",
            "rotational=150",
            "--latency-limit",
            "ssd=150",
            "--latency-relative",
            "0",
        ],
    )?;
    let raised = condition(POD_A, pv, "raised", "Degraded HighLatency", "check/latency");
    let cleared = condition(
        POD_A,
        pv,
        "cleared",
        "Degraded HighLatency",
        "check/latency",
    );
    let writes: Vec<_> = (0..6)
        .map(|i| fs::Writes::start(&dm.mapper_path(), IO_BASE + i * 4096))
        .collect();
    let mut delays = Delays::default();
    let seen = delays.wait(&agent, "HighLatency while delayed", &raised, Instant::now());
    let fast = Instant::now();
    dm.replace_table(&format!("0 131072 linear {lo_path} 0"))?;
    let gone = delays.wait(&agent, "HighLatency cleared once fast", &cleared, fast);
    let written = writes
        .into_iter()
        .map(fs::Writes::stop)
        .sum::<std::io::Result<u64>>()?;
    let run = agent.stop_cleanly()?;
    delays.report();
    eprintln!("dm-delay 300 ms, six writers: {written} writes");
    ensure!(
        seen && gone,
        "no raise or no clear:\n{}",
        volume_lines(&run, POD_A)
    );
    assert_slow_writes(&run, &raised, (&dm.dev.name, lo.name(), POD_A), 150, held)?;
    assert_eq!(
        raised_and_cleared(&run, POD_A, "Degraded HighLatency", "check/latency"),
        ["raised", "cleared"]
    );
    assert_eq!(
        transitions(&run, POD_A, IO_STALLED, STALL),
        Vec::<String>::new()
    );
    Ok(())
}

/// `dmsetup suspend --nolockfs` of a dm-linear device under a mounted
/// volume (the filesystem is not frozen: the application's I/O reaches dm
/// and waits there, unaccounted in the device's own statistics): with
/// `--stall-after 2`, a held O_DIRECT write is `IOStalled` on the dm device
/// within the poll, named by the writer's cgroup, and cleared once
/// `dmsetup resume` lets it through.
#[test]
fn a_suspended_dm_device_is_io_stalled_until_resumed() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let pv = "pv-suspended";
    let disk = FaultDisk::start(64 * 1024 * 1024)?;
    let lo = disk.attach_loop(false)?;
    let dm = DmDevice::create(
        "stall-linear",
        &format!("0 131072 linear {} 0", lo.path().display()),
    )?;
    let mut kubelet = Kubelet::new()?;
    kubelet.fs_volume(POD_A, pv, &dm.mapper_path())?;
    let agent = start_agent(&kubelet, POD_A, pv, FOLLOWED_STALLS)?;
    let raised = condition(POD_A, pv, "raised", IO_STALLED, STALL);
    let cleared = condition(
        POD_A,
        pv,
        "cleared",
        "Inaccessible IOStalled",
        "check/stall",
    );

    let cgroup = TestCgroup::new("dm-suspend")?;
    cmd::run(
        "dmsetup",
        &["suspend", "--nolockfs", "--noudevsync", &dm.name],
    )?;
    let submitted = Instant::now();
    let mut writer = cgroup.o_direct_write(&dm.mapper_path(), IO_BASE)?;
    let mut delays = Delays::default();
    let seen = delays.wait(&agent, "IOStalled after the write", &raised, submitted);
    let resumed = Instant::now();
    cmd::run("dmsetup", &["resume", "--noudevsync", &dm.name])?;
    let written = writer.wait().context("waiting for dd")?;
    let gone = delays.wait(&agent, "IOStalled cleared after resume", &cleared, resumed);
    let run = agent.stop_cleanly()?;
    delays.report();
    ensure!(
        seen && gone,
        "no raise or no clear:\n{}",
        volume_lines(&run, POD_A)
    );
    ensure!(written.success(), "dd: {written}");
    let (name, who) = (&dm.dev.name, &cgroup.path);
    assert_eq!(
        message_of(&run, &raised).as_deref(),
        Some(
            format!(
                "{name}: I/O stalled, 1 waiting (1 write); the oldest, a write from cgroup {who}, has waited 2s+ (--stall-after 2s)"
            )
            .as_str()
        ),
        "{}",
        volume_lines(&run, POD_A)
    );
    assert_eq!(
        raised_and_cleared(&run, POD_A, IO_STALLED, STALL),
        ["raised", "cleared"]
    );
    Ok(())
}
