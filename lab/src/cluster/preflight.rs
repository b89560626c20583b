//! What must hold before `up` changes anything: root, a cgroup layout the
//! kubelet knows, overlayfs, the ports free (or held by this cluster's own
//! daemons), the kubelet root empty or ours, no foreign containerd on our
//! socket and no foreign CNI bridge.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{bail, Context};

use super::state::{KUBELET_MARKER, KUBELET_ROOT};
use super::{daemon, network, State, DAEMONS, PORTS};

pub(super) fn require_root() -> anyhow::Result<()> {
    if !xtask::util::is_root() {
        bail!(
            "cargo xtask cluster must run as root: it starts a kubelet and containerd, \
             mounts, and changes cgroups, sysctls and network links"
        );
    }
    Ok(())
}

/// Everything `up` needs from the host; the first problem found is the
/// error, worded for the user to act on.
pub(super) fn check(state: &State) -> anyhow::Result<()> {
    let layout = cgroup_layout()?;
    xtask::util::say(format!("cgroups: {layout}"));
    require_overlayfs()?;
    check_ports(state)?;
    check_kubelet_root(state)?;
    check_containerd_socket(state)?;
    check_bridge(state)?;
    Ok(())
}

/// "v1 (…controllers…)" or "v2"; an error when the kubelet's controllers
/// are missing.
fn cgroup_layout() -> anyhow::Result<String> {
    let mounts = super::mounts::current_mounts()?;
    let is_v2 = mounts
        .iter()
        .any(|m| m.mount_point == Path::new("/sys/fs/cgroup") && m.fs_type == "cgroup2");
    let needed = ["cpu", "cpuacct", "cpuset", "memory", "pids"];
    if is_v2 {
        let text = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .context("reading /sys/fs/cgroup/cgroup.controllers")?;
        let have: BTreeSet<&str> = text.split_whitespace().collect();
        let missing: Vec<&str> = ["cpu", "cpuset", "memory", "pids"]
            .into_iter()
            .filter(|c| !have.contains(c))
            .collect();
        if !missing.is_empty() {
            bail!(
                "cgroup v2 without the controllers {} (the kubelet needs them)",
                missing.join(", ")
            );
        }
        return Ok("v2 (unified)".into());
    }
    let have: BTreeSet<&str> = mounts
        .iter()
        .filter(|m| m.fs_type == "cgroup")
        .flat_map(|m| m.super_options.split(','))
        .collect();
    let missing: Vec<&str> = needed.into_iter().filter(|c| !have.contains(c)).collect();
    if !missing.is_empty() {
        bail!(
            "cgroup v1 without the controllers {} mounted (the kubelet needs them)",
            missing.join(", ")
        );
    }
    Ok(format!("v1 ({})", needed.join(", ")))
}

fn require_overlayfs() -> anyhow::Result<()> {
    let has = |text: &str| {
        text.lines()
            .any(|l| l.split_whitespace().last() == Some("overlay"))
    };
    let filesystems = std::fs::read_to_string("/proc/filesystems")?;
    if has(&filesystems) {
        return Ok(());
    }
    // Built as a module: loading it is what mounting would do anyway.
    let _ = std::process::Command::new("modprobe")
        .arg("overlay")
        .status();
    if has(&std::fs::read_to_string("/proc/filesystems")?) {
        return Ok(());
    }
    bail!("the kernel has no overlay filesystem (containerd's snapshotter needs it): `modprobe overlay` failed")
}

/// A listening TCP socket: its port and inode.
#[derive(Debug, PartialEq)]
pub(super) struct Listener {
    pub port: u16,
    pub inode: u64,
}

/// The listening sockets in a /proc/net/tcp or tcp6 table.
pub(super) fn parse_listeners(table: &str) -> Vec<Listener> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            if *fields.get(3)? != LISTEN {
                return None;
            }
            let port = u16::from_str_radix(local.rsplit_once(':')?.1, 16).ok()?;
            let inode = fields.get(9)?.parse().ok()?;
            Some(Listener { port, inode })
        })
        .collect()
}

/// Which process holds each socket inode: "pid (comm)".
fn socket_owners() -> BTreeMap<u64, (u32, String)> {
    let mut owners = BTreeMap::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return owners;
    };
    for entry in procs.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let comm = std::fs::read_to_string(entry.path().join("comm"))
            .map(|c| c.trim().to_string())
            .unwrap_or_default();
        for fd in fds.flatten() {
            let Ok(link) = std::fs::read_link(fd.path()) else {
                continue;
            };
            let inode = link
                .to_str()
                .and_then(|l| l.strip_prefix("socket:["))
                .and_then(|l| l.strip_suffix(']'))
                .and_then(|i| i.parse().ok());
            if let Some(inode) = inode {
                owners.entry(inode).or_insert((pid, comm.clone()));
            }
        }
    }
    owners
}

fn check_ports(state: &State) -> anyhow::Result<()> {
    let mut listeners = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(table) {
            listeners.extend(parse_listeners(&text));
        }
    }
    let ours: BTreeSet<u32> = DAEMONS
        .iter()
        .filter_map(|d| daemon::running(state, d))
        .collect();
    let owners = socket_owners();
    let mut taken = Vec::new();
    for (port, what) in PORTS {
        for l in listeners.iter().filter(|l| l.port == *port) {
            match owners.get(&l.inode) {
                Some((pid, _)) if ours.contains(pid) => {}
                Some((pid, comm)) => taken.push(format!("{port} ({what}) by {comm} (pid {pid})")),
                None => taken.push(format!("{port} ({what}) by a process not visible here")),
            }
        }
    }
    taken.dedup();
    if !taken.is_empty() {
        bail!(
            "ports the cluster needs are taken: {}. Stop what holds them (another Kubernetes, etcd \
             or kubelet?) and run `cargo xtask cluster up` again",
            taken.join("; ")
        );
    }
    Ok(())
}

/// /var/lib/kubelet must be absent, empty, or marked as ours.
fn check_kubelet_root(state: &State) -> anyhow::Result<()> {
    let root = Path::new(KUBELET_ROOT);
    let entries: Vec<String> = match std::fs::read_dir(root) {
        Ok(dir) => dir
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_context(|| format!("listing {KUBELET_ROOT}")),
    };
    if entries.is_empty() {
        return Ok(());
    }
    match std::fs::read_to_string(KUBELET_MARKER) {
        Ok(owner) if Path::new(owner.trim()) == state.dir => Ok(()),
        Ok(owner) => bail!(
            "{KUBELET_ROOT} belongs to the cluster of another state directory ({}); run \
             `cargo xtask cluster down --state-dir {}` first",
            owner.trim(),
            owner.trim()
        ),
        Err(_) => {
            let mut shown = entries;
            shown.sort();
            shown.truncate(5);
            bail!(
                "{KUBELET_ROOT} holds files this cluster did not make ({}...): another kubelet's? \
                 Stop it and move {KUBELET_ROOT} away, then run `cargo xtask cluster up` again",
                shown.join(", ")
            )
        }
    }
}

fn check_containerd_socket(state: &State) -> anyhow::Result<()> {
    let socket = network::containerd_socket(state);
    if daemon::running(state, "containerd").is_some() || !socket.exists() {
        return Ok(());
    }
    if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
        bail!(
            "a containerd this cluster did not start answers on {}; stop it first",
            socket.display()
        );
    }
    // Left by a containerd that died: nobody answers on it.
    std::fs::remove_file(&socket).with_context(|| format!("removing {}", socket.display()))
}

fn check_bridge(state: &State) -> anyhow::Result<()> {
    let bridge = Path::new("/sys/class/net").join(network::BRIDGE);
    if bridge.exists() && daemon::running(state, "containerd").is_none() {
        // Ours from a cluster that died without `down` counts as foreign
        // too: its addresses may differ. `down` removes it.
        let ours = state.read_host().ok().flatten().is_some();
        if !ours {
            bail!(
                "a network interface {} exists (another CNI's bridge?); the cluster's pods use a \
                 bridge of that name. Remove it (`ip link delete {}`) if nothing uses it",
                network::BRIDGE,
                network::BRIDGE
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_are_read_from_proc_net_tcp() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0953 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 00000000:1A0B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 77 1 0000000000000000 100 0 0 10 0
   2: 0200000A:D2F0 0100007F:0953 01 00000000:00000000 00:00000000 00000000     0        0 99 1 0000000000000000 20 4 30 10 -1
";
        assert_eq!(
            parse_listeners(table),
            vec![
                Listener {
                    port: 2387,
                    inode: 4242
                },
                Listener {
                    port: 6667,
                    inode: 77
                },
            ]
        );
    }

    #[test]
    fn ipv6_listeners_are_read_too() {
        let table = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000000000000:192B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 5150 1 0000000000000000 100 0 0 10 0
";
        assert_eq!(
            parse_listeners(table),
            vec![Listener {
                port: 6443,
                inode: 5150
            }]
        );
    }
}
