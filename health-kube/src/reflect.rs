//! Running a kube-rs reflector's watch stream, the same way for the node
//! agent's stores and the controller's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::StreamExt as _;
use kube::runtime::watcher;
use tokio::sync::Notify;

/// Drives one reflector's watch stream for its whole life: says when the
/// first list is in (`ready`) and wakes `changed` (if any) on every event.
/// The agent and the controller both run their reflectors this way; their
/// clients count the list and watch requests (`crate::request_metrics`).
pub async fn drive<S, K>(
    stream: S,
    what: &'static str,
    changed: Option<Arc<Notify>>,
    ready: Arc<AtomicBool>,
) where
    S: futures_util::Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(event) => {
                if matches!(event, watcher::Event::InitDone) && !ready.swap(true, Ordering::AcqRel)
                {
                    tracing::info!(what, "initial list from the API server complete");
                }
                if let Some(changed) = &changed {
                    changed.notify_one();
                }
            }
            Err(e) => tracing::warn!(what, "watching the API server failed, retrying: {e}"),
        }
    }
}
