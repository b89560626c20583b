//! `cargo xtask cluster test`: the end-to-end suite (tests/tests/kubelet_e2e.rs)
//! on the local single-node cluster of `cargo xtask cluster` (the lab's
//! `cluster` command, docs/local-cluster.md).
//!
//! The agent's image is built from this tree first and imported under the
//! chart's default name, so the suite installs what this checkout is. A
//! cluster that was up before is used and left up (with the new image); one
//! brought up here is taken down afterwards, pass or fail, and a failed
//! teardown fails the command: CI must leave the machine as it found it.

use std::process::Command;

use xtask::build;
use xtask::image::{self, ImageArgs};
use xtask::util::{cargo, run as run_cmd, say, workspace_root};

use crate::lab;

/// The suite (a `test = false` target), with the workspace build's
/// selection and so its features: nothing compiles again.
const SUITE: &[&str] = &["test", "--release", "--workspace", "--test", "kubelet_e2e"];

pub fn run(filter: &[String]) -> anyhow::Result<()> {
    // Everything the stage runs, in the build `cargo xtask test` left: the
    // agent and the controller of the image (the same binaries the other
    // suites test), the lab, the fault disk server, the CSI driver and
    // the suite itself.
    xtask::ebpf::ensure()?;
    build::workspace(&["kubelet_e2e"])?;
    let release = xtask::util::target_dir().join("release");
    let (repository, tag) = ("volume-health-agent", env!("CARGO_PKG_VERSION"));
    let archive = image::build(&ImageArgs {
        repository: Some(repository.into()),
        tag: Some(tag.into()),
        agent: Some(release.join("health-agent")),
        controller: Some(release.join("health-controller")),
        ..Default::default()
    })?
    .path;
    let was_up = lab::run("cluster", &["status".into()]).is_ok();
    if was_up {
        say("the cluster is up: running the suite on it, and leaving it up");
    }
    let up = lab::run(
        "cluster",
        &[
            "up".into(),
            "--agent-archive".into(),
            archive.display().to_string(),
        ],
    );
    let result = up.and_then(|()| run_suite(filter));
    if was_up {
        return result;
    }
    let down = lab::run("cluster", &["down".into()]);
    match (result, down) {
        (Ok(()), down) => down,
        (Err(e), Ok(())) => Err(e),
        (Err(e), Err(down)) => Err(e.context(format!("and `cluster down` failed too: {down:#}"))),
    }
}

fn run_suite(filter: &[String]) -> anyhow::Result<()> {
    say("running the end-to-end suite on the cluster (tests/tests/kubelet_e2e.rs)");
    let mut cmd: Command = cargo();
    cmd.current_dir(workspace_root()).args(SUITE);
    xtask::components::ensure(&[xtask::components::Part::Kubernetes])?.apply(&mut cmd);
    // One test at a time: they share the one node, its agent and its fault
    // disk.
    cmd.arg("--").arg("--test-threads=1").args(filter);
    run_cmd(&mut cmd)
}
