//! What the controller monitors, from two watches: this driver's PVs
//! (volume handle -> PV name, `spec.claimRef` -> the PVC with its uid;
//! [`PvStore`]) and the Nodes (their Ready condition and unreachable taint,
//! in a reflector).
//!
//! No PVC watch (a PV's claimRef names its claim) and no Pod watch: pods are
//! listed for one node only when that node goes down (see `nodes`), so the
//! controller's API load does not grow with the number of pods.
//!
//! PVs are decoded into [`SlimPv`] (shared with the node agent), not
//! k8s-openapi's `PersistentVolume` (3.5 KB before its strings, an inline
//! field per volume source), and only this driver's are kept, as
//! [`MonitoredVolume`]s.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use futures_util::TryStreamExt as _;
pub use health_kube::pv::{PvClaimRef, PvCsi, PvSpec, SlimPv};
use health_kube::reflect::drive;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::core::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, ResourceExt as _};

pub use crate::pv_store::{MonitoredVolume, PvStore};

/// The taint the node lifecycle controller puts on a node whose kubelet
/// stopped reporting.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// Whether a node can run its pods, as its Ready condition and taints say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    Ready,
    /// Ready=False: the kubelet reports the node is not ready.
    NotReady,
    /// Ready=Unknown or the unreachable taint: the kubelet stopped
    /// reporting.
    Unreachable,
}

/// One node as the node-down check needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    pub name: String,
    pub readiness: Readiness,
    /// When it entered that state (the Ready condition's
    /// lastTransitionTime, or the taint's timeAdded), where known.
    pub since: Option<SystemTime>,
    /// The Ready condition's reason (`KubeletNotReady`,
    /// `NodeStatusUnknown`), where given.
    pub reason: Option<String>,
}

/// Read access to the two stores.
#[derive(Clone)]
pub struct Inventory {
    pvs: Arc<PvStore>,
    nodes: Store<Node>,
    pvs_ready: Arc<AtomicBool>,
    nodes_ready: Arc<AtomicBool>,
}

impl Inventory {
    /// Starts both watches as background tasks; they retry with backoff
    /// while the API server is away.
    pub fn start(client: Client, driver: &str) -> (Inventory, Vec<tokio::task::JoinHandle<()>>) {
        let pv_resource = ApiResource::erase::<PersistentVolume>(&());
        let pvs = Arc::new(PvStore::new(driver));
        let (nodes, node_writer) = reflector::store::<Node>();
        // PVs cannot be selected by CSI driver on the server: all are
        // watched, and those of other drivers are dropped as they come.
        let store = Arc::clone(&pvs);
        let pv_stream = watcher(
            Api::<SlimPv>::all_with(client.clone(), &pv_resource),
            watcher::Config::default(),
        )
        .default_backoff()
        .map_ok(move |event| {
            let seen = event_kind(&event);
            store.apply(event);
            seen
        });
        let node_stream = watcher(Api::<Node>::all(client), watcher::Config::default())
            .default_backoff()
            .modify(slim_node)
            .reflect(node_writer);
        let pvs_ready = Arc::new(AtomicBool::new(false));
        let nodes_ready = Arc::new(AtomicBool::new(false));
        let tasks = vec![
            tokio::spawn(drive(
                pv_stream,
                "persistentvolumes",
                None,
                Arc::clone(&pvs_ready),
            )),
            tokio::spawn(drive(node_stream, "nodes", None, Arc::clone(&nodes_ready))),
        ];
        let inventory = Inventory {
            pvs,
            nodes,
            pvs_ready,
            nodes_ready,
        };
        (inventory, tasks)
    }

    /// Both stores have completed their first list.
    pub fn is_ready(&self) -> bool {
        self.pvs_ready.load(Ordering::Acquire) && self.nodes_ready.load(Ordering::Acquire)
    }

    /// This driver's PVs, sorted by name (shared, not copied).
    pub fn volumes(&self) -> Arc<Vec<MonitoredVolume>> {
        self.pvs.volumes()
    }

    pub fn nodes(&self) -> Vec<NodeState> {
        self.nodes
            .state()
            .iter()
            .filter_map(|n| node_state(n))
            .collect()
    }
}

/// The event without its object, once the store has it.
fn event_kind(event: &watcher::Event<SlimPv>) -> watcher::Event<()> {
    match event {
        watcher::Event::Apply(_) => watcher::Event::Apply(()),
        watcher::Event::Delete(_) => watcher::Event::Delete(()),
        watcher::Event::Init => watcher::Event::Init,
        watcher::Event::InitApply(_) => watcher::Event::InitApply(()),
        watcher::Event::InitDone => watcher::Event::InitDone,
    }
}

/// Keeps a node's name, Ready condition and taints.
fn slim_node(node: &mut Node) {
    node.managed_fields_mut().clear();
    node.annotations_mut().clear();
    node.labels_mut().clear();
    node.spec = node
        .spec
        .take()
        .map(|s| k8s_openapi::api::core::v1::NodeSpec {
            taints: s.taints,
            ..Default::default()
        });
    node.status = node
        .status
        .take()
        .map(|s| k8s_openapi::api::core::v1::NodeStatus {
            conditions: s.conditions.map(|c| {
                c.into_iter()
                    .filter(|c| c.type_ == "Ready")
                    .collect::<Vec<_>>()
            }),
            ..Default::default()
        });
}

/// A node's readiness; `None` for a node without a Ready condition yet
/// (just registered: no evidence either way).
pub fn node_state(node: &Node) -> Option<NodeState> {
    let name = node.name_any();
    let taint = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .and_then(|t| t.iter().find(|t| t.key == UNREACHABLE_TAINT));
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    let since = ready
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| SystemTime::from(t.0));
    let reason = ready.and_then(|c| c.reason.clone());
    let readiness = match (ready.map(|c| c.status.as_str()), taint) {
        (Some("Unknown"), _) => Readiness::Unreachable,
        (_, Some(_)) => Readiness::Unreachable,
        (Some("False"), None) => Readiness::NotReady,
        (Some(_), None) => Readiness::Ready,
        (None, None) => return None,
    };
    let since = match (readiness, taint) {
        // A Ready node with the taint: the taint says when it was seen
        // unreachable.
        (Readiness::Unreachable, Some(t)) if ready.is_some_and(|c| c.status == "True") => t
            .time_added
            .as_ref()
            .map(|t| SystemTime::from(t.0))
            .or(since),
        _ => since,
    };
    Some(NodeState {
        name,
        readiness,
        since,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_full_pv_decodes_into_the_slim_one_and_only_this_drivers_are_kept() {
        // As the API server sends it: every field the controller ignores
        // must decode (and be dropped) without error.
        let full = |name: &str, driver: &str| {
            json!({"apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": name, "uid": "u", "resourceVersion": "7",
                             "labels": {"a": "b"}, "annotations": {"pv.kubernetes.io/provisioned-by": driver},
                             "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}]},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
                         "volumeMode": "Filesystem", "mountOptions": ["noatime"],
                         "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "zone", "operator": "In", "values": ["a"]}]}]}},
                         "csi": {"driver": driver, "volumeHandle": format!("h-{name}"), "fsType": "ext4",
                                 "volumeAttributes": {"k": "v"}},
                         "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                      "namespace": "shop", "name": "data", "uid": "u-1",
                                      "resourceVersion": "5"}},
                "status": {"phase": "Bound", "lastPhaseTransitionTime": "2027-01-15T08:00:00Z"}})
        };
        let nfs =
            json!({"metadata": {"name": "pv-nfs"}, "spec": {"nfs": {"server": "s", "path": "/"}}});
        let store = PvStore::new("a.csi");
        store.apply(watcher::Event::Init);
        for value in [full("pv-2", "b.csi"), full("pv-1", "a.csi"), nfs] {
            let pv: SlimPv = serde_json::from_value(value).expect("a PV");
            store.apply(watcher::Event::InitApply(pv));
        }
        store.apply(watcher::Event::InitDone);
        assert_eq!(
            *store.volumes(),
            [MonitoredVolume {
                pv: "pv-1".into(),
                handle: "h-pv-1".into(),
                claim: Some(Arc::new(health_kube::events::ObjectRef {
                    kind: health_kube::events::ObjectKind::PersistentVolumeClaim,
                    namespace: "shop".into(),
                    name: "data".into(),
                    uid: "u-1".into()
                }))
            }]
        );
    }

    fn node(value: serde_json::Value) -> Node {
        serde_json::from_value(value).expect("a node")
    }

    #[test]
    fn readiness_from_the_ready_condition_and_the_unreachable_taint() {
        let ready = |status: &str| {
            json!({"type": "Ready", "status": status, "reason": "KubeletNotReady",
                   "lastTransitionTime": "2027-01-15T08:00:00Z"})
        };
        let cases = [
            (
                json!({"metadata": {"name": "n"}, "status": {"conditions": [ready("True")]}}),
                Some(Readiness::Ready),
            ),
            (
                json!({"metadata": {"name": "n"}, "status": {"conditions": [ready("False")]}}),
                Some(Readiness::NotReady),
            ),
            (
                json!({"metadata": {"name": "n"}, "status": {"conditions": [ready("Unknown")]}}),
                Some(Readiness::Unreachable),
            ),
            (
                json!({"metadata": {"name": "n"},
                       "spec": {"taints": [{"key": UNREACHABLE_TAINT, "effect": "NoExecute",
                                            "timeAdded": "2027-01-15T08:05:00Z"}]},
                       "status": {"conditions": [ready("True")]}}),
                Some(Readiness::Unreachable),
            ),
            (json!({"metadata": {"name": "n"}}), None),
        ];
        for (value, want) in cases {
            let state = node_state(&node(value.clone()));
            assert_eq!(state.as_ref().map(|s| s.readiness), want, "{value}");
        }
        let tainted = node_state(&node(cases_taint())).expect("a state");
        assert_eq!(
            tainted.since,
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_300))
        );
    }

    fn cases_taint() -> serde_json::Value {
        json!({"metadata": {"name": "n"},
               "spec": {"taints": [{"key": UNREACHABLE_TAINT, "effect": "NoExecute",
                                    "timeAdded": "2027-01-15T08:05:00Z"}]},
               "status": {"conditions": [{"type": "Ready", "status": "True",
                                          "lastTransitionTime": "2027-01-15T08:00:00Z"}]}})
    }
}
