//! What the controller monitors, from two reflectors: this driver's PVs
//! (volume handle -> PV name, `spec.claimRef` -> the PVC with its uid) and
//! the Nodes (their Ready condition and unreachable taint).
//!
//! No PVC watch (a PV's claimRef names its claim) and no Pod watch: pods are
//! listed for one node only when that node goes down (see `nodes`), so the
//! controller's API load does not grow with the number of pods.
//!
//! PVs are decoded into [`SlimPv`] (shared with the node agent), not k8s-openapi's `PersistentVolume`:
//! every PV of the cluster is held, and the full type is 3.5 KB before its
//! strings (an inline field per volume source), which made 10,000 PVs
//! ~50 MB of the controller's memory (docs/benchmarks.md, "Controller").

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use health_kube::events::{ObjectKind, ObjectRef};
pub use health_kube::pv::{PvClaimRef, PvCsi, PvSpec, SlimPv};
use health_kube::reflect::drive;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::core::ApiResource;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, ResourceExt as _};

/// The taint the node lifecycle controller puts on a node whose kubelet
/// stopped reporting.
pub const UNREACHABLE_TAINT: &str = "node.kubernetes.io/unreachable";

/// One PV of this driver.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct MonitoredVolume {
    pub pv: String,
    /// `spec.csi.volumeHandle`: the id the CSI driver knows the volume by.
    pub handle: String,
    /// The PVC bound to it (`None` while the PV is Available or Released
    /// without a claim reference).
    pub claim: Option<ObjectRef>,
}

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
    driver: String,
    pvs: Store<SlimPv>,
    nodes: Store<Node>,
    pvs_ready: Arc<AtomicBool>,
    nodes_ready: Arc<AtomicBool>,
}

impl Inventory {
    /// Starts both reflectors as background tasks; they retry with backoff
    /// while the API server is away.
    pub fn start(client: Client, driver: &str) -> (Inventory, Vec<tokio::task::JoinHandle<()>>) {
        let pv_resource = ApiResource::erase::<PersistentVolume>(&());
        let pv_writer = reflector::store::Writer::<SlimPv>::new(pv_resource.clone());
        let pvs = pv_writer.as_reader();
        let (nodes, node_writer) = reflector::store::<Node>();
        let keep = driver.to_string();
        // PVs cannot be selected by CSI driver on the server: all are
        // watched, and those of other drivers are kept as bare names.
        let pv_stream = watcher(
            Api::<SlimPv>::all_with(client.clone(), &pv_resource),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(move |pv| slim_pv(pv, &keep))
        .reflect(pv_writer);
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
            driver: driver.to_string(),
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

    /// This driver's PVs, by name.
    pub fn volumes(&self) -> Vec<MonitoredVolume> {
        monitored(&self.pvs.state(), &self.driver)
    }

    pub fn nodes(&self) -> Vec<NodeState> {
        self.nodes
            .state()
            .iter()
            .filter_map(|n| node_state(n))
            .collect()
    }
}

/// Keeps a PV's name, claim reference and CSI source; a PV of another
/// driver keeps only its name.
fn slim_pv(pv: &mut SlimPv, driver: &str) {
    health_kube::pv::slim(pv);
    let ours = pv.spec.csi.as_ref().is_some_and(|csi| csi.driver == driver);
    if !ours {
        pv.spec = PvSpec::default();
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

/// The PVs of `driver` among `pvs`, by name.
pub fn monitored(pvs: &[Arc<SlimPv>], driver: &str) -> Vec<MonitoredVolume> {
    let mut out: Vec<MonitoredVolume> = pvs
        .iter()
        .filter_map(|pv| {
            let spec = &pv.spec;
            let csi = spec.csi.as_ref().filter(|c| c.driver == driver)?;
            let claim = spec
                .claim_ref
                .as_ref()
                .filter(|c| c.name.is_some() && c.namespace.is_some())
                .map(|c| ObjectRef {
                    kind: ObjectKind::PersistentVolumeClaim,
                    namespace: c.namespace.clone().unwrap_or_default(),
                    name: c.name.clone().unwrap_or_default(),
                    uid: c.uid.clone().unwrap_or_default(),
                });
            Some(MonitoredVolume {
                pv: pv.name_any(),
                handle: csi.volume_handle.clone(),
                claim,
            })
        })
        .collect();
    out.sort();
    out
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

    fn pv(value: serde_json::Value) -> Arc<SlimPv> {
        Arc::new(serde_json::from_value(value).expect("a PV"))
    }

    #[test]
    fn only_this_drivers_pvs_with_their_claims() {
        let pvs = [
            pv(json!({"metadata": {"name": "pv-b"},
                "spec": {"csi": {"driver": "a.csi", "volumeHandle": "h-b"},
                         "claimRef": {"namespace": "shop", "name": "data", "uid": "u-1"}}})),
            pv(json!({"metadata": {"name": "pv-a"},
                "spec": {"csi": {"driver": "a.csi", "volumeHandle": "h-a"}}})),
            pv(json!({"metadata": {"name": "pv-other"},
                "spec": {"csi": {"driver": "other.csi", "volumeHandle": "h-o"}}})),
            pv(json!({"metadata": {"name": "pv-nfs"},
                "spec": {"nfs": {"server": "s", "path": "/"}}})),
        ];
        assert_eq!(
            monitored(&pvs, "a.csi"),
            [
                MonitoredVolume {
                    pv: "pv-a".into(),
                    handle: "h-a".into(),
                    claim: None
                },
                MonitoredVolume {
                    pv: "pv-b".into(),
                    handle: "h-b".into(),
                    claim: Some(ObjectRef {
                        kind: ObjectKind::PersistentVolumeClaim,
                        namespace: "shop".into(),
                        name: "data".into(),
                        uid: "u-1".into()
                    })
                },
            ]
        );
    }

    #[test]
    fn a_full_pv_decodes_into_the_slim_one_and_other_drivers_keep_only_a_name() {
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
        let mut ours: SlimPv = serde_json::from_value(full("pv-1", "a.csi")).expect("a PV");
        let mut other: SlimPv = serde_json::from_value(full("pv-2", "b.csi")).expect("a PV");
        slim_pv(&mut ours, "a.csi");
        slim_pv(&mut other, "a.csi");
        assert!(ours
            .metadata
            .managed_fields
            .as_ref()
            .is_none_or(Vec::is_empty));
        assert!(ours
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| a.is_empty()));
        assert!(ours.status.is_none());
        assert!(other.spec.csi.is_none() && other.spec.claim_ref.is_none());
        assert_eq!(
            monitored(&[Arc::new(ours), Arc::new(other)], "a.csi"),
            [MonitoredVolume {
                pv: "pv-1".into(),
                handle: "h-pv-1".into(),
                claim: Some(ObjectRef {
                    kind: ObjectKind::PersistentVolumeClaim,
                    namespace: "shop".into(),
                    name: "data".into(),
                    uid: "u-1".into()
                })
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
