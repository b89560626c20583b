//! Helpers shared by the manifest tests (deploy.rs for the node agent,
//! deploy_controller.rs for the controller, deploy_monitoring.rs for the
//! dashboard and alerts): where the manifests are, strict typed parsing, and
//! running helm, kubectl and promtool.
//!
//! Each test binary uses its own subset, hence the allowance below.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("health-agent sits in the workspace")
        .to_path_buf()
}

pub fn deploy_dir() -> PathBuf {
    repo_root().join("deploy")
}

pub fn chart_dir() -> PathBuf {
    deploy_dir().join("helm/volume-health")
}

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Deserializes `json` into `T` and checks that nothing was lost on the way.
pub fn typed<T: DeserializeOwned + Serialize>(json: &Value, origin: &str) -> T {
    let object: T = serde_json::from_value(json.clone())
        .unwrap_or_else(|e| panic!("{origin}: not a valid {}: {e}", json["kind"]));
    let again = serde_json::to_value(&object).expect("serializing a typed object");
    assert_eq!(
        &again, json,
        "{origin}: {} {} has fields its type does not know (misspelt?)",
        json["kind"], json["metadata"]["name"]
    );
    object
}

pub fn json<T: Serialize>(v: &T) -> Value {
    serde_json::to_value(v).expect("serializing")
}

/// `env` if set, else the copy `cargo xtask tools` put in the tools cache,
/// else `name` on PATH. Fails (never skips) when there is none.
pub fn tool(env: &str, name: &str) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        return PathBuf::from(p);
    }
    if let Some(p) = cached_tool(name) {
        return p;
    }
    if let Some(p) = on_path(name) {
        return p;
    }
    panic!(
        "{name} not found (looked at ${env}, the tools cache, PATH): `cargo xtask tools` \
         installs it (and `cargo xtask test` does so by itself)"
    )
}

fn cached_tool(name: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    let tools = cache.join("volume-health/tools");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(tools)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        // helm and kubectl share one folder; other tools (promtool) have
        // their own, named after them.
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

pub fn run_tool(program: &Path, args: &[&str], home: &Path) -> String {
    try_run_tool(program, args, home)
        .unwrap_or_else(|e| panic!("{} {args:?} failed: {e}", program.display()))
}

/// [`run_tool`] for runs that may fail: `Err` with the tool's output.
pub fn try_run_tool(program: &Path, args: &[&str], home: &Path) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        // helm keeps config and caches there; nothing of the user's is read.
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .env("KUBECONFIG", home.join("kubeconfig"))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
    if !out.status.success() {
        return Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8(out.stdout).expect("UTF-8 output"))
}

/// Every document of a multi-document YAML text as JSON (empty documents skipped).
pub fn yaml_documents(text: &str, origin: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{origin}: not YAML: {e}")))
        .filter(|json| !json.is_null())
        .collect()
}
