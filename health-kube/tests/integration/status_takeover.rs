//! The `VolumeHealth` board ([`health_kube::status::WritePlan`]) of a writer that took over from an earlier process (a
//! restarted agent, a new leader of the controller): the object is left
//! as it is until the writer says what it asserts there, a condition it
//! asserted once is its own and goes as soon as it stops asserting it,
//! and only one it never asserted waits for the start-up grace.

use std::time::{Duration, SystemTime};

use health_core::conditions::Status;
use health_kube::status::types::{
    self, EntryCondition, EntryKind, HealthStatus, SourceEntry, Spec, VolumeHealth,
};
use health_kube::status::write_plan::{Done, Next, WritePlan, STARTUP_GRACE};
use health_kube::status::Claim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use tokio::time::Instant;

const SINCE: u64 = 0;
/// When the new process started.
const STARTED: u64 = 100;

fn claim() -> Claim {
    Claim {
        namespace: "shop".into(),
        name: "data".into(),
        uid: "uid-1".into(),
        pv: Some("pv-1".into()),
    }
}

fn at(secs: u64) -> SystemTime {
    health_core::testing::t(secs)
}

/// The controller's entry, asserting `ReplicaLost` since `SINCE` or
/// nothing.
fn entry(asserting: bool) -> SourceEntry {
    SourceEntry {
        name: "CSIDriver".into(),
        kind: EntryKind::CsiDriver,
        node: None,
        driver: Some("hostpath.csi.k8s.io".into()),
        pods: vec![],
        pod_count: None,
        update_time: types::time(at(STARTED)),
        conditions: asserting
            .then(|| EntryCondition {
                status: Status::Degraded,
                reason: "ReplicaLost".into(),
                message: "replica 2 of 3 lost".into(),
                since: types::time(at(SINCE)),
                last_seen: Some(types::time(at(STARTED))),
                count: None,
                origin: "csi-controller".into(),
            })
            .into_iter()
            .collect(),
    }
}

/// The object the predecessor wrote: its entry asserting `ReplicaLost`.
fn listed() -> VolumeHealth {
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
            persistent_volume_name: Some("pv-1".into()),
        },
        status: Some(HealthStatus {
            sources: vec![entry(true)],
            ..Default::default()
        }),
    }
}

fn owned() -> Vec<String> {
    vec!["CSIDriver".into(), "Controller".into()]
}

/// A board that listed the predecessor's object and whose view is
/// complete from the start, as the controller's is.
fn taken_over() -> WritePlan {
    let mut board = WritePlan::new(Duration::from_secs(1), Duration::ZERO);
    board.set_ready();
    let adopted = board.adopt(&[listed()], &owned(), at(STARTED));
    assert_eq!(adopted, 1);
    board
}

fn next_write(board: &mut WritePlan, now: Instant, wall: SystemTime) -> Option<Vec<SourceEntry>> {
    match board.next(now, wall) {
        Next::Write(_, entries) => Some(entries),
        Next::Idle(_) => None,
    }
}

#[test]
fn nothing_is_written_on_a_claim_taken_over_until_the_writer_speaks_of_it() {
    let mut board = taken_over();
    let now = Instant::now();
    // Ready, but the writer has said nothing of the claim yet: an empty
    // write here would clear the condition and raise it again a moment
    // later, moving its transition time to the restart.
    match board.next(now, at(STARTED)) {
        Next::Idle(None) => {}
        Next::Idle(Some(wake)) => panic!("woken at {wake:?} for nothing"),
        Next::Write(_, e) => panic!("written before the writer spoke: {e:?}"),
    }
    // It asserts the same episode: still nothing to write.
    board.set(&claim(), vec![entry(true)]);
    assert_eq!(next_write(&mut board, now, at(STARTED + 1)), None);
}

#[test]
fn a_condition_the_new_process_asserted_goes_as_soon_as_it_stops() {
    let mut board = taken_over();
    let now = Instant::now();
    board.set(&claim(), vec![entry(true)]);
    assert_eq!(next_write(&mut board, now, at(STARTED + 1)), None);
    // Seen clear 5 s after the start, well within the grace: written now.
    board.set(&claim(), vec![entry(false)]);
    let wrote = next_write(&mut board, now, at(STARTED + 5)).expect("the clear");
    assert_eq!(wrote, vec![entry(false)]);
    board.finish(&claim(), wrote, Done::Written, now);
    assert_eq!(next_write(&mut board, now, at(STARTED + 6)), None);
}

#[test]
fn asserted_and_cleared_between_two_writes_still_goes_at_once() {
    let mut board = taken_over();
    board.set(&claim(), vec![entry(true)]);
    board.set(&claim(), vec![entry(false)]);
    let wrote = next_write(&mut board, Instant::now(), at(STARTED + 2)).expect("the clear");
    assert_eq!(wrote, vec![entry(false)]);
}

#[test]
fn a_condition_spoken_of_before_the_list_came_back_counts_as_asserted() {
    let mut board = WritePlan::new(Duration::from_secs(1), Duration::ZERO);
    board.set_ready();
    board.set(&claim(), vec![entry(true)]);
    let now = Instant::now();
    let wrote = next_write(&mut board, now, at(STARTED)).expect("the first write");
    board.finish(&claim(), wrote, Done::Written, now);
    // The list answers after the first cycle: the condition taken over
    // is already the new process's.
    board.adopt(&[listed()], &owned(), at(STARTED));
    board.set(&claim(), vec![entry(false)]);
    let wrote = next_write(&mut board, now, at(STARTED + 3)).expect("the clear");
    assert_eq!(wrote, vec![entry(false)]);
}

#[test]
fn a_condition_never_asserted_again_waits_for_the_grace() {
    let mut board = taken_over();
    let now = Instant::now();
    // The writer's probes have not told yet (its entry says nothing):
    // the condition stands until the grace ends.
    board.set(&claim(), vec![entry(false)]);
    let grace_ends = at(STARTED) + STARTUP_GRACE;
    match board.next(now, at(STARTED + 1)) {
        Next::Idle(Some(wake)) => assert_eq!(
            wake,
            now + (grace_ends.duration_since(at(STARTED + 1)).unwrap())
        ),
        Next::Idle(None) => panic!("never woken"),
        Next::Write(_, e) => panic!("cleared within the grace: {e:?}"),
    }
    let wrote = next_write(&mut board, now, grace_ends).expect("the clear");
    assert_eq!(wrote, vec![entry(false)]);
}
