//! The control plane's processes: started so that none outlives the test.
//!
//! Each process leads its own process group, and is stopped by killing the group
//! (anything it started goes too). A test binary that dies without unwinding
//! (SIGKILL, `abort`, a harness time-out) runs no `Drop`, so each process also
//! gets `PR_SET_PDEATHSIG` = SIGKILL. That signal fires when the *thread* that
//! forked it ends, not the process; test threads end when their test does, and
//! a server may be moved between threads, so the forks happen on a keeper
//! thread of their own that lives exactly as long as the [`Keeper`].

use std::io;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::sync::mpsc;
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

type SpawnRequest = (Command, mpsc::Sender<io::Result<Child>>);

/// The thread that forks the processes; they are killed by the kernel if it ends.
pub struct Keeper {
    requests: Option<mpsc::Sender<SpawnRequest>>,
    thread: Option<JoinHandle<()>>,
}

impl Keeper {
    pub fn new() -> Result<Self> {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let thread = std::thread::Builder::new()
            .name("envtest-keeper".to_string())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })
            .context("starting the envtest keeper thread")?;
        Ok(Keeper {
            requests: Some(tx),
            thread: Some(thread),
        })
    }

    /// Starts `command` in its own process group, bound to the keeper thread.
    pub fn spawn(&self, mut command: Command) -> io::Result<Child> {
        command.process_group(0);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let (reply, answer) = mpsc::channel();
        let gone = || io::Error::other("the envtest keeper thread is gone");
        self.requests
            .as_ref()
            .ok_or_else(gone)?
            .send((command, reply))
            .map_err(|_| gone())?;
        answer.recv().map_err(|_| gone())?
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop; any process still bound to
        // it gets SIGKILL from the kernel.
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Kills `child`'s whole process group and reaps it. SIGKILL straight away: the
/// data directory is thrown away, so a graceful shutdown (seconds for
/// kube-apiserver) would buy nothing.
pub fn kill_group(child: &mut Child) {
    let group = Pid::from_raw(child.id() as i32);
    // ESRCH (already gone) is fine: the goal is that nothing is left.
    let _ = killpg(group, Signal::SIGKILL);
    let _ = child.wait();
    // Members that outlived their leader would still be in the group.
    let _ = killpg(group, Signal::SIGKILL);
}

/// Whether `child` has exited; its status if so.
pub fn exited(child: &mut Child) -> Option<String> {
    match child.try_wait() {
        Ok(Some(status)) => Some(status.to_string()),
        Ok(None) => None,
        Err(e) => Some(format!("unknown ({e})")),
    }
}

/// A loopback port nobody listens on right now. Another process may take it
/// before the server binds it; the caller retries a start that failed so.
pub fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Polls `probe` every `interval` until it returns `Some` or `timeout` passes.
    fn poll<T>(
        timeout: Duration,
        interval: Duration,
        mut probe: impl FnMut() -> Option<T>,
    ) -> Option<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = probe() {
                return Some(v);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(interval);
        }
    }

    #[test]
    fn killing_the_group_leaves_no_child_behind() {
        let keeper = Keeper::new().unwrap();
        let mut command = Command::new("sh");
        // The shell starts a grandchild in its group and prints its pid.
        command
            .args(["-c", "sleep 600 & echo $!; wait"])
            .stdout(std::process::Stdio::piped());
        let mut child = keeper.spawn(command).unwrap();
        let mut line = String::new();
        io::BufRead::read_line(
            &mut io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        kill_group(&mut child);
        let gone = poll(Duration::from_secs(5), Duration::from_millis(20), || {
            let alive = std::fs::read_to_string(format!("/proc/{grandchild}/stat"))
                .map(|s| !s.contains(") Z "))
                .unwrap_or(false);
            (!alive).then_some(())
        });
        assert!(
            gone.is_some(),
            "grandchild {grandchild} survived its group's kill"
        );
    }

    #[test]
    fn ending_the_keeper_kills_what_it_started() {
        let keeper = Keeper::new().unwrap();
        let mut command = Command::new("sleep");
        command.arg("600");
        let mut child = keeper.spawn(command).unwrap();
        drop(keeper);
        let status = poll(Duration::from_secs(5), Duration::from_millis(20), || {
            child.try_wait().unwrap()
        });
        let status = status.expect("the child outlived its keeper thread");
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }
}
