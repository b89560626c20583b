//! Building the agent (with the kernel object embedded) and the
//! controller, and running the tests against them.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context};

use crate::bootstrap;
use crate::ebpf::{self, Committed};
use crate::util::{cargo, is_root, run, run_foreground, say, target_dir, workspace_root};

pub struct Built {
    pub agent: PathBuf,
    /// When [`Wanted::controller`].
    pub controller: Option<PathBuf>,
}

/// What a command needs besides the release agent.
#[derive(Default)]
pub struct Wanted<'a> {
    /// The controller too, in the same cargo run as the agent: built on its
    /// own, the libraries it shares with the agent unify other features
    /// (health-common without `user`) and compile a second time, and the
    /// agent's build after it again.
    pub controller: bool,
    /// Debian packages the command needs, installed while cargo compiles.
    pub packages: &'a [&'a str],
}

/// The release agent, as `cargo xtask run` needs it.
pub fn all() -> anyhow::Result<Built> {
    binaries(&Wanted::default())
}

/// The release agent with the kernel object embedded, and what `wanted`
/// adds.
///
/// The object is the committed one when it fits the kernel sources (no
/// toolchain needed, xtask::ebpf). When it does not, or when packages are
/// missing, the Rust build runs in the background while apt installs and
/// the object is built; only the agent's own crate (`health-agent`, the
/// command line) embeds the object, so the last build just recompiles that
/// crate and links (docs/benchmarks.md, "First run"). Every command builds
/// with the same cargo arguments and environment, so none undoes another's
/// build.
pub fn binaries(wanted: &Wanted<'_>) -> anyhow::Result<Built> {
    let committed = ebpf::check()?;
    let missing = bootstrap::missing_packages(wanted.packages);
    let mut args = vec!["build", "--release", "--package", "health-agent"];
    if wanted.controller {
        args.extend(["--package", "health-controller"]);
    }
    if std::env::var_os("HEALTH_EBPF_OBJECT").is_some() {
        say("HEALTH_EBPF_OBJECT is set: the agent embeds that object, not health-ebpf/object/'s");
    }
    let stale = matches!(committed, Committed::Stale(_));
    if stale || !missing.is_empty() {
        let background = Background::cargo("the agent's libraries", &args)?;
        let prepared = bootstrap::ensure_packages(&missing).and_then(|()| match committed {
            Committed::Fresh => Ok(()),
            Committed::Stale(reasons) => ebpf::rebuild(&reasons).map(drop),
        });
        background.finish()?;
        prepared?;
    }
    say(if wanted.controller {
        "building health-agent and health-controller (release)"
    } else {
        "building health-agent (release)"
    });
    run(cargo().current_dir(workspace_root()).args(&args))?;
    let release = target_dir().join("release");
    let agent = release.join("health-agent");
    say(format!(
        "built {} (kernel programs embedded)",
        agent.display()
    ));
    Ok(Built {
        agent,
        controller: wanted.controller.then(|| release.join("health-controller")),
    })
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

/// A program of the test harness (release) from the workspace build: the
/// faultdisk server (the bench and the local cluster's storage) or the
/// project's CSI driver `csi-loop-driver` (the local cluster's storage).
pub fn release_test_binary(name: &str) -> anyhow::Result<PathBuf> {
    workspace(&[])?;
    let bin = target_dir().join("release").join(name);
    if !bin.is_file() {
        bail!(
            "the workspace build succeeded but {} is missing",
            bin.display()
        );
    }
    Ok(bin)
}

/// [`workspace`]'s cargo arguments: `--tests` brings the dev-dependencies,
/// and so the feature set `cargo test --release --workspace` finds built.
const WORKSPACE_BUILD: &[&str] = &[
    "build",
    "--release",
    "--workspace",
    "--lib",
    "--bins",
    "--tests",
];

/// Every library, program and test of the workspace in one release build
/// (`tests`: targets with `test = false` to add by name), with the feature
/// set of `cargo test --release --workspace`: dependencies unified with the
/// dev-dependencies. `cargo xtask test`, `cluster test`, `vm` and the lab
/// build this and nothing else, so none of them compiles what another
/// already has. Built per package instead (`cargo build -p health-lab`,
/// `-p health-tests --bin faultdisk`, ...), each selection unified its own
/// features and compiled tokio, kube, hyper and the workspace crates again:
/// about 10 minutes of a cold CI run (docs/benchmarks.md, "CI"). The
/// agent users build (`cargo xtask build`, `run`, `image`) stays its own
/// package's build.
pub fn workspace(tests: &[&str]) -> anyhow::Result<()> {
    say("building the workspace: programs and tests (release profile)");
    let mut cmd = cargo();
    cmd.current_dir(workspace_root()).args(WORKSPACE_BUILD);
    for test in tests {
        cmd.args(["--test", test]);
    }
    run(&mut cmd)
}

/// A cargo build running beside other work, its output in a log file under
/// the target directory (shown when it fails); killed when dropped unfinished.
struct Background {
    what: &'static str,
    log: PathBuf,
    child: Option<Child>,
}

impl Background {
    fn cargo(what: &'static str, args: &[&str]) -> anyhow::Result<Background> {
        let dir = target_dir();
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let log = dir.join("xtask-background-build.log");
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let child = cargo()
            .current_dir(workspace_root())
            .args(args)
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
