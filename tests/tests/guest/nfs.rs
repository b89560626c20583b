//! NFS volumes: the kernel's NFS server (knfsd) and client in one guest,
//! over loopback, the export a filesystem of the test's own
//! (tests/src/nfs_server.rs), mounted where kubelet mounts in-tree `nfs`
//! volumes (`pods/<uid>/volumes/kubernetes.io~nfs/<pv>`):
//!
//! ```text
//! cargo xtask vm --kernel 6.12 --tests nfs [--filter NAME]
//! ```
//!
//! - the server stopped under hard NFSv4.2 and NFSv3 mounts:
//!   `Inaccessible ServerNotResponding` on both volumes (the client's own
//!   counters: no reply for the mount's timeout while the agent's probe
//!   waits), cleared when the server answers again, nothing counted;
//! - on three volumes of one server, what applications were told, each
//!   counted exactly on its own volume: ESTALE (a file deleted on the
//!   server, NFSv3), the server's EIO (the export's disk failing) and
//!   ETIMEDOUT (a soft mount, the server stopped);
//! - the export full under a `sync` mount: the writes refused with ENOSPC,
//!   counted once each, said in the writeback errors' condition, and the
//!   volume full by the capacity check;
//! - the export changed to squash the client's root: reads of a file it
//!   holds open refused with EACCES, `Inaccessible AccessDenied`.
//!
//! Every test runs the agent with `--returned-errors` and asserts the exact
//! tally per (pod, disk, source, op, errno).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use health_tests::agent::EventFilter;
use health_tests::cgroup::TestCgroup;
use health_tests::devices::{DmDevice, TmpfsLoop};
use health_tests::fs::{dev_of, RemoteMount};
use health_tests::kubelet_tree::Kubelet;
use health_tests::nfs_server::{NfsServer, Version};
use health_tests::vm_report::{
    cleared, key, last_message, raised, show, tally, tally_on_volumes, Tally,
};
use health_tests::{kernel_alone, require_root};

const MIB: u64 = 1 << 20;
/// The agent's probe times out after 5 s, then the mount's 2 s timeout
/// without a reply, then one check interval: well within this.
const WAIT: Duration = Duration::from_secs(40);
const POD_A: &str = "7e70e000-0000-4000-8000-0000000000b1";
const POD_B: &str = "7e70e000-0000-4000-8000-0000000000b2";
const PV_A: &str = "pv-nfs-a";
const PV_B: &str = "pv-nfs-b";
const POD_C: &str = "7e70e000-0000-4000-8000-0000000000b3";
const PV_C: &str = "pv-nfs-c";
const CHECK: &str = "check/reachability";
const KERNEL: &str = "kernel";
const SOURCE: &str = "vfs_return";
const READER: &str = env!("CARGO_BIN_EXE_file-reader");
/// Short timeouts so that a stopped server shows within seconds (the
/// defaults, timeo=600 over TCP, take minutes).
const HARD: &str = "hard,timeo=20,retrans=2";
/// Soft with `softerr`: a read that times out returns ETIMEDOUT (plain
/// `soft` returns EIO), in about 3 s.
/// `nosharecache`: its own superblock (and device) beside a hard mount
/// of the same export.
const SOFT: &str = "soft,softerr,timeo=10,retrans=1,nosharecache";

/// The export mounted as `pod`'s in-tree NFS volume `pv`.
fn nfs_volume(
    server: &NfsServer,
    kubelet: &Kubelet,
    pod: &str,
    pv: &str,
    version: Version,
    options: &str,
) -> Result<RemoteMount> {
    let dir = kubelet.nfs_volume_dir(pod, pv)?;
    server.mount(version, options, &dir)
}

/// A file of `size` bytes on the export, written on the server's side;
/// its name.
fn export_file(server: &NfsServer, name: &str, size: u64) -> Result<PathBuf> {
    let path = server.export().join(name);
    std::fs::write(&path, vec![0x5a; size as usize])?;
    health_tests::fs::sync_fs(&path)?;
    Ok(PathBuf::from(name))
}

/// The server's threads stopped under a hard NFSv4.2 and a hard NFSv3
/// mount: each volume is `Inaccessible ServerNotResponding` (the agent's
/// own probe waits and the client's transport got no reply for the
/// mount's 2 s timeout), cleared once the server answers; no error was
/// returned to anyone, so nothing is counted.
#[test]
fn a_stopped_server_is_server_not_responding_until_it_answers() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = TmpfsLoop::new(64)?;
    let server = NfsServer::start(&disk.dev.path)?;
    let kubelet = Kubelet::new()?;
    let v4 = nfs_volume(&server, &kubelet, POD_A, PV_A, Version::V4_2, HARD)?;
    let v3 = nfs_volume(&server, &kubelet, POD_B, PV_B, Version::V3, HARD)?;
    let agent = kubelet.agent_counting_returned_errors()?;
    // Healthy first: the checks pass on both before the server stops.
    std::thread::sleep(Duration::from_secs(3));
    server.stop()?;
    let reason = "Inaccessible ServerNotResponding";
    for (pod, pv) in [(POD_A, PV_A), (POD_B, PV_B)] {
        let line = raised(pod, pv, reason, CHECK);
        assert!(
            agent.wait_for_log(&line, WAIT),
            "{line:?} not within {WAIT:?} of the server stopping"
        );
    }
    server.resume()?;
    for (pod, pv) in [(POD_A, PV_A), (POD_B, PV_B)] {
        let line = cleared(pod, pv, reason, CHECK);
        assert!(
            agent.wait_for_log(&line, WAIT),
            "{line:?} not within {WAIT:?} of the server's restart"
        );
    }
    let run = agent.stop_cleanly()?;

    assert_eq!(tally(&run.events), Tally::new(), "{}", show(&run));
    for (pod, pv, mount) in [(POD_A, PV_A, &v4), (POD_B, PV_B, &v3)] {
        let message = last_message(&run, pod, pv, reason, CHECK)
            .with_context(|| format!("no {reason} line for {pv}:\n{}", show(&run)))?;
        let head = "NFS server 127.0.0.1 has sent no reply since ";
        let tail = format!(
            " (the mount's timeout is 2s); statvfs of {} has not returned",
            mount.path().display()
        );
        assert!(
            message.starts_with(head) && message.ends_with(&tail),
            "{message:?} is not {head:?}...{tail:?}"
        );
    }
    Ok(())
}

/// Starts the server's threads again when dropped.
struct ResumeOnDrop<'a>(&'a NfsServer);

impl Drop for ResumeOnDrop<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.0.resume() {
            eprintln!("resuming the NFS server: {e:#}");
        }
    }
}

/// One volume of a scenario: its pod's in-tree NFS volume and a reader
/// in a cgroup of its own holding a file of the export open.
struct Volume {
    pod: &'static str,
    pv: &'static str,
    mount: RemoteMount,
    dev: String,
    reader: health_tests::cgroup::Reader,
    cgroup: TestCgroup,
}

impl Volume {
    fn open(
        server: &NfsServer,
        kubelet: &Kubelet,
        (pod, pv): (&'static str, &'static str),
        (version, options): (Version, &str),
        file: &Path,
    ) -> Result<Volume> {
        let mount = nfs_volume(server, kubelet, pod, pv, version, options)?;
        let dev = dev_of(mount.path())?;
        let cgroup = TestCgroup::new(pv)?;
        let mut reader = cgroup.reader(Path::new(READER), &mount.path().join(file))?;
        assert_eq!(reader.pread(0)?, None, "a healthy read on {pv}");
        Ok(Volume {
            pod,
            pv,
            mount,
            dev,
            reader,
            cgroup,
        })
    }

    /// `n` reads a megabyte apart (none finds a page another brought in),
    /// each failing with `errno`.
    fn fail(&mut self, n: u64, errno: i32) -> Result<()> {
        for i in 0..n {
            let got = self.reader.pread(2 * MIB + i * MIB)?;
            assert_eq!(got, Some(errno), "read {i} on {}", self.pv);
        }
        Ok(())
    }

    /// The last `status_reason` condition of the volume (from the kernel's
    /// evidence) starts by saying the `n` reads that failed with `errno`,
    /// on its device and mount.
    fn assert_said(
        &self,
        run: &health_tests::agent::AgentRun,
        (n, errno): (u64, &str),
        status_reason: &str,
    ) -> Result<()> {
        let message = last_message(run, self.pod, self.pv, status_reason, KERNEL)
            .with_context(|| format!("no {status_reason} line for {}:\n{}", self.pv, show(run)))?;
        let head = format!(
            "{} on {} at {} in ",
            self.told(n, errno),
            self.dev,
            self.mount.path().display()
        );
        assert!(
            message.starts_with(&head),
            "{message:?} does not start with {head:?}"
        );
        Ok(())
    }

    /// What the volume's condition says was returned.
    fn told(&self, n: u64, errno: &str) -> String {
        format!(
            "{n} failed file operations (read, {errno}) returned to cgroup {}",
            self.cgroup.path
        )
    }
}

/// Errors the server or the client returned to applications, on three
/// volumes of one server, each counted exactly on its own volume with the
/// reader's cgroup, in its own condition:
/// - NFSv3, a file the application holds open deleted on the server (v3
///   keeps no open state): 3 reads fail with ESTALE, `Inaccessible
///   StaleFileHandle`;
/// - NFSv4.2, the export's disk failing (its dm table switched to
///   `error`): 3 reads of data the server must fetch fail with the
///   server's EIO, `Degraded ApplicationIOErrors`; the server's own block
///   errors are on its dm device, which is no pod's volume;
/// - NFSv3 soft (`softerr`, its own superblock), the server's threads
///   stopped: 2 reads fail with ETIMEDOUT after the mount's timeout,
///   `Inaccessible IOTimeouts`.
#[test]
fn errors_returned_through_nfs_are_counted_on_their_own_volume() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = TmpfsLoop::new(64)?;
    let sectors = 64 * MIB / 512;
    let dm = DmDevice::create(
        "nfs-export",
        &format!("0 {sectors} linear {} 0", disk.dev.path.display()),
    )?;
    let server = NfsServer::start(&dm.mapper_path())?;
    let stale = export_file(&server, "stale.bin", 8 * MIB)?;
    let data = export_file(&server, "data.bin", 8 * MIB)?;
    let kubelet = Kubelet::new()?;
    let mut v3 = Volume::open(
        &server,
        &kubelet,
        (POD_C, PV_C),
        (Version::V3, HARD),
        &stale,
    )?;
    let mut v4 = Volume::open(
        &server,
        &kubelet,
        (POD_A, PV_A),
        (Version::V4_2, HARD),
        &data,
    )?;
    let mut soft = Volume::open(&server, &kubelet, (POD_B, PV_B), (Version::V3, SOFT), &data)?;
    // Dropped before the readers, also when an assertion fails: the
    // NFSv4 reader's exit closes its file on the server, which a hard
    // mount waits for.
    let resume = ResumeOnDrop(&server);
    let mut agent = kubelet.agent_counting_returned_errors()?;

    std::fs::remove_file(server.export().join(&stale))?;
    // The server's cache of open files lets the file go within seconds;
    // until then a read of a page not yet here still succeeds.
    let gone = std::time::Instant::now();
    let first = loop {
        if let Some(errno) = v3.reader.pread(MIB)? {
            break errno;
        }
        anyhow::ensure!(
            gone.elapsed() < WAIT,
            "the deleted file still reads after {WAIT:?}"
        );
        std::fs::write("/proc/sys/vm/drop_caches", "1")?;
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(first, libc::ESTALE, "the first failed read on {PV_C}");
    v3.fail(2, libc::ESTALE)?;

    dm.replace_table(&format!("0 {sectors} error"))?;
    // Neither the client nor the server may answer from its page cache.
    std::fs::write("/proc/sys/vm/drop_caches", "1")?;
    v4.fail(3, libc::EIO)?;

    server.stop()?;
    soft.fail(2, libc::ETIMEDOUT)?;

    let expected = [
        (&v3, 3, "ESTALE", "Inaccessible StaleFileHandle"),
        (&v4, 3, "EIO", "Degraded ApplicationIOErrors"),
        (&soft, 2, "ETIMEDOUT", "Inaccessible IOTimeouts"),
    ];
    for (r, n, errno, _) in &expected {
        let filter = EventFilter::device(&r.dev).kind("returned_error");
        agent.wait_for_count(&filter, *n, WAIT);
        agent.wait_for_log(&r.told(*n, errno), WAIT);
    }
    let run = agent.stop_cleanly()?;

    let mut want = Tally::new();
    for (r, n, errno, _) in &expected {
        want.insert(key(r.pod, "-", SOURCE, "read", errno), *n);
    }
    assert_eq!(tally_on_volumes(&run), want, "{}", show(&run));
    for (r, n, errno, status_reason) in &expected {
        r.assert_said(&run, (*n, errno), status_reason)?;
    }
    drop(resume);
    drop((v3, v4, soft));
    drop(server);
    Ok(())
}

/// The export full (its ext4 filled on the server's side) under an
/// NFSv4.2 mount with `sync` (each write reaches the server before
/// `write()` returns, so the server's refusal is the application's
/// answer): each of 4 writes that need a new block fails with ENOSPC,
/// counted once on the volume with the writer's cgroup (the flush inside
/// `write()` is not a second, fsync, error); the client keeps each refused
/// write as the file's writeback error, so the volume's condition is
/// `DataLoss WritebackErrors` with the application's ENOSPC said in it
/// (one failure, one condition); the capacity check sees the volume full,
/// `Degraded CapacityExhausted`.
#[test]
fn a_full_export_is_out_of_space_for_the_application() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = TmpfsLoop::new(64)?;
    let server = NfsServer::start(&disk.dev.path)?;
    let data = export_file(&server, "data.bin", MIB)?;
    let kubelet = Kubelet::new()?;
    let options = format!("{HARD},sync");
    let mount = nfs_volume(&server, &kubelet, POD_A, PV_A, Version::V4_2, &options)?;
    let dev = dev_of(mount.path())?;
    let cgroup = TestCgroup::new(PV_A)?;
    let mut writer = cgroup.writer(Path::new(READER), &mount.path().join(&data))?;
    assert_eq!(writer.pwrite(0)?, None, "a healthy write on {PV_A}");
    let mut agent = kubelet.agent_counting_returned_errors()?;

    health_tests::fs::fill_until_full(server.export())?;
    let answers = (0..4)
        .map(|i| writer.pwrite(8 * MIB + i * MIB))
        .collect::<Result<Vec<_>>>()?;
    assert_eq!(
        answers,
        [Some(libc::ENOSPC); 4],
        "the writes to a full export"
    );
    let filter = EventFilter::device(&dev).kind("returned_error");
    agent.wait_for_count(&filter, 4, WAIT);
    let told = format!(
        "4 failed file operations (write, ENOSPC) returned to cgroup {}",
        cgroup.path
    );
    agent.wait_for_log(&told, WAIT);
    let full = raised(POD_A, PV_A, "Degraded CapacityExhausted", "check/capacity");
    assert!(
        agent.wait_for_log(&full, WAIT),
        "{full:?} not within {WAIT:?}"
    );
    drop(writer);
    let run = agent.stop_cleanly()?;

    let got = tally_on_volumes(&run);
    let writeback = key(POD_A, "-", "filemap_set_wb_err", "write", "ENOSPC");
    let kept = got.get(&writeback).copied().unwrap_or(0);
    let mut want = Tally::new();
    want.insert(key(POD_A, "-", SOURCE, "write", "ENOSPC"), 4);
    want.insert(writeback, kept.max(1));
    assert_eq!(got, want, "{}", show(&run));
    let reason = "DataLoss WritebackErrors";
    let message = last_message(&run, POD_A, PV_A, reason, KERNEL)
        .with_context(|| format!("no {reason} line:\n{}", show(&run)))?;
    let errors = match kept {
        1 => "1 writeback error".to_string(),
        n => format!("{n} writeback errors"),
    };
    let head = format!(
        "{errors} (write, ENOSPC) on {dev} at {} ",
        mount.path().display()
    );
    let tail = format!("; {told}");
    assert!(
        message.starts_with(&head) && message.ends_with(&tail),
        "{message:?} is not {head:?}...{tail:?}"
    );
    let alone = raised(POD_A, PV_A, "Degraded OutOfSpace", KERNEL);
    assert!(!run.stderr.contains(&alone), "{alone:?} beside {reason}");
    eprintln!("{kept} writeback errors kept for 4 refused writes");
    drop(mount);
    drop(server);
    Ok(())
}

/// The export changed under its client (`root_squash` where it was
/// `no_root_squash`, the server's caches flushed): a file of mode 0600
/// owned by root, which the application (root) holds open over NFSv3, is
/// no longer the client's to read, and each of 3 reads fails with EACCES:
/// counted exactly on the volume with the reader's cgroup, `Inaccessible
/// AccessDenied`. The mount itself still answers (its root is readable by
/// anyone): the probe raises nothing.
#[test]
fn an_export_changed_to_squash_the_client_is_access_denied() -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    require_root()?;
    let _kernel = kernel_alone();
    let disk = TmpfsLoop::new(64)?;
    let server = NfsServer::start(&disk.dev.path)?;
    let private = export_file(&server, "private.bin", 8 * MIB)?;
    std::fs::set_permissions(
        server.export().join(&private),
        std::fs::Permissions::from_mode(0o600),
    )?;
    let kubelet = Kubelet::new()?;
    let mut v3 = Volume::open(
        &server,
        &kubelet,
        (POD_C, PV_C),
        (Version::V3, HARD),
        &private,
    )?;
    let mut agent = kubelet.agent_counting_returned_errors()?;

    server.export_to_root(false)?;
    v3.fail(3, libc::EACCES)?;
    let filter = EventFilter::device(&v3.dev).kind("returned_error");
    agent.wait_for_count(&filter, 3, WAIT);
    agent.wait_for_log(&v3.told(3, "EACCES"), WAIT);
    let run = agent.stop_cleanly()?;
    server.export_to_root(true)?;

    let want: Tally = [(key(POD_C, "-", SOURCE, "read", "EACCES"), 3)].into();
    assert_eq!(tally_on_volumes(&run), want, "{}", show(&run));
    v3.assert_said(&run, (3, "EACCES"), "Inaccessible AccessDenied")?;
    let probe = raised(POD_C, PV_C, "Inaccessible PathUnreachable", CHECK);
    assert!(!run.stderr.contains(&probe), "{probe:?}:\n{}", show(&run));
    drop(v3);
    drop(server);
    Ok(())
}
