//! The exact requests the Event writer ([`health_kube::writer`]) sends,
//! against kube's mock API service (tower-test): a create, then merge
//! patches of the same Event; how each API answer maps to an outcome; and
//! what the writer reports (writes, deferrals by the per-object cap).

use crate::common;

use std::time::Duration;

use common::{block, config, key, t, targets};
use health_core::conditions::Change;
use health_kube::events::Shared;
use health_kube::events::{Next, Outcome, Recorder, Targets, Write};
use health_kube::observer::Observer;
use health_kube::testing::{client, next, respond, ApiRequest};
use health_kube::writer::{perform, run};
use http::Method;
use serde_json::{json, Value};

fn status(code: u16, reason: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": format!("test says {reason}"), "reason": reason, "code": code})
}

fn first_write(r: &mut Recorder) -> Write {
    match r.next_write(tokio::time::Instant::now()) {
        Next::Write(w) => w,
        other => panic!("expected a write, got {other:?}"),
    }
}

#[tokio::test]
async fn create_then_patch_send_exactly_these_requests() {
    let (client, mut handle) = client();
    let mut r = Recorder::new(config());
    let pod_only = Targets {
        pvc: None,
        ..targets("web-0")
    };
    r.observe(&key("a"), &pod_only, &[Change::Raised(block(3, 1))], t(1));
    let create = first_write(&mut r);
    let Write::Create { event, .. } = &create else {
        panic!("expected a create");
    };
    let expected = serde_json::to_value(event.as_ref()).expect("json");
    let name = event.metadata.name.clone().expect("a name");

    let server = tokio::spawn(async move {
        let (
            ApiRequest {
                method,
                uri,
                content_type: ct,
                body,
            },
            send,
        ) = next(&mut handle).await;
        assert_eq!(method, Method::POST);
        assert_eq!(uri, "/api/v1/namespaces/shop/events?");
        assert_eq!(ct.as_deref(), Some("application/json"));
        assert_eq!(body, expected);
        respond(send, 201, &body);
        handle
    });
    assert_eq!(perform(&client, &create, None).await, Outcome::Done);
    let mut handle = server.await.expect("server task");
    r.finish(&create, Outcome::Done, tokio::time::Instant::now());

    r.observe(
        &key("a"),
        &pod_only,
        &[Change::Updated {
            previous_message: String::new(),
            condition: block(40, 9),
        }],
        t(9),
    );
    let patch = match r.next_write(tokio::time::Instant::now() + Duration::from_secs(10)) {
        Next::Write(w) => w,
        other => panic!("expected a patch, got {other:?}"),
    };
    let server = tokio::spawn(async move {
        let (
            ApiRequest {
                method,
                uri,
                content_type: ct,
                body,
            },
            send,
        ) = next(&mut handle).await;
        assert_eq!(method, Method::PATCH);
        assert_eq!(uri, format!("/api/v1/namespaces/shop/events/{name}?"));
        assert_eq!(ct.as_deref(), Some("application/merge-patch+json"));
        assert_eq!(
            body,
            json!({
                "count": 40,
                "lastTimestamp": "2027-01-15T08:00:09Z",
                "message": "PV pv-1 (volume \"data\"): Degraded BlockIOErrors: 40 block I/O errors (write, EIO) on loop3 (7:3)"
            })
        );
        respond(
            send,
            200,
            &json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": "shop"},
            "involvedObject": {"kind": "Pod", "name": "web-0", "namespace": "shop"}}),
        );
    });
    assert_eq!(perform(&client, &patch, None).await, Outcome::Done);
    server.await.expect("server task");
}

#[tokio::test]
async fn api_answers_map_to_outcomes() {
    let cases: [(u16, &str, bool, Outcome); 5] = [
        (404, "NotFound", true, Outcome::NotFound),
        (409, "AlreadyExists", false, Outcome::Conflict),
        (503, "ServiceUnavailable", false, Outcome::Retry),
        (429, "TooManyRequests", true, Outcome::Retry),
        (403, "Forbidden", false, Outcome::Rejected),
    ];
    for (code, reason, patch, want) in cases {
        let (client, mut handle) = client();
        let mut r = Recorder::new(config());
        r.observe(
            &key("a"),
            &targets("web-0"),
            &[Change::Raised(block(1, 0))],
            t(0),
        );
        let mut w = first_write(&mut r);
        if patch {
            r.finish(&w, Outcome::Done, tokio::time::Instant::now());
            r.observe(
                &key("a"),
                &targets("web-0"),
                &[Change::Updated {
                    previous_message: String::new(),
                    condition: block(2, 20),
                }],
                t(20),
            );
            w = match r.next_write(tokio::time::Instant::now() + Duration::from_secs(30)) {
                Next::Write(w) => w,
                other => panic!("expected a patch, got {other:?}"),
            };
            assert!(matches!(w, Write::Patch { .. }));
        }
        let server = tokio::spawn(async move {
            let (_, send) = next(&mut handle).await;
            respond(send, code, &status(code, reason));
        });
        assert_eq!(perform(&client, &w, None).await, want, "HTTP {code}");
        server.await.expect("server task");
    }
}

/// Counts what the writer reports.
#[derive(Default)]
struct Seen {
    written: std::sync::atomic::AtomicU64,
    deferred: std::sync::atomic::AtomicU64,
}

impl Observer for Seen {
    fn api_request(&self, _verb: &str, _resource: &str, _code: Option<u16>) {}
    fn event_written(&self, _type_: &str, _reason: &str) {
        self.written
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn event_write_deferred(&self) {
        self.deferred
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

#[tokio::test]
async fn the_writer_reports_writes_and_deferrals_by_the_cap() {
    use std::sync::atomic::Ordering::Relaxed;
    let (client, mut handle) = client();
    let mut cfg = config();
    cfg.writes_per_object_per_minute = 1;
    let mut r = Recorder::new(cfg);
    // Two conditions on one pod: the second create waits for the cap.
    let pod_only = Targets {
        pvc: None,
        ..targets("web-0")
    };
    let mut other = block(1, 0);
    other.reason = "WritebackErrors".into();
    r.observe(
        &key("a"),
        &pod_only,
        &[Change::Raised(block(1, 0)), Change::Raised(other)],
        t(0),
    );
    let shared = Shared::new(r);
    let seen = std::sync::Arc::new(Seen::default());
    let observer: std::sync::Arc<dyn Observer> = seen.clone();
    let task = tokio::spawn(run(client, std::sync::Arc::clone(&shared), Some(observer)));
    // First the read-back of earlier Events (none here).
    let (ApiRequest { method, .. }, send) = next(&mut handle).await;
    assert_eq!(method, Method::GET);
    respond(
        send,
        200,
        &json!({"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": []}),
    );
    let (ApiRequest { method, body, .. }, send) = next(&mut handle).await;
    assert_eq!(method, Method::POST);
    respond(send, 201, &body);
    // The second write is held: no request within a second.
    let more = tokio::time::timeout(Duration::from_secs(1), handle.next_request()).await;
    assert!(more.is_err(), "a second write went out despite the cap");
    assert_eq!(seen.written.load(Relaxed), 1);
    assert_eq!(seen.deferred.load(Relaxed), 1);
    task.abort();
}
