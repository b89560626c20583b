//! RLIMIT_MEMLOCK and CAP_SYS_RESOURCE, which the DaemonSet grants only on
//! request (Helm `memlockCapability`, the kustomize component
//! `deploy/components/memlock`): kernels before 5.11 charge BPF memory to
//! the limit and need the capability to raise it; later kernels need
//! neither. The agent runs with the limit at 64 KiB (a common distribution
//! default), with and without the capability in its bounding set (and so in
//! its effective set: a root process gets its bounding set at exec).
//!
//! Each test asserts what the running kernel must do: before 5.11 the
//! refusal names the limit and the fix (5.10: `cargo xtask vm --kernel 5.10
//! --tests memlock`), from 5.11 on the agent loads regardless.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use health_kernel::probes::release::{parse_version, running_release};
use health_tests::agent::{agent_bin, agent_command};
use health_tests::{require_root, shared_kernel};

/// The limit the agent starts with, soft and hard.
const LIMIT: u64 = 64 * 1024;
/// include/uapi/linux/capability.h.
const CAP_SYS_RESOURCE: u32 = 24;
/// Loading takes a while under QEMU's emulation.
const READY_TIMEOUT: Duration = Duration::from_secs(180);

/// The running kernel's release and whether it charges BPF memory to
/// RLIMIT_MEMLOCK (before 5.11).
fn kernel() -> Result<(String, bool)> {
    let release = running_release(Path::new("/proc"))?;
    let version = parse_version(&release)
        .with_context(|| format!("no version in kernel release {release:?}"))?;
    Ok((release, version < (5, 11)))
}

/// Whether `capability` is in the effective set of the status text.
fn has_capability(status: &str, capability: u32) -> Result<bool> {
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .context("no CapEff line")?;
    Ok(u64::from_str_radix(eff.trim(), 16)? & (1 << capability) != 0)
}

/// The soft limit of "Max locked memory" in a /proc/PID/limits text.
fn memlock_soft_limit(limits: &str) -> Result<String> {
    let line = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max locked memory"))
        .context("no Max locked memory line")?;
    Ok(line
        .split_whitespace()
        .next()
        .context("empty line")?
        .to_string())
}

/// What an agent started under the limit did.
struct Run {
    status: ExitStatus,
    stderr: String,
    /// While it ran, once ready: its effective capabilities' CAP_SYS_RESOURCE
    /// bit and its memlock soft limit; `None` when it exited before ready.
    ready: Option<(bool, String)>,
}

/// `health-agent watch` with RLIMIT_MEMLOCK at `limit` bytes and, with
/// `drop_sys_resource`, CAP_SYS_RESOURCE out of its bounding set; stopped
/// once ready (or read to its exit).
fn run_limited(limit: u64, drop_sys_resource: bool) -> Result<Run> {
    let mut command = agent_command(&agent_bin()?);
    command
        .args(["watch", "--duration", "600", "--no-pin"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit and prctl are async-signal-safe; nothing allocates.
    unsafe {
        command.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if drop_sys_resource
                && libc::prctl(
                    libc::PR_CAPBSET_DROP,
                    CAP_SYS_RESOURCE as libc::c_ulong,
                    0,
                    0,
                    0,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command.spawn().context("starting the agent")?;
    let stderr = child.stderr.take().context("agent stderr")?;
    let (tx, lines) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut text = String::new();
    let mut ready = None;
    loop {
        match lines.recv_timeout(READY_TIMEOUT) {
            Ok(line) => {
                text.push_str(&line);
                text.push('\n');
                if line.contains("volume-health: ready") {
                    let pid = child.id();
                    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
                    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits"))?;
                    ready = Some((
                        has_capability(&status, CAP_SYS_RESOURCE)?,
                        memlock_soft_limit(&limits)?,
                    ));
                    nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGTERM,
                    )?;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("the agent neither got ready nor exited within {READY_TIMEOUT:?}:\n{text}");
            }
        }
    }
    let status = child.wait()?;
    reader
        .join()
        .map_err(|_| anyhow::anyhow!("stderr reader panicked"))?;
    Ok(Run {
        status,
        stderr: text,
        ready,
    })
}

impl Run {
    /// Its CAP_SYS_RESOURCE bit and memlock limit once ready; an error
    /// naming the kernel and the agent's output when it never got ready.
    fn loaded(&self, release: &str) -> Result<(bool, &str)> {
        match &self.ready {
            Some((sys_resource, memlock)) => Ok((*sys_resource, memlock)),
            None => bail!(
                "the agent did not load on {release} ({}):\n{}",
                self.status,
                self.stderr
            ),
        }
    }

    /// Loaded with memlock limit `memlock`, stopped cleanly by the SIGTERM
    /// (its handler is installed before it says it is ready), and no word
    /// of the limit.
    fn check_loaded(&self, release: &str, memlock: &str) -> Result<bool> {
        let (sys_resource, have) = self.loaded(release)?;
        assert_eq!(have, memlock, "{}", self.stderr);
        assert!(self.status.success(), "{}\n{}", self.status, self.stderr);
        assert!(!self.stderr.contains("RLIMIT_MEMLOCK"), "{}", self.stderr);
        Ok(sys_resource)
    }

    /// The agent's own lines (`health-agent: ...`), not its log's.
    fn agent_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("health-agent: "))
            .collect()
    }
}

/// The start of the agent's message when a kernel that charges BPF memory
/// to the limit refuses it, up to the cause.
fn refusal(release: &str, kib: u64) -> String {
    format!(
        "health-agent: kernel {release} charges BPF memory to RLIMIT_MEMLOCK (every kernel \
         before 5.11 does) and this process's limit is {kib} KiB, too little to load the agent; \
         raising it needs CAP_SYS_RESOURCE, which this process does not have: grant it with \
         the Helm value `--set memlockCapability=true` or the kustomize component \
         deploy/components/memlock: "
    )
}

#[test]
fn a_64_kib_memlock_limit_without_cap_sys_resource() -> Result<()> {
    require_root()?;
    let _kernel = shared_kernel();
    let (release, charges) = kernel()?;
    let run = run_limited(LIMIT, true)?;
    if !charges {
        // 5.11+: the limit is not charged; the raise failed and that is all.
        let sys_resource = run.check_loaded(&release, &LIMIT.to_string())?;
        assert!(!sys_resource, "CAP_SYS_RESOURCE was not dropped");
        // Its log went to a pipe, as a pod's does: plain text, no colours.
        assert!(
            run.stderr.contains(" INFO ") && !run.stderr.contains('\x1b'),
            "{:?}",
            run.stderr
        );
        return Ok(());
    }
    assert!(
        run.ready.is_none(),
        "the agent loaded on {release}:\n{}",
        run.stderr
    );
    assert_eq!(run.status.code(), Some(3), "{}", run.stderr);
    let message = refusal(&release, LIMIT / 1024);
    let lines = run.agent_lines();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    let cause = lines[0]
        .strip_prefix(&message)
        .unwrap_or_else(|| panic!("not the memlock message:\n{}", run.stderr));
    // The kernel's refusal follows: the first map the loader creates
    // (which one varies: aya keeps the object's maps in a hash map).
    assert!(
        cause.starts_with("loading the kernel programs: map error: failed to create map")
            && cause.ends_with("Operation not permitted (os error 1)"),
        "{cause}"
    );
    assert!(!run.stderr.contains("lockdown"), "{}", run.stderr);
    Ok(())
}

#[test]
fn a_64_kib_memlock_limit_with_cap_sys_resource() -> Result<()> {
    require_root()?;
    let _kernel = shared_kernel();
    let (release, charges) = kernel()?;
    let own = has_capability(
        &std::fs::read_to_string("/proc/self/status")?,
        CAP_SYS_RESOURCE,
    )?;
    if charges && !own {
        bail!("this test needs CAP_SYS_RESOURCE on {release}, and this process has none");
    }
    let run = run_limited(LIMIT, false)?;
    // The raise works wherever the capability is there; where it is not
    // (this is 5.11+, as checked above) the limit stays and does not matter.
    let expected = if own {
        "unlimited".to_string()
    } else {
        LIMIT.to_string()
    };
    let sys_resource = run.check_loaded(&release, &expected)?;
    assert_eq!(sys_resource, own);
    Ok(())
}

/// A limit too low for even the one-page map of the agent's first BPF
/// check: the refusal comes from that check, with the same message.
#[test]
fn a_zero_memlock_limit_without_cap_sys_resource() -> Result<()> {
    require_root()?;
    let _kernel = shared_kernel();
    let (release, charges) = kernel()?;
    let run = run_limited(0, true)?;
    if !charges {
        let sys_resource = run.check_loaded(&release, "0")?;
        assert!(!sys_resource, "CAP_SYS_RESOURCE was not dropped");
        return Ok(());
    }
    assert_eq!(run.status.code(), Some(3), "{}", run.stderr);
    let expected = format!(
        "{}creating a test map: Operation not permitted (os error 1)",
        refusal(&release, 0)
    );
    assert_eq!(run.agent_lines(), [expected.as_str()], "{}", run.stderr);
    Ok(())
}
