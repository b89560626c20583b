//! Building the kernel object and the agent, and running tests against them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::bootstrap::{self, DEBIAN_CARGO, DEBIAN_RUSTC};
use crate::util::{cargo, is_root, run, say, workspace_root};

pub struct Built {
    pub ebpf_object: PathBuf,
    pub agent: PathBuf,
}

/// Bootstrap, kernel object, release agent.
pub fn all() -> anyhow::Result<Built> {
    let toolchain = bootstrap::ensure()?;
    let ebpf_object = ebpf(&toolchain)?;
    say("building health-agent (release)");
    let agent = release_agent(Some(&ebpf_object))?;
    say(format!(
        "built {} (kernel programs embedded)",
        agent.display()
    ));
    Ok(Built { ebpf_object, agent })
}

/// Builds the release agent, embedding `ebpf_object` when given (without
/// it the agent cannot attach, which a controller-only run does not need).
pub fn release_agent(ebpf_object: Option<&Path>) -> anyhow::Result<PathBuf> {
    let mut build = cargo();
    build.current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "health-agent",
        "--bin",
        "health-agent",
    ]);
    if let Some(object) = ebpf_object {
        build.env("HEALTH_EBPF_OBJECT", object);
    }
    run(&mut build)?;
    Ok(target_dir().join("release/health-agent"))
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Builds `health-ebpf` for bpfel-unknown-none with Debian's compiler.
pub fn ebpf(toolchain: &bootstrap::Toolchain) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let target_dir = root.join("target");
    say(format!(
        "building the kernel programs (Debian rustc, LLVM {})",
        toolchain.llvm_major
    ));
    let mut cmd = Command::new(DEBIAN_CARGO);
    cmd.current_dir(root.join("health-ebpf"))
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // rustup's proxies and the outer cargo's settings must not leak in:
        // this build uses a different compiler.
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env("RUSTC", DEBIAN_RUSTC)
        // build-std is unstable; Debian's stable compiler allows it this way.
        .env("RUSTC_BOOTSTRAP", "1")
        .env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_LINKER",
            &toolchain.bpf_linker,
        )
        .env(
            "CARGO_TARGET_BPFEL_UNKNOWN_NONE_RUSTFLAGS",
            "-C debuginfo=2 -C link-arg=--btf",
        );
    run(&mut cmd).context("building the kernel programs")?;
    let object = target_dir.join("bpfel-unknown-none/release/health-ebpf");
    if !object.is_file() {
        bail!(
            "the eBPF build succeeded but {} is missing",
            object.display()
        );
    }
    Ok(object)
}

pub fn run_agent(built: &Built, args: &[String]) -> anyhow::Result<()> {
    if !is_root() {
        say("note: not root; the agent will explain what it is missing");
    }
    let mut cmd = Command::new(&built.agent);
    cmd.arg("watch").args(args);
    say(format!("running {cmd:?} (Ctrl-C to stop)"));
    run(&mut cmd)
}

/// The README's test command: everything, and loudly refusing to pretend
/// when the real-kernel tests cannot run.
pub fn test(args: &[String]) -> anyhow::Result<()> {
    if !is_root() {
        bail!(
            "the test suite drives the real kernel (eBPF programs, loop devices, FUSE, mounts) and must run as root; \
             nothing was skipped, nothing was run"
        );
    }
    let toolchain = bootstrap::ensure()?;
    let ebpf_object = ebpf(&toolchain)?;
    // health-agent/tests/deploy.rs renders the chart and the kustomization;
    // deploy_monitoring.rs also runs promtool on the chart's rules.
    let k8s = crate::k8s_tools::ensure()?;
    // xtask/tests/image.rs reads the image with skopeo and umoci.
    bootstrap::ensure_commands(&crate::image::test_tools()?)?;
    // No separate `cargo build` of the agent first: the test build unifies
    // dependency features across the workspace and its dev-dependencies, so
    // it would compile tokio, hyper, kube, tonic and aya a second time
    // (about 7 minutes on 2 cores). The agent binary comes from this very
    // build instead: cargo builds a package's binaries for its integration
    // tests (health-agent/tests/), and it builds everything before running
    // anything.
    say("building and running the test suite (release profile)");
    let mut cargo = cargo();
    if let Some(assets) = k8s_assets() {
        say(format!(
            "kube-apiserver for the RBAC tests: {ASSETS_ENV}={}",
            assets.display()
        ));
        cargo.env(ASSETS_ENV, assets);
    }
    run(cargo
        .current_dir(workspace_root())
        .args(["test", "--release", "--workspace", "--no-fail-fast"])
        .env("HEALTH_EBPF_OBJECT", &ebpf_object)
        .env(
            "HEALTH_AGENT_BIN",
            target_dir().join("release/health-agent"),
        )
        .env("HELM_BIN", &k8s.helm)
        .env("KUBECTL_BIN", &k8s.kubectl)
        .env("PROMTOOL_BIN", &k8s.promtool)
        .arg("--")
        .args(args))
}

/// Where health_tests::envtest finds kube-apiserver (and optionally etcd).
const ASSETS_ENV: &str = "HEALTH_K8S_ASSETS";

/// The user's `HEALTH_K8S_ASSETS` wins (the test reads it itself); else the
/// project's shared binaries beside the checkout (`../shared/k8s/bin`), or
/// beside a directory above it (a checkout nested deeper, as CI may make),
/// when there. With neither, the envtest tests fail under CI=true and say so
/// loudly elsewhere.
fn k8s_assets() -> Option<PathBuf> {
    if std::env::var_os(ASSETS_ENV).is_some() {
        return None;
    }
    let root = workspace_root();
    root.ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/k8s/bin"))
        .find(|bin| bin.join("kube-apiserver").is_file())
        .and_then(|bin| bin.canonicalize().ok())
}
