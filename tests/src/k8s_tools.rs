//! helm and kubectl for the manifest tests (tests/tests/server/deploy*.rs
//! render the chart and the kustomizations; tests/tests/server/apiserver_deploy.rs
//! dry-runs them against a real kube-apiserver): found, never skipped, and
//! run so that nothing of the user's configuration is read.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

/// `env` if set, else the copy `cargo xtask tools` put in the tools cache,
/// else `name` on PATH. An error (never a skip) when there is none.
pub fn find(env: &str, name: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Ok(PathBuf::from(p));
    }
    if let Some(p) = cached(name).or_else(|| on_path(name)) {
        return Ok(p);
    }
    bail!(
        "{name} not found (looked at ${env}, the tools cache, PATH): `cargo xtask tools` \
         installs it (and `cargo xtask test` does so by itself)"
    )
}

/// The newest directory of the tools cache that has `name`: helm and
/// kubectl share `k8s-tools-*`, other tools (promtool) have `<name>-*`.
fn cached(name: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(cache.join("volume-health/tools"))
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("k8s-tools-") || n.starts_with(&format!("{name}-"))
            })
        })
        .collect();
    dirs.sort();
    dirs.into_iter()
        .rev()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs `program` with helm's configuration, caches and the default
/// kubeconfig under `home`, whatever its exit status.
pub fn output(program: &Path, args: &[&str], home: &Path) -> Result<Output> {
    Command::new(program)
        .args(args)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", home.join("kubeconfig"))
        .output()
        .with_context(|| format!("running {}", program.display()))
}

/// [`output`] that must succeed: its stdout.
pub fn run(program: &Path, args: &[&str], home: &Path) -> Result<String> {
    let out = output(program, args, home)?;
    if !out.status.success() {
        bail!(
            "{} {args:?} failed ({}): {}{}",
            program.display(),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8(out.stdout).context("output is not UTF-8")
}

/// Writes `dir/kustomization.yaml` with `resources` and `components` (other
/// kustomizations, by absolute path), as a user's own kustomization names
/// deploy/ and its components. kustomize takes only relative paths there, so
/// each is written as the way up from `dir` to `/` and down again.
pub fn write_kustomization(dir: &Path, resources: &[&Path], components: &[&Path]) -> Result<()> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let up = "../".repeat(dir.components().count().saturating_sub(1));
    let relative = |p: &&Path| -> Result<String> {
        let p = p
            .canonicalize()
            .with_context(|| format!("resolving {}", p.display()))?;
        let below_root = p.strip_prefix("/").context("an absolute path")?;
        Ok(format!("  - {up}{}\n", below_root.display()))
    };
    let mut text = String::from(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n",
    );
    for r in resources {
        text += &relative(r)?;
    }
    if !components.is_empty() {
        text += "components:\n";
        for c in components {
            text += &relative(c)?;
        }
    }
    let file = dir.join("kustomization.yaml");
    std::fs::write(&file, text).with_context(|| format!("writing {}", file.display()))
}
