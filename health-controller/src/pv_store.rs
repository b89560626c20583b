//! This driver's PVs as the controller keeps them: one [`MonitoredVolume`]
//! per PV of the driver, in a list sorted by PV name that the cycles share
//! instead of copying (a cycle holds the list it started with; a watch
//! event meanwhile copies the list's pointers, not its strings).
//!
//! Why not kube's reflector `Store`: PVs cannot be selected by CSI driver
//! on the server, so the store would hold every PV of the cluster, each an
//! `Arc`'d object with its `ObjectMeta`, keyed by an `ObjectRef` that
//! repeats its name and uid: ~1.3 KB per PV, the largest part of the
//! controller's 570 MB at 100,000 PVs (docs/benchmarks.md, "Scale"). Here a
//! PV of another driver is not kept at all, and one of this driver costs
//! its three strings.

use std::sync::{Arc, PoisonError, RwLock};

use health_kube::events::{ObjectKind, ObjectRef};
use health_kube::pv::SlimPv;
use kube::runtime::watcher;
use kube::ResourceExt as _;

/// One PV of this driver. Cloning it copies three pointers.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MonitoredVolume {
    pub pv: Arc<str>,
    /// `spec.csi.volumeHandle`: the id the CSI driver knows the volume by.
    pub handle: Arc<str>,
    /// The PVC bound to it (`None` while the PV is Available or Released
    /// without a claim reference).
    pub claim: Option<Arc<ObjectRef>>,
}

/// The PVs of one driver, kept from its watch events.
#[derive(Debug)]
pub struct PvStore {
    driver: String,
    state: RwLock<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Sorted by PV name, one per PV.
    volumes: Arc<Vec<MonitoredVolume>>,
    /// Filled between a (re)list's `Init` and `InitDone`, then replaces
    /// `volumes` whole: a PV deleted while the watch was down goes then.
    relisting: Option<Vec<MonitoredVolume>>,
}

impl PvStore {
    pub fn new(driver: &str) -> PvStore {
        PvStore {
            driver: driver.to_string(),
            state: RwLock::default(),
        }
    }

    /// This driver's PVs now, sorted by name; shared, not copied.
    pub fn volumes(&self) -> Arc<Vec<MonitoredVolume>> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&state.volumes)
    }

    /// Applies one event of the PV watch.
    pub fn apply(&self, event: watcher::Event<SlimPv>) {
        // Decoded before the lock is taken: the cycles' reads never wait
        // for it.
        let (name, ours) = match &event {
            watcher::Event::Apply(pv) | watcher::Event::InitApply(pv) => {
                (pv.name_any(), self.monitored(pv))
            }
            watcher::Event::Delete(pv) => (pv.name_any(), None),
            watcher::Event::Init | watcher::Event::InitDone => (String::new(), None),
        };
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        match event {
            watcher::Event::Init => state.relisting = Some(Vec::new()),
            watcher::Event::InitApply(_) => {
                if let (Some(list), Some(v)) = (state.relisting.as_mut(), ours) {
                    list.push(v);
                }
            }
            watcher::Event::InitDone => {
                if let Some(mut list) = state.relisting.take() {
                    list.sort();
                    list.dedup_by(|a, b| a.pv == b.pv);
                    state.volumes = Arc::new(list);
                }
            }
            watcher::Event::Apply(_) => {
                // The list is copied (its pointers) only when it changes
                // while a cycle holds it.
                match (position(&state.volumes, &name), ours) {
                    (Ok(i), Some(v)) if state.volumes[i] != v => {
                        Arc::make_mut(&mut state.volumes)[i] = v;
                    }
                    (Ok(_), Some(_)) | (Err(_), None) => {}
                    (Ok(i), None) => drop(Arc::make_mut(&mut state.volumes).remove(i)),
                    (Err(i), Some(v)) => Arc::make_mut(&mut state.volumes).insert(i, v),
                }
            }
            watcher::Event::Delete(_) => {
                if let Ok(i) = position(&state.volumes, &name) {
                    Arc::make_mut(&mut state.volumes).remove(i);
                }
            }
        }
    }

    /// The PV as this driver's volume; `None` for another driver's.
    fn monitored(&self, pv: &SlimPv) -> Option<MonitoredVolume> {
        let csi = pv.spec.csi.as_ref().filter(|c| c.driver == self.driver)?;
        let claim = pv
            .spec
            .claim_ref
            .as_ref()
            .filter(|c| c.name.is_some() && c.namespace.is_some())
            .map(|c| {
                Arc::new(ObjectRef {
                    kind: ObjectKind::PersistentVolumeClaim,
                    namespace: c.namespace.clone().unwrap_or_default(),
                    name: c.name.clone().unwrap_or_default(),
                    uid: c.uid.clone().unwrap_or_default(),
                })
            });
        Some(MonitoredVolume {
            pv: pv.name_any().into(),
            handle: csi.volume_handle.as_str().into(),
            claim,
        })
    }
}

/// Where the PV named `name` is (or would be) in the sorted list.
pub fn position(volumes: &[MonitoredVolume], name: &str) -> Result<usize, usize> {
    volumes.binary_search_by(|v| (*v.pv).cmp(name))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pv(name: &str, driver: &str, claim: Option<&str>) -> SlimPv {
        let mut spec = json!({"csi": {"driver": driver, "volumeHandle": format!("h-{name}")}});
        if let Some(c) = claim {
            spec["claimRef"] = json!({"namespace": "shop", "name": c, "uid": format!("u-{c}")});
        }
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("a PV")
    }

    fn names(store: &PvStore) -> Vec<(String, Option<String>)> {
        store
            .volumes()
            .iter()
            .map(|v| (v.pv.to_string(), v.claim.as_ref().map(|c| c.name.clone())))
            .collect()
    }

    #[test]
    fn keeps_this_drivers_pvs_sorted_through_list_apply_and_delete() {
        let store = PvStore::new("a.csi");
        store.apply(watcher::Event::Init);
        for p in [
            pv("pv-c", "a.csi", None),
            pv("pv-x", "other.csi", None),
            pv("pv-a", "a.csi", Some("data")),
        ] {
            store.apply(watcher::Event::InitApply(p));
        }
        assert!(store.volumes().is_empty(), "nothing before the list is in");
        store.apply(watcher::Event::InitDone);
        assert_eq!(
            names(&store),
            [("pv-a".into(), Some("data".into())), ("pv-c".into(), None)]
        );
        let held = store.volumes();
        // Bound, added, moved to another driver, deleted.
        store.apply(watcher::Event::Apply(pv("pv-c", "a.csi", Some("logs"))));
        store.apply(watcher::Event::Apply(pv("pv-b", "a.csi", None)));
        store.apply(watcher::Event::Apply(pv("pv-a", "other.csi", Some("data"))));
        store.apply(watcher::Event::Apply(pv("pv-y", "other.csi", None)));
        assert_eq!(
            names(&store),
            [("pv-b".into(), None), ("pv-c".into(), Some("logs".into()))]
        );
        store.apply(watcher::Event::Delete(pv("pv-b", "a.csi", None)));
        assert_eq!(names(&store), [("pv-c".into(), Some("logs".into()))]);
        // What a cycle held is what it started with.
        assert_eq!(held.len(), 2);
        assert_eq!(&*held[0].pv, "pv-a");
        // An unchanged PV shares the list: no copy.
        let before = store.volumes();
        store.apply(watcher::Event::Apply(pv("pv-c", "a.csi", Some("logs"))));
        assert!(Arc::ptr_eq(&before, &store.volumes()));
        // A relist replaces the whole: a PV deleted meanwhile goes.
        store.apply(watcher::Event::Init);
        store.apply(watcher::Event::InitApply(pv("pv-d", "a.csi", None)));
        assert_eq!(names(&store), [("pv-c".into(), Some("logs".into()))]);
        store.apply(watcher::Event::InitDone);
        assert_eq!(names(&store), [("pv-d".into(), None)]);
    }
}
