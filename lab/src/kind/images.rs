//! What this host must have (docker with a running engine, kind, kubectl)
//! and what is built on it: the agent's image archive (`cargo xtask image`,
//! no engine involved) and the faultdisk server (still a Dockerfile target:
//! it is a test tool, built on bookworm for the node's glibc).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use xtask::util::{on_path, output, run as run_cmd, say, workspace_root};

use super::{E2E_IMAGE, E2E_TAG};

pub(super) fn require_tools() -> anyhow::Result<()> {
    let missing: Vec<&str> = ["docker", "kind", "kubectl"]
        .into_iter()
        .filter(|t| on_path(t).is_none())
        .collect();
    if !missing.is_empty() {
        bail!("{}", missing_tools_message(&missing));
    }
    output(Command::new("docker").args(["info", "--format", "{{.ServerVersion}}"])).context(
        "docker is installed but its engine does not answer (`docker info`); \
         cargo xtask kind needs a running Docker engine",
    )?;
    Ok(())
}

fn missing_tools_message(missing: &[&str]) -> String {
    format!(
        "cargo xtask kind needs docker, kind and kubectl on PATH; missing: {}. \
         It cannot run on the project's development VMs (no Docker engine); \
         run it where Docker and kind exist.",
        missing.join(", ")
    )
}

/// What the end to end test deploys.
pub(super) struct Built {
    /// The agent's OCI archive, named [`E2E_IMAGE`].
    pub(super) agent_image: PathBuf,
    /// The faultdisk server binary on this host.
    pub(super) faultdisk: PathBuf,
}

pub(super) fn build_images(work: &Path) -> anyhow::Result<Built> {
    say(format!(
        "building the agent image {E2E_IMAGE} (cargo xtask image)"
    ));
    let agent_image = xtask::image::build(&image_args(work))?.path;
    let root = workspace_root();
    let out = work.join("faultdisk-out");
    say("building the faultdisk server (Dockerfile target `faultdisk`)");
    run_cmd(
        Command::new("docker")
            .args(["build", "--target", "faultdisk", "--output"])
            .arg(format!("type=local,dest={}", out.display()))
            .arg(&root),
    )?;
    let faultdisk = out.join("faultdisk");
    if !faultdisk.is_file() {
        bail!("the faultdisk build left no {}", faultdisk.display());
    }
    Ok(Built {
        agent_image,
        faultdisk,
    })
}

/// `cargo xtask image --tag e2e --output <work>/agent.oci.tar`: the agent
/// built here, under the name the manifests are given ([`E2E_IMAGE`]).
fn image_args(work: &Path) -> xtask::image::ImageArgs {
    xtask::image::ImageArgs {
        output: Some(work.join("agent.oci.tar")),
        tag: Some(E2E_TAG.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tools_are_named_and_the_reason_given() {
        let msg = missing_tools_message(&["docker", "kind"]);
        assert!(msg.contains("missing: docker, kind."), "{msg}");
        assert!(msg.contains("no Docker engine"), "{msg}");
    }

    #[test]
    fn the_archive_carries_the_name_the_manifests_get() {
        let args = image_args(Path::new("/w/target/kind-e2e"));
        assert_eq!(
            args.output.as_deref(),
            Some(Path::new("/w/target/kind-e2e/agent.oci.tar"))
        );
        let repository = args
            .repository
            .as_deref()
            .unwrap_or(xtask::image::REPOSITORY);
        assert_eq!(format!("{repository}:{}", args.tag.unwrap()), E2E_IMAGE);
        assert_eq!(args.agent, None, "the e2e builds the agent itself");
    }
}
