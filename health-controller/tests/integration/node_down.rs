//! Node-down ([`health_controller::nodes::NodeWatch`]): a node down past
//! the grace makes the volumes of its pods that use the driver's claims
//! `Inaccessible` (the pods listed once, from kube's mock API service), until
//! it is Ready again; a node deleted meanwhile ends without a recovery.

use crate::common;

use std::time::Duration;

use common::{pvc, start_api, volume};
use health_controller::inventory::{NodeState, Readiness};
use health_controller::nodes::{affected_pods, Affected, NodeWatch};
use health_controller::recorder_config;
use health_kube::events::{Next, ObjectKind, ObjectRef, Outcome, Recorder, Write};
use serde_json::json;

fn node(readiness: Readiness, since: u64) -> NodeState {
    NodeState {
        name: "node-1".into(),
        readiness,
        since: Some(at(since)),
        reason: Some("NodeStatusUnknown".into()),
    }
}

use health_core::testing::t as at;

fn writes(r: &mut Recorder) -> Vec<(String, String, String, String)> {
    let mut out = Vec::new();
    while let Next::Write(w) = r.next_write(tokio::time::Instant::now()) {
        r.finish(&w, Outcome::Done, tokio::time::Instant::now());
        let Write::Create { event, .. } = &w else {
            panic!("expected creates only, got {w:?}");
        };
        out.push((
            event.involved_object.kind.clone().unwrap_or_default(),
            event.involved_object.name.clone().unwrap_or_default(),
            event.type_.clone().unwrap_or_default(),
            event.message.clone().unwrap_or_default(),
        ));
    }
    out
}

#[tokio::test]
async fn a_node_down_past_the_grace_makes_its_pods_volumes_inaccessible_until_ready() {
    let pods = vec![
        json!({"metadata": {"name": "web-0", "namespace": "shop", "uid": "uid-web-0"},
               "spec": {"nodeName": "node-1", "containers": [],
                        "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "data-1"}},
                                    {"name": "other", "persistentVolumeClaim": {"claimName": "not-ours"}}]}}),
        json!({"metadata": {"name": "cache", "namespace": "shop", "uid": "uid-cache"},
               "spec": {"nodeName": "node-1", "containers": [], "volumes": [{"name": "tmp", "emptyDir": {}}]}}),
    ];
    let (client, api) = start_api(Vec::new(), pods);
    let volumes = vec![volume(1), volume(2)];
    let mut r = Recorder::new(recorder_config("ctl-0", 100, Duration::ZERO));
    let mut watch = NodeWatch::new(Duration::from_secs(60));

    let down = [node(Readiness::Unreachable, 0)];
    assert_eq!(watch.update(&down, &mut r, at(59)), Vec::<String>::new());
    assert_eq!(watch.update(&down, &mut r, at(60)), ["node-1"]);
    let affected = affected_pods(&client, "node-1", &volumes, Duration::from_secs(1))
        .await
        .unwrap();
    let seen = api.take();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].uri,
        "/api/v1/pods?&fieldSelector=spec.nodeName%3Dnode-1&limit=500"
    );
    watch.report("node-1", affected, &mut r, at(60));
    let message = "node node-1: Inaccessible NodeNotReady: node node-1 unreachable since 2027-01-15T08:00:00Z (NodeStatusUnknown)";
    assert_eq!(
        writes(&mut r),
        [
            (
                "Pod".into(),
                "web-0".into(),
                "Warning".into(),
                message.to_string()
            ),
            (
                "PersistentVolumeClaim".into(),
                "data-1".into(),
                "Warning".into(),
                message.to_string()
            ),
        ]
    );
    // Still down: not listed again, nothing written.
    assert_eq!(watch.update(&down, &mut r, at(120)), Vec::<String>::new());
    assert_eq!(writes(&mut r), []);

    // Ready again: a Normal on each.
    watch.update(&[node(Readiness::Ready, 200)], &mut r, at(200));
    let cleared = "node node-1: Inaccessible NodeNotReady cleared; it was: node node-1 unreachable since 2027-01-15T08:00:00Z (NodeStatusUnknown)";
    assert_eq!(
        writes(&mut r),
        [
            (
                "Pod".into(),
                "web-0".into(),
                "Normal".into(),
                cleared.to_string()
            ),
            (
                "PersistentVolumeClaim".into(),
                "data-1".into(),
                "Normal".into(),
                cleared.to_string()
            ),
        ]
    );
}

#[tokio::test]
async fn a_node_deleted_while_down_ends_without_a_recovery() {
    let mut r = Recorder::new(recorder_config("ctl-0", 100, Duration::ZERO));
    let mut watch = NodeWatch::new(Duration::from_secs(60));
    let down = [node(Readiness::NotReady, 0)];
    assert_eq!(watch.update(&down, &mut r, at(61)), ["node-1"]);
    let pod = ObjectRef {
        kind: ObjectKind::Pod,
        namespace: "shop".into(),
        name: "web-0".into(),
        uid: "u".into(),
    };
    let affected = vec![Affected {
        pod,
        pvcs: vec![pvc("data-1")],
    }];
    watch.report("node-1", affected, &mut r, at(61));
    assert_eq!(writes(&mut r).len(), 2);
    watch.update(&[], &mut r, at(100));
    assert_eq!(writes(&mut r), []);
    assert!(r.is_empty(), "series left: {}", r.len());
}
