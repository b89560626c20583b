//! The project's manifests (deploy/) as documents, and applying them to a real
//! API server ([`crate::envtest`]). Shared by the controller scenarios and
//! tests/apiserver_{rbac,deploy}.rs.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;
use serde_json::Value;

use crate::envtest::apply_manifest;

/// The workspace: deploy/ is `repo_root().join("deploy")`.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

/// Every document of a multi-document YAML text as JSON, empty ones skipped.
pub fn documents(text: &str, origin: &str) -> Result<Vec<Value>> {
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(text) {
        let value = Value::deserialize(doc).with_context(|| format!("{origin}: not YAML"))?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The documents of every `*.yaml` in `dir` but its kustomization, in name order.
pub fn manifests(dir: &Path) -> Result<Vec<Value>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<std::io::Result<_>>()?;
    files.retain(|p| {
        p.extension().is_some_and(|e| e == "yaml")
            && p.file_name().is_some_and(|n| n != "kustomization.yaml")
    });
    files.sort();
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("reading {}", file.display()))?;
        docs.extend(documents(&text, &file.display().to_string())?);
    }
    Ok(docs)
}

/// `Kind namespace/name` of a document, for messages.
pub fn describe(doc: &Value) -> String {
    format!(
        "{} {}/{}",
        doc["kind"].as_str().unwrap_or("?"),
        doc["metadata"]["namespace"].as_str().unwrap_or(""),
        doc["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Server-side apply of every document, namespaces first as `kubectl apply -k`
/// orders them; what the server refused, by [`describe`].
pub async fn apply_all(client: &kube::Client, docs: &[Value]) -> Vec<(String, kube::Error)> {
    let mut ordered: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Namespace").collect();
    ordered.extend(docs.iter().filter(|d| d["kind"] != "Namespace"));
    let mut refused = Vec::new();
    for doc in ordered {
        if let Err(e) = apply_manifest(client, doc).await {
            refused.push((describe(doc), e));
        }
    }
    refused
}
