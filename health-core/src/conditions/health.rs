//! The machine: [`VolumeHealth`] holds each source's conditions of one
//! volume, merges new evidence into them and says what changed.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use super::driver_words;
use super::episode::{Episode, MAX_WHOS};
use super::evidence::{
    CheckResult, CsiEntry, CsiListSighting, CsiReport, KernelErrorKind, KernelErrors, Observation,
};
use super::vocabulary::{Change, Condition, Source, Status};

#[derive(Clone, Debug)]
pub struct ConditionConfig {
    /// Kernel conditions clear after this long without a new error of their
    /// kind, measured from the last error.
    pub kernel_quiet_window: Duration,
    /// Consecutive complete List cycles without a volume that clear its
    /// controller conditions.
    pub list_cycles_to_clear: u32,
}

impl Default for ConditionConfig {
    fn default() -> Self {
        Self {
            kernel_quiet_window: Duration::from_secs(5 * 60),
            list_cycles_to_clear: 2,
        }
    }
}

type Key = (Status, String);

#[derive(Clone, Debug)]
struct Stored {
    message: String,
    since: SystemTime,
    last_probe: SystemTime,
    occurrences: Option<u64>,
}

/// A condition a source currently asserts, before it is merged into the store.
struct Desired {
    status: Status,
    reason: String,
    message: String,
    /// Used only when the condition is new.
    since: SystemTime,
    seen: SystemTime,
    occurrences: Option<u64>,
}

/// The conditions of one volume, from all sources.
#[derive(Clone, Debug, Default)]
pub struct VolumeHealth {
    config: ConditionConfig,
    owned: BTreeMap<Source, BTreeMap<Key, Stored>>,
    kernel: BTreeMap<KernelErrorKind, Episode>,
    list_absent_cycles: u32,
    probe_failures: BTreeMap<Source, u64>,
}

impl VolumeHealth {
    pub fn new(config: ConditionConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// Feeds one observation; returns what changed (empty in steady state).
    pub fn apply(&mut self, now: SystemTime, obs: Observation) -> Vec<Change> {
        match obs {
            Observation::Kernel(errors) => {
                for e in errors.into_iter().filter(|e| e.count > 0) {
                    self.merge_kernel(e);
                }
                self.reconcile_kernel(now)
            }
            Observation::Check { check, result } => {
                let source = Source::Check(check);
                match result {
                    CheckResult::Pass => self.set(source, Vec::new()),
                    CheckResult::Found(findings) => {
                        let desired = findings
                            .iter()
                            .map(|f| Desired {
                                status: f.status(),
                                reason: f.reason().to_string(),
                                message: f.message(),
                                since: now,
                                seen: now,
                                occurrences: None,
                            })
                            .collect();
                        self.set(source, desired)
                    }
                    CheckResult::ProbeFailed(_) => self.probe_failed(source),
                }
            }
            Observation::CsiNode(report) => self.csi_report(Source::CsiNode, report, now),
            Observation::CsiStorage(report) => self.csi_report(Source::CsiStorage, report, now),
            Observation::CsiControllerGet(report) => {
                if matches!(report, CsiReport::Health(_)) {
                    // A Get is a confirmation; List absences start over.
                    self.list_absent_cycles = 0;
                }
                self.csi_report(Source::CsiController, report, now)
            }
            Observation::CsiControllerList(sighting) => match sighting {
                CsiListSighting::Listed(entries) if !entries.is_empty() => {
                    self.list_absent_cycles = 0;
                    self.set(Source::CsiController, csi_desired(entries, now))
                }
                // Listed with no entries is treated like an omission: a List
                // is not trusted to clear on one cycle.
                CsiListSighting::Listed(_) | CsiListSighting::Absent => {
                    self.list_absent_cycles = self.list_absent_cycles.saturating_add(1);
                    if self.list_absent_cycles >= self.config.list_cycles_to_clear {
                        self.set(Source::CsiController, Vec::new())
                    } else {
                        Vec::new()
                    }
                }
                // A failed cycle neither counts as absence nor breaks the run
                // of complete cycles: it says nothing.
                CsiListSighting::CycleFailed(_) => self.probe_failed(Source::CsiController),
            },
        }
    }

    /// Periodic evaluation: clears kernel conditions whose quiet window has
    /// passed.
    pub fn tick(&mut self, now: SystemTime) -> Vec<Change> {
        self.reconcile_kernel(now)
    }

    /// The volume's view: the union of all sources, worst first, one entry per
    /// `(status, reason)` (the earliest `since` wins when sources agree).
    pub fn conditions(&self) -> Vec<Condition> {
        let mut all: Vec<Condition> = self
            .owned
            .iter()
            .flat_map(|(source, map)| map.iter().map(|(key, s)| condition(*source, key, s)))
            .collect();
        all.sort_by(|a, b| {
            (a.status, &a.reason, a.since, a.source).cmp(&(b.status, &b.reason, b.since, b.source))
        });
        all.dedup_by(|later, first| later.status == first.status && later.reason == first.reason);
        all
    }

    /// The worst status over all sources, `None` when healthy.
    pub fn worst(&self) -> Option<Status> {
        self.owned
            .values()
            .flat_map(|m| m.keys())
            .map(|(s, _)| *s)
            .min()
    }

    /// Holds nothing that decides what a later observation does: no
    /// condition of any source and no open kernel episode. Such a state
    /// answers every observation as a new one would (the List absence run
    /// only ends conditions, and the probe failures are a statistic), so a
    /// holder of many volumes may drop it and keep state only for the
    /// volumes that are unhealthy.
    pub fn is_quiet(&self) -> bool {
        self.owned.values().all(BTreeMap::is_empty) && self.kernel.is_empty()
    }

    /// Whether a kernel condition of this kind is open (errors of that kind
    /// within the quiet window).
    pub fn kernel_active(&self, kind: KernelErrorKind) -> bool {
        self.kernel.contains_key(&kind)
    }

    /// How many probes of `source` failed without telling anything.
    pub fn probe_failures(&self, source: Source) -> u64 {
        self.probe_failures.get(&source).copied().unwrap_or(0)
    }

    fn probe_failed(&mut self, source: Source) -> Vec<Change> {
        *self.probe_failures.entry(source).or_default() += 1;
        Vec::new()
    }

    fn csi_report(&mut self, source: Source, report: CsiReport, now: SystemTime) -> Vec<Change> {
        match report {
            CsiReport::Health(entries) => self.set(source, csi_desired(entries, now)),
            CsiReport::NoHealthInfo => Vec::new(),
            CsiReport::ProbeFailed(_) => self.probe_failed(source),
        }
    }

    fn merge_kernel(&mut self, e: KernelErrors) {
        let (first, last) = (e.first.min(e.last), e.first.max(e.last));
        let ep = self.kernel.entry(e.kind).or_insert_with(|| Episode {
            count: 0,
            first,
            last,
            devices: BTreeSet::new(),
            names: BTreeMap::new(),
            mounts: BTreeSet::new(),
            ops: BTreeSet::new(),
            errnos: BTreeSet::new(),
            whos: BTreeSet::new(),
            more_whos: false,
        });
        ep.count = ep.count.saturating_add(e.count);
        ep.first = ep.first.min(first);
        ep.last = ep.last.max(last);
        if let (Some(dev), Some(name)) = (e.device, e.device_name) {
            ep.names.insert(dev, name);
        }
        ep.devices.extend(e.device);
        ep.mounts.extend(e.mount_point);
        ep.ops.extend(e.op);
        ep.errnos.extend(e.errno);
        if let Some(who) = e.who {
            if ep.whos.len() < MAX_WHOS || ep.whos.contains(&who) {
                ep.whos.insert(who);
            } else {
                ep.more_whos = true;
            }
        }
    }

    fn reconcile_kernel(&mut self, now: SystemTime) -> Vec<Change> {
        let window = self.config.kernel_quiet_window;
        // A last error in the future (clock step) keeps the episode open.
        self.kernel.retain(|_, ep| {
            now.duration_since(ep.last)
                .map_or(true, |quiet| quiet < window)
        });
        // One failure, one condition: errors returned to applications are
        // said in the device's or filesystem's condition where one is open
        // (the worst, if several), else in conditions of their own.
        let host = self
            .kernel
            .keys()
            .filter(|kind| !kind.returned())
            .min_by_key(|kind| (kind.status(), **kind))
            .copied();
        let told: Vec<String> = match host {
            Some(_) => self
                .kernel
                .iter()
                .filter(|(kind, _)| kind.returned())
                .map(|(kind, ep)| ep.what(*kind))
                .collect(),
            None => Vec::new(),
        };
        let desired = self
            .kernel
            .iter()
            .filter(|(kind, _)| host.is_none() || !kind.returned())
            .map(|(kind, ep)| {
                let mut message = ep.message(*kind);
                if Some(*kind) == host {
                    for t in &told {
                        message.push_str("; ");
                        message.push_str(t);
                    }
                }
                Desired {
                    status: kind.status(),
                    reason: kind.reason().to_string(),
                    message,
                    since: ep.first,
                    seen: ep.last,
                    occurrences: Some(ep.count),
                }
            })
            .collect();
        self.set(Source::Kernel, desired)
    }

    /// Makes `desired` the complete set of `source`'s conditions.
    fn set(&mut self, source: Source, desired: Vec<Desired>) -> Vec<Change> {
        let current = self.owned.entry(source).or_default();
        let mut next: BTreeMap<Key, Desired> = BTreeMap::new();
        for d in desired {
            // (status, reason) is unique per volume: the last word wins.
            next.insert((d.status, d.reason.clone()), d);
        }
        let mut changes = Vec::new();
        current.retain(|key, stored| {
            let keep = next.contains_key(key);
            if !keep {
                changes.push(Change::Cleared(condition(source, key, stored)));
            }
            keep
        });
        for (key, d) in next {
            match current.get_mut(&key) {
                Some(stored) => {
                    stored.last_probe = d.seen;
                    stored.occurrences = d.occurrences;
                    if stored.message != d.message {
                        let previous_message = std::mem::replace(&mut stored.message, d.message);
                        changes.push(Change::Updated {
                            previous_message,
                            condition: condition(source, &key, stored),
                        });
                    }
                }
                None => {
                    let stored = Stored {
                        message: d.message,
                        since: d.since,
                        last_probe: d.seen,
                        occurrences: d.occurrences,
                    };
                    changes.push(Change::Raised(condition(source, &key, &stored)));
                    current.insert(key, stored);
                }
            }
        }
        if current.is_empty() {
            self.owned.remove(&source);
        }
        changes
    }
}

fn csi_desired(entries: Vec<CsiEntry>, now: SystemTime) -> Vec<Desired> {
    // The driver's words are another party's: made fit before they are kept.
    driver_words::fit(entries)
        .into_iter()
        .map(|e| Desired {
            status: e.status,
            reason: e.reason,
            message: e.message,
            since: now,
            seen: now,
            occurrences: None,
        })
        .collect()
}

fn condition(source: Source, key: &Key, s: &Stored) -> Condition {
    Condition {
        source,
        status: key.0,
        reason: key.1.clone(),
        message: s.message.clone(),
        since: s.since,
        last_probe: s.last_probe,
        occurrences: s.occurrences,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conditions::testing::*;
    use crate::conditions::{CheckFinding, CheckKind, ReadOnlyEvidence};
    use crate::dev::Dev;

    #[test]
    fn unchanged_tuple_keeps_since_and_steady_state_is_silent() {
        let mut h = VolumeHealth::default();
        let changes = h.apply(t(0), check(CheckKind::ReadOnly, read_only()));
        assert_eq!(reasons(&changes), ["+ReadOnlyRemount"]);

        // Same finding again: nothing to write, since kept, last probe moves.
        assert!(h
            .apply(t(60), check(CheckKind::ReadOnly, read_only()))
            .is_empty());
        let c = &h.conditions()[0];
        assert_eq!((c.since, c.last_probe), (t(0), t(60)));

        // Same (status, reason), new message: Updated, since still kept.
        let other = CheckResult::Found(vec![CheckFinding::ReadOnlyRemount {
            mount_point: "/mnt/v".into(),
            device: Dev::new(7, 3),
            fs_type: "ext4".into(),
            evidence: ReadOnlyEvidence::EmergencyRo,
        }]);
        let changes = h.apply(t(120), check(CheckKind::ReadOnly, other));
        match &changes[..] {
            [Change::Updated {
                previous_message,
                condition,
            }] => {
                assert!(previous_message.contains("7:2"));
                assert!(condition.message.contains("7:3"));
                assert_eq!((condition.since, condition.last_probe), (t(0), t(120)));
            }
            other => panic!("expected one Updated, got {other:?}"),
        }

        // Healthy steady state: passes on a healthy volume change nothing.
        let mut healthy = VolumeHealth::default();
        for i in 0..3 {
            assert!(healthy
                .apply(t(i), check(CheckKind::Mount, CheckResult::Pass))
                .is_empty());
            assert!(healthy
                .apply(t(i), Observation::CsiNode(CsiReport::Health(vec![])))
                .is_empty());
            assert!(healthy.tick(t(i)).is_empty());
        }
        assert_eq!(healthy.worst(), None);
    }

    #[test]
    fn a_quiet_state_answers_as_a_new_one() {
        let listed = |reason: &str| {
            Observation::CsiControllerList(CsiListSighting::Listed(vec![CsiEntry {
                status: Status::Degraded,
                reason: reason.into(),
                message: "m".into(),
            }]))
        };
        let absent = || Observation::CsiControllerList(CsiListSighting::Absent);
        // Raised, then cleared by two complete lists without it, with an
        // absence run and failed probes left behind.
        let mut old = VolumeHealth::default();
        assert!(old.is_quiet());
        assert_eq!(old.apply(t(0), listed("ReplicaLost")).len(), 1);
        assert!(!old.is_quiet());
        old.apply(t(1), absent());
        assert!(!old.is_quiet(), "one absence does not clear");
        old.apply(t(2), absent());
        old.apply(t(3), absent());
        old.apply(
            t(4),
            Observation::CsiControllerList(CsiListSighting::CycleFailed("down".into())),
        );
        assert!(old.is_quiet());
        assert_eq!(old.worst(), None);
        let mut new = VolumeHealth::default();
        let then = [
            absent(),
            listed("ReplicaLost"),
            absent(),
            absent(),
            Observation::CsiControllerGet(CsiReport::Health(vec![])),
        ];
        for (i, obs) in then.into_iter().enumerate() {
            let at = t(10 + i as u64);
            assert_eq!(old.apply(at, obs.clone()), new.apply(at, obs), "step {i}");
            assert_eq!(old.conditions(), new.conditions(), "step {i}");
        }
        // An open kernel episode is not quiet.
        let mut kernel = VolumeHealth::default();
        kernel.apply(t(10), block_errors(1, 0, 5));
        assert!(!kernel.is_quiet());
    }

    #[test]
    fn failed_check_probe_is_not_a_recovery() {
        let mut h = VolumeHealth::default();
        h.apply(t(0), check(CheckKind::ReadOnly, read_only()));
        let failed = check(
            CheckKind::ReadOnly,
            CheckResult::ProbeFailed("EACCES".into()),
        );
        assert!(h.apply(t(10), failed.clone()).is_empty());
        assert!(h.apply(t(20), failed).is_empty());
        assert_eq!(view(&h), [(Status::Inaccessible, "ReadOnlyRemount".into())]);
        assert_eq!(h.probe_failures(Source::Check(CheckKind::ReadOnly)), 2);
        assert_eq!(h.probe_failures(Source::CsiNode), 0);
        // The stored condition was not touched by the failures.
        assert_eq!(h.conditions()[0].last_probe, t(0));
    }

    #[test]
    fn check_condition_clears_when_the_check_passes() {
        let mut h = VolumeHealth::default();
        h.apply(t(0), check(CheckKind::ReadOnly, read_only()));
        // Another check passing says nothing about this one.
        assert!(h
            .apply(t(5), check(CheckKind::Mount, CheckResult::Pass))
            .is_empty());
        // Back to rw.
        let changes = h.apply(t(10), check(CheckKind::ReadOnly, CheckResult::Pass));
        assert_eq!(reasons(&changes), ["-ReadOnlyRemount"]);
        assert_eq!(h.worst(), None);
    }

    #[test]
    fn capacity_low_then_exhausted_then_fine() {
        let mut h = VolumeHealth::default();
        let low = CheckResult::Found(vec![CheckFinding::CapacityLow {
            free_bytes: 3 << 20,
            total_bytes: 100 << 20,
            threshold_percent: 5.0,
        }]);
        assert_eq!(
            reasons(&h.apply(t(0), check(CheckKind::Capacity, low))),
            ["+CapacityLow"]
        );
        let msg = h.conditions()[0].message.clone();
        assert_eq!(
            msg,
            "3145728 of 104857600 bytes free (3.0 MiB of 100.0 MiB, 3.00%), below 5%"
        );
        let out = CheckResult::Found(vec![CheckFinding::CapacityExhausted {
            total_bytes: 100 << 20,
        }]);
        let mut changes = reasons(&h.apply(t(1), check(CheckKind::Capacity, out)));
        changes.sort();
        assert_eq!(changes, ["+CapacityExhausted", "-CapacityLow"]);
        let changes = h.apply(t(2), check(CheckKind::Capacity, CheckResult::Pass));
        assert_eq!(reasons(&changes), ["-CapacityExhausted"]);
    }

    /// Errors returned to `who` on the FUSE volume's anonymous device.
    fn returned(kind: KernelErrorKind, errno: i32, count: u64, at: u64, who: &str) -> Observation {
        Observation::Kernel(vec![KernelErrors {
            kind,
            count,
            first: t(at),
            last: t(at),
            device: Some(Dev::new(0, 52)),
            mount_point: Some("/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv1/mount".into()),
            op: Some("read".into()),
            errno: Some(errno),
            device_name: None,
            who: Some(who.into()),
        }])
    }

    #[test]
    fn returned_errors_alone_raise_their_own_condition_naming_whom_they_were_told() {
        let mut h = VolumeHealth::new(ConditionConfig::default());
        let web = "pod shop/web-0 (container app)";
        let changes = h.apply(
            t(0),
            returned(KernelErrorKind::ReturnedIo, libc::EIO, 2, 0, web),
        );
        assert_eq!(reasons(&changes), ["+ApplicationIOErrors"]);
        let changes = h.apply(
            t(3),
            returned(KernelErrorKind::ReturnedIo, libc::EIO, 1, 3, web),
        );
        assert_eq!(reasons(&changes), ["~ApplicationIOErrors"]);
        let c = &h.conditions()[0];
        assert_eq!(c.status, Status::Degraded);
        assert_eq!(
            c.message,
            "3 failed file operations (read, EIO) returned to pod shop/web-0 (container app) \
             on 0:52 at /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv1/mount \
             in 3s (2027-01-15T08:00:00Z to 2027-01-15T08:00:03Z)"
        );
        // A daemon gone: ENOTCONN is its own, Inaccessible.
        let changes = h.apply(
            t(4),
            returned(
                KernelErrorKind::ReturnedNotConnected,
                libc::ENOTCONN,
                1,
                4,
                web,
            ),
        );
        assert_eq!(reasons(&changes), ["+NotConnected"]);
        assert_eq!(h.worst(), Some(Status::Inaccessible));
    }

    #[test]
    fn returned_errors_are_said_in_the_devices_condition_not_beside_it() {
        let mut h = VolumeHealth::new(ConditionConfig::default());
        let changes = h.apply(t(10), block_errors(3, 0, 5));
        assert_eq!(reasons(&changes), ["+BlockIOErrors"]);
        let changes = h.apply(
            t(10),
            returned(
                KernelErrorKind::ReturnedIo,
                libc::EIO,
                1,
                6,
                "cgroup /batch",
            ),
        );
        assert_eq!(reasons(&changes), ["~BlockIOErrors"]);
        assert_eq!(view(&h), [(Status::Degraded, "BlockIOErrors".to_string())]);
        let c = &h.conditions()[0];
        assert!(
            c.message.ends_with(
                "(2027-01-15T08:00:00Z to 2027-01-15T08:00:05Z); \
                 1 failed file operation (read, EIO) returned to cgroup /batch"
            ),
            "{}",
            c.message
        );
        // The count is the device's: the same failure is not counted twice.
        assert_eq!(c.occurrences, Some(3));
    }

    #[test]
    fn an_episode_names_a_bounded_number_of_applications() {
        let mut h = VolumeHealth::new(ConditionConfig::default());
        for i in 0..10 {
            let who = format!("pod shop/web-{i} (container app)");
            h.apply(
                t(i),
                returned(KernelErrorKind::ReturnedStale, libc::ESTALE, 1, i, &who),
            );
        }
        let c = &h.conditions()[0];
        assert_eq!(
            (c.status, c.reason.as_str()),
            (Status::Inaccessible, "StaleFileHandle")
        );
        assert!(
            c.message.starts_with(
                "10 failed file operations (read, ESTALE) returned to \
                 pod shop/web-0 (container app), pod shop/web-1 (container app), \
                 pod shop/web-2 (container app), pod shop/web-3 (container app) and others on 0:52 "
            ),
            "{}",
            c.message
        );
    }

    #[test]
    fn kernel_condition_clears_after_quiet_window_from_last_error() {
        let cfg = ConditionConfig {
            kernel_quiet_window: Duration::from_secs(300),
            ..ConditionConfig::default()
        };
        let mut h = VolumeHealth::new(cfg);
        let changes = h.apply(t(10), block_errors(3, 0, 5));
        assert_eq!(reasons(&changes), ["+BlockIOErrors"]);
        let c = &h.conditions()[0];
        assert_eq!(
            (c.status, c.since, c.last_probe),
            (Status::Degraded, t(0), t(5))
        );
        assert_eq!(
            c.message,
            "3 block I/O errors (write, EIO) on 7:2 at \
             /var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv1/mount \
             in 5s (2027-01-15T08:00:00Z to 2027-01-15T08:00:05Z)"
        );

        // More errors extend the episode: the message (count, window) changes.
        let changes = h.apply(t(100), block_errors(2, 100, 100));
        assert_eq!(reasons(&changes), ["~BlockIOErrors"]);
        assert!(h.conditions()[0].message.starts_with("5 block I/O errors"));
        assert_eq!(h.conditions()[0].since, t(0));

        // 300 s counted from the last error (t=100), not the first.
        assert!(h.tick(t(305)).is_empty());
        assert!(h.tick(t(399)).is_empty());
        // An empty kernel observation is no evidence of anything.
        assert!(h.apply(t(399), Observation::Kernel(vec![])).is_empty());
        assert_eq!(reasons(&h.tick(t(400))), ["-BlockIOErrors"]);
        assert!(h.tick(t(500)).is_empty());

        // A new error after clearing starts a new episode with a new since.
        h.apply(t(600), block_errors(1, 600, 600));
        let c = &h.conditions()[0];
        assert_eq!(c.since, t(600));
        assert!(c
            .message
            .starts_with("1 block I/O error (write, EIO) on 7:2"));
        assert!(c.message.ends_with(" at 2027-01-15T08:10:00Z"));
    }

    #[test]
    fn kernel_kinds_map_to_their_own_conditions() {
        let mut h = VolumeHealth::default();
        let e = |kind, count| KernelErrors {
            kind,
            count,
            first: t(0),
            last: t(0),
            device: None,
            mount_point: None,
            op: None,
            errno: None,
            device_name: None,
            who: None,
        };
        let changes = h.apply(
            t(0),
            Observation::Kernel(vec![
                e(KernelErrorKind::Writeback, 1),
                e(KernelErrorKind::Shutdown, 1),
                e(KernelErrorKind::FilesystemError, 0), // nothing new
            ]),
        );
        assert_eq!(changes.len(), 2);
        assert_eq!(
            view(&h),
            [
                (Status::Inaccessible, "FilesystemShutdown".into()),
                (Status::DataLoss, "WritebackErrors".into())
            ]
        );
        assert_eq!(h.worst(), Some(Status::Inaccessible));
    }

    #[test]
    fn csi_node_empty_list_clears_at_once_and_failures_do_not() {
        let mut h = VolumeHealth::default();
        let sick = CsiReport::Health(vec![entry(
            Status::DataLoss,
            "BackendCorrupt",
            "raid lost a member",
        )]);
        assert_eq!(
            reasons(&h.apply(t(0), Observation::CsiNode(sick))),
            ["+BackendCorrupt"]
        );
        let timeout = Observation::CsiNode(CsiReport::ProbeFailed("DeadlineExceeded".into()));
        assert!(h.apply(t(60), timeout).is_empty());
        assert!(h
            .apply(t(90), Observation::CsiNode(CsiReport::NoHealthInfo))
            .is_empty());
        assert_eq!(h.probe_failures(Source::CsiNode), 1);
        assert_eq!(h.worst(), Some(Status::DataLoss));
        let healthy = Observation::CsiNode(CsiReport::Health(vec![]));
        assert_eq!(reasons(&h.apply(t(120), healthy)), ["-BackendCorrupt"]);
    }

    #[test]
    fn a_driver_reason_that_is_not_camel_case_is_made_one_for_every_csi_source() {
        let mut h = VolumeHealth::default();
        let bad = || vec![entry(Status::Degraded, "disk-failure", "slow\nlane")];
        let changes = h.apply(t(0), Observation::CsiNode(CsiReport::Health(bad())));
        assert_eq!(reasons(&changes), ["+DiskFailure"]);
        let changes = h.apply(
            t(1),
            Observation::CsiControllerList(CsiListSighting::Listed(bad())),
        );
        assert_eq!(reasons(&changes), ["+DiskFailure"]);
        let messages: Vec<String> = h.conditions().into_iter().map(|c| c.message).collect();
        // The union shows one condition per (status, reason).
        assert_eq!(messages, ["(driver reason \"disk-failure\") slow lane"]);
    }

    #[test]
    fn csi_list_clears_only_after_two_complete_cycles_without_the_volume() {
        let mut h = VolumeHealth::default();
        let listed = || {
            Observation::CsiControllerList(CsiListSighting::Listed(vec![entry(
                Status::Inaccessible,
                "VolumeNotFound",
                "deleted on the array",
            )]))
        };
        let absent = || Observation::CsiControllerList(CsiListSighting::Absent);
        assert_eq!(reasons(&h.apply(t(0), listed())), ["+VolumeNotFound"]);

        // One absence, then back: the run of absences starts over.
        assert!(h.apply(t(300), absent()).is_empty());
        assert!(h.apply(t(600), listed()).is_empty());
        assert!(h.apply(t(900), absent()).is_empty());
        // A failed cycle says nothing and is counted.
        let failed =
            Observation::CsiControllerList(CsiListSighting::CycleFailed("Unavailable".into()));
        assert!(h.apply(t(1000), failed).is_empty());
        assert_eq!(h.probe_failures(Source::CsiController), 1);
        // A listing with no entries is no stronger than an omission.
        let changes = h.apply(
            t(1200),
            Observation::CsiControllerList(CsiListSighting::Listed(vec![])),
        );
        assert_eq!(reasons(&changes), ["-VolumeNotFound"]);
        assert!(h.apply(t(1500), absent()).is_empty());
        assert_eq!(h.conditions()[0..].len(), 0);
    }

    #[test]
    fn csi_controller_get_clears_what_list_raised_at_once() {
        let mut h = VolumeHealth::default();
        let listed = CsiListSighting::Listed(vec![entry(
            Status::Degraded,
            "ReplicaMissing",
            "1 of 3 replicas down",
        )]);
        h.apply(t(0), Observation::CsiControllerList(listed));
        h.apply(
            t(300),
            Observation::CsiControllerList(CsiListSighting::Absent),
        );
        let changes = h.apply(
            t(301),
            Observation::CsiControllerGet(CsiReport::Health(vec![])),
        );
        assert_eq!(reasons(&changes), ["-ReplicaMissing"]);
    }

    #[test]
    fn each_source_owns_its_conditions_and_worst_case_wins() {
        let mut h = VolumeHealth::default();
        h.apply(t(0), block_errors(4, 0, 1));
        h.apply(
            t(0),
            Observation::CsiControllerGet(CsiReport::Health(vec![entry(
                Status::Degraded,
                "BlockIOErrors",
                "driver saw it too",
            )])),
        );
        h.apply(
            t(1),
            Observation::CsiNode(CsiReport::Health(vec![entry(
                Status::Inaccessible,
                "NodeLostPath",
                "multipath down",
            )])),
        );
        // Union, worst first, one entry per (status, reason): the kernel's
        // BlockIOErrors (since t0) and the controller's are one condition.
        assert_eq!(
            view(&h),
            [
                (Status::Inaccessible, "NodeLostPath".into()),
                (Status::Degraded, "BlockIOErrors".into())
            ]
        );
        // The driver saying "healthy" clears only the driver's conditions.
        let changes = h.apply(t(2), Observation::CsiNode(CsiReport::Health(vec![])));
        assert_eq!(reasons(&changes), ["-NodeLostPath"]);
        let changes = h.apply(
            t(3),
            Observation::CsiControllerGet(CsiReport::Health(vec![])),
        );
        assert_eq!(reasons(&changes), ["-BlockIOErrors"]);
        assert_eq!(view(&h), [(Status::Degraded, "BlockIOErrors".into())]);
        assert_eq!(h.conditions()[0].source, Source::Kernel);
        // The kernel's condition goes only by its own rule.
        assert_eq!(reasons(&h.tick(t(301))), ["-BlockIOErrors"]);
    }
}
