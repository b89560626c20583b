//! The `VolumeHealth` board ([`health_kube::status::WritePlan`]) through its
//! public API: the write-on-change rules, what a restart carries over, and
//! what it takes over from listed objects (outside input, property-tested).

mod rules {
    //! The board's write-on-change rules: what is due when, what a restart
    //! carries over, what leaving a claim removes. (The requests themselves are
    //! tested against a real API server: tests/tests/server/apiserver_status.rs.)

    use std::time::{Duration, SystemTime};

    use health_core::conditions::Status;
    use health_kube::status::types::{
        EntryCondition, EntryKind, HealthStatus, SourceEntry, Spec, VolumeHealth,
    };
    use health_kube::status::write_plan::{Done, Next, WritePlan};
    use health_kube::status::Claim;
    use tokio::time::Instant;

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

    use health_core::testing::t as at;

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

    fn write(board: &mut WritePlan, now: Instant, wall: SystemTime) -> Vec<SourceEntry> {
        match board.next(now, wall) {
            Next::Write(c, e) => {
                assert_eq!(c, claim());
                board.finish(&c, e.clone(), Done::Written, now);
                e
            }
            Next::Idle(at) => panic!("expected a write, idle until {at:?}"),
        }
    }

    fn idle(board: &mut WritePlan, now: Instant, wall: SystemTime) -> Option<Instant> {
        match board.next(now, wall) {
            Next::Idle(at) => at,
            Next::Write(_, e) => panic!("expected nothing due, got a write of {e:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_raise_is_written_at_once_counts_at_most_every_interval_and_nothing_else() {
        let t0 = Instant::now();
        let mut b = WritePlan::new(INTERVAL, QUIET);
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
        let mut b = WritePlan::new(INTERVAL, QUIET).with_settle(settle);
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
        let mut b = WritePlan::new(INTERVAL, QUIET);
        b.set_ready();
        b.set(&claim(), vec![entry(Some(1), "x")]);
        let Next::Write(c, e) = b.next(t0, at(0)) else {
            panic!()
        };
        b.finish(&c, e.clone(), Done::Failed, t0);
        // The backoff's delays are jittered: between the base and twice it.
        let first = idle(&mut b, t0, at(0)).expect("a retry time");
        let ms = |d: Duration| d.as_millis();
        assert!((500..1000).contains(&ms(first - t0)), "{:?}", first - t0);
        assert!(matches!(
            b.next(first - Duration::from_millis(1), at(0)),
            Next::Idle(_)
        ));
        let Next::Write(c, e) = b.next(first, at(0)) else {
            panic!()
        };
        b.finish(&c, e, Done::Failed, first);
        let second = idle(&mut b, first, at(0)).expect("a retry time");
        assert!(
            (1000..2000).contains(&ms(second - first)),
            "{:?}",
            second - first
        );
        let Next::Write(c, e) = b.next(t0 + Duration::from_secs(4), at(2)) else {
            panic!()
        };
        b.finish(&c, e, Done::Refused, t0 + Duration::from_secs(4));
        assert_eq!(
            idle(&mut b, t0 + Duration::from_secs(4), at(2)),
            Some(t0 + Duration::from_secs(304))
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
        let mut b = WritePlan::new(INTERVAL, QUIET);
        // Last seen at 08:00:00 = 1800000000 + x: use the board's clock instead.
        let seen = health_kube::status::types::time(at(0));
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
        let mut b = WritePlan::new(INTERVAL, QUIET);
        let owned = vec!["Node/node-a".to_string()];
        b.adopt(
            &[listed(vec![entry(
                Some(5),
                &health_kube::status::types::time(at(0)),
            )])],
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
}

mod restart {
    //! The board after a restart: an episode taken over goes on when its
    //! condition comes back (count and since continue).

    use std::time::{Duration, SystemTime};

    use health_core::conditions::Status;
    use health_kube::status::types::{
        self, EntryCondition, EntryKind, HealthStatus, SourceEntry, Spec, VolumeHealth,
    };
    use health_kube::status::write_plan::{Done, Next, WritePlan};
    use health_kube::status::Claim;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
    use tokio::time::Instant;

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

    fn next_write(
        board: &mut WritePlan,
        now: Instant,
        wall: SystemTime,
    ) -> Option<Vec<SourceEntry>> {
        match board.next(now, wall) {
            Next::Write(_, entries) => Some(entries),
            Next::Idle(_) => None,
        }
    }

    #[test]
    fn an_episode_asserted_again_after_a_restart_goes_on_counting() {
        let t0 = health_core::testing::t(0);
        let mut board = WritePlan::new(Duration::from_secs(1), QUIET);
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
        let t0 = health_core::testing::t(0);
        let mut board = WritePlan::new(Duration::from_secs(1), QUIET);
        board.adopt(
            &[written(5, t0, t0 + Duration::from_secs(2))],
            &["Node/node-1".into()],
            t0 + Duration::from_secs(3),
        );
        board.set_ready();
        board.set(&claim(), vec![entry(7, t0, t0 + Duration::from_secs(4))]);
        let wrote = next_write(&mut board, Instant::now(), t0 + Duration::from_secs(5))
            .expect("the new count");
        assert_eq!(wrote[0].conditions[0].count, Some(7));
    }
}

mod props {
    //! What the board takes over from a listed object is outside input (any
    //! writer with access to the object could have put it there): whatever the
    //! times and counts say, adopting and continuing never panics, and a
    //! continued count never goes below either side's.

    use std::time::{Duration, UNIX_EPOCH};

    use health_core::conditions::Status;
    use health_kube::status::types::{
        parse_time, time, EntryCondition, EntryKind, HealthStatus, SourceEntry, VolumeHealth,
    };
    use health_kube::status::write_plan::{Done, Next, WritePlan};
    use health_kube::status::Claim;
    use proptest::prelude::*;
    use tokio::time::Instant;

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
            let mut board = WritePlan::new(Duration::from_secs(10), Duration::from_secs(300));
            let wall = health_core::testing::t(0);
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
}
