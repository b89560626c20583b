//! Writes what the [`crate::events::Recorder`] decides against the API server, a few
//! requests at a time: `POST` for a new Event, a JSON merge `PATCH` of
//! `count`, `lastTimestamp` and `message` to aggregate; a node's agent keeps
//! what the server accepted in a file on the node ([`LocalCopy`]), which
//! its next start continues from ([`recover_from`]). The controller, one
//! process for the cluster, lists its Events instead ([`recover`]). Failures the server may get
//! over (unreachable, 5xx, 429, timeouts) back off exponentially while the
//! recorder keeps aggregating, so an outage costs one request per backoff
//! step and nothing detected meanwhile is lost.

use std::sync::Arc;

use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Event;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio::time::Instant;

use crate::backoff::{Backoff, REQUEST_TIMEOUT};
use crate::events::{LocalCopy, Next, Outcome, Shared, Write};
use crate::observer::Observer;

/// Writes in flight at once. The pod's and the PVC's Event of one failure
/// go out together instead of the second waiting for the first's answer
/// (a round trip, and on a busy API server most of the PVC's latency); a
/// handful bounds what an outage's end can fire at the server at once.
const MAX_IN_FLIGHT: usize = 4;
/// Events listed per page when recovering after a restart.
const LIST_PAGE: u32 = 500;

/// Runs until the task is dropped. First takes over the open Events of an
/// earlier process ([`recover`]), then writes what the recorder decides.
pub async fn run(client: Client, shared: Arc<Shared>, metrics: Option<Arc<dyn Observer>>) {
    recover(&client, &shared).await;
    write(client, shared, metrics, None).await
}

/// The writing half of [`run`], for a caller that has taken over earlier
/// Events itself ([`recover`], [`recover_from`]). Each write the server
/// accepts goes into `kept` (when given), and `kept` to its file.
pub async fn write(
    client: Client,
    shared: Arc<Shared>,
    metrics: Option<Arc<dyn Observer>>,
    mut kept: Option<LocalCopy>,
) {
    let mut backoff = Backoff::default();
    // After a failure no new write starts before this.
    let mut paused_until: Option<Instant> = None;
    let mut in_flight = FuturesUnordered::new();
    // The recorder counts deferrals when it looks for the next write; the
    // metric follows that count.
    let mut deferred_reported = 0;
    loop {
        let mut wake = paused_until.filter(|at| *at > Instant::now());
        if wake.is_none() {
            paused_until = None;
            while in_flight.len() < MAX_IN_FLIGHT {
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
                match next {
                    Next::Write(write) => {
                        let client = client.clone();
                        let metrics = metrics.clone();
                        in_flight.push(async move {
                            let outcome = perform(&client, &write, metrics.as_deref()).await;
                            (write, outcome)
                        });
                    }
                    Next::Idle(at) => {
                        wake = at;
                        break;
                    }
                }
            }
        }
        tokio::select! {
            Some((write, outcome)) = in_flight.next(), if !in_flight.is_empty() => {
                let retry = outcome == Outcome::Retry;
                if let Some(copy) = kept.as_mut() {
                    if copy.apply(&write, &outcome) {
                        copy.save_in_background(std::time::SystemTime::now());
                    }
                }
                shared.lock().finish(&write, outcome, Instant::now());
                if retry {
                    let pause = backoff.failed();
                    tracing::debug!(?pause, "event write failed; backing off");
                    paused_until = Some(Instant::now() + pause);
                } else {
                    backoff.succeeded();
                }
            }
            _ = shared.notified() => {}
            _ = sleep_until(wake) => {}
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Why the Events of an earlier agent process could not be listed.
pub type ListError = super::paged_list::PageError;

/// The Events an earlier process wrote, in all namespaces.
/// - The controller lists every Event of its component
///   (`fieldSelector=reportingComponent=...`: any replica's), in pages.
/// - Otherwise they are selected by the node's label (`crate::node_label`:
///   the server sends no other node's) in one answer. The API server reads
///   every Event of the cluster from etcd for it (Events are not in its
///   watch cache), which is why a node's agent reads its [`LocalCopy`]
///   instead ([`recover_from`]).
///
/// Events expire after the server's TTL (an hour by default), which bounds
/// the answer.
pub async fn list_own_events(
    client: &Client,
    config: &crate::events::RecorderConfig,
) -> Result<Vec<Event>, ListError> {
    let api: Api<Event> = Api::all(client.clone());
    let params = if config.adopt_any_instance {
        ListParams::default()
            .fields(&format!("reportingComponent={}", config.component))
            .limit(LIST_PAGE)
    } else {
        ListParams::default()
            .labels(&crate::node_label::event_selector(&config.host))
            .match_any()
    };
    let mut events = Vec::new();
    super::paged_list::list_pages(&api, params, REQUEST_TIMEOUT, |page| events.extend(page))
        .await?;
    Ok(events)
}

/// Seeds the recorder with the Events an earlier process wrote (the agent
/// before a restart on this node; for the controller, any replica before a
/// takeover), so that an open episode goes on in the same Event. A failed
/// list is logged as an error, and the agent goes on as a first start
/// would: open episodes get new Events.
pub async fn recover(client: &Client, shared: &Shared) {
    let (config, whose) = {
        let recorder = shared.lock();
        let config = recorder.config().clone();
        let whose = if config.adopt_any_instance {
            "any replica's"
        } else {
            "this node's"
        };
        (config, whose)
    };
    match list_own_events(client, &config).await {
        Ok(events) => {
            let adopted =
                shared
                    .lock()
                    .adopt(&events, std::time::SystemTime::now(), Instant::now());
            tracing::info!(
                listed = events.len(),
                own = adopted.own,
                open = adopted.warnings,
                recoveries = adopted.normals,
                "took over {whose} Events from before this process started"
            );
            shared.wake();
        }
        Err(e) => tracing::error!(
            "could not read back {whose} Events ({e}); episodes open before this process started will be reported as new Events"
        ),
    }
}

/// Seeds the recorder with the Events an earlier agent on this node wrote,
/// from the node's copy (read by the caller: [`LocalCopy::load`]), so that
/// an open episode goes on in the same Event. Nothing is asked of the API
/// server.
pub fn recover_from(copy: &LocalCopy, shared: &Shared) {
    let events = copy.events();
    let adopted = shared
        .lock()
        .adopt(&events, std::time::SystemTime::now(), Instant::now());
    tracing::info!(
        kept = events.len(),
        open = adopted.warnings,
        recoveries = adopted.normals,
        "took over this node's Events from before this process started ({})",
        copy.path().display()
    );
    shared.wake();
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
    let outcome = match result {
        Ok(Ok(())) => Outcome::Done,
        Ok(Err(kube::Error::Api(status))) => {
            let code = status.code;
            match (verb, code) {
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
            }
        }
        Ok(Err(e)) => {
            tracing::warn!(verb, "event write failed: {e}");
            Outcome::Retry
        }
        Err(_) => {
            tracing::warn!(verb, "event write timed out after {REQUEST_TIMEOUT:?}");
            Outcome::Retry
        }
    };
    // The request itself is counted by the client (`crate::request_metrics`).
    if let (Some(m), Outcome::Done) = (metrics, &outcome) {
        let (type_, reason) = write.kind();
        m.event_written(type_.as_str(), reason);
    }
    outcome
}
