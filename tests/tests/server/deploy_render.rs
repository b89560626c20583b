//! `deploy/` and the Helm chart as the real tools render them, for old and
//! new clusters.
//!
//! Two renderings of the node agent exist, and every way of producing one
//! must give exactly one of them, each object parsed into its typed
//! k8s-openapi object (strictly: see deploy_common::typed):
//! - old (any supported cluster, 1.26+): the files of `deploy/`, no mount
//!   with `recursiveReadOnly`. `kubectl kustomize deploy/`; `helm template`
//!   for a cluster before 1.31, or with `recursiveReadOnly=disabled`.
//! - new (1.31+, where the API server keeps the field by default): the same
//!   objects with `recursiveReadOnly: IfPossible` on exactly the mounts
//!   `MOUNTS` marks recursive and nothing else changed. A kustomization
//!   naming `deploy/` and `deploy/components/recursive-read-only` (as
//!   docs/install.md, "Deploy" tells users to write it); `helm template` for
//!   1.31 and newer, or with `recursiveReadOnly=enabled`.
//!
//! The agents' API Priority and Fairness objects are version-dependent in
//! another way (no one apiVersion is served by every supported cluster):
//! deploy/components/flow-control (v1, 1.29+) and flow-control-v1beta3
//! (1.26-1.31) each add exactly their two objects, and the chart renders the
//! one its cluster serves (v1 from 1.29) unless turned off. Every helm
//! rendering below is checked for them and then compared without them.
//!
//! Capabilities some nodes need and others cannot grant (SYS_RESOURCE for
//! kernels before 5.11, SYS_ADMIN for the device-mapper status call) are a
//! Helm value and a Component each, which add exactly that capability.
//!
//! helm and kubectl: HELM_BIN / KUBECTL_BIN, the xtask tools cache, or PATH
//! (`cargo xtask tools` installs them). Whether a real 1.26 API server takes
//! the old rendering and refuses the new one is
//! tests/tests/server/apiserver_deploy.rs (crate health-tests).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::deploy_common;

use deploy_common::agent_objects::{
    agent, by_key, deploy_objects, env_value, mount_path_of_host_path, namespace_of,
    parse_documents, pod_spec, required_architectures, split, without_namespace, Parsed,
    FLOW_CONTROL_V1, FLOW_CONTROL_V1BETA3, MOUNTS,
};
use deploy_common::{chart_dir, deploy_dir, read, run_tool, tool};
use serde_json::Value;

/// The value the new rendering sets on each recursive mount.
const RECURSIVE: &str = "IfPossible";
/// The Component that turns the old rendering into the new one.
const COMPONENT: &str = "components/recursive-read-only";

/// The Components holding the agents' APF objects, by their apiVersion.
const FLOW_CONTROL: [(&str, &str); 2] = [
    (FLOW_CONTROL_V1, "components/flow-control"),
    (FLOW_CONTROL_V1BETA3, "components/flow-control-v1beta3"),
];

type Objects = BTreeMap<(String, String, String), Value>;

fn kustomize(dir: &Path) -> Vec<Parsed> {
    let home = tempfile::tempdir().unwrap();
    let text = run_tool(
        &tool("KUBECTL_BIN", "kubectl"),
        &["kustomize", dir.to_str().unwrap()],
        home.path(),
    );
    parse_documents(&text, &format!("kubectl kustomize {}", dir.display()))
}

/// deploy/ with the Component, through a kustomization of the user's kind
/// (one inside deploy/ cannot name deploy/: kustomize refuses the cycle).
fn kustomize_with_component() -> Vec<Parsed> {
    let user = tempfile::tempdir().unwrap();
    health_tests::k8s_tools::write_kustomization(
        user.path(),
        &[&deploy_dir()],
        &[&deploy_dir().join(COMPONENT)],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    kustomize(user.path())
}

/// The objects of `helm template`, the agents' APF objects checked (they
/// are one of the flow-control Components, or none) and taken out.
fn helm_template(extra: &[&str]) -> Vec<Parsed> {
    let origin = format!("helm template {extra:?}");
    take_flow_control(helm_template_all(extra), &origin).1
}

fn helm_template_all(extra: &[&str]) -> Vec<Parsed> {
    let home = tempfile::tempdir().unwrap();
    let chart = chart_dir();
    let chart = chart.to_str().unwrap();
    // crds/ too: the CRD is part of what deploy/ holds; in deploy/'s
    // namespace unless the caller names another (a later --namespace wins).
    let mut args = vec![
        "template",
        "volume-health",
        chart,
        "--include-crds",
        "--namespace",
        "volume-health",
    ];
    args.extend_from_slice(extra);
    let text = run_tool(&tool("HELM_BIN", "helm"), &args, home.path());
    let objects = parse_documents(&text, &format!("helm template {extra:?}"));
    assert!(
        !objects.iter().any(|p| p.json["kind"] == "Namespace"),
        "helm template {extra:?} makes a Namespace"
    );
    objects
}

/// `helm template` that must fail: its stderr.
fn helm_template_refused(extra: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    let chart = chart_dir();
    let mut args = vec!["template", "volume-health", chart.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = health_tests::k8s_tools::output(&tool("HELM_BIN", "helm"), &args, home.path())
        .unwrap_or_else(|e| panic!("{e:#}"));
    assert!(!out.status.success(), "helm template {extra:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The mount paths that carry recursiveReadOnly (each must say
/// `IfPossible`), and the objects with the field taken out.
fn take_recursive(objects: &[Parsed], origin: &str) -> (BTreeSet<String>, Objects) {
    let mut paths = BTreeSet::new();
    let mut rest = by_key(objects, origin);
    for json in rest.values_mut() {
        // pointer_mut: indexing with [] would insert nulls into other kinds.
        let containers = json
            .pointer_mut("/spec/template/spec/containers")
            .and_then(Value::as_array_mut);
        for container in containers.into_iter().flatten() {
            let mounts = container
                .pointer_mut("/volumeMounts")
                .and_then(Value::as_array_mut);
            for mount in mounts.into_iter().flatten() {
                let path = mount["mountPath"].as_str().unwrap_or_default().to_string();
                let Some(value) = mount.as_object_mut().unwrap().remove("recursiveReadOnly") else {
                    continue;
                };
                assert_eq!(value, RECURSIVE, "{origin}: {path}");
                assert_eq!(mount["readOnly"], true, "{origin}: {path} is not readOnly");
                assert!(paths.insert(path.clone()), "{origin}: {path} twice");
            }
        }
    }
    (paths, rest)
}

/// The two objects of the flow-control Component in `api_version`.
fn flow_control_files(api_version: &str) -> Objects {
    let (_, dir) = FLOW_CONTROL
        .iter()
        .find(|(v, _)| *v == api_version)
        .unwrap_or_else(|| panic!("no Component in {api_version}"));
    let dir = deploy_dir().join(dir);
    let objects: Vec<Parsed> = ["prioritylevel.yaml", "flowschema.yaml"]
        .iter()
        .flat_map(|f| parse_documents(&read(&dir.join(f)), f))
        .collect();
    let objects = by_key(&objects, &dir.display().to_string());
    let kinds: Vec<&str> = objects.keys().map(|(kind, _, _)| kind.as_str()).collect();
    assert_eq!(kinds, ["FlowSchema", "PriorityLevelConfiguration"]);
    objects
}

/// A rendering's APF objects taken out: the apiVersion they are in (None:
/// there are none), after checking they are exactly that version's
/// Component with the FlowSchema naming the rendering's own agent
/// ServiceAccount; and the other objects.
fn take_flow_control(objects: Vec<Parsed>, origin: &str) -> (Option<String>, Vec<Parsed>) {
    let (taken, rest): (Vec<Parsed>, Vec<Parsed>) = objects.into_iter().partition(|p| {
        p.json["apiVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with("flowcontrol.apiserver.k8s.io/"))
    });
    let Some(first) = taken.first() else {
        return (None, rest);
    };
    let version = first.json["apiVersion"].as_str().unwrap().to_string();
    let accounts: Vec<&Value> = rest
        .iter()
        .filter(|p| {
            p.json["kind"] == "ServiceAccount" && p.json["metadata"]["name"] == "volume-health"
        })
        .map(|p| &p.json["metadata"]["namespace"])
        .collect();
    assert_eq!(accounts.len(), 1, "{origin}: the agent's ServiceAccount");
    let agent_namespace = accounts[0].clone();
    let mut expected = flow_control_files(&version);
    for ((kind, _, _), object) in expected.iter_mut() {
        if kind == "FlowSchema" {
            object["spec"]["rules"][0]["subjects"][0]["serviceAccount"]["namespace"] =
                agent_namespace.clone();
        }
    }
    assert_eq!(
        by_key(&taken, origin),
        expected,
        "{origin}: the {version} objects are not the Component's"
    );
    (Some(version), rest)
}

fn files() -> Objects {
    by_key(&deploy_objects(), "deploy/")
}

/// The objects of deploy/, no mount recursively read-only.
fn assert_old(objects: &[Parsed], origin: &str) {
    let (recursive, rest) = take_recursive(objects, origin);
    assert_eq!(
        recursive,
        BTreeSet::new(),
        "{origin}: recursiveReadOnly mounts"
    );
    assert_objects(&rest, origin);
}

/// The objects of deploy/ with recursiveReadOnly on exactly the recursive
/// mounts of MOUNTS.
fn assert_new(objects: &[Parsed], origin: &str) {
    let (recursive, rest) = take_recursive(objects, origin);
    let expected: BTreeSet<String> = MOUNTS
        .iter()
        .filter(|m| m.recursive)
        .map(|m| m.mount.to_string())
        .collect();
    assert_eq!(
        expected.len(),
        4,
        "/host/proc, /sys, /dev and /host/sys/fs/cgroup"
    );
    assert_eq!(recursive, expected, "{origin}: recursiveReadOnly mounts");
    assert_objects(&rest, origin);
}

/// deploy/'s objects, its Namespace aside: the chart leaves that to Helm
/// (the release's namespace; [`helm_template_all`] checks it makes none).
fn assert_objects(rendered: &Objects, origin: &str) {
    let files = without_namespace(files());
    let mut rendered = rendered.clone();
    rendered.remove(&("Namespace".into(), String::new(), "volume-health".into()));
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        files.keys().collect::<Vec<_>>(),
        "{origin}: objects"
    );
    for (key, value) in &files {
        assert_eq!(
            &rendered[key], value,
            "{key:?} differs between {origin} and deploy/"
        );
    }
}

// ---------------------------------------------------------------------------
// kustomize

#[test]
fn kustomize_renders_the_files_unchanged() {
    assert_old(&kustomize(&deploy_dir()), "kubectl kustomize deploy/");
}

#[test]
fn the_component_adds_recursive_read_only_to_exactly_its_mounts() {
    let text = read(&deploy_dir().join(COMPONENT).join("kustomization.yaml"));
    let component: Value = serde_yaml::from_str(&text).unwrap();
    assert_eq!(component["kind"], "Component");
    assert_eq!(component["apiVersion"], "kustomize.config.k8s.io/v1alpha1");
    assert_new(&kustomize_with_component(), "deploy/ + the Component");
}

#[test]
fn a_kustomization_of_the_user_names_deploy_by_relative_paths() {
    let user = tempfile::tempdir().unwrap();
    health_tests::k8s_tools::write_kustomization(
        user.path(),
        &[&deploy_dir()],
        &[&deploy_dir().join(COMPONENT)],
    )
    .unwrap();
    let written: Value =
        serde_yaml::from_str(&read(&user.path().join("kustomization.yaml"))).unwrap();
    let deploy = deploy_dir().canonicalize().unwrap();
    let resolved = |v: &Value| {
        let p = user.path().join(v.as_str().unwrap());
        assert!(v.as_str().unwrap().starts_with("../"), "{v}");
        p.canonicalize().unwrap()
    };
    assert_eq!(written["resources"].as_array().unwrap().len(), 1);
    assert_eq!(resolved(&written["resources"][0]), deploy);
    assert_eq!(written["components"].as_array().unwrap().len(), 1);
    assert_eq!(resolved(&written["components"][0]), deploy.join(COMPONENT));
}

#[test]
fn each_flow_control_component_adds_exactly_its_two_objects() {
    for (version, dir) in FLOW_CONTROL {
        let text = read(&deploy_dir().join(dir).join("kustomization.yaml"));
        let component: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(component["kind"], "Component", "{dir}");
        let user = tempfile::tempdir().unwrap();
        health_tests::k8s_tools::write_kustomization(
            user.path(),
            &[&deploy_dir()],
            &[&deploy_dir().join(dir)],
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
        let origin = format!("deploy/ + {dir}");
        let (found, rest) = take_flow_control(kustomize(user.path()), &origin);
        assert_eq!(found.as_deref(), Some(version), "{origin}");
        assert_old(&rest, &origin);
    }
}

// ---------------------------------------------------------------------------
// helm

#[test]
fn helm_lints_and_renders_deploy_for_each_cluster_version() {
    let home = tempfile::tempdir().unwrap();
    let chart = chart_dir();
    run_tool(
        &tool("HELM_BIN", "helm"),
        &["lint", "--strict", chart.to_str().unwrap()],
        home.path(),
    );
    // 1.30 has the field behind an alpha gate that is off by default: the
    // server would drop it, so it is not sent.
    for version in ["1.26.1", "1.30.0", "v1.30.14+k3s1"] {
        assert_old(
            &helm_template(&["--kube-version", version]),
            &format!("helm template --kube-version {version}"),
        );
    }
    for version in ["1.31.0", "1.33.0", "v1.31.2-eks-7f9249a"] {
        assert_new(
            &helm_template(&["--kube-version", version]),
            &format!("helm template --kube-version {version}"),
        );
    }
    let refused = helm_template_refused(&["--kube-version", "1.25.16"]);
    assert!(
        refused.contains(
            "chart requires kubeVersion: >=1.26.0-0 which is incompatible with Kubernetes v1.25.16"
        ),
        "{refused}"
    );
}

/// Without --kube-version, helm renders for its own client's version.
#[test]
fn helm_renders_for_its_own_kube_version_by_default() {
    let home = tempfile::tempdir().unwrap();
    let version = run_tool(
        &tool("HELM_BIN", "helm"),
        &["version", "--template", "{{.KubeClientVersion}}"],
        home.path(),
    );
    let minor: u32 = version
        .trim()
        .strip_prefix("v1.")
        .and_then(|m| m.split('.').next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("helm's Kubernetes version: {version:?}"));
    let rendered = helm_template(&[]);
    let origin = format!(
        "helm template (helm's default, Kubernetes {})",
        version.trim()
    );
    if minor >= 31 {
        assert_new(&rendered, &origin);
    } else {
        assert_old(&rendered, &origin);
    }
}

#[test]
fn the_recursive_read_only_value_overrides_the_version() {
    assert_new(
        &helm_template(&[
            "--kube-version",
            "1.26.1",
            "--set",
            "recursiveReadOnly=enabled",
        ]),
        "helm template --kube-version 1.26.1 recursiveReadOnly=enabled",
    );
    assert_old(
        &helm_template(&[
            "--kube-version",
            "1.33.0",
            "--set",
            "recursiveReadOnly=disabled",
        ]),
        "helm template --kube-version 1.33.0 recursiveReadOnly=disabled",
    );
    let refused = helm_template_refused(&["--set", "recursiveReadOnly=yes"]);
    assert!(
        refused.contains(
            "at '/recursiveReadOnly': value must be one of 'auto', 'enabled', 'disabled'"
        ),
        "{refused}"
    );
}

/// The agent's added capabilities in one rendering.
fn added_capabilities(objects: &[Parsed], origin: &str) -> Vec<String> {
    let d = split(objects, origin);
    let sc = agent(&d.daemon_set).security_context.clone().unwrap();
    sc.capabilities.unwrap().add.unwrap()
}

/// What every rendering adds by default.
const CAPABILITIES: [&str; 4] = ["BPF", "PERFMON", "DAC_READ_SEARCH", "SYS_NICE"];

/// The Helm values that add one capability each, with the Component that
/// adds the same: SYS_RESOURCE for kernels before 5.11 (RLIMIT_MEMLOCK),
/// SYS_ADMIN for the device-mapper status call.
const CAPABILITY_OPTIONS: [(&str, &str, &str); 2] = [
    ("memlockCapability", "components/memlock", "SYS_RESOURCE"),
    (
        "deviceMapperStatus",
        "components/device-mapper-status",
        "SYS_ADMIN",
    ),
];

/// deploy/ with the Components `dirs` (under deploy/), in that order.
fn kustomize_components(dirs: &[&str]) -> Vec<Parsed> {
    let user = tempfile::tempdir().unwrap();
    let components: Vec<std::path::PathBuf> = dirs.iter().map(|d| deploy_dir().join(d)).collect();
    let components: Vec<&Path> = components.iter().map(|p| p.as_path()).collect();
    health_tests::k8s_tools::write_kustomization(user.path(), &[&deploy_dir()], &components)
        .unwrap_or_else(|e| panic!("{e:#}"));
    kustomize(user.path())
}

#[test]
fn each_capability_option_adds_exactly_its_capability() {
    let files = take_recursive(&kustomize(&deploy_dir()), "deploy/").1;
    assert_eq!(
        added_capabilities(&helm_template(&[]), "helm template"),
        CAPABILITIES
    );
    for (value, component, capability) in CAPABILITY_OPTIONS {
        let with: Vec<&str> = CAPABILITIES.iter().copied().chain([capability]).collect();
        let set = format!("{value}=true");
        let origin = format!("helm template --set {set}");
        let helm = helm_template(&["--set", &set, "--set", "recursiveReadOnly=disabled"]);
        assert_eq!(added_capabilities(&helm, &origin), with);
        let origin = format!("deploy/ + {component}");
        let kustomized = kustomize_components(&[component]);
        assert_eq!(added_capabilities(&kustomized, &origin), with);
        // Nothing else changes, and the value and the Component agree.
        let rendered = without_namespace(take_recursive(&kustomized, &origin).1);
        let differing: Vec<_> = rendered
            .iter()
            .filter(|(k, v)| files.get(*k) != Some(*v))
            .map(|(k, _)| k.clone())
            .collect();
        assert_eq!(differing.len(), 1, "{origin}: {differing:?}");
        assert_eq!(differing[0].0, "DaemonSet", "{origin}");
        assert_eq!(
            take_recursive(&helm, "helm").1,
            rendered,
            "{set} vs {component}"
        );
    }
    // Both, in the order of the list.
    let all: Vec<&str> = CAPABILITIES
        .iter()
        .copied()
        .chain(CAPABILITY_OPTIONS.map(|(_, _, c)| c))
        .collect();
    let helm = helm_template(&["--set", "memlockCapability=true,deviceMapperStatus=true"]);
    assert_eq!(added_capabilities(&helm, "helm template --set both"), all);
    let kustomized = kustomize_components(&CAPABILITY_OPTIONS.map(|(_, c, _)| c));
    assert_eq!(added_capabilities(&kustomized, "both Components"), all);
}

#[test]
fn helm_values_change_what_they_claim_to() {
    let objects = helm_template(&[
        "--set",
        "privileged=true",
        "--set",
        "extraArgs={--flush-errors,--event-writes-per-minute=10}",
        "--namespace",
        "storage-watch",
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
    let selector: Vec<(&str, &str)> = selector
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(selector, [("disk", "ssd"), ("kubernetes.io/os", "linux")]);
    assert_eq!(required_architectures(pod_spec(ds)), ["amd64", "arm64"]);
    assert!(d.namespace.is_none(), "the chart makes no Namespace");
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
    // Without the Service, the rest stays.
    let fewer = helm_template(&["--set", "metrics.service=false"]);
    let kinds: BTreeSet<String> = fewer.iter().map(|p| p.key().0).collect();
    let expected: BTreeSet<String> = [
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "DaemonSet",
        "ServiceAccount",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds, expected);
}

/// The FlowSchema of a rendering, as JSON.
fn flow_schema(objects: &[Parsed]) -> Value {
    let schemas: Vec<&Parsed> = objects
        .iter()
        .filter(|p| p.json["kind"] == "FlowSchema")
        .collect();
    assert_eq!(schemas.len(), 1, "one FlowSchema");
    schemas[0].json.clone()
}

#[test]
fn helm_renders_the_flow_control_objects_in_the_clusters_api_version() {
    // v1 is served from 1.29, v1beta3 from 1.26 until 1.31. helm template's
    // own API list has both whatever the version, so the version decides.
    for (version, expected) in [
        ("1.26.1", FLOW_CONTROL_V1BETA3),
        ("1.28.15", FLOW_CONTROL_V1BETA3),
        ("v1.28.3-eks-4f4795d", FLOW_CONTROL_V1BETA3),
        ("1.29.0", FLOW_CONTROL_V1),
        ("1.31.0", FLOW_CONTROL_V1),
        ("1.33.0", FLOW_CONTROL_V1),
        ("v1.30.14+k3s1", FLOW_CONTROL_V1),
    ] {
        let origin = format!("helm template --kube-version {version}");
        let (found, _) =
            take_flow_control(helm_template_all(&["--kube-version", version]), &origin);
        assert_eq!(found.as_deref(), Some(expected), "{origin}");
    }
    // The switch: none at all, the rest unchanged.
    for version in ["1.26.1", "1.33.0"] {
        let origin =
            format!("helm template --kube-version {version} priorityAndFairness.enabled=false");
        let objects = helm_template_all(&[
            "--kube-version",
            version,
            "--set",
            "priorityAndFairness.enabled=false",
        ]);
        let (found, rest) = take_flow_control(objects, &origin);
        assert_eq!(found, None, "{origin}");
        assert_eq!(
            by_key(&rest, &origin),
            by_key(&helm_template(&["--kube-version", version]), &origin),
            "{origin}"
        );
    }
    // The subject follows the agents' namespace.
    let fs = flow_schema(&helm_template_all(&[
        "--kube-version",
        "1.29.0",
        "--namespace",
        "storage-watch",
    ]));
    assert_eq!(
        fs["spec"]["rules"][0]["subjects"],
        serde_json::json!([{"kind": "ServiceAccount",
            "serviceAccount": {"name": "volume-health", "namespace": "storage-watch"}}])
    );
}

/// values.schema.json: a value the chart does not have, or one of the
/// wrong type, fails the render with the value named, instead of being
/// ignored (Helm validates values against the schema on install, upgrade,
/// lint and template).
#[test]
fn an_unknown_or_mistyped_value_is_refused() {
    let unknown = helm_template_refused(&["--set", "image.tagg=1.2.3"]);
    assert!(
        unknown.contains("at '/image': additional properties 'tagg' not allowed"),
        "{unknown}"
    );
    let mistyped = helm_template_refused(&["--set", "metrics.port=nine"]);
    assert!(
        mistyped.contains("at '/metrics/port': got string, want integer"),
        "{mistyped}"
    );
    let outside = helm_template_refused(&["--set", "image.pullPolicy=Sometimes"]);
    assert!(
        outside.contains(
            "at '/image/pullPolicy': value must be one of 'Always', 'IfNotPresent', 'Never'"
        ),
        "{outside}"
    );
    let arch = helm_template_refused(&["--set", "architectures={amd64,riscv64}"]);
    assert!(
        arch.contains("at '/architectures/1': value must be one of 'amd64', 'arm64'"),
        "{arch}"
    );
    let none = helm_template_refused(&["--set", "architectures=null"]);
    assert!(
        none.contains("architectures: the node architectures the agent runs on (amd64, arm64)"),
        "{none}"
    );
    // `{}` is Helm's list of one empty string.
    let empty = helm_template_refused(&["--set", "architectures={}"]);
    assert!(
        empty.contains("at '/architectures/0': value must be one of 'amd64', 'arm64'"),
        "{empty}"
    );
}

/// `architectures` keeps the agent off the nodes it leaves out.
#[test]
fn the_architectures_value_is_the_pods_required_node_affinity() {
    let objects = helm_template_all(&["--set", "architectures={arm64}"]);
    let d = split(&objects, "helm template --set architectures={arm64}");
    assert_eq!(required_architectures(pod_spec(&d.daemon_set)), ["arm64"]);
}
