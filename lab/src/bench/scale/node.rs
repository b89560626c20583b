//! One node as its agent sees it: a kubelet root where each of the node's
//! pods has its claim's CSI volume set up as kubelet leaves it
//! (`pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount` with `vol_data.json`
//! beside it), each mount a small tmpfs. The volumes' storage plays no
//! part here, only that the agent finds them and resolves their pods,
//! claims and PVs on the API server.

use std::path::Path;

use anyhow::{Context, Result};
use health_tests::Mount;
use serde_json::json;
use tempfile::TempDir;

use super::populate::{node_name, pv_name, CLAIMS, PODS_PER_NODE};
use crate::bench::controller::cluster::handle;
use crate::bench::controller::DRIVER;

/// A node's kubelet root; unmounted and removed on drop.
pub struct NodeTree {
    pub node: String,
    // Declared before `root`: unmounted before the directory goes.
    _mounts: Vec<Mount>,
    root: TempDir,
}

impl NodeTree {
    /// Node `n` (1-based) with the volumes of its pods (`pod_uids` as the
    /// server assigned them, by pod number).
    pub fn new(n: usize, pod_uids: &[String]) -> Result<NodeTree> {
        let node = node_name(n);
        let root = tempfile::Builder::new()
            .prefix(&format!("kubelet-{node}-"))
            .tempdir()?;
        let mut mounts = Vec::new();
        let first = (n - 1) * PODS_PER_NODE;
        let pods = pod_uids.iter().enumerate().skip(first).take(PODS_PER_NODE);
        for (j, uid) in pods.filter(|(j, _)| *j < CLAIMS) {
            let dir = root
                .path()
                .join("pods")
                .join(uid)
                .join("volumes/kubernetes.io~csi")
                .join(pv_name(j));
            std::fs::create_dir_all(dir.join("mount"))
                .with_context(|| format!("creating {}", dir.display()))?;
            std::fs::write(
                dir.join("vol_data.json"),
                json!({"attachmentID": format!("csi-{j:012x}"), "driverName": DRIVER,
                       "nodeName": node, "specVolID": pv_name(j), "volumeHandle": handle(j),
                       "volumeLifecycleMode": "Persistent"})
                .to_string(),
            )?;
            mounts.push(Mount::at("tmpfs", dir.join("mount"), "tmpfs", "size=1m")?);
        }
        // Nodes 1-50 run pods with claims only: each has its 10 volumes.
        anyhow::ensure!(
            mounts.len() == PODS_PER_NODE,
            "{node} has {} volumes, not {PODS_PER_NODE}",
            mounts.len()
        );
        Ok(NodeTree {
            node,
            _mounts: mounts,
            root,
        })
    }

    pub fn root(&self) -> &Path {
        self.root.path()
    }
}
