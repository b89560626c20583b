//! The suites as steps: the test binaries built as `cargo xtask test`
//! builds them, listed, and a suite that is a module of the host's or the
//! guest's binary run by its tests' exact names.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use serde_json::Value;

use super::script::{Env, Step};
use super::selection::Suite;
use crate::util::{cargo, say, workspace_root};

/// The variables that name the programs the tests start, and the
/// workspace's release binaries they name: the agent, and the fault disk
/// server (which the tests otherwise look for beside their own binary).
pub(super) const PROGRAM_VARS: &[(&str, &str)] = &[
    ("HEALTH_AGENT_BIN", "health-agent"),
    ("FAULTDISK_BIN", "faultdisk"),
];

/// The programs the suites run: each step's, and those of
/// [`PROGRAM_VARS`].
pub(super) fn suite_programs(steps: &[Step], env: &Env) -> Vec<PathBuf> {
    let named = env
        .iter()
        .filter(|(key, _)| PROGRAM_VARS.iter().any(|(k, _)| k == key))
        .map(|(_, value)| value.as_str());
    steps
        .iter()
        .filter_map(|step| step.argv.first().map(String::as_str))
        .chain(named)
        .map(PathBuf::from)
        .collect()
}

/// Builds the agent with its kernel object and the test binaries, as
/// `cargo xtask test` does, and returns the selected suites as steps.
pub(super) fn default_tests(
    filter: Option<&str>,
    suites: &[Suite],
) -> anyhow::Result<(Vec<Step>, Env)> {
    // No separate `cargo build` of the agent: the test build below links
    // it (for health-agent's own tests) with the feature set `cargo xtask
    // test` uses, so after that command nothing is compiled again.
    // The tools the suites drive run in the guest from the shared root.
    crate::bootstrap::ensure_test_packages()?;
    // The agent embeds health-ebpf/object/ (rebuilt first when the kernel
    // sources changed).
    crate::ebpf::ensure()?;
    let release = crate::util::target_dir().join("release");
    let env: Env = PROGRAM_VARS
        .iter()
        .map(|(key, name)| (key.to_string(), release.join(name).display().to_string()))
        .collect();
    let binaries = test_binaries(&env)?;
    // A suite that is no binary is a module of the host's or the guest's
    // binary, each listed once. The guest's has `test = false` (drivers
    // the host lacks), which `cargo test` leaves out: built by name.
    let is_binary = |suite: &Suite| binaries.iter().any(|t| t.name == suite.name);
    let mut modules: Vec<(TestBinary, Vec<String>)> = Vec::new();
    if !suites.iter().all(is_binary) {
        for name in SUITE_BINARIES {
            let binary = match binaries.iter().find(|t| t.name == name) {
                Some(t) => t.clone(),
                None => named_test_binaries(&env, &[name])?
                    .into_iter()
                    .find(|t| t.name == name)
                    .with_context(|| format!("cargo test --no-run did not report {name}"))?,
            };
            let tests = list_tests(&binary)?;
            modules.push((binary, tests));
        }
    }
    let mut steps = Vec::new();
    for suite in suites {
        let name = &suite.name;
        if let Some(test) = binaries.iter().find(|t| &t.name == name) {
            let mut argv = vec![test.exe.display().to_string()];
            argv.extend(filter.map(str::to_string));
            steps.push(step(suite, test, argv));
            continue;
        }
        let found = modules
            .iter()
            .find_map(|(binary, all)| suite_tests(all, name, filter).map(|names| (binary, names)));
        let Some((binary, names)) = found else {
            let known: Vec<&str> = binaries.iter().map(|t| t.name.as_str()).collect();
            let suites: Vec<&str> = modules
                .iter()
                .flat_map(|(_, all)| suite_names(all))
                .collect();
            bail!(
                "no suite or test binary named {name:?}; the suites: {}; the binaries: {}",
                suites.join(", "),
                known.join(", ")
            );
        };
        if names.is_empty() {
            say(format!("{name}: no test matches the filter; not run"));
            continue;
        }
        let mut argv = vec![binary.exe.display().to_string(), "--exact".to_string()];
        argv.extend(names);
        steps.push(step(suite, binary, argv));
    }
    Ok((steps, env))
}

/// The binaries whose modules are suites: the host's real-kernel tests
/// (tests/tests/host/: kernel_errors, volumes, ...) and those only a guest
/// runs (tests/tests/guest/: device_faults, storage_stacks, ...).
const SUITE_BINARIES: [&str; 2] = ["host", "guest"];

fn step(suite: &Suite, test: &TestBinary, argv: Vec<String>) -> Step {
    Step {
        label: suite.name.clone(),
        // cargo runs an integration test in its package's directory.
        cwd: test.dir.clone(),
        argv,
        only: suite.only.clone(),
    }
}

/// Every test of a binary (`module::test`), from its own `--list`.
fn list_tests(test: &TestBinary) -> anyhow::Result<Vec<String>> {
    let out = Command::new(&test.exe)
        .args(["--list", "--format", "terse"])
        .current_dir(&test.dir)
        .output()
        .with_context(|| format!("listing the tests of {}", test.exe.display()))?;
    if !out.status.success() {
        bail!("{} --list failed ({})", test.exe.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect())
}

/// The tests of suite (module) `suite` among `all` whose names contain
/// `filter`; `None` when the binary has no such module.
fn suite_tests(all: &[String], suite: &str, filter: Option<&str>) -> Option<Vec<String>> {
    let prefix = format!("{suite}::");
    let of_suite: Vec<&String> = all.iter().filter(|n| n.starts_with(&prefix)).collect();
    if of_suite.is_empty() {
        return None;
    }
    Some(
        of_suite
            .into_iter()
            .filter(|n| filter.is_none_or(|f| n.contains(f)))
            .cloned()
            .collect(),
    )
}

/// The modules tests are in, each once, in order.
fn suite_names(all: &[String]) -> Vec<&str> {
    let mut names: Vec<&str> = all
        .iter()
        .filter_map(|n| n.split_once("::"))
        .map(|(m, _)| m)
        .collect();
    names.dedup();
    names
}

/// An integration test binary and its package's directory.
#[derive(Clone, Debug, PartialEq)]
struct TestBinary {
    name: String,
    exe: PathBuf,
    dir: PathBuf,
}

/// Every integration test binary, from `cargo test --no-run` with the
/// environment of `cargo xtask test`, so the two share one build.
fn test_binaries(env: &Env) -> anyhow::Result<Vec<TestBinary>> {
    say("building the test binaries (release profile)");
    let binaries = cargo_test_no_run(env, &[])?;
    if binaries.is_empty() {
        bail!("cargo test --no-run reported no integration test binaries");
    }
    Ok(binaries)
}

/// The integration test binaries `names`, built explicitly (`cargo test
/// --test NAME --no-run`), which also builds targets marked `test = false`.
fn named_test_binaries(env: &Env, names: &[&str]) -> anyhow::Result<Vec<TestBinary>> {
    say(format!(
        "building the test binaries {} (release profile)",
        names.join(", ")
    ));
    let args: Vec<&str> = names.iter().flat_map(|n| ["--test", n]).collect();
    cargo_test_no_run(env, &args)
}

fn cargo_test_no_run(env: &Env, args: &[&str]) -> anyhow::Result<Vec<TestBinary>> {
    let out = cargo()
        .current_dir(workspace_root())
        .args(["test", "--release", "--workspace", "--no-run"])
        .args(args)
        // Diagnostics rendered on stderr as usual; artifacts as JSON on stdout.
        .arg("--message-format=json-render-diagnostics")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::inherit())
        .output()
        .context("starting cargo test --no-run")?;
    if !out.status.success() {
        bail!(
            "building the test binaries failed ({}): cargo test --no-run {}",
            out.status,
            args.join(" ")
        );
    }
    Ok(parse_test_artifacts(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_test_artifacts(json_lines: &str) -> Vec<TestBinary> {
    json_lines
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|v| v["reason"] == "compiler-artifact")
        .filter(|v| {
            v["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .filter_map(|v| {
            Some(TestBinary {
                name: v["target"]["name"].as_str()?.to_string(),
                exe: PathBuf::from(v["executable"].as_str()?),
                dir: Path::new(v["manifest_path"].as_str()?)
                    .parent()?
                    .to_path_buf(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_suite_is_its_modules_tests_that_match_the_filter() {
        let all: Vec<String> = [
            "device_faults::a_vanished_disk",
            "storage_stacks::md_member_failed",
            "storage_stacks::multipath_all_paths_offline",
            "storage_stacks_extra::md_other",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            suite_tests(&all, "storage_stacks", None),
            Some(vec![
                "storage_stacks::md_member_failed".to_string(),
                "storage_stacks::multipath_all_paths_offline".to_string()
            ])
        );
        assert_eq!(
            suite_tests(&all, "storage_stacks", Some("md_")),
            Some(vec!["storage_stacks::md_member_failed".to_string()])
        );
        assert_eq!(
            suite_tests(&all, "storage_stacks", Some("nvme")),
            Some(vec![])
        );
        assert_eq!(suite_tests(&all, "storage", None), None);
        assert_eq!(
            suite_names(&all),
            ["device_faults", "storage_stacks", "storage_stacks_extra"]
        );
    }

    #[test]
    fn integration_tests_from_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"name":"kernel_errors"},"executable":"/w/target/release/deps/kernel_errors-1"}
{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["lib"],"name":"health_tests"},"executable":"/w/target/release/deps/health_tests-2"}
{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["bin"],"name":"faultdisk"},"executable":"/w/target/release/faultdisk"}
{"reason":"build-finished","success":true}"#;
        let found = parse_test_artifacts(json);
        assert_eq!(
            found,
            vec![TestBinary {
                name: "kernel_errors".to_string(),
                exe: PathBuf::from("/w/target/release/deps/kernel_errors-1"),
                dir: PathBuf::from("/w/tests"),
            }]
        );
    }
}
