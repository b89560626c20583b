//! The chart installed as Helm users install charts, against a real
//! kube-apiserver: into the release's namespace (`helm install -n X
//! --create-namespace`), and removed by `helm uninstall` with exactly what
//! docs/install.md ("Uninstall") says stays behind.
//!
//! Needs the real kube-apiserver and etcd (`HEALTH_K8S_ASSETS`) and helm
//! and kubectl (`cargo xtask tools`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use health_tests::manifests::{documents, repo_root};
use health_tests::{k8s_tools, require_api_server, RealApiServer};
use serde_json::Value;

const NAMESPACE: &str = "team-storage";

struct Helm<'a> {
    server: &'a RealApiServer,
    home: tempfile::TempDir,
}

impl Helm<'_> {
    fn kubeconfig(&self) -> Result<&str> {
        self.server
            .kubeconfig(self.server.admin())
            .to_str()
            .context("UTF-8 kubeconfig path")
    }

    fn helm(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["--kubeconfig", self.kubeconfig()?];
        all.extend_from_slice(args);
        k8s_tools::run(
            &k8s_tools::find("HELM_BIN", "helm")?,
            &all,
            self.home.path(),
        )
    }

    fn kubectl(&self, args: &[&str]) -> Result<String> {
        let mut all = vec!["--kubeconfig", self.kubeconfig()?];
        all.extend_from_slice(args);
        k8s_tools::run(
            &k8s_tools::find("KUBECTL_BIN", "kubectl")?,
            &all,
            self.home.path(),
        )
    }

    /// `kubectl get -f file` of the objects that exist: `kind/name` each.
    fn existing(&self, file: &Path) -> Result<Vec<String>> {
        let path = file.to_str().context("UTF-8")?;
        let out = self.kubectl(&["get", "-f", path, "--ignore-not-found", "-o", "name"])?;
        let mut names: Vec<String> = out.lines().map(str::to_string).collect();
        names.sort();
        Ok(names)
    }
}

fn chart() -> PathBuf {
    repo_root().join("deploy/helm/volume-health")
}

#[test]
fn the_chart_installs_into_the_release_namespace_and_uninstall_leaves_what_the_docs_say(
) -> Result<()> {
    let Some(server) = require_api_server() else {
        return Ok(());
    };
    let helm = Helm {
        server: &server,
        home: tempfile::tempdir()?,
    };
    let chart = chart();
    let chart = chart.to_str().context("UTF-8")?;
    let out = helm.helm(&[
        "install",
        "volume-health",
        chart,
        "--namespace",
        NAMESPACE,
        "--create-namespace",
        "--output",
        "json",
    ])?;
    let release: Value = serde_json::from_str(&out).with_context(|| out.clone())?;
    let notes = release["info"]["notes"].as_str().context("NOTES")?;
    assert_eq!(
        notes.lines().next(),
        Some("volume-health node agent: DaemonSet volume-health-agent in namespace team-storage.")
    );
    let checks: Vec<&str> = notes
        .lines()
        .filter(|l| l.trim_start().starts_with("kubectl "))
        .collect();
    assert_eq!(
        checks,
        [
            "  kubectl -n team-storage rollout status daemonset/volume-health-agent",
            "  kubectl -n team-storage get pods -l app.kubernetes.io/name=volume-health -o wide",
            "  kubectl -n team-storage exec daemonset/volume-health-agent -- health-agent volumes",
        ]
    );

    // Every namespaced object in the release's namespace, the agent's
    // identity named there wherever it is bound.
    let manifest = helm.helm(&["get", "manifest", "volume-health", "-n", NAMESPACE])?;
    let objects = documents(&manifest, "helm get manifest")?;
    let kind_of = |o: &Value| o["kind"].as_str().unwrap_or_default().to_string();
    let namespaced: Vec<(String, Option<&str>)> = objects
        .iter()
        .filter(|o| o["metadata"].get("namespace").is_some())
        .map(|o| (kind_of(o), o["metadata"]["namespace"].as_str()))
        .collect();
    assert_eq!(
        namespaced,
        [
            ("ServiceAccount".into(), Some(NAMESPACE)),
            ("Service".into(), Some(NAMESPACE)),
            ("DaemonSet".into(), Some(NAMESPACE)),
        ]
    );
    assert!(
        !objects.iter().any(|o| o["kind"] == "Namespace"),
        "the chart made a Namespace"
    );
    let binding = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRoleBinding")
        .context("no ClusterRoleBinding")?;
    assert_eq!(binding["subjects"][0]["namespace"], NAMESPACE);
    let schema = objects
        .iter()
        .find(|o| o["kind"] == "FlowSchema")
        .context("no FlowSchema")?;
    assert_eq!(
        schema["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["namespace"],
        NAMESPACE
    );
    let file = helm.home.path().join("manifest.yaml");
    std::fs::write(&file, &manifest)?;
    let installed = helm.existing(&file)?;
    assert_eq!(installed.len(), objects.len(), "{installed:?}");

    // What the agents write: a claim's VolumeHealth object and its label.
    let written = helm.home.path().join("written.yaml");
    std::fs::write(
        &written,
        format!(
            "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: data\n  namespace: {NAMESPACE}\n  labels:\n    volume-health.io/health: Inaccessible\nspec:\n  accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: 1Gi\n---\napiVersion: volume-health.io/v1alpha1\nkind: VolumeHealth\nmetadata:\n  name: data\n  namespace: {NAMESPACE}\nspec:\n  persistentVolumeClaimName: data\n"
        ),
    )?;
    helm.kubectl(&["create", "-f", written.to_str().context("UTF-8")?])?;

    helm.helm(&[
        "uninstall",
        "volume-health",
        "-n",
        NAMESPACE,
        "--wait",
        "--timeout",
        "60s",
    ])?;
    assert_eq!(helm.existing(&file)?, Vec::<String>::new());
    // What stays (docs/install.md, "Uninstall"): the CRD (Helm never
    // deletes crds/), the namespace --create-namespace made, and what the
    // agents wrote.
    let crd = "customresourcedefinition.apiextensions.k8s.io/volumehealths.volume-health.io";
    assert_eq!(helm.kubectl(&["get", crd, "-o", "name"])?.trim(), crd);
    assert_eq!(
        helm.kubectl(&["get", "namespace", NAMESPACE, "-o", "name"])?
            .trim(),
        format!("namespace/{NAMESPACE}")
    );
    assert_eq!(
        helm.existing(&written)?,
        [
            "persistentvolumeclaim/data",
            "volumehealth.volume-health.io/data"
        ]
    );
    // And how the docs say to remove it: the label from every claim, then
    // the CRD with its objects.
    helm.kubectl(&["label", "pvc", "--all", "-A", "volume-health.io/health-"])?;
    helm.kubectl(&["delete", "crd", "volumehealths.volume-health.io", "--wait"])?;
    assert_eq!(
        helm.kubectl(&["get", crd, "--ignore-not-found", "-o", "name"])?,
        "",
        "the CRD, and with it every VolumeHealth object, gone"
    );
    let labels = helm.kubectl(&[
        "get",
        "pvc",
        "data",
        "-n",
        NAMESPACE,
        "-o",
        "jsonpath={.metadata.labels}",
    ])?;
    assert_eq!(labels, "");
    Ok(())
}
