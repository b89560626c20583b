//! The agent over native NVMe multipath: an nvmet target over TCP loopback
//! with two ports to one subsystem (tests/src/nvmet.rs), the host connected
//! to both, a head disk (`nvme0n1`) over two hidden path disks
//! (`nvme0c0n1`, `nvme0c1n1`), given to pod volumes of a kubelet-like tree.
//!
//! The namespace is a dm device over a tmpfs loop device, whose table the
//! tests switch to `error` on a range to fail reads at the target; ports
//! are unlinked from the subsystem on the target to lose paths.
//!
//! These need nvmet, nvmet-tcp, nvme-tcp and dm-mod, which the development
//! host lacks: the target is `test = false` and runs in the VMs,
//!
//! ```text
//! cargo xtask vm --kernel 6.1 --tests nvme_multipath
//! ```
//!
//! Every test fails (never skips) when a module or tool is missing, runs
//! alone, asserts exact counts per (pod, disk, source, op, errno) and the
//! condition lines, and tears its devices down even when it fails.

use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use health_tests::agent::{volumes_json, Agent, AgentRun};
use health_tests::bpffs::Bpffs;
use health_tests::devices::{BlockDev, DmDevice, TmpfsLoop};
use health_tests::kubelet_tree::Kubelet;
use health_tests::nvmet::{self, NvmeOf, Timeouts};
use health_tests::vm_report::{
    assert_logged, assert_one_read_stalled, cleared, kernel_release, key, message_of, passed_up,
    raised, request_source, show, tally, volume_lines, Tally,
};
use health_tests::{cmd, fs, kernel_alone, require_root};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(30);
const EIO: i32 = libc::EIO;

const POD_A: &str = "da7a0000-0000-4000-8000-0000000000a1";
const POD_B: &str = "da7a0000-0000-4000-8000-0000000000b1";

const PORT_1: u16 = 4420;
const PORT_2: u16 = 4421;

/// The backend's size and the range of it the tests fail (beyond the
/// 32 MiB filesystems, so nothing but the tests' own reads touches it).
const BACKEND_MB: u64 = 64;
const BAD_OFFSET: u64 = 48 << 20;
const BAD_LEN: u64 = 1 << 20;

// ---------------------------------------------------------------------------------------
// The backend and the fabric.

/// The namespace's backing device: a dm-linear over a tmpfs loop device,
/// whose middle can be switched to `error`.
struct Backend {
    // Fields drop in declaration order: the dm device before its loop.
    dm: DmDevice,
    lower: TmpfsLoop,
}

impl Backend {
    fn new(name: &str) -> Result<Backend> {
        let lower = TmpfsLoop::new(BACKEND_MB)?;
        let dm = DmDevice::create(name, &Self::linear_table(&lower.dev))?;
        Ok(Backend { dm, lower })
    }

    fn sectors() -> u64 {
        (BACKEND_MB << 20) / 512
    }

    fn linear_table(lower: &BlockDev) -> String {
        format!("0 {} linear {} 0", Self::sectors(), lower.path.display())
    }

    /// Reads and writes of [`BAD_OFFSET`, +[`BAD_LEN`]) fail at the target.
    fn fail_bad_range(&self) -> Result<()> {
        let l = self.lower.dev.path.display();
        let (start, len) = (BAD_OFFSET / 512, BAD_LEN / 512);
        let end = start + len;
        let rest = Self::sectors() - end;
        self.dm.replace_table(&format!(
            "0 {start} linear {l} 0\n{start} {len} error\n{end} {rest} linear {l} {end}"
        ))
    }

    fn heal(&self) -> Result<()> {
        self.dm.replace_table(&Self::linear_table(&self.lower.dev))
    }
}

/// The backend, and the target over it with the host connected to both
/// ports. Declared in that order so that the fabric goes first.
struct Stack {
    fabric: NvmeOf,
    backend: Backend,
}

impl Stack {
    fn new(name: &str, timeouts: Timeouts) -> Result<Stack> {
        let backend = Backend::new(&format!("health-nvmet-{name}"))?;
        let fabric = NvmeOf::start(name, &backend.dm.mapper_path(), &[PORT_1, PORT_2], timeouts)?;
        eprintln!(
            "{}: head {} ({}) over {:?}",
            kernel_release(),
            fabric.head.name,
            fabric.head.maj_min,
            fabric.paths()?
        );
        Ok(Stack { fabric, backend })
    }
}

// ---------------------------------------------------------------------------------------
// A kubelet-like tree (a private copy of device_faults.rs's fixture).

// ---------------------------------------------------------------------------------------
// Events and condition lines.

fn expect_errno(res: std::io::Result<Vec<u8>>, errno: i32, what: &str) {
    match res {
        Ok(_) => panic!("{what}: succeeded, expected errno {errno}"),
        Err(e) => assert_eq!(e.raw_os_error(), Some(errno), "{what}: {e}"),
    }
}

/// No `[kernel]` condition was raised on the pod: losing a path fails no
/// I/O.
fn assert_no_kernel_condition(run: &AgentRun, pod: &str) {
    let prefix = format!("volume pod {pod} ");
    let kernel: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains(&prefix) && l.contains(": raised ") && l.contains("[kernel]"))
        .collect();
    assert!(
        kernel.is_empty(),
        "kernel conditions on pod {pod}: {kernel:#?}\n{}",
        run.stderr
    );
}

/// The pod's `raised`/`cleared` lines of `status_reason`, in order (the
/// word only): a condition that flaps shows up here.
fn transitions(run: &AgentRun, pod: &str, status_reason: &str) -> Vec<String> {
    let prefix = format!("volume pod {pod} ");
    run.stderr
        .lines()
        .filter(|l| l.contains(&prefix))
        .filter_map(|l| {
            ["raised", "cleared"]
                .into_iter()
                .find(|w| l.contains(&format!(": {w} {status_reason} [")))
                .map(str::to_string)
        })
        .collect()
}

/// Whether some object anywhere in `v` has `name` (and `dev`, when given).
fn lists_layer(v: &Value, name: &str, dev: Option<&str>) -> bool {
    match v {
        Value::Object(m) => {
            let here = m.get("name").and_then(Value::as_str) == Some(name)
                && dev.is_none_or(|d| m.get("dev").and_then(Value::as_str) == Some(d));
            here || m.values().any(|x| lists_layer(x, name, dev))
        }
        Value::Array(a) => a.iter().any(|x| lists_layer(x, name, dev)),
        _ => false,
    }
}

/// Polls the controller on `port` until it leaves `live`; when it did.
fn left_live_at(stack: &Stack, port: u16) -> Result<Instant> {
    let ok = stack
        .fabric
        .wait_ctrl_state(port, WAIT, |s| s != Some("live"));
    anyhow::ensure!(
        ok,
        "the controller on port {port} stayed live for {WAIT:?} after its port was unlinked"
    );
    Ok(Instant::now())
}

// ---------------------------------------------------------------------------------------

/// 1. Reads the target fails: each is one failed request on the path disk
///    that carried it (traced with the path disk's number; the head is
///    bio-based and fails nothing itself), counted once per pod volume of
///    the head (ext4 on it, and the head in block mode), named by the path
///    disk's kernel name; the path disk is in `volumes --json`, and both
///    volumes are Degraded BlockIOErrors. The backend's own failures (the
///    dm error target, a device of no pod) are counted on it.
#[test]
fn errors_on_a_path_are_counted_once_on_the_path_disk_for_the_heads_volumes() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    cmd::require_tools(&["dmsetup", "losetup", "mkfs.ext4", "ip"])?;
    let stack = Stack::new("path-errors", Timeouts::default())?;
    let head = &stack.fabric.head;
    let bpffs = Bpffs::mount()?;
    let pin = bpffs.pin_dir_arg();
    let mut kubelet = Kubelet::new()?;
    kubelet.fs_volume(POD_A, "pv-nvme-fs", &head.path)?;
    kubelet.block_volume(POD_B, "pv-nvme-blk", head)?;
    let mut agent = kubelet.agent(&["--pin-dir", &pin])?;

    stack.backend.fail_bad_range()?;
    let paths = stack.fabric.paths()?;
    let before: Vec<u64> = paths
        .iter()
        .map(|p| nvmet::diskstats_reads(&p.name))
        .collect::<Result<_>>()?;
    const N: u64 = 3;
    for i in 0..N {
        let r = fs::o_direct_read(&head.path, BAD_OFFSET + i * 4096, 4096);
        expect_errno(
            r,
            EIO,
            &format!("read {i} of the failing range through the head"),
        );
    }
    stack.backend.heal()?;
    // The path that carried them: native multipath (iopolicy numa) keeps
    // one path per node while it is usable.
    let after: Vec<u64> = paths
        .iter()
        .map(|p| nvmet::diskstats_reads(&p.name))
        .collect::<Result<_>>()?;
    let carried: Vec<_> = paths
        .iter()
        .zip(before.iter().zip(&after))
        .filter(|(_, (b, a))| a > b)
        .map(|(p, (b, a))| (p.clone(), a - b))
        .collect();
    assert_eq!(
        carried.len(),
        1,
        "the reads went over one path: {carried:?} (paths {paths:?})"
    );
    let (path, reads) = carried[0].clone();
    // Not necessarily N: besides the application's reads, a kernel may read
    // the path for itself (6.12 counted 5 for 3). What the agent counts is
    // asserted against what the application saw, below.
    assert!(reads >= N, "{reads} reads completed on {}", path.name);
    eprintln!(
        "{}: the reads failed on {path:?} ({reads} reads completed there)",
        kernel_release()
    );

    // One line per error per pod volume; the filter is by name, since 5.10
    // gives the path disks no number outside the trace.
    let got = sys_wait_for_disk(&mut agent, &path.name, 2 * N);
    std::thread::sleep(Duration::from_millis(2000));
    let (vols, _, vol_stderr) = volumes_json(kubelet.root_arg(), &["--pin-dir", &pin])?;
    let run = agent.stop_cleanly()?;
    if got < 2 * N {
        eprintln!("only {got} of {} awaited errors arrived", 2 * N);
    }

    let src = request_source();
    let pods: Vec<Value> = run
        .events
        .iter()
        .filter(|e| e["pod_uid"].is_string())
        .cloned()
        .collect();
    let want: Tally = [
        (key(POD_A, &path.name, src, "read", "EIO"), N),
        (key(POD_B, &path.name, src, "read", "EIO"), N),
    ]
    .into();
    assert_eq!(tally(&pods), want, "{}", show(&run));
    for e in &pods {
        if let Some(mm) = &path.maj_min {
            assert_eq!(e["device"], mm.as_str(), "{e}");
        } else {
            eprintln!(
                "{}: event device {} for {}",
                kernel_release(),
                e["device"],
                path.name
            );
        }
        assert_eq!(e["errno"], EIO, "{e}");
        assert_eq!(e["sectors"], 8, "{e}");
        assert!(e["pv"].is_string(), "{e}");
    }
    for e in pods.iter().filter(|e| e["pod_uid"] == POD_A) {
        assert_eq!(e["pv"], "pv-nvme-fs", "{e}");
        assert_eq!(e["volume_mode"], "Filesystem", "{e}");
    }
    for e in pods.iter().filter(|e| e["pod_uid"] == POD_B) {
        assert_eq!(e["pv"], "pv-nvme-blk", "{e}");
        assert_eq!(e["volume_mode"], "Block", "{e}");
    }
    // The rest: the backend's failed bios (a device of no pod), nothing on
    // the head.
    let others = tally(
        &run.events
            .iter()
            .filter(|e| !e["pod_uid"].is_string())
            .cloned()
            .collect::<Vec<_>>(),
    );
    let want_others: Tally = [(
        key(
            "-",
            &stack.backend.dm.dev.name,
            "block_bio_complete",
            "read",
            "EIO",
        ),
        N,
    )]
    .into();
    assert_eq!(others, want_others, "{}", show(&run));
    assert_eq!(passed_up(&run), 0, "{}", run.stderr);

    // Kernels before 5.15 cannot pin tracepoint attachments (the agent
    // says so), and then pins nothing.
    let pinnable = !run.stderr.contains("cannot pin tracepoint attachments");
    // The path disk is a layer of both volumes, not dropped for having no
    // `dev` file.
    for pod in [POD_A, POD_B] {
        let v = vols
            .iter()
            .find(|v| v["pod_uid"] == pod)
            .unwrap_or_else(|| panic!("no volume of pod {pod} in {vols:#?}\n{vol_stderr}"));
        assert!(
            lists_layer(&v["stack"], &head.name, Some(&head.maj_min)),
            "the head {} is not in the stack: {v:#}",
            head.name
        );
        for p in &paths {
            assert!(
                lists_layer(&v["stack"], &p.name, p.maj_min.as_deref()),
                "the path disk {p:?} is not in the stack: {v:#}"
            );
        }
        let kernel = v["kernel_errors"].as_array().context("kernel_errors")?;
        if !pinnable {
            // Nothing outlives the agent there, so `volumes` has no counts.
            assert!(kernel.is_empty(), "{v:#}");
            assert!(vol_stderr.contains("no agent state pinned"), "{vol_stderr}");
            continue;
        }
        let on_path: Vec<&Value> = kernel
            .iter()
            .filter(|k| k["device_name"] == path.name.as_str())
            .collect();
        assert_eq!(on_path.len(), 1, "{v:#}");
        assert_eq!(on_path[0]["count"], N, "{v:#}");
        assert_eq!(on_path[0]["reason"], "BlockIOErrors", "{v:#}");
    }
    assert_logged(
        &run,
        &raised(POD_A, "pv-nvme-fs", "Degraded BlockIOErrors", "kernel"),
    );
    assert_logged(
        &run,
        &raised(POD_B, "pv-nvme-blk", "Degraded BlockIOErrors", "kernel"),
    );
    Ok(())
}

/// Waits for `n` errors on the disk named `disk` (by the events' `disk`).
fn sys_wait_for_disk(agent: &mut Agent, disk: &str, n: u64) -> u64 {
    let start = Instant::now();
    loop {
        let sum: u64 = agent
            .events()
            .iter()
            .filter(|e| e["disk"] == disk)
            .map(|e| e["count"].as_u64().unwrap_or(0))
            .sum();
        if sum >= n || start.elapsed() >= WAIT {
            return sum;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// 2. One of two paths lost (its port unlinked on the target): the
///    controller reconnects in vain and is removed after ctrl_loss_tmo
///    (5 s), its path disk with it. The volume is Degraded PathsDown from
///    the moment the controller leaves `live` to the moment a new
///    controller on that port is live again; the application's I/O goes on
///    over the other path and nothing fails.
#[test]
fn one_path_lost_is_paths_down_and_cleared_when_it_is_back() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    cmd::require_tools(&["dmsetup", "losetup", "mkfs.ext4", "ip"])?;
    let stack = Stack::new("one-path", Timeouts::default())?;
    let head = &stack.fabric.head;
    let mut kubelet = Kubelet::new()?;
    let dir = kubelet.fs_volume(POD_A, "pv-nvme-paths", &head.path)?;
    let agent = kubelet.agent(&[])?;
    let pv = "pv-nvme-paths";
    let down = raised(POD_A, pv, "Degraded PathsDown", "check/stack");
    let up = cleared(POD_A, pv, "Degraded PathsDown", "check/stack");
    // Both paths live: nothing to say (a few stack scans).
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        !agent.wait_for_log(": raised ", Duration::ZERO),
        "a condition with both paths live"
    );

    let lost = stack.fabric.path_of(PORT_2)?;
    stack.fabric.unlink_port(PORT_2)?;
    let t0 = left_live_at(&stack, PORT_2)?;
    let saw = agent.wait_for_log(&down, WAIT);
    eprintln!(
        "{}: PathsDown {} {:.2} s after {} ({}) left live",
        kernel_release(),
        if saw { "raised" } else { "NOT raised" },
        t0.elapsed().as_secs_f64(),
        lost.ctrl,
        lost.name
    );

    // The application does not notice.
    let file = dir.join("still-here");
    std::fs::write(&file, b"one path is enough")?;
    std::fs::File::open(&file)?.sync_all()?;
    fs::o_direct_read(&head.path, 1 << 20, 4096).context("reading the head over one path")?;

    // Removed after ctrl_loss_tmo: still a path down.
    let removed = stack.fabric.wait_ctrl_state(
        PORT_2,
        Duration::from_secs(u64::from(stack.fabric.timeouts.ctrl_loss_tmo) + 20),
        |s| s.is_none(),
    );
    assert!(removed, "the controller on port {PORT_2} was never removed");
    let paths = stack.fabric.paths()?;
    assert!(
        !paths.iter().any(|p| p.name == lost.name),
        "{} still there: {paths:?}",
        lost.name
    );
    std::thread::sleep(Duration::from_secs(3));
    let cleared_early = agent.wait_for_log(&up, Duration::ZERO);

    // The port back, the host reconnected.
    stack.fabric.link_port(PORT_2)?;
    let ctrl = stack.fabric.connect(PORT_2)?;
    let live = stack
        .fabric
        .wait_ctrl_state(PORT_2, WAIT, |s| s == Some("live"));
    assert!(live, "{ctrl} on port {PORT_2} never went live");
    let t1 = Instant::now();
    let saw_clear = agent.wait_for_log(&up, WAIT);
    eprintln!(
        "{}: PathsDown {} {:.2} s after {ctrl} went live",
        kernel_release(),
        if saw_clear { "cleared" } else { "NOT cleared" },
        t1.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;

    assert!(
        run.events.iter().all(|e| e["pod_uid"] != POD_A),
        "losing a path failed I/O: {}",
        show(&run)
    );
    assert_no_kernel_condition(&run, POD_A);
    assert!(!run.stderr.contains("AllPathsDown"), "{}", run.stderr);
    assert_logged(&run, &down);
    assert!(
        !cleared_early,
        "PathsDown cleared while the path was gone:\n{}",
        run.stderr
    );
    assert_logged(&run, &up);
    // Raised once (connecting, then removed: the same condition), cleared
    // once.
    assert_eq!(
        transitions(&run, POD_A, "Degraded PathsDown"),
        ["raised", "cleared"],
        "{}",
        run.stderr
    );
    Ok(())
}

/// 3. Both paths lost: with no controller `live` the head queues I/O ("no
///    usable path - requeuing I/O") until the last controller is removed.
///    The volume is Inaccessible AllPathsDown while the application's read
///    waits; the ports back within ctrl_loss_tmo (30 s here), the
///    controllers reconnect, the read completes and the condition clears.
///    With `--stall-after 2` the queued read is Inaccessible IOStalled on
///    the head within the poll past 2 s (one read), its message joined by
///    AllPathsDown, cleared once the read completes. (Past ctrl_loss_tmo the read would fail with EIO at the head, and
///    Debian's 5.10 oopses in nvme_tcp doing so.)
#[test]
fn all_paths_lost_is_all_paths_down_while_io_queues() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    cmd::require_tools(&["dmsetup", "losetup", "ip"])?;
    let stack = Stack::new(
        "all-paths",
        Timeouts {
            ctrl_loss_tmo: 30,
            reconnect_delay: 1,
        },
    )?;
    let head = stack.fabric.head.clone();
    let kubelet = Kubelet::new()?;
    let pv = "pv-nvme-all";
    kubelet.block_volume(POD_A, pv, &head)?;
    let agent = kubelet.agent(&["--stall-after", "2", "--follow-bios"])?;
    let down = raised(POD_A, pv, "Inaccessible AllPathsDown", "check/stack");
    let up = cleared(POD_A, pv, "Inaccessible AllPathsDown", "check/stack");
    let stalled = raised(POD_A, pv, "Inaccessible IOStalled", "check/stall");
    std::thread::sleep(Duration::from_secs(3));

    stack.fabric.unlink_port(PORT_1)?;
    stack.fabric.unlink_port(PORT_2)?;
    left_live_at(&stack, PORT_1)?;
    let t0 = left_live_at(&stack, PORT_2)?;
    // The application's read, in a thread: it waits for a path.
    let (tx, rx) = mpsc::channel();
    let path = head.path.clone();
    let read_at = Instant::now();
    let reader = std::thread::spawn(move || {
        let started = Instant::now();
        let r = fs::o_direct_read(&path, 2 << 20, 4096);
        let _ = tx.send((r.map(|b| b.len()), started.elapsed()));
    });
    // Whichever comes first: the paths' state, the read's stall.
    let (mut down_after, mut stall_after) = (None, None);
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline && (down_after.is_none() || stall_after.is_none()) {
        if down_after.is_none() && agent.wait_for_log(&down, Duration::ZERO) {
            down_after = Some(t0.elapsed());
        }
        if stall_after.is_none() && agent.wait_for_log(&stalled, Duration::ZERO) {
            stall_after = Some(read_at.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let joined = agent.wait_for_log("; the stack: AllPathsDown: ", WAIT);
    eprintln!(
        "{}: AllPathsDown {down_after:?} after the last controller left live, IOStalled \
         {stall_after:?} after the read (--stall-after 2), joined: {joined}; states {:?} {:?}",
        kernel_release(),
        stack.fabric.ctrl_state(PORT_1),
        stack.fabric.ctrl_state(PORT_2)
    );
    let waiting = rx.try_recv().is_err();

    stack.fabric.link_port(PORT_1)?;
    stack.fabric.link_port(PORT_2)?;
    let done = rx.recv_timeout(WAIT);
    reader.join().expect("the reader thread");
    for port in [PORT_1, PORT_2] {
        let live = stack
            .fabric
            .wait_ctrl_state(port, WAIT, |s| s == Some("live"));
        assert!(live, "the controller on port {port} never came back");
    }
    let saw_clear = agent.wait_for_log(&up, WAIT);
    std::thread::sleep(Duration::from_millis(1500));
    let run = agent.stop_cleanly()?;

    assert!(waiting, "the read did not wait for a path: {done:?}");
    let (res, took) = done.context("the read never completed after the ports came back")?;
    eprintln!(
        "{}: the read waited {:.1} s and returned {res:?}; cleared: {saw_clear}",
        kernel_release(),
        took.as_secs_f64()
    );
    assert_eq!(res.context("the queued read")?, 4096);
    assert!(
        run.events.iter().all(|e| e["pod_uid"] != POD_A),
        "queued I/O failed: {}",
        show(&run)
    );
    assert_no_kernel_condition(&run, POD_A);
    assert_logged(&run, &down);
    assert_logged(&run, &up);
    assert_eq!(
        transitions(&run, POD_A, "Inaccessible AllPathsDown"),
        ["raised", "cleared"],
        "{}",
        run.stderr
    );
    eprintln!(
        "{}: PathsDown around it: {:?}",
        kernel_release(),
        transitions(&run, POD_A, "Degraded PathsDown")
    );

    // The queued read's stall, on the head, joined by the paths' state.
    let message = message_of(&run, &stalled)
        .with_context(|| format!("no IOStalled:\n{}", volume_lines(&run, POD_A)))?;
    assert_one_read_stalled(&message, &head.name, "2s");
    assert!(
        joined,
        "no stall joined by AllPathsDown:\n{}",
        volume_lines(&run, POD_A)
    );
    assert_eq!(
        transitions(&run, POD_A, "Inaccessible IOStalled"),
        ["raised", "cleared"],
        "{}",
        volume_lines(&run, POD_A)
    );
    let stall_after = stall_after.context("IOStalled not seen")?;
    assert!(
        stall_after <= Duration::from_secs(4),
        "IOStalled {stall_after:?} after the read"
    );
    Ok(())
}
