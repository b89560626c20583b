//! What a user watching one PVC sees, as admin: its Events, its
//! `VolumeHealth` and its label, each watched from a list on, every
//! version kept with its `resourceVersion` and when it arrived here.
//!
//! The three are put in one history by `resourceVersion`: on this test's
//! single etcd (Events included: no `--etcd-servers-overrides`) it is the
//! etcd revision of the write, so the history is the order in which the
//! server took the writes. Kubernetes calls resource versions opaque; this
//! test relies on them only as the revisions of the one etcd it started,
//! which is what they are there. A story told in the wrong order (the
//! recovery Event written while the object still said Degraded) shows as
//! a state of the history, however short it lasted.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures_util::TryStreamExt as _;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, ListParams, WatchEvent, WatchParams};
use kube::core::{ApiResource, DynamicObject};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::Value;

use health_tests::controller::APP_NS;

const EVERY: Duration = Duration::from_millis(20);

/// One Event about the PVC, with what the assertions read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PvcEvent {
    pub name: String,
    pub type_: String,
    pub reason: String,
    pub count: i32,
    /// `firstTimestamp` and `lastTimestamp`, RFC 3339.
    pub first: String,
    pub last: String,
    pub message: String,
    pub instance: String,
}

impl PvcEvent {
    fn of(e: Event) -> PvcEvent {
        let stamp = |t: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
            t.map(|t| t.0.strftime("%Y-%m-%dT%H:%M:%SZ").to_string())
                .unwrap_or_default()
        };
        PvcEvent {
            name: e.metadata.name.unwrap_or_default(),
            type_: e.type_.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            count: e.count.unwrap_or(0),
            first: stamp(e.first_timestamp),
            last: stamp(e.last_timestamp),
            message: e.message.unwrap_or_default(),
            instance: e.reporting_instance.unwrap_or_default(),
        }
    }
}

/// What one write changed.
#[derive(Clone, Debug)]
enum Part {
    Event(PvcEvent),
    EventGone(String),
    Object(Option<Value>),
    Label(Option<String>),
}

#[derive(Clone, Debug)]
struct Change {
    rv: u64,
    seen: Instant,
    part: Part,
}

/// The PVC's story right after one write.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// The write's resource version, and when this test heard of it.
    pub rv: u64,
    pub at: Instant,
    /// Sorted by name.
    pub events: Vec<PvcEvent>,
    pub object: Option<Value>,
    pub label: Option<String>,
}

impl Snapshot {
    pub fn of_type(&self, type_: &str) -> Vec<&PvcEvent> {
        self.events.iter().filter(|e| e.type_ == type_).collect()
    }

    /// Recoveries told: the count of the (one) recovery Event.
    pub fn recoveries(&self) -> i32 {
        self.of_type("Normal").iter().map(|e| e.count).sum()
    }

    /// `status.health` of the object ("" without one).
    pub fn health(&self) -> &str {
        self.status("health").as_str().unwrap_or("")
    }

    pub fn status(&self, field: &str) -> &Value {
        match &self.object {
            Some(o) => &o["status"][field],
            None => &Value::Null,
        }
    }

    /// Whether the object or the label says Degraded.
    pub fn says_degraded(&self) -> bool {
        self.health() == "Degraded" || self.label.as_deref() == Some("Degraded")
    }
}

#[derive(Default)]
struct State {
    changes: Vec<Change>,
    error: Option<String>,
}

/// The watches and what they saw; they stop when it is dropped.
pub struct Timeline {
    state: Arc<Mutex<State>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Timeline {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Timeline {
    /// Lists and watches the PVC `pvc` in [`APP_NS`], its Events and its
    /// `VolumeHealth`; returns once the three lists are in.
    pub async fn start(admin: Client, pvc: &str) -> Result<Timeline> {
        let state = Arc::new(Mutex::new(State::default()));
        let resource = ApiResource {
            group: "volume-health.io".into(),
            version: "v1alpha1".into(),
            api_version: "volume-health.io/v1alpha1".into(),
            kind: "VolumeHealth".into(),
            plural: "volumehealths".into(),
        };
        let named = format!("metadata.name={pvc}");
        let about = format!("involvedObject.kind=PersistentVolumeClaim,involvedObject.name={pvc}");
        let tasks = vec![
            watch(
                Api::<Event>::namespaced(admin.clone(), APP_NS),
                about,
                Arc::clone(&state),
                |e, gone| match gone {
                    false => Part::Event(PvcEvent::of(e)),
                    true => Part::EventGone(e.metadata.name.unwrap_or_default()),
                },
            )
            .await?,
            watch(
                Api::<DynamicObject>::namespaced_with(admin.clone(), APP_NS, &resource),
                named.clone(),
                Arc::clone(&state),
                |o, gone| match gone {
                    false => Part::Object(serde_json::to_value(&o).ok()),
                    true => Part::Object(None),
                },
            )
            .await?,
            watch(
                Api::<PersistentVolumeClaim>::namespaced(admin, APP_NS),
                named,
                Arc::clone(&state),
                |p, _| {
                    let labels = p.metadata.labels.unwrap_or_default();
                    Part::Label(labels.get("volume-health.io/health").cloned())
                },
            )
            .await?,
        ];
        Ok(Timeline { state, tasks })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The whole history so far, one state per write, in the server's order.
    pub fn history(&self) -> Result<Vec<Snapshot>> {
        let state = self.lock();
        if let Some(e) = &state.error {
            bail!("watching the PVC's story: {e}");
        }
        let mut changes = state.changes.clone();
        drop(state);
        changes.sort_by_key(|c| c.rv);
        let mut events: BTreeMap<String, PvcEvent> = BTreeMap::new();
        let (mut object, mut label) = (None, None);
        let mut out = Vec::with_capacity(changes.len());
        for c in changes {
            match c.part {
                Part::Event(e) => {
                    events.insert(e.name.clone(), e);
                }
                Part::EventGone(name) => {
                    events.remove(&name);
                }
                Part::Object(o) => object = o,
                Part::Label(l) => label = l,
            }
            out.push(Snapshot {
                rv: c.rv,
                at: c.seen,
                events: events.values().cloned().collect(),
                object: object.clone(),
                label: label.clone(),
            });
        }
        Ok(out)
    }

    /// The first state for which `ready` holds, from the latest one when
    /// called on.
    pub async fn wait(
        &self,
        what: &str,
        within: Duration,
        ready: impl Fn(&Snapshot) -> bool,
    ) -> Result<Snapshot> {
        let from = self.history()?.last().map_or(0, |s| s.rv);
        let deadline = Instant::now() + within;
        loop {
            let history = self.history()?;
            if let Some(s) = history.iter().filter(|s| s.rv >= from).find(|s| ready(s)) {
                return Ok(s.clone());
            }
            if Instant::now() >= deadline {
                bail!(
                    "waited {within:?} for {what}; last seen: {:#?}",
                    history.last()
                );
            }
            tokio::time::sleep(EVERY).await;
        }
    }
}

fn version(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> Result<u64> {
    let rv = meta.resource_version.as_deref().unwrap_or("");
    rv.parse()
        .with_context(|| format!("resourceVersion {rv:?} is not an etcd revision"))
}

/// Lists the objects `fields` selects, then watches them from that list
/// on in a task, every version going to `state` as `part` makes it (its
/// second argument: the object was deleted).
async fn watch<K>(
    api: Api<K>,
    fields: String,
    state: Arc<Mutex<State>>,
    part: fn(K, bool) -> Part,
) -> Result<tokio::task::JoinHandle<()>>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
{
    let listed = api
        .list(&ListParams::default().fields(&fields))
        .await
        .with_context(|| format!("listing {fields}"))?;
    let mut from = listed.metadata.resource_version.clone().unwrap_or_default();
    let seen = Instant::now();
    for item in listed.items {
        let rv = version(item.meta())?;
        push(
            &state,
            Ok(Change {
                rv,
                seen,
                part: part(item, false),
            }),
        );
    }
    Ok(tokio::spawn(async move {
        loop {
            let params = WatchParams::default().fields(&fields).timeout(290);
            let stream = match api.watch(&params, &from).await {
                Ok(s) => s,
                Err(e) => return push(&state, Err(format!("watching {fields}: {e}"))),
            };
            let mut stream = std::pin::pin!(stream);
            loop {
                let (object, gone) = match stream.try_next().await {
                    Ok(Some(WatchEvent::Added(o) | WatchEvent::Modified(o))) => (o, false),
                    Ok(Some(WatchEvent::Deleted(o))) => (o, true),
                    Ok(Some(WatchEvent::Bookmark(_))) => continue,
                    Ok(Some(WatchEvent::Error(e))) => {
                        return push(&state, Err(format!("watching {fields}: {e:?}")))
                    }
                    // The server ended the watch (its timeout): go on from here.
                    Ok(None) => break,
                    Err(e) => return push(&state, Err(format!("watching {fields}: {e}"))),
                };
                let seen = Instant::now();
                let change = version(object.meta()).map(|rv| {
                    from = rv.to_string();
                    Change {
                        rv,
                        seen,
                        part: part(object, gone),
                    }
                });
                push(&state, change.map_err(|e| format!("{e:#}")));
            }
        }
    }))
}

fn push(state: &Mutex<State>, change: Result<Change, String>) {
    let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
    match change {
        Ok(c) => s.changes.push(c),
        Err(e) => s.error = Some(e),
    }
}
