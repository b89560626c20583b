//! The PersistentVolumes this node's kubelet volume directories name, each
//! read with one GET when a volume first needs it.
//!
//! kubelet names a pod's CSI volume directory after its PV; the PV's
//! `spec.claimRef` names the claim with its uid. The agent used to hold
//! every PV of the cluster in a reflector for that: memory and start-up
//! bytes grew with the cluster (~1.6 KiB and ~2 KB per PV), on every node.
//! A node uses a few PVs, and a PV's claim does not change while a pod uses
//! it (the binding is made before the pod starts), so a GET each is enough,
//! and it is what the Node authorizer lets a kubelet do.
//!
//! A lookup that has no answer yet says so ([`Lookup::Pending`]); the
//! fetcher task asks the server (a few at a time, retried with backoff) and
//! wakes the cluster view when an answer comes. Answers are kept a while
//! ([`KEEP`]): a resolved volume keeps its targets in the reporter, so the
//! cache only has to outlive the burst of lookups of one change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt as _;
use health_kube::backoff::Backoff;
use health_kube::backoff::REQUEST_TIMEOUT;
use health_kube::pv::SlimPv;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::core::ApiResource;
use kube::{Api, Client};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long an answer is kept after it came.
pub const KEEP: Duration = Duration::from_secs(600);
/// GETs in flight at once (a node starting with many pods).
const CONCURRENT: usize = 4;

/// What is known of a PV now.
#[derive(Clone, Debug)]
pub enum Lookup {
    /// The server answered: the PV, or `None` when it has no such PV.
    Known(Option<Arc<SlimPv>>),
    /// Asked, or being asked; the view is woken when the answer comes.
    Pending,
}

#[derive(Debug)]
enum Entry {
    Known {
        pv: Option<Arc<SlimPv>>,
        at: Instant,
    },
    Pending {
        /// A failed GET is retried after the API writers' jittered
        /// backoff: a fleet's agents that failed together do not retry
        /// together.
        backoff: Box<Backoff>,
        /// Failed attempts so far.
        failures: u32,
        /// Not asked before this (a failed GET's backoff).
        not_before: Instant,
        /// A GET of it is in flight.
        asking: bool,
    },
}

/// The lookups and their answers, shared with the fetcher task.
#[derive(Clone)]
pub struct PvLookups {
    entries: Arc<Mutex<HashMap<String, Entry>>>,
    wake_fetcher: Arc<Notify>,
}

impl PvLookups {
    /// Starts the fetcher; `answered` is notified after each batch of
    /// answers.
    pub fn start(
        client: Client,
        answered: Arc<Notify>,
    ) -> (PvLookups, tokio::task::JoinHandle<()>) {
        let lookups = PvLookups {
            entries: Arc::default(),
            wake_fetcher: Arc::new(Notify::new()),
        };
        let resource = ApiResource::erase::<PersistentVolume>(&());
        let api = Api::<SlimPv>::all_with(client, &resource);
        let task = tokio::spawn(fetch_loop(lookups.clone(), api, answered));
        (lookups, task)
    }

    /// What is known of the PV `name`; asks the server when nothing is.
    pub fn lookup(&self, name: &str) -> Lookup {
        let now = Instant::now();
        let expired =
            |e: &Entry| matches!(e, Entry::Known { at, .. } if now.duration_since(*at) > KEEP);
        let mut entries = self.lock();
        match entries.get(name) {
            Some(Entry::Known { pv, at }) if now.duration_since(*at) <= KEEP => {
                Lookup::Known(pv.clone())
            }
            Some(Entry::Pending { .. }) => Lookup::Pending,
            // Asked for the first time, or answered too long ago: the
            // expired answers go now (a lookup of a known PV, which the
            // error path may make, stays a map lookup).
            _ => {
                entries.retain(|_, e| !expired(e));
                entries.insert(
                    name.to_string(),
                    Entry::Pending {
                        backoff: Box::default(),
                        failures: 0,
                        not_before: now,
                        asking: false,
                    },
                );
                drop(entries);
                self.wake_fetcher.notify_one();
                Lookup::Pending
            }
        }
    }

    /// Stops asking for the PVs no volume here names any more (`wanted`
    /// are those the volumes name now): a PV whose GET keeps failing would
    /// otherwise stay pending after its pod left.
    pub fn forget_unwanted(&self, wanted: &std::collections::HashSet<&str>) {
        self.lock()
            .retain(|name, e| matches!(e, Entry::Known { .. }) || wanted.contains(name.as_str()));
    }

    /// Some lookup has no answer yet.
    pub fn any_pending(&self) -> bool {
        self.lock()
            .values()
            .any(|e| matches!(e, Entry::Pending { .. }))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // Held only for map operations: a panic cannot leave it half-done.
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The pending names due now (marked as being asked), and when the next
    /// one not yet due is.
    fn due(&self, now: Instant) -> (Vec<String>, Option<Instant>) {
        let mut due = Vec::new();
        let mut next = None::<Instant>;
        for (name, e) in self.lock().iter_mut() {
            if let Entry::Pending {
                not_before, asking, ..
            } = e
            {
                if *asking {
                    continue;
                }
                if *not_before <= now {
                    *asking = true;
                    due.push(name.clone());
                } else {
                    next = Some(next.map_or(*not_before, |n| n.min(*not_before)));
                }
            }
        }
        (due, next)
    }

    fn answer(&self, name: &str, result: Result<Option<SlimPv>, String>) {
        let now = Instant::now();
        let mut entries = self.lock();
        let (mut backoff, failures) = match entries.remove(name) {
            Some(Entry::Pending {
                backoff, failures, ..
            }) => (backoff, failures),
            // Forgotten while it was asked for: no volume wants it.
            None => return,
            Some(Entry::Known { .. }) => (Box::default(), 0),
        };
        let entry = match result {
            Ok(pv) => Entry::Known {
                pv: pv.map(|mut pv| {
                    health_kube::pv::slim(&mut pv);
                    Arc::new(pv)
                }),
                at: now,
            },
            Err(e) => {
                if failures == 0 {
                    tracing::warn!(pv = name, "reading the PV failed, retrying: {e}");
                }
                let wait = backoff.failed();
                Entry::Pending {
                    backoff,
                    failures: failures + 1,
                    not_before: now + wait,
                    asking: false,
                }
            }
        };
        entries.insert(name.to_string(), entry);
    }
}

/// Asks for every due PV, a few at a time, and sleeps until a new lookup
/// or the next retry.
async fn fetch_loop(lookups: PvLookups, api: Api<SlimPv>, answered: Arc<Notify>) {
    loop {
        let (due, next) = lookups.due(Instant::now());
        if !due.is_empty() {
            futures_util::stream::iter(due)
                .for_each_concurrent(CONCURRENT, |name| {
                    let (api, lookups) = (api.clone(), lookups.clone());
                    async move {
                        let result =
                            match tokio::time::timeout(REQUEST_TIMEOUT, api.get_opt(&name)).await {
                                Ok(Ok(pv)) => Ok(pv),
                                Ok(Err(e)) => Err(e.to_string()),
                                Err(_) => Err(format!("no answer within {REQUEST_TIMEOUT:?}")),
                            };
                        lookups.answer(&name, result);
                    }
                })
                .await;
            answered.notify_one();
            continue;
        }
        let retry = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = lookups.wake_fetcher.notified() => {}
            _ = retry => {}
        }
    }
}

#[cfg(test)]
mod tests {
    //! The fetcher's exact requests (kube's mock API service, tower-test).

    use health_kube::testing::{client, next, respond, ApiRequest};
    use serde_json::json;

    use super::*;

    /// Answers a request with the server's "busy" (503).
    fn busy(send: health_kube::testing::Responder) {
        let status = json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                            "reason": "ServiceUnavailable", "code": 503, "message": "busy"});
        respond(send, 503, &status);
    }

    #[tokio::test]
    async fn a_failed_read_is_retried_after_a_backoff_and_the_volume_waits_meanwhile() {
        let (client, mut handle) = client();
        let answered = Arc::new(Notify::new());
        let (lookups, task) = PvLookups::start(client, Arc::clone(&answered));
        assert!(matches!(lookups.lookup("pv-1"), Lookup::Pending));
        let (ApiRequest { uri, .. }, send) = next(&mut handle).await;
        assert_eq!(uri, "/api/v1/persistentvolumes/pv-1");
        let failed_at = Instant::now();
        busy(send);
        // Still pending, and asked again only after the backoff's first
        // delay (500 ms to 1 s, jittered).
        answered.notified().await;
        assert!(matches!(lookups.lookup("pv-1"), Lookup::Pending));
        assert!(lookups.any_pending());
        let (ApiRequest { uri, .. }, send) = next(&mut handle).await;
        let waited = failed_at.elapsed();
        assert_eq!(uri, "/api/v1/persistentvolumes/pv-1");
        assert!(
            (Duration::from_millis(450)..Duration::from_millis(1500)).contains(&waited),
            "{waited:?}"
        );
        respond(
            send,
            200,
            &json!({"apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": "pv-1", "managedFields": [{"manager": "x"}]},
                    "spec": {"claimRef": {"namespace": "shop", "name": "data", "uid": "u"}}}),
        );
        answered.notified().await;
        let Lookup::Known(Some(pv)) = lookups.lookup("pv-1") else {
            panic!("the PV is known now");
        };
        let claim = pv.spec.claim_ref.as_ref().expect("its claim");
        assert_eq!(
            (claim.name.as_deref(), claim.uid.as_deref()),
            (Some("data"), Some("u"))
        );
        // Kept slim: what nothing reads is dropped.
        assert!(pv
            .metadata
            .managed_fields
            .as_ref()
            .is_none_or(|m| m.is_empty()));
        assert!(!lookups.any_pending());

        // A PV no volume names any more is no longer waited for, even
        // while its GET is out, and its late answer is not kept.
        assert!(matches!(lookups.lookup("pv-left"), Lookup::Pending));
        let (ApiRequest { uri, .. }, send) = next(&mut handle).await;
        assert_eq!(uri, "/api/v1/persistentvolumes/pv-left");
        lookups.forget_unwanted(&["pv-1"].into_iter().collect());
        assert!(!lookups.any_pending());
        busy(send);
        answered.notified().await;
        assert!(!lookups.any_pending());
        // What was answered stays known.
        assert!(matches!(lookups.lookup("pv-1"), Lookup::Known(Some(_))));
        task.abort();
    }
}
