//! The exact requests against kube's mock service (the real 1.26 server has
//! no such field; tests/tests/server/apiserver_status.rs checks it refuses it).
//! Bodies are decoded with k8s-openapi's 1.37 types and must round-trip
//! unchanged: the shape is upstream's, to the field.

use std::sync::{Arc, Mutex};

use health_core::conditions::Status;
use health_core::testing::t;
use health_kube::status::types::{EntryCondition, EntryKind, HealthStatus, SourceEntry};
use health_kube::status::VolumeHealth;
use health_kube::testing::{ApiRequest, MockApi};
use serde_json::{json, Value};

use super::*;

fn claim(name: &str) -> Claim {
    Claim {
        namespace: "shop".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        pv: Some(format!("pv-{name}")),
    }
}

fn condition(status: Status, reason: &str, message: &str, since: u64) -> EntryCondition {
    EntryCondition {
        status,
        reason: reason.into(),
        message: message.into(),
        since: health_kube::status::types::time(t(since)),
        last_seen: Some(health_kube::status::types::time(t(since + 5))),
        count: None,
        origin: "kernel".into(),
    }
}

fn entry(name: &str, kind: EntryKind, conditions: Vec<EntryCondition>) -> SourceEntry {
    SourceEntry {
        name: name.into(),
        kind,
        node: name.split_once('/').map(|(_, n)| n.to_string()),
        driver: None,
        pods: vec![],
        pod_count: None,
        update_time: health_kube::status::types::time(t(10)),
        conditions,
    }
}

fn object(sources: Vec<SourceEntry>) -> VolumeHealth {
    VolumeHealth {
        status: Some(HealthStatus {
            sources,
            ..HealthStatus::default()
        }),
        ..VolumeHealth::default()
    }
}

/// The kernel saw data loss on node-a; the CSI controller says nothing.
fn data_loss(message: &str) -> VolumeHealth {
    object(vec![entry(
        "Node/node-a",
        EntryKind::Node,
        vec![condition(Status::DataLoss, "MediumErrors", message, 0)],
    )])
}

/// A 1.37 server with the gate on: a claim without `healthStatus` at
/// first, then whatever was applied; patches answered with the stored claim.
fn server_137(stored: Option<Value>) -> (Client, MockApi) {
    let stored = Arc::new(Mutex::new(stored));
    MockApi::start(move |req: &ApiRequest| {
        let mut s = stored.lock().expect("stored");
        if req.method == "PATCH" {
            *s = Some(req.body["status"]["healthStatus"].clone());
        }
        let mut pvc = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "shop", "uid": "uid-data"},
            "status": {"phase": "Bound"},
        });
        if let Some(h) = &*s {
            pvc["status"]["healthStatus"] = h.clone();
        }
        (200, pvc)
    })
}

/// The body decoded with the 1.37 types, encoded again: nothing lost,
/// nothing added.
fn round_trips(body: &Value) {
    let typed: PersistentVolumeClaim =
        serde_json::from_value(body.clone()).expect("a 1.37 PersistentVolumeClaim");
    assert_eq!(&serde_json::to_value(&typed).expect("json"), body);
}

const GET: &str = "/api/v1/namespaces/shop/persistentvolumeclaims/data";
const PATCH: &str =
    "/api/v1/namespaces/shop/persistentvolumeclaims/data/status?&fieldManager=volume-health-controller";

#[tokio::test]
async fn kernel_evidence_is_written_in_the_merged_shape_on_change_only() {
    let (client, api) = server_137(None);
    let metrics = Arc::new(ControllerMetrics::new());
    let mut w = HealthStatusWriter::new(client, Some(Arc::clone(&metrics)));
    let c = claim("data");

    let got = w
        .write(&c, shape::wanted(&data_loss("2 medium errors")), t(60))
        .await;
    assert_eq!(got, Outcome::Written);
    let seen = api.take();
    let calls: Vec<(&str, &str)> = seen
        .iter()
        .map(|r| (r.method.as_str(), r.uri.as_str()))
        .collect();
    assert_eq!(calls, [("GET", GET), ("PATCH", PATCH)]);
    assert_eq!(
        seen[1].body,
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "shop", "uid": "uid-data"},
            "status": {"healthStatus": {
                "healthConditions": [{
                    "status": "DataLoss", "reason": "MediumErrors",
                    "message": "Node/node-a: 2 medium errors",
                }],
                // The evidence's start, not the write's.
                "lastTransitionTime": "2027-01-15T08:00:00Z",
            }},
        })
    );
    round_trips(&seen[1].body);
    assert_eq!(w.support(), Support::Served);

    // The same again: nothing. A new message: written, the time kept.
    w.write(&c, shape::wanted(&data_loss("2 medium errors")), t(70))
        .await;
    assert!(api.take().is_empty());
    w.write(&c, shape::wanted(&data_loss("3 medium errors")), t(80))
        .await;
    let seen = api.take();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let status = &seen[0].body["status"]["healthStatus"];
    assert_eq!(
        status["healthConditions"][0]["message"],
        "Node/node-a: 3 medium errors"
    );
    assert_eq!(status["lastTransitionTime"], "2027-01-15T08:00:00Z");

    // Recovery: an empty list, from now.
    w.write(&c, shape::wanted(&object(vec![])), t(90)).await;
    let seen = api.take();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(
        seen[0].body["status"]["healthStatus"],
        json!({"healthConditions": [], "lastTransitionTime": "2027-01-15T08:01:30Z"})
    );
    round_trips(&seen[0].body);
    let text = metrics.encode();
    assert!(
        text.contains("volume_health_controller_pvc_health_status{state=\"written\"} 1"),
        "{text}"
    );
}

#[tokio::test]
async fn a_restarted_controller_reads_once_and_moves_nothing() {
    let stored = json!({
        "healthConditions": [{"status": "DataLoss", "reason": "MediumErrors",
                              "message": "Node/node-a: 2 medium errors"}],
        "lastTransitionTime": "2027-01-15T07:00:00Z",
    });
    let (client, api) = server_137(Some(stored));
    let mut w = HealthStatusWriter::new(client, None);
    let c = claim("data");
    let got = w
        .write(&c, shape::wanted(&data_loss("2 medium errors")), t(600))
        .await;
    assert_eq!(got, Outcome::Unchanged);
    let seen = api.take();
    assert_eq!(seen.len(), 1, "one read, no write: {seen:#?}");
    assert_eq!(seen[0].method, "GET");
    // A later message keeps the episode's start.
    w.write(&c, shape::wanted(&data_loss("4 medium errors")), t(700))
        .await;
    let seen = api.take();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    assert_eq!(
        seen[0].body["status"]["healthStatus"]["lastTransitionTime"],
        "2027-01-15T07:00:00Z"
    );
}

#[tokio::test]
async fn a_server_without_the_field_is_asked_once() {
    let (client, api) = MockApi::start(|req: &ApiRequest| {
        if req.method == "GET" {
            return (
                200,
                json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                "metadata": {"name": "data", "namespace": "shop", "uid": "uid-data"}}),
            );
        }
        (
            500,
            json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
                   "message": "failed to create typed patch object (shop/data; /v1, Kind=PersistentVolumeClaim): .status.healthStatus: field not declared in schema"}),
        )
    });
    let mut w = HealthStatusWriter::new(client, None);
    let got = w
        .write(&claim("data"), shape::wanted(&data_loss("x")), t(1))
        .await;
    assert_eq!(got, Outcome::Skipped);
    assert_eq!(w.support(), Support::Absent);
    w.write(&claim("logs"), shape::wanted(&data_loss("x")), t(2))
        .await;
    assert_eq!(api.seen().len(), 2, "one read and one refused write");
}

#[tokio::test]
async fn a_server_that_drops_the_field_is_asked_once() {
    // The feature gate off: the field is known to the client, not stored.
    let (client, api) = MockApi::start(|_: &ApiRequest| {
        (
            200,
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": "data", "namespace": "shop", "uid": "uid-data"},
                     "status": {"phase": "Bound"}}),
        )
    });
    let mut w = HealthStatusWriter::new(client, None);
    w.write(&claim("data"), shape::wanted(&data_loss("x")), t(1))
        .await;
    assert_eq!(w.support(), Support::Dropped);
    w.write(&claim("data"), shape::wanted(&object(vec![])), t(2))
        .await;
    assert_eq!(api.seen().len(), 2, "one read and one write");
}

#[tokio::test]
async fn a_field_another_manager_owns_is_left_to_it() {
    let (client, api) = MockApi::start(|req: &ApiRequest| {
        let name = req
            .uri
            .split('/')
            .nth(6)
            .unwrap_or("")
            .split('?')
            .next()
            .unwrap_or("")
            .to_string();
        let pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}")},
                         "status": {"phase": "Bound"}});
        match (req.method.as_str(), name.as_str()) {
            ("PATCH", "data") => (
                409,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 409, "reason": "Conflict",
                       "message": "Apply failed with 1 conflict: conflict with \"csi-external-health-monitor-controller\" using v1: .status.healthStatus.lastTransitionTime"}),
            ),
            ("PATCH", _) => {
                let mut stored = pvc.clone();
                stored["status"]["healthStatus"] = req.body["status"]["healthStatus"].clone();
                (200, stored)
            }
            _ => (200, pvc),
        }
    });
    let metrics = Arc::new(ControllerMetrics::new());
    let mut w = HealthStatusWriter::new(client, Some(Arc::clone(&metrics)));
    let got = w
        .write(&claim("data"), shape::wanted(&data_loss("x")), t(1))
        .await;
    assert_eq!(got, Outcome::Skipped);
    assert_eq!(api.take().len(), 2, "a read and the refused write");
    // Never again for that claim, whatever it says.
    w.write(&claim("data"), shape::wanted(&object(vec![])), t(2))
        .await;
    w.write(&claim("data"), shape::wanted(&data_loss("y")), t(3))
        .await;
    assert!(api.take().is_empty());
    // Other claims are still this controller's to write.
    let got = w
        .write(&claim("logs"), shape::wanted(&data_loss("x")), t(4))
        .await;
    assert_eq!(got, Outcome::Written);
    let text = metrics.encode();
    assert!(
        text.contains("volume_health_controller_pvc_health_status_yielded_claims 1"),
        "{text}"
    );
}

/// The follower end to end over the mock server: the claim's object as a
/// watch lists it (a node's kernel evidence), then the field written for
/// this driver's claim only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_follower_writes_the_objects_union_for_this_drivers_claims_only() {
    let mut listed = serde_json::to_value(data_loss("2 medium errors")).expect("json");
    listed["metadata"] = json!({"name": "data", "namespace": "shop", "resourceVersion": "7"});
    listed["apiVersion"] = json!("volume-health.io/v1alpha1");
    listed["kind"] = json!("VolumeHealth");
    let mut other = listed.clone();
    other["metadata"]["name"] = json!("other-drivers");
    let (client, api) = MockApi::start(move |req: &ApiRequest| {
        if req
            .uri
            .starts_with("/apis/volume-health.io/v1alpha1/volumehealths")
        {
            if req.uri.contains("watch=true") {
                // Nothing new; the watcher asks again.
                std::thread::sleep(std::time::Duration::from_millis(50));
                return (
                    200,
                    json!({"type": "BOOKMARK", "object": {
                    "apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
                    "metadata": {"resourceVersion": "7"}}}),
                );
            }
            return (
                200,
                json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealthList",
                                "metadata": {"resourceVersion": "7"}, "items": [listed, other]}),
            );
        }
        let mut pvc = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                             "metadata": {"name": "data", "namespace": "shop", "uid": "uid-data"},
                             "status": {"phase": "Bound"}});
        if req.method == "PATCH" {
            pvc["status"]["healthStatus"] = req.body["status"]["healthStatus"].clone();
        }
        (200, pvc)
    });
    let follower = follow::Follower::start(client, None);
    let bound = crate::pv_store::MonitoredVolume {
        pv: "pv-data".into(),
        handle: "h-data".into(),
        claim: Some(std::sync::Arc::new(health_kube::events::ObjectRef {
            kind: health_kube::events::ObjectKind::PersistentVolumeClaim,
            namespace: "shop".into(),
            name: "data".into(),
            uid: "uid-data".into(),
        })),
    };
    let index = crate::claim_index::ClaimIndex::new(std::sync::Arc::new(vec![bound]));
    follower.set_claims(&std::sync::Arc::new(index));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    let patches = loop {
        let patches: Vec<ApiRequest> = api
            .seen()
            .into_iter()
            .filter(|r| r.method == "PATCH")
            .collect();
        if !patches.is_empty() || tokio::time::Instant::now() > deadline {
            break patches;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(patches.len(), 1, "{patches:#?}");
    assert_eq!(patches[0].uri, PATCH);
    assert_eq!(
        patches[0].body["status"]["healthStatus"]["healthConditions"],
        json!([{"status": "DataLoss", "reason": "MediumErrors",
                "message": "Node/node-a: 2 medium errors"}])
    );
    // The other driver's claim was never read nor written.
    let pvc_requests: Vec<String> = api
        .seen()
        .into_iter()
        .filter(|r| r.uri.contains("persistentvolumeclaims"))
        .map(|r| format!("{} {}", r.method, r.uri))
        .collect();
    assert_eq!(
        pvc_requests,
        [format!("GET {GET}"), format!("PATCH {PATCH}")]
    );
}
