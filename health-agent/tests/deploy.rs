//! The deployment contract: what `deploy/` and the Helm chart give the agent
//! is exactly what the code needs.
//!
//! Every manifest in `deploy/` is parsed into its typed k8s-openapi object;
//! a document whose kind is not expected fails, and so does one with a field
//! the type does not know (the typed object is serialized again and must
//! equal the document, so a misspelt key cannot be dropped silently).
//!
//! The Helm chart is checked twice:
//! - without any tool: every object of `deploy/` is named in the templates,
//!   the fixed lines that matter (RBAC rules, capabilities, mounts, env) are
//!   literally there, and `values.yaml` holds the values `deploy/` uses. This
//!   reads text; it does not evaluate the templates.
//! - with `helm` (HELM_BIN, the xtask tools cache, or PATH; `cargo xtask
//!   tools` installs it): `helm lint --strict`, then `helm template` with the
//!   default values must give the very objects of `deploy/`, and non-default
//!   values must change what they claim to change.
//!
//! `kubectl kustomize deploy/` (same lookup, KUBECTL_BIN) must render the
//! same objects as the files.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

mod common;

use common::{chart_dir, deploy_dir, json, read, run_tool, tool, typed, yaml_documents};
use health_agent::k8s::API_ACCESS;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{
    Container, Namespace, PodSpec, Probe, Service, ServiceAccount, Volume,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::Value;

const NAMESPACE: &str = "volume-health";
const SERVICE_ACCOUNT: &str = "volume-health";
const CLUSTER_ROLE: &str = "volume-health";
const DAEMON_SET: &str = "volume-health-agent";
const METRICS_SERVICE: &str = "volume-health-metrics";
const IMAGE: &str = "volume-health-agent:0.1.0";

/// The default of `health-agent run --metrics-addr` (env HEALTH_METRICS_ADDR).
/// Keep in sync with the CLI in src/main.rs.
const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9808";
const METRICS_PORT_NAME: &str = "metrics";

/// The capabilities deploy/daemonset.yaml documents, one by one.
const CAPABILITIES: [&str; 5] = [
    "BPF",
    "PERFMON",
    "SYS_RESOURCE",
    "DAC_READ_SEARCH",
    "SYS_NICE",
];

/// One host path the agent needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct HostMount {
    host: &'static str,
    mount: &'static str,
    read_only: bool,
    /// recursiveReadOnly: IfPossible (submounts of the host's /proc, /sys
    /// and /dev must not be writable either).
    recursive: bool,
    propagation: Option<&'static str>,
}

const fn host_mount(
    host: &'static str,
    mount: &'static str,
    read_only: bool,
    recursive: bool,
    propagation: Option<&'static str>,
) -> HostMount {
    HostMount {
        host,
        mount,
        read_only,
        recursive,
        propagation,
    }
}

/// Every host path the agent needs, and nothing else.
const MOUNTS: [HostMount; 6] = [
    host_mount("/proc", "/host/proc", true, true, None),
    host_mount("/sys", "/sys", true, true, None),
    host_mount(
        "/sys/kernel/tracing",
        "/sys/kernel/tracing",
        true,
        false,
        None,
    ),
    host_mount("/sys/fs/bpf", "/sys/fs/bpf", false, false, None),
    host_mount(
        "/var/lib/kubelet",
        "/var/lib/kubelet",
        true,
        false,
        Some("HostToContainer"),
    ),
    host_mount("/dev", "/dev", true, true, None),
];

// ---------------------------------------------------------------------------
// Parsing

/// One object of a manifest, typed.
#[derive(Clone, Debug)]
enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    DaemonSet(Box<DaemonSet>),
    Service(Box<Service>),
}

/// An object with the document it came from (as JSON).
#[derive(Clone, Debug)]
struct Parsed {
    object: Object,
    json: Value,
}

impl Parsed {
    /// (kind, namespace, name): what identifies an object in a cluster.
    fn key(&self) -> (String, String, String) {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        (
            s(&self.json["kind"]),
            s(&self.json["metadata"]["namespace"]),
            s(&self.json["metadata"]["name"]),
        )
    }
}

fn to_object(json: &Value, origin: &str) -> Object {
    let kind = json["kind"].as_str().unwrap_or_default();
    let api_version = json["apiVersion"].as_str().unwrap_or_default();
    match (api_version, kind) {
        ("v1", "Namespace") => Object::Namespace(typed(json, origin)),
        ("v1", "ServiceAccount") => Object::ServiceAccount(typed(json, origin)),
        ("v1", "Service") => Object::Service(Box::new(typed(json, origin))),
        ("rbac.authorization.k8s.io/v1", "ClusterRole") => Object::ClusterRole(typed(json, origin)),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
            Object::ClusterRoleBinding(typed(json, origin))
        }
        ("apps/v1", "DaemonSet") => Object::DaemonSet(Box::new(typed(json, origin))),
        _ => panic!("{origin}: unexpected object {api_version} {kind}"),
    }
}

/// Every document of a multi-document YAML text (empty documents skipped).
fn parse_documents(text: &str, origin: &str) -> Vec<Parsed> {
    yaml_documents(text, origin)
        .into_iter()
        .map(|json| Parsed {
            object: to_object(&json, origin),
            json,
        })
        .collect()
}

/// The manifest files of deploy/ (the kustomization itself aside).
fn manifest_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(deploy_dir())
        .expect("deploy/ exists")
        .map(|e| e.expect("listing deploy/").file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml") || n.ends_with(".yml"))
        .filter(|n| n != "kustomization.yaml")
        .collect();
    names.sort();
    names
}

fn deploy_objects() -> Vec<Parsed> {
    manifest_files()
        .iter()
        .flat_map(|name| parse_documents(&read(&deploy_dir().join(name)), name))
        .collect()
}

/// The objects keyed by (kind, namespace, name); a key seen twice fails.
fn by_key(objects: &[Parsed], origin: &str) -> BTreeMap<(String, String, String), Value> {
    let mut map = BTreeMap::new();
    for p in objects {
        let previous = map.insert(p.key(), p.json.clone());
        assert!(previous.is_none(), "{origin}: {:?} twice", p.key());
    }
    map
}

struct Deploy {
    namespace: Namespace,
    service_account: ServiceAccount,
    role: ClusterRole,
    binding: ClusterRoleBinding,
    daemon_set: DaemonSet,
    service: Service,
}

/// The one object of each kind that deploy/ must have.
fn deploy() -> Deploy {
    split(&deploy_objects(), "deploy/")
}

fn split(objects: &[Parsed], origin: &str) -> Deploy {
    fn one<T: Clone>(found: &[T], what: &str, origin: &str) -> T {
        assert_eq!(found.len(), 1, "{origin}: expected exactly one {what}");
        found[0].clone()
    }
    let mut ns = vec![];
    let mut sa = vec![];
    let mut role = vec![];
    let mut binding = vec![];
    let mut ds = vec![];
    let mut svc = vec![];
    for p in objects {
        match &p.object {
            Object::Namespace(o) => ns.push(o.clone()),
            Object::ServiceAccount(o) => sa.push(o.clone()),
            Object::ClusterRole(o) => role.push(o.clone()),
            Object::ClusterRoleBinding(o) => binding.push(o.clone()),
            Object::DaemonSet(o) => ds.push((**o).clone()),
            Object::Service(o) => svc.push((**o).clone()),
        }
    }
    Deploy {
        namespace: one(&ns, "Namespace", origin),
        service_account: one(&sa, "ServiceAccount", origin),
        role: one(&role, "ClusterRole", origin),
        binding: one(&binding, "ClusterRoleBinding", origin),
        daemon_set: one(&ds, "DaemonSet", origin),
        service: one(&svc, "Service", origin),
    }
}

fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .expect("the DaemonSet has a pod spec")
}

fn agent(ds: &DaemonSet) -> &Container {
    let containers = &pod_spec(ds).containers;
    assert_eq!(containers.len(), 1, "one container, the agent");
    &containers[0]
}

fn env_value<'a>(c: &'a Container, name: &str) -> &'a str {
    let var = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("env {name} is not set"));
    var.value
        .as_deref()
        .unwrap_or_else(|| panic!("env {name} has no literal value"))
}

fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or_default()
}

fn metrics_port() -> i32 {
    DEFAULT_METRICS_ADDR
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .expect("the default metrics address has a port")
}

// ---------------------------------------------------------------------------
// deploy/: the objects

#[test]
fn the_kustomization_lists_every_manifest_and_only_those() {
    #[derive(Deserialize)]
    struct Kustomization {
        resources: Vec<String>,
    }
    let k: Kustomization =
        serde_yaml::from_str(&read(&deploy_dir().join("kustomization.yaml"))).unwrap();
    let mut listed = k.resources.clone();
    listed.sort();
    assert_eq!(listed, manifest_files());
    let unique: BTreeSet<&String> = k.resources.iter().collect();
    assert_eq!(unique.len(), k.resources.len(), "a resource listed twice");
}

#[test]
fn deploy_has_exactly_the_expected_objects() {
    let keys: Vec<(String, String, String)> =
        by_key(&deploy_objects(), "deploy/").into_keys().collect();
    let k = |kind: &str, ns: &str, name: &str| (kind.into(), ns.into(), name.into());
    let expected = vec![
        k("ClusterRole", "", CLUSTER_ROLE),
        k("ClusterRoleBinding", "", CLUSTER_ROLE),
        k("DaemonSet", NAMESPACE, DAEMON_SET),
        k("Namespace", "", NAMESPACE),
        k("Service", NAMESPACE, METRICS_SERVICE),
        k("ServiceAccount", NAMESPACE, SERVICE_ACCOUNT),
    ];
    assert_eq!(keys, expected);
}

#[test]
fn an_unknown_field_or_kind_is_refused() {
    let misspelt =
        "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\nautomountToken: true\n";
    let refused = std::panic::catch_unwind(|| parse_documents(misspelt, "test"));
    assert!(refused.is_err(), "a misspelt field must fail");
    let unknown = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n";
    let refused = std::panic::catch_unwind(|| parse_documents(unknown, "test"));
    assert!(refused.is_err(), "an unexpected kind must fail");
    let fine = "---\napiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: x\n---\n";
    assert_eq!(parse_documents(fine, "test").len(), 1);
}

#[test]
fn the_cluster_role_grants_exactly_api_access() {
    let d = deploy();
    assert_eq!(name(&d.role.metadata), CLUSTER_ROLE);
    assert!(d.role.aggregation_rule.is_none());
    let mut granted: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for rule in d.role.rules.iter().flatten() {
        assert!(rule.resource_names.is_none(), "{rule:?}");
        assert!(rule.non_resource_urls.is_none(), "{rule:?}");
        let groups = rule.api_groups.clone().unwrap_or_default();
        let resources = rule.resources.clone().unwrap_or_default();
        for s in groups.iter().chain(&resources).chain(&rule.verbs) {
            assert!(!s.contains('*'), "wildcard in {rule:?}");
        }
        for g in &groups {
            for r in &resources {
                let verbs = granted.entry((g.clone(), r.clone())).or_default();
                assert!(verbs.is_empty(), "{g}/{r} granted by two rules");
                verbs.extend(rule.verbs.iter().cloned());
            }
        }
    }
    let needed: BTreeMap<(String, String), BTreeSet<String>> = API_ACCESS
        .iter()
        .map(|a| {
            let verbs = a.verbs.iter().map(|v| v.to_string()).collect();
            ((a.group.to_string(), a.resource.to_string()), verbs)
        })
        .collect();
    assert_eq!(granted, needed);
    // One rule per API_ACCESS entry, so the manifest reads like the code.
    assert_eq!(d.role.rules.as_ref().map_or(0, Vec::len), API_ACCESS.len());
}

#[test]
fn the_binding_gives_the_role_to_the_service_account() {
    let d = deploy();
    assert_eq!(name(&d.namespace.metadata), NAMESPACE);
    let labels = d.namespace.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("privileged"),
        "hostPath volumes and added capabilities need the privileged level"
    );
    assert_eq!(name(&d.service_account.metadata), SERVICE_ACCOUNT);
    assert_eq!(namespace_of(&d.service_account.metadata), NAMESPACE);
    let r = &d.binding.role_ref;
    assert_eq!(
        (r.api_group.as_str(), r.kind.as_str(), r.name.as_str()),
        ("rbac.authorization.k8s.io", "ClusterRole", CLUSTER_ROLE)
    );
    let subjects = d.binding.subjects.clone().unwrap_or_default();
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    let s = &subjects[0];
    assert_eq!(
        (s.kind.as_str(), s.name.as_str(), s.namespace.as_deref()),
        ("ServiceAccount", SERVICE_ACCOUNT, Some(NAMESPACE))
    );
    assert!(s.api_group.as_deref().unwrap_or_default().is_empty());
}

#[test]
fn the_daemon_set_runs_everywhere_as_the_service_account() {
    let ds = deploy().daemon_set;
    assert_eq!(name(&ds.metadata), DAEMON_SET);
    assert_eq!(namespace_of(&ds.metadata), NAMESPACE);
    let spec = ds.spec.as_ref().unwrap();
    let selector = spec.selector.match_labels.clone().unwrap_or_default();
    let labels = spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.labels.clone());
    assert!(!selector.is_empty());
    assert!(selector
        .iter()
        .all(|(k, v)| labels.as_ref().and_then(|l| l.get(k)) == Some(v)));
    let strategy = spec.update_strategy.as_ref().unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    assert_eq!(
        strategy.rolling_update.as_ref().unwrap().max_unavailable,
        Some(IntOrString::String("10%".into()))
    );

    let pod = pod_spec(&ds);
    assert_eq!(pod.service_account_name.as_deref(), Some(SERVICE_ACCOUNT));
    assert_ne!(pod.automount_service_account_token, Some(false));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    assert_eq!(pod.termination_grace_period_seconds, Some(10));
    assert_eq!(pod.host_pid, Some(false));
    assert_ne!(pod.host_network, Some(true));
    assert_ne!(pod.host_ipc, Some(true));
    let tolerations = pod.tolerations.clone().unwrap_or_default();
    assert!(
        tolerations
            .iter()
            .any(|t| t.operator.as_deref() == Some("Exists")
                && t.key.is_none()
                && t.effect.is_none()),
        "a toleration of every taint: {tolerations:?}"
    );
    assert!(pod.security_context.is_none(), "pod-level securityContext");
}

#[test]
fn env_names_the_node_and_the_mounted_host_paths() {
    let ds = deploy().daemon_set;
    let c = agent(&ds);
    let node = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NODE_NAME")
        .expect("NODE_NAME is set");
    assert!(node.value.is_none());
    let field = node
        .value_from
        .as_ref()
        .and_then(|v| v.field_ref.as_ref())
        .expect("NODE_NAME comes from a fieldRef");
    assert_eq!(field.field_path, "spec.nodeName");

    let mount_of = |host: &str| mount_path_of_host_path(&ds, host);
    assert_eq!(env_value(c, "HEALTH_HOST_PROC"), mount_of("/proc"));
    assert_eq!(env_value(c, "HEALTH_HOST_PROC"), "/host/proc");
    assert_eq!(env_value(c, "HEALTH_HOST_SYS"), mount_of("/sys"));
    assert_eq!(env_value(c, "HEALTH_HOST_SYS"), "/sys");
    // tracefs where the agent (<host-sys>/kernel/tracing) and aya look.
    assert_eq!(
        mount_of("/sys/kernel/tracing"),
        format!("{}/kernel/tracing", env_value(c, "HEALTH_HOST_SYS"))
    );
    // The kubelet root at its host path: mount points in the host's
    // mountinfo are paths the agent can use as they are.
    assert_eq!(env_value(c, "HEALTH_KUBELET_ROOT"), "/var/lib/kubelet");
    assert_eq!(mount_of("/var/lib/kubelet"), "/var/lib/kubelet");
    assert_eq!(env_value(c, "HEALTH_METRICS_ADDR"), DEFAULT_METRICS_ADDR);
    assert_eq!(env_value(c, "HEALTH_LOG"), "info");
    let names: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "NODE_NAME",
            "HEALTH_HOST_PROC",
            "HEALTH_HOST_SYS",
            "HEALTH_KUBELET_ROOT",
            "HEALTH_METRICS_ADDR",
            "HEALTH_LOG"
        ]
    );
}

fn host_path_volume<'a>(ds: &'a DaemonSet, host: &str) -> &'a Volume {
    pod_spec(ds)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.as_ref().is_some_and(|h| h.path == host))
        .unwrap_or_else(|| panic!("no hostPath volume for {host}"))
}

fn mount_path_of_host_path(ds: &DaemonSet, host: &str) -> String {
    let volume = host_path_volume(ds, host);
    let mounts: Vec<_> = agent(ds)
        .volume_mounts
        .iter()
        .flatten()
        .filter(|m| m.name == volume.name)
        .collect();
    assert_eq!(mounts.len(), 1, "{host} mounted once");
    mounts[0].mount_path.clone()
}

#[test]
fn every_host_path_is_mounted_as_documented() {
    let ds = deploy().daemon_set;
    let volumes: BTreeMap<&str, &Volume> = pod_spec(&ds)
        .volumes
        .iter()
        .flatten()
        .map(|v| (v.name.as_str(), v))
        .collect();
    let mounts = agent(&ds).volume_mounts.clone().unwrap_or_default();
    assert_eq!(volumes.len(), mounts.len(), "every volume mounted once");
    let mut seen = Vec::new();
    for m in &mounts {
        let v = volumes
            .get(m.name.as_str())
            .unwrap_or_else(|| panic!("volumeMount {} has no volume", m.name));
        let host = v.host_path.as_ref().expect("only hostPath volumes");
        assert_eq!(host.type_.as_deref(), Some("Directory"), "{}", m.name);
        let recursive = match m.recursive_read_only.as_deref() {
            None => false,
            Some("IfPossible") => true,
            Some(other) => panic!("{}: recursiveReadOnly {other}", m.name),
        };
        seen.push((
            host.path.clone(),
            m.mount_path.clone(),
            m.read_only == Some(true),
            recursive,
            m.mount_propagation.clone(),
        ));
        assert!(m.sub_path.is_none() && m.sub_path_expr.is_none());
    }
    seen.sort();
    let mut expected: Vec<_> = MOUNTS
        .iter()
        .map(|m| {
            (
                m.host.to_string(),
                m.mount.to_string(),
                m.read_only,
                m.recursive,
                m.propagation.map(String::from),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(seen, expected);
}

#[test]
fn the_container_is_not_privileged_and_has_exactly_the_documented_capabilities() {
    let ds = deploy().daemon_set;
    let sc = agent(&ds)
        .security_context
        .clone()
        .expect("securityContext");
    assert_eq!(sc.privileged, Some(false));
    assert_eq!(sc.run_as_user, Some(0));
    assert_ne!(sc.run_as_non_root, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    let caps = sc.capabilities.expect("capabilities");
    assert_eq!(caps.drop, Some(vec!["ALL".to_string()]));
    let added: Vec<String> = caps.add.unwrap_or_default();
    assert_eq!(added, CAPABILITIES.map(String::from).to_vec());
    // The agent's preflight (kernel/probes) accepts BPF + PERFMON instead of SYS_ADMIN.
    assert!(!added.iter().any(|c| c == "SYS_ADMIN" || c == "ALL"));
    let seccomp = sc.seccomp_profile.expect("seccompProfile");
    assert_eq!(seccomp.type_, "RuntimeDefault");
    assert!(sc.proc_mount.is_none());
}

#[test]
fn requests_and_a_memory_limit_are_set_and_no_cpu_limit() {
    let ds = deploy().daemon_set;
    let r = agent(&ds).resources.clone().expect("resources");
    let quantities =
        |m: Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.0))
                .collect::<BTreeMap<String, String>>()
        };
    let requests = quantities(r.requests);
    let limits = quantities(r.limits);
    let map = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(requests, map(&[("cpu", "20m"), ("memory", "32Mi")]));
    // No CPU limit: the reason is written next to it in daemonset.yaml.
    assert_eq!(limits, map(&[("memory", "128Mi")]));
}

fn http_get(probe: Option<&Probe>, what: &str) -> (String, IntOrString) {
    let get = probe
        .and_then(|p| p.http_get.as_ref())
        .unwrap_or_else(|| panic!("{what} is an httpGet probe"));
    (get.path.clone().unwrap_or_default(), get.port.clone())
}

#[test]
fn the_agent_runs_cluster_mode_and_is_probed_on_its_metrics_port() {
    let d = deploy();
    let ds = &d.daemon_set;
    let c = agent(ds);
    assert_eq!(c.image.as_deref(), Some(IMAGE));
    assert!(c.command.is_none(), "the image's entrypoint is the agent");
    let args = c.args.clone().unwrap_or_default();
    assert_eq!(args.first().map(String::as_str), Some("run"));
    let port = IntOrString::String(METRICS_PORT_NAME.into());
    assert_eq!(
        http_get(c.liveness_probe.as_ref(), "liveness"),
        ("/healthz".to_string(), port.clone())
    );
    assert_eq!(
        http_get(c.readiness_probe.as_ref(), "readiness"),
        ("/readyz".to_string(), port.clone())
    );
    let ports = c.ports.clone().unwrap_or_default();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].name.as_deref(), Some(METRICS_PORT_NAME));
    assert_eq!(ports[0].container_port, metrics_port());
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    assert!(ports[0].host_port.is_none());

    let annotations = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    let a = |k: &str| annotations.get(k).map(String::as_str);
    assert_eq!(a("prometheus.io/scrape"), Some("true"));
    assert_eq!(
        a("prometheus.io/port"),
        Some(metrics_port().to_string().as_str())
    );
    assert_eq!(a("prometheus.io/path"), Some("/metrics"));

    let svc = d.service.spec.clone().expect("service spec");
    assert_eq!(namespace_of(&d.service.metadata), NAMESPACE);
    let template_labels = ds
        .spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.clone())
        .unwrap_or_default();
    assert_eq!(svc.selector.clone().unwrap_or_default(), template_labels);
    let svc_ports = svc.ports.clone().unwrap_or_default();
    assert_eq!(svc_ports.len(), 1);
    assert_eq!(svc_ports[0].port, metrics_port());
    assert_eq!(svc_ports[0].target_port, Some(port));
}

// ---------------------------------------------------------------------------
// The agent's CLI

fn agent_help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_health-agent"))
        .args(args)
        .arg("--help")
        // Set values would show up in the help text instead of the names.
        .env_remove("HEALTH_HOST_PROC")
        .env_remove("HEALTH_HOST_SYS")
        .env_remove("HEALTH_LOG")
        .env_remove("HEALTH_KUBELET_ROOT")
        .env_remove("HEALTH_METRICS_ADDR")
        .env_remove("NODE_NAME")
        .output()
        .expect("running health-agent --help");
    assert!(out.status.success(), "health-agent {args:?} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn the_cli_reads_the_environment_the_daemon_set_sets() {
    let ds = deploy().daemon_set;
    let c = agent(&ds);
    let help = agent_help(&[]) + &agent_help(&["watch"]);
    for name in [
        "HEALTH_HOST_PROC",
        "HEALTH_HOST_SYS",
        "HEALTH_LOG",
        "HEALTH_KUBELET_ROOT",
    ] {
        assert!(c.env.iter().flatten().any(|e| e.name == name));
        assert!(
            help.contains(&format!("[env: {name}=")),
            "the CLI has no env {name}"
        );
    }
}

/// NODE_NAME and HEALTH_METRICS_ADDR belong to `health-agent run`: the
/// DaemonSet's env must be what the binary reads.
#[test]
fn the_run_command_reads_node_name_and_the_metrics_address() {
    let help = agent_help(&["run"]);
    assert!(help.contains("[env: NODE_NAME="), "{help}");
    assert!(help.contains("[env: HEALTH_METRICS_ADDR="), "{help}");
    assert!(
        help.contains(&format!("[default: {DEFAULT_METRICS_ADDR}]")),
        "{help}"
    );
}

// ---------------------------------------------------------------------------
// The Helm chart, read as text

fn chart_templates() -> String {
    let dir = chart_dir().join("templates");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("templates/ exists")
        .map(|e| e.expect("listing templates/").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    names.sort();
    names.iter().map(|p| read(p) + "\n").collect()
}

fn chart_values() -> Value {
    serde_yaml::from_str(&read(&chart_dir().join("values.yaml"))).expect("values.yaml is YAML")
}

/// The `rules:` block of a ClusterRole file, comments and blank lines aside.
fn rules_block(text: &str) -> Vec<String> {
    text.lines()
        .skip_while(|l| l.trim() != "rules:")
        .take_while(|l| !l.trim_start().starts_with("{{"))
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|l| l.trim_end().to_string())
        .collect()
}

#[test]
fn the_chart_templates_name_every_object_and_the_fixed_fields() {
    let templates = chart_templates();
    let has = |s: &str| templates.contains(s);
    for p in deploy_objects() {
        let (kind, _, name) = p.key();
        assert!(has(&format!("kind: {kind}\n")), "no {kind} in the chart");
        if kind != "Namespace" {
            assert!(
                has(&format!("  name: {name}\n")),
                "no {kind} {name} in the chart"
            );
        }
    }
    let chart_rules = rules_block(&read(&chart_dir().join("templates/clusterrole.yaml")));
    assert_eq!(
        chart_rules,
        rules_block(&read(&deploy_dir().join("clusterrole.yaml")))
    );
    assert!(chart_rules.len() > API_ACCESS.len());
    let caps = CAPABILITIES.map(|c| format!("{c:?}")).join(", ");
    assert!(has(&format!("add: [{caps}]\n")), "capabilities differ");
    assert!(has("drop: [\"ALL\"]\n"));
    assert!(has("privileged: false\n") && has("allowPrivilegeEscalation: false\n"));
    assert!(has("readOnlyRootFilesystem: true\n") && has("runAsUser: 0\n"));
    for m in MOUNTS {
        // The kubelet root is a value (checked against values.yaml below).
        if m.host != "/var/lib/kubelet" {
            assert!(
                has(&format!("path: {}\n", m.host)),
                "no hostPath {}",
                m.host
            );
            assert!(
                has(&format!("mountPath: {}\n", m.mount)),
                "no mount at {}",
                m.mount
            );
        }
        if let Some(p) = m.propagation {
            assert!(has(&format!("mountPropagation: {p}\n")));
        }
    }
    assert_eq!(
        templates.matches("recursiveReadOnly: IfPossible\n").count(),
        MOUNTS.iter().filter(|m| m.recursive).count()
    );
    for env in [
        "NODE_NAME",
        "HEALTH_HOST_PROC",
        "HEALTH_HOST_SYS",
        "HEALTH_KUBELET_ROOT",
        "HEALTH_METRICS_ADDR",
        "HEALTH_LOG",
    ] {
        assert!(has(&format!("- name: {env}\n")), "no env {env}");
    }
    assert!(has("fieldPath: spec.nodeName\n"));
    for s in [
        "path: /healthz\n",
        "path: /readyz\n",
        "port: metrics\n",
        "- run\n",
    ] {
        assert!(has(s), "no {s:?}");
    }
}

#[test]
fn the_chart_defaults_are_the_values_of_deploy() {
    let values = chart_values();
    let ds = deploy().daemon_set;
    let c = agent(&ds);
    let pod = pod_spec(&ds);
    let image = format!(
        "{}:{}",
        values["image"]["repository"].as_str().unwrap(),
        values["image"]["tag"].as_str().unwrap()
    );
    assert_eq!(Some(image.as_str()), c.image.as_deref());
    assert_eq!(
        values["image"]["pullPolicy"].as_str(),
        c.image_pull_policy.as_deref()
    );
    assert_eq!(values["namespace"]["name"], NAMESPACE);
    assert_eq!(values["namespace"]["create"], true);
    assert_eq!(values["metrics"]["port"], metrics_port());
    assert_eq!(values["metrics"]["service"], true);
    assert_eq!(values["kubeletRoot"], env_value(c, "HEALTH_KUBELET_ROOT"));
    assert_eq!(values["logLevel"], env_value(c, "HEALTH_LOG"));
    assert_eq!(values["extraArgs"], serde_json::json!([]));
    assert_eq!(values["privileged"], false);
    assert_eq!(
        values["priorityClassName"].as_str(),
        pod.priority_class_name.as_deref()
    );
    assert_eq!(values["updateStrategy"]["maxUnavailable"], "10%");
    assert_eq!(values["resources"], json(&c.resources));
    assert_eq!(values["tolerations"], json(&pod.tolerations));
    assert_eq!(
        values["seccompProfile"],
        json(&c.security_context.as_ref().unwrap().seccomp_profile)
    );
    assert_eq!(values["nodeSelector"], serde_json::json!({}));
    assert!(pod.node_selector.is_none());
}

// ---------------------------------------------------------------------------
// Rendering with the real tools

fn helm_template(extra: &[&str]) -> Vec<Parsed> {
    let home = tempfile::tempdir().unwrap();
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    let mut args = vec!["template", "volume-health", chart];
    args.extend_from_slice(extra);
    let text = run_tool(&tool("HELM_BIN", "helm"), &args, home.path());
    parse_documents(&text, "helm template")
}

#[test]
fn helm_lints_and_renders_the_objects_of_deploy() {
    let home = tempfile::tempdir().unwrap();
    let chart = chart_dir();
    run_tool(
        &tool("HELM_BIN", "helm"),
        &["lint", "--strict", chart.to_str().unwrap()],
        home.path(),
    );
    let rendered = by_key(&helm_template(&[]), "helm template");
    let files = by_key(&deploy_objects(), "deploy/");
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        files.keys().collect::<Vec<_>>()
    );
    for (key, value) in &files {
        assert_eq!(
            &rendered[key], value,
            "{key:?} differs between the chart and deploy/"
        );
    }
}

#[test]
fn helm_values_change_what_they_claim_to() {
    let objects = helm_template(&[
        "--set",
        "privileged=true",
        "--set",
        "extraArgs={--flush-errors,--event-writes-per-minute=10}",
        "--set",
        "namespace.name=storage-watch",
        "--set",
        "metrics.port=9900",
        "--set",
        "kubeletRoot=/data/kubelet",
        "--set",
        "image.repository=registry.example/vh,image.tag=1.2.3",
        "--set",
        "nodeSelector.disk=ssd",
    ]);
    let d = split(&objects, "helm template --set ...");
    let ds = &d.daemon_set;
    let c = agent(ds);
    assert_eq!(c.image.as_deref(), Some("registry.example/vh:1.2.3"));
    assert_eq!(
        c.args.clone().unwrap(),
        ["run", "--flush-errors", "--event-writes-per-minute=10"]
    );
    let sc = c.security_context.clone().unwrap();
    assert_eq!(sc.privileged, Some(true));
    assert!(sc.capabilities.is_none() && sc.allow_privilege_escalation.is_none());
    assert_eq!(env_value(c, "HEALTH_METRICS_ADDR"), "0.0.0.0:9900");
    assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 9900);
    assert_eq!(d.service.spec.unwrap().ports.unwrap()[0].port, 9900);
    assert_eq!(env_value(c, "HEALTH_KUBELET_ROOT"), "/data/kubelet");
    assert_eq!(
        mount_path_of_host_path(ds, "/data/kubelet"),
        "/data/kubelet"
    );
    let selector = pod_spec(ds).node_selector.clone().unwrap();
    assert_eq!(selector.get("disk").map(String::as_str), Some("ssd"));
    assert_eq!(name(&d.namespace.metadata), "storage-watch");
    for ns in [
        namespace_of(&ds.metadata),
        namespace_of(&d.service_account.metadata),
        namespace_of(&d.service.metadata),
        d.binding.subjects.as_ref().unwrap()[0]
            .namespace
            .as_deref()
            .unwrap(),
    ] {
        assert_eq!(ns, "storage-watch");
    }
    // Without the namespace and the Service, the rest stays.
    let fewer = helm_template(&["--set", "namespace.create=false,metrics.service=false"]);
    let kinds: BTreeSet<String> = fewer.iter().map(|p| p.key().0).collect();
    let expected: BTreeSet<String> = [
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
        "ServiceAccount",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds, expected);
}

#[test]
fn kustomize_renders_the_files_unchanged() {
    let home = tempfile::tempdir().unwrap();
    let dir = deploy_dir();
    let text = run_tool(
        &tool("KUBECTL_BIN", "kubectl"),
        &["kustomize", dir.to_str().unwrap()],
        home.path(),
    );
    let rendered = by_key(
        &parse_documents(&text, "kubectl kustomize"),
        "kubectl kustomize",
    );
    assert_eq!(rendered, by_key(&deploy_objects(), "deploy/"));
}
