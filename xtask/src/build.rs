//! Building the kernel object and the agent, and running tests against them.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};

use crate::bootstrap::{self, DEBIAN_CARGO, DEBIAN_RUSTC};
use crate::util::{cargo, is_root, run, run_foreground, say, workspace_root};

pub struct Built {
    pub ebpf_object: PathBuf,
    pub agent: PathBuf,
}

/// Bootstrap, kernel object, release agent.
///
/// Only the agent's own crate (`health-agent`, the command line) embeds
/// the kernel object; everything compiles in the background meanwhile,
/// while apt installs the toolchain and the object is built, and the last
/// build only embeds the object and links (docs/benchmarks.md, "First run").
pub fn all() -> anyhow::Result<Built> {
    // The whole package, with no object yet (/dev/null: nothing to embed):
    // the same features unify as in the build below, so it reuses all of it.
    let libraries = Background::cargo(
        "the agent's libraries",
        &["build", "--release", "--package", "health-agent"],
        &[("HEALTH_EBPF_OBJECT", "/dev/null")],
    )?;
    let ebpf_object = bootstrap::ensure().and_then(|toolchain| ebpf(&toolchain));
    libraries.finish()?;
    let ebpf_object = ebpf_object?;
    say("building health-agent (release)");
    let agent = release_agent(&ebpf_object)?;
    say(format!(
        "built {} (kernel programs embedded)",
        agent.display()
    ));
    Ok(Built { ebpf_object, agent })
}

/// Builds the release agent with `ebpf_object` embedded.
pub fn release_agent(ebpf_object: &Path) -> anyhow::Result<PathBuf> {
    run(cargo()
        .current_dir(workspace_root())
        .args(["build", "--release", "--package", "health-agent"])
        .env("HEALTH_EBPF_OBJECT", ebpf_object))?;
    Ok(target_dir().join("release/health-agent"))
}

/// Builds the release controller (no kernel object: it has none).
pub fn release_controller() -> anyhow::Result<PathBuf> {
    run(cargo().current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "health-controller",
    ]))?;
    Ok(target_dir().join("release/health-controller"))
}

/// Builds the test harness's faultdisk server (release), for the bench and
/// the local cluster's storage.
pub fn release_faultdisk() -> anyhow::Result<PathBuf> {
    say("building the faultdisk server (release)");
    run(cargo().current_dir(workspace_root()).args([
        "build",
        "--release",
        "--package",
        "health-tests",
        "--bin",
        "faultdisk",
    ]))?;
    let bin = target_dir().join("release/faultdisk");
    if !bin.is_file() {
        bail!("the build succeeded but {} is missing", bin.display());
    }
    Ok(bin)
}

/// A cargo build running beside other work, its output in a log file under
/// the target directory (shown when it fails); killed when dropped unfinished.
struct Background {
    what: &'static str,
    log: PathBuf,
    child: Option<Child>,
}

impl Background {
    fn cargo(
        what: &'static str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Background> {
        let dir = target_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = dir.join("xtask-background-build.log");
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cargo()
            .current_dir(workspace_root())
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .context("starting cargo")?;
        say(format!(
            "compiling {what} in the background (log: {})",
            log.display()
        ));
        Ok(Background {
            what,
            log,
            child: Some(child),
        })
    }

    fn finish(mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let status = child.wait().context("waiting for cargo")?;
        if !status.success() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            eprintln!("{log}");
            bail!(
                "compiling {} failed with {status} (log above and in {})",
                self.what,
                self.log.display()
            );
        }
        Ok(())
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
}

/// Where the kernel object is built: a target directory of its own, so that
/// this build (another compiler) neither waits for the lock of the agent's
/// build running beside it nor shares its host artifacts.
pub fn ebpf_target_dir() -> PathBuf {
    target_dir().join("ebpf")
}

/// The kernel object `cargo xtask build` writes.
pub fn ebpf_object() -> PathBuf {
    ebpf_target_dir().join("bpfel-unknown-none/release/health-ebpf")
}

/// Builds `health-ebpf` for bpfel-unknown-none with Debian's compiler.
pub fn ebpf(toolchain: &bootstrap::Toolchain) -> anyhow::Result<PathBuf> {
    let root = workspace_root();
    let target_dir = ebpf_target_dir();
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
    let object = ebpf_object();
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
    let status = run_foreground(&mut cmd)?;
    say_what_is_pinned(&built.agent, args);
    if !status.success() {
        bail!("{} exited with {status}", built.agent.display());
    }
    Ok(())
}

/// The agent pins its programs by default: they go on counting after it
/// stops (for the next start), which a developer should know, and how to
/// take them away.
fn say_what_is_pinned(agent: &Path, args: &[String]) {
    if args.iter().any(|a| a == "--no-pin") {
        return;
    }
    let dir = args
        .iter()
        .position(|a| a == "--pin-dir")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HEALTH_PIN_DIR").map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(DEFAULT_PIN_DIR));
    let layouts = std::fs::read_dir(&dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().is_dir())
                .count()
        })
        .unwrap_or(0);
    if layouts > 0 {
        say(format!(
            "the agent left its kernel programs pinned at {}: they go on counting errors for its next start \
             (`cargo xtask test` is not disturbed by them). Remove them with: {} uninstall --pin-dir {}",
            dir.display(),
            agent.display(),
            dir.display()
        ));
    }
}

/// Where the agent pins by default (`health_kernel::probes::pins::DEFAULT_PIN_ROOT`,
/// checked below).
const DEFAULT_PIN_DIR: &str = "/sys/fs/bpf/volume-health";

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
    // tests/tests/deploy.rs renders the chart and the kustomization;
    // deploy_monitoring.rs also runs promtool on the chart's rules.
    let k8s = crate::k8s_tools::ensure()?;
    // tests/tests/image.rs reads the image with skopeo and umoci.
    bootstrap::ensure_commands(crate::image::TEST_TOOLS)?;
    // No separate `cargo build` of the agent first: the test build unifies
    // dependency features across the workspace and its dev-dependencies, so
    // it would compile tokio, hyper, kube, tonic and aya a second time
    // (about 7 minutes on 2 cores). The agent binary comes from this very
    // build instead: cargo builds a package's binaries for its integration
    // tests (health-agent/tests/, health-controller/tests/), and it builds
    // everything before running anything.
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
        .env(
            "HEALTH_CONTROLLER_BIN",
            target_dir().join("release/health-controller"),
        )
        // tests/image.rs runs `xtask image`: this very binary.
        .env("HEALTH_XTASK_BIN", std::env::current_exe()?)
        .env("HELM_BIN", &k8s.helm)
        .env("KUBECTL_BIN", &k8s.kubectl)
        .env("PROMTOOL_BIN", &k8s.promtool)
        .arg("--")
        .args(args))
}

/// Where health_tests::envtest finds kube-apiserver (and optionally etcd).
pub const ASSETS_ENV: &str = "HEALTH_K8S_ASSETS";

/// The user's `HEALTH_K8S_ASSETS` wins (the test reads it itself); else the
/// project's shared binaries beside the checkout (`../shared/k8s/bin`), or
/// beside a directory above it (a checkout nested deeper, as CI may make),
/// when there. With neither, the envtest tests fail under CI=true and say so
/// loudly elsewhere.
pub fn k8s_assets() -> Option<PathBuf> {
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_default_pin_dir_is_the_agents() {
        assert_eq!(
            super::DEFAULT_PIN_DIR,
            health_kernel::probes::pins::DEFAULT_PIN_ROOT
        );
    }
}
