//! Writes what the [`Recorder`] decides, one request at a time, against the
//! API server: `POST` for a new Event, a JSON merge `PATCH` of `count`,
//! `lastTimestamp` and `message` to aggregate. Failures the server may get
//! over (unreachable, 5xx, 429, timeouts) back off exponentially while the
//! recorder keeps aggregating, so an outage costs one request per backoff
//! step and nothing detected meanwhile is lost.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use k8s_openapi::api::core::v1::Event;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio::time::Instant;

use super::events::{Next, Outcome, Recorder, Write};

/// What the writer reports as it goes (metrics in the agent, nothing in
/// tests that don't care).
pub trait Observer: Send + Sync {
    /// One API request: its verb, resource and HTTP status (`None`: no
    /// response).
    fn api_request(&self, verb: &str, resource: &str, code: Option<u16>);
    /// An Event write the server accepted.
    fn event_written(&self, type_: &str, reason: &str);
    /// A write held back by the per-object cap.
    fn event_write_deferred(&self);
}

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
}

impl Observer for crate::report::metrics::Metrics {
    fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
        crate::report::metrics::Metrics::api_request(self, verb, resource, code)
    }
    fn event_written(&self, type_: &str, reason: &str) {
        crate::report::metrics::Metrics::event_written(self, type_, reason)
    }
    fn event_write_deferred(&self) {
        crate::report::metrics::Metrics::event_write_deferred(self)
    }
}

/// How long one Event request may take before it counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Runs until the task is dropped.
pub async fn run(client: Client, shared: Arc<Shared>, metrics: Option<Arc<dyn Observer>>) {
    let mut backoff = BACKOFF_MIN;
    // The recorder counts deferrals when it looks for the next write; the
    // metric follows that count.
    let mut deferred_reported = 0;
    loop {
        let (next, deferred) = {
            let mut r = shared.lock();
            let next = r.next_write(Instant::now());
            (next, r.stats().deferred)
        };
        if let Some(m) = &metrics {
            for _ in deferred_reported..deferred {
                m.event_write_deferred();
            }
        }
        deferred_reported = deferred;
        let write = match next {
            Next::Write(w) => w,
            Next::Idle(wake) => {
                match wake {
                    Some(at) => {
                        tokio::select! {
                            _ = shared.notify.notified() => {}
                            _ = tokio::time::sleep_until(at) => {}
                        }
                    }
                    None => shared.notify.notified().await,
                }
                continue;
            }
        };
        let outcome = perform(&client, &write, metrics.as_deref()).await;
        shared
            .lock()
            .finish(&write, outcome.clone(), Instant::now());
        if outcome == Outcome::Retry {
            tracing::debug!(?backoff, "event write failed; backing off");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
        } else {
            backoff = BACKOFF_MIN;
        }
    }
}

/// Makes one request and classifies how it ended.
pub async fn perform(client: &Client, write: &Write, metrics: Option<&dyn Observer>) -> Outcome {
    let (verb, result) = match write {
        Write::Create { event, .. } => {
            let ns = event.metadata.namespace.clone().unwrap_or_default();
            let api: Api<Event> = Api::namespaced(client.clone(), &ns);
            let r =
                tokio::time::timeout(REQUEST_TIMEOUT, api.create(&PostParams::default(), event))
                    .await;
            ("create", r.map(|r| r.map(drop)))
        }
        Write::Patch {
            namespace,
            name,
            patch,
            ..
        } => {
            let api: Api<Event> = Api::namespaced(client.clone(), namespace);
            let r = tokio::time::timeout(
                REQUEST_TIMEOUT,
                api.patch(name, &PatchParams::default(), &Patch::Merge(patch)),
            )
            .await;
            ("patch", r.map(|r| r.map(drop)))
        }
    };
    let (code, outcome) = match result {
        Ok(Ok(())) => (
            Some(if verb == "create" { 201 } else { 200 }),
            Outcome::Done,
        ),
        Ok(Err(kube::Error::Api(status))) => {
            let code = status.code;
            let outcome = match (verb, code) {
                ("patch", 404) => Outcome::NotFound,
                ("create", 409) => Outcome::Conflict,
                (_, 429) | (_, 500..=599) => Outcome::Retry,
                _ => {
                    tracing::error!(
                        verb,
                        code,
                        message = %status.message,
                        "the API server refused an event; dropping it (check the agent's RBAC)"
                    );
                    Outcome::Rejected
                }
            };
            (Some(code), outcome)
        }
        Ok(Err(e)) => {
            tracing::warn!(verb, "event write failed: {e}");
            (None, Outcome::Retry)
        }
        Err(_) => {
            tracing::warn!(verb, "event write timed out after {REQUEST_TIMEOUT:?}");
            (None, Outcome::Retry)
        }
    };
    if let Some(m) = metrics {
        m.api_request(verb, "events", code);
        if outcome == Outcome::Done {
            let (type_, reason) = write.kind();
            m.event_written(type_.as_str(), reason);
        }
    }
    outcome
}
