//! The recorder shared between the agent loop (which records) and the
//! writer task (which writes, [`crate::writer`]).

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::Recorder;

/// The recorder shared between the agent loop (which records) and the
/// writer task (which writes). The lock is held only for bookkeeping, never
/// across a request.
pub struct Shared {
    recorder: Mutex<Recorder>,
    notify: Notify,
}

impl Shared {
    pub fn new(recorder: Recorder) -> Arc<Shared> {
        Arc::new(Shared {
            recorder: Mutex::new(recorder),
            notify: Notify::new(),
        })
    }

    /// The recorder, for recording; call [`Shared::wake`] after.
    pub fn lock(&self) -> MutexGuard<'_, Recorder> {
        // A panic while holding the lock leaves plain data behind; the
        // recorder's invariants hold between any two calls.
        self.recorder.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the writer there may be something to write.
    pub fn wake(&self) {
        self.notify.notify_one();
    }

    /// Resolves at the next [`Shared::wake`] (or at once if one came since
    /// the last wait): the writer's signal to look again.
    pub(crate) fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }
}
