//! The deployment contract: what `deploy/` and the Helm chart give the agent
//! is exactly what the code needs.
//!
//! Every manifest in `deploy/` is parsed into its typed k8s-openapi object;
//! a document whose kind is not expected fails, and so does one with a field
//! the type does not know (the typed object is serialized again and must
//! equal the document, so a misspelt key cannot be dropped silently).
//!
//! The Helm chart is read as text here, without any tool: every object of
//! `deploy/` is named in the templates, the fixed lines that matter (RBAC
//! rules, capabilities, mounts, env) are literally there, and `values.yaml`
//! holds the values `deploy/` uses. Rendering it, and the kustomizations,
//! with the real tools is deploy_render.rs.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use crate::deploy_common;

use deploy_common::agent_objects::{
    agent, by_key, deploy, deploy_objects, env_value, manifest_files, mount_path_of_host_path,
    name, namespace_of, parse_documents, pod_spec, required_architectures, CLUSTER_ROLE,
    DAEMON_SET, IMAGE, METRICS_SERVICE, MOUNTS, NAMESPACE, SERVICE_ACCOUNT, STATE_DIR,
};
use deploy_common::{chart_dir, deploy_dir, json, read};
use health_node::cluster::API_ACCESS;
use k8s_openapi::api::core::v1::{Probe, Volume};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde_json::Value;

/// The default of `health-agent run --metrics-addr` (env HEALTH_METRICS_ADDR).
/// Keep in sync with the CLI in src/main.rs.
const DEFAULT_METRICS_ADDR: &str = "0.0.0.0:9808";
const METRICS_PORT_NAME: &str = "metrics";

/// The capabilities deploy/daemonset.yaml documents, one by one. Not
/// SYS_RESOURCE: only kernels before 5.11 need it, on request (the Helm
/// value memlockCapability, deploy/components/memlock; deploy_render.rs).
const CAPABILITIES: [&str; 4] = ["BPF", "PERFMON", "DAC_READ_SEARCH", "SYS_NICE"];

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
        k(
            "CustomResourceDefinition",
            "",
            "volumehealths.volume-health.io",
        ),
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
    let mut named: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for rule in d.role.rules.iter().flatten() {
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
                if let Some(names) = &rule.resource_names {
                    named.insert((g.clone(), r.clone()), names.clone());
                }
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
    // Restricted to the same objects by name (the agent's own DaemonSet).
    let needed_names: BTreeMap<(String, String), Vec<String>> = API_ACCESS
        .iter()
        .filter(|a| !a.names.is_empty())
        .map(|a| {
            let names = a.names.iter().map(|n| n.to_string()).collect();
            ((a.group.to_string(), a.resource.to_string()), names)
        })
        .collect();
    assert_eq!(named, needed_names);
    // One rule per API_ACCESS entry, so the manifest reads like the code.
    assert_eq!(d.role.rules.as_ref().map_or(0, Vec::len), API_ACCESS.len());
}

#[test]
fn the_binding_gives_the_role_to_the_service_account() {
    let d = deploy();
    let namespace = d.namespace.expect("deploy/ has its namespace");
    assert_eq!(name(&namespace.metadata), NAMESPACE);
    let labels = namespace.metadata.labels.clone().unwrap_or_default();
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
        (
            r.api_group.as_deref().unwrap_or_default(),
            r.kind.as_str(),
            r.name.as_str()
        ),
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
    let spec = &ds.spec;
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
    assert_eq!(
        env_value(c, "HEALTH_HOST_CGROUP"),
        mount_of("/sys/fs/cgroup")
    );
    // tracefs where the agent (<host-sys>/kernel/tracing) and aya look.
    assert_eq!(
        mount_of("/sys/kernel/tracing"),
        format!("{}/kernel/tracing", env_value(c, "HEALTH_HOST_SYS"))
    );
    // The kubelet root at its host path: mount points in the host's
    // mountinfo are paths the agent can use as they are.
    assert_eq!(env_value(c, "HEALTH_KUBELET_ROOT"), "/var/lib/kubelet");
    assert_eq!(mount_of("/var/lib/kubelet"), "/var/lib/kubelet");
    assert_eq!(env_value(c, "HEALTH_STATE_DIR"), STATE_DIR);
    assert_eq!(mount_of(STATE_DIR), STATE_DIR);
    assert_eq!(env_value(c, "HEALTH_METRICS_ADDR"), DEFAULT_METRICS_ADDR);
    assert_eq!(env_value(c, "HEALTH_LOG"), "info");
    // Its own DaemonSet, by its namespace (the downward API, which
    // kubectl's and kustomize's namespace changes follow) and name.
    let namespace = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "POD_NAMESPACE")
        .and_then(|e| e.value_from.as_ref())
        .and_then(|v| v.field_ref.as_ref())
        .expect("POD_NAMESPACE comes from a fieldRef");
    assert_eq!(namespace.field_path, "metadata.namespace");
    assert_eq!(
        env_value(c, "HEALTH_DAEMONSET"),
        format!("$(POD_NAMESPACE)/{}", health_node::cluster::DAEMONSET_NAME)
    );
    assert_eq!(name(&ds.metadata), health_node::cluster::DAEMONSET_NAME);
    let names: Vec<&str> = c.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "NODE_NAME",
            "POD_NAMESPACE",
            "HEALTH_DAEMONSET",
            "HEALTH_HOST_PROC",
            "HEALTH_HOST_SYS",
            "HEALTH_HOST_CGROUP",
            "HEALTH_KUBELET_ROOT",
            "HEALTH_STATE_DIR",
            "HEALTH_METRICS_ADDR",
            "HEALTH_LOG"
        ]
    );
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
        // The agent's state directory is the one made if missing (a new
        // node has none); every other must be there.
        let type_ = if host.path == STATE_DIR {
            "DirectoryOrCreate"
        } else {
            "Directory"
        };
        assert_eq!(host.type_.as_deref(), Some(type_), "{}", m.name);
        // Every supported API server must take these files: recursive
        // read-only mounts come from deploy/components/recursive-read-only
        // (deploy_render.rs checks where it puts them).
        assert_eq!(m.recursive_read_only, None, "{}", m.name);
        seen.push((
            host.path.clone(),
            m.mount_path.clone(),
            m.read_only == Some(true),
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
    // The agent's preflight (kernel/probes) accepts BPF + PERFMON instead of
    // SYS_ADMIN; SYS_RESOURCE is asked for only where kernels need it.
    assert!(!added
        .iter()
        .any(|c| c == "SYS_ADMIN" || c == "SYS_RESOURCE" || c == "ALL"));
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
        .template
        .metadata
        .as_ref()
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
        .template
        .metadata
        .as_ref()
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
    let out = Command::new(health_tests::agent::agent_bin().expect("the agent binary"))
        .args(args)
        .arg("--help")
        // Set values would show up in the help text instead of the names.
        .env_remove("HEALTH_HOST_PROC")
        .env_remove("HEALTH_HOST_SYS")
        .env_remove("HEALTH_HOST_CGROUP")
        .env_remove("HEALTH_LOG")
        .env_remove("HEALTH_KUBELET_ROOT")
        .env_remove("HEALTH_STATE_DIR")
        .env_remove("HEALTH_METRICS_ADDR")
        .env_remove("NODE_NAME")
        .env_remove("HEALTH_DAEMONSET")
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
        "HEALTH_HOST_CGROUP",
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
fn the_run_command_reads_node_name_the_state_dir_and_the_metrics_address() {
    let help = agent_help(&["run"]);
    assert!(help.contains("[env: NODE_NAME="), "{help}");
    assert!(help.contains("[env: HEALTH_STATE_DIR="), "{help}");
    assert!(help.contains("[env: HEALTH_DAEMONSET="), "{help}");
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
        if kind == "CustomResourceDefinition" {
            // In crds/, not templates/: deploy_status.rs checks it is the same file.
            continue;
        }
        if kind == "Namespace" {
            // The release's namespace, which Helm makes (--create-namespace).
            assert!(!has("kind: Namespace\n"), "a Namespace in the chart");
            continue;
        }
        assert!(has(&format!("kind: {kind}\n")), "no {kind} in the chart");
        assert!(
            has(&format!("  name: {name}\n")),
            "no {kind} {name} in the chart"
        );
    }
    let chart_rules = rules_block(&read(&chart_dir().join("templates/clusterrole.yaml")));
    assert_eq!(
        chart_rules,
        rules_block(&read(&deploy_dir().join("clusterrole.yaml")))
    );
    assert!(chart_rules.len() > API_ACCESS.len());
    // The optional capabilities follow the list on lines of their own
    // (deploy_render.rs renders each way).
    let caps = CAPABILITIES.map(|c| format!("{c:?}")).join(", ");
    assert!(has(&format!("add: [{caps}\n")), "capabilities differ");
    assert!(has("drop: [\"ALL\"]\n"));
    assert!(has("privileged: false\n") && has("allowPrivilegeEscalation: false\n"));
    assert!(has("readOnlyRootFilesystem: true\n") && has("runAsUser: 0\n"));
    for m in MOUNTS {
        // The kubelet root and the state directory are values (checked
        // against values.yaml below).
        if m.host != "/var/lib/kubelet" && m.host != STATE_DIR {
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
        "POD_NAMESPACE",
        "HEALTH_DAEMONSET",
        "HEALTH_HOST_PROC",
        "HEALTH_HOST_SYS",
        "HEALTH_HOST_CGROUP",
        "HEALTH_KUBELET_ROOT",
        "HEALTH_STATE_DIR",
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
    // The namespace is the release's (helm install -n), no value.
    assert_eq!(values.get("namespace"), None);
    assert_eq!(values["metrics"]["port"], metrics_port());
    assert_eq!(values["metrics"]["service"], true);
    assert_eq!(values["kubeletRoot"], env_value(c, "HEALTH_KUBELET_ROOT"));
    assert_eq!(values["stateDir"], env_value(c, "HEALTH_STATE_DIR"));
    assert_eq!(values["logLevel"], env_value(c, "HEALTH_LOG"));
    assert_eq!(values["extraArgs"], serde_json::json!([]));
    assert_eq!(values["privileged"], false);
    assert_eq!(values["memlockCapability"], false);
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
    assert_eq!(values["nodeSelector"], json(&pod.node_selector));
    assert_eq!(
        values["nodeSelector"],
        serde_json::json!({"kubernetes.io/os": "linux"})
    );
    assert_eq!(
        values["architectures"],
        serde_json::json!(required_architectures(pod))
    );
    assert_eq!(required_architectures(pod), ["amd64", "arm64"]);
}

/// docs/install.md's "Chart values" table lists every value of values.yaml
/// once, with its default: a value added to the chart and not documented,
/// or documented with another default, fails here. A value is a leaf of
/// values.yaml, but for maps given whole (resources, selectors, labels, a
/// security context) and each alert's settings under `monitoring.rules`.
#[test]
fn the_install_guide_documents_every_chart_value_with_its_default() {
    const WHOLE: [&str; 8] = [
        "resources",
        "nodeSelector",
        "seccompProfile",
        "securityContext",
        "labels",
        "annotations",
        "additionalLabels",
        "selector",
    ];
    fn walk(v: &Value, prefix: &str, out: &mut BTreeMap<String, Value>) {
        let Some(map) = v.as_object() else { return };
        for (k, val) in map {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            let whole = !val.is_object()
                || WHOLE.contains(&k.as_str())
                || val.as_object().is_some_and(|m| m.is_empty())
                || prefix == "monitoring.rules";
            if whole {
                out.insert(path, val.clone());
            } else {
                walk(val, &path, out);
            }
        }
    }
    let mut values = BTreeMap::new();
    walk(&chart_values(), "", &mut values);

    let guide = read(&deploy_dir().join("../docs/install.md"));
    let section = guide
        .split("### Chart values\n")
        .nth(1)
        .expect("install.md has a Chart values section");
    let mut documented = BTreeMap::new();
    for line in section.lines().take_while(|l| !l.starts_with('#')) {
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let cells: Vec<&str> = row.splitn(3, " | ").collect();
        let path = cells[0].trim_end_matches('`').to_string();
        let default = cells
            .get(1)
            .and_then(|d| d.strip_prefix('`'))
            .and_then(|d| d.strip_suffix('`'))
            .unwrap_or_else(|| panic!("no default for {path}: {line}"));
        let default: Value = serde_json::from_str(default)
            .unwrap_or_else(|e| panic!("{path}'s default {default:?}: {e}"));
        assert!(
            documented.insert(path.clone(), default).is_none(),
            "{path} twice"
        );
    }
    let names = |m: &BTreeMap<String, Value>| m.keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(&documented), names(&values), "the values documented");
    assert_eq!(documented, values, "their defaults");
}
