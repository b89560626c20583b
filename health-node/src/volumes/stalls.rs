//! `IOStalled`: a volume whose oldest I/O has waited at least
//! `--stall-after`, from the bios the kernel side follows
//! (`health_kernel::waiting`) or, where none are followed, from the
//! devices' own counters ([`super::inflight`]), judged on every poll of
//! the agent loop.
//!
//! The volume's own device (the top of its stack) is what is judged: a bio
//! of a layer below waits only while one of the top's waits too. The
//! deepest device below it whose oldest bio is as old is named with it, as
//! where the I/O is stuck (`dm-0 on sdb`).
//!
//! A stall that goes on is not re-reported every poll: the message says how
//! long the oldest has waited in steps (`--stall-after` times 1, 2, 4, 8...)
//! and is kept, counts included, until the next step is reached; so is
//! whose I/O the oldest is (`a write from pod ns/db-0 (container
//! postgres)`, [`super::waiters`]), looked up once per step.
//!
//! A stack whose own state explains the wait (a full thin pool queueing
//! writes, every path down) still gets the stall: the message joins what
//! the stack check says of the volume (`explain`), and says it again when
//! that changes, since it is what an operator acts on.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use health_common::op;
use health_core::conditions::{CheckFinding, CheckKind, CheckResult};
use health_core::dev::Dev;
use health_kernel::waiting::DeviceWait;
use health_topology::Topology;

use super::checks::CheckReport;
use super::{IndexedVolume, VolumeKey};

/// `--stall-after`'s default: the SCSI and NVMe command timeout (30 s,
/// the kernel's `scsi_device` timeout and `nvme_core.io_timeout`), the
/// longest the kernel itself lets a request wait on a healthy path before
/// it aborts and retries it; so a hiccup the kernel recovers from on its
/// own (a path failover, a controller reset) raises nothing, and a stall
/// is told four times sooner than the kernel's hung-task report (120 s).
/// Judged from the devices' counters by default, at no cost per request.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(30);

/// Where a poll's waits come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallSource {
    /// The bios the kernel side follows: the oldest's age, operation and
    /// cgroup are known.
    Bios,
    /// The devices' in-flight and completed counters: how long nothing
    /// has completed while requests wait ([`super::inflight`]).
    Counters,
}

/// What a stalled volume's message names besides its devices.
pub struct Namers<'a> {
    /// Whose I/O waits: a cgroup id to `pod ns/name (container c)` or
    /// `cgroup /path` ([`super::waiters`]).
    pub waiter: &'a mut dyn FnMut(u64) -> Option<String>,
    /// What the stack check says of the volume now (`Reason: message`).
    pub explain: &'a mut dyn FnMut(&VolumeKey) -> Vec<String>,
}

/// What each volume was last told, so that only a new step is a change.
#[derive(Debug, Default)]
pub struct StallJudge {
    told: HashMap<VolumeKey, CheckFinding>,
}

impl StallJudge {
    /// One report per volume with a device: `IOStalled` where the oldest
    /// bio of its device has waited at least `stall_after`, a pass
    /// elsewhere. `now_ns` is CLOCK_MONOTONIC, as the bios' times.
    pub fn judge(
        &mut self,
        volumes: &[IndexedVolume],
        topo: &Topology,
        waits: &[DeviceWait],
        now_ns: u64,
        (stall_after, source): (Duration, StallSource),
        names: Namers<'_>,
    ) -> Vec<(VolumeKey, CheckReport)> {
        let Namers { waiter, explain } = names;
        let by_dev: HashMap<Dev, &DeviceWait> = waits.iter().map(|w| (w.dev, w)).collect();
        let age = |w: &DeviceWait| Duration::from_nanos(now_ns.saturating_sub(w.oldest_ns));
        let mut out = Vec::new();
        let mut live = HashSet::new();
        for v in volumes {
            let Some(device) = v.device else { continue };
            live.insert(v.key.clone());
            let stalled = topo
                .filesystem_backing_devices(device)
                .into_iter()
                .filter_map(|d| by_dev.get(&d).copied())
                .filter(|w| age(w) >= stall_after)
                .max_by_key(|w| age(w));
            let result = match stalled {
                None => {
                    self.told.remove(&v.key);
                    CheckResult::Pass
                }
                Some(w) => {
                    let below = deepest_stalled(topo, w.dev, &by_dev, |w| age(w) >= stall_after);
                    let mut finding = finding(topo, w, below, age(w), stall_after, source);
                    if let CheckFinding::IoStalled { explained, .. } = &mut finding {
                        *explained = explain(&v.key);
                    }
                    let kept = self
                        .told
                        .get(&v.key)
                        .filter(|told| same_step(told, &finding));
                    let finding = match kept {
                        Some(told) => told.clone(),
                        None => {
                            // Named once per step, as the counts are.
                            if let CheckFinding::IoStalled { waiter: who, .. } = &mut finding {
                                *who = w.oldest_cgroup.and_then(&mut *waiter);
                            }
                            finding
                        }
                    };
                    self.told.insert(v.key.clone(), finding.clone());
                    CheckResult::Found(vec![finding])
                }
            };
            out.push((
                v.key.clone(),
                CheckReport {
                    results: vec![(CheckKind::Stall, result)],
                },
            ));
        }
        self.told.retain(|k, _| live.contains(k));
        out
    }
}

/// The step `waited` falls in: `stall_after` times the largest power of two
/// not above `waited / stall_after`.
pub fn step(waited: Duration, stall_after: Duration) -> Duration {
    let mut step = stall_after;
    while step * 2 <= waited && step < Duration::from_secs(86_400 * 365) {
        step *= 2;
    }
    step
}

fn same_step(told: &CheckFinding, now: &CheckFinding) -> bool {
    match (told, now) {
        (
            CheckFinding::IoStalled {
                device: a,
                waited: wa,
                explained: ea,
                ..
            },
            CheckFinding::IoStalled {
                device: b,
                waited: wb,
                explained: eb,
                ..
            },
        ) => a == b && wa == wb && ea == eb,
        _ => false,
    }
}

fn finding(
    topo: &Topology,
    w: &DeviceWait,
    below: Option<Dev>,
    waited: Duration,
    stall_after: Duration,
    source: StallSource,
) -> CheckFinding {
    let name = |d: Dev| {
        topo.device(d)
            .map_or_else(|| d.to_string(), |b| b.name.clone())
    };
    let device = match below {
        Some(b) => format!("{} on {}", name(w.dev), name(b)),
        None => name(w.dev),
    };
    CheckFinding::IoStalled {
        device,
        waited: step(waited, stall_after),
        oldest_op: (source == StallSource::Bios).then(|| op_word(w.oldest_op)),
        reads: w.reads,
        writes: w.writes,
        other: w.other,
        stall_after,
        waiter: None,
        explained: Vec::new(),
    }
}

/// The deepest device below `top` (through `slaves`) whose oldest bio is
/// stalled too; `None` when none is.
fn deepest_stalled(
    topo: &Topology,
    top: Dev,
    by_dev: &HashMap<Dev, &DeviceWait>,
    stalled: impl Fn(&DeviceWait) -> bool,
) -> Option<Dev> {
    let mut seen = HashSet::from([top]);
    let mut queue = VecDeque::from([top]);
    let mut deepest = None;
    while let Some(d) = queue.pop_front() {
        let Some(b) = topo.device(d) else { continue };
        for &low in &b.slaves {
            if seen.insert(low) {
                if by_dev.get(&low).is_some_and(|w| stalled(w)) {
                    deepest = Some(low);
                }
                queue.push_back(low);
            }
        }
    }
    deepest
}

fn op_word(code: u8) -> &'static str {
    match code {
        op::READ => "read",
        op::WRITE => "write",
        op::FLUSH => "flush",
        op::DISCARD => "discard",
        op::SECURE_ERASE => "secure erase",
        op::WRITE_ZEROES => "write-zeroes",
        _ => "request",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::testing::{block_volume, device, verdict};

    const SECOND: u64 = 1_000_000_000;
    const SDB: Dev = Dev::new(8, 16);
    const DM0: Dev = Dev::new(253, 0);

    /// dm-0 on sdb, and one block volume on dm-0.
    fn world() -> (Topology, Vec<IndexedVolume>) {
        let topo = Topology::from_parts(
            vec![device(SDB, "sdb", vec![]), device(DM0, "dm-0", vec![SDB])],
            vec![],
        );
        (topo, vec![block_volume(DM0, "dm-0")])
    }

    fn wait(dev: Dev, reads: u32, writes: u32, queued_s: u64) -> DeviceWait {
        DeviceWait {
            dev,
            reads,
            writes,
            other: 0,
            oldest_ns: queued_s * SECOND,
            oldest_op: op::WRITE,
            oldest_cgroup: Some(queued_s),
        }
    }

    fn messages(reports: &[(VolumeKey, CheckReport)]) -> Vec<String> {
        reports
            .iter()
            .map(|(_, r)| verdict(r, CheckKind::Stall))
            .collect()
    }

    /// Below the threshold a pass; at it IOStalled naming the device and
    /// the deepest one below where I/O waits as long; the same message
    /// (counts included) until the next step; a pass once it drains.
    #[test]
    fn a_stall_is_raised_at_the_threshold_kept_per_step_and_cleared() {
        let (topo, vols) = world();
        let mut judge = StallJudge::default();
        let after = Duration::from_secs(10);
        let mut named = |id: u64| (id != 101).then(|| format!("cgroup /c{id}"));
        let mut at = |now_s: u64, waits: &[DeviceWait]| {
            messages(&judge.judge(
                &vols,
                &topo,
                waits,
                now_s * SECOND,
                (after, StallSource::Bios),
                Namers {
                    waiter: &mut named,
                    explain: &mut |_| Vec::new(),
                },
            ))
        };
        let both = |n| [wait(DM0, 1, n, 100), wait(SDB, 0, 1, 101)];
        assert_eq!(at(109, &both(2)), ["pass"]);
        let first = "dm-0 on sdb: I/O stalled, 3 waiting (1 read, 2 writes); the oldest, a write from cgroup /c100, has waited 10s+ (--stall-after 10s)";
        assert_eq!(at(111, &both(2)), [first]);
        // More writes queue behind it: same step, same message.
        assert_eq!(at(119, &both(7)), [first]);
        assert_eq!(
            at(121, &both(7)),
            ["dm-0 on sdb: I/O stalled, 8 waiting (1 read, 7 writes); the oldest, a write from cgroup /c100, has waited 20s+ (--stall-after 10s)"]
        );
        // Only the top stalled: named alone. A cgroup with no name (the
        // root's, one gone): no one named.
        assert_eq!(
            at(160, &[wait(DM0, 0, 1, 101)]),
            ["dm-0: I/O stalled, 1 waiting (1 write); the oldest, a write, has waited 40s+ (--stall-after 10s)"]
        );
        // A device below that waits while the volume's own does not (I/O
        // of something else on the disk) is not the volume's stall.
        assert_eq!(at(170, &[wait(SDB, 0, 1, 100)]), ["pass"]);
        assert_eq!(at(171, &[]), ["pass"]);
    }

    /// From the devices' counters: no operation or cgroup is claimed; the
    /// message says for how long none has completed.
    #[test]
    fn a_stall_told_by_the_counters_says_how_long_none_has_completed() {
        let (topo, vols) = world();
        let mut judge = StallJudge::default();
        let counted = |dev, reads, writes| DeviceWait {
            oldest_op: op::NONE,
            oldest_cgroup: None,
            ..wait(dev, reads, writes, 100)
        };
        let reports = judge.judge(
            &vols,
            &topo,
            &[counted(DM0, 1, 2), counted(SDB, 0, 3)],
            165 * SECOND,
            (Duration::from_secs(30), StallSource::Counters),
            Namers {
                waiter: &mut |id| panic!("cgroup {id} asked of the counters"),
                explain: &mut |_| Vec::new(),
            },
        );
        assert_eq!(
            messages(&reports),
            ["dm-0 on sdb: I/O stalled, 3 waiting (1 read, 2 writes); none has completed for 1m00s+ (--stall-after 30s)"]
        );
    }

    /// What the stack says of a stalled volume is joined to the stall, and
    /// a change of it is a new message within the same step; gone, the
    /// stall stays on its own.
    #[test]
    fn the_stacks_state_is_joined_to_the_stall_and_follows_it() {
        let (topo, vols) = world();
        let mut judge = StallJudge::default();
        let after = Duration::from_secs(2);
        let mut at = |now_s: u64, stack: &[&str]| {
            let stack: Vec<String> = stack.iter().map(|s| s.to_string()).collect();
            messages(&judge.judge(
                &vols,
                &topo,
                &[wait(DM0, 0, 1, 100)],
                now_s * SECOND,
                (after, StallSource::Bios),
                Namers {
                    waiter: &mut |_| None,
                    explain: &mut |key| {
                        assert_eq!(key, &vols[0].key);
                        stack.clone()
                    },
                },
            ))
        };
        let base = "dm-0: I/O stalled, 1 waiting (1 write); the oldest, a write, has waited 2s+ (--stall-after 2s)";
        let full =
            "ThinPoolFull: thin pool vg-pool is out of data space; writes queue until it grows";
        assert_eq!(at(102, &[]), [base]);
        assert_eq!(at(103, &[full]), [format!("{base}; the stack: {full}")]);
        assert_eq!(
            at(103, &[full, "ThinPoolLow: thin pool vg-pool 100% used"]),
            [format!(
                "{base}; the stack: {full}; the stack: ThinPoolLow: thin pool vg-pool 100% used"
            )]
        );
        assert_eq!(at(103, &[]), [base]);
    }

    #[test]
    fn steps_double_from_the_threshold() {
        let s = Duration::from_secs(10);
        let at = |secs| step(Duration::from_secs(secs), s).as_secs();
        assert_eq!(
            [at(10), at(19), at(20), at(39), at(40), at(95)],
            [10, 10, 20, 20, 40, 80]
        );
        // Below the threshold (not judged stalled) the step is the threshold.
        assert_eq!(at(3), 10);
    }
}
