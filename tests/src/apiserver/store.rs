//! The server's state: the stored pods, PVs and Events, the change history watches
//! resume from, list snapshots for `continue`, and the recorded requests.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};

use hyper::body::Bytes;
use serde_json::Value;
use tokio::sync::watch;

use super::apply::Owners;
use super::json::{
    meta_mut, meta_remove, meta_str, name_of, namespace_of, now_rfc3339, too_old_line,
};
use super::select::WatchSpec;
use super::{Mode, Recorded};

/// Changes to pods and PVs kept for resuming watches. Watches from a version older
/// than the oldest kept change get 410 Gone, as from a compacted etcd.
const HISTORY_LIMIT: usize = 1000;

/// What the server thread and the test thread share.
pub(super) struct Shared {
    pub(super) state: Mutex<State>,
    /// The resourceVersion of the latest change (or compaction); watch tasks wait on
    /// it and then read the history under the lock.
    pub(super) changes: watch::Sender<u64>,
    pub(super) mode: watch::Sender<Mode>,
}

impl Shared {
    /// The state, even after a panic elsewhere poisoned the lock: the server keeps
    /// answering so the failing test reports its own error, not a cascade.
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The stored kinds (Events are kept apart: they have no watch history).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Kind {
    Pod,
    PersistentVolume,
    /// Put by tests; the agent only applies its label (`volumehealth`).
    PersistentVolumeClaim,
    /// The project's CRD, written by server-side apply (`volumehealth`).
    VolumeHealth,
}

impl Kind {
    pub(super) fn from_kind(kind: &str) -> Option<Kind> {
        match kind {
            "Pod" => Some(Kind::Pod),
            "PersistentVolume" => Some(Kind::PersistentVolume),
            "PersistentVolumeClaim" => Some(Kind::PersistentVolumeClaim),
            "VolumeHealth" => Some(Kind::VolumeHealth),
            _ => None,
        }
    }

    pub(super) fn kind(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::PersistentVolume => "PersistentVolume",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaim",
            Kind::VolumeHealth => "VolumeHealth",
        }
    }

    pub(super) fn list_kind(self) -> &'static str {
        match self {
            Kind::Pod => "PodList",
            Kind::PersistentVolume => "PersistentVolumeList",
            Kind::PersistentVolumeClaim => "PersistentVolumeClaimList",
            Kind::VolumeHealth => "VolumeHealthList",
        }
    }

    pub(super) fn api_version(self) -> &'static str {
        match self {
            Kind::VolumeHealth => "volume-health.io/v1alpha1",
            _ => "v1",
        }
    }

    pub(super) fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::PersistentVolume => "persistentvolumes",
            Kind::PersistentVolumeClaim => "persistentvolumeclaims",
            Kind::VolumeHealth => "volumehealths",
        }
    }

    pub(super) fn namespaced(self) -> bool {
        self != Kind::PersistentVolume
    }
}

/// (kind, namespace or "" for cluster-scoped, name)
pub(super) type ObjKey = (Kind, String, String);

/// One put or delete, for watches.
pub(super) struct Change {
    pub(super) rv: u64,
    pub(super) kind: Kind,
    /// The object before (None: created).
    pub(super) before: Option<Value>,
    /// The object after (None: deleted).
    pub(super) after: Option<Value>,
}

/// The rest of a paginated list, served by `continue`.
pub(super) struct PageSnapshot {
    pub(super) token: String,
    pub(super) rv: u64,
    pub(super) kind: Kind,
    pub(super) items: Vec<Value>,
}

#[derive(Default)]
pub(super) struct State {
    /// The one resourceVersion counter for everything, as etcd's revision.
    pub(super) rv: u64,
    /// Counter for uids, generated names and continue tokens.
    serial: u64,
    pub(super) objects: BTreeMap<ObjKey, Value>,
    pub(super) history: VecDeque<Change>,
    /// Changes up to this version are gone from `history`.
    pub(super) compacted_rv: u64,
    /// Events by (namespace, name).
    pub(super) events: BTreeMap<(String, String), Value>,
    pub(super) requests: Vec<Recorded>,
    pub(super) pages: VecDeque<PageSnapshot>,
    /// Server-side apply: who owns which field of a stored object.
    pub(super) owners: BTreeMap<ObjKey, Owners>,
}

impl State {
    pub(super) fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    pub(super) fn new_uid(&mut self) -> String {
        format!("00000000-fa4e-4000-8000-{:012x}", self.next_serial())
    }

    pub(super) fn put_object(&mut self, kind: Kind, mut obj: Value) {
        self.rv += 1;
        let rv = self.rv;
        let namespace = if kind.namespaced() {
            let ns = namespace_of(&obj);
            if ns.is_empty() {
                "default".to_string()
            } else {
                ns.to_string()
            }
        } else {
            String::new()
        };
        let key = (kind, namespace.clone(), name_of(&obj).to_string());
        let before = self.objects.get(&key).cloned();
        let uid = before
            .as_ref()
            .and_then(|b| meta_str(b, "uid"))
            .map(str::to_string);
        let created = before
            .as_ref()
            .and_then(|b| meta_str(b, "creationTimestamp"))
            .map(str::to_string);
        let uid = match uid {
            Some(uid) => uid,
            None => self.new_uid(),
        };
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), kind.api_version().into());
            o.insert("kind".into(), kind.kind().into());
        }
        if kind.namespaced() {
            meta_mut(&mut obj)["namespace"] = namespace.into();
        } else {
            meta_remove(&mut obj, "namespace");
        }
        let meta = meta_mut(&mut obj);
        meta["resourceVersion"] = rv.to_string().into();
        if meta.get("uid").is_none() {
            meta["uid"] = uid.into();
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = created.unwrap_or_else(now_rfc3339).into();
        }
        self.objects.insert(key, obj.clone());
        self.record_change(Change {
            rv,
            kind,
            before,
            after: Some(obj),
        });
    }

    pub(super) fn delete_object(&mut self, kind: Kind, namespace: &str, name: &str) -> bool {
        let key = (kind, namespace.to_string(), name.to_string());
        let Some(before) = self.objects.remove(&key) else {
            return false;
        };
        self.owners.remove(&key);
        self.rv += 1;
        self.record_change(Change {
            rv: self.rv,
            kind,
            before: Some(before),
            after: None,
        });
        true
    }

    fn record_change(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > HISTORY_LIMIT {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
    }

    /// Watch lines for the changes after `cursor` that concern `spec`, and the
    /// version they bring the watch to; Err(the 410 ERROR line) if some are gone.
    pub(super) fn drain(&self, spec: &WatchSpec, cursor: u64) -> Result<(Vec<Bytes>, u64), Bytes> {
        if cursor < self.compacted_rv {
            return Err(too_old_line(cursor, self.compacted_rv));
        }
        let lines = self
            .history
            .iter()
            .filter(|c| c.rv > cursor && c.kind == spec.kind)
            .filter_map(|c| spec.event_for(c))
            .collect();
        Ok((lines, self.rv.max(cursor)))
    }

    /// The objects of `spec` as they are now, sorted by (namespace, name).
    pub(super) fn current(&self, spec: &WatchSpec) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((kind, _, _), obj)| *kind == spec.kind && spec.matches(obj))
            .map(|(_, obj)| obj.clone())
            .collect()
    }
}
