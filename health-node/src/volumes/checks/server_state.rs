//! What the NFS and SMB server checks share: the probe's failure they
//! judge, one read of the client's state serving a round of checks, and
//! the mount's options.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use health_topology::MountEntry;

/// The value of the mount's superblock option `key` (`addr=`, `timeo=`).
pub fn super_option<'a>(mount: &'a MountEntry, key: &str) -> Option<&'a str> {
    mount
        .super_options
        .split(',')
        .find_map(|o| o.strip_prefix(key)?.strip_prefix('='))
}

/// What the probe of the mount saw.
pub struct Failed<'a> {
    pub path: &'a Path,
    pub op: &'static str,
    /// The probe's error; `None` while it waits.
    pub errno: Option<i32>,
}

/// The client's state last read, reused within [`REUSE`]: when a server
/// stops, every volume of it fails in the same round, and each would read
/// the whole file again.
#[derive(Debug)]
pub struct Recent<T> {
    last: Mutex<Option<(SystemTime, Arc<T>)>>,
}

/// How long one read serves the volumes of a round.
pub const REUSE: Duration = Duration::from_millis(500);

impl<T> Default for Recent<T> {
    fn default() -> Self {
        Self {
            last: Mutex::new(None),
        }
    }
}

impl<T> Recent<T> {
    /// The state read at most [`REUSE`] before `now`, else `read`'s.
    pub fn get(
        &self,
        now: SystemTime,
        read: impl FnOnce() -> std::io::Result<T>,
    ) -> std::io::Result<Arc<T>> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, state)) = last.as_ref() {
            let age = now.duration_since(*at).unwrap_or(Duration::MAX);
            if age < REUSE {
                return Ok(Arc::clone(state));
            }
        }
        let state = Arc::new(read()?);
        *last = Some((now, Arc::clone(&state)));
        Ok(state)
    }
}
