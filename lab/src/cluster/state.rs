//! The cluster's state directory (`target/cluster/` unless `--state-dir` or
//! `HEALTH_CLUSTER_DIR` says otherwise) and the two files in it that other
//! code reads: `cluster.json` (what the cluster is, for tests, scripts and
//! the storage part) and `host.json` (what `up` found on the host before it
//! changed anything, so that `down` can put it back).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The environment variable that moves the state directory.
pub(super) const DIR_ENV: &str = "HEALTH_CLUSTER_DIR";
/// The kubelet's root: every distribution's default, which the chart's
/// hostPaths assume. It is the one part of the cluster outside the state
/// directory.
pub(super) const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// What marks [`KUBELET_ROOT`] as made by this cluster (its content is the
/// state directory that made it).
pub(super) const KUBELET_MARKER: &str = "/var/lib/kubelet/.volume-health-cluster";

/// The state directory of one cluster and its node's name.
pub(super) struct State {
    pub dir: PathBuf,
    node: String,
}

impl State {
    /// The state directory from `--state-dir`, else `HEALTH_CLUSTER_DIR`,
    /// else `target/cluster` of the workspace. The node is named as
    /// `cluster.json` says when a cluster was brought up from here, else
    /// after this host.
    pub(super) fn open(dir: Option<&Path>) -> anyhow::Result<State> {
        let dir = match dir {
            Some(dir) => dir.to_path_buf(),
            None => match std::env::var_os(DIR_ENV) {
                Some(dir) => PathBuf::from(dir),
                None => xtask::util::target_dir().join("cluster"),
            },
        };
        let dir = if dir.is_absolute() {
            dir
        } else {
            std::env::current_dir()?.join(dir)
        };
        let mut state = State {
            dir,
            node: String::new(),
        };
        state.node = match state.read_description() {
            Ok(Some(d)) => d["node"].as_str().map(str::to_string),
            _ => None,
        }
        .map_or_else(host_node_name, Ok)?;
        Ok(state)
    }

    pub(super) fn path(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.dir.join(rel)
    }

    /// The admin's kubeconfig (system:masters).
    pub(super) fn kubeconfig(&self) -> PathBuf {
        self.path("kubeconfig")
    }

    pub(super) fn node_name(&self) -> &str {
        &self.node
    }

    fn description_path(&self) -> PathBuf {
        self.path("cluster.json")
    }

    /// `cluster.json`, or None when `up` has not written it.
    pub(super) fn read_description(&self) -> anyhow::Result<Option<Value>> {
        let path = self.description_path();
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not JSON", path.display()))
                .map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    /// Writes `cluster.json` whole (through a temporary file, so a reader
    /// never sees half of it).
    pub(super) fn write_description(&self, description: &Value) -> anyhow::Result<()> {
        write_json(&self.description_path(), description)
    }

    /// What `up` recorded about the host before changing it.
    pub(super) fn read_host(&self) -> anyhow::Result<Option<HostBefore>> {
        let path = self.path("host.json");
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("{} is not what `up` wrote", path.display()))
                .map(Some),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    pub(super) fn write_host(&self, host: &HostBefore) -> anyhow::Result<()> {
        write_json(&self.path("host.json"), &serde_json::to_value(host)?)
    }
}

/// What the host had before the cluster changed it; `down` restores it.
#[derive(Debug, Default, Serialize, Deserialize, PartialEq)]
pub(super) struct HostBefore {
    /// sysctl name (dotted) → value, for those the kubelet and the CNI
    /// bridge set.
    pub sysctls: BTreeMap<String, String>,
    /// Paths the kubelet creates whatever its root says, and whether each
    /// existed before (those that did are left alone).
    pub existed: BTreeMap<String, bool>,
    /// The kernel filesystems `up` mounted because the host had none there
    /// (bpffs, tracefs: a fresh VM has no bpffs); `down` unmounts them.
    #[serde(default)]
    pub mounted: Vec<String>,
}

fn write_json(path: &Path, value: &Value) -> anyhow::Result<()> {
    let tmp = path.with_extension("json.partial");
    let text = serde_json::to_string_pretty(value)? + "\n";
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("moving {} into place", tmp.display()))
}

/// This host's name as a Node name: lower case, and a valid DNS subdomain.
fn host_node_name() -> anyhow::Result<String> {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading /proc/sys/kernel/hostname")?;
    node_name_from(&raw).with_context(|| {
        format!(
            "the host name {:?} is not a valid Kubernetes node name (a DNS subdomain)",
            raw.trim()
        )
    })
}

fn node_name_from(host: &str) -> Option<String> {
    let name = host.trim().to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    (!name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_lower_case_dns_subdomains() {
        assert_eq!(node_name_from("vm\n").as_deref(), Some("vm"));
        assert_eq!(
            node_name_from("Build-01.Example.org").as_deref(),
            Some("build-01.example.org")
        );
        assert_eq!(node_name_from("under_score"), None);
        assert_eq!(node_name_from("-dash"), None);
        assert_eq!(node_name_from("a..b"), None);
        assert_eq!(node_name_from(""), None);
    }

    #[test]
    fn host_facts_round_trip_through_host_json() {
        let dir = tempfile::tempdir().unwrap();
        let state = State {
            dir: dir.path().to_path_buf(),
            node: "n".into(),
        };
        assert_eq!(state.read_host().unwrap(), None);
        let mut host = HostBefore::default();
        host.sysctls.insert("kernel.panic".into(), "1".into());
        host.existed.insert("/var/log/pods".into(), false);
        state.write_host(&host).unwrap();
        assert_eq!(state.read_host().unwrap(), Some(host));
        assert!(!dir.path().join("host.json.partial").exists());
    }
}
