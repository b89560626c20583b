//! The recorder's rules (pure, no server) and the exact requests the
//! writer and the reflectors send (kube's mock-service approach).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio::time::Instant;

use super::events::{
    EventType, Next, ObjectKind, ObjectRef, Outcome, Recorder, RecorderConfig, Targets, Write,
};
use crate::volumes::conditions::{Change, Condition, Source, Status};
use crate::volumes::kubelet::VolumeMode;
use crate::volumes::VolumeKey;

pub(super) fn t(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

pub(super) fn key(pod_uid: &str) -> VolumeKey {
    VolumeKey {
        pod_uid: pod_uid.into(),
        name: "pv-1".into(),
        mode: VolumeMode::Filesystem,
    }
}

pub(super) fn pvc() -> ObjectRef {
    ObjectRef {
        kind: ObjectKind::PersistentVolumeClaim,
        namespace: "shop".into(),
        name: "data".into(),
        uid: "pvc-uid".into(),
    }
}

pub(super) fn targets(pod: &str) -> Targets {
    Targets {
        pod: ObjectRef {
            kind: ObjectKind::Pod,
            namespace: "shop".into(),
            name: pod.into(),
            uid: format!("{pod}-uid"),
        },
        pod_volume: "data".into(),
        pvc: Some(pvc()),
        pv: Some("pv-1".into()),
    }
}

pub(super) fn block(count: u64, last: u64) -> Condition {
    Condition {
        source: Source::Kernel,
        status: Status::Degraded,
        reason: "BlockIOErrors".into(),
        message: format!("{count} block I/O errors (write, EIO) on loop3 (7:3)"),
        since: t(0),
        last_probe: t(last),
        occurrences: Some(count),
    }
}

pub(super) fn config() -> RecorderConfig {
    RecorderConfig::new("node-1")
}

/// Takes every write due at `now`, answering each with `outcome`.
pub(super) fn drain(r: &mut Recorder, now: Instant, outcome: Outcome) -> Vec<Write> {
    let mut out = Vec::new();
    while let Next::Write(w) = r.next_write(now) {
        r.finish(&w, outcome.clone(), now);
        out.push(w);
        assert!(out.len() < 1000, "the recorder keeps producing writes");
    }
    out
}

fn object_of(w: &Write) -> (String, String) {
    match w {
        Write::Create { event, .. } => (
            event.involved_object.kind.clone().unwrap_or_default(),
            event.involved_object.name.clone().unwrap_or_default(),
        ),
        Write::Patch { name, .. } => ("patch".into(), name.clone()),
    }
}

#[test]
fn shared_volume_gives_one_event_per_pod_and_one_on_the_pvc() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    r.observe(
        &key("a"),
        &targets("web-0"),
        &[Change::Raised(block(3, 1))],
        t(1),
    );
    r.observe(
        &key("b"),
        &targets("web-1"),
        &[Change::Raised(block(3, 1))],
        t(1),
    );
    let writes = drain(&mut r, now, Outcome::Done);
    let objects: Vec<(String, String)> = writes.iter().map(object_of).collect();
    assert_eq!(
        objects,
        [
            ("Pod".to_string(), "web-0".to_string()),
            ("PersistentVolumeClaim".to_string(), "data".to_string()),
            ("Pod".to_string(), "web-1".to_string()),
        ]
    );
    let Write::Create { event, .. } = &writes[1] else {
        panic!("expected a create, got {:?}", writes[1]);
    };
    let body = serde_json::to_value(event.as_ref()).expect("event serializes");
    let name = body["metadata"]["name"]
        .as_str()
        .expect("a name")
        .to_string();
    assert!(name.starts_with("data."), "{name}");
    assert_eq!(
        body,
        json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": "shop"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": "shop",
                "name": "data",
                "uid": "pvc-uid"
            },
            "reason": "BlockIOErrors",
            "message": "pods shop/web-0, shop/web-1 (PV pv-1): Degraded BlockIOErrors: 3 block I/O errors (write, EIO) on loop3 (7:3)",
            "type": "Warning",
            "count": 3,
            "firstTimestamp": "2027-01-15T08:00:00Z",
            "lastTimestamp": "2027-01-15T08:00:01Z",
            "source": {"component": "volume-health-agent", "host": "node-1"},
            "reportingComponent": "volume-health-agent",
            "reportingInstance": "node-1"
        })
    );
    let Write::Create { event, .. } = &writes[0] else {
        panic!("expected a create");
    };
    assert_eq!(
        event.message.as_deref(),
        Some("PVC shop/data (PV pv-1, volume \"data\"): Degraded BlockIOErrors: 3 block I/O errors (write, EIO) on loop3 (7:3)")
    );

    // Both pods see the next errors: the PVC's count is the errors', not
    // the sum over pods.
    r.observe(&key("a"), &targets("web-0"), &[updated(block(10, 5))], t(5));
    r.observe(&key("b"), &targets("web-1"), &[updated(block(10, 5))], t(5));
    assert_eq!(
        drain(&mut r, now + Duration::from_secs(1), Outcome::Done),
        []
    );
    let later = drain(&mut r, now + Duration::from_secs(10), Outcome::Done);
    let counts: Vec<(String, u64)> = later
        .iter()
        .map(|w| match w {
            Write::Patch { name, patch, .. } => (
                name.split('.').next().unwrap_or_default().to_string(),
                patch["count"].as_u64().unwrap_or(0),
            ),
            other => panic!("expected patches, got {other:?}"),
        })
        .collect();
    assert_eq!(
        counts,
        [
            ("web-0".to_string(), 10),
            ("data".to_string(), 10),
            ("web-1".to_string(), 10)
        ]
    );
}

fn updated(c: Condition) -> Change {
    Change::Updated {
        previous_message: String::new(),
        condition: c,
    }
}

#[test]
fn a_storm_stays_within_the_cap_and_ends_with_the_exact_count() {
    let mut cfg = config();
    cfg.writes_per_object_per_minute = 4;
    cfg.min_update_interval = Duration::from_secs(1);
    let mut r = Recorder::new(cfg);
    let start = Instant::now();
    let mut writes: Vec<(Instant, Write)> = Vec::new();
    // 10,000 errors over 100 s, reported once a second (the kernel flush).
    for sec in 0..100u64 {
        let now = start + Duration::from_secs(sec);
        let c = block((sec + 1) * 100, sec);
        let change = if sec == 0 {
            Change::Raised(c)
        } else {
            updated(c)
        };
        r.observe(&key("a"), &targets("web-0"), &[change], t(sec));
        writes.extend(
            drain(&mut r, now, Outcome::Done)
                .into_iter()
                .map(|w| (now, w)),
        );
    }
    // After the storm, the held-back state goes out when the cap allows.
    for sec in 100..200u64 {
        let now = start + Duration::from_secs(sec);
        writes.extend(
            drain(&mut r, now, Outcome::Done)
                .into_iter()
                .map(|w| (now, w)),
        );
    }
    for object in ["web-0", "data"] {
        let times: Vec<Instant> = writes
            .iter()
            .filter(|(_, w)| series_object(w) == object)
            .map(|(at, _)| *at)
            .collect();
        for (i, at) in times.iter().enumerate() {
            let in_window = times[i..]
                .iter()
                .take_while(|t| t.duration_since(*at) < Duration::from_secs(60))
                .count();
            assert!(
                in_window <= 4,
                "{object}: {in_window} writes within a minute"
            );
        }
        // 100 s of storm plus the tail: at most 4 per started minute.
        assert!(times.len() <= 12, "{object}: {} writes", times.len());
        let last = writes
            .iter()
            .rev()
            .find(|(_, w)| series_object(w) == object)
            .map(|(_, w)| w.clone())
            .expect("a write");
        assert_eq!(count_of(&last), 10_000, "{object}: final count");
    }
    assert!(!r.has_pending());
    assert!(r.stats().deferred >= 1);
}

fn series_object(w: &Write) -> String {
    match w {
        Write::Create { event, .. } => event.involved_object.name.clone().unwrap_or_default(),
        Write::Patch { name, .. } => name.split('.').next().unwrap_or_default().to_string(),
    }
}

fn count_of(w: &Write) -> u64 {
    match w {
        Write::Create { event, .. } => event.count.unwrap_or(0) as u64,
        Write::Patch { patch, .. } => patch["count"].as_u64().unwrap_or(0),
    }
}

#[test]
fn an_outage_loses_nothing_and_reports_exact_totals_after() {
    let mut r = Recorder::new(config());
    let start = Instant::now();
    r.observe(
        &key("a"),
        &targets("web-0"),
        &[Change::Raised(block(5, 0))],
        t(0),
    );
    // The API server is down: every attempt fails, the errors keep coming.
    let mut attempts = 0;
    for sec in 0..120u64 {
        let now = start + Duration::from_secs(sec);
        r.observe(
            &key("a"),
            &targets("web-0"),
            &[updated(block(5 + sec * 7, sec))],
            t(sec),
        );
        // One attempt per second at most (the writer's backoff is longer).
        if let Next::Write(w) = r.next_write(now) {
            r.finish(&w, Outcome::Retry, now);
            attempts += 1;
        }
    }
    assert!(r.has_pending());
    assert!(attempts <= 120);
    // Back: the first writes carry the totals of the whole outage.
    let now = start + Duration::from_secs(121);
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(writes.len(), 2, "{writes:?}");
    for w in &writes {
        let Write::Create { event, .. } = w else {
            panic!("nothing reached the server before: expected creates, got {w:?}");
        };
        assert_eq!(event.count, Some(5 + 119 * 7));
        assert_eq!(event.type_.as_deref(), Some("Warning"));
    }
    assert!(!r.has_pending());
}

#[test]
fn a_recovery_is_a_normal_event_and_the_next_episode_a_new_object() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    let pod_only = Targets {
        pvc: None,
        ..targets("web-0")
    };
    r.observe(&key("a"), &pod_only, &[Change::Raised(block(2, 0))], t(0));
    let first = drain(&mut r, now, Outcome::Done);
    assert_eq!(first.len(), 1);
    let first_name = match &first[0] {
        Write::Create { event, .. } => event.metadata.name.clone().expect("a name"),
        w => panic!("expected a create, got {w:?}"),
    };
    r.observe(
        &key("a"),
        &pod_only,
        &[Change::Cleared(block(2, 0))],
        t(300),
    );
    let writes = drain(&mut r, now + Duration::from_secs(1), Outcome::Done);
    assert_eq!(writes.len(), 1, "{writes:?}");
    let Write::Create { event, .. } = &writes[0] else {
        panic!("expected a create");
    };
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(event.reason.as_deref(), Some("BlockIOErrorsCleared"));
    assert_eq!(
        event.message.as_deref(),
        Some("PV pv-1 (volume \"data\"): Degraded BlockIOErrors cleared; it was: 2 block I/O errors (write, EIO) on loop3 (7:3)")
    );
    assert_eq!(event.count, Some(1));
    // The closed Warning series is gone; a new episode is a new object.
    r.observe(
        &key("a"),
        &pod_only,
        &[Change::Raised(block(1, 400))],
        t(400),
    );
    let again = drain(&mut r, now + Duration::from_secs(2), Outcome::Done);
    assert_eq!(again.len(), 1);
    match &again[0] {
        Write::Create { event, .. } => {
            assert_ne!(event.metadata.name.as_deref(), Some(first_name.as_str()));
            assert_eq!(event.count, Some(1));
        }
        w => panic!("expected a create, got {w:?}"),
    }
    assert_eq!(r.len(), 2, "the open Warning and the Normal series");
}

#[test]
fn idle_recovery_events_are_let_go() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    let pod_only = Targets {
        pvc: None,
        ..targets("web-0")
    };
    r.observe(&key("a"), &pod_only, &[Change::Raised(block(2, 0))], t(0));
    r.observe(
        &key("a"),
        &pod_only,
        &[Change::Cleared(block(2, 0))],
        t(300),
    );
    assert_eq!(drain(&mut r, now, Outcome::Done).len(), 2);
    assert_eq!(
        r.len(),
        1,
        "the recovery series stays to aggregate the next one"
    );
    assert_eq!(
        drain(&mut r, now + super::events::NORMAL_IDLE, Outcome::Done),
        []
    );
    assert!(r.is_empty());
}

#[test]
fn a_pod_that_goes_away_is_not_a_recovery() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    r.observe(
        &key("a"),
        &targets("web-0"),
        &[Change::Raised(block(2, 0))],
        t(0),
    );
    r.observe(
        &key("b"),
        &targets("web-1"),
        &[Change::Raised(block(2, 0))],
        t(0),
    );
    assert_eq!(drain(&mut r, now, Outcome::Done).len(), 3);
    r.forget_volume(&key("a"));
    r.forget_volume(&key("b"));
    assert_eq!(
        drain(&mut r, now + Duration::from_secs(60), Outcome::Done),
        []
    );
    assert!(r.is_empty());
}

#[test]
fn an_expired_event_is_created_again_with_the_full_count() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    let pod_only = Targets {
        pvc: None,
        ..targets("web-0")
    };
    r.observe(&key("a"), &pod_only, &[Change::Raised(block(2, 0))], t(0));
    assert_eq!(drain(&mut r, now, Outcome::Done).len(), 1);
    r.observe(&key("a"), &pod_only, &[updated(block(9, 20))], t(20));
    let later = now + Duration::from_secs(20);
    let Next::Write(w) = r.next_write(later) else {
        panic!("a patch is due");
    };
    assert!(matches!(w, Write::Patch { .. }));
    r.finish(&w, Outcome::NotFound, later);
    let Next::Write(again) = r.next_write(later) else {
        panic!("a create is due");
    };
    let Write::Create { event, .. } = &again else {
        panic!("expected a create, got {again:?}");
    };
    assert_eq!(event.count, Some(9));
    r.finish(&again, Outcome::Done, later);
    assert!(!r.has_pending());
}

#[test]
fn rejected_writes_are_not_retried() {
    let mut r = Recorder::new(config());
    let now = Instant::now();
    r.observe(
        &key("a"),
        &targets("web-0"),
        &[Change::Raised(block(2, 0))],
        t(0),
    );
    assert_eq!(drain(&mut r, now, Outcome::Rejected).len(), 2);
    assert!(!r.has_pending());
    assert_eq!(r.next_write(now), Next::Idle(None));
}

#[test]
fn event_type_names() {
    assert_eq!(EventType::Warning.as_str(), "Warning");
    assert_eq!(EventType::Normal.as_str(), "Normal");
}

// ---------------------------------------------------------------------------
// Exact requests, against kube's mock service (tower-test)
// ---------------------------------------------------------------------------

mod api {
    use std::time::Duration;

    use http::{Method, Request, Response};
    use kube::client::Body;
    use serde_json::{json, Value};
    use tower_test::mock::{self, Handle, SendResponse};

    use super::super::cluster::ClusterView;
    use super::super::events::{Next, ObjectKind, Outcome, Recorder, Write};
    use super::super::writer::perform;
    use super::{block, config, key, t, targets};
    use crate::volumes::conditions::Change;
    use crate::volumes::kubelet::{KubeletVolume, VolumeKind, VolumeMode};

    type MockHandle = Handle<Request<Body>, Response<Body>>;

    fn client() -> (kube::Client, MockHandle) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        (kube::Client::new(service, "default"), handle)
    }

    /// The next request: method, URI, content type and JSON body.
    async fn next(
        handle: &mut MockHandle,
    ) -> (
        Method,
        String,
        Option<String>,
        Value,
        SendResponse<Response<Body>>,
    ) {
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("a request within 5 s")
            .expect("the client is still there");
        let method = req.method().clone();
        let uri = req.uri().to_string();
        let ct = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.to_str().unwrap_or_default().to_string());
        let bytes = req.into_body().collect_bytes().await.expect("a body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("a JSON body")
        };
        (method, uri, ct, body, send)
    }

    fn respond(send: SendResponse<Response<Body>>, code: u16, body: &Value) {
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(body).expect("json")))
                .expect("a response"),
        );
    }

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
        let pod_only = super::Targets {
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
            let (method, uri, ct, body, send) = next(&mut handle).await;
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
            let (method, uri, ct, body, send) = next(&mut handle).await;
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
                let (_, _, _, _, send) = next(&mut handle).await;
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

    impl super::super::writer::Observer for Seen {
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
        let pod_only = super::Targets {
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
        let shared = super::super::writer::Shared::new(r);
        let seen = std::sync::Arc::new(Seen::default());
        let observer: std::sync::Arc<dyn super::super::writer::Observer> = seen.clone();
        let task = tokio::spawn(super::super::writer::run(
            client,
            std::sync::Arc::clone(&shared),
            Some(observer),
        ));
        // First the read-back of earlier Events (none here).
        let (method, _, _, _, send) = next(&mut handle).await;
        assert_eq!(method, Method::GET);
        respond(
            send,
            200,
            &json!({"apiVersion": "v1", "kind": "EventList", "metadata": {}, "items": []}),
        );
        let (method, _, _, body, send) = next(&mut handle).await;
        assert_eq!(method, Method::POST);
        respond(send, 201, &body);
        // The second write is held: no request within a second.
        let more = tokio::time::timeout(Duration::from_secs(1), handle.next_request()).await;
        assert!(more.is_err(), "a second write went out despite the cap");
        assert_eq!(seen.written.load(Relaxed), 1);
        assert_eq!(seen.deferred.load(Relaxed), 1);
        task.abort();
    }

    fn pod_list() -> Value {
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
        "items": [{
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "uid-web-0",
                         "resourceVersion": "9", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
        }]})
    }

    fn pv_list() -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeList", "metadata": {"resourceVersion": "10"},
        "items": [{
            "metadata": {"name": "pv-1", "resourceVersion": "8"},
            "spec": {"claimRef": {"namespace": "shop", "name": "data", "uid": "uid-pvc"},
                     "csi": {"driver": "test.csi", "volumeHandle": "h-1"}}
        }]})
    }

    #[tokio::test]
    async fn reflectors_list_and_watch_this_node_and_map_volumes() {
        let (client, mut handle) = client();
        let (view, tasks) = ClusterView::start(client, "node-1", None);
        let mut seen = Vec::new();
        let mut held = Vec::new();
        // Two lists, then two watches (in either order across the two).
        for _ in 0..4 {
            let (method, uri, _, _, send) = next(&mut handle).await;
            assert_eq!(method, Method::GET);
            if uri.contains("watch=true") {
                held.push(send); // the watch stays open, with nothing new
            } else if uri.starts_with("/api/v1/pods") {
                respond(send, 200, &pod_list());
            } else {
                respond(send, 200, &pv_list());
            }
            seen.push(uri);
        }
        seen.sort();
        assert_eq!(
            seen,
            [
                "/api/v1/persistentvolumes?&limit=500",
                "/api/v1/persistentvolumes?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=10",
                "/api/v1/pods?&fieldSelector=spec.nodeName%3Dnode-1&limit=500",
                "/api/v1/pods?&watch=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3Dnode-1&allowWatchBookmarks=true&resourceVersion=10",
            ]
        );
        assert!(view.is_ready());
        let v = KubeletVolume {
            pod_uid: "uid-web-0".into(),
            pv: Some("pv-1".into()),
            pod_volume_dir_name: "pv-1".into(),
            driver: Some("test.csi".into()),
            volume_handle: Some("h-1".into()),
            volume_mode: VolumeMode::Filesystem,
            kind: VolumeKind::Csi,
            path: "/var/lib/kubelet/pods/uid-web-0/volumes/kubernetes.io~csi/pv-1/mount".into(),
            staging_path: None,
            node_name: Some("node-1".into()),
        };
        let t = view.targets(&v).expect("the pod is known");
        assert_eq!(t.pod.kind, ObjectKind::Pod);
        assert_eq!(
            (
                t.pod.namespace.as_str(),
                t.pod.name.as_str(),
                t.pod.uid.as_str()
            ),
            ("shop", "web-0", "uid-web-0")
        );
        assert_eq!(t.pod_volume, "data");
        let pvc = t.pvc.expect("the claim");
        assert_eq!(
            (pvc.namespace.as_str(), pvc.name.as_str(), pvc.uid.as_str()),
            ("shop", "data", "uid-pvc")
        );
        assert_eq!(t.pv.as_deref(), Some("pv-1"));
        // An unknown pod is not guessed at.
        let other = KubeletVolume {
            pod_uid: "uid-other".into(),
            ..v
        };
        assert_eq!(view.targets(&other), None);
        // What Events continued from before a restart may stay about.
        let object = |kind, name: &str, uid: &str| super::super::events::ObjectRef {
            kind,
            namespace: "shop".into(),
            name: name.into(),
            uid: uid.into(),
        };
        assert!(view.reports_on(&object(ObjectKind::Pod, "web-0", "uid-web-0")));
        assert!(!view.reports_on(&object(ObjectKind::Pod, "web-0", "uid-of-a-deleted-web-0")));
        assert!(view.reports_on(&object(
            ObjectKind::PersistentVolumeClaim,
            "data",
            "uid-pvc"
        )));
        assert!(!view.reports_on(&object(
            ObjectKind::PersistentVolumeClaim,
            "logs",
            "uid-logs"
        )));
        drop(held);
        for task in tasks {
            task.abort();
        }
    }
}
