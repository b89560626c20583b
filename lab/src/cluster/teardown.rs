//! `cargo xtask cluster down`: everything stopped and the host as `up`
//! found it. Nothing is deleted through the API (the cluster's data goes
//! with its etcd). The order matters:
//!
//! 1. the kubelet stops first, so nothing restarts containers or remounts;
//! 2. every container's processes are killed (found in the `kubepods`
//!    cgroups, where every container runs) and containerd forgets its tasks;
//! 3. everything mounted under /var/lib/kubelet is unmounted, deepest first
//!    (only when the marker says it is ours);
//! 4. the storage part goes (its disks may back the mounts of step 3, its
//!    driver's sockets are under /var/lib/kubelet), then /var/lib/kubelet;
//! 5. containerd stops, leftover shims are killed, its overlay, shm and
//!    netns mounts under the state directory are unmounted;
//! 6. the scheduler, the controller-manager, the API server and etcd stop;
//! 7. the Service address rule, the bridge and its veths, the `kubepods`
//!    cgroups, the sysctls and the directories created at fixed paths are
//!    undone, as host.json recorded the host before `up`;
//! 8. the state directory is emptied except `images/` (the built archives,
//!    reused by the next `up`), `last-logs/` (the daemons' logs) and
//!    `last-down.log` (what this did).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use xtask::util::say;

use super::state::{KUBELET_MARKER, KUBELET_ROOT};
use super::{daemon, host, images, mounts, network, preflight, storage, State, DAEMONS};

/// What survives `down` in the state directory.
const KEPT: &[&str] = &["images", "last-logs", "last-down.log"];

pub(super) fn down(state: &State) -> anyhow::Result<()> {
    preflight::require_root()?;
    let before = state.read_host()?;
    let running: Vec<&str> = DAEMONS
        .iter()
        .copied()
        .filter(|d| daemon::running(state, d).is_some())
        .collect();
    if before.is_none() && running.is_empty() && !kubelet_root_is_ours(state) {
        say(format!(
            "no cluster in {}: nothing to take down",
            state.dir.display()
        ));
        return Ok(());
    }
    let mut log = Log::default();
    let result = steps(state, &mut log);
    let text = log.lines.join("\n") + "\n";
    if state.dir.is_dir() {
        let path = state.path("last-down.log");
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    result?;
    say("the cluster is down and the host as it was");
    Ok(())
}

#[derive(Default)]
struct Log {
    lines: Vec<String>,
    failures: Vec<String>,
}

impl Log {
    fn note(&mut self, line: impl Into<String>) {
        let line = line.into();
        if line.is_empty() {
            return;
        }
        say(&line);
        self.lines.push(line);
    }

    fn failed(&mut self, what: &str, e: anyhow::Error) {
        let line = format!("FAILED {what}: {e:#}");
        say(&line);
        self.lines.push(line);
        self.failures.push(what.to_string());
    }

    /// Logs what a step did, or its failure.
    fn attempt(&mut self, what: &str, result: anyhow::Result<String>) {
        match result {
            Ok(done) => self.note(done),
            Err(e) => self.failed(what, e),
        }
    }
}

/// The steps in order. A failed step is logged and the rest still run
/// (a teardown that stops at the first problem leaves more behind); what
/// could destroy data (removing a directory with something mounted under
/// it) checks first and refuses instead.
fn steps(state: &State, log: &mut Log) -> anyhow::Result<()> {
    log.attempt("stopping the kubelet", stop(state, "kubelet"));
    log.attempt("killing the containers", kill_containers(state));
    let kubelet_root_ours = kubelet_root_is_ours(state);
    if kubelet_root_ours {
        log.attempt(
            &format!("unmounting under {KUBELET_ROOT}"),
            mounts::unmount_all_under(Path::new(KUBELET_ROOT))
                .map(|n| format!("unmounted {n} mounts under {KUBELET_ROOT}")),
        );
    }
    log.attempt(
        "taking the storage down",
        storage::down(state).map(|()| "storage down".to_string()),
    );
    if kubelet_root_ours {
        // After the storage's daemons: their sockets live under it.
        log.attempt(&format!("removing {KUBELET_ROOT}"), remove_kubelet_root());
    }
    log.attempt("stopping containerd", stop(state, "containerd"));
    let shims = kill_shims(state);
    if shims > 0 {
        log.note(format!("killed {shims} leftover containerd shims"));
    }
    log.attempt(
        "unmounting under the state directory",
        mounts::unmount_all_under(&state.dir)
            .map(|n| format!("unmounted {n} mounts under {}", state.dir.display())),
    );
    for name in [
        "kube-scheduler",
        "kube-controller-manager",
        "kube-apiserver",
        "etcd",
    ] {
        log.attempt(&format!("stopping {name}"), stop(state, name));
    }
    log.attempt(
        "removing the Service address rule",
        host::unroute_service_address().map(|had| {
            match had {
                true => "removed the iptables chain for the kubernetes Service address",
                false => "",
            }
            .to_string()
        }),
    );
    log.attempt(
        "deleting the pod network's links",
        host::remove_links().map(|l| match l.is_empty() {
            true => String::new(),
            false => format!("deleted links {}", l.join(", ")),
        }),
    );
    log.attempt(
        "removing the kubepods cgroups",
        host::remove_kubepods_cgroups().map(|n| format!("removed {n} kubepods cgroups")),
    );
    match state.read_host() {
        Ok(Some(before)) => {
            log.attempt(
                "restoring sysctls",
                host::restore_sysctls(&before).map(|r| match r.is_empty() {
                    true => String::new(),
                    false => format!("restored sysctls: {}", r.join(", ")),
                }),
            );
            log.attempt(
                "detaching the agents' pinned programs",
                host::uninstall_agent_pins(&before),
            );
            log.attempt(
                "unmounting the kernel filesystems `up` mounted",
                host::unmount_kernel_filesystems(&before).map(|r| match r.is_empty() {
                    true => String::new(),
                    false => format!("unmounted {}", r.join(", ")),
                }),
            );
            log.attempt(
                "removing what the cluster created at fixed paths",
                host::remove_created_paths(&before).map(|r| match r.is_empty() {
                    true => String::new(),
                    false => format!("removed {}", r.join(", ")),
                }),
            );
            if before.existed.get(KUBELET_ROOT) == Some(&true) {
                // It was there, empty, before `up`: leave it so.
                log.attempt(
                    &format!("recreating the empty {KUBELET_ROOT} found before"),
                    std::fs::create_dir_all(KUBELET_ROOT)
                        .map(|()| String::new())
                        .map_err(anyhow::Error::from),
                );
            }
        }
        Ok(None) => log.note("no host.json: no sysctls or paths to restore"),
        Err(e) => log.failed("reading host.json", e),
    }
    if log.failures.is_empty() {
        log.attempt(
            "emptying the state directory",
            clean_state_dir(state).map(|()| String::new()),
        );
    }
    let mut left = host::leftovers();
    left.extend(
        DAEMONS
            .iter()
            .filter_map(|d| daemon::running(state, d).map(|pid| format!("{d} (pid {pid})"))),
    );
    if !left.is_empty() {
        log.failed(
            "checking",
            anyhow::anyhow!("still there: {}", left.join("; ")),
        );
    }
    if !log.failures.is_empty() {
        bail!(
            "down did not finish cleanly ({}); run `cargo xtask cluster down` again after fixing it",
            log.failures.join("; ")
        );
    }
    Ok(())
}

/// /var/lib/kubelet removed, unless something is still mounted under it
/// (removing then would delete the mounted filesystems' files).
fn remove_kubelet_root() -> anyhow::Result<String> {
    mounts::unmount_all_under(Path::new(KUBELET_ROOT))?;
    std::fs::remove_dir_all(KUBELET_ROOT).with_context(|| format!("removing {KUBELET_ROOT}"))?;
    Ok(format!("removed {KUBELET_ROOT}"))
}

fn stop(state: &State, name: &str) -> anyhow::Result<String> {
    let pid = daemon::running(state, name);
    daemon::stop(state, name, Duration::from_secs(10))?;
    Ok(pid.map_or(String::new(), |pid| format!("stopped {name} (pid {pid})")))
}

/// /var/lib/kubelet carries our marker.
fn kubelet_root_is_ours(state: &State) -> bool {
    std::fs::read_to_string(KUBELET_MARKER).is_ok_and(|s| Path::new(s.trim()) == state.dir)
}

/// Kills every container's processes and makes containerd delete its
/// tasks (the shims unmount the containers' root filesystems then).
fn kill_containers(state: &State) -> anyhow::Result<String> {
    let killed = host::kill_pod_processes()?;
    let mut done = format!("killed {killed} container processes");
    if daemon::running(state, "containerd").is_none() {
        return Ok(done);
    }
    let tasks = xtask::util::output(images::ctr(state).args(["tasks", "ls", "-q"]))
        .context("listing containerd's tasks")?;
    let mut deleted = 0;
    for id in tasks.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let out = images::ctr(state)
            .args(["tasks", "delete", "--force", id])
            .output()?;
        deleted += usize::from(out.status.success());
    }
    done.push_str(&format!("; containerd deleted {deleted} tasks"));
    Ok(done)
}

/// Shims of our containerd still running (their containerd is gone);
/// found by the socket address in their command line.
fn kill_shims(state: &State) -> usize {
    let socket = network::containerd_socket(state);
    let socket = socket.to_string_lossy();
    let mut killed = 0;
    for pid in shim_pids(&socket) {
        if kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
            killed += 1;
        }
    }
    killed
}

pub(super) fn shim_pids(socket: &str) -> Vec<u32> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first()
                .is_some_and(|a| String::from_utf8_lossy(a).contains("containerd-shim"))
                && args.contains(&socket.as_bytes())
        })
        .collect()
}

/// Empties the state directory except [`KEPT`]; the logs move to
/// `last-logs/`. Refuses while anything is mounted under it.
fn clean_state_dir(state: &State) -> anyhow::Result<()> {
    if !state.dir.is_dir() {
        return Ok(());
    }
    let left = mounts::mounted_under(&state.dir)?;
    if !left.is_empty() {
        bail!(
            "not removing {}: still mounted under it: {left:?}",
            state.dir.display()
        );
    }
    let logs = state.path("logs");
    if logs.is_dir() {
        let last = state.path("last-logs");
        if last.exists() {
            std::fs::remove_dir_all(&last)?;
        }
        std::fs::rename(&logs, &last)?;
    }
    for entry in std::fs::read_dir(&state.dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if KEPT.iter().any(|k| name == *k) {
            continue;
        }
        let path: PathBuf = entry.path();
        if entry.file_type()?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}
