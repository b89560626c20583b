//! The chart's NOTES name the Nodes whose kernel charges BPF memory to
//! RLIMIT_MEMLOCK (before 5.11), where the agent needs CAP_SYS_RESOURCE
//! (`memlockCapability`), from the kernel version each Node reports. helm's
//! `lookup` answers only against a cluster: here `helm install
//! --dry-run=server` against a real kube-apiserver holding Nodes with the
//! kernels of real distributions. (Under `helm template` lookup finds
//! nothing: the rendering never depends on it.)
//!
//! Needs the real kube-apiserver and etcd (`HEALTH_K8S_ASSETS`) and helm
//! and kubectl (`cargo xtask tools`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use health_tests::{k8s_tools, require_api_server, RealApiServer};
use serde_json::Value;

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/volume-health")
}

/// A Node named `name` whose status reports `kernel`.
fn add_node(server: &RealApiServer, home: &Path, name: &str, kernel: &str) -> Result<()> {
    let kubectl = k8s_tools::find("KUBECTL_BIN", "kubectl")?;
    let kubeconfig = server
        .kubeconfig(server.admin())
        .to_str()
        .context("UTF-8")?;
    let file = home.join(format!("{name}.json"));
    let node = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name},
    });
    std::fs::write(&file, node.to_string())?;
    let path = file.to_str().context("UTF-8")?;
    k8s_tools::run(
        &kubectl,
        &["--kubeconfig", kubeconfig, "create", "-f", path],
        home,
    )?;
    let status = serde_json::json!({"status": {"nodeInfo": {"kernelVersion": kernel}}});
    k8s_tools::run(
        &kubectl,
        &[
            "--kubeconfig",
            kubeconfig,
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=merge",
            "-p",
            &status.to_string(),
        ],
        home,
    )?;
    Ok(())
}

/// The NOTES of `helm install --dry-run=server` with `values`.
fn notes(server: &RealApiServer, home: &Path, values: &[&str]) -> Result<String> {
    let helm = k8s_tools::find("HELM_BIN", "helm")?;
    let kubeconfig = server
        .kubeconfig(server.admin())
        .to_str()
        .context("UTF-8")?;
    let chart = chart();
    let mut args = vec![
        "install",
        "volume-health",
        chart.to_str().context("UTF-8")?,
        "--dry-run=server",
        "--kubeconfig",
        kubeconfig,
        "--output",
        "json",
    ];
    args.extend_from_slice(values);
    let out = k8s_tools::run(&helm, &args, home)?;
    let release: Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    Ok(release["info"]["notes"]
        .as_str()
        .with_context(|| format!("no info.notes in {out}"))?
        .to_string())
}

/// The NOTES' lines before anything about kernels (for the release's
/// namespace, here helm's default).
const FIRST_LINE: &str = concat!(
    "volume-health node agent: DaemonSet volume-health-agent in namespace default.\n",
    "\n",
    "Check it: every node's agent ready (attached to the kernel, its pod and PV\n",
    "lists read), and what one of them sees on its node:\n",
    "\n",
    "  kubectl -n default rollout status daemonset/volume-health-agent\n",
    "  kubectl -n default get pods -l app.kubernetes.io/name=volume-health -o wide\n",
    "  kubectl -n default exec daemonset/volume-health-agent -- health-agent volumes\n",
);

#[test]
fn the_notes_name_the_nodes_with_kernels_before_5_11() -> Result<()> {
    let Some(server) = require_api_server() else {
        return Ok(());
    };
    let home = tempfile::tempdir()?;
    // Only Nodes of newer kernels: nothing to say.
    add_node(&server, home.path(), "bookworm", "6.1.0-56-amd64")?;
    add_node(&server, home.path(), "noble", "6.8.0-45-generic")?;
    assert_eq!(notes(&server, home.path(), &[])?, FIRST_LINE);

    add_node(&server, home.path(), "bullseye", "5.10.0-34-amd64")?;
    add_node(&server, home.path(), "rhel8", "4.18.0-553.el8_10.x86_64")?;
    add_node(&server, home.path(), "five-eleven", "5.11.0-49-generic")?;
    assert_eq!(
        notes(&server, home.path(), &[])?,
        format!(
            "{FIRST_LINE}\n\
             Kernels before 5.11 on 2 node(s): bullseye (5.10.0-34-amd64), rhel8 (4.18.0-553.el8_10.x86_64).\n\
             They charge BPF memory to RLIMIT_MEMLOCK, and the agent needs CAP_SYS_RESOURCE\n\
             to raise it; without it the agent exits there saying so. Upgrade with\n\
             --set memlockCapability=true (kustomize: the component deploy/components/memlock).\n"
        )
    );
    // Asked for: nothing more to say.
    assert_eq!(
        notes(&server, home.path(), &["--set", "memlockCapability=true"])?,
        FIRST_LINE
    );
    Ok(())
}
