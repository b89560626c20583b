//! The agent against an iSCSI disk: the kernel's LIO target exports a
//! device-mapper backend over TCP on 127.0.0.1 and the open-iscsi initiator
//! logs in to it (tests/src/iscsi.rs); ext4 on the initiator's sd disk is a
//! pod's filesystem volume.
//!
//! 1. The backend fails reads: each failure the application sees is one
//!    failed request on the sd disk, counted for the pod.
//! 2. The session is lost (loopback down): the disk is `blocked` while I/O
//!    waits, then `transport-offline` after the replacement timeout, when
//!    the waiting read fails; the stack check says so on the pod volume
//!    (DeviceBlocked, then TransportOffline), and clears once the session
//!    is back.
//!
//! These need the LIO target and open-iscsi, which the development host
//! lacks: the target is `test = false` and runs in the VMs of Debian's
//! kernels,
//!
//! ```text
//! cargo xtask vm --kernel 6.1 --tests iscsi
//! ```
//!
//! Every test fails (never skips) when a module or tool is missing, runs
//! alone, and tears its stack down even when it fails (loopback up,
//! logout, iscsid stopped, configfs entries, dm and loop devices removed).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use health_tests::devices::BlockDev;
use health_tests::iscsi::{DirectReader, IscsiStack, LoopbackDown, Timeouts};
use health_tests::kubelet_tree::Kubelet;
use health_tests::vm_report::{
    assert_logged, assert_one_read_stalled, cleared, condition_lines, kernel_release, key,
    message_of, raised, raised_and_cleared, request_source, show, tally, volume_lines, Tally,
};
use health_tests::{fs, kernel_alone, require_root};

const WAIT: Duration = Duration::from_secs(30);

const EIO: i32 = libc::EIO;

const POD_A: &str = "da7a0000-0000-4000-8000-0000000015c1";
const IO_STALLED: &str = "Inaccessible IOStalled";
const STALL: &str = "check/stall";

/// Size of the backend (and so of the sd disk).
const DISK_MB: u64 = 64;
/// Size of the filesystem on the sd disk: the sectors the test fails or
/// reads are beyond it, so the filesystem never touches them.
/// Where the backend fails (512-byte sectors): 40 MiB in.
const BAD_SECTOR: u64 = 81_920;
const BAD_COUNT: u64 = 8_192;
/// Where the application of scenario 2 reads (bytes): 48 MiB in.
const READ_BASE: u64 = 48 << 20;

/// The rows of one disk.
fn on_disk(t: &Tally, disk: &str) -> Tally {
    t.iter()
        .filter(|(key, _)| key.1 == disk)
        .map(|(key, n)| (key.clone(), *n))
        .collect()
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// Seconds from `origin` to `t`, negative when `t` is earlier.
fn since(origin: Instant, t: Instant) -> f64 {
    match t.checked_duration_since(origin) {
        Some(d) => d.as_secs_f64(),
        None => -origin.duration_since(t).as_secs_f64(),
    }
}

// ---------------------------------------------------------------------------------------

/// 1. The backend fails reads (dm `error` over a range beyond the
///    filesystem): LIO answers CHECK CONDITION (Not Ready, logical unit
///    communication failure), the sd disk fails the request with EIO. Each
///    failed O_DIRECT read of the sd disk is one `read EIO` on the sd disk,
///    for the pod whose volume lives there; the backend's own failed bios
///    (on the target's dm device, under no pod volume) are not the pod's.
#[test]
fn iscsi_backend_errors_are_counted_on_the_sd_disk() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let stack = IscsiStack::start("backend", DISK_MB, Timeouts::default())?;
    let disk = stack.disk.clone();
    let mut kubelet = Kubelet::new()?;
    kubelet.fs_volume(POD_A, "pv-iscsi", &disk.path)?;
    let mut agent = kubelet.agent(&[])?;
    eprintln!(
        "{}: {} ({}) over session {} to {}, backend {} ({})",
        kernel_release(),
        disk.name,
        disk.maj_min,
        stack.session.display(),
        stack.target.iqn,
        stack.backend.dm.dev.name,
        stack.backend.dm.dev.maj_min
    );

    stack.backend.fail_range(BAD_SECTOR, BAD_COUNT)?;
    const N: u64 = 3;
    let mut seen = Vec::new();
    for i in 0..N {
        let r = fs::o_direct_read(&disk.path, BAD_SECTOR * 512 + i * 4096, 4096);
        seen.push(r.map(|b| b.len()).map_err(|e| e.raw_os_error()));
    }
    // Outside the failing range all is well.
    let good = fs::o_direct_read(&disk.path, 1 << 20, 4096).map(|b| b.len());
    stack.backend.heal()?;
    eprintln!(
        "{}: the application's reads of the failing range: {seen:?}; a good read: {good:?}",
        kernel_release()
    );

    let got = agent.wait_for_count(
        &health_tests::agent::EventFilter::device(&disk.maj_min),
        N,
        WAIT,
    );
    std::thread::sleep(Duration::from_secs(2));
    let run = agent.stop_cleanly()?;
    let all = tally(&run.events);
    eprintln!(
        "{}: {got} errors on {} arrived; every row: {all:#?}\ncondition lines: {:#?}",
        kernel_release(),
        disk.name,
        condition_lines(&run, POD_A)
    );

    for (i, r) in seen.iter().enumerate() {
        assert_eq!(*r, Err(Some(EIO)), "read {i} of the failing range");
    }
    assert_eq!(good.ok(), Some(4096), "the read outside the failing range");
    let backend = &stack.backend.dm.dev.name;
    let want: Tally = [
        (key(POD_A, &disk.name, request_source(), "read", "EIO"), N),
        // The failed bios under the target, on its bio-based dm device:
        // counted, but no pod's.
        (key("-", backend, "block_bio_complete", "read", "EIO"), N),
    ]
    .into();
    assert_eq!(all, want, "{}", show(&run));
    for e in run
        .events
        .iter()
        .filter(|e| e["disk"] == disk.name.as_str())
    {
        assert_eq!(e["device"], disk.maj_min.as_str(), "{e}");
        assert_eq!(e["pv"], "pv-iscsi", "{e}");
        assert_eq!(e["volume_mode"], "Filesystem", "{e}");
    }
    assert_logged(
        &run,
        &raised(POD_A, "pv-iscsi", "Degraded BlockIOErrors", "kernel"),
    );
    Ok(())
}

/// What the application's reader thread says.
enum ReaderSays {
    Started(u32, Instant),
    Done(u32, Instant, Duration, ReadResult),
    /// The reader could not open the disk.
    OpenFailed(std::io::Error),
}

/// A state seen, and when (since loopback went down, or came up).
struct Seen {
    at: Duration,
    device: String,
    session: String,
}

/// One line per change: `+3.35 s device blocked, session FAILED`.
fn timeline(states: &[Seen]) -> String {
    states
        .iter()
        .map(|s| {
            format!(
                "  +{:.2} s device {}, session {}",
                s.at.as_secs_f64(),
                s.device,
                s.session
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// What a read returned: bytes, or the errno.
type ReadResult = std::result::Result<usize, Option<i32>>;

/// 2. The session is lost: loopback goes down while the application reads
///    the disk (O_DIRECT, one descriptor). The NOP-Out ping times out, the
///    session fails and the disk is `blocked`: the read waits, and the stack
///    check raises Inaccessible DeviceBlocked while it does. After the
///    replacement timeout the disk is `transport-offline`, the read fails
///    with EIO (counted once on the sd disk, as are the reads the
///    application makes after it) and the stack check raises Inaccessible
///    TransportOffline. With loopback up, iscsid logs in again, the disk is
///    `running` and the condition clears. With `--stall-after 2`, the read
///    that waits is Inaccessible IOStalled on the sd disk within the poll
///    past 2 s (one read), its message joined by DeviceBlocked while the
///    session recovers, cleared when the read fails.
#[test]
fn iscsi_session_lost_blocks_then_offlines_the_disk() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let timeouts = Timeouts::default();
    let stack = IscsiStack::start("session", DISK_MB, timeouts)?;
    let disk: BlockDev = stack.disk.clone();
    let mut kubelet = Kubelet::new()?;
    let pv = "pv-iscsi-session";
    kubelet.fs_volume(POD_A, pv, &disk.path)?;
    let agent = kubelet.agent(&["--stall-after", "2", "--follow-bios"])?;
    let blocked_line = raised(POD_A, pv, "Inaccessible DeviceBlocked", "check/stack");
    let stall_line = raised(POD_A, pv, IO_STALLED, STALL);
    let offline_line = raised(POD_A, pv, "Inaccessible TransportOffline", "check/stack");
    let offline_cleared = cleared(POD_A, pv, "Inaccessible TransportOffline", "check/stack");
    // A few stack checks with the session up: nothing to say.
    std::thread::sleep(Duration::from_secs(3));
    let raised_before = agent.wait_for_log(": raised ", Duration::ZERO);
    eprintln!(
        "{}: {} over {}: device {}, session {}",
        kernel_release(),
        disk.name,
        stack.session.display(),
        stack.device_state(),
        stack.session_state()
    );

    // The application: reads every 200 ms through one descriptor until its
    // third failed read (the one that waited, then two on the offline
    // disk), or until told to stop.
    const FAILURES: u32 = 3;
    let stop = Arc::new(AtomicBool::new(false));
    let (tx, rx) = mpsc::channel();
    let reader = {
        let path = disk.path.clone();
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut r = match DirectReader::open(&path) {
                Ok(r) => r,
                Err(e) => {
                    let _ = tx.send(ReaderSays::OpenFailed(e));
                    return;
                }
            };
            let mut failures = 0;
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) && failures < FAILURES {
                let started = Instant::now();
                let _ = tx.send(ReaderSays::Started(i, started));
                let res = r
                    .read_at(READ_BASE + u64::from(i % 256) * 4096, 4096)
                    .map_err(|e| e.raw_os_error());
                if res.is_err() {
                    failures += 1;
                }
                let _ = tx.send(ReaderSays::Done(i, started, started.elapsed(), res));
                i += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    // Stops the reader whatever happens below.
    struct StopOnDrop(Arc<AtomicBool>);
    impl Drop for StopOnDrop {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    let _stop_reader = StopOnDrop(Arc::clone(&stop));
    std::thread::sleep(Duration::from_secs(1));

    let lo = LoopbackDown::take_down()?;
    let down_at = Instant::now();
    let mut states: Vec<Seen> = Vec::new();
    // (index, started: seconds after loopback went down, took, result).
    let mut reads: Vec<(u32, f64, Duration, ReadResult)> = Vec::new();
    // The read in progress: (index, started).
    let mut in_flight: Option<(u32, Instant)> = None;
    let mut reader_error = None;
    let mut blocked_seen: Option<Duration> = None;
    let mut offline_seen: Option<Duration> = None;
    let mut blocked_raised: Option<(Duration, bool)> = None;
    let mut offline_raised: Option<(Duration, bool)> = None;
    let mut stall_raised: Option<Duration> = None;
    let limit = Duration::from_secs(
        u64::from(
            timeouts.noop_out_interval + timeouts.noop_out_timeout + timeouts.replacement_timeout,
        ) + 30,
    );
    let mut failures_seen = 0;
    let mut offline_open = None;
    loop {
        let now = down_at.elapsed();
        let device = stack.device_state();
        let session = stack.session_state();
        if states
            .last()
            .is_none_or(|s| s.device != device || s.session != session)
        {
            states.push(Seen {
                at: now,
                device: device.clone(),
                session,
            });
        }
        if device == "blocked" && blocked_seen.is_none() {
            blocked_seen = Some(now);
        }
        if device == "transport-offline" && offline_seen.is_none() {
            offline_seen = Some(now);
            // A new open of the offline disk.
            offline_open =
                Some(fs::o_direct_read(&disk.path, READ_BASE, 4096).map_err(|e| e.raw_os_error()));
        }
        while let Ok(m) = rx.try_recv() {
            match m {
                ReaderSays::Started(i, t) => in_flight = Some((i, t)),
                ReaderSays::Done(i, t, took, res) => {
                    in_flight = None;
                    if res.is_err() {
                        failures_seen += 1;
                    }
                    reads.push((i, since(down_at, t), took, res));
                }
                ReaderSays::OpenFailed(e) => reader_error = Some(e),
            }
        }
        // A read waiting since before this poll (a read takes ms when the
        // session is up).
        let reader_waiting =
            in_flight.is_some_and(|(_, t)| t.elapsed() > Duration::from_millis(500));
        if blocked_raised.is_none() && agent.wait_for_log(&blocked_line, Duration::ZERO) {
            blocked_raised = Some((now, reader_waiting));
        }
        if offline_raised.is_none() && agent.wait_for_log(&offline_line, Duration::ZERO) {
            offline_raised = Some((now, reader_waiting));
        }
        if stall_raised.is_none() && agent.wait_for_log(&stall_line, Duration::ZERO) {
            stall_raised = Some(now);
        }
        let offline_done = offline_seen.is_some_and(|t| {
            offline_raised.is_some() || now.saturating_sub(t) > Duration::from_secs(10)
        });
        if reader_error.is_some() || (failures_seen >= FAILURES && offline_done) || now > limit {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let hung_read = reads
        .iter()
        .find(|(_, _, _, r)| r.is_err())
        .map(|(i, started, took, r)| (*i, *started, *took, *r));

    // Loopback up: iscsid logs in again.
    let cleared_while_down = agent.wait_for_log(&offline_cleared, Duration::ZERO);
    lo.up()?;
    let up_at = Instant::now();
    let mut running_again = None;
    let mut after_up: Vec<Seen> = Vec::new();
    while up_at.elapsed() < WAIT {
        let device = stack.device_state();
        let session = stack.session_state();
        if after_up
            .last()
            .is_none_or(|s| s.device != device || s.session != session)
        {
            after_up.push(Seen {
                at: up_at.elapsed(),
                device: device.clone(),
                session,
            });
        }
        if device == "running" {
            running_again = Some(up_at.elapsed());
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let running_at = Instant::now();
    let cleared_seen = agent.wait_for_log(&offline_cleared, WAIT);
    let cleared_after = running_at.elapsed();
    let read_after = fs::o_direct_read(&disk.path, READ_BASE, 4096).map(|b| b.len());
    stop.store(true, Ordering::Relaxed);
    reader.join().expect("the reader thread");
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;
    let all = tally(&run.events);

    let rel = kernel_release();
    eprintln!(
        "{rel}: states after loopback went down:\n{}",
        timeline(&states)
    );
    eprintln!(
        "{rel}: the application's reads:\n{}",
        reads
            .iter()
            .map(|(i, started, took, r)| format!(
                "  read {i}: started {started:+.2} s, took {}, {r:?}",
                secs(*took)
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
    eprintln!(
        "{rel}: a new open+read of the transport-offline disk: {offline_open:?}; \
         after recovery: {read_after:?}"
    );
    if let Some((i, started, took, r)) = hung_read {
        eprintln!(
            "{rel}: read {i} started {started:+.2} s after loopback went down, hung {} and \
             ended {r:?}",
            secs(took)
        );
    }
    match (blocked_seen, blocked_raised) {
        (Some(s), Some((r, waiting))) => eprintln!(
            "{rel}: DeviceBlocked raised {} after the disk was seen blocked (reader still \
             waiting: {waiting})",
            secs(r.saturating_sub(s))
        ),
        (s, r) => eprintln!("{rel}: blocked seen at {s:?}, DeviceBlocked raised at {r:?}"),
    }
    match (offline_seen, offline_raised) {
        (Some(s), Some((r, _))) => eprintln!(
            "{rel}: TransportOffline raised {} after the disk was seen transport-offline",
            secs(r.saturating_sub(s))
        ),
        (s, r) => {
            eprintln!("{rel}: transport-offline seen at {s:?}, TransportOffline raised at {r:?}")
        }
    }
    if let (Some((_, started, _, _)), Some(r)) = (hung_read, stall_raised) {
        eprintln!(
            "{rel}: IOStalled raised {:.2} s after the read that waited started (--stall-after 2)",
            r.as_secs_f64() - started
        );
    }
    eprintln!(
        "{rel}: after loopback came up:\n{}\nrunning again after {running_again:?}; \
         TransportOffline cleared: {cleared_seen} ({} after the disk was seen running)",
        timeline(&after_up),
        secs(cleared_after)
    );
    eprintln!(
        "{rel}: rows: {all:#?}\ncondition lines: {:#?}",
        condition_lines(&run, POD_A)
    );

    // The kernel did what this test is about.
    assert!(
        !raised_before,
        "a condition with the session up:\n{}",
        run.stderr
    );
    if let Some(e) = reader_error {
        return Err(e).context("the reader could not open the disk");
    }
    assert!(
        blocked_seen.is_some(),
        "never blocked:\n{}",
        timeline(&states)
    );
    assert!(
        offline_seen.is_some(),
        "never transport-offline:\n{}",
        timeline(&states)
    );
    let (_, _, took, r) = hung_read.context("no read failed")?;
    assert_eq!(r, Err(Some(EIO)), "the read that waited");
    assert!(
        took >= Duration::from_secs(u64::from(timeouts.replacement_timeout)),
        "the read failed after {} only",
        secs(took)
    );
    let failed: Vec<_> = reads.iter().filter(|(_, _, _, r)| r.is_err()).collect();
    assert_eq!(failed.len() as u32, FAILURES, "{reads:?}");
    for (i, _, _, r) in &failed {
        assert_eq!(*r, Err(Some(EIO)), "read {i}");
    }
    assert_eq!(
        offline_open
            .as_ref()
            .map(|r| r.as_ref().map(|b| b.len()).map_err(|e| *e)),
        Some(Err(Some(libc::ENXIO))),
        "opening a transport-offline disk"
    );
    assert!(
        running_again.is_some(),
        "not running again:\n{}",
        timeline(&after_up)
    );
    assert_eq!(
        read_after.ok(),
        Some(4096),
        "a read once the session is back"
    );

    // Each failed read counted once, on the sd disk, for the pod.
    let want: Tally = [(
        key(POD_A, &disk.name, request_source(), "read", "EIO"),
        u64::from(FAILURES),
    )]
    .into();
    assert_eq!(on_disk(&all, &disk.name), want, "{}", show(&run));

    // The stack check.
    let (_, waiting) = blocked_raised
        .with_context(|| format!("{blocked_line:?} never logged:\n{}", run.stderr))?;
    assert!(
        waiting,
        "DeviceBlocked came after the read had failed:\n{}",
        run.stderr
    );
    assert!(
        offline_raised.is_some(),
        "{offline_line:?} never logged:\n{}",
        run.stderr
    );
    assert!(
        !cleared_while_down,
        "TransportOffline cleared while the session was down:\n{}",
        run.stderr
    );
    assert!(
        cleared_seen,
        "{offline_cleared:?} not logged once the disk was running again:\n{}",
        run.stderr
    );

    // The read that waited, a stall while it did, joined by the session's
    // state once the stack check saw the disk blocked.
    let stalled = message_of(&run, &stall_line)
        .with_context(|| format!("no IOStalled:\n{}", volume_lines(&run, POD_A)))?;
    assert_one_read_stalled(&stalled, &disk.name, "2s");
    assert!(
        run.stderr
            .lines()
            .any(|l| l.contains(&format!(" {IO_STALLED} [{STALL}]: "))
                && l.contains("; the stack: DeviceBlocked: ")),
        "no stall joined by DeviceBlocked:\n{}",
        volume_lines(&run, POD_A)
    );
    assert_eq!(
        raised_and_cleared(&run, POD_A, IO_STALLED, STALL),
        ["raised", "cleared"],
        "{}",
        volume_lines(&run, POD_A)
    );
    let (_, started, _, _) = hung_read.context("no read failed")?;
    let after = stall_raised
        .context("IOStalled not seen while polling")?
        .as_secs_f64()
        - started;
    assert!(
        after <= 4.0,
        "IOStalled {after:.2} s after the read started"
    );
    Ok(())
}
