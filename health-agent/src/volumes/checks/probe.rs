//! Probes bounded by the timeout: each runs on a blocking thread, and a path
//! whose probe is still stuck in the kernel is not probed again until the
//! kernel lets that thread go.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use nix::errno::Errno;

use super::Checker;
use crate::volumes::conditions::errno_name;

#[derive(Debug, thiserror::Error)]
pub(super) enum ProbeError {
    #[error("{op} {}: {}", .path.display(), errno_name(*.errno as i32))]
    Sys {
        op: &'static str,
        path: PathBuf,
        errno: Errno,
    },
    #[error("reading {}: {source}", .path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("{}: unexpected content {content:?}", .path.display())]
    Parse { path: PathBuf, content: String },
    #[error("probe thread failed: {0}")]
    Join(String),
}

/// How a bounded probe ended.
pub(super) enum Probe<T> {
    Done(T),
    /// Timed out now, or an earlier probe of the same path is still stuck;
    /// `since` is when that stuck probe started.
    Hung {
        since: SystemTime,
    },
    Lost(ProbeError),
}

/// Paths with a probe still blocked in the kernel, and since when.
pub(super) type InFlight = Arc<Mutex<HashMap<PathBuf, SystemTime>>>;

pub(super) fn lock(
    m: &Mutex<HashMap<PathBuf, SystemTime>>,
) -> MutexGuard<'_, HashMap<PathBuf, SystemTime>> {
    // A panic elsewhere while holding the lock leaves a map that is still
    // consistent (single inserts/removes), so keep using it.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Removes a path from the in-flight set when its blocking probe ends, even
/// by panic: only the probe thread knows when the kernel let go.
struct InFlightGuard {
    map: InFlight,
    path: PathBuf,
}

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        lock(&self.map).remove(&self.path);
    }
}

impl Checker {
    /// Runs `f` on a blocking thread for at most the configured timeout,
    /// unless a probe of `path` is still stuck from before.
    pub(super) async fn bounded<T, F>(&self, path: &Path, f: F) -> Probe<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let since = SystemTime::now();
        {
            let mut in_flight = lock(&self.in_flight);
            if let Some(since) = in_flight.get(path) {
                return Probe::Hung { since: *since };
            }
            in_flight.insert(path.to_path_buf(), since);
        }
        let guard = InFlightGuard {
            map: Arc::clone(&self.in_flight),
            path: path.to_path_buf(),
        };
        let task = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            f()
        });
        // On timeout the JoinHandle is dropped, which detaches the thread; it
        // clears its in-flight entry whenever the kernel lets it go.
        match tokio::time::timeout(self.cfg.timeout, task).await {
            Ok(Ok(out)) => Probe::Done(out),
            Ok(Err(join)) => Probe::Lost(ProbeError::Join(join.to_string())),
            Err(_elapsed) => Probe::Hung { since },
        }
    }
}
