//! The node agent's objects as deploy/ and its renderings give them, typed:
//! parsing (strict: a field a type does not know fails), the objects by key,
//! the DaemonSet's pod and container, and the host paths it must mount.
//! Shared by deploy.rs (the files) and deploy_render.rs (kustomize and helm).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Container, Namespace, PodSpec, Service, ServiceAccount, Volume};
use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

use super::{deploy_dir, read, typed, yaml_documents};

pub const NAMESPACE: &str = "volume-health";
pub const SERVICE_ACCOUNT: &str = "volume-health";
pub const CLUSTER_ROLE: &str = "volume-health";
pub const DAEMON_SET: &str = "volume-health-agent";
pub const METRICS_SERVICE: &str = "volume-health-metrics";
pub const IMAGE: &str = "volume-health-agent:0.1.0";
/// The API Priority and Fairness versions of deploy/components/flow-control
/// (1.29+) and flow-control-v1beta3 (1.26-1.31).
pub const FLOW_CONTROL_V1: &str = "flowcontrol.apiserver.k8s.io/v1";
pub const FLOW_CONTROL_V1BETA3: &str = "flowcontrol.apiserver.k8s.io/v1beta3";

/// One host path the agent needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct HostMount {
    pub host: &'static str,
    pub mount: &'static str,
    pub read_only: bool,
    /// recursiveReadOnly: IfPossible where the cluster has it (1.31+): the
    /// host's mounts below /proc, /sys and /dev read-only too. deploy/ has
    /// it on none; deploy/components/recursive-read-only adds it.
    pub recursive: bool,
    pub propagation: Option<&'static str>,
}

pub const fn host_mount(
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

/// The agent's own directory on the node (`--state-dir`): its copy of the
/// node's Events. The one host path that the kubelet creates if missing.
pub const STATE_DIR: &str = "/var/lib/volume-health";

/// Every host path the agent needs, and nothing else.
pub const MOUNTS: [HostMount; 8] = [
    host_mount("/proc", "/host/proc", true, true, None),
    host_mount("/sys", "/sys", true, true, None),
    // Writable: the agent's tracer witness is a tracefs instance.
    host_mount(
        "/sys/kernel/tracing",
        "/sys/kernel/tracing",
        false,
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
    // The host's cgroups (the container's own /sys/fs/cgroup is its cgroup
    // namespace's): a stalled bio's cgroup named as pod and container.
    host_mount("/sys/fs/cgroup", "/host/sys/fs/cgroup", true, true, None),
    // Writable: the agent keeps its copy of the node's Events there.
    host_mount(STATE_DIR, STATE_DIR, false, false, None),
];

// ---------------------------------------------------------------------------
// Parsing

/// One object of a manifest, typed.
#[derive(Clone, Debug)]
pub enum Object {
    Namespace(Namespace),
    ServiceAccount(ServiceAccount),
    ClusterRole(ClusterRole),
    ClusterRoleBinding(ClusterRoleBinding),
    DaemonSet(Box<DaemonSet>),
    Service(Box<Service>),
    Crd(Box<CustomResourceDefinition>),
    /// The agents' API Priority and Fairness objects (v1, or v1beta3 read
    /// as v1: see [`to_object`]).
    FlowSchema(Box<FlowSchema>),
    PriorityLevel(Box<PriorityLevelConfiguration>),
}

/// An object with the document it came from (as JSON).
#[derive(Clone, Debug)]
pub struct Parsed {
    pub object: Object,
    pub json: Value,
}

impl Parsed {
    /// (kind, namespace, name): what identifies an object in a cluster.
    pub fn key(&self) -> (String, String, String) {
        let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
        (
            s(&self.json["kind"]),
            s(&self.json["metadata"]["namespace"]),
            s(&self.json["metadata"]["name"]),
        )
    }
}

pub fn to_object(json: &Value, origin: &str) -> Object {
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
        ("apiextensions.k8s.io/v1", "CustomResourceDefinition") => {
            Object::Crd(Box::new(typed(json, origin)))
        }
        (FLOW_CONTROL_V1, "FlowSchema") => Object::FlowSchema(Box::new(typed(json, origin))),
        (FLOW_CONTROL_V1, "PriorityLevelConfiguration") => {
            Object::PriorityLevel(Box::new(typed(json, origin)))
        }
        // k8s-openapi has no v1beta3 (Kubernetes 1.32 removed it); every
        // field deploy/ uses has the same name and type in v1, so a
        // misspelt one still fails here. What a real 1.26 makes of v1beta3
        // is apiserver_flowcontrol.rs.
        (FLOW_CONTROL_V1BETA3, "FlowSchema" | "PriorityLevelConfiguration") => {
            let mut as_v1 = json.clone();
            as_v1["apiVersion"] = FLOW_CONTROL_V1.into();
            to_object(&as_v1, origin)
        }
        _ => panic!("{origin}: unexpected object {api_version} {kind}"),
    }
}

/// Every document of a multi-document YAML text (empty documents skipped).
pub fn parse_documents(text: &str, origin: &str) -> Vec<Parsed> {
    yaml_documents(text, origin)
        .into_iter()
        .map(|json| Parsed {
            object: to_object(&json, origin),
            json,
        })
        .collect()
}

/// The manifest files of deploy/ (the kustomization itself aside).
pub fn manifest_files() -> Vec<String> {
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

pub fn deploy_objects() -> Vec<Parsed> {
    manifest_files()
        .iter()
        .flat_map(|name| parse_documents(&read(&deploy_dir().join(name)), name))
        .collect()
}

/// The objects keyed by (kind, namespace, name); a key seen twice fails.
pub fn by_key(objects: &[Parsed], origin: &str) -> BTreeMap<(String, String, String), Value> {
    let mut map = BTreeMap::new();
    for p in objects {
        let previous = map.insert(p.key(), p.json.clone());
        assert!(previous.is_none(), "{origin}: {:?} twice", p.key());
    }
    map
}

/// `objects` without deploy/'s Namespace, which it must have: the chart
/// leaves the namespace to Helm (the release's).
pub fn without_namespace(
    mut objects: BTreeMap<(String, String, String), Value>,
) -> BTreeMap<(String, String, String), Value> {
    let key = ("Namespace".into(), String::new(), "volume-health".into());
    assert!(objects.remove(&key).is_some(), "no Namespace volume-health");
    objects
}

pub struct Deploy {
    /// deploy/ has one; the chart none (the release's namespace is the
    /// user's, made by `helm install --create-namespace` or before).
    pub namespace: Option<Namespace>,
    pub service_account: ServiceAccount,
    pub role: ClusterRole,
    pub binding: ClusterRoleBinding,
    pub daemon_set: DaemonSet,
    pub service: Service,
}

/// The one object of each kind that deploy/ must have.
pub fn deploy() -> Deploy {
    split(&deploy_objects(), "deploy/")
}

pub fn split(objects: &[Parsed], origin: &str) -> Deploy {
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
            // Checked on their own (deploy_status.rs: the_crd_is_the_charts_...;
            // deploy_render.rs: the flow-control components).
            Object::Crd(_) | Object::FlowSchema(_) | Object::PriorityLevel(_) => {}
        }
    }
    Deploy {
        namespace: match ns.len() {
            0 => None,
            _ => Some(one(&ns, "Namespace", origin)),
        },
        service_account: one(&sa, "ServiceAccount", origin),
        role: one(&role, "ClusterRole", origin),
        binding: one(&binding, "ClusterRoleBinding", origin),
        daemon_set: one(&ds, "DaemonSet", origin),
        service: one(&svc, "Service", origin),
    }
}

pub fn pod_spec(ds: &DaemonSet) -> &PodSpec {
    // k8s-openapi's v1_37 types: `spec` is no longer optional.
    ds.spec
        .template
        .spec
        .as_ref()
        .expect("the DaemonSet has a pod spec")
}

/// The `kubernetes.io/arch` values of the pod's one required node affinity
/// term (the architectures it may run on).
pub fn required_architectures(pod: &PodSpec) -> Vec<String> {
    let terms = &pod
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|n| {
            n.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .expect("a required node affinity")
        .node_selector_terms;
    assert_eq!(terms.len(), 1, "{terms:?}");
    let expressions = terms[0].match_expressions.as_deref().unwrap_or_default();
    assert_eq!(expressions.len(), 1, "{expressions:?}");
    assert_eq!(expressions[0].key, "kubernetes.io/arch");
    assert_eq!(expressions[0].operator, "In");
    expressions[0].values.clone().unwrap_or_default()
}

pub fn agent(ds: &DaemonSet) -> &Container {
    let containers = &pod_spec(ds).containers;
    assert_eq!(containers.len(), 1, "one container, the agent");
    &containers[0]
}

pub fn env_value<'a>(c: &'a Container, name: &str) -> &'a str {
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

pub fn name(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

pub fn namespace_of(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or_default()
}

pub fn host_path_volume<'a>(ds: &'a DaemonSet, host: &str) -> &'a Volume {
    pod_spec(ds)
        .volumes
        .iter()
        .flatten()
        .find(|v| v.host_path.as_ref().is_some_and(|h| h.path == host))
        .unwrap_or_else(|| panic!("no hostPath volume for {host}"))
}

pub fn mount_path_of_host_path(ds: &DaemonSet, host: &str) -> String {
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
