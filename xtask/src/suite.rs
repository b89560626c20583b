//! `cargo xtask test`, the README's test command: the packages and tools
//! the suites need, the Go components beside the release build, then
//! every test of the workspace with the built binaries named to them.

use anyhow::bail;

use crate::build::workspace;
use crate::util::{cargo, is_root, run, say, target_dir, workspace_root};
use crate::{bootstrap, ebpf};

/// The README's test command: everything, and loudly refusing to pretend
/// when the real-kernel tests cannot run.
pub fn test(args: &[String]) -> anyhow::Result<()> {
    if !is_root() {
        bail!(
            "the test suite drives the real kernel (eBPF programs, loop devices, FUSE, mounts) and must run as root; \
             nothing was skipped, nothing was run"
        );
    }
    // The real-server suites' Kubernetes and csi-sanity compile from Go
    // modules beside everything below (once per version; a cold build is
    // the longest part of a first run, docs/benchmarks.md, "CI").
    let components = crate::components::Background::start(crate::components::ALL);
    bootstrap::ensure_test_packages()?;
    // The committed kernel object must be what the toolchain builds from
    // these sources (the agent embeds that file).
    ebpf::verify()?;
    // tests/tests/server/deploy.rs renders the chart and the kustomization;
    // deploy_monitoring.rs also runs promtool on the chart's rules.
    let k8s = crate::k8s_tools::ensure()?;
    // tests/tests/host/image.rs reads the image with skopeo and umoci, and boots
    // its arm64 files on Debian's arm64 kernels.
    bootstrap::ensure_commands(bootstrap::IMAGE_TEST_TOOLS)?;
    let arm64_guests = crate::vm::arm64_guests::ensure(false)?;
    // The agent and the controller the suites run come from the workspace
    // build (HEALTH_AGENT_BIN), not from a build of their own package: that
    // one unifies fewer features and would compile tokio, hyper, kube,
    // tonic and aya a second time (about 7 minutes on 2 cores).
    let suite = || {
        let mut cargo = cargo();
        cargo
            .current_dir(workspace_root())
            .args(["test", "--release", "--workspace", "--no-fail-fast"])
            .env(
                "HEALTH_AGENT_BIN",
                target_dir().join("release/health-agent"),
            )
            .env(
                "HEALTH_CONTROLLER_BIN",
                target_dir().join("release/health-controller"),
            )
            .env("HELM_BIN", &k8s.helm)
            .env("KUBECTL_BIN", &k8s.kubectl)
            .env("PROMTOOL_BIN", &k8s.promtool)
            .env(crate::vm::arm64_guests::ENV, &arm64_guests);
        cargo
    };
    // A failed build is told at once; the Go builds it leaves go on
    // filling the cache for the next run.
    workspace(&[])?;
    let components = components.finish()?;
    say("running the test suite");
    let mut cargo = suite();
    components.apply(&mut cargo);
    run(cargo
        // tests/tests/host/image.rs runs `xtask image`: this very binary.
        .env("HEALTH_XTASK_BIN", std::env::current_exe()?)
        .arg("--")
        .args(args))
}
