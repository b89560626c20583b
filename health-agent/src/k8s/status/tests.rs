//! The board's write-on-change rules: what is due when, what a restart
//! carries over, what leaving a claim removes. (The requests themselves are
//! tested against a real API server: tests/tests/apiserver_status.rs.)

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use super::board::{Board, Done, Next};
use super::types::{EntryCondition, EntryKind, HealthStatus, SourceEntry, Spec, VolumeHealth};
use super::Claim;
use crate::volumes::conditions::Status;

const INTERVAL: Duration = Duration::from_secs(10);
const QUIET: Duration = Duration::from_secs(300);

fn claim() -> Claim {
    Claim {
        namespace: "shop".into(),
        name: "data".into(),
        uid: "u-1".into(),
        pv: Some("pv-1".into()),
    }
}

fn at(secs: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
}

fn entry(count: Option<u64>, last_seen: &str) -> SourceEntry {
    SourceEntry {
        name: "Node/node-a".into(),
        kind: EntryKind::Node,
        node: Some("node-a".into()),
        driver: None,
        pods: vec!["shop/web-0".into()],
        pod_count: Some(1),
        update_time: last_seen.into(),
        conditions: vec![EntryCondition {
            status: Status::Degraded,
            reason: "BlockIOErrors".into(),
            message: format!("{count:?} errors"),
            since: "2027-01-15T08:00:00Z".into(),
            last_seen: Some(last_seen.into()),
            count,
            origin: "kernel".into(),
        }],
    }
}

fn write(board: &mut Board, now: Instant, wall: SystemTime) -> Vec<SourceEntry> {
    match board.next(now, wall) {
        Next::Write(c, e) => {
            assert_eq!(c, claim());
            board.finish(&c, e.clone(), Done::Written, now);
            e
        }
        Next::Idle(at) => panic!("expected a write, idle until {at:?}"),
    }
}

fn idle(board: &mut Board, now: Instant, wall: SystemTime) -> Option<Instant> {
    match board.next(now, wall) {
        Next::Idle(at) => at,
        Next::Write(_, e) => panic!("expected nothing due, got a write of {e:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn a_raise_is_written_at_once_counts_at_most_every_interval_and_nothing_else() {
    let t0 = Instant::now();
    let mut b = Board::new(INTERVAL, QUIET);
    b.set_ready();
    b.set(&claim(), vec![entry(Some(1), "2027-01-15T08:00:00Z")]);
    assert_eq!(write(&mut b, t0, at(0))[0].conditions[0].count, Some(1));
    assert_eq!(idle(&mut b, t0, at(0)), None, "written: nothing due");

    // Only lastSeen and updateTime move: never a write.
    b.set(&claim(), vec![entry(Some(1), "2027-01-15T08:05:00Z")]);
    assert_eq!(idle(&mut b, t0 + Duration::from_secs(60), at(60)), None);

    // A new count: due one interval after the last write.
    b.set(&claim(), vec![entry(Some(9_999), "2027-01-15T08:00:01Z")]);
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(idle(&mut b, t1, at(1)), Some(t0 + INTERVAL));
    b.set(&claim(), vec![entry(Some(10_000), "2027-01-15T08:00:02Z")]);
    let e = write(&mut b, t0 + INTERVAL, at(10));
    assert_eq!(
        e[0].conditions[0].count,
        Some(10_000),
        "the latest count, once"
    );

    // Recovery: written at once, the entry kept without conditions.
    let mut healthy = entry(None, "x");
    healthy.conditions.clear();
    b.set(&claim(), vec![]);
    let e = write(&mut b, t0 + INTERVAL + Duration::from_secs(1), at(11));
    assert_eq!(
        e,
        vec![SourceEntry {
            update_time: e[0].update_time.clone(),
            ..healthy
        }]
    );
    assert_eq!(idle(&mut b, t0 + Duration::from_secs(100), at(100)), None);

    // The pod left the node: the entry goes, then the claim's state.
    b.release("shop", "data");
    assert_eq!(
        write(&mut b, t0 + Duration::from_secs(101), at(101)),
        vec![]
    );
    assert!(b.is_empty());
}

#[tokio::test(start_paused = true)]
async fn with_a_settle_a_raise_waits_from_when_it_was_first_seen() {
    let settle = Duration::from_millis(20);
    let t0 = Instant::now();
    let mut b = Board::new(INTERVAL, QUIET).with_settle(settle);
    b.set_ready();
    b.set(&claim(), vec![entry(Some(1), "2027-01-15T08:00:00Z")]);
    assert_eq!(idle(&mut b, t0, at(0)), Some(t0 + settle));
    // More changes meanwhile do not push the write further out.
    b.set(&claim(), vec![entry(Some(7), "2027-01-15T08:00:00Z")]);
    let t1 = t0 + Duration::from_millis(15);
    assert_eq!(idle(&mut b, t1, at(0)), Some(t0 + settle));
    let e = write(&mut b, t0 + settle, at(0));
    assert_eq!(e[0].conditions[0].count, Some(7), "the burst in one write");

    // Count updates keep their interval; a recovery settles from when it was
    // seen, as a raise does.
    b.set(&claim(), vec![]);
    let t2 = t0 + Duration::from_secs(3);
    assert_eq!(idle(&mut b, t2, at(3)), Some(t2 + settle));
    let e = write(&mut b, t2 + settle, at(3));
    assert_eq!(
        (e.len(), e[0].name.as_str(), e[0].conditions.len()),
        (1, "Node/node-a", 0)
    );
    assert_eq!(idle(&mut b, t2 + settle, at(3)), None);
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_backs_off_and_a_refusal_waits_long() {
    let t0 = Instant::now();
    let mut b = Board::new(INTERVAL, QUIET);
    b.set_ready();
    b.set(&claim(), vec![entry(Some(1), "x")]);
    let Next::Write(c, e) = b.next(t0, at(0)) else {
        panic!()
    };
    b.finish(&c, e.clone(), Done::Failed, t0);
    assert_eq!(
        idle(&mut b, t0, at(0)),
        Some(t0 + Duration::from_millis(500))
    );
    let Next::Write(c, e) = b.next(t0 + Duration::from_millis(500), at(0)) else {
        panic!()
    };
    b.finish(&c, e, Done::Failed, t0 + Duration::from_millis(500));
    assert_eq!(
        idle(&mut b, t0 + Duration::from_millis(500), at(0)),
        Some(t0 + Duration::from_millis(1500))
    );
    let Next::Write(c, e) = b.next(t0 + Duration::from_secs(2), at(2)) else {
        panic!()
    };
    b.finish(&c, e, Done::Refused, t0 + Duration::from_secs(2));
    assert_eq!(
        idle(&mut b, t0 + Duration::from_secs(2), at(2)),
        Some(t0 + Duration::from_secs(302))
    );
}

fn listed(entries: Vec<SourceEntry>) -> VolumeHealth {
    let mut o = VolumeHealth {
        spec: Spec {
            persistent_volume_claim_name: "data".into(),
            persistent_volume_name: Some("pv-1".into()),
        },
        status: Some(HealthStatus {
            sources: entries,
            ..Default::default()
        }),
        ..Default::default()
    };
    o.metadata.namespace = Some("shop".into());
    o.metadata.owner_references = Some(vec![serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "name": "data", "uid": "u-1"
    }))
    .unwrap()]);
    o
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_a_kernel_condition_is_kept_until_its_quiet_window_ends() {
    let t0 = Instant::now();
    let mut b = Board::new(INTERVAL, QUIET);
    // Last seen at 08:00:00 = 1800000000 + x: use the board's clock instead.
    let seen = super::types::time(at(0));
    let mut other = entry(Some(5), &seen);
    other.name = "Node/node-b".into();
    other.node = Some("node-b".into());
    let owned = vec!["Node/node-a".to_string(), "CSIDriver/node-a".to_string()];
    let n = b.adopt(
        &[listed(vec![entry(Some(5), &seen), other])],
        &owned,
        at(10),
    );
    assert_eq!(n, 1);
    // Before the pods are known, nothing is removed or cleared.
    assert_eq!(idle(&mut b, t0, at(10)), None);
    // The pod is still here and the new process sees nothing yet: the
    // condition is carried, so no write at all.
    b.set(&claim(), vec![]);
    b.set_ready();
    assert_eq!(
        idle(&mut b, t0, at(10)),
        Some(t0 + Duration::from_secs(290))
    );
    // The quiet window after it was last seen ends: cleared.
    let e = write(&mut b, t0 + Duration::from_secs(290), at(300));
    assert_eq!(e.len(), 1);
    assert!(e[0].conditions.is_empty(), "{e:?}");
}

#[tokio::test(start_paused = true)]
async fn after_a_restart_entries_of_claims_no_longer_used_here_go_once_ready() {
    let t0 = Instant::now();
    let mut b = Board::new(INTERVAL, QUIET);
    let owned = vec!["Node/node-a".to_string()];
    b.adopt(
        &[listed(vec![entry(Some(5), &super::types::time(at(0)))])],
        &owned,
        at(10),
    );
    assert!(
        matches!(b.next(t0, at(10)), Next::Idle(_)),
        "not before the view is complete"
    );
    b.release_others(&[]);
    b.set_ready();
    assert_eq!(write(&mut b, t0, at(10)), vec![]);
    assert!(b.is_empty());
}
