//! The VolumeHealth CRD and the admission policies of deploy/, offline: the
//! chart ships the same CRD, it names what the agent writes, and the
//! admission-policy Component renders and holds exactly the ServiceAccount
//! the manifests create. (What the server makes of them:
//! tests/tests/server/apiserver_status.rs.)

use crate::deploy_common;

use deploy_common::agent_objects::{parse_documents, Object};
use deploy_common::{chart_dir, deploy_dir, read, tool};

#[test]
fn the_crd_is_the_charts_and_names_what_the_agent_writes() {
    use health_kube::status::types::{GROUP, KIND, PLURAL, VERSION};
    let file = read(&deploy_dir().join("volumehealth-crd.yaml"));
    assert_eq!(
        read(&chart_dir().join("crds/volumehealths.yaml")),
        file,
        "the chart's crds/volumehealths.yaml must be deploy/volumehealth-crd.yaml"
    );
    let crd = parse_documents(&file, "volumehealth-crd.yaml");
    let Object::Crd(crd) = &crd[0].object else {
        panic!("not a CRD")
    };
    assert_eq!(crd.spec.group, GROUP);
    assert_eq!(crd.spec.names.kind, KIND);
    assert_eq!(crd.spec.names.plural, PLURAL);
    assert_eq!(crd.spec.scope, "Namespaced");
    let versions: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(versions, [VERSION]);
    let columns: Vec<(&str, &str)> = crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.as_str(), c.json_path.as_str()))
        .collect();
    assert_eq!(
        columns,
        [
            ("PVC", ".spec.persistentVolumeClaimName"),
            ("Status", ".status.health"),
            ("Reason", ".status.reason"),
            ("Since", ".status.since"),
            ("Nodes", ".status.nodes"),
            ("PV", ".spec.persistentVolumeName"),
        ]
    );
}

#[test]
fn the_admission_policy_component_names_the_agents_service_account() {
    let dir = deploy_dir().join("components/admission-policy");
    let kustomization = read(&dir.join("kustomization.yaml"));
    assert!(kustomization.contains("kind: Component"), "{kustomization}");
    let user = "system:serviceaccount:volume-health:volume-health";
    for f in ["volumehealth-policy.yaml", "pvc-label-policy.yaml"] {
        let text = read(&dir.join(f));
        let docs = deploy_common::yaml_documents(&text, f);
        assert_eq!(docs.len(), 1, "{f}");
        assert_eq!(
            docs[0]["apiVersion"], "admissionregistration.k8s.io/v1",
            "{f}"
        );
        assert_eq!(docs[0]["spec"]["failurePolicy"], "Fail", "{f}");
        for v in docs[0]["spec"]["validations"]
            .as_array()
            .expect("validations")
        {
            let e = v["expression"].as_str().expect("expression");
            assert!(
                e.starts_with(&format!("request.userInfo.username != '{user}' ||")),
                "{f}: every rule applies to the agent only: {e}"
            );
        }
    }
    // The ServiceAccount the policies name is the one deploy/ binds.
    let sa = read(&deploy_dir().join("serviceaccount.yaml"));
    assert!(
        sa.contains("name: volume-health\n") && sa.contains("namespace: volume-health\n"),
        "{sa}"
    );
    let rendered = deploy_common::run_tool(
        &tool("KUBECTL_BIN", "kubectl"),
        &["kustomize", dir.to_str().unwrap()],
        tempfile::tempdir().unwrap().path(),
    );
    assert!(rendered.is_empty() || rendered.contains("ValidatingAdmissionPolicy"));
}

#[test]
fn the_chart_renders_the_components_policies_on_request_only() {
    let chart = chart_dir();
    let helm = |extra: &[&str]| {
        // deploy/'s namespace, unless a later --namespace says another.
        let mut args = vec![
            "template",
            "volume-health",
            chart.to_str().unwrap(),
            "--namespace",
            "volume-health",
        ];
        args.extend_from_slice(extra);
        deploy_common::try_run_tool(
            &tool("HELM_BIN", "helm"),
            &args,
            tempfile::tempdir().unwrap().path(),
        )
    };
    let kinds = |text: &str| -> Vec<String> {
        deploy_common::yaml_documents(text, "helm")
            .iter()
            .map(|d| d["kind"].as_str().unwrap_or_default().to_string())
            .filter(|k| k.starts_with("ValidatingAdmission"))
            .collect()
    };
    let default = helm(&["--kube-version", "1.33.0"]).expect("renders");
    assert!(kinds(&default).is_empty(), "off by default");
    let on = helm(&[
        "--kube-version",
        "1.33.0",
        "--set",
        "admissionPolicy.enabled=true",
    ])
    .expect("renders");
    let mut rendered: Vec<serde_json::Value> = deploy_common::yaml_documents(&on, "helm")
        .into_iter()
        .filter(|d| {
            d["kind"]
                .as_str()
                .unwrap_or_default()
                .starts_with("ValidatingAdmission")
        })
        .collect();
    let dir = deploy_dir().join("components/admission-policy");
    let mut files: Vec<serde_json::Value> = [
        "volumehealth-policy.yaml",
        "volumehealth-policybinding.yaml",
        "pvc-label-policy.yaml",
        "pvc-label-policybinding.yaml",
    ]
    .iter()
    .flat_map(|f| deploy_common::yaml_documents(&read(&dir.join(f)), f))
    .collect();
    let key = |d: &serde_json::Value| format!("{}/{}", d["kind"], d["metadata"]["name"]);
    rendered.sort_by_key(key);
    files.sort_by_key(key);
    assert_eq!(rendered, files, "the chart's policies are the Component's");
    // Another namespace is the ServiceAccount the policies name.
    let other = helm(&[
        "--kube-version",
        "1.33.0",
        "--set",
        "admissionPolicy.enabled=true",
        "--namespace",
        "storage-watch",
    ])
    .expect("renders");
    assert!(other.contains("system:serviceaccount:storage-watch:volume-health"));
    assert!(!other.contains("system:serviceaccount:volume-health:volume-health"));
    let refused = helm(&[
        "--kube-version",
        "1.29.0",
        "--set",
        "admissionPolicy.enabled=true",
    ])
    .expect_err("refused");
    assert!(
        refused.contains("admissionPolicy.enabled needs Kubernetes 1.30 or newer"),
        "{refused}"
    );
}
