//! Probes bounded by the timeout (see [`health_topology::bounded`]): each runs on a
//! blocking thread, a path whose probe is still stuck in the kernel is not
//! probed again until the kernel lets that thread go, and at most
//! [`MAX_PROBE_THREADS`] probe threads exist at once, stuck ones included.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use health_core::conditions::errno_name;
use nix::errno::Errno;

use super::Checker;

/// How many probe threads may exist at once, those stuck in the kernel
/// included. A check that finds none free within the timeout reports that
/// it could not look (no evidence): a node with 500 volumes on a dead NFS
/// server holds at most this many blocked threads, not one per volume.
pub const MAX_PROBE_THREADS: usize = 32;

/// Why a probe could not look.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{op} {}: {}", .path.display(), errno_name(*.errno as i32))]
    Sys {
        op: &'static str,
        path: PathBuf,
        errno: Errno,
    },
    // The cause in the message, not also a `source()` (it is logged whole).
    #[error("reading {}: {error}", .path.display())]
    Read { path: PathBuf, error: io::Error },
    #[error("{}: unexpected content {content:?}", .path.display())]
    Parse { path: PathBuf, content: String },
    #[error(
        "no single journal thread of {name} under {}: {found} processes named jbd2/{name}-*",
        .proc_root.display()
    )]
    JournalThread {
        name: String,
        proc_root: PathBuf,
        found: usize,
    },
    #[error("probe thread failed: {0}")]
    Join(String),
    #[error(
        "no probe thread free within {timeout:?}: all {MAX_PROBE_THREADS} are in probes of other paths ({busy} in flight)"
    )]
    NoThread {
        timeout: std::time::Duration,
        busy: usize,
    },
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

impl Checker {
    /// Runs `f` on a blocking thread for at most the configured timeout,
    /// unless a probe of `path` is still stuck from before.
    pub(super) async fn bounded<T, F>(&self, path: &Path, f: F) -> Probe<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        let claim = match self.in_flight.claim(path) {
            Ok(claim) => claim,
            Err(since) => return Probe::Hung { since },
        };
        let since = claim.since();
        let timeout = self.cfg.timeout;
        // The permit goes with the thread: a stuck thread keeps it.
        let permit =
            match tokio::time::timeout(timeout, Arc::clone(&self.probe_threads).acquire_owned())
                .await
            {
                Ok(Ok(permit)) => permit,
                // The semaphore is never closed; a closed one would only mean
                // no probe can run.
                Ok(Err(_)) | Err(_) => {
                    return Probe::Lost(ProbeError::NoThread {
                        timeout,
                        busy: self.in_flight.len().saturating_sub(1),
                    })
                }
            };
        let task = tokio::task::spawn_blocking(move || {
            let _claim = claim;
            let _permit = permit;
            f()
        });
        // On timeout the JoinHandle is dropped, which detaches the thread; it
        // ends its claim and frees its permit whenever the kernel lets it go.
        match tokio::time::timeout(timeout, task).await {
            Ok(Ok(out)) => Probe::Done(out),
            Ok(Err(join)) => Probe::Lost(ProbeError::Join(join.to_string())),
            Err(_elapsed) => Probe::Hung { since },
        }
    }
}
