//! What the cluster changes on the host outside its state directory, and
//! how `down` undoes it: the sysctls the kubelet and the CNI bridge set,
//! the directories the kubelet and containerd create at fixed paths, the
//! `kubepods` cgroups, the bridge and its veths, and the iptables rule that
//! gives pods the `kubernetes` Service's address (there is no kube-proxy:
//! one DNAT rule sends 10.96.0.1:443 to the API server).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use xtask::util::{output, say};

use super::network::{Network, BRIDGE, NETWORK_NAME, SERVICE_IP};
use super::state::{HostBefore, KUBELET_ROOT};
use super::{mounts, State, APISERVER_PORT};

/// The kubelet sets these at start (its kernel tunables, unless
/// protectKernelDefaults), the CNI bridge sets ip_forward.
const SYSCTLS: &[&str] = &[
    "kernel.panic",
    "kernel.panic_on_oops",
    "kernel.keys.root_maxkeys",
    "kernel.keys.root_maxbytes",
    "vm.overcommit_memory",
    "vm.panic_on_oom",
    "net.ipv4.ip_forward",
];

/// Paths created whatever our configuration says: the kubelet's pod log
/// directories (hard-coded), libcni's cache (containerd's CNI library keeps
/// results there), the containerd shims' socket directory, the agent's
/// conditions socket directory (the chart's `csiProxy.socketDir`, a
/// hostPath the kubelet creates when an agent serves the CSI proxy) and its
/// state directory (the chart's `stateDir`, a hostPath made if missing).
pub(super) const FIXED_PATHS: &[&str] = &[
    KUBELET_ROOT,
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/run/containerd",
    "/run/volume-health",
    "/var/lib/volume-health",
];

/// The kernel filesystems the agent's DaemonSet mounts from the host
/// (deploy/daemonset.yaml): where, and of which type. Distributions mount
/// them at boot; a bare VM may not (this machine kind has no bpffs at
/// first), and the agent then refuses to pin.
const KERNEL_FILESYSTEMS: &[(&str, &str)] =
    &[("/sys/fs/bpf", "bpf"), ("/sys/kernel/tracing", "tracefs")];

/// Where the DaemonSet's agents pin their programs (the agent's default
/// `--pin-dir`). Agents remove them as they stop once their DaemonSet is
/// deleted; what a killed agent left, `down` detaches with the agent's own
/// `uninstall` when the directory was not there before `up`.
const AGENT_PIN_DIR: &str = "/sys/fs/bpf/volume-health";

/// Detaches what the cluster's agents left pinned (and their tracefs
/// instance) with `health-agent uninstall`, when the pin directory is the
/// cluster's. Returns what it did.
pub(super) fn uninstall_agent_pins(before: &HostBefore) -> anyhow::Result<String> {
    let ours = before.existed.get(AGENT_PIN_DIR) == Some(&false);
    if !ours || !Path::new(AGENT_PIN_DIR).exists() {
        return Ok(String::new());
    }
    let agent = xtask::util::target_dir().join("release/health-agent");
    if !agent.is_file() {
        bail!(
            "the agents left programs pinned in {AGENT_PIN_DIR}, and {} (to run `health-agent uninstall`) is gone",
            agent.display()
        );
    }
    output(Command::new(&agent).args(["uninstall", "--pin-dir", AGENT_PIN_DIR]))
        .context("health-agent uninstall")?;
    Ok(format!(
        "detached the agents' pinned programs in {AGENT_PIN_DIR}"
    ))
}

/// Mounts whichever of [`KERNEL_FILESYSTEMS`] the host lacks, and records
/// it in host.json for `down`. Returns what it mounted.
pub(super) fn mount_kernel_filesystems(state: &State) -> anyhow::Result<Vec<String>> {
    let mut before = state
        .read_host()?
        .context("host.json is written before the kernel filesystems are mounted")?;
    let present = mounts::current_mounts()?;
    let mut mounted = Vec::new();
    for (path, fs_type) in KERNEL_FILESYSTEMS {
        let there = present
            .iter()
            .any(|m| m.mount_point == Path::new(path) && m.fs_type == *fs_type);
        if there {
            continue;
        }
        nix::mount::mount(
            Some(*fs_type),
            *path,
            Some(*fs_type),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .with_context(|| format!("mounting {fs_type} at {path} (the agent needs it)"))?;
        if !before.mounted.iter().any(|p| p == path) {
            before.mounted.push(path.to_string());
        }
        mounted.push(format!("{fs_type} at {path}"));
    }
    state.write_host(&before)?;
    Ok(mounted)
}

/// Unmounts the kernel filesystems `up` mounted (pinned BPF objects under
/// bpffs go with it: the agent's pins belonged to this cluster). Returns
/// what it unmounted.
pub(super) fn unmount_kernel_filesystems(before: &HostBefore) -> anyhow::Result<Vec<String>> {
    let mut done = Vec::new();
    for path in &before.mounted {
        match nix::mount::umount2(path.as_str(), nix::mount::MntFlags::empty()) {
            Ok(()) => done.push(path.clone()),
            Err(nix::errno::Errno::EINVAL) => {} // not mounted any more
            Err(e) => return Err(e).with_context(|| format!("unmounting {path}")),
        }
    }
    Ok(done)
}

fn sysctl_path(name: &str) -> PathBuf {
    Path::new("/proc/sys").join(name.replace('.', "/"))
}

/// Writes host.json unless a half-up cluster already did (then the host
/// as it was before that `up` is what must come back).
pub(super) fn record_before(state: &State) -> anyhow::Result<()> {
    if state.read_host()?.is_some() {
        return Ok(());
    }
    let mut before = HostBefore::default();
    for name in SYSCTLS {
        if let Ok(value) = std::fs::read_to_string(sysctl_path(name)) {
            before
                .sysctls
                .insert(name.to_string(), value.trim().to_string());
        }
    }
    for path in FIXED_PATHS.iter().chain([&AGENT_PIN_DIR]) {
        before
            .existed
            .insert(path.to_string(), Path::new(path).exists());
    }
    state.write_host(&before)
}

/// Puts the recorded sysctls back; returns what it changed.
pub(super) fn restore_sysctls(before: &HostBefore) -> anyhow::Result<Vec<String>> {
    let mut changed = Vec::new();
    for (name, value) in &before.sysctls {
        let path = sysctl_path(name);
        let now = std::fs::read_to_string(&path).unwrap_or_default();
        if now.trim() != value {
            std::fs::write(&path, value).with_context(|| format!("restoring {name} = {value}"))?;
            changed.push(format!("{name} {} -> {value}", now.trim()));
        }
    }
    Ok(changed)
}

/// Removes the fixed paths that did not exist before `up`; of those that
/// did, only what the cluster added to them (libcni's cache entries of our
/// network). Returns what it removed.
pub(super) fn remove_created_paths(before: &HostBefore) -> anyhow::Result<Vec<String>> {
    let mut removed = Vec::new();
    for path in FIXED_PATHS {
        let p = Path::new(path);
        let existed = before.existed.get(*path).copied().unwrap_or(true);
        // The kubelet's root is teardown's own step (its mounts first).
        if !existed && p.exists() && *path != KUBELET_ROOT {
            let mounted = mounts::mounted_under(p)?;
            if !mounted.is_empty() {
                bail!("not removing {path}: still mounted under it: {mounted:?}");
            }
            std::fs::remove_dir_all(p).with_context(|| format!("removing {path}"))?;
            removed.push(path.to_string());
        }
    }
    let results = Path::new("/var/lib/cni/results");
    if let Ok(entries) = std::fs::read_dir(results) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("{NETWORK_NAME}-")) {
                std::fs::remove_file(entry.path())?;
                removed.push(entry.path().display().to_string());
            }
        }
    }
    Ok(removed)
}

/// The `kubepods` cgroup trees, in every mounted hierarchy.
pub(super) fn kubepods_cgroups() -> anyhow::Result<Vec<PathBuf>> {
    let mut found: Vec<PathBuf> = mounts::current_mounts()?
        .into_iter()
        .filter(|m| m.fs_type == "cgroup" || m.fs_type == "cgroup2")
        .map(|m| m.mount_point.join("kubepods"))
        .filter(|p| p.is_dir())
        .collect();
    found.dedup();
    Ok(found)
}

/// Every directory of a cgroup tree, deepest first.
fn cgroup_dirs_deepest_first(root: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![root.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        if let Ok(entries) = std::fs::read_dir(&dirs[i]) {
            for e in entries.flatten() {
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(e.path());
                }
            }
        }
        i += 1;
    }
    dirs.reverse();
    dirs
}

/// The processes in the cgroup trees.
fn cgroup_pids(roots: &[PathBuf]) -> Vec<u32> {
    let mut pids: Vec<u32> = roots
        .iter()
        .flat_map(|r| cgroup_dirs_deepest_first(r))
        .filter_map(|d| std::fs::read_to_string(d.join("cgroup.procs")).ok())
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// SIGKILLs every process left in the `kubepods` cgroups (the containers'
/// processes: the kubelet is stopped and nothing restarts them) until none
/// is left. Returns how many were killed.
pub(super) fn kill_pod_processes() -> anyhow::Result<usize> {
    let roots = kubepods_cgroups()?;
    let mut killed = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let pids = cgroup_pids(&roots);
        if pids.is_empty() {
            return Ok(killed.len());
        }
        for pid in pids {
            if kill(Pid::from_raw(pid as i32), Signal::SIGKILL).is_ok() {
                killed.insert(pid);
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "processes remain in the kubepods cgroups after 20 s of SIGKILL: {:?}",
                cgroup_pids(&roots)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Removes the `kubepods` cgroup trees (rmdir, deepest first; the kernel
/// refuses while a process is in one). Returns how many directories.
pub(super) fn remove_kubepods_cgroups() -> anyhow::Result<usize> {
    let mut removed = 0;
    for root in kubepods_cgroups()? {
        for dir in cgroup_dirs_deepest_first(&root) {
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                match std::fs::remove_dir(&dir) {
                    Ok(()) => {
                        removed += 1;
                        break;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    // EBUSY while a killed process is still being torn down.
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => {
                        return Err(e).with_context(|| format!("removing cgroup {}", dir.display()))
                    }
                }
            }
        }
    }
    Ok(removed)
}

/// The bridge and the host ends of the pods' veths. Returns the links
/// deleted.
pub(super) fn remove_links() -> anyhow::Result<Vec<String>> {
    let mut deleted = Vec::new();
    let bridge = Path::new("/sys/class/net").join(BRIDGE);
    if !bridge.exists() {
        return Ok(deleted);
    }
    if let Ok(ports) = std::fs::read_dir(bridge.join("brif")) {
        for port in ports.flatten() {
            let name = port.file_name().to_string_lossy().into_owned();
            // Gone already when its namespace went away.
            if output(Command::new("ip").args(["link", "delete", &name])).is_ok() {
                deleted.push(name);
            }
        }
    }
    output(Command::new("ip").args(["link", "delete", BRIDGE]))
        .with_context(|| format!("deleting the bridge {BRIDGE}"))?;
    deleted.push(BRIDGE.to_string());
    Ok(deleted)
}

/// The nat chain holding the Service address rule.
const CHAIN: &str = "VOLUME-HEALTH-SVC";
const HOOKS: &[&str] = &["PREROUTING", "OUTPUT"];

fn iptables(args: &[&str]) -> anyhow::Result<String> {
    output(
        Command::new("iptables")
            .args(["-w", "5", "-t", "nat"])
            .args(args),
    )
}

/// The `kubernetes` Service's address (what the kubelet gives pods as
/// KUBERNETES_SERVICE_HOST:443) sent to the API server on this host, from
/// pods (PREROUTING) and host-network pods (OUTPUT).
pub(super) fn route_service_address(net: &Network) -> anyhow::Result<()> {
    if iptables(&["-S", CHAIN]).is_err() {
        iptables(&["-N", CHAIN]).context("creating an iptables nat chain (iptables)")?;
    }
    iptables(&["-F", CHAIN])?;
    let to = format!("{}:{APISERVER_PORT}", net.node_ip);
    let service = format!("{SERVICE_IP}/32");
    iptables(&[
        "-A",
        CHAIN,
        "-d",
        &service,
        "-p",
        "tcp",
        "--dport",
        "443",
        "-j",
        "DNAT",
        "--to-destination",
        &to,
    ])?;
    for hook in HOOKS {
        if iptables(&["-C", hook, "-j", CHAIN]).is_err() {
            iptables(&["-I", hook, "-j", CHAIN])?;
        }
    }
    say(format!("{SERVICE_IP}:443 (the kubernetes Service) -> {to}"));
    Ok(())
}

/// Removes the chain and its jumps; true when there was one.
pub(super) fn unroute_service_address() -> anyhow::Result<bool> {
    if iptables(&["-S", CHAIN]).is_err() {
        return Ok(false);
    }
    for hook in HOOKS {
        while iptables(&["-D", hook, "-j", CHAIN]).is_ok() {}
    }
    iptables(&["-F", CHAIN])?;
    iptables(&["-X", CHAIN])?;
    Ok(true)
}

/// Anything of the cluster's left on the host, for `status` and for the
/// end of `down`: a list of findings, empty when clean.
pub(super) fn leftovers() -> Vec<String> {
    let mut found = Vec::new();
    if let Ok(roots) = kubepods_cgroups() {
        found.extend(roots.iter().map(|r| format!("cgroup {}", r.display())));
    }
    if Path::new("/sys/class/net").join(BRIDGE).exists() {
        found.push(format!("link {BRIDGE}"));
    }
    if let Ok(points) = mounts::mounted_under(Path::new(KUBELET_ROOT)) {
        found.extend(points.iter().map(|p| format!("mount {}", p.display())));
    }
    if iptables(&["-S", CHAIN]).is_ok() {
        found.push(format!("iptables nat chain {CHAIN}"));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysctl_names_map_to_proc_sys() {
        assert_eq!(
            sysctl_path("net.ipv4.ip_forward"),
            PathBuf::from("/proc/sys/net/ipv4/ip_forward")
        );
    }

    #[test]
    fn cgroup_trees_are_listed_deepest_first() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kubepods");
        std::fs::create_dir_all(root.join("besteffort/pod1/c1")).unwrap();
        std::fs::create_dir_all(root.join("burstable")).unwrap();
        std::fs::write(root.join("besteffort/pod1/cgroup.procs"), "12\n7\n").unwrap();
        let dirs = cgroup_dirs_deepest_first(&root);
        assert_eq!(dirs.len(), 5);
        assert_eq!(dirs.last().unwrap(), &root);
        let pos = |p: &str| dirs.iter().position(|d| d == &root.join(p)).unwrap();
        assert!(pos("besteffort/pod1/c1") < pos("besteffort/pod1"));
        assert!(pos("besteffort/pod1") < pos("besteffort"));
        assert_eq!(cgroup_pids(&[root]), vec![7, 12]);
    }
}
