//! Syscalls on paths that may hang (a dead NFS server, a wedged FUSE daemon,
//! a btrfs volume stuck in the kernel), bounded by a timeout.
//!
//! Such a syscall cannot be cancelled: the thread that made it stays blocked
//! until the kernel lets it go. So each probe runs on a thread of its own,
//! the caller waits at most a timeout, and an [`InFlight`] set remembers the
//! paths whose probe thread is still blocked: while it is, the path is
//! answered "still hung" at once instead of blocking another thread on it.
//! That bounds the stuck threads to one per path.
//!
//! Used by `volumes::checks` (async, on tokio's blocking pool) and by
//! `topology`'s btrfs discovery (sync, on plain threads: [`spawn_claimed`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime};

/// Paths with a probe still blocked in the kernel, and since when. Cheap to
/// clone; clones share the set.
#[derive(Clone, Debug, Default)]
pub struct InFlight {
    map: Arc<Mutex<HashMap<PathBuf, SystemTime>>>,
}

impl InFlight {
    /// Claims `path` for a new probe, or says since when an earlier probe of
    /// it is stuck. The claim ends when the returned [`Claim`] is dropped:
    /// hand it to the probe thread, which alone knows when the kernel let go.
    pub fn claim(&self, path: &Path) -> Result<Claim, SystemTime> {
        let since = SystemTime::now();
        let mut map = self.lock();
        if let Some(since) = map.get(path) {
            return Err(*since);
        }
        map.insert(path.to_path_buf(), since);
        Ok(Claim {
            set: self.clone(),
            path: path.to_path_buf(),
            since,
        })
    }

    /// How many probes are blocked now (each holds a thread).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<PathBuf, SystemTime>> {
        // A panic elsewhere while holding the lock leaves a map that is still
        // consistent (single inserts/removes), so keep using it.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One path claimed by one probe; dropping it (also by panic) ends the claim.
#[derive(Debug)]
pub struct Claim {
    set: InFlight,
    path: PathBuf,
    since: SystemTime,
}

impl Claim {
    /// When the probe started.
    pub fn since(&self) -> SystemTime {
        self.since
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.set.lock().remove(&self.path);
    }
}

/// How a bounded probe ended.
#[derive(Debug, PartialEq)]
pub enum Bounded<T> {
    Done(T),
    /// Timed out now, or an earlier probe of the same path is still stuck;
    /// `since` is when that stuck probe started.
    Hung {
        since: SystemTime,
    },
    /// The probe thread could not be started or died (panic).
    Lost(String),
}

/// A probe running on its own thread; [`Pending::wait_until`] collects it.
#[derive(Debug)]
pub struct Pending<T> {
    rx: mpsc::Receiver<T>,
    since: SystemTime,
    spawn_error: Option<String>,
}

/// Runs `f` on a new thread that holds `claim` until `f` returns.
pub fn spawn_claimed<T, F>(claim: Claim, name: &str, f: F) -> Pending<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let since = claim.since();
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            let _claim = claim;
            // The receiver is gone when the caller stopped waiting: nothing
            // to tell then.
            let _ = tx.send(f());
        });
    Pending {
        rx,
        since,
        spawn_error: spawned
            .err()
            .map(|e| format!("cannot start a probe thread: {e}")),
    }
}

impl<T> Pending<T> {
    /// Waits for the probe until `deadline`. On timeout the thread is left
    /// to finish (or stay stuck) on its own, still holding its claim.
    pub fn wait_until(self, deadline: Instant) -> Bounded<T> {
        if let Some(e) = self.spawn_error {
            return Bounded::Lost(e);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match self.rx.recv_timeout(left) {
            Ok(out) => Bounded::Done(out),
            Err(RecvTimeoutError::Timeout) => Bounded::Hung { since: self.since },
            Err(RecvTimeoutError::Disconnected) => {
                Bounded::Lost("the probe thread panicked".to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_claim_is_exclusive_until_dropped() {
        let set = InFlight::default();
        let claim = set.claim(Path::new("/v")).unwrap();
        assert_eq!(set.claim(Path::new("/v")).unwrap_err(), claim.since());
        let other = set.claim(Path::new("/w")).unwrap();
        assert_eq!(set.len(), 2);
        drop(claim);
        drop(other);
        assert!(set.is_empty());
        assert!(set.claim(Path::new("/v")).is_ok());
    }

    #[test]
    fn a_slow_probe_is_hung_and_keeps_its_claim_until_it_ends() {
        let set = InFlight::default();
        let (release, wait) = mpsc::channel::<()>();
        let claim = set.claim(Path::new("/slow")).unwrap();
        let since = claim.since();
        let pending = spawn_claimed(claim, "test-probe", move || wait.recv().is_ok());
        let out = pending.wait_until(Instant::now() + Duration::from_millis(50));
        assert_eq!(out, Bounded::Hung { since });
        assert_eq!(set.claim(Path::new("/slow")).unwrap_err(), since);
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !set.is_empty() {
            assert!(Instant::now() < deadline, "the claim outlived its thread");
            std::thread::sleep(Duration::from_millis(5));
        }
        let quick = spawn_claimed(set.claim(Path::new("/slow")).unwrap(), "t", || 7);
        assert_eq!(
            quick.wait_until(Instant::now() + Duration::from_secs(10)),
            Bounded::Done(7)
        );
        let panics = spawn_claimed(set.claim(Path::new("/p")).unwrap(), "t", || -> u8 {
            panic!("probe panicked on purpose")
        });
        assert_eq!(
            panics.wait_until(Instant::now() + Duration::from_secs(10)),
            Bounded::Lost("the probe thread panicked".into())
        );
    }
}
