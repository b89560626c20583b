//! The board after a restart: an episode taken over goes on when its
//! condition comes back (count and since continue).

use std::time::{Duration, SystemTime};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tokio::time::Instant;

use super::board::{Board, Done, Next};
use super::types::{
    self, EntryCondition, EntryKind, HealthStatus, SourceEntry, Spec, VolumeHealth,
};
use super::Claim;
use crate::volumes::conditions::Status;

const QUIET: Duration = Duration::from_secs(10);

fn claim() -> Claim {
    Claim {
        namespace: "shop".into(),
        name: "data".into(),
        uid: "uid-1".into(),
        pv: None,
    }
}

fn entry(count: u64, since: SystemTime, seen: SystemTime) -> SourceEntry {
    SourceEntry {
        name: EntryKind::Node.entry_name(Some("node-1")),
        kind: EntryKind::Node,
        node: Some("node-1".into()),
        driver: None,
        pods: vec!["shop/web-0".into()],
        pod_count: Some(1),
        update_time: types::time(seen),
        conditions: vec![EntryCondition {
            status: Status::Degraded,
            reason: "BlockIOErrors".into(),
            message: format!("{count} block I/O errors"),
            since: types::time(since),
            last_seen: Some(types::time(seen)),
            count: Some(count),
            origin: "kernel".into(),
        }],
    }
}

/// The object an earlier process wrote: its entry asserting `count`.
fn written(count: u64, since: SystemTime, seen: SystemTime) -> VolumeHealth {
    VolumeHealth {
        metadata: ObjectMeta {
            name: Some("data".into()),
            namespace: Some("shop".into()),
            owner_references: Some(vec![OwnerReference {
                kind: "PersistentVolumeClaim".into(),
                uid: "uid-1".into(),
                ..Default::default()
            }]),
            ..Default::default()
        },
        spec: Spec {
            persistent_volume_claim_name: "data".into(),
            persistent_volume_name: None,
        },
        status: Some(HealthStatus {
            sources: vec![entry(count, since, seen)],
            ..Default::default()
        }),
    }
}

fn next_write(board: &mut Board, now: Instant, wall: SystemTime) -> Option<Vec<SourceEntry>> {
    match board.next(now, wall) {
        Next::Write(_, entries) => Some(entries),
        Next::Idle(_) => None,
    }
}

#[test]
fn an_episode_asserted_again_after_a_restart_goes_on_counting() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut board = Board::new(Duration::from_secs(1), QUIET);
    let adopted = board.adopt(
        &[written(5, t0, t0 + Duration::from_secs(1))],
        &["Node/node-1".into()],
        t0 + Duration::from_secs(2),
    );
    assert_eq!(adopted, 1);
    board.set_ready();
    // The new process has seen nothing yet: the carried condition stands,
    // nothing to write (no false recovery).
    board.set(
        &claim(),
        vec![SourceEntry {
            conditions: vec![],
            ..entry(0, t0, t0)
        }],
    );
    let now = Instant::now();
    let wall = t0 + Duration::from_secs(3);
    assert!(next_write(&mut board, now, wall).is_none());

    // 3 new errors, raised after the earlier process last saw any: 5 + 3,
    // since the episode's start.
    board.set(
        &claim(),
        vec![entry(
            3,
            t0 + Duration::from_secs(4),
            t0 + Duration::from_secs(4),
        )],
    );
    let wrote = next_write(&mut board, now, wall).expect("the count changed");
    let c = &wrote[0].conditions[0];
    assert_eq!(
        (c.count, c.since.as_str()),
        (Some(8), types::time(t0).as_str())
    );
    board.finish(&claim(), wrote, Done::Written, now);

    // Past the carried condition's own quiet window, while the new process
    // still asserts it: still 8, no write (and no busy wake-up).
    let later = t0 + Duration::from_secs(30);
    match board.next(now + Duration::from_secs(5), later) {
        Next::Idle(None) => {}
        Next::Write(_, e) => panic!("unexpected write {e:?}"),
        Next::Idle(Some(at)) => panic!("woken for nothing at {at:?}"),
    }

    // Recovered in the new process: one clear, the carried condition gone.
    board.set(
        &claim(),
        vec![SourceEntry {
            conditions: vec![],
            ..entry(0, t0, t0)
        }],
    );
    let wrote = next_write(&mut board, now + Duration::from_secs(6), later).expect("the clear");
    assert!(wrote[0].conditions.is_empty(), "{wrote:?}");
}

#[test]
fn a_condition_raised_before_the_last_write_already_has_its_count() {
    // Kernel counts adopted from pinned maps: the new process's condition
    // began with the episode and counts all of it.
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let mut board = Board::new(Duration::from_secs(1), QUIET);
    board.adopt(
        &[written(5, t0, t0 + Duration::from_secs(2))],
        &["Node/node-1".into()],
        t0 + Duration::from_secs(3),
    );
    board.set_ready();
    board.set(&claim(), vec![entry(7, t0, t0 + Duration::from_secs(4))]);
    let wrote =
        next_write(&mut board, Instant::now(), t0 + Duration::from_secs(5)).expect("the new count");
    assert_eq!(wrote[0].conditions[0].count, Some(7));
}
