//! The leader's task that keeps `pvc.status.healthStatus` in step with the
//! claims' `VolumeHealth` objects: a reflector over the objects (every
//! writer's entries, the nodes' agents' included), and a write for each of
//! this driver's claims whose object changed. The field therefore follows
//! the object: the two never tell different stories for longer than one
//! watch event and one request.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use futures_util::StreamExt as _;
use health_kube::status::{Claim, VolumeHealth};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client};
use tokio::sync::Notify;

use super::{shape, HealthStatusWriter};
use crate::metrics::ControllerMetrics;

type Key = (String, String);

/// This driver's bound claims, as the last cycle saw them.
#[derive(Default)]
struct Claims {
    by_key: HashMap<Key, Claim>,
    /// Claims added since the task last looked.
    added: BTreeSet<Key>,
}

#[derive(Default)]
struct Shared {
    claims: Mutex<Claims>,
    changed: Notify,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Claims> {
        self.claims.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The running task; aborted when dropped (the leadership ended).
pub struct Follower {
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Follower {
    pub fn start(client: Client, metrics: Option<Arc<ControllerMetrics>>) -> Self {
        let shared = Arc::new(Shared::default());
        let writer = HealthStatusWriter::new(client.clone(), metrics);
        let task = tokio::spawn(run(client, Arc::clone(&shared), writer));
        Follower { shared, task }
    }

    /// The claims bound to this driver's PVs now: only theirs are written.
    pub fn set_claims(&self, claims: impl IntoIterator<Item = Claim>) {
        let mut c = self.shared.lock();
        let now: HashMap<Key, Claim> = claims
            .into_iter()
            .map(|c| ((c.namespace.clone(), c.name.clone()), c))
            .collect();
        let added: Vec<Key> = now
            .keys()
            .filter(|k| !c.by_key.contains_key(*k))
            .cloned()
            .collect();
        if added.is_empty() && now.len() == c.by_key.len() {
            return;
        }
        c.added.extend(added);
        c.by_key = now;
        drop(c);
        self.shared.changed.notify_one();
    }
}

async fn run(client: Client, shared: Arc<Shared>, mut writer: HealthStatusWriter) {
    let (store, store_writer) = reflector::store::<VolumeHealth>();
    let objects = reflector::reflector(
        store_writer,
        watcher(Api::<VolumeHealth>::all(client), watcher::Config::default()),
    )
    .default_backoff()
    .touched_objects();
    let mut objects = std::pin::pin!(objects);
    loop {
        tokio::select! {
            event = objects.next() => match event {
                // The object as the event carries it: during the initial
                // list the store is filled only once the list is complete.
                Some(Ok(o)) => write_one(&mut writer, &shared, &o).await,
                Some(Err(e)) => {
                    // The watcher retries with backoff; the field waits.
                    tracing::warn!("watching VolumeHealth objects: {e}");
                }
                None => return,
            },
            _ = shared.changed.notified() => {
                let added = {
                    let mut c = shared.lock();
                    let keep: BTreeSet<Key> = c.by_key.keys().cloned().collect();
                    writer.retain(|ns, name| keep.contains(&(ns.to_string(), name.to_string())));
                    std::mem::take(&mut c.added)
                };
                for (ns, name) in added {
                    if let Some(o) = store.get(&ObjectRef::new(&name).within(&ns)) {
                        write_one(&mut writer, &shared, &o).await;
                    }
                }
            }
        }
    }
}

/// Writes the field of `object`'s claim if it is one of this driver's.
async fn write_one(writer: &mut HealthStatusWriter, shared: &Shared, object: &VolumeHealth) {
    let (Some(ns), Some(name)) = (&object.metadata.namespace, &object.metadata.name) else {
        return;
    };
    let Some(claim) = shared
        .lock()
        .by_key
        .get(&(ns.clone(), name.clone()))
        .cloned()
    else {
        return;
    };
    writer
        .write(&claim, shape::wanted(object), SystemTime::now())
        .await;
}
