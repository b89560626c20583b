//! The CSI proxy's deployment (docs/controller.md, "CSI proxy"), as kustomize and helm
//! render it:
//! - `deploy/components/csi-proxy`: the agent's DaemonSet gains its
//!   conditions socket (an env variable, a mount, a host directory) and
//!   nothing else changes;
//! - the chart's `csiProxy.enabled` renders exactly that, and its notes give
//!   `node-plugin.yaml`, the driver-side patch;
//! - `node-plugin.yaml` and `example-hostpath/`: the proxy listens where
//!   the registrar tells the kubelet to connect, reaches the driver's socket
//!   and the agent's, and the example for csi-driver-host-path is the
//!   generic sidecar plus that registrar.
//!
//! helm and kubectl: HELM_BIN / KUBECTL_BIN, the xtask tools cache, or PATH.

use crate::deploy_common;

use std::collections::BTreeMap;
use std::path::Path;

use deploy_common::agent_objects::{
    by_key, deploy_objects, parse_documents, without_namespace, Parsed, DAEMON_SET,
};
use deploy_common::{chart_dir, deploy_dir, read, run_tool, tool, typed, yaml_documents};
use health_node::conditions_socket::DEFAULT_SOCKET;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Container, Volume};
use serde_json::{json, Value};

const COMPONENT: &str = "components/csi-proxy";
/// The host directory both pods share.
const SOCKET_DIR: &str = "/run/volume-health";

type Objects = BTreeMap<(String, String, String), Value>;

fn component_dir() -> std::path::PathBuf {
    deploy_dir().join(COMPONENT)
}

fn kustomize(dir: &Path) -> Vec<Parsed> {
    let home = tempfile::tempdir().unwrap();
    let text = run_tool(
        &tool("KUBECTL_BIN", "kubectl"),
        &["kustomize", dir.to_str().unwrap()],
        home.path(),
    );
    parse_documents(&text, &format!("kubectl kustomize {}", dir.display()))
}

/// deploy/ with the component, as a user's kustomization names them.
fn kustomize_with_component() -> Objects {
    let user = tempfile::tempdir().unwrap();
    health_tests::k8s_tools::write_kustomization(
        user.path(),
        &[&deploy_dir()],
        &[&component_dir()],
    )
    .unwrap_or_else(|e| panic!("{e:#}"));
    without_namespace(by_key(&kustomize(user.path()), "deploy/ + csi-proxy"))
}

fn daemon_set_key() -> (String, String, String) {
    (
        "DaemonSet".into(),
        "volume-health".into(),
        DAEMON_SET.into(),
    )
}

/// deploy/'s DaemonSet with the socket added as the component adds it.
fn with_socket(mut ds: Value, dir: &str) -> Value {
    let pod = &mut ds["spec"]["template"]["spec"];
    let agent = &mut pod["containers"][0];
    agent["env"].as_array_mut().unwrap().push(
        json!({"name": "HEALTH_VOLUME_HEALTH_SOCKET", "value": format!("{dir}/conditions.sock")}),
    );
    agent["volumeMounts"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "volume-health-run", "mountPath": dir}));
    pod["volumes"].as_array_mut().unwrap().push(
        json!({"name": "volume-health-run", "hostPath": {"path": dir, "type": "DirectoryOrCreate"}}),
    );
    ds
}

#[test]
fn the_component_gives_the_agent_its_socket_and_changes_nothing_else() {
    let files = without_namespace(by_key(&deploy_objects(), "deploy/"));
    let rendered = kustomize_with_component();
    let mut want = files.clone();
    let ds = want.remove(&daemon_set_key()).unwrap();
    want.insert(daemon_set_key(), with_socket(ds, SOCKET_DIR));
    assert_eq!(rendered, want);
    // Where the proxy asks by default.
    assert_eq!(DEFAULT_SOCKET, format!("{SOCKET_DIR}/conditions.sock"));
}

fn helm(args: &[&str]) -> String {
    let home = tempfile::tempdir().unwrap();
    run_tool(&tool("HELM_BIN", "helm"), args, home.path())
}

fn helm_template(values: &[&str]) -> Objects {
    let chart = chart_dir();
    // Before 1.31: the rendering of deploy/ without recursiveReadOnly; and
    // without the API Priority and Fairness objects (deploy_render.rs's).
    let mut args = vec![
        "template",
        "volume-health",
        chart.to_str().unwrap(),
        "--include-crds",
        "--namespace",
        "volume-health",
        "--kube-version",
        "1.30.0",
        "--set",
        "priorityAndFairness.enabled=false",
    ];
    for v in values {
        args.extend(["--set", v]);
    }
    by_key(
        &parse_documents(&helm(&args), "helm template"),
        "helm template",
    )
}

#[test]
fn helm_renders_the_component_on_request() {
    let chart = chart_dir();
    helm(&[
        "lint",
        "--strict",
        chart.to_str().unwrap(),
        "--set",
        "csiProxy.enabled=true",
    ]);
    assert_eq!(
        helm_template(&["csiProxy.enabled=true"]),
        kustomize_with_component()
    );
    assert_eq!(
        helm_template(&[]),
        without_namespace(by_key(&deploy_objects(), "deploy/"))
    );
    let moved = helm_template(&["csiProxy.enabled=true", "csiProxy.socketDir=/var/run/vh"]);
    let ds = by_key(&deploy_objects(), "deploy/")
        .remove(&daemon_set_key())
        .unwrap();
    assert_eq!(moved[&daemon_set_key()], with_socket(ds, "/var/run/vh"));
}

/// The patch in the release notes (`helm install --dry-run=client`).
fn helm_notes_patch(values: &[&str]) -> Value {
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
        .split_once("# --- node-plugin.yaml ---\n")
        .and_then(|(_, rest)| rest.split_once("# --- end ---"))
        .unwrap_or_else(|| panic!("no node-plugin patch in the notes:\n{notes}"))
        .0;
    let docs = yaml_documents(patch, "NOTES.txt");
    assert_eq!(docs.len(), 1, "{patch}");
    docs[0].clone()
}

fn file_patch(relative: &str) -> Value {
    let docs = yaml_documents(&read(&component_dir().join(relative)), relative);
    assert_eq!(docs.len(), 1, "{relative}: one document");
    docs[0].clone()
}

#[test]
fn helm_notes_give_the_node_plugin_patch_of_deploy() {
    assert_eq!(
        helm_notes_patch(&["csiProxy.enabled=true"]),
        file_patch("node-plugin.yaml")
    );
    let moved = helm_notes_patch(&["csiProxy.enabled=true", "csiProxy.socketDir=/var/run/vh"]);
    let spec = &moved["spec"]["template"]["spec"];
    assert_eq!(
        spec["containers"][0]["env"][2]["value"],
        "/var/run/vh/conditions.sock"
    );
    assert_eq!(
        spec["containers"][0]["volumeMounts"][1]["mountPath"],
        "/var/run/vh"
    );
    assert_eq!(spec["volumes"][0]["hostPath"]["path"], "/var/run/vh");
}

fn env<'a>(c: &'a Container, name: &str) -> &'a str {
    c.env
        .iter()
        .flatten()
        .find(|e| e.name == name)
        .and_then(|e| e.value.as_deref())
        .unwrap_or_else(|| panic!("{}: no env {name}", c.name))
}

fn mount_path<'a>(c: &'a Container, volume: &str) -> &'a str {
    &c.volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == volume)
        .unwrap_or_else(|| panic!("{}: no mount of {volume}", c.name))
        .mount_path
}

/// The generic patch's one container and its volumes, typed.
fn generic_sidecar() -> (Container, Vec<Volume>) {
    let patch = file_patch("node-plugin.yaml");
    let spec = &patch["spec"]["template"]["spec"];
    assert_eq!(
        patch.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["spec"],
        "a patch naming no object"
    );
    let containers: Vec<Container> = typed(&spec["containers"], "node-plugin.yaml");
    let volumes: Vec<Volume> = typed(&spec["volumes"], "node-plugin.yaml");
    assert_eq!(containers.len(), 1);
    (containers[0].clone(), volumes)
}

#[test]
fn the_proxy_reaches_the_driver_and_the_agent_where_they_are() {
    let (proxy, volumes) = generic_sidecar();
    assert_eq!(proxy.name, "volume-health-csi-proxy");
    assert_eq!(proxy.args, Some(vec!["csi-proxy".to_string()]));
    // The driver's socket and the proxy's own, both in the driver's socket
    // directory; the proxy's one level down.
    assert_eq!(mount_path(&proxy, "socket-dir"), "/csi");
    assert_eq!(env(&proxy, "CSI_ADDRESS"), "/csi/csi.sock");
    assert_eq!(
        env(&proxy, "CSI_PROXY_ADDRESS"),
        "/csi/volume-health/csi.sock"
    );
    // The agent's socket, in the host directory the component gives the
    // agent, read-only here.
    assert_eq!(env(&proxy, "HEALTH_VOLUME_HEALTH_SOCKET"), DEFAULT_SOCKET);
    let mount = proxy
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.name == "volume-health-run")
        .unwrap();
    assert_eq!(
        (mount.mount_path.as_str(), mount.read_only),
        (SOCKET_DIR, Some(true))
    );
    assert_eq!(
        serde_json::to_value(&volumes).unwrap(),
        json!([{"name": "volume-health-run", "hostPath": {"path": SOCKET_DIR, "type": "DirectoryOrCreate"}}])
    );
    // Root without a capability, read-only root filesystem.
    let security = proxy.security_context.unwrap();
    assert_eq!(security.run_as_user, Some(0));
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(
        security.capabilities.unwrap().drop,
        Some(vec!["ALL".to_string()])
    );
    assert_eq!(security.privileged, None);
}

/// csi-driver-host-path's node plugin as upstream deploys it
/// (deploy/kubernetes-1.34/hostpath/csi-hostpath-plugin.yaml), the parts
/// the example touches.
fn hostpath_statefulset() -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "csi-hostpathplugin", "namespace": "default"},
        "spec": {
            "serviceName": "csi-hostpathplugin",
            "selector": {"matchLabels": {"app.kubernetes.io/name": "csi-hostpathplugin"}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/name": "csi-hostpathplugin"}},
                "spec": {
                    "containers": [
                        {"name": "hostpath", "image": "registry.k8s.io/sig-storage/hostpathplugin:v1.17.1",
                         "env": [{"name": "CSI_ENDPOINT", "value": "unix:///csi/csi.sock"}],
                         "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"}]},
                        {"name": "node-driver-registrar",
                         "image": "registry.k8s.io/sig-storage/csi-node-driver-registrar:v2.17.0",
                         "args": ["--v=5", "--csi-address=/csi/csi.sock",
                                  "--kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/csi.sock",
                                  "--http-endpoint=:9809"],
                         "securityContext": {"privileged": true},
                         "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"},
                                          {"name": "registration-dir", "mountPath": "/registration"}]},
                    ],
                    "volumes": [
                        {"name": "socket-dir", "hostPath": {"path": "/var/lib/kubelet/plugins/csi-hostpath", "type": "DirectoryOrCreate"}},
                        {"name": "registration-dir", "hostPath": {"path": "/var/lib/kubelet/plugins_registry", "type": "Directory"}},
                    ],
                },
            },
        },
    })
}

#[test]
fn the_hostpath_example_is_the_sidecar_and_a_registrar_naming_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("driver.yaml"),
        hostpath_statefulset().to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("patch.yaml"),
        read(&component_dir().join("example-hostpath/node-plugin.yaml")),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        "resources: [driver.yaml]\npatches:\n  - path: patch.yaml\n",
    )
    .unwrap();
    let home = tempfile::tempdir().unwrap();
    let text = run_tool(
        &tool("KUBECTL_BIN", "kubectl"),
        &["kustomize", dir.path().to_str().unwrap()],
        home.path(),
    );
    let docs = yaml_documents(&text, "kustomize hostpath");
    assert_eq!(docs.len(), 1);
    let rendered: StatefulSet = typed(&docs[0], "kustomize hostpath");

    // Expected: upstream's, with the registrar's path moved to the proxy,
    // the generic sidecar and its volume added.
    let (sidecar, volumes) = generic_sidecar();
    let mut want = hostpath_statefulset();
    let spec = &mut want["spec"]["template"]["spec"];
    spec["containers"][1]["args"][2] = json!(
        "--kubelet-registration-path=/var/lib/kubelet/plugins/csi-hostpath/volume-health/csi.sock"
    );
    spec["containers"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::to_value(&sidecar).unwrap());
    spec["volumes"]
        .as_array_mut()
        .unwrap()
        .extend(volumes.iter().map(|v| serde_json::to_value(v).unwrap()));
    let mut rendered_json = serde_json::to_value(&rendered).unwrap();
    // kustomize orders what it merged its own way; compare containers and
    // volumes by name.
    let by_name = |v: &mut Value| {
        for list in ["containers", "volumes"] {
            v["spec"]["template"]["spec"][list]
                .as_array_mut()
                .unwrap()
                .sort_by_key(|c| c["name"].as_str().unwrap().to_string());
        }
    };
    by_name(&mut rendered_json);
    by_name(&mut want);
    assert_eq!(rendered_json, want);

    // The registrar tells the kubelet the file the proxy listens on: the
    // socket directory's host path plus the proxy's place in it.
    let pod = rendered.spec.template.spec.unwrap();
    let host_dir = pod
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "socket-dir")
        .and_then(|v| v.host_path.as_ref())
        .unwrap()
        .path
        .clone();
    let proxy = pod
        .containers
        .iter()
        .find(|c| c.name == sidecar.name)
        .unwrap();
    let in_pod = env(proxy, "CSI_PROXY_ADDRESS");
    let on_host = in_pod.replacen(mount_path(proxy, "socket-dir"), &host_dir, 1);
    let registrar = pod
        .containers
        .iter()
        .find(|c| c.name == "node-driver-registrar")
        .unwrap();
    let registration: Vec<&String> = registrar
        .args
        .iter()
        .flatten()
        .filter(|a| a.starts_with("--kubelet-registration-path="))
        .collect();
    assert_eq!(
        registration,
        [&format!("--kubelet-registration-path={on_host}")]
    );
    // And the proxy forwards to the socket the driver serves.
    assert_eq!(env(proxy, "CSI_ADDRESS"), "/csi/csi.sock");
    let driver = pod
        .containers
        .iter()
        .find(|c| c.name == "hostpath")
        .unwrap();
    assert_eq!(env(driver, "CSI_ENDPOINT"), "unix:///csi/csi.sock");
}
