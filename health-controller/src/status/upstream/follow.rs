//! The leader's task that keeps `pvc.status.healthStatus` in step with the
//! claims' `VolumeHealth` objects: a reflector over the objects (every
//! writer's entries, the nodes' agents' included), and a write for each of
//! this driver's claims whose object changed. The field therefore follows
//! the object: the two never tell different stories for longer than one
//! watch event and one request.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use futures_util::StreamExt as _;
use health_kube::status::{Claim, VolumeHealth};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client};
use tokio::sync::Notify;

use super::{shape, HealthStatusWriter};
use crate::claim_index::ClaimIndex;
use crate::metrics::ControllerMetrics;

/// This driver's bound claims, as the last cycle saw them.
#[derive(Default)]
struct Claims {
    index: Arc<ClaimIndex>,
    /// Claims bound since the task last looked.
    added: Vec<Claim>,
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
    pub fn set_claims(&self, index: &Arc<ClaimIndex>) {
        let mut c = self.shared.lock();
        if Arc::ptr_eq(&c.index, index) {
            return;
        }
        let added = index.added_since(&c.index);
        c.added.extend(added);
        c.index = Arc::clone(index);
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
                    let index = Arc::clone(&c.index);
                    writer.retain(|ns, name| index.contains(ns, name));
                    std::mem::take(&mut c.added)
                };
                for claim in added {
                    let at = ObjectRef::new(&claim.name).within(&claim.namespace);
                    if let Some(o) = store.get(&at) {
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
    let Some(claim) = shared.lock().index.claim(ns, name) else {
        return;
    };
    writer
        .write(&claim, shape::wanted(object), SystemTime::now())
        .await;
}
