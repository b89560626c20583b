//! This node's pods and the PVs, as kube-rs reflectors, and the mapping of
//! each kubelet volume directory to the objects its Events go on.
//!
//! kubelet names a pod's volume directory by PV name (or, for inline CSI
//! volumes, by the pod's volume name); the PV's `spec.claimRef` names the
//! PVC with its uid, and the pod's `spec.volumes` say which of its volumes
//! uses that claim. So two reflectors suffice: pods with
//! `spec.nodeName=<this node>` and all PVs. Both keep only the fields used
//! here, to bound memory on large clusters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use health_kube::events::{ObjectKind, ObjectRef, Targets};
use health_kube::pv::SlimPv;
use health_kube::reflect::drive;
use health_kube::writer::Observer;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::core::ApiResource;
use kube::runtime::reflector::{self, ObjectRef as StoreRef, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, ResourceExt as _};
use tokio::sync::Notify;

use crate::volumes::kubelet::{KubeletVolume, VolumeKind};

/// Read access to the two reflector stores.
#[derive(Clone)]
pub struct ClusterView {
    pods: Store<Pod>,
    pvs: Store<SlimPv>,
    /// What the PV store's keys are typed by (`SlimPv` is a dynamic object).
    pv_resource: ApiResource,
    /// Notified on every change either store applies.
    changed: Arc<Notify>,
    /// Each store has completed a list.
    pods_ready: Arc<AtomicBool>,
    pvs_ready: Arc<AtomicBool>,
}

impl ClusterView {
    /// Starts the reflectors as background tasks; they retry with backoff
    /// while the API server is away, and the stores are empty (not ready)
    /// until their first list completes.
    pub fn start(
        client: Client,
        node: &str,
        observer: Option<Arc<dyn Observer>>,
    ) -> (ClusterView, Vec<tokio::task::JoinHandle<()>>) {
        let changed = Arc::new(Notify::new());
        let (pods, pod_writer) = reflector::store::<Pod>();
        // PVs decode into the slim type: the agent holds every PV of the
        // cluster and reads only the claim reference.
        let pv_resource = ApiResource::erase::<PersistentVolume>(&());
        let pv_writer = reflector::store::Writer::<SlimPv>::new(pv_resource.clone());
        let pvs = pv_writer.as_reader();
        let pod_config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let pod_stream = watcher(Api::<Pod>::all(client.clone()), pod_config)
            .default_backoff()
            .modify(slim_pod)
            .reflect(pod_writer);
        let pv_stream = watcher(
            Api::<SlimPv>::all_with(client, &pv_resource),
            watcher::Config::default(),
        )
        .default_backoff()
        .modify(health_kube::pv::slim)
        .reflect(pv_writer);
        let pods_ready = Arc::new(AtomicBool::new(false));
        let pvs_ready = Arc::new(AtomicBool::new(false));
        let tasks = vec![
            tokio::spawn(drive(
                pod_stream,
                "pods",
                Some(Arc::clone(&changed)),
                Arc::clone(&pods_ready),
                observer.clone(),
            )),
            tokio::spawn(drive(
                pv_stream,
                "persistentvolumes",
                Some(Arc::clone(&changed)),
                Arc::clone(&pvs_ready),
                observer,
            )),
        ];
        let view = ClusterView {
            pods,
            pvs,
            pv_resource,
            changed,
            pods_ready,
            pvs_ready,
        };
        (view, tasks)
    }

    /// Both stores have completed their first list.
    pub fn is_ready(&self) -> bool {
        self.pods_ready.load(Ordering::Acquire) && self.pvs_ready.load(Ordering::Acquire)
    }

    /// Resolves when either store changed since the last call.
    pub async fn changed(&self) {
        self.changed.notified().await
    }

    /// Whether `object` is one the agent reports on now: a pod of this node,
    /// or a PVC one of them uses.
    pub fn reports_on(&self, object: &ObjectRef) -> bool {
        let pods = self.pods.state();
        match object.kind {
            ObjectKind::Pod => pods.iter().any(|p| {
                p.metadata.uid.as_deref() == Some(object.uid.as_str())
                    || (object.uid.is_empty()
                        && p.namespace().as_deref() == Some(object.namespace.as_str())
                        && p.name_any() == object.name)
            }),
            ObjectKind::PersistentVolumeClaim => pods
                .iter()
                .filter(|p| p.namespace().as_deref() == Some(object.namespace.as_str()))
                .any(|p| {
                    let vols = p.spec.as_ref().and_then(|s| s.volumes.as_ref());
                    vols.is_some_and(|vols| {
                        vols.iter().any(|v| {
                            v.persistent_volume_claim
                                .as_ref()
                                .is_some_and(|c| c.claim_name == object.name)
                                || (v.ephemeral.is_some()
                                    && object.name == format!("{}-{}", p.name_any(), v.name))
                        })
                    })
                }),
        }
    }

    /// Where a kubelet volume's Events go; `None` while its pod is unknown.
    pub fn targets(&self, v: &KubeletVolume) -> Option<Targets> {
        let pod = self
            .pods
            .state()
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(v.pod_uid.as_str()))?;
        let pv = v.pv.as_deref().and_then(|name| {
            self.pvs
                .get(&StoreRef::new_with(name, self.pv_resource.clone()))
        });
        Some(resolve(&pod, pv.as_deref(), v))
    }
}

/// Keeps what [`resolve`] reads of a pod: identity and `spec.volumes`.
fn slim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.annotations_mut().clear();
    pod.status = None;
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.clear();
        spec.init_containers = None;
        spec.ephemeral_containers = None;
        spec.affinity = None;
        spec.tolerations = None;
    }
}

/// The objects a kubelet volume reports to: its pod, the pod's name for the
/// volume, and through the PV's claim reference the PVC.
pub fn resolve(pod: &Pod, pv: Option<&SlimPv>, v: &KubeletVolume) -> Targets {
    let pod_ref = ObjectRef {
        kind: ObjectKind::Pod,
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        uid: pod.metadata.uid.clone().unwrap_or_default(),
    };
    let claim = pv
        .and_then(|pv| pv.spec.claim_ref.as_ref())
        .filter(|c| c.name.is_some());
    let pvc = claim.map(|c| ObjectRef {
        kind: ObjectKind::PersistentVolumeClaim,
        namespace: c
            .namespace
            .clone()
            .unwrap_or_else(|| pod_ref.namespace.clone()),
        name: c.name.clone().unwrap_or_default(),
        uid: c.uid.clone().unwrap_or_default(),
    });
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let pod_volume = match (&pvc, v.kind) {
        // Inline CSI volumes: kubelet names the directory by the pod's volume.
        (_, VolumeKind::CsiEphemeral) | (None, _) => None,
        (Some(pvc), _) => volumes.and_then(|vols| {
            vols.iter().find_map(|vol| {
                let by_claim = vol
                    .persistent_volume_claim
                    .as_ref()
                    .is_some_and(|c| c.claim_name == pvc.name);
                // A generic ephemeral volume's PVC is `<pod>-<volume>`.
                let by_ephemeral =
                    vol.ephemeral.is_some() && pvc.name == format!("{}-{}", pod_ref.name, vol.name);
                (by_claim || by_ephemeral).then(|| vol.name.clone())
            })
        }),
    };
    Targets {
        pod_volume: pod_volume.unwrap_or_else(|| v.pod_volume_dir_name.clone()),
        pod: pod_ref,
        pvc,
        pv: v.pv.clone(),
    }
}

#[cfg(test)]
mod tests {
    //! The reflectors' exact requests (kube's mock API service, tower-test):
    //! this node's pods and all PVs, listed then watched, and the objects a
    //! kubelet volume's Events go on.

    use health_kube::testing::{client, next, respond, ApiRequest};
    use http::Method;
    use serde_json::{json, Value};

    use super::*;
    use crate::volumes::kubelet::VolumeMode;

    fn pod_list() -> Value {
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
        "items": [{
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "uid-web-0",
                         "resourceVersion": "9", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}
        }]})
    }

    fn pv_list() -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolumeList", "metadata": {"resourceVersion": "10"},
        "items": [{
            "metadata": {"name": "pv-1", "resourceVersion": "8"},
            "spec": {"claimRef": {"namespace": "shop", "name": "data", "uid": "uid-pvc"},
                     "csi": {"driver": "test.csi", "volumeHandle": "h-1"}}
        }]})
    }

    #[tokio::test]
    async fn reflectors_list_and_watch_this_node_and_map_volumes() {
        let (client, mut handle) = client();
        let (view, tasks) = ClusterView::start(client, "node-1", None);
        let mut seen = Vec::new();
        let mut held = Vec::new();
        // Two lists, then two watches (in either order across the two).
        for _ in 0..4 {
            let (ApiRequest { method, uri, .. }, send) = next(&mut handle).await;
            assert_eq!(method, Method::GET);
            if uri.contains("watch=true") {
                held.push(send); // the watch stays open, with nothing new
            } else if uri.starts_with("/api/v1/pods") {
                respond(send, 200, &pod_list());
            } else {
                respond(send, 200, &pv_list());
            }
            seen.push(uri);
        }
        seen.sort();
        assert_eq!(
            seen,
            [
                "/api/v1/persistentvolumes?&limit=500",
                "/api/v1/persistentvolumes?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true&resourceVersion=10",
                "/api/v1/pods?&fieldSelector=spec.nodeName%3Dnode-1&limit=500",
                "/api/v1/pods?&watch=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3Dnode-1&allowWatchBookmarks=true&resourceVersion=10",
            ]
        );
        assert!(view.is_ready());
        let v = KubeletVolume {
            pod_uid: "uid-web-0".into(),
            pv: Some("pv-1".into()),
            pod_volume_dir_name: "pv-1".into(),
            driver: Some("test.csi".into()),
            volume_handle: Some("h-1".into()),
            volume_mode: VolumeMode::Filesystem,
            kind: VolumeKind::Csi,
            path: "/var/lib/kubelet/pods/uid-web-0/volumes/kubernetes.io~csi/pv-1/mount".into(),
            staging_path: None,
            node_name: Some("node-1".into()),
        };
        let t = view.targets(&v).expect("the pod is known");
        assert_eq!(t.pod.kind, ObjectKind::Pod);
        assert_eq!(
            (
                t.pod.namespace.as_str(),
                t.pod.name.as_str(),
                t.pod.uid.as_str()
            ),
            ("shop", "web-0", "uid-web-0")
        );
        assert_eq!(t.pod_volume, "data");
        let pvc = t.pvc.expect("the claim");
        assert_eq!(
            (pvc.namespace.as_str(), pvc.name.as_str(), pvc.uid.as_str()),
            ("shop", "data", "uid-pvc")
        );
        assert_eq!(t.pv.as_deref(), Some("pv-1"));
        // An unknown pod is not guessed at.
        let other = KubeletVolume {
            pod_uid: "uid-other".into(),
            ..v
        };
        assert_eq!(view.targets(&other), None);
        // What Events continued from before a restart may stay about.
        let object = |kind, name: &str, uid: &str| ObjectRef {
            kind,
            namespace: "shop".into(),
            name: name.into(),
            uid: uid.into(),
        };
        assert!(view.reports_on(&object(ObjectKind::Pod, "web-0", "uid-web-0")));
        assert!(!view.reports_on(&object(ObjectKind::Pod, "web-0", "uid-of-a-deleted-web-0")));
        assert!(view.reports_on(&object(
            ObjectKind::PersistentVolumeClaim,
            "data",
            "uid-pvc"
        )));
        assert!(!view.reports_on(&object(
            ObjectKind::PersistentVolumeClaim,
            "logs",
            "uid-logs"
        )));
        drop(held);
        for task in tasks {
            task.abort();
        }
    }
}
