//! The fake kube-apiserver's server-side apply of `VolumeHealth` objects and PVC
//! labels (`health_tests::apiserver`, modules `volumehealth` and `apply`), driven
//! by the agent's own writer (`health_kube::status::StatusApi`) and by raw
//! kube-rs requests: what tests/server/apiserver_status.rs checks on a real API server
//! (the union, per-node entries, the label) must hold on the fake too, so that the
//! cluster tests against the fake mean the same.
//!
//! No root needed. Each test has its own server.

use std::collections::BTreeMap;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use health_core::conditions::Status;
use health_kube::status::{self, Claim, Put, SourceEntry, StatusApi, VolumeHealth};
use health_tests::FakeApiServer;
use status_fixtures::{cond, node_entry};

use crate::status_fixtures;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

const NS: &str = "shop";
const PVC: &str = "data";
const PVC_UID: &str = "2c2c2c2c-0000-4000-8000-00000000002c";

fn pvc(namespace: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": {"app": "shop"}},
        "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": "pv-1"},
    })
}

/// A server with the PVC shop/data, and a directory for its kubeconfig.
fn serve() -> Result<(FakeApiServer, tempfile::TempDir)> {
    let server = FakeApiServer::start()?;
    server.put(pvc(NS, PVC, PVC_UID));
    Ok((server, tempfile::tempdir()?))
}

fn claim() -> Claim {
    Claim {
        namespace: NS.into(),
        name: PVC.into(),
        uid: PVC_UID.into(),
        pv: Some("pv-1".into()),
    }
}

fn node_api(client: &Client, node: &str) -> StatusApi {
    StatusApi::new(
        client.clone(),
        status::node_manager(node),
        status::node_entry_names(node),
        None,
    )
}

fn entry(node: &str, conditions: &[(Status, &str, Option<u64>)]) -> SourceEntry {
    let conditions = conditions.iter().map(|(s, r, n)| cond(*s, r, *n)).collect();
    node_entry(node, conditions)
}

fn source_names(o: &Value) -> Vec<String> {
    o["status"]["sources"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| e["name"].as_str().unwrap_or("?").to_string())
        .collect()
}

/// `(type, status, reason)` of each condition.
fn conditions(o: &Value) -> Vec<(String, String, String)> {
    o["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap_or("?").to_string();
            (s("type"), s("status"), s("reason"))
        })
        .collect()
}

fn labels(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

fn triple(t: &str, s: &str, r: &str) -> (String, String, String) {
    (t.into(), s.into(), r.into())
}

#[test]
fn the_agents_writer_keeps_entries_the_union_and_the_label() -> Result<()> {
    let (server, dir) = serve()?;
    health_tests::multi_thread_runtime()?.block_on(async {
        let client = server.kube_client(dir.path(), false).await?;
        let (a, b) = (node_api(&client, "node-a"), node_api(&client, "node-b"));
        let now = SystemTime::now();
        assert_eq!(a.put(&claim(), &[], now).await?, Put::NoObject);
        assert_eq!(server.volume_health(NS, PVC), None);

        let degraded = [entry(
            "node-a",
            &[(Status::Degraded, "BlockIOErrors", Some(25))],
        )];
        let put = a.put(&claim(), &degraded, now).await?;
        assert_eq!(
            put,
            Put::Written {
                health: "Degraded".into()
            }
        );
        let o = server.volume_health(NS, PVC).context("created")?;
        assert_eq!(o["apiVersion"], "volume-health.io/v1alpha1");
        assert_eq!(o["metadata"]["generation"], 1);
        assert_eq!(o["metadata"]["ownerReferences"][0]["uid"], PVC_UID);
        assert_eq!(
            o["spec"],
            json!({"persistentVolumeClaimName": PVC, "persistentVolumeName": "pv-1"})
        );
        assert_eq!(source_names(&o), ["Node/node-a"]);
        assert_eq!(o["status"]["sources"][0]["conditions"][0]["count"], 25);
        assert_eq!(
            conditions(&o),
            [triple("Degraded", "True", "BlockIOErrors")]
        );
        assert_eq!(
            server.pvc_labels(NS, PVC),
            labels(&[("app", "shop"), (status::HEALTH_LABEL, "Degraded")])
        );

        // Nothing new to say: no write, the same version.
        let rv = o["metadata"]["resourceVersion"].clone();
        assert_eq!(a.put(&claim(), &degraded, now).await?, Put::Unchanged);
        assert_eq!(
            server.volume_health(NS, PVC).context("kept")?["metadata"]["resourceVersion"],
            rv
        );

        // Another node's worse entry: both kept, the label follows the worst.
        let hung = [entry("node-b", &[(Status::Inaccessible, "PathHung", None)])];
        b.put(&claim(), &hung, now).await?;
        let o = server.volume_health(NS, PVC).context("object")?;
        assert_eq!(source_names(&o), ["Node/node-a", "Node/node-b"]);
        assert_eq!(o["status"]["health"], "Inaccessible");
        assert_eq!(o["status"]["nodes"], "node-a,node-b");
        assert_eq!(
            server.pvc_labels(NS, PVC),
            labels(&[("app", "shop"), (status::HEALTH_LABEL, "Inaccessible")])
        );

        // node-b recovers: its entry stays empty, Inaccessible goes False.
        b.put(&claim(), &[entry("node-b", &[])], now).await?;
        let o = server.volume_health(NS, PVC).context("object")?;
        assert_eq!(source_names(&o), ["Node/node-a", "Node/node-b"]);
        assert_eq!(
            conditions(&o),
            [
                triple("Inaccessible", "False", "PathHungCleared"),
                triple("Degraded", "True", "BlockIOErrors")
            ]
        );
        assert_eq!(
            server.pvc_labels(NS, PVC),
            labels(&[("app", "shop"), (status::HEALTH_LABEL, "Degraded")])
        );

        // node-a recovers: Healthy, the label removed, the other label kept.
        a.put(&claim(), &[entry("node-a", &[])], now).await?;
        let o = server.volume_health(NS, PVC).context("object")?;
        assert_eq!(o["status"]["health"], "Healthy");
        assert_eq!(o["status"]["sources"][0]["conditions"], json!([]));
        assert_eq!(server.pvc_labels(NS, PVC), labels(&[("app", "shop")]));

        // node-b's pod left: its entry goes, node-a's stays.
        b.put(&claim(), &[], now).await?;
        let o = server.volume_health(NS, PVC).context("object")?;
        assert_eq!(source_names(&o), ["Node/node-a"]);

        let listed = status::list_all(&client).await?;
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].spec.persistent_volume_claim_name, PVC);

        // What RBAC sees of these requests: the agent's VolumeHealth access.
        let asked: std::collections::BTreeSet<_> = server
            .requests()
            .iter()
            .filter_map(|r| r.access())
            .collect();
        let want: std::collections::BTreeSet<_> = [
            ("", "persistentvolumeclaims", "patch"),
            ("volume-health.io", "volumehealths", "get"),
            ("volume-health.io", "volumehealths", "list"),
            ("volume-health.io", "volumehealths", "patch"),
            ("volume-health.io", "volumehealths/status", "patch"),
        ]
        .into_iter()
        .map(|(g, r, v)| (g.to_string(), r.to_string(), v))
        .collect();
        assert_eq!(asked, want);
        Ok(())
    })
}

#[test]
fn racing_writers_never_clear_each_others_assertions() -> Result<()> {
    let (server, dir) = serve()?;
    health_tests::multi_thread_runtime()?.block_on(async {
        let client = server.kube_client(dir.path(), false).await?;
        let (a, b) = (node_api(&client, "node-a"), node_api(&client, "node-b"));
        let (now, claim) = (SystemTime::now(), claim());
        for round in 0..20u64 {
            let ea: Vec<_> = (round % 2 == 1)
                .then_some((Status::Degraded, "BlockIOErrors", Some(round)))
                .into_iter()
                .collect();
            let eb: Vec<_> = (round % 3 != 0)
                .then_some((Status::DataLoss, "FilesystemCorruption", None))
                .into_iter()
                .collect();
            let (na, nb) = ([entry("node-a", &ea)], [entry("node-b", &eb)]);
            let (ra, rb) = tokio::join!(a.put(&claim, &na, now), b.put(&claim, &nb, now));
            ra?;
            rb?;
            let Some(o) = server.volume_health(NS, PVC) else {
                assert!(ea.is_empty() && eb.is_empty(), "round {round}: no object");
                continue;
            };
            let mut want = Vec::new();
            if !eb.is_empty() {
                want.push("DataLoss");
            }
            if !ea.is_empty() {
                want.push("Degraded");
            }
            let truly: Vec<String> = conditions(&o)
                .into_iter()
                .filter(|c| c.1 == "True")
                .map(|c| c.0)
                .collect();
            assert_eq!(truly, want, "round {round}");
            let label = server
                .pvc_labels(NS, PVC)
                .context("pvc")?
                .get(status::HEALTH_LABEL)
                .cloned();
            assert_eq!(
                label.as_deref(),
                want.first().copied(),
                "round {round}: the label follows the union"
            );
        }
        // How often the precondition refused a stale write (races vary per run).
        let conflicts = server
            .requests()
            .iter()
            .filter(|r| r.path.ends_with("/status") && r.status == 409)
            .count();
        eprintln!("{conflicts} status applies refused as stale in 20 rounds");
        Ok(())
    })
}

fn vh_body(status: Value, rv: Option<&str>) -> Value {
    let mut meta = json!({"name": PVC, "namespace": NS});
    if let Some(rv) = rv {
        meta["resourceVersion"] = json!(rv);
    }
    json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth", "metadata": meta, "status": status})
}

/// The API error's code and message.
fn refusal<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Result<(u16, String)> {
    match r {
        Err(kube::Error::Api(s)) => Ok((s.code, s.message)),
        other => bail!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn preconditions_missing_objects_and_foreign_fields_are_refused() -> Result<()> {
    let server = FakeApiServer::start()?;
    server.put(pvc(NS, PVC, PVC_UID));
    server.put(pvc("other", PVC, "uid-other"));
    let dir = tempfile::tempdir()?;
    health_tests::multi_thread_runtime()?.block_on(async {
        let client = server.kube_client(dir.path(), false).await?;
        let vh: Api<VolumeHealth> = Api::namespaced(client.clone(), NS);
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
        let apply = PatchParams::apply("m").force();

        let (code, msg) = refusal(vh.patch_status(PVC, &apply, &Patch::Apply(vh_body(json!({}), None))).await)?;
        assert_eq!((code, msg.as_str()), (404, "volumehealths \"data\" not found"));

        let create = json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
            "metadata": {"name": PVC, "namespace": NS}, "spec": {"persistentVolumeClaimName": PVC}});
        let o = vh.patch(PVC, &apply, &Patch::Apply(&create)).await?;
        let rv = o.metadata.resource_version.clone().context("rv")?;
        vh.patch_status(PVC, &apply, &Patch::Apply(vh_body(json!({"health": "Healthy"}), Some(&rv)))).await?;
        let (code, msg) = refusal(vh.patch_status(PVC, &apply, &Patch::Apply(vh_body(json!({"health": "Degraded"}), Some(&rv)))).await)?;
        assert_eq!(code, 409);
        assert_eq!(msg, "Operation cannot be fulfilled on volumehealths.volume-health.io \"data\": the object has been modified; please apply your changes to the latest version and try again");
        let (code, msg) = refusal(vh.patch_status(PVC, &apply, &Patch::Apply(vh_body(json!({"sources": [{"name": "a"}, {"name": "a"}]}), None))).await)?;
        assert_eq!((code, msg.as_str()), (422, "volumehealths.volume-health.io \"data\" is invalid: .status.sources: duplicate entries for key [name=\"a\"]"));
        let (code, _) = refusal(vh.patch_status(PVC, &PatchParams::default(), &Patch::Merge(json!({"status": {}}))).await)?;
        assert_eq!(code, 415, "only apply");

        let label = |uid: &str, extra: Value| {
            let mut b = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": PVC, "namespace": NS, "uid": uid, "labels": {status::HEALTH_LABEL: "Degraded"}}});
            if let (Some(m), Some(e)) = (b["metadata"].as_object_mut(), extra.as_object()) {
                m.extend(e.clone());
            }
            b
        };
        let (code, msg) = refusal(pvcs.patch(PVC, &apply, &Patch::Apply(label("wrong", json!({})))).await)?;
        assert_eq!(code, 409);
        assert_eq!(msg, format!("Operation cannot be fulfilled on persistentvolumeclaims \"data\": Precondition failed: UID in precondition: wrong, UID in object meta: {PVC_UID}"));
        let (code, msg) = refusal(pvcs.patch(PVC, &apply, &Patch::Apply(label(PVC_UID, json!({"annotations": {"x": "y"}})))).await)?;
        assert_eq!((code, msg.as_str()), (422, "persistentvolumeclaims \"data\" is invalid: the fake apiserver applies only metadata.labels of a PVC, not [\"annotations\"]"));
        let missing: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "nowhere");
        let mut body = label(PVC_UID, json!({}));
        body["metadata"]["namespace"] = json!("nowhere");
        let (code, _) = refusal(missing.patch(PVC, &apply, &Patch::Apply(&body)).await)?;
        assert_eq!(code, 404);
        assert_eq!(server.pvc_labels("nowhere", PVC), None, "never created");

        // Unforced, another manager's label with another value is a conflict.
        pvcs.patch(PVC, &apply, &Patch::Apply(label(PVC_UID, json!({})))).await?;
        let mut other = label(PVC_UID, json!({}));
        other["metadata"]["labels"][status::HEALTH_LABEL] = json!("DataLoss");
        let (code, msg) = refusal(pvcs.patch(PVC, &PatchParams::apply("n"), &Patch::Apply(&other)).await)?;
        assert_eq!((code, msg.as_str()), (409, "Apply failed with 1 conflict(s): conflict with [\"m\"]: .metadata.labels.volume-health.io/health"));
        // The label's manager applying without it removes it, and only it.
        let mut none = label(PVC_UID, json!({}));
        none["metadata"].as_object_mut().context("meta")?.remove("labels");
        pvcs.patch(PVC, &apply, &Patch::Apply(&none)).await?;
        assert_eq!(server.pvc_labels(NS, PVC), labels(&[("app", "shop")]));

        // Lists of all namespaces page like the other lists.
        let create_other = json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
            "metadata": {"name": PVC, "namespace": "other"}, "spec": {"persistentVolumeClaimName": PVC}});
        Api::<VolumeHealth>::namespaced(client.clone(), "other").patch(PVC, &apply, &Patch::Apply(&create_other)).await?;
        let all: Api<VolumeHealth> = Api::all(client.clone());
        let first = all.list(&ListParams::default().limit(1)).await?;
        assert_eq!(first.items.len(), 1);
        let token = first.metadata.continue_.clone().context("a continue token")?;
        let second = all.list(&ListParams::default().limit(1).continue_token(&token)).await?;
        let namespaces: Vec<_> = first.items.iter().chain(&second.items).filter_map(|o| o.metadata.namespace.clone()).collect();
        assert_eq!(namespaces, ["other", "shop"]);
        assert_eq!(second.metadata.continue_.as_deref().unwrap_or(""), "");
        Ok(())
    })
}
