//! The cluster's long-running processes: started detached from the lab
//! (their own session, so a Ctrl-C on the terminal that ran `up` does not
//! reach them, and no parent-death signal: they outlive the lab), their
//! output in `logs/<name>.log` (whose last lines [`log_tail`] puts in
//! errors), their pid in `run/<name>.pid`. A later `lab`
//! process finds them through that file.
//!
//! The pid file holds the pid and the executable that was started; a pid
//! counts as the daemon only while `/proc/<pid>/exe` is still that
//! executable, so a reused pid is never signalled.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

use super::State;

fn pid_file(state: &State, name: &str) -> PathBuf {
    state.path(format!("run/{name}.pid"))
}

/// Where `name`'s output goes.
pub(super) fn log_file(state: &State, name: &str) -> PathBuf {
    state.path(format!("logs/{name}.log"))
}

/// "last lines of LOG: ..." for an error message: what every wait on a
/// daemon (the control plane, the node, the API server's readiness) adds
/// when it gives up, so it lives with the log it reads.
pub(super) fn log_tail(state: &State, name: &str) -> String {
    let path = log_file(state, name);
    tail(&path, 15)
}

fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            let start = all.len().saturating_sub(lines);
            format!(
                "last lines of {}:\n{}",
                path.display(),
                all[start..].join("\n")
            )
        }
        Err(e) => format!("no log at {} ({e})", path.display()),
    }
}

/// Starts `cmd` as the daemon `name`; returns its pid.
pub(super) fn start(state: &State, name: &str, mut cmd: Command) -> anyhow::Result<u32> {
    let exe = resolve_program(cmd.get_program().as_ref())
        .with_context(|| format!("{name}: {:?} not found", cmd.get_program()))?;
    for dir in ["logs", "run"] {
        std::fs::create_dir_all(state.path(dir))
            .with_context(|| format!("creating {}", state.path(dir).display()))?;
    }
    let log_path = log_file(state, name);
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    // SAFETY: setsid is async-signal-safe and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()?;
            Ok(())
        });
    }
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {name}: {cmd:?}"))?;
    let pid = child.id();
    // The child is not waited for here: it lives on after this process, and
    // init reaps it then. While we run, `running` sees an exited child as a
    // zombie, which is not running.
    drop(child);
    let file = pid_file(state, name);
    std::fs::write(&file, format!("{pid}\n{}\n", exe.display()))
        .with_context(|| format!("writing {}", file.display()))?;
    Ok(pid)
}

/// The daemon's pid while it runs.
pub(super) fn running(state: &State, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(pid_file(state, name)).ok()?;
    let (pid, exe) = parse_pid_file(&text)?;
    alive_as(pid, exe).then_some(pid)
}

/// SIGTERM to the daemon's process group, `grace` to exit, then SIGKILL.
/// Fine when it does not run; the pid file is removed in any case.
pub(super) fn stop(state: &State, name: &str, grace: Duration) -> anyhow::Result<()> {
    let file = pid_file(state, name);
    if let Some(pid) = running(state, name) {
        let group = Pid::from_raw(pid as i32);
        let _ = killpg(group, Signal::SIGTERM);
        if !wait_gone(pid, grace) {
            let _ = killpg(group, Signal::SIGKILL);
            if !wait_gone(pid, Duration::from_secs(10)) {
                bail!("{name} (pid {pid}) is still there 10 s after SIGKILL");
            }
        }
    }
    match std::fs::remove_file(&file) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("removing {}", file.display())),
    }
}

/// Waits until `pid` has exited (reaping it when it is our own child).
fn wait_gone(pid: u32, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    loop {
        // Our own child (started by this same run) stays a zombie until
        // reaped; anyone else's is reaped by init.
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid as i32),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        if !live(pid) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn parse_pid_file(text: &str) -> Option<(u32, &str)> {
    let mut lines = text.lines();
    let pid = lines.next()?.trim().parse().ok().filter(|p| *p > 0)?;
    let exe = lines.next()?.trim();
    (!exe.is_empty()).then_some((pid, exe))
}

/// `pid` exists and is not a zombie.
fn live(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the command's closing parenthesis.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|s| s != "Z" && s != "X"),
        Err(_) => false,
    }
}

/// `pid` runs and is the executable `exe` (a replaced binary shows as
/// "PATH (deleted)" and still counts).
fn alive_as(pid: u32, exe: &str) -> bool {
    if !live(pid) {
        return false;
    }
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|link| {
        let link = link.to_string_lossy();
        link.strip_suffix(" (deleted)").unwrap_or(&link) == exe
    })
}

/// The program as the kernel will show it in /proc/<pid>/exe: found on
/// PATH when it has no slash, with every symlink resolved.
fn resolve_program(program: &Path) -> Option<PathBuf> {
    let found = if program.components().count() > 1 {
        program.to_path_buf()
    } else {
        xtask::util::on_path(program.to_str()?)?
    };
    found.canonicalize().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_files_hold_a_pid_and_an_executable() {
        assert_eq!(
            parse_pid_file("42\n/usr/bin/etcd\n"),
            Some((42, "/usr/bin/etcd"))
        );
        assert_eq!(parse_pid_file("42\n"), None);
        assert_eq!(parse_pid_file("0\n/x\n"), None);
        assert_eq!(parse_pid_file("x\n/x\n"), None);
    }

    /// Live processes whose process group is `pgid`.
    fn group_members(pgid: u32) -> Vec<u32> {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter(|pid| {
                let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
                let fields: Vec<&str> = stat
                    .rsplit_once(')')
                    .map(|(_, rest)| rest.split_whitespace().collect())
                    .unwrap_or_default();
                // state, ppid, pgrp
                fields.len() > 2 && fields[2] == pgid.to_string() && live(*pid)
            })
            .collect()
    }

    #[test]
    fn a_daemon_runs_detached_and_stops_by_its_group() {
        let dir = tempfile::tempdir().unwrap();
        let state = State::open(Some(dir.path())).unwrap();
        let mut cmd = Command::new("sh");
        // A child in the same group that ignores nothing: SIGTERM to the
        // group must end both.
        cmd.args(["-c", "sleep 300 & echo started; wait"]);
        let pid = start(&state, "sleeper", cmd).unwrap();
        assert_eq!(running(&state, "sleeper"), Some(pid));
        // Its own session: the session id is its pid.
        let sid = nix::unistd::getsid(Some(Pid::from_raw(pid as i32))).unwrap();
        assert_eq!(sid.as_raw(), pid as i32);
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(group_members(pid).len(), 2, "sh and its sleep");
        stop(&state, "sleeper", Duration::from_secs(5)).unwrap();
        assert_eq!(running(&state, "sleeper"), None);
        // The sleep went with the group (init reaps it: poll briefly).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !group_members(pid).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(group_members(pid), Vec::<u32>::new());
        assert!(!pid_file(&state, "sleeper").exists());
        let log = std::fs::read_to_string(log_file(&state, "sleeper")).unwrap();
        assert_eq!(log, "started\n");
        // Stopping what does not run is fine.
        stop(&state, "sleeper", Duration::from_secs(1)).unwrap();
    }
}
