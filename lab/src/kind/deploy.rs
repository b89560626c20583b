//! The agent in the cluster: the image loaded, deploy/ applied with it, the
//! DaemonSet waited for; and what to print when something fails.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context};
use xtask::util::{run as run_cmd, say, workspace_root};

use super::{Cluster, Kube, E2E_IMAGE, TEST_NAMESPACE};

/// The image deploy/daemonset.yaml names; replaced by the one built here.
const DEPLOY_IMAGE: &str = "volume-health-agent:0.1.0";
const AGENT_NAMESPACE: &str = "volume-health";
const AGENT_DAEMON_SET: &str = "volume-health-agent";

pub(super) fn deploy_agent(cluster: &Cluster, kube: &Kube, archive: &Path) -> anyhow::Result<()> {
    say(format!(
        "loading {E2E_IMAGE} into the cluster from {}",
        archive.display()
    ));
    run_cmd(Command::new("kind").args(load_args(archive, &cluster.name)))?;
    let deploy = workspace_root().join("deploy");
    let rendered = kube.output(&["kustomize", &deploy.to_string_lossy()])?;
    let manifests = replace_image(&rendered, DEPLOY_IMAGE, E2E_IMAGE)?;
    say("applying deploy/");
    kube.apply(&manifests)?;
    if cluster.reused {
        // Same spec as before, but the image under the tag may be new.
        kube.run(&[
            "--namespace",
            AGENT_NAMESPACE,
            "rollout",
            "restart",
            &format!("daemonset/{AGENT_DAEMON_SET}"),
        ])?;
    }
    kube.run(&[
        "--namespace",
        AGENT_NAMESPACE,
        "rollout",
        "status",
        &format!("daemonset/{AGENT_DAEMON_SET}"),
        "--timeout=180s",
    ])
    .context("the agent's DaemonSet did not become ready")
}

/// `kind load image-archive`: kind copies the archive to each node and
/// imports it with containerd, which names the image after the archive's
/// `io.containerd.image.name`.
fn load_args(archive: &Path, cluster: &str) -> Vec<OsString> {
    let mut args: Vec<OsString> = vec!["load".into(), "image-archive".into()];
    args.push(archive.into());
    args.extend(["--name".into(), cluster.into()]);
    args
}

/// `image: FROM` replaced by `image: TO`, which must occur exactly once.
fn replace_image(manifests: &str, from: &str, to: &str) -> anyhow::Result<String> {
    let needle = format!("image: {from}\n");
    let count = manifests.matches(&needle).count();
    if count != 1 {
        bail!(
            "expected `{}` once in deploy/, found it {count} times",
            needle.trim()
        );
    }
    Ok(manifests.replace(&needle, &format!("image: {to}\n")))
}

/// What a failure needs to be understood: the agent's state and log.
pub(super) fn diagnose(kube: &Kube) {
    let ns = AGENT_NAMESPACE;
    let ds = format!("daemonset/{AGENT_DAEMON_SET}");
    for args in [
        vec!["--namespace", ns, "get", "pods", "-o", "wide"],
        vec!["--namespace", ns, "describe", "pods"],
        vec!["--namespace", ns, "logs", ds.as_str(), "--tail=100"],
        vec!["--namespace", TEST_NAMESPACE, "get", "events"],
    ] {
        let _ = kube.run(&args);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_is_replaced_exactly_once() {
        let text = "a: 1\n        image: volume-health-agent:0.1.0\nb: 2\n";
        let out = replace_image(text, DEPLOY_IMAGE, E2E_IMAGE).unwrap();
        assert_eq!(out, "a: 1\n        image: volume-health-agent:e2e\nb: 2\n");
        assert!(replace_image("image: other:1\n", DEPLOY_IMAGE, E2E_IMAGE).is_err());
        let twice = format!("{text}{text}");
        assert!(replace_image(&twice, DEPLOY_IMAGE, E2E_IMAGE).is_err());
    }

    #[test]
    fn the_archive_is_loaded_into_the_named_cluster() {
        let args = load_args(
            Path::new("/w/target/kind-e2e/agent.oci.tar"),
            "volume-health-e2e",
        );
        assert_eq!(
            args,
            [
                "load",
                "image-archive",
                "/w/target/kind-e2e/agent.oci.tar",
                "--name",
                "volume-health-e2e"
            ]
        );
    }

    #[test]
    fn deploy_names_the_image_the_e2e_replaces() {
        let ds = std::fs::read_to_string(workspace_root().join("deploy/daemonset.yaml")).unwrap();
        assert_eq!(ds.matches(&format!("image: {DEPLOY_IMAGE}\n")).count(), 1);
    }
}
