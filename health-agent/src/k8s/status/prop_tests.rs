//! What the board takes over from a listed object is outside input (any
//! writer with access to the object could have put it there): whatever the
//! times and counts say, adopting and continuing never panics, and a
//! continued count never goes below either side's.

use std::time::{Duration, UNIX_EPOCH};

use proptest::prelude::*;
use tokio::time::Instant;

use super::board::{Board, Done, Next};
use super::types::{
    parse_time, time, EntryCondition, EntryKind, HealthStatus, SourceEntry, VolumeHealth,
};
use super::Claim;
use crate::volumes::conditions::Status;

fn claim() -> Claim {
    Claim {
        namespace: "shop".into(),
        name: "data".into(),
        uid: "u-1".into(),
        pv: None,
    }
}

fn entry(since: String, last_seen: Option<String>, count: Option<u64>) -> SourceEntry {
    SourceEntry {
        name: "Node/node-a".into(),
        kind: EntryKind::Node,
        node: Some("node-a".into()),
        driver: None,
        pods: vec![],
        pod_count: None,
        update_time: String::new(),
        conditions: vec![EntryCondition {
            status: Status::Degraded,
            reason: "BlockIOErrors".into(),
            message: String::new(),
            since,
            last_seen,
            count,
            origin: "kernel".into(),
        }],
    }
}

proptest! {
    #[test]
    fn any_listed_entry_is_taken_over_without_panic(
        since in ".{0,32}",
        last_seen in proptest::option::of(".{0,32}"),
        old in proptest::option::of(any::<u64>()),
        new in proptest::option::of(any::<u64>()),
    ) {
        let mut listed = VolumeHealth {
            status: Some(HealthStatus { sources: vec![entry(since, last_seen, old)], ..Default::default() }),
            ..Default::default()
        };
        listed.metadata.namespace = Some("shop".into());
        listed.spec.persistent_volume_claim_name = "data".into();
        let mut board = Board::new(Duration::from_secs(10), Duration::from_secs(300));
        let wall = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        board.adopt(&[listed], &["Node/node-a".to_string()], wall);
        board.set(&claim(), vec![entry(time(wall), None, new)]);
        board.set_ready();
        let now = Instant::now();
        if let Next::Write(c, e) = board.next(now, wall) {
            let count = e[0].conditions[0].count;
            if let (Some(n), Some(o), Some(c)) = (new, old, count) {
                prop_assert!(c >= n.max(o), "{c} < {n}, {o}");
            }
            board.finish(&c, e, Done::Written, now);
        }
        let _ = board.next(now + Duration::from_secs(600), wall + Duration::from_secs(600));
    }

    #[test]
    fn written_times_read_back(secs in 0u64..8_000_000_000) {
        let t = UNIX_EPOCH + Duration::from_secs(secs);
        prop_assert_eq!(parse_time(&time(t)), Some(t));
    }
}
