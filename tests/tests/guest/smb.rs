//! SMB volumes: the kernel's SMB server (ksmbd) and CIFS client in one
//! guest, over loopback, the share a filesystem of the test's own
//! (tests/src/smb_server.rs), mounted where kubelet has csi-driver-smb
//! publish a volume (`pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`):
//!
//! ```text
//! cargo xtask vm --kernel 6.12 --tests smb [--filter NAME]
//! ```
//!
//! - the server stopped: `Inaccessible ServerNotResponding` (the agent's
//!   probe fails and the client's own state says its connection to the
//!   server is lost), and the reads that failed with EHOSTDOWN counted
//!   exactly (`Inaccessible HostDown`); cleared when the server is back;
//! - the share full: the writes the server refuses with ENOSPC counted
//!   exactly, said in the condition of the writeback error the client
//!   keeps for them, beside the capacity check's `Degraded
//!   CapacityExhausted`.
//!
//! A disk failing under the share is not among them: ksmbd answers a read
//! its filesystem failed with EIO with a status the client returns to
//! the application as EBADF (measured on 6.12: "ksmbd: smb read failed,
//! err = -5" on the server, EBADF from the pread), an errno the agent
//! leaves to the caller (a bad descriptor is the application's own
//! error everywhere else).
//!
//! CI runs it on 6.12 only (`smb@6.12`): 5.10 has no ksmbd (Linux 5.15
//! brought it), and on Debian's 6.1 (6.1.192) with Debian 12's
//! ksmbd-tools 3.4.7 every tree connect fails (BAD_NETWORK_NAME, IPC$
//! included), measured in the guest on 2026-11-30.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use health_tests::agent::{Agent, EventFilter};
use health_tests::cgroup::{Reader, TestCgroup};
use health_tests::devices::TmpfsLoop;
use health_tests::fs::{dev_of, RemoteMount};
use health_tests::kubelet_tree::Kubelet;
use health_tests::smb_server::SmbServer;
use health_tests::vm_report::{cleared, key, last_message, raised, show, tally_on_volumes, Tally};
use health_tests::{kernel_alone, require_root};

const MIB: u64 = 1 << 20;
/// A read of a share whose server is gone fails after about 10 s (the
/// client's reconnect attempts); the probe's 5 s timeout and a check
/// interval on top: well within this.
const WAIT: Duration = Duration::from_secs(60);
const POD: &str = "7e70e000-0000-4000-8000-0000000000c1";
const PV: &str = "pv-smb";
const DRIVER: &str = "smb.csi.k8s.io";
const CHECK: &str = "check/reachability";
const KERNEL: &str = "kernel";
const SOURCE: &str = "vfs_return";
const READER: &str = env!("CARGO_BIN_EXE_file-reader");
/// Every read goes to the server: no page cache, no lease, on the client.
const OPTIONS: &str = "cache=none";

/// The share as the pod's CSI volume, and a reader in a cgroup of its own
/// holding a file of the share open, one healthy read done.
struct Volume {
    mount: RemoteMount,
    dev: String,
    reader: Reader,
    cgroup: TestCgroup,
}

impl Volume {
    /// `write`: the file open for writing too ([`Reader::pwrite`]).
    fn open(server: &SmbServer, kubelet: &Kubelet, file: &Path, write: bool) -> Result<Volume> {
        let dir = kubelet.csi_volume_dir(POD, PV, DRIVER)?;
        let mount = server.mount(OPTIONS, &dir)?;
        let dev = dev_of(mount.path())?;
        let cgroup = TestCgroup::new(PV)?;
        let (bin, file) = (Path::new(READER), mount.path().join(file));
        let mut reader = match write {
            true => cgroup.writer(bin, &file)?,
            false => cgroup.reader(bin, &file)?,
        };
        assert_eq!(reader.pread(0)?, None, "a healthy read on {PV}");
        Ok(Volume {
            mount,
            dev,
            reader,
            cgroup,
        })
    }

    /// `n` reads a megabyte apart, each failing with `errno`.
    fn fail(&mut self, n: u64, errno: i32) -> Result<()> {
        for i in 0..n {
            let got = self.reader.pread(2 * MIB + i * MIB)?;
            assert_eq!(got, Some(errno), "read {i} on {PV}");
        }
        Ok(())
    }

    /// What the volume's condition says was returned.
    fn told(&self, n: u64, op: &str, errno: &str) -> String {
        let noun = if n == 1 { "operation" } else { "operations" };
        format!(
            "{n} failed file {noun} ({op}, {errno}) returned to cgroup {}",
            self.cgroup.path
        )
    }

    /// Waits until the agent counted `n` returned errors of `op` on the
    /// volume and said them.
    fn wait_told(&self, agent: &mut Agent, n: u64, op: &str, errno: &str) {
        let filter = EventFilter::device(&self.dev).kind("returned_error");
        agent.wait_for_count(&filter, n, WAIT);
        agent.wait_for_log(&self.told(n, op, errno), WAIT);
    }

    /// The agent's run counted exactly `n` errors of `op` on the volume
    /// and nothing else on any pod's volume, and said them in a condition
    /// of their own.
    fn check_told(
        &self,
        run: &health_tests::agent::AgentRun,
        (n, op, errno): (u64, &str, &str),
        status_reason: &str,
    ) -> Result<()> {
        let mut want = Tally::new();
        want.insert(key(POD, "-", SOURCE, op, errno), n);
        assert_eq!(tally_on_volumes(run), want, "{}", show(run));
        let message = last_message(run, POD, PV, status_reason, KERNEL)
            .with_context(|| format!("no {status_reason} line:\n{}", show(run)))?;
        let head = format!(
            "{} on {} at {} in ",
            self.told(n, op, errno),
            self.dev,
            self.mount.path().display()
        );
        assert!(
            message.starts_with(&head),
            "{message:?} does not start with {head:?}"
        );
        Ok(())
    }
}

/// A file of `size` bytes on the share, written on the server's side,
/// which the share's user may write (ksmbd opens it as that user).
fn share_file(server: &SmbServer, name: &str, size: u64) -> Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = server.share().join(name);
    std::fs::write(&path, vec![0x5a; size as usize])?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))?;
    health_tests::fs::sync_fs(&path)?;
    Ok(PathBuf::from(name))
}

/// The server stopped under a mounted share: the client loses its
/// connection; the agent's probe fails (EHOSTDOWN after the client's
/// reconnect attempts, or still waiting) and the volume is `Inaccessible
/// ServerNotResponding`; the application's 2 reads that failed with
/// EHOSTDOWN are counted exactly and said as `Inaccessible HostDown`.
/// Once the server is back and the client reconnected, the check's
/// condition clears.
#[test]
fn a_stopped_smb_server_is_server_not_responding_until_it_answers() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = TmpfsLoop::new(64)?;
    let mut server = SmbServer::start(&disk.dev.path)?;
    let data = share_file(&server, "data.bin", 8 * MIB)?;
    let kubelet = Kubelet::new()?;
    let mut volume = Volume::open(&server, &kubelet, &data, false)?;
    let mut agent = kubelet.agent_counting_returned_errors()?;
    // Healthy first: the checks pass before the server stops.
    std::thread::sleep(Duration::from_secs(3));
    let stopped = Instant::now();
    server.stop()?;
    let reason = "Inaccessible ServerNotResponding";
    let line = raised(POD, PV, reason, CHECK);
    assert!(
        agent.wait_for_log(&line, WAIT),
        "{line:?} not within {WAIT:?} of the server stopping"
    );
    let raised_after = stopped.elapsed();
    volume.fail(2, libc::EHOSTDOWN)?;
    volume.wait_told(&mut agent, 2, "read", "EHOSTDOWN");
    // While the server is down the client keeps reconnecting, and the
    // condition says so; after the restart it may say `negotiating` for a
    // moment before it clears, so the state is asserted here, not at the end.
    let head = "SMB server 127.0.0.1: the client's connection is disconnected, reconnecting since ";
    let down = format!("{reason} [{CHECK}]: {head}");
    assert!(
        agent.wait_for_log(&down, WAIT),
        "{down:?} not within {WAIT:?} of the server stopping"
    );
    let resumed = Instant::now();
    server.resume()?;
    let line = cleared(POD, PV, reason, CHECK);
    assert!(
        agent.wait_for_log(&line, WAIT),
        "{line:?} not within {WAIT:?} of the server's restart"
    );
    eprintln!(
        "{reason} raised {:.1} s after the server stopped, cleared {:.1} s after its restart began",
        raised_after.as_secs_f64(),
        resumed.elapsed().as_secs_f64()
    );
    let run = agent.stop_cleanly()?;

    volume.check_told(&run, (2, "read", "EHOSTDOWN"), "Inaccessible HostDown")?;
    let message = last_message(&run, POD, PV, reason, CHECK)
        .with_context(|| format!("no {reason} line:\n{}", show(&run)))?;
    let head = "SMB server 127.0.0.1: the client's connection is ";
    let probe = format!("; statvfs of {} ", volume.mount.path().display());
    assert!(
        message.starts_with(head) && message.contains(&probe),
        "{message:?} is not {head:?}...{probe:?}..."
    );
    drop(volume);
    drop(server);
    Ok(())
}

/// The share full (its ext4, with no blocks reserved for root, filled on
/// the server's side): of 4 writes that need a new block, those the
/// application is told failed with ENOSPC are counted exactly on the SMB
/// volume; the CIFS client keeps the first refused write as the file's
/// writeback error, so the volume's condition is `DataLoss
/// WritebackErrors` with the application's ENOSPC said in it (one
/// failure, one condition); the capacity check sees the same volume full,
/// `Degraded CapacityExhausted`.
#[test]
fn a_full_share_is_out_of_space_for_the_application() -> Result<()> {
    require_root()?;
    let _kernel = kernel_alone();
    let disk = TmpfsLoop::new(64)?;
    let server = SmbServer::start(&disk.dev.path)?;
    let data = share_file(&server, "data.bin", MIB)?;
    let kubelet = Kubelet::new()?;
    let mut volume = Volume::open(&server, &kubelet, &data, true)?;
    assert_eq!(volume.reader.pwrite(0)?, None, "a healthy write on {PV}");
    let mut agent = kubelet.agent_counting_returned_errors()?;

    health_tests::fs::fill_until_full(server.share())?;
    // What the application is told is the ground truth: the CIFS client
    // (6.12, cache=none) answered the first write the server refused
    // with 0 bytes written and the next with ENOSPC (measured); every
    // ENOSPC it got must be counted, and nothing else.
    let answers = (0..4)
        .map(|i| volume.reader.pwrite(8 * MIB + i * MIB))
        .collect::<Result<Vec<_>>>()?;
    let refused = answers.iter().filter(|a| **a == Some(libc::ENOSPC)).count() as u64;
    assert!(
        refused >= 1
            && answers
                .iter()
                .all(|a| a.is_none() || *a == Some(libc::ENOSPC)),
        "the writes to a full share answered {answers:?}"
    );
    volume.wait_told(&mut agent, refused, "write", "ENOSPC");
    let full = raised(POD, PV, "Degraded CapacityExhausted", "check/capacity");
    assert!(
        agent.wait_for_log(&full, WAIT),
        "{full:?} not within {WAIT:?}"
    );
    let run = agent.stop_cleanly()?;

    // The client also keeps the refused write as its file's writeback
    // error (what a later fsync returns), and the kernel's evidence is one
    // condition with the application's errors said in it, not a second.
    let mut want = Tally::new();
    want.insert(key(POD, "-", SOURCE, "write", "ENOSPC"), refused);
    want.insert(key(POD, "-", "filemap_set_wb_err", "write", "ENOSPC"), 1);
    assert_eq!(tally_on_volumes(&run), want, "{}", show(&run));
    let reason = "DataLoss WritebackErrors";
    let message = last_message(&run, POD, PV, reason, KERNEL)
        .with_context(|| format!("no {reason} line:\n{}", show(&run)))?;
    let head = format!(
        "1 writeback error (write, ENOSPC) on {} at {} at ",
        volume.dev,
        volume.mount.path().display()
    );
    let tail = format!("; {}", volume.told(refused, "write", "ENOSPC"));
    assert!(
        message.starts_with(&head) && message.ends_with(&tail),
        "{message:?} is not {head:?}...{tail:?}"
    );
    let alone = raised(POD, PV, "Degraded OutOfSpace", KERNEL);
    assert!(!run.stderr.contains(&alone), "{alone:?} beside {reason}");
    eprintln!("the writes to the full share answered {answers:?}");
    drop(volume);
    drop(server);
    Ok(())
}
