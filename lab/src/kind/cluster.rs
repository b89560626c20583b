//! The kind cluster: made (or reused) with this host's shared directory
//! mounted into its one node, deleted unless kept; commands on that node.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use xtask::util::{output, run as run_cmd, say};

use super::{KindArgs, Kube, NODE_SHARED};

const CLUSTER: &str = "volume-health-e2e";

pub(super) struct Cluster {
    pub(super) name: String,
    pub(super) node: String,
    kubeconfig: PathBuf,
    /// An existing cluster was used (the agent may run an older image).
    pub(super) reused: bool,
    /// Deleted when dropped: not with --keep, and never a cluster that
    /// turned out not to be this command's.
    delete: bool,
}

impl Cluster {
    pub(super) fn up(args: &KindArgs, work: &Path, shared: &Path) -> anyhow::Result<Cluster> {
        let exists = output(Command::new("kind").args(["get", "clusters"]))?
            .lines()
            .any(|l| l.trim() == CLUSTER);
        if exists && !args.reuse {
            bail!(
                "a kind cluster named {CLUSTER} exists already; pass --reuse to use it, \
                 or delete it with `kind delete cluster --name {CLUSTER}`"
            );
        }
        if !exists {
            create_cluster(work, shared, args.node_image.as_deref())?;
        }
        let mut cluster = Cluster {
            name: CLUSTER.to_string(),
            node: String::new(),
            kubeconfig: work.join("kubeconfig"),
            reused: exists,
            // From here on a cluster made here goes away if anything fails.
            delete: !exists && !args.keep,
        };
        let config = output(Command::new("kind").args(["get", "kubeconfig", "--name", CLUSTER]))?;
        std::fs::write(&cluster.kubeconfig, config)?;
        cluster.node = control_plane_node()?;
        check_shared_mount(&cluster.node, shared)?;
        cluster.delete = !args.keep;
        Ok(cluster)
    }

    pub(super) fn kube(&self) -> Kube {
        Kube {
            kubeconfig: self.kubeconfig.clone(),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.delete {
            say(format!(
                "leaving the cluster {} (kubectl --kubeconfig {})",
                self.name,
                self.kubeconfig.display()
            ));
            return;
        }
        say(format!("deleting the cluster {}", self.name));
        if let Err(e) =
            run_cmd(Command::new("kind").args(["delete", "cluster", "--name", &self.name]))
        {
            say(format!("deleting the cluster: {e:#}"));
        }
    }
}

fn create_cluster(work: &Path, shared: &Path, node_image: Option<&str>) -> anyhow::Result<()> {
    let config = work.join("kind-config.yaml");
    std::fs::write(&config, kind_config(shared))?;
    say(format!("creating the kind cluster {CLUSTER}"));
    let mut cmd = Command::new("kind");
    cmd.args([
        "create", "cluster", "--name", CLUSTER, "--wait", "180s", "--config",
    ])
    .arg(&config);
    if let Some(image) = node_image {
        cmd.args(["--image", image]);
    }
    run_cmd(&mut cmd)
}

fn kind_config(shared: &Path) -> String {
    format!(
        "kind: Cluster\n\
         apiVersion: kind.x-k8s.io/v1alpha4\n\
         nodes:\n\
         \x20 - role: control-plane\n\
         \x20   extraMounts:\n\
         \x20     - hostPath: {}\n\
         \x20       containerPath: {NODE_SHARED}\n",
        shared.display()
    )
}

fn control_plane_node() -> anyhow::Result<String> {
    let nodes = output(Command::new("kind").args(["get", "nodes", "--name", CLUSTER]))?;
    nodes
        .lines()
        .map(str::trim)
        .find(|n| n.ends_with("-control-plane"))
        .map(String::from)
        .with_context(|| format!("no control-plane node in {nodes:?}"))
}

/// A reused cluster must have been made by this command: the shared
/// directory of this host must be what the node sees.
fn check_shared_mount(node: &str, shared: &Path) -> anyhow::Result<()> {
    let marker = format!(".marker-{}", std::process::id());
    std::fs::write(shared.join(&marker), b"")?;
    let seen = node_sh(node, &format!("test -f {NODE_SHARED}/{marker}"));
    let _ = std::fs::remove_file(shared.join(&marker));
    seen.with_context(|| {
        format!(
            "the node {node} does not see {} at {NODE_SHARED}: the cluster was not made by \
             `cargo xtask kind`; delete it with `kind delete cluster --name {CLUSTER}`",
            shared.display()
        )
    })?;
    Ok(())
}

/// Runs a shell script on the node; its stdout.
pub(super) fn node_sh(node: &str, script: &str) -> anyhow::Result<String> {
    output(Command::new("docker").args(["exec", node, "sh", "-c", script]))
}

/// tracefs and bpffs where the DaemonSet mounts them from, and what the
/// fault disk needs on the node.
pub(super) fn prepare_node(node: &str) -> anyhow::Result<()> {
    say(format!("preparing the node {node}"));
    node_sh(
        node,
        "set -e
         mountpoint -q /sys/kernel/tracing || mount -t tracefs tracefs /sys/kernel/tracing
         mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf",
    )
    .context("mounting tracefs and bpffs on the node")?;
    let checks = [
        ("test -e /sys/kernel/btf/vmlinux", "the host kernel has no BTF (/sys/kernel/btf/vmlinux)"),
        ("test -c /dev/fuse", "no /dev/fuse on the node: load the fuse module on the host (modprobe fuse) and recreate the cluster"),
        ("test -e /dev/loop-control", "no /dev/loop-control on the node: load the loop module on the host (modprobe loop) and recreate the cluster"),
        ("command -v losetup && command -v mkfs.ext4 && command -v filefrag && command -v mknod", "the node image lacks losetup, mkfs.ext4, filefrag or mknod"),
    ];
    for (script, problem) in checks {
        node_sh(node, script).with_context(|| problem.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kind_config_mounts_the_shared_dir() {
        let config = kind_config(Path::new("/w/target/kind-e2e/shared"));
        assert!(config.contains("  - role: control-plane\n"));
        assert!(config.contains("      - hostPath: /w/target/kind-e2e/shared\n"));
        assert!(config.contains(&format!("        containerPath: {NODE_SHARED}\n")));
    }
}
