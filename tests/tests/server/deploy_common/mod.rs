//! Helpers shared by the manifest tests (deploy.rs for the node agent,
//! deploy_controller.rs for the controller, deploy_monitoring.rs for the
//! dashboard and alerts): where the manifests are, strict typed parsing, and
//! running helm, kubectl and promtool.
//!
//! Each test binary uses its own subset, hence the allowance below.
#![allow(dead_code)]

pub mod agent_objects;

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
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

/// helm or kubectl (`env`, the tools cache, PATH); fails, never skips, when
/// there is none.
pub fn tool(env: &str, name: &str) -> PathBuf {
    health_tests::k8s_tools::find(env, name).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `program args` with helm's and kubectl's configuration under `home`; its
/// stdout, or a panic with its output.
pub fn run_tool(program: &Path, args: &[&str], home: &Path) -> String {
    health_tests::k8s_tools::run(program, args, home).unwrap_or_else(|e| panic!("{e:#}"))
}

/// [`run_tool`] for runs that may fail: `Err` with the tool's output.
pub fn try_run_tool(program: &Path, args: &[&str], home: &Path) -> Result<String, String> {
    let out = health_tests::k8s_tools::output(program, args, home).map_err(|e| format!("{e:#}"))?;
    if !out.status.success() {
        return Err(format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| e.to_string())
}

/// Every document of a multi-document YAML text as JSON (empty documents skipped).
pub fn yaml_documents(text: &str, origin: &str) -> Vec<Value> {
    serde_yaml::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("{origin}: not YAML: {e}")))
        .filter(|json| !json.is_null())
        .collect()
}
