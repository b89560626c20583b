//! The cluster side of the controller benchmark, as the admin: the
//! namespace, the PVs, the Events as they arrive, and the API server's
//! request counts.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::{stream, StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolume};
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::Api;
use serde_json::json;

use super::scrape::Samples;

/// Where the claims live (and the controller's Lease).
pub const NAMESPACE: &str = "bench";

/// The PV, claim and CSI handle of volume `i` (the driver's `vol-NNNNNN`).
pub fn pv_name(i: usize) -> String {
    format!("pv-{i:06}")
}
pub fn claim_name(i: usize) -> String {
    format!("data-{i:06}")
}
pub fn handle(i: usize) -> String {
    format!("vol-{i:06}")
}

pub async fn create_namespace(client: &kube::Client) -> Result<()> {
    let ns: Namespace = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}
    }))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {NAMESPACE}"))?;
    Ok(())
}

/// Installs the `VolumeHealth` CRD of deploy/, as a cluster running the
/// controller has it, and waits until it serves.
pub async fn install_volume_health_crd(client: &kube::Client) -> Result<()> {
    let file = xtask::util::workspace_root().join("deploy/volumehealth-crd.yaml");
    let text = std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
    for crd in health_tests::manifests::documents(&text, "volumehealth-crd.yaml")? {
        health_tests::envtest::apply_manifest(client, &crd)
            .await
            .context("installing the VolumeHealth CRD")?;
    }
    let resource = kube::core::ApiResource {
        group: "volume-health.io".into(),
        version: "v1alpha1".into(),
        api_version: "volume-health.io/v1alpha1".into(),
        kind: "VolumeHealth".into(),
        plural: "volumehealths".into(),
    };
    let api: Api<kube::core::DynamicObject> = Api::all_with(client.clone(), &resource);
    for _ in 0..100 {
        if api.list(&Default::default()).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    anyhow::bail!("the VolumeHealth CRD never served")
}

/// Creates `count` PVs of `driver`, `in_flight` creates at a time, each
/// bound (by claimRef; the claims themselves are not created: Events may
/// name absent objects) to claim `data-NNNNNN`. Returns how long it took.
pub async fn create_pvs(
    client: &kube::Client,
    driver: &str,
    count: usize,
    in_flight: usize,
) -> Result<Duration> {
    let api = Api::<PersistentVolume>::all(client.clone());
    let started = Instant::now();
    stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            async move {
                let pv: PersistentVolume = serde_json::from_value(json!({
                    "apiVersion": "v1", "kind": "PersistentVolume",
                    "metadata": {"name": pv_name(i)},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "csi": {"driver": driver, "volumeHandle": handle(i)},
                        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                     "namespace": NAMESPACE, "name": claim_name(i),
                                     "uid": format!("00000000-0000-4000-8000-{i:012}")}
                    }
                }))
                .context("a PV as JSON")?;
                api.create(&PostParams::default(), &pv)
                    .await
                    .with_context(|| format!("creating PV {}", pv_name(i)))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(in_flight.max(1))
        .try_collect::<()>()
        .await?;
    Ok(started.elapsed())
}

/// An Event as the rounds look for it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EventKey {
    pub object: String,
    pub type_: String,
    pub reason: String,
}

/// Every Event of the namespace as it arrives on a watch: when each
/// (object, type, reason) was first seen.
pub struct EventLog {
    seen: Arc<Mutex<HashMap<EventKey, Instant>>>,
    synced: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl EventLog {
    /// Starts watching; returns once the initial list is in.
    pub async fn start(client: &kube::Client) -> Result<EventLog> {
        let seen = Arc::new(Mutex::new(HashMap::new()));
        let synced = Arc::new(AtomicBool::new(false));
        let api = Api::<Event>::namespaced(client.clone(), NAMESPACE);
        let (sink, ready) = (Arc::clone(&seen), Arc::clone(&synced));
        let task = tokio::spawn(async move {
            let events = watcher(api, watcher::Config::default()).default_backoff();
            let mut events = std::pin::pin!(events);
            while let Some(item) = events.next().await {
                // Stamped before anything else is done with it.
                let at = Instant::now();
                match item {
                    Ok(watcher::Event::Apply(e) | watcher::Event::InitApply(e)) => {
                        let key = EventKey {
                            object: e.involved_object.name.unwrap_or_default(),
                            type_: e.type_.unwrap_or_default(),
                            reason: e.reason.unwrap_or_default(),
                        };
                        lock(&sink).entry(key).or_insert(at);
                    }
                    Ok(watcher::Event::InitDone) => ready.store(true, Ordering::Release),
                    Ok(_) => {}
                    // The watcher retries with backoff; an Event missed
                    // meanwhile is re-listed, only stamped late, which the
                    // round's figure then shows.
                    Err(e) => eprintln!("xtask: watching Events: {e}; retrying"),
                }
            }
        });
        let log = EventLog { seen, synced, task };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !log.synced.load(Ordering::Acquire) {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the Event watch did not list within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(log)
    }

    /// When the Event was first seen.
    pub fn seen(&self, object: &str, type_: &str, reason: &str) -> Option<Instant> {
        let key = EventKey {
            object: object.to_string(),
            type_: type_.to_string(),
            reason: reason.to_string(),
        };
        lock(&self.seen).get(&key).copied()
    }

    /// Every Event seen so far.
    pub fn count(&self) -> usize {
        lock(&self.seen).len()
    }
}

impl Drop for EventLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `apiserver_request_total` by (verb, resource), resource requests only:
/// the non-resource ones are our own scrapes of /metrics.
pub fn requests_by_resource(samples: &Samples) -> BTreeMap<(String, String), f64> {
    let mut out = BTreeMap::new();
    for (labels, value) in samples.matching("apiserver_request_total", &[]) {
        let resource = labels.get("resource").cloned().unwrap_or_default();
        if resource.is_empty() {
            continue;
        }
        let verb = labels.get("verb").cloned().unwrap_or_default();
        *out.entry((verb, resource)).or_insert(0.0) += value;
    }
    out
}

/// `after - before`, rows that moved only.
pub fn diff<K: Ord + Clone>(
    before: &BTreeMap<K, f64>,
    after: &BTreeMap<K, f64>,
) -> BTreeMap<K, f64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0.0);
            (d != 0.0).then(|| (k.clone(), d))
        })
        .collect()
}
