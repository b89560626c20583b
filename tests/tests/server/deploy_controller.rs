//! The controller's deployment contract: `deploy/controller/` and the chart's
//! `controller.*` values give `health-controller` exactly what it needs.
//!
//! - `rbac/`: every manifest parses strictly into its typed object (a field the
//!   type does not know fails); the ClusterRole grants exactly
//!   `controller::API_ACCESS`, the Role exactly `controller::LEASE_ACCESS`, and
//!   the bindings give them to the ServiceAccount.
//! - `sidecar.yaml`: a strategic-merge patch adding one container whose env, mounts,
//!   ports, probes, resources and security match the controller's CLI and the
//!   driver pod it joins; `example-hostpath/` differs only where it says.
//! - kustomize and helm (HELM_BIN / KUBECTL_BIN, the xtask tools cache, or
//!   PATH) render the same objects and the same sidecar.
//!
//! Whether a real API server accepts these objects and what the identities may
//! then do is tests/tests/server/apiserver_rbac.rs (crate health-tests).

use crate::deploy_common;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;

use deploy_common::{chart_dir, deploy_dir, json, read, run_tool, tool, typed, yaml_documents};
use health_controller::{API_ACCESS, LEASE_ACCESS};
use health_kube::ApiAccess;
use k8s_openapi::api::core::v1::{Container, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::{json, Value};

const NAME: &str = "volume-health-controller";
/// Where most CSI drivers run; the base's namespace.
const NAMESPACE: &str = "kube-system";
/// The CLI's defaults (`health-controller --help`).
const CSI_ADDRESS: &str = "/csi/csi.sock";
const METRICS_ADDR: &str = "0.0.0.0:9810";
const METRICS_PORT: i32 = 9810;
/// The volume CSI controller pods share their socket in, by convention.
const SOCKET_VOLUME: &str = "socket-dir";
const PORT_NAME: &str = "health-metrics";
const HOSTPATH_SA: &str = "csi-hostpathplugin-sa";

fn controller_dir() -> PathBuf {
    deploy_dir().join("controller")
}

// ---------------------------------------------------------------------------
// Parsing

/// The RBAC objects, typed.
#[derive(Debug, Default)]
struct Rbac {
    service_accounts: Vec<ServiceAccount>,
    cluster_roles: Vec<ClusterRole>,
    cluster_bindings: Vec<ClusterRoleBinding>,
    roles: Vec<Role>,
    bindings: Vec<RoleBinding>,
}

fn rbac_of(docs: &[Value], origin: &str) -> Rbac {
    let mut rbac = Rbac::default();
    for doc in docs {
        let kind = (doc["apiVersion"].as_str(), doc["kind"].as_str());
        match kind {
            (Some("v1"), Some("ServiceAccount")) => rbac.service_accounts.push(typed(doc, origin)),
            (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRole")) => {
                rbac.cluster_roles.push(typed(doc, origin))
            }
            (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRoleBinding")) => {
                rbac.cluster_bindings.push(typed(doc, origin))
            }
            (Some("rbac.authorization.k8s.io/v1"), Some("Role")) => {
                rbac.roles.push(typed(doc, origin))
            }
            (Some("rbac.authorization.k8s.io/v1"), Some("RoleBinding")) => {
                rbac.bindings.push(typed(doc, origin))
            }
            other => panic!("{origin}: unexpected object {other:?}"),
        }
    }
    rbac
}

#[derive(Deserialize)]
struct Kustomization {
    resources: Vec<String>,
}

fn rbac_files() -> Vec<String> {
    let dir = controller_dir().join("rbac");
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("deploy/controller/rbac exists")
        .map(|e| {
            e.expect("listing rbac/")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".yaml") && n != "kustomization.yaml")
        .collect();
    names.sort();
    names
}

/// Every document of rbac/, as JSON, in file order.
fn rbac_docs() -> Vec<Value> {
    let dir = controller_dir().join("rbac");
    rbac_files()
        .iter()
        .flat_map(|f| yaml_documents(&read(&dir.join(f)), f))
        .collect()
}

/// (kind, namespace, name) -> object, for comparing renders.
fn keyed(docs: &[Value]) -> Vec<((String, String, String), Value)> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let mut all: Vec<_> = docs
        .iter()
        .map(|d| {
            let key = (
                s(&d["kind"]),
                s(&d["metadata"]["namespace"]),
                s(&d["metadata"]["name"]),
            );
            (key, d.clone())
        })
        .collect();
    all.sort_by(|a, b| a.0.cmp(&b.0));
    all
}

/// The one container a sidecar patch adds. The patch must be a
/// strategic-merge patch of the pod template's containers with exactly that
/// container, and, if it names its target (`named`), nothing else beside.
fn sidecar_of(patch: &[Value], origin: &str, named: Option<&str>) -> Container {
    assert_eq!(patch.len(), 1, "{origin}: one document");
    let mut doc = patch[0].clone();
    let object = doc
        .as_object_mut()
        .unwrap_or_else(|| panic!("{origin}: an object"));
    let header: Value = ["apiVersion", "kind", "metadata"]
        .iter()
        .filter_map(|k| object.remove(*k).map(|v| (k.to_string(), v)))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let want_header = match named {
        Some(name) => {
            json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": name}})
        }
        None => json!({}),
    };
    assert_eq!(header, want_header, "{origin}: what the patch names");
    let containers = doc["spec"]["template"]["spec"]["containers"].clone();
    let shape = json!({"spec": {"template": {"spec": {"containers": containers}}}});
    assert_eq!(
        doc, shape,
        "{origin}: the patch touches more than the containers"
    );
    let containers = containers.as_array().cloned().unwrap_or_default();
    assert_eq!(containers.len(), 1, "{origin}: one container");
    typed(&containers[0], origin)
}

fn sidecar_file(relative: &str) -> Container {
    let path = controller_dir().join(relative);
    let named = relative
        .starts_with("example-hostpath/")
        .then_some("csi-hostpathplugin");
    sidecar_of(&yaml_documents(&read(&path), relative), relative, named)
}

// ---------------------------------------------------------------------------
// rbac/

#[test]
fn the_rbac_kustomization_lists_every_manifest_and_only_those() {
    let k: Kustomization =
        serde_yaml::from_str(&read(&controller_dir().join("rbac/kustomization.yaml"))).unwrap();
    let mut listed = k.resources;
    listed.sort();
    assert_eq!(listed, rbac_files());
}

#[test]
fn rbac_has_exactly_the_expected_objects_in_the_driver_namespace() {
    let docs = rbac_docs();
    rbac_of(&docs, "rbac/");
    let got: Vec<(String, String, String)> = keyed(&docs).into_iter().map(|(k, _)| k).collect();
    let key = |kind: &str, ns: &str| (kind.to_string(), ns.to_string(), NAME.to_string());
    assert_eq!(
        got,
        [
            key("ClusterRole", ""),
            key("ClusterRoleBinding", ""),
            key("Role", NAMESPACE),
            key("RoleBinding", NAMESPACE),
            key("ServiceAccount", NAMESPACE),
        ]
    );
}

#[test]
fn an_unknown_field_or_kind_is_refused() {
    let misspelt = json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "x"}, "rules": [{"apiGroup": [""], "resources": ["leases"], "verbs": ["get"]}],
    });
    let refused = std::panic::catch_unwind(|| rbac_of(&[misspelt], "misspelt"));
    assert!(refused.is_err(), "`apiGroup` (for apiGroups) was accepted");
    let deployment =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}});
    assert!(std::panic::catch_unwind(|| rbac_of(&[deployment], "kind")).is_err());
    let more =
        json!({"spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "c"}]}}}});
    assert!(std::panic::catch_unwind(|| sidecar_of(&[more], "more", None)).is_err());
    let renamed = json!({"metadata": {"name": "x"}, "spec": {"template": {"spec": {"containers": [{"name": "c"}]}}}});
    assert!(std::panic::catch_unwind(|| sidecar_of(&[renamed], "renamed", None)).is_err());
}

/// The rules as (group, resource, verbs), one rule per (group, resource),
/// with nothing else in them (no resourceNames, no nonResourceURLs).
fn grants(rules: &[PolicyRule], origin: &str) -> BTreeSet<(String, String, BTreeSet<String>)> {
    let mut out = BTreeSet::new();
    for rule in rules {
        let groups = rule.api_groups.clone().unwrap_or_default();
        let resources = rule.resources.clone().unwrap_or_default();
        assert_eq!(groups.len(), 1, "{origin}: one group per rule: {rule:?}");
        assert_eq!(
            resources.len(),
            1,
            "{origin}: one resource per rule: {rule:?}"
        );
        assert!(
            rule.resource_names.is_none() && rule.non_resource_urls.is_none(),
            "{rule:?}"
        );
        let verbs: BTreeSet<String> = rule.verbs.iter().cloned().collect();
        assert_eq!(
            verbs.len(),
            rule.verbs.len(),
            "{origin}: a verb twice: {rule:?}"
        );
        assert!(
            out.insert((groups[0].clone(), resources[0].clone(), verbs)),
            "{origin}: {rule:?} twice"
        );
    }
    out
}

fn wanted(access: &[ApiAccess]) -> BTreeSet<(String, String, BTreeSet<String>)> {
    access
        .iter()
        .map(|a| {
            let verbs = a.verbs.iter().map(|v| v.to_string()).collect();
            (a.group.to_string(), a.resource.to_string(), verbs)
        })
        .collect()
}

#[test]
fn the_cluster_role_grants_exactly_api_access() {
    let rbac = rbac_of(&rbac_docs(), "rbac/");
    let rules = rbac.cluster_roles[0].rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), API_ACCESS.len());
    assert_eq!(grants(&rules, "clusterrole.yaml"), wanted(API_ACCESS));
}

#[test]
fn the_role_grants_exactly_lease_access() {
    let rbac = rbac_of(&rbac_docs(), "rbac/");
    let rules = rbac.roles[0].rules.clone().unwrap_or_default();
    assert_eq!(rules.len(), LEASE_ACCESS.len());
    assert_eq!(grants(&rules, "role.yaml"), wanted(LEASE_ACCESS));
}

#[test]
fn the_bindings_give_the_roles_to_the_service_account() {
    let rbac = rbac_of(&rbac_docs(), "rbac/");
    let subject = json!([{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]);
    let crb = &rbac.cluster_bindings[0];
    assert_eq!(
        json(&crb.role_ref),
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME})
    );
    assert_eq!(json(&crb.subjects), subject);
    let rb = &rbac.bindings[0];
    assert_eq!(
        json(&rb.role_ref),
        json!({"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": NAME})
    );
    assert_eq!(json(&rb.subjects), subject);
    assert_eq!(
        rbac.service_accounts[0].metadata.name.as_deref(),
        Some(NAME)
    );
}

// ---------------------------------------------------------------------------
// The sidecar

fn env_of(c: &Container) -> Value {
    json(&c.env)
}

#[test]
fn the_sidecar_runs_the_controller_with_the_cli_defaults() {
    let c = sidecar_file("sidecar.yaml");
    assert_eq!(c.name, NAME);
    // The image's entrypoint is the node agent; the sidecar runs the
    // controller binary beside it, with its defaults.
    assert_eq!(
        c.command.clone().unwrap_or_default(),
        ["/usr/local/bin/health-controller"]
    );
    assert!(c.args.is_none(), "{:?}", c.args);
    assert_eq!(
        env_of(&c),
        json!([
            {"name": "CSI_ADDRESS", "value": CSI_ADDRESS},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "HEALTH_METRICS_ADDR", "value": METRICS_ADDR},
        ])
    );
    // The socket's directory is the driver pod's socket volume.
    let socket_dir = CSI_ADDRESS.rsplit_once('/').unwrap().0;
    assert_eq!(
        json(&c.volume_mounts),
        json!([{"name": SOCKET_VOLUME, "mountPath": socket_dir}])
    );
    assert_eq!(
        json(&c.ports),
        json!([{"name": PORT_NAME, "containerPort": METRICS_PORT, "protocol": "TCP"}])
    );
    assert_eq!(
        METRICS_ADDR.rsplit_once(':').unwrap().1,
        METRICS_PORT.to_string()
    );
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.clone())
            .expect("an HTTP probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(get.port, IntOrString::String(PORT_NAME.to_string()));
    }
}

#[test]
fn the_sidecar_has_requests_a_memory_limit_and_no_cpu_limit() {
    let c = sidecar_file("sidecar.yaml");
    let r = c.resources.expect("resources");
    let requests = r.requests.expect("requests");
    let limits = r.limits.expect("limits");
    assert_eq!(requests.keys().collect::<Vec<_>>(), ["cpu", "memory"]);
    assert_eq!(limits.keys().collect::<Vec<_>>(), ["memory"]);
    assert_eq!(limits["memory"], Quantity("256Mi".to_string()));
}

#[test]
fn the_sidecar_is_non_root_read_only_without_capabilities() {
    let c = sidecar_file("sidecar.yaml");
    assert_eq!(
        json(&c.security_context),
        json!({
            "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        })
    );
}

#[test]
fn the_hostpath_sidecar_differs_only_in_running_as_the_socket_owner() {
    let generic = json(&sidecar_file("sidecar.yaml"));
    let mut hostpath = json(&sidecar_file("example-hostpath/sidecar.yaml"));
    let sc = &mut hostpath["securityContext"];
    assert_eq!(
        (&sc["runAsNonRoot"], &sc["runAsUser"], &sc["runAsGroup"]),
        (&json!(false), &json!(0), &json!(0))
    );
    sc["runAsNonRoot"] = json!(true);
    sc["runAsUser"] = json!(65532);
    sc["runAsGroup"] = json!(65532);
    assert_eq!(hostpath, generic);
}

fn controller_help() -> String {
    let out = Command::new(health_tests::agent::controller_bin().expect("the controller binary"))
        .arg("--help")
        .env_remove("CSI_ADDRESS")
        .env_remove("POD_NAME")
        .env_remove("POD_NAMESPACE")
        .env_remove("HEALTH_METRICS_ADDR")
        .output()
        .expect("running health-controller --help");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "health-controller --help: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

#[test]
fn the_controller_cli_reads_the_environment_the_sidecar_sets() {
    let help = controller_help();
    for needle in [
        format!("[default: {CSI_ADDRESS}]"),
        "[env: CSI_ADDRESS=".to_string(),
        "[env: POD_NAME=".to_string(),
        "[env: POD_NAMESPACE=".to_string(),
        "[env: HEALTH_METRICS_ADDR=".to_string(),
        format!("[default: {METRICS_ADDR}]"),
    ] {
        assert!(help.contains(&needle), "no {needle:?} in:\n{help}");
    }
}

// ---------------------------------------------------------------------------
// Rendering with the real tools

fn kubectl_kustomize(dir: &std::path::Path) -> Vec<Value> {
    let home = tempfile::tempdir().unwrap();
    let text = run_tool(
        &tool("KUBECTL_BIN", "kubectl"),
        &["kustomize", dir.to_str().unwrap()],
        home.path(),
    );
    yaml_documents(&text, "kubectl kustomize")
}

#[test]
fn kustomize_renders_the_rbac_files_unchanged() {
    assert_eq!(
        keyed(&kubectl_kustomize(&controller_dir().join("rbac"))),
        keyed(&rbac_docs())
    );
}

/// What the hostpath example must render: rbac/ in `default`, bound to the
/// driver's account, without an account of its own.
fn hostpath_rbac() -> Vec<Value> {
    let subject = json!([{"kind": "ServiceAccount", "name": HOSTPATH_SA, "namespace": "default"}]);
    rbac_docs()
        .into_iter()
        .filter(|d| d["kind"] != "ServiceAccount")
        .map(|mut d| {
            if d["metadata"].get("namespace").is_some() {
                d["metadata"]["namespace"] = json!("default");
            }
            if d.get("subjects").is_some() {
                d["subjects"] = subject.clone();
            }
            d
        })
        .collect()
}

#[test]
fn the_hostpath_example_binds_the_drivers_account_in_default() {
    let rendered = kubectl_kustomize(&controller_dir().join("example-hostpath"));
    let rbac = rbac_of(&rendered, "example-hostpath");
    assert!(rbac.service_accounts.is_empty());
    assert_eq!(keyed(&rendered), keyed(&hostpath_rbac()));
}

/// A driver's controller StatefulSet of our own making (the shape CSI drivers
/// use: the plugin container and the socket volume).
fn driver_statefulset(name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "serviceName": name,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{"name": "plugin", "image": "example/csi-plugin:1",
                        "volumeMounts": [{"name": SOCKET_VOLUME, "mountPath": "/csi"}]}],
                    "volumes": [{"name": SOCKET_VOLUME, "emptyDir": {}}],
                },
            },
        },
    })
}

/// `kubectl kustomize` of the driver with `patch` (the file's text) applied.
fn kustomize_driver_with(name: &str, patch: &str) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("driver.yaml"),
        driver_statefulset(name).to_string(),
    )
    .unwrap();
    std::fs::write(dir.path().join("sidecar.yaml"), patch).unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "resources: [driver.yaml]\npatches:\n  - path: sidecar.yaml\n",
    )
    .unwrap();
    kubectl_kustomize(dir.path())
}

fn with_sidecar(mut driver: Value, sidecar: &Container) -> Value {
    driver["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .unwrap()
        .insert(0, json(sidecar));
    driver
}

#[test]
fn kustomize_applies_the_sidecar_patches_to_a_driver() {
    // The generic patch, with the driver named on top as its comment says.
    let generic = read(&controller_dir().join("sidecar.yaml"));
    let named =
        format!("apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: csi-driver\n{generic}");
    let rendered = kustomize_driver_with("csi-driver", &named);
    let want = with_sidecar(
        driver_statefulset("csi-driver"),
        &sidecar_file("sidecar.yaml"),
    );
    assert_eq!(rendered, [want]);
    // The hostpath example as it is.
    let example = read(&controller_dir().join("example-hostpath/sidecar.yaml"));
    let rendered = kustomize_driver_with("csi-hostpathplugin", &example);
    let want = with_sidecar(
        driver_statefulset("csi-hostpathplugin"),
        &sidecar_file("example-hostpath/sidecar.yaml"),
    );
    assert_eq!(rendered, [want]);
}

fn helm_home() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn helm(args: &[&str]) -> String {
    let home = helm_home();
    run_tool(&tool("HELM_BIN", "helm"), args, home.path())
}

/// The controller's objects of `helm template` with `values`.
fn helm_controller_objects(values: &[&str]) -> Vec<Value> {
    let chart = chart_dir();
    let mut args = vec!["template", "volume-health", chart.to_str().unwrap()];
    for v in values {
        args.extend(["--set", v]);
    }
    yaml_documents(&helm(&args), "helm template")
        .into_iter()
        .filter(|d| d["metadata"]["labels"]["app.kubernetes.io/component"] == "controller")
        .collect()
}

#[test]
fn helm_renders_no_controller_object_by_default() {
    assert_eq!(helm_controller_objects(&[]), Vec::<Value>::new());
}

#[test]
fn helm_lints_and_renders_the_rbac_of_deploy_controller() {
    let chart = chart_dir();
    helm(&[
        "lint",
        "--strict",
        chart.to_str().unwrap(),
        "--set",
        "controller.enabled=true",
    ]);
    let rendered = helm_controller_objects(&["controller.enabled=true"]);
    rbac_of(&rendered, "helm template");
    assert_eq!(keyed(&rendered), keyed(&rbac_docs()));
}

#[test]
fn helm_values_bind_the_drivers_own_account() {
    let rendered = helm_controller_objects(&[
        "controller.enabled=true",
        "controller.namespace=default",
        "controller.serviceAccount.create=false",
        &format!("controller.serviceAccount.name={HOSTPATH_SA}"),
    ]);
    assert_eq!(keyed(&rendered), keyed(&hostpath_rbac()));
}

/// The sidecar patch in the release notes (`helm install --dry-run=client`).
fn helm_notes_sidecar(values: &[&str]) -> Container {
    let chart = chart_dir();
    let mut args = vec![
        "install",
        "volume-health",
        chart.to_str().unwrap(),
        "--dry-run=client",
    ];
    for v in values {
        args.extend(["--set", v]);
    }
    let out = helm(&args);
    let notes = out.split_once("\nNOTES:\n").expect("helm printed notes").1;
    let patch = notes
        .split_once("# --- sidecar.yaml ---\n")
        .and_then(|(_, rest)| rest.split_once("# --- end ---"))
        .unwrap_or_else(|| panic!("no sidecar patch in the notes:\n{notes}"))
        .0;
    sidecar_of(&yaml_documents(patch, "NOTES.txt"), "NOTES.txt", None)
}

#[test]
fn helm_notes_give_the_sidecar_of_deploy_controller() {
    assert_eq!(
        json(&helm_notes_sidecar(&["controller.enabled=true"])),
        json(&sidecar_file("sidecar.yaml"))
    );
    let root = helm_notes_sidecar(&[
        "controller.enabled=true",
        "controller.securityContext.runAsNonRoot=false",
        "controller.securityContext.runAsUser=0",
        "controller.securityContext.runAsGroup=0",
    ]);
    assert_eq!(
        json(&root),
        json(&sidecar_file("example-hostpath/sidecar.yaml"))
    );
    let moved = helm_notes_sidecar(&[
        "controller.enabled=true",
        "controller.metrics.port=9900",
        "controller.socketVolume=plugin-dir",
    ]);
    assert_eq!(
        json(&moved.ports),
        json!([{"name": PORT_NAME, "containerPort": 9900, "protocol": "TCP"}])
    );
    assert_eq!(
        json(&moved.env)[3],
        json!({"name": "HEALTH_METRICS_ADDR", "value": "0.0.0.0:9900"})
    );
    assert_eq!(
        json(&moved.volume_mounts),
        json!([{"name": "plugin-dir", "mountPath": "/csi"}])
    );
}
