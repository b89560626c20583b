//! The recorder as the controller uses it, pure: Events continued from a
//! former leader become the new leader's (`reportingInstance`), a condition
//! seeded at its Event's start keeps the Event's count, and a recovery on a
//! PVC waits until the claim's `VolumeHealth` stops asserting the condition
//! (and [`StatusFollower`] brings it the status writer's results).

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{drain, pvc, t, targets};
use health_core::conditions::{Change, Condition, Source, Status};
use health_kube::events::Shared;
use health_kube::events::{
    EventType, Next, ObjectRef, Outcome, Recorder, RecorderConfig, StatusFollower, Write,
};
use health_kube::status::{Claim, EntryCondition, EntryKind, SourceEntry};
use k8s_openapi::api::core::v1::Event;
use serde_json::{json, Value};
use tokio::time::Instant;

const COMPONENT: &str = "volume-health-controller";
const CONTRIBUTOR: &str = "pv/pv-1/h-1";
const SUBJECT: &str = "PV pv-1";
const HOLD: Duration = Duration::from_secs(10);

/// The controller's settings: replica `ctl-b`, continuing any replica's
/// Events, patches not spaced out.
fn controller() -> RecorderConfig {
    let mut c = RecorderConfig::new("ctl-b");
    c.component = COMPONENT.to_string();
    c.adopt_any_instance = true;
    c.min_update_interval = Duration::ZERO;
    c.unclaimed_clear_after = Duration::from_secs(365 * 24 * 3600);
    c
}

fn replica_lost(message: &str, since: u64, probe: u64) -> Condition {
    Condition {
        source: Source::CsiController,
        status: Status::Degraded,
        reason: "ReplicaLost".into(),
        message: message.into(),
        since: t(since),
        last_probe: t(probe),
        occurrences: None,
    }
}

fn stamp(secs: u64) -> String {
    let t = k8s_openapi::jiff::Timestamp::try_from(t(secs)).expect("a time in range");
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// An Event of the PVC `shop/data` as replica `ctl-a` wrote it.
fn by_ctl_a(
    name: &str,
    type_: &str,
    reason: &str,
    count: i32,
    secs: (u64, u64),
    message: &str,
) -> Event {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": name, "namespace": "shop", "resourceVersion": "7"},
        "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "namespace": "shop", "name": "data", "uid": "pvc-uid"},
        "type": type_, "reason": reason, "message": message, "count": count,
        "firstTimestamp": stamp(secs.0), "lastTimestamp": stamp(secs.1),
        "source": {"component": COMPONENT, "host": "ctl-a"},
        "reportingComponent": COMPONENT, "reportingInstance": "ctl-a"
    }))
    .expect("an Event")
}

fn patch_of(w: &Write) -> (&str, &Value) {
    match w {
        Write::Patch { name, patch, .. } => (name.as_str(), patch),
        other => panic!("expected a patch, got {other:?}"),
    }
}

/// What each write is: its type, reason and object (`patch <name>` for a patch).
fn kinds(writes: &[Write]) -> Vec<(EventType, String, String)> {
    writes
        .iter()
        .map(|w| {
            let (type_, reason) = w.kind();
            let object = match w {
                Write::Create { event, .. } => {
                    event.involved_object.name.clone().unwrap_or_default()
                }
                Write::Patch { name, .. } => format!("patch {name}"),
            };
            (type_, reason.to_string(), object)
        })
        .collect()
}

#[test]
fn a_former_leaders_events_go_on_under_the_new_leaders_name() {
    let mut r = Recorder::new(controller());
    let now = Instant::now();
    let events = [
        // An earlier episode, recovered under ctl-a.
        by_ctl_a(
            "data.ok",
            "Normal",
            "ReplicaLostCleared",
            1,
            (0, 5),
            "PV pv-1: Degraded ReplicaLost cleared; it was: replica 1 of 3 lost",
        ),
        // The open one, written once at 10 s.
        by_ctl_a(
            "data.open",
            "Warning",
            "ReplicaLost",
            1,
            (10, 10),
            "PV pv-1: Degraded ReplicaLost: replica 2 of 3 lost",
        ),
    ];
    let adopted = r.adopt(&events, t(60), now);
    assert_eq!((adopted.warnings, adopted.normals), (1, 1));
    // Seeded as the controller does: raised when the Event began. The Event
    // already says all of it: nothing to write, the count stays 1.
    let pvc_only = [pvc()];
    r.observe_on(
        CONTRIBUTOR,
        SUBJECT,
        &pvc_only,
        &[Change::Raised(replica_lost("replica 2 of 3 lost", 10, 10))],
        t(10),
    );
    assert_eq!(drain(&mut r, now, Outcome::Done), []);

    // The driver words it differently: the same Event, now ctl-b's.
    let second = replica_lost("replicas 2 and 3 of 3 lost", 10, 70);
    let changes = [Change::Updated {
        previous_message: "replica 2 of 3 lost".into(),
        condition: second.clone(),
    }];
    r.observe_on(CONTRIBUTOR, SUBJECT, &pvc_only, &changes, t(70));
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        patch_of(&writes[0]),
        (
            "data.open",
            &json!({
                "count": 2,
                "lastTimestamp": stamp(70),
                "message": "PV pv-1: Degraded ReplicaLost: replicas 2 and 3 of 3 lost",
                "reportingInstance": "ctl-b",
                "source": {"host": "ctl-b"}
            })
        )
    );

    // Recovered: the recovery Event of the earlier episode counts it, and
    // names ctl-b too.
    r.observe_on(
        CONTRIBUTOR,
        SUBJECT,
        &pvc_only,
        &[Change::Cleared(second)],
        t(80),
    );
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(writes.len(), 1, "{writes:?}");
    assert_eq!(
        patch_of(&writes[0]),
        (
            "data.ok",
            &json!({
                "count": 2,
                "lastTimestamp": stamp(80),
                "message": "PV pv-1: Degraded ReplicaLost cleared; it was: replicas 2 and 3 of 3 lost",
                "reportingInstance": "ctl-b",
                "source": {"host": "ctl-b"}
            })
        )
    );

    // Once written, it is ctl-b's: the next patch says nothing of instances.
    let third = replica_lost("replica 3 of 3 lost", 90, 90);
    r.observe_on(
        CONTRIBUTOR,
        SUBJECT,
        &pvc_only,
        &[Change::Raised(third.clone())],
        t(90),
    );
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(
        kinds(&writes),
        [(EventType::Warning, "ReplicaLost".into(), "data".into())]
    );
    r.observe_on(
        CONTRIBUTOR,
        SUBJECT,
        &pvc_only,
        &[Change::Cleared(third)],
        t(95),
    );
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(writes.len(), 1, "{writes:?}");
    let (name, patch) = patch_of(&writes[0]);
    assert_eq!(name, "data.ok");
    assert_eq!(
        patch,
        &json!({
            "count": 3,
            "lastTimestamp": stamp(95),
            "message": "PV pv-1: Degraded ReplicaLost cleared; it was: replica 3 of 3 lost"
        })
    );
}

fn claim() -> Claim {
    Claim {
        namespace: "shop".into(),
        name: "data".into(),
        uid: "pvc-uid".into(),
        pv: Some("pv-1".into()),
    }
}

/// The controller's entry on the claim asserting `reasons`.
fn entries(reasons: &[&str]) -> Vec<SourceEntry> {
    vec![SourceEntry {
        name: "CSIDriver".into(),
        kind: EntryKind::CsiDriver,
        node: None,
        driver: Some("hostpath.csi.k8s.io".into()),
        pods: vec![],
        pod_count: None,
        update_time: stamp(0),
        conditions: reasons
            .iter()
            .map(|r| EntryCondition {
                status: Status::Degraded,
                reason: r.to_string(),
                message: "m".into(),
                since: stamp(0),
                last_seen: None,
                count: None,
                origin: "csi-controller".into(),
            })
            .collect(),
    }]
}

/// A recorder with recoveries held, after a Warning on the pod web-0 and
/// the PVC (both written) and its recovery at 30 s.
fn recovered_on_pod_and_pvc(now: Instant) -> Recorder {
    let mut r = Recorder::new(controller());
    r.hold_recoveries(HOLD);
    let both: Vec<ObjectRef> = vec![targets("web-0").pod, pvc()];
    let c = replica_lost("replica 2 of 3 lost", 10, 10);
    r.observe_on(
        CONTRIBUTOR,
        SUBJECT,
        &both,
        &[Change::Raised(c.clone())],
        t(10),
    );
    assert_eq!(drain(&mut r, now, Outcome::Done).len(), 2);
    r.observe_on(CONTRIBUTOR, SUBJECT, &both, &[Change::Cleared(c)], t(30));
    r
}

#[test]
fn a_recovery_on_a_pvc_waits_until_the_claims_volume_health_no_longer_asserts_it() {
    let now = Instant::now();
    let mut r = recovered_on_pod_and_pvc(now);
    // The pod has no VolumeHealth: its recovery goes at once.
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(
        kinds(&writes),
        [(
            EventType::Normal,
            "ReplicaLostCleared".into(),
            "web-0".into()
        )]
    );
    assert!(r.has_waiting_recoveries());
    assert_eq!(r.next_write(now), Next::Idle(Some(now + HOLD)));

    // A write that still asserts it, or another claim's: still waiting.
    assert!(!r.volume_health_written(&claim(), Some(&entries(&["ReplicaLost"]))));
    let other = Claim {
        name: "logs".into(),
        ..claim()
    };
    assert!(!r.volume_health_written(&other, Some(&entries(&[]))));
    assert_eq!(
        drain(&mut r, now + Duration::from_secs(1), Outcome::Done),
        []
    );

    // The claim's object no longer asserts it (another condition stays):
    // the recovery goes.
    assert!(r.volume_health_written(&claim(), Some(&entries(&["PathHung"]))));
    assert!(!r.has_waiting_recoveries());
    let writes = drain(&mut r, now + Duration::from_secs(1), Outcome::Done);
    assert_eq!(
        kinds(&writes),
        [(
            EventType::Normal,
            "ReplicaLostCleared".into(),
            "data".into()
        )]
    );
    let Write::Create { event, .. } = &writes[0] else {
        unreachable!()
    };
    assert_eq!(event.count, Some(1));
    assert_eq!(
        event.last_timestamp.as_ref().map(|t| t.0.to_string()),
        Some(stamp(30))
    );
}

#[test]
fn what_follows_a_waiting_recovery_on_its_object_waits_behind_it_and_the_wait_ends() {
    let now = Instant::now();
    let mut r = recovered_on_pod_and_pvc(now);
    assert_eq!(
        drain(&mut r, now, Outcome::Done).len(),
        1,
        "the pod's recovery"
    );
    // A new episode on the PVC before the object caught up: its Warning
    // does not overtake the recovery.
    let again = replica_lost("replica 3 of 3 lost", 31, 31);
    r.observe_on(
        CONTRIBUTOR,
        SUBJECT,
        &[pvc()],
        &[Change::Raised(again)],
        t(31),
    );
    assert_eq!(
        drain(&mut r, now + Duration::from_secs(2), Outcome::Done),
        []
    );
    assert_eq!(
        r.next_write(now + Duration::from_secs(2)),
        Next::Idle(Some(now + HOLD))
    );
    // The status writer never answers: after the wait both go, in order.
    let writes = drain(&mut r, now + HOLD, Outcome::Done);
    assert_eq!(
        kinds(&writes),
        [
            (
                EventType::Normal,
                "ReplicaLostCleared".into(),
                "data".into()
            ),
            (EventType::Warning, "ReplicaLost".into(), "data".into()),
        ]
    );
}

#[test]
fn a_refused_status_write_lets_the_recovery_go() {
    let now = Instant::now();
    let mut r = recovered_on_pod_and_pvc(now);
    drain(&mut r, now, Outcome::Done);
    assert!(r.volume_health_written(&claim(), None));
    let writes = drain(&mut r, now, Outcome::Done);
    assert_eq!(
        kinds(&writes),
        [(
            EventType::Normal,
            "ReplicaLostCleared".into(),
            "data".into()
        )]
    );
}

#[test]
fn the_follower_hands_results_to_the_recorder_it_follows_while_it_lives() {
    let now = Instant::now();
    let follower = StatusFollower::default();
    // Nothing followed yet: a result goes nowhere.
    follower.written(&claim(), Some(&entries(&[])));
    let shared = Shared::new(recovered_on_pod_and_pvc(now));
    follower.follow(&shared);
    drain(&mut shared.lock(), now, Outcome::Done);
    follower.written(&claim(), Some(&entries(&["ReplicaLost"])));
    assert!(shared.lock().has_waiting_recoveries());
    follower.written(&claim(), Some(&entries(&[])));
    assert!(!shared.lock().has_waiting_recoveries());
    let writes = drain(&mut shared.lock(), now, Outcome::Done);
    assert_eq!(
        kinds(&writes),
        [(
            EventType::Normal,
            "ReplicaLostCleared".into(),
            "data".into()
        )]
    );
    // The leadership ended: its recorder is gone, results are dropped.
    let weak = Arc::downgrade(&shared);
    drop(shared);
    assert!(weak.upgrade().is_none());
    follower.written(&claim(), None);
}
