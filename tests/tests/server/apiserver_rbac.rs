//! What a real kube-apiserver (`health_tests::envtest`) says of `deploy/`: every
//! manifest of the node agent and of the controller is accepted under
//! server-side apply with strict field validation, the controller's sidecar
//! patches apply to a driver's StatefulSet, and then each ServiceAccount may do
//! exactly what its code declares (`health_node::cluster::API_ACCESS`,
//! `health_controller::{API_ACCESS, LEASE_ACCESS}`) and nothing more.
//!
//! The server is v1.26, the oldest Kubernetes the manifests support; that
//! every file and rendering for such a cluster passes `kubectl apply
//! --dry-run=server` is apiserver_deploy.rs.
//!
//! No root, no BPF; needs HEALTH_K8S_ASSETS (see the harness).

use std::collections::BTreeSet;
use std::path::Path;

use anyhow::{ensure, Context, Result};
use health_kube::ApiAccess;
use health_tests::envtest::{
    apply_manifest, attributes, may, runtime, wait_allowed, Identity, Options, RealApiServer,
    FIELD_MANAGER,
};
use health_tests::manifests::{apply_all, manifests, repo_root};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Api, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

const AGENT_NS: &str = "volume-health";
const AGENT_SA: &str = "volume-health";
const DRIVER_NS: &str = "kube-system";
const CONTROLLER_SA: &str = "volume-health-controller";
/// Every verb RBAC knows for resources; what is not granted must be denied.
const VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
];

/// Every (verb, resource) of `access` is allowed in `ns` (None: cluster-wide),
/// and every other verb on those resources is denied there.
async fn check_exact(
    admin: &Client,
    who: &Identity,
    access: &[ApiAccess],
    ns: Option<&str>,
) -> Result<()> {
    let mut wrong = Vec::new();
    for a in access {
        let granted: BTreeSet<&str> = a.verbs.iter().copied().collect();
        // Named grants hold for those objects only: any other, or none
        // named (a list), is refused.
        let mut objects: Vec<(Option<&str>, bool)> =
            a.names.iter().map(|n| (Some(*n), true)).collect();
        if a.names.is_empty() {
            objects.push((None, true));
        } else {
            objects.extend([(None, false), (Some("another"), false)]);
        }
        for verb in VERBS {
            for &(name, named) in &objects {
                let mut asked = attributes(a.group, a.resource, verb, ns);
                asked.name = name.map(str::to_string);
                let allowed = may(admin, who, asked).await?;
                if allowed != (named && granted.contains(verb)) {
                    wrong.push(format!(
                        "{verb} {}/{} {name:?} in {ns:?}: allowed={allowed}",
                        a.group, a.resource
                    ));
                }
            }
        }
    }
    ensure!(
        wrong.is_empty(),
        "{} is not granted exactly its access:\n{}",
        who.user,
        wrong.join("\n")
    );
    Ok(())
}

/// Denied, each one: (group, resource, verb, namespace).
async fn check_denied(
    admin: &Client,
    who: &Identity,
    calls: &[(&str, &str, &str, Option<&str>)],
) -> Result<()> {
    for (group, resource, verb, ns) in calls {
        ensure!(
            !may(admin, who, attributes(group, resource, verb, *ns)).await?,
            "{} may {verb} {group}/{resource} in {ns:?}",
            who.user
        );
    }
    Ok(())
}

fn start() -> Option<RealApiServer> {
    Options::new()
        .service_account(AGENT_NS, AGENT_SA)
        .service_account(DRIVER_NS, CONTROLLER_SA)
        .require()
}

#[test]
fn the_server_accepts_deploy_and_each_account_gets_exactly_its_access() -> Result<()> {
    let Some(server) = start() else { return Ok(()) };
    let agent_docs = manifests(&repo_root().join("deploy"))?;
    let controller_docs = manifests(&repo_root().join("deploy/controller/rbac"))?;
    ensure!(
        agent_docs.len() == 7 && controller_docs.len() == 5,
        "manifests read: {} + {}",
        agent_docs.len(),
        controller_docs.len()
    );
    let rt = runtime()?;
    rt.block_on(async {
        let admin = server.client(server.admin()).await?;

        // The controller's RBAC: accepted as it is.
        let refused = apply_all(&admin, &controller_docs).await;
        ensure!(
            refused.is_empty(),
            "deploy/controller/rbac refused: {refused:#?}"
        );

        // The node agent: accepted as it is (no recursiveReadOnly before 1.30).
        let refused = apply_all(&admin, &agent_docs).await;
        ensure!(refused.is_empty(), "deploy/ refused: {refused:#?}");

        let agent = server
            .service_account(AGENT_NS, AGENT_SA)
            .context("agent identity")?;
        let controller = server
            .service_account(DRIVER_NS, CONTROLLER_SA)
            .context("controller identity")?;
        let a = &health_node::cluster::API_ACCESS[0];
        wait_allowed(&admin, agent, (a.group, a.resource, a.verbs[0]), None).await?;
        let lease = &health_controller::LEASE_ACCESS[0];
        wait_allowed(
            &admin,
            controller,
            (lease.group, lease.resource, lease.verbs[0]),
            Some(DRIVER_NS),
        )
        .await?;

        // Cluster-wide grants hold in any namespace and across the cluster.
        for ns in [None, Some("default"), Some(DRIVER_NS)] {
            check_exact(&admin, agent, health_node::cluster::API_ACCESS, ns).await?;
            check_exact(&admin, controller, health_controller::API_ACCESS, ns).await?;
        }
        check_exact(
            &admin,
            controller,
            health_controller::LEASE_ACCESS,
            Some(DRIVER_NS),
        )
        .await?;

        check_denied(
            &admin,
            controller,
            &[
                ("coordination.k8s.io", "leases", "get", Some("default")),
                (
                    "coordination.k8s.io",
                    "leases",
                    "create",
                    Some("kube-node-lease"),
                ),
                ("coordination.k8s.io", "leases", "list", None),
                ("", "secrets", "get", Some(DRIVER_NS)),
                ("", "secrets", "list", None),
                ("", "persistentvolumeclaims", "list", None),
                ("storage.k8s.io", "volumeattachments", "list", None),
            ],
        )
        .await?;
        // The agent reads PVs one by one, never the cluster's list
        // (issue 29): get allowed, list and watch denied, by name here
        // whatever API_ACCESS says.
        ensure!(
            may(
                &admin,
                agent,
                attributes("", "persistentvolumes", "get", None)
            )
            .await?,
            "the agent may not get a PV"
        );
        check_denied(
            &admin,
            agent,
            &[
                ("", "persistentvolumes", "list", None),
                ("", "persistentvolumes", "watch", None),
                ("", "persistentvolumeclaims", "list", None),
                ("", "persistentvolumeclaims", "watch", None),
                ("", "pods", "get", Some("default")),
                ("", "secrets", "get", Some(AGENT_NS)),
                ("", "nodes", "list", None),
                ("coordination.k8s.io", "leases", "create", Some(AGENT_NS)),
                ("", "persistentvolumeclaims", "get", Some("default")),
            ],
        )
        .await?;
        anyhow::Ok(())
    })
}

/// A driver's controller StatefulSet of our own making, in `default`: the
/// plugin container and the socket volume, as CSI drivers have them.
fn driver(name: &str) -> Value {
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
                        "volumeMounts": [{"name": "socket-dir", "mountPath": "/csi"}]}],
                    "volumes": [{"name": "socket-dir", "emptyDir": {}}],
                },
            },
        },
    })
}

/// `kubectl patch --patch-file FILE` (strategic merge) with strict field validation.
async fn strategic_patch(client: &Client, name: &str, file: &Path) -> Result<StatefulSet> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    let patch: Value = serde_yaml::from_str(&text).context("the patch is YAML")?;
    let params = PatchParams {
        field_manager: Some(FIELD_MANAGER.to_string()),
        ..Default::default()
    }
    .validation_strict();
    let api = Api::<StatefulSet>::namespaced(client.clone(), "default");
    Ok(api.patch(name, &params, &Patch::Strategic(patch)).await?)
}

#[test]
fn the_sidecar_patches_apply_to_a_driver_statefulset() -> Result<()> {
    let Some(server) = health_tests::require_api_server() else {
        return Ok(());
    };
    let rt = runtime()?;
    rt.block_on(async {
        let admin = server.client(server.admin()).await?;
        for (name, patch) in [
            ("csi-driver", "deploy/controller/sidecar.yaml"),
            (
                "csi-hostpathplugin",
                "deploy/controller/example-hostpath/sidecar.yaml",
            ),
        ] {
            apply_manifest(&admin, &driver(name))
                .await
                .with_context(|| format!("creating {name}"))?;
            let file = repo_root().join(patch);
            let patched = strategic_patch(&admin, name, &file).await.context(patch)?;
            let pod = patched.spec.template.spec.as_ref().context("pod")?;
            let names: BTreeSet<&str> = pod.containers.iter().map(|c| c.name.as_str()).collect();
            ensure!(
                names == BTreeSet::from(["plugin", CONTROLLER_SA]),
                "{name} after {patch}: {names:?}"
            );
            let sidecar = pod
                .containers
                .iter()
                .find(|c| c.name == CONTROLLER_SA)
                .context("sidecar")?;
            ensure!(
                serde_json::to_value(&sidecar.volume_mounts)?
                    == json!([{"name": "socket-dir", "mountPath": "/csi"}]),
                "{sidecar:?}"
            );
            // Again: merged by name, nothing changes.
            let again = strategic_patch(&admin, name, &file).await.context(patch)?;
            ensure!(
                again.metadata.resource_version == patched.metadata.resource_version,
                "{patch} applied twice changed {name}: {again:?}"
            );
        }
        anyhow::Ok(())
    })
}
