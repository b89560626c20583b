//! What this host must have (docker with a running engine, kind, kubectl)
//! and the images built on it: the agent's and the faultdisk server's.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use super::E2E_IMAGE;
use crate::util::{on_path, output, run as run_cmd, say, workspace_root};

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

/// The agent image, and the faultdisk binary built the same way; returns
/// the binary's path on this host.
pub(super) fn build_images(work: &Path) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    say(format!("building the agent image {E2E_IMAGE} (Dockerfile)"));
    run_cmd(
        Command::new("docker")
            .args(["build", "--tag", E2E_IMAGE])
            .arg(&root),
    )?;
    let out = work.join("faultdisk-out");
    say("building the faultdisk server (Dockerfile target `faultdisk`)");
    run_cmd(
        Command::new("docker")
            .args(["build", "--target", "faultdisk", "--output"])
            .arg(format!("type=local,dest={}", out.display()))
            .arg(&root),
    )?;
    let bin = out.join("faultdisk");
    if !bin.is_file() {
        bail!("the faultdisk build left no {}", bin.display());
    }
    Ok(bin)
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
}
