//! `IOStalled` on real kernels: I/O held by the device under a pod volume,
//! seen through the bios the kernel side follows (`WAITING`) and the
//! agent's `--stall-after`. Here a loop device over the project's fault
//! disk, whose server holds every request for as long as it is told (a
//! slow backing store, as a network disk behind a loop device would be).
//! The device-mapper stall (`dmsetup suspend`) is in storage_stacks (the
//! host has no dm module). Runs on the host (`cargo xtask test`) and in
//! the guests (`cargo xtask vm --tests stalls`); needs root and fails
//! without it.
//!
//! Each test prints how long the condition took after the I/O was
//! submitted (docs/benchmarks.md, "Stalls"), and asserts it came within
//! `--stall-after` plus [`TARGET`].

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use health_tests::agent::{Agent, AgentRun};
use health_tests::cgroup::TestCgroup;
use health_tests::kubelet_tree::Kubelet;
use health_tests::vm_report::kernel_release;
use health_tests::{fs, kernel_alone, require_root, FaultDisk, LoopDevice};

const MIB: u64 = 1024 * 1024;
const POD: &str = "57a10000-0000-4000-8000-000000000001";
const PV: &str = "pv-stall";
/// Past the 32 MiB filesystem on the 64 MiB disk: the test's own I/O.
const IO_AT: u64 = 48 * MIB;
/// What the agent promises past `--stall-after`: a poll (0.5 s) and a turn.
const TARGET: Duration = Duration::from_secs(2);
/// For a condition line: generous, emulated guests are slow.
const WAIT: Duration = Duration::from_secs(20);

fn condition(verb: &str) -> String {
    format!("volume pod {POD} pv {PV}: {verb} Inaccessible IOStalled [check/stall]")
}

/// The message of each raised or updated line, in order.
fn messages(run: &AgentRun) -> Vec<String> {
    run.stderr
        .lines()
        .filter_map(|l| {
            ["raised", "updated"]
                .iter()
                .find_map(|verb| l.strip_prefix(&condition(verb))?.strip_prefix(": "))
        })
        .map(str::to_string)
        .collect()
}

/// `raised`, `updated` and `cleared`, in order.
fn transitions(run: &AgentRun) -> Vec<&'static str> {
    run.stderr
        .lines()
        .filter_map(|l| {
            ["raised", "updated", "cleared"]
                .into_iter()
                .find(|verb| l.starts_with(&condition(verb)))
        })
        .collect()
}

/// An O_DIRECT write of 4 KiB at [`IO_AT`] on a thread of its own.
fn write_behind(dev: PathBuf) -> JoinHandle<std::io::Result<usize>> {
    std::thread::spawn(move || fs::o_direct_write(&dev, IO_AT, &[0x5a; 4096]))
}

/// A pod volume (ext4) on a loop device over a fault disk, and the agent
/// watching it with these arguments.
struct Setup {
    agent: Agent,
    _kubelet: Kubelet,
    lo: LoopDevice,
    disk: FaultDisk,
}

fn setup(args: &[&str]) -> Result<Setup> {
    let disk = FaultDisk::start(64 * MIB)?;
    let lo = disk.attach_loop(false)?;
    let mut kubelet = Kubelet::new()?;
    kubelet.fs_volume(POD, PV, lo.path())?;
    let agent = kubelet.agent(args)?;
    Ok(Setup {
        agent,
        _kubelet: kubelet,
        lo,
        disk,
    })
}

/// A write the backing store holds for 5 s, with `--stall-after 2`: raised
/// at 2 s (one write waiting, named by the cgroup of the process that
/// wrote), updated at the 4 s step, cleared once the write completes.
/// Nothing is raised before the write or after it. The bios are followed
/// by the BTF raw tracepoints, whose plain loads cost a fraction of helper
/// calls: every kernel CI runs takes them.
#[test]
fn a_write_held_by_the_backing_store_is_io_stalled_until_it_completes() -> Result<()> {
    held_write(
        &["--stall-after", "2", "--follow-bios"],
        Evidence::Bios("BTF raw tracepoints (tp_btf), fields read by loads"),
    )
}

/// The same with the raw tracepoint programs, which the agent attaches
/// where a verifier refuses the BTF ones, and with `--block-attach
/// tracefs`, which rules BTF raw tracepoints out.
#[test]
fn the_raw_tracepoint_programs_see_the_same_stall() -> Result<()> {
    held_write(
        &["--stall-after", "2", "--follow-bios", "--block-attach", "tracefs"],
        Evidence::Bios("raw tracepoints, fields read by helper calls (the tp_btf programs: not tried: --block-attach tracefs)"),
    )
}

/// The same without `--follow-bios` (the default): the loop device's own
/// counters (one write in flight, none completed) tell the stall; whose
/// write it is, is not said.
#[test]
fn the_devices_counters_tell_the_stall_without_following_a_bio() -> Result<()> {
    held_write(&["--stall-after", "2"], Evidence::Counters)
}

/// What the agent judges stalls from.
#[derive(Clone, Copy)]
enum Evidence {
    /// The bios, followed by these programs (as its log names them).
    Bios(&'static str),
    /// The devices' in-flight and completed counters.
    Counters,
}

/// The held write, with the agent started with `args`, which judges from
/// `evidence`.
fn held_write(args: &[&str], evidence: Evidence) -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    // Bound in this order so that they drop in reverse: the agent, the
    // tree's mounts, the loop device, the fault disk.
    let Setup {
        disk,
        lo,
        _kubelet,
        agent,
    } = setup(args)?;
    let following = match evidence {
        Evidence::Bios(programs) => format!(
            "stalls: following every bio from block_bio_queue to its completion with {programs}"
        ),
        Evidence::Counters => "stalls: a volume is IOStalled once its devices have completed nothing for 2s while requests wait (their counters, read every 0.5 s); no bio followed (neither --follow-bios nor --latency-window): --follow-bios names whose I/O waits".to_string(),
    };
    if !agent.wait_for_log(&following, Duration::ZERO) {
        let run = agent.stop()?;
        bail!(
            "the agent did not say \"{following}\"; its log:\n{}",
            run.stderr
        );
    }
    // Healthy I/O first: no condition.
    fs::o_direct_write(lo.path(), IO_AT, &[0x11; 4096])?;
    std::thread::sleep(Duration::from_secs(3));
    ensure!(
        !agent.wait_for_log(&condition("raised"), Duration::ZERO),
        "IOStalled raised on a healthy volume"
    );

    let cgroup = TestCgroup::new("stalls")?;
    disk.set_delay(Duration::from_secs(5))?;
    let writes = disk.stats()?.requests.write;
    // Starting dd takes a while in an emulated guest: the write was
    // submitted after `spawned` and before the server had it (`received`).
    let spawned = Instant::now();
    let mut writer = cgroup.o_direct_write(lo.path(), IO_AT)?;
    let received = arrival(&disk, writes)?;
    let raised = agent.wait_for_log(&condition("raised"), WAIT);
    let (took, since_spawn) = (received.elapsed(), spawned.elapsed());
    let cleared = agent.wait_for_log(&condition("cleared"), WAIT);
    let cleared_after = received.elapsed();
    disk.set_delay(Duration::ZERO)?;
    let written = writer.wait().context("waiting for dd")?;
    let run = agent.stop_cleanly()?;
    eprintln!(
        "{}: write held 5 s, --stall-after 2: raised {:.2} s after the server had it, cleared after {:.2} s",
        kernel_release(),
        took.as_secs_f64(),
        cleared_after.as_secs_f64()
    );
    ensure!(raised && cleared, "no raise or no clear:\n{}", run.stderr);
    ensure!(written.success(), "dd: {written}");
    let name = lo.name();
    let oldest = match evidence {
        Evidence::Bios(_) => format!(
            "the oldest, a write from cgroup {}, has waited",
            cgroup.path
        ),
        Evidence::Counters => "none has completed for".to_string(),
    };
    assert_eq!(
        messages(&run),
        [
            format!("{name}: I/O stalled, 1 waiting (1 write); {oldest} 2s+ (--stall-after 2s)"),
            format!("{name}: I/O stalled, 1 waiting (1 write); {oldest} 4s+ (--stall-after 2s)"),
        ],
        "{}",
        run.stderr
    );
    assert_eq!(transitions(&run), ["raised", "updated", "cleared"]);
    assert!(
        since_spawn >= Duration::from_secs(2),
        "raised {since_spawn:?} after dd started"
    );
    assert!(
        took <= Duration::from_secs(2) + TARGET,
        "raised {took:?} after the server had the write"
    );
    Ok(())
}

/// When the fault disk's server has received a write beyond the first
/// `before`.
fn arrival(disk: &FaultDisk, before: u64) -> Result<Instant> {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if disk.stats()?.requests.write > before {
            return Ok(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    anyhow::bail!("the write did not reach the fault disk within {WAIT:?}")
}

/// `--stall-after 0` follows no bio and says so; a held write raises
/// nothing.
#[test]
fn stall_after_zero_follows_no_bio() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    // Bound in this order so that they drop in reverse: the agent, the
    // tree's mounts, the loop device, the fault disk.
    let Setup {
        disk,
        lo,
        _kubelet,
        agent,
    } = setup(&["--stall-after", "0"])?;
    disk.set_delay(Duration::from_secs(3))?;
    let writer = write_behind(lo.path().to_path_buf());
    writer.join().expect("the writer thread")?;
    disk.set_delay(Duration::ZERO)?;
    std::thread::sleep(Duration::from_secs(1));
    let run = agent.stop_cleanly()?;
    assert!(
        run.stderr.contains("stalls: off (--stall-after 0)"),
        "{}",
        run.stderr
    );
    assert_eq!(transitions(&run), Vec::<&str>::new(), "{}", run.stderr);
    Ok(())
}

/// A FUSE volume (the fault disk's own mount, bind mounted as a pod's
/// local PV) whose daemon is stopped (SIGSTOP: a wedged or descheduled
/// FUSE driver): a read of a file of it waits, and so does the agent's
/// probe of the mount (statfs always goes to the daemon), so `Inaccessible
/// PathHung` is raised once the probe has waited `--check-timeout`; once
/// the daemon runs again (SIGCONT) the read returns its data and the
/// condition clears. No block device is under the volume: nothing is
/// followed or counted per request, and no IOStalled is raised; the hung
/// probe is this volume's stall. Prints how long each took
/// (docs/benchmarks.md, "Stalls").
#[test]
fn a_stopped_fuse_daemon_is_path_hung_until_it_runs_again() -> Result<()> {
    use std::os::unix::fs::FileExt as _;
    require_root()?;
    let _kernel = kernel_alone();
    const FUSE_POD: &str = "57a10000-0000-4000-8000-000000000002";
    const FUSE_PV: &str = "pv-fuse-stopped";
    let line = |verb: &str| {
        format!(
            "volume pod {FUSE_POD} pv {FUSE_PV}: {verb} Inaccessible PathHung [check/reachability]"
        )
    };
    let disk = FaultDisk::start(16 * MIB)?;
    let mut kubelet = Kubelet::new()?;
    let pod_dir = kubelet.dir_volume(FUSE_POD, FUSE_PV, disk.mount_dir())?;
    let name = disk.image_path().file_name().context("the image's name")?;
    let file = std::fs::File::open(pod_dir.join(name)).context("opening the image")?;
    let agent = kubelet.agent(&["--check-timeout", "2", "--stall-after", "2"])?;
    // One passing check first: the condition below is the stop's.
    std::thread::sleep(Duration::from_secs(2));

    disk.stop_server()?;
    let stopped = Instant::now();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 4096];
        file.read_at(&mut buf, 4 * MIB).map(|n| (n, buf))
    });
    let raised = agent.wait_for_log(&line("raised"), WAIT);
    let raised_after = stopped.elapsed();
    let waiting = !reader.is_finished();
    disk.cont()?;
    let resumed = Instant::now();
    let read = reader.join().expect("the reader thread");
    let cleared = agent.wait_for_log(&line("cleared"), WAIT);
    let cleared_after = resumed.elapsed();
    let run = agent.stop_cleanly()?;
    eprintln!(
        "{}: FUSE daemon stopped: PathHung {:.2} s after SIGSTOP (--check-timeout 2, --check-interval 1), cleared {:.2} s after SIGCONT",
        kernel_release(),
        raised_after.as_secs_f64(),
        cleared_after.as_secs_f64()
    );
    ensure!(
        raised && cleared,
        "PathHung raised {raised}, cleared {cleared}:\n{}",
        run.stderr
    );
    ensure!(waiting, "the read returned while the daemon was stopped");
    let (n, data) = read.context("the read once the daemon ran again")?;
    assert_eq!(n, 4096);
    assert!(data.iter().all(|b| *b == 0), "a fresh image reads zeros");
    let ours: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with(&format!("volume pod {FUSE_POD} pv {FUSE_PV}: ")))
        .collect();
    // The fault disk's statfs answers no free block or inode (its one
    // image file is all it holds): the capacity check's conditions are
    // true of it and not this test's.
    let transitions: Vec<String> = ours
        .iter()
        .map(|l| l.split(": ").nth(1).unwrap_or_default().to_string())
        .filter(|t| !t.starts_with("stack ") && !t.ends_with("[check/capacity]"))
        .collect();
    assert_eq!(
        transitions,
        [
            "raised Inaccessible PathHung [check/reachability]",
            "cleared Inaccessible PathHung [check/reachability]"
        ],
        "{}",
        run.stderr
    );
    let message = ours
        .iter()
        .find(|l| l.starts_with(&line("raised")))
        .and_then(|l| l.split_once("[check/reachability]: "))
        .map(|(_, m)| m)
        .unwrap_or_default()
        .to_string();
    let head = format!("statvfs of {} has not returned since ", pod_dir.display());
    ensure!(
        message.starts_with(&head) && message.ends_with(" (timeout 2s)"),
        "{message:?}: not {head:?}... (timeout 2s)"
    );
    Ok(())
}
