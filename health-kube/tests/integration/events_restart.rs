//! Continuing Events across an agent restart: the recorder seeded from the
//! Events an earlier process wrote (pure), and the writer's exact requests
//! (kube's mock service): one field-selected list before the first write.

use crate::common;

use std::time::Duration;

use common::{block, config, drain, key, t, targets};
use health_core::conditions::{Change, Condition};
use health_kube::events::{Adopted, EventType, Next, Outcome, Recorder, Targets, Write};
use k8s_openapi::api::core::v1::Event;
use serde_json::{json, Value};
use tokio::time::Instant;

const POD_MSG: &str = "PVC shop/data (PV pv-1, volume \"data\"): Degraded BlockIOErrors: 5 block I/O errors (write, EIO) on loop3 (7:3)";
const PVC_MSG: &str =
    "pod shop/web-0 (PV pv-1): Degraded BlockIOErrors: 5 block I/O errors (write, EIO) on loop3 (7:3)";

fn stamp(secs: u64) -> String {
    let t = k8s_openapi::jiff::Timestamp::try_from(t(secs)).expect("a time in range");
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// An Event as the API server lists it, written by this node's agent.
fn event(
    name: &str,
    on: (&str, &str),
    type_: &str,
    reason: &str,
    count: i32,
    secs: (u64, u64),
    message: &str,
) -> Value {
    let (kind, object) = on;
    let uid = if kind == "Pod" {
        format!("{object}-uid")
    } else {
        "pvc-uid".to_string()
    };
    json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "shop", "uid": format!("uid-{name}"), "resourceVersion": "7"},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "namespace": "shop", "name": object, "uid": uid},
        "type": type_, "reason": reason, "message": message, "count": count,
        "firstTimestamp": stamp(secs.0), "lastTimestamp": stamp(secs.1),
        "source": {"component": "volume-health-agent", "host": "node-1"},
        "reportingComponent": "volume-health-agent", "reportingInstance": "node-1"
    })
}

fn typed(values: &[Value]) -> Vec<Event> {
    values
        .iter()
        .map(|v| serde_json::from_value(v.clone()).expect("an Event"))
        .collect()
}

/// The open episode as the killed agent left it: 5 errors, last at t(40).
fn open_episode() -> Vec<Value> {
    vec![
        event(
            "web-0.old",
            ("Pod", "web-0"),
            "Warning",
            "BlockIOErrors",
            5,
            (0, 40),
            POD_MSG,
        ),
        event(
            "data.old",
            ("PersistentVolumeClaim", "data"),
            "Warning",
            "BlockIOErrors",
            5,
            (0, 40),
            PVC_MSG,
        ),
    ]
}

/// The condition as the restarted agent raises it: 3 new errors from t(70).
fn after_restart(count: u64, last: u64) -> Condition {
    Condition {
        since: t(70),
        ..block(count, last)
    }
}

fn pod_only() -> Targets {
    Targets {
        pvc: None,
        ..targets("web-0")
    }
}

fn patch_of(w: &Write) -> (&str, &Value) {
    match w {
        Write::Patch { name, patch, .. } => (name.as_str(), patch),
        other => panic!("expected a patch, got {other:?}"),
    }
}

#[test]
fn an_open_episode_goes_on_in_the_same_event_with_its_count() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    let adopted = r.adopt(&typed(&open_episode()), t(60), now);
    assert_eq!(
        adopted,
        Adopted {
            warnings: 2,
            normals: 0,
            own: 2
        }
    );
    // Nothing to say yet; if nothing comes back, it clears when the quiet
    // window after its last report (t(40) + 300 s) ends.
    assert_eq!(
        r.next_write(now),
        Next::Idle(Some(now + Duration::from_secs(280)))
    );

    r.observe(
        &key("a"),
        &targets("web-0"),
        &[Change::Raised(after_restart(3, 71))],
        t(71),
    );
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(writes.len(), 2, "{writes:?}");
    let (name, patch) = patch_of(&writes[0]);
    assert_eq!(name, "web-0.old");
    assert_eq!(
        patch,
        &json!({
            "count": 8,
            "lastTimestamp": stamp(71),
            "message": "PVC shop/data (PV pv-1, volume \"data\"): Degraded BlockIOErrors: 3 block I/O errors (write, EIO) on loop3 (7:3) (and 5 reported before the agent restarted)"
        })
    );
    let (name, patch) = patch_of(&writes[1]);
    assert_eq!(name, "data.old");
    assert_eq!(patch["count"], 8);

    // Claimed: the deadline is gone, and the recovery comes from the
    // condition clearing, on both objects.
    assert_eq!(
        r.next_write(now + Duration::from_secs(400)),
        Next::Idle(None)
    );
    r.observe(
        &key("a"),
        &targets("web-0"),
        &[Change::Cleared(after_restart(3, 71))],
        t(400),
    );
    let writes = drain(&mut r, now + Duration::from_secs(400), Outcome::Done);
    let kinds: Vec<(String, String, String)> = writes
        .iter()
        .map(|w| match w {
            Write::Create { event, .. } => (
                event.involved_object.name.clone().unwrap_or_default(),
                event.type_.clone().unwrap_or_default(),
                event.reason.clone().unwrap_or_default(),
            ),
            other => panic!("expected a create, got {other:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            (
                "web-0".into(),
                "Normal".into(),
                "BlockIOErrorsCleared".into()
            ),
            (
                "data".into(),
                "Normal".into(),
                "BlockIOErrorsCleared".into()
            ),
        ]
    );
}

#[test]
fn a_condition_raised_before_the_list_answers_takes_over_the_event() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    r.observe(
        &key("a"),
        &targets("web-0"),
        &[Change::Raised(after_restart(3, 71))],
        t(71),
    );
    let adopted = r.adopt(&typed(&open_episode()), t(72), now);
    assert_eq!(adopted.warnings, 2);
    let writes = drain(&mut r, now, Outcome::Done);
    let patched: Vec<(&str, i64)> = writes
        .iter()
        .map(|w| {
            let (name, patch) = patch_of(w);
            (name, patch["count"].as_i64().unwrap_or(-1))
        })
        .collect();
    assert_eq!(patched, [("web-0.old", 8), ("data.old", 8)]);
}

#[test]
fn counts_that_already_include_the_episode_are_not_added_twice() {
    // A condition whose episode began before the Event's last write (the
    // kernel counts outlived the process): its count is the episode's.
    let mut r = Recorder::new(config());
    let now = Instant::now();
    r.adopt(&typed(&open_episode()[..1]), t(60), now);
    r.observe(
        &key("a"),
        &pod_only(),
        &[Change::Raised(block(9, 61))],
        t(61),
    );
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(writes.len(), 1);
    let (name, patch) = patch_of(&writes[0]);
    assert_eq!(name, "web-0.old");
    assert_eq!(
        patch,
        &json!({
            "count": 9,
            "lastTimestamp": stamp(61),
            "message": "PV pv-1 (volume \"data\"): Degraded BlockIOErrors: 9 block I/O errors (write, EIO) on loop3 (7:3)"
        })
    );
}

#[test]
fn an_episode_nobody_claims_after_the_restart_is_cleared_at_the_end_of_its_window() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    r.adopt(&typed(&open_episode()[..1]), t(60), now);
    let due = now + Duration::from_secs(280);
    assert_eq!(
        r.next_write(due - Duration::from_millis(1)),
        Next::Idle(Some(due))
    );
    let writes = drain(&mut r, due, Outcome::Done);
    assert_eq!(writes.len(), 1, "{writes:?}");
    let Write::Create { event, .. } = &writes[0] else {
        panic!("expected a create, got {:?}", writes[0]);
    };
    let body = serde_json::to_value(event.as_ref()).expect("json");
    assert_eq!(body["type"], "Normal");
    assert_eq!(body["reason"], "BlockIOErrorsCleared");
    assert_eq!(body["involvedObject"]["name"], "web-0");
    assert_eq!(body["count"], 1);
    assert_eq!(body["firstTimestamp"], stamp(340));
    assert_eq!(
        body["message"],
        "PVC shop/data (PV pv-1, volume \"data\"): Degraded BlockIOErrors cleared; it was: 5 block I/O errors (write, EIO) on loop3 (7:3)"
    );
    // The Warning stays as the server has it, and is let go.
    assert_eq!(r.len(), 1);
    assert_eq!(drain(&mut r, due, Outcome::Done), []);
}

#[test]
fn an_episode_on_a_pod_gone_meanwhile_ends_without_a_recovery() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    r.adopt(&typed(&open_episode()), t(60), now);
    assert!(r.has_unclaimed());
    // web-0 was deleted while no agent ran; its PVC is still used here.
    let dropped = r.drop_unclaimed(|o| o.name != "web-0");
    assert_eq!(dropped, 1);
    assert!(r.has_unclaimed());
    let writes = drain(&mut r, now + Duration::from_secs(280), Outcome::Done);
    let objects: Vec<(EventType, String)> = writes
        .iter()
        .map(|w| match w {
            Write::Create { event, .. } => (
                w.kind().0,
                event.involved_object.name.clone().unwrap_or_default(),
            ),
            other => panic!("expected a create, got {other:?}"),
        })
        .collect();
    assert_eq!(objects, [(EventType::Normal, "data".to_string())]);
    assert!(!r.has_unclaimed());
}

#[test]
fn an_episode_already_past_its_window_is_cleared_at_once() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    r.adopt(&typed(&open_episode()[..1]), t(4000), now);
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        writes[0].kind(),
        (EventType::Normal, "BlockIOErrorsCleared")
    );
}

#[test]
fn a_cleared_episode_is_not_continued_and_its_recovery_event_is() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    let cleared = "PVC shop/data (PV pv-1, volume \"data\"): Degraded BlockIOErrors cleared; it was: 5 block I/O errors (write, EIO) on loop3 (7:3)";
    let events = vec![
        event(
            "web-0.old",
            ("Pod", "web-0"),
            "Warning",
            "BlockIOErrors",
            5,
            (0, 40),
            POD_MSG,
        ),
        event(
            "web-0.ok",
            ("Pod", "web-0"),
            "Normal",
            "BlockIOErrorsCleared",
            2,
            (20, 340),
            cleared,
        ),
        // An older episode of the same object, cleared long ago.
        event(
            "web-0.older",
            ("Pod", "web-0"),
            "Warning",
            "BlockIOErrors",
            1,
            (0, 5),
            POD_MSG,
        ),
    ];
    let adopted = r.adopt(&typed(&events), t(400), now);
    assert_eq!(
        adopted,
        Adopted {
            warnings: 0,
            normals: 1,
            own: 3
        }
    );
    r.observe(
        &key("a"),
        &pod_only(),
        &[Change::Raised(after_restart(1, 410))],
        t(410),
    );
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(writes.len(), 1);
    let Write::Create { event, .. } = &writes[0] else {
        panic!("a new episode is a new Event: {:?}", writes[0]);
    };
    assert_eq!(event.count, Some(1));
    assert_ne!(event.metadata.name.as_deref(), Some("web-0.old"));
    r.observe(
        &key("a"),
        &pod_only(),
        &[Change::Cleared(after_restart(1, 410))],
        t(800),
    );
    // Recoveries aggregate like any open series: at most one patch per
    // update interval (10 s), counted from the take-over.
    assert_eq!(
        r.next_write(now),
        Next::Idle(Some(now + Duration::from_secs(10)))
    );
    let writes = drain(&mut r, now + Duration::from_secs(10), Outcome::Done);
    assert_eq!(writes.len(), 1);
    let (name, patch) = patch_of(&writes[0]);
    assert_eq!(name, "web-0.ok");
    assert_eq!(patch["count"], 3);
}

#[test]
fn events_of_other_nodes_components_and_kinds_are_not_taken() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    let mut other_node = open_episode()[0].clone();
    other_node["reportingInstance"] = json!("node-2");
    other_node["source"]["host"] = json!("node-2");
    let mut other_component = open_episode()[0].clone();
    other_component["reportingComponent"] = json!("kubelet");
    other_component["source"]["component"] = json!("kubelet");
    let mut other_kind = open_episode()[0].clone();
    other_kind["involvedObject"]["kind"] = json!("Node");
    let mut not_ours = open_episode()[0].clone();
    not_ours["message"] = json!("Back-off restarting failed container");
    let events = typed(&[other_node, other_component, other_kind, not_ours]);
    assert_eq!(r.adopt(&events, t(60), now), Adopted::default());
    r.observe(
        &key("a"),
        &pod_only(),
        &[Change::Raised(after_restart(3, 71))],
        t(71),
    );
    let writes = drain(&mut r, now, Outcome::Done);
    assert!(
        matches!(writes.as_slice(), [Write::Create { .. }]),
        "{writes:?}"
    );
}

// ---------------------------------------------------------------------------
// The writer's requests, against kube's mock service (tower-test)
// ---------------------------------------------------------------------------

mod api {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use health_core::conditions::Change;
    use health_kube::events::Recorder;
    use health_kube::events::Shared;
    use health_kube::observer::Observer;
    use health_kube::testing::{counted_client, next, respond, ApiRequest, MockHandle};
    use health_kube::writer::run;
    use http::Method;
    use serde_json::{json, Value};

    use super::common::{config, key, t};
    use super::{after_restart, open_episode, pod_only};

    /// This node's Events, by the node label, from the watch cache.
    const LIST: &str = "/api/v1/events?&labelSelector=volume-health.io%2Fnode%3Dnode-1&resourceVersion=0&resourceVersionMatch=NotOlderThan";
    /// A next page (a server may still page): the token replaces the version.
    const NEXT: &str =
        "/api/v1/events?&labelSelector=volume-health.io%2Fnode%3Dnode-1&continue=page-2";

    #[derive(Default)]
    struct Requests(Mutex<Vec<(String, String, Option<u16>)>>);

    impl Observer for Requests {
        fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
            if let Ok(mut seen) = self.0.lock() {
                seen.push((verb.to_string(), resource.to_string(), code));
            }
        }
        fn event_written(&self, _type_: &str, _reason: &str) {}
        fn event_write_deferred(&self) {}
    }

    fn list(items: Vec<Value>, next: Option<&str>) -> Value {
        let mut metadata = json!({"resourceVersion": "20"});
        if let Some(token) = next {
            metadata["continue"] = json!(token);
        }
        json!({"apiVersion": "v1", "kind": "EventList", "metadata": metadata, "items": items})
    }

    /// A writer whose recorder already holds the condition raised after the
    /// restart (detection does not wait for the API server).
    fn writer() -> (MockHandle, Arc<Requests>, tokio::task::JoinHandle<()>) {
        let seen = Arc::new(Requests::default());
        // Requests are counted by the client, as the agent's are.
        let (client, handle) = counted_client(seen.clone());
        let mut r = Recorder::new(config());
        r.observe(
            &key("a"),
            &pod_only(),
            &[Change::Raised(after_restart(3, 71))],
            t(71),
        );
        let observer: Arc<dyn Observer> = seen.clone();
        let task = tokio::spawn(run(client, Shared::new(r), Some(observer)));
        (handle, seen, task)
    }

    #[tokio::test]
    async fn the_writer_reads_back_its_events_in_pages_then_patches_the_open_one() {
        let (mut handle, seen, task) = writer();
        let (ApiRequest { method, uri, .. }, send) = next(&mut handle).await;
        assert_eq!((method, uri.as_str()), (Method::GET, LIST));
        let mut elsewhere = open_episode()[0].clone();
        elsewhere["reportingInstance"] = json!("node-2");
        elsewhere["source"]["host"] = json!("node-2");
        respond(send, 200, &list(vec![elsewhere], Some("page-2")));
        let (ApiRequest { method, uri, .. }, send) = next(&mut handle).await;
        assert_eq!(method, Method::GET);
        assert_eq!(uri, NEXT);
        respond(send, 200, &list(open_episode()[..1].to_vec(), None));

        let (
            ApiRequest {
                method, uri, body, ..
            },
            send,
        ) = next(&mut handle).await;
        assert_eq!(method, Method::PATCH);
        assert_eq!(uri, "/api/v1/namespaces/shop/events/web-0.old?");
        assert_eq!(body["count"], 8);
        respond(send, 200, &open_episode()[0]);
        let more = tokio::time::timeout(Duration::from_millis(500), handle.next_request()).await;
        assert!(more.is_err(), "no other request: no second Warning");
        let seen = seen.0.lock().expect("lock").clone();
        assert_eq!(
            seen,
            [
                ("list".to_string(), "events".to_string(), Some(200)),
                ("list".to_string(), "events".to_string(), Some(200)),
                ("patch".to_string(), "events".to_string(), Some(200)),
            ],
            "each page is a request"
        );
        task.abort();
    }

    #[tokio::test]
    async fn a_failed_read_back_is_counted_and_the_agent_goes_on_as_on_a_first_start() {
        let (mut handle, seen, task) = writer();
        let (ApiRequest { method, uri, .. }, send) = next(&mut handle).await;
        assert_eq!((method, uri.as_str()), (Method::GET, LIST));
        respond(
            send,
            403,
            &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "events is forbidden", "reason": "Forbidden", "code": 403}),
        );
        let (
            ApiRequest {
                method, uri, body, ..
            },
            send,
        ) = next(&mut handle).await;
        assert_eq!(method, Method::POST);
        assert_eq!(uri, "/api/v1/namespaces/shop/events?");
        assert_eq!(body["count"], 3);
        respond(send, 201, &body);
        let more = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(more.is_err(), "no other request");
        let seen = seen.0.lock().expect("lock").clone();
        assert_eq!(
            seen,
            [
                ("list".to_string(), "events".to_string(), Some(403)),
                ("create".to_string(), "events".to_string(), Some(201)),
            ]
        );
        task.abort();
    }
}
