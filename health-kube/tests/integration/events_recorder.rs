//! The event recorder's rules ([`health_kube::events::Recorder`]), pure: no
//! server and no clock of its own. One Event per object and episode, counts
//! that are the errors' and not the sum over pods, the per-object cap, an
//! outage, recoveries, expiry.

use crate::common;

use std::time::Duration;

use common::{block, config, drain, key, t, targets};
use health_core::conditions::{Change, Condition};
use health_kube::events::{EventType, Next, Outcome, Recorder, Targets, Write};
use serde_json::json;
use tokio::time::Instant;

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
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"volume-health.io/node": "node-1"}},
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
        drain(
            &mut r,
            now + health_kube::events::NORMAL_IDLE,
            Outcome::Done
        ),
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
