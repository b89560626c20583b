//! The tests plain `cargo test` runs (the default members', every crate's
//! own) run as a user without root: none of them may need it
//! (docs/development.md, "Set up and run"). CI runs them this way.
//!
//! They run from the release build `cargo xtask test` makes, not from a
//! build of the user's own: that build (the debug profile in a target
//! directory of the user's) was 10-11 minutes of both cores of a fresh CI
//! machine, for the same tests (docs/benchmarks.md, "CI"). What the two
//! differ in: debug assertions (off in release) and the doc tests, which
//! `cargo xtask test` runs.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};
use serde_json::Value;

use crate::util::{cargo, is_root, output, say, workspace_root};

/// One test binary of a default member.
#[derive(Debug, PartialEq, Eq)]
pub struct TestBinary {
    pub package: String,
    /// The package's directory: where `cargo test` runs its binaries.
    pub dir: PathBuf,
    pub executable: PathBuf,
}

/// Runs every test binary of the default members as `user`, `args` after
/// each (a filter, `--nocapture`); fails naming those that failed.
pub fn run(user: &str, args: &[String]) -> anyhow::Result<()> {
    if !is_root() {
        bail!("running the tests as {user} switches to that user, which needs root");
    }
    let account = nix::unistd::User::from_name(user)
        .with_context(|| format!("looking up the user {user}"))?
        .with_context(|| format!("there is no user {user}"))?;
    if account.uid.is_root() {
        bail!("{user} is root: the point is to run the tests without it");
    }
    let binaries = default_members_tests()?;
    if binaries.is_empty() {
        bail!("the build listed no test binary of the default members");
    }
    let mut failed = Vec::new();
    for binary in &binaries {
        say(format!(
            "running {} as {user} ({})",
            binary.executable.display(),
            binary.package
        ));
        let status = Command::new("runuser")
            .current_dir(&binary.dir)
            .args(["-u", user, "--", "env", "-i"])
            .arg(format!("HOME={}", account.dir.display()))
            .arg("PATH=/usr/bin:/bin")
            // What cargo sets for a test it runs (some read it).
            .arg(format!("CARGO_MANIFEST_DIR={}", binary.dir.display()))
            .arg(format!("CARGO_PKG_NAME={}", binary.package))
            .arg(&binary.executable)
            .args(args)
            .status()
            .context("running runuser")?;
        if !status.success() {
            failed.push(format!("{} ({status})", binary.executable.display()));
        }
    }
    match failed.as_slice() {
        [] => {
            say(format!(
                "{} test binaries of the default members passed as {user}",
                binaries.len()
            ));
            Ok(())
        }
        _ => bail!(
            "{} of {} test binaries failed as {user}: {}",
            failed.len(),
            binaries.len(),
            failed.join(", ")
        ),
    }
}

/// A default member: its id in cargo's messages, its name and directory.
#[derive(Debug)]
struct Member {
    id: String,
    name: String,
    dir: PathBuf,
}

/// The test binaries of `cargo test --release --workspace` that belong to
/// a default member, from cargo's own account of the build (up to date
/// after `cargo xtask test`: nothing compiles).
fn default_members_tests() -> anyhow::Result<Vec<TestBinary>> {
    let metadata = output(cargo().current_dir(workspace_root()).args([
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
    ]))?;
    let members =
        default_members(&serde_json::from_str(&metadata).context("reading cargo metadata")?)?;
    let messages = output(cargo().current_dir(workspace_root()).args([
        "test",
        "--release",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]))?;
    messages
        .lines()
        .map(|line| serde_json::from_str::<Value>(line).context("reading cargo's messages"))
        .filter_map(|message| match message {
            Ok(message) => test_binary(&message, &members).map(Ok),
            Err(e) => Some(Err(e)),
        })
        .collect()
}

/// The workspace's default members, from `cargo metadata`.
fn default_members(metadata: &Value) -> anyhow::Result<Vec<Member>> {
    let ids: Vec<&str> = metadata["workspace_default_members"]
        .as_array()
        .context("cargo metadata has no workspace_default_members (cargo 1.71 or newer)")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    ids.iter()
        .map(|id| {
            let package = packages.iter().find(|p| p["id"] == *id).with_context(|| {
                format!("cargo metadata lists the member {id} among no packages")
            })?;
            let manifest = PathBuf::from(
                package["manifest_path"]
                    .as_str()
                    .context("a manifest path")?,
            );
            Ok(Member {
                id: id.to_string(),
                name: package["name"]
                    .as_str()
                    .context("a package name")?
                    .to_string(),
                dir: manifest
                    .parent()
                    .context("the manifest's directory")?
                    .to_path_buf(),
            })
        })
        .collect()
}

/// The test binary `message` (a `compiler-artifact`) tells of, if it is
/// one of a package in `members`.
fn test_binary(message: &Value, members: &[Member]) -> Option<TestBinary> {
    if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
        return None;
    }
    let member = members.iter().find(|m| message["package_id"] == *m.id)?;
    Some(TestBinary {
        package: member.name.clone(),
        dir: member.dir.clone(),
        executable: PathBuf::from(message["executable"].as_str()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const CORE: &str = "path+file:///w/health-core#0.1.0";
    const TESTS: &str = "path+file:///w/tests#health-tests@0.1.0";

    fn members() -> Vec<Member> {
        let metadata = json!({
            "packages": [
                {"id": CORE, "name": "health-core", "manifest_path": "/w/health-core/Cargo.toml"},
                {"id": TESTS, "name": "health-tests", "manifest_path": "/w/tests/Cargo.toml"},
            ],
            "workspace_default_members": [CORE],
        });
        default_members(&metadata).unwrap()
    }

    fn artifact(package_id: &str, test: bool, executable: Option<&str>) -> Value {
        json!({
            "reason": "compiler-artifact",
            "package_id": package_id,
            "profile": {"test": test},
            "executable": executable,
        })
    }

    #[test]
    fn only_test_binaries_of_default_members_are_run() {
        let members = members();
        assert_eq!(members.len(), 1);
        assert_eq!(
            test_binary(
                &artifact(CORE, true, Some("/w/target/release/deps/health_core-1")),
                &members
            ),
            Some(TestBinary {
                package: "health-core".into(),
                dir: "/w/health-core".into(),
                executable: "/w/target/release/deps/health_core-1".into(),
            })
        );
        // The library itself, a program, a member's tests that plain
        // `cargo test` leaves out, a message that is no artifact.
        assert_eq!(test_binary(&artifact(CORE, false, None), &members), None);
        assert_eq!(
            test_binary(
                &artifact(CORE, false, Some("/w/target/release/agent")),
                &members
            ),
            None
        );
        assert_eq!(
            test_binary(
                &artifact(TESTS, true, Some("/w/target/release/deps/kernel-1")),
                &members
            ),
            None
        );
        assert_eq!(
            test_binary(&json!({"reason": "build-finished"}), &members),
            None
        );
    }

    #[test]
    fn a_member_missing_from_the_packages_is_an_error() {
        let metadata = json!({"packages": [], "workspace_default_members": [CORE]});
        let e = default_members(&metadata).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("cargo metadata lists the member {CORE} among no packages")
        );
    }
}
