//! Each volume's checks on their own schedule while the agent runs: one due
//! time per volume, a check task per due volume, its report handed back as
//! soon as it ends. A volume whose probe hangs holds back only its own next
//! check (which, started while the probe is still stuck, is answered "still
//! hung" at once without a thread); the other volumes keep their interval.
//! The probe threads all checks share are capped by the [`Checker`].
//!
//! A volume's next check is due one interval after its last one started;
//! one that ended later than that starts again at once.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use health_topology::MountEntry;
use tokio::task::{Id, JoinError, JoinSet};
use tokio::time::Instant;

use super::index::{IndexedVolume, VolumeIndex};
use super::VolumeKey;
use crate::volumes::checks::{CheckReport, Checker};

/// One ended check task: the volume, and its report (an error when the task
/// panicked, which is no evidence).
#[derive(Debug)]
pub struct Checked {
    pub key: VolumeKey,
    pub report: Result<CheckReport, JoinError>,
}

#[derive(Debug)]
pub(super) struct CheckSchedule {
    interval: Duration,
    /// Volumes not being checked, by due time.
    queue: BTreeSet<(Instant, VolumeKey)>,
    /// The due time of each volume in `queue`.
    idle: HashMap<VolumeKey, Instant>,
    /// Volumes being checked, with their next due time.
    running: HashMap<VolumeKey, Instant>,
    /// The volumes of the current index: a check that ends for a volume
    /// gone meanwhile is not scheduled again.
    current: HashSet<VolumeKey>,
    tasks: JoinSet<(VolumeKey, CheckReport)>,
    task_keys: HashMap<Id, VolumeKey>,
}

impl CheckSchedule {
    pub(super) fn new(interval: Duration) -> Self {
        Self {
            interval,
            queue: BTreeSet::new(),
            idle: HashMap::new(),
            running: HashMap::new(),
            current: HashSet::new(),
            tasks: JoinSet::new(),
            task_keys: HashMap::new(),
        }
    }

    /// Follows a rebuilt index: new volumes are due at once, gone ones leave
    /// the schedule (a check of theirs still running is left to end).
    pub(super) fn sync(&mut self, volumes: &[IndexedVolume], now: Instant) {
        self.current = volumes.iter().map(|v| v.key.clone()).collect();
        let current = &self.current;
        self.idle.retain(|key, due| {
            let keep = current.contains(key);
            if !keep {
                self.queue.remove(&(*due, key.clone()));
            }
            keep
        });
        for key in current {
            if !self.idle.contains_key(key) && !self.running.contains_key(key) {
                self.idle.insert(key.clone(), now);
                self.queue.insert((now, key.clone()));
            }
        }
    }

    /// When the next idle volume is due.
    pub(super) fn next_due(&self) -> Option<Instant> {
        self.queue.first().map(|(due, _)| *due)
    }

    /// Starts a check for every idle volume that is due.
    pub(super) fn start_due(
        &mut self,
        now: Instant,
        index: &VolumeIndex,
        mounts: &Arc<[MountEntry]>,
        checker: &Checker,
    ) {
        while let Some((due, _)) = self.queue.first() {
            if *due > now {
                break;
            }
            let Some((_, key)) = self.queue.pop_first() else {
                break;
            };
            self.idle.remove(&key);
            let Some(volume) = index.position(&key).and_then(|i| index.volumes().get(i)) else {
                continue;
            };
            let volume = volume.volume.clone();
            let checker = checker.clone();
            let mounts = Arc::clone(mounts);
            let task_key = key.clone();
            let handle = self.tasks.spawn(async move {
                let report = checker.check_volume(&volume, &mounts).await;
                (task_key, report)
            });
            self.task_keys.insert(handle.id(), key.clone());
            self.running.insert(key, now + self.interval);
        }
    }

    /// Waits for the next check to end; never resolves while none runs.
    /// Cancel-safe: the join is, and the bookkeeping after it does not wait.
    pub(super) async fn next_checked(&mut self) -> Checked {
        loop {
            let Some(joined) = self.tasks.join_next_with_id().await else {
                return std::future::pending().await;
            };
            let (id, key, report) = match joined {
                Ok((id, (key, report))) => (id, Some(key), Ok(report)),
                Err(e) => (e.id(), None, Err(e)),
            };
            let Some(key) = self.task_keys.remove(&id).or(key) else {
                continue;
            };
            self.done(&key);
            return Checked { key, report };
        }
    }

    /// A check of `key` ended: it is idle again, due one interval after
    /// its check started.
    fn done(&mut self, key: &VolumeKey) {
        let Some(due) = self.running.remove(key) else {
            return;
        };
        if self.current.contains(key) {
            self.idle.insert(key.clone(), due);
            self.queue.insert((due, key.clone()));
        }
    }

    /// Volumes with a check running now.
    pub(super) fn running(&self) -> usize {
        self.running.len()
    }
}
