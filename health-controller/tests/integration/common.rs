//! What the controller's integration tests share: kube's mock API service
//! answering every request (and recording it), and the driver's PVs with
//! their claims.

// Each test crate uses only part of this module.
#![allow(dead_code)]

use health_controller::inventory::MonitoredVolume;
use health_kube::events::{ObjectKind, ObjectRef};
use health_kube::testing::MockApi;
use http::Method;
use serde_json::{json, Value};

/// kube's mock API service answering every request (and recording it):
/// Event lists with `events`, pod lists with `pods`, creates and patches
/// with success.
pub fn start_api(events: Vec<Value>, pods: Vec<Value>) -> (kube::Client, MockApi) {
    MockApi::start(move |req| match req.method {
        Method::GET if req.uri.starts_with("/api/v1/events") => (
            200,
            json!({"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": events}),
        ),
        Method::GET if req.uri.starts_with("/api/v1/pods") => (
            200,
            json!({"apiVersion": "v1", "kind": "PodList", "metadata": {}, "items": pods}),
        ),
        Method::POST => (201, req.body.clone()),
        _ => (
            200,
            json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "x", "namespace": "shop"},
                   "involvedObject": {}}),
        ),
    })
}

pub fn pvc(name: &str) -> ObjectRef {
    ObjectRef {
        kind: ObjectKind::PersistentVolumeClaim,
        namespace: "shop".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
    }
}

pub fn volume(n: u32) -> MonitoredVolume {
    MonitoredVolume {
        pv: format!("pv-{n}").into(),
        handle: format!("h-{n}").into(),
        claim: Some(pvc(&format!("data-{n}")).into()),
    }
}
