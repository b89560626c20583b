//! This node's pods, in a kube-rs reflector, and the PVs their volumes use,
//! read one by one ([`super::pvs`]); and the mapping of each kubelet volume
//! directory to the objects its Events go on.
//!
//! kubelet names a pod's volume directory by PV name (or, for inline CSI
//! volumes, by the pod's volume name); the PV's `spec.claimRef` names the
//! PVC with its uid, and the pod's `spec.volumes` say which of its volumes
//! uses that claim. Nothing here grows with the cluster: the reflector
//! holds this node's pods (`spec.nodeName=<node>`, listed from the API
//! server's watch cache, as the kubelet lists them), slimmed to the fields
//! used here, and the PV lookups only the PVs those pods use.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use health_kube::events::{ObjectKind, ObjectRef, Targets};
use health_kube::pv::SlimPv;
use health_kube::reflect::drive;
use k8s_openapi::api::core::v1::{ContainerStatus, Pod, PodStatus};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt as _};
use kube::{Api, Client, ResourceExt as _};
use tokio::sync::Notify;

use super::pvs::{Lookup, PvLookups};
use crate::volumes::kubelet::{KubeletVolume, VolumeKind};
use crate::volumes::waiters::PodNames;

/// Read access to the pod store and the PV lookups.
#[derive(Clone)]
pub struct ClusterView {
    pods: Store<Pod>,
    pvs: PvLookups,
    /// Notified on every change the store applies and every PV answer.
    changed: Arc<Notify>,
    /// The pod store has completed a list.
    pods_ready: Arc<AtomicBool>,
}

impl ClusterView {
    /// Starts the pod reflector and the PV fetcher as background tasks; they
    /// retry with backoff while the API server is away, and the store is
    /// empty (not ready) until its first list completes.
    pub fn start(client: Client, node: &str) -> (ClusterView, Vec<tokio::task::JoinHandle<()>>) {
        let changed = Arc::new(Notify::new());
        let (pods, pod_writer) = reflector::store::<Pod>();
        // `resourceVersion=0`: the watch cache answers, indexed by node
        // name, instead of etcd decoding every pod of the cluster. It
        // answers in one page (kube sends no `resourceVersion=0` with a
        // `limit`, which the cache would ignore): one node's pods.
        let mut pod_config = watcher::Config::default()
            .fields(&format!("spec.nodeName={node}"))
            .any_semantic();
        pod_config.page_size = None;
        let pod_stream = watcher(Api::<Pod>::all(client.clone()), pod_config)
            .default_backoff()
            .modify(slim_pod)
            .reflect(pod_writer);
        let pods_ready = Arc::new(AtomicBool::new(false));
        let (pvs, fetcher) = PvLookups::start(client, Arc::clone(&changed));
        let tasks = vec![
            tokio::spawn(drive(
                pod_stream,
                "pods",
                Some(Arc::clone(&changed)),
                Arc::clone(&pods_ready),
            )),
            fetcher,
        ];
        let view = ClusterView {
            pods,
            pvs,
            changed,
            pods_ready,
        };
        (view, tasks)
    }

    /// The pod store has completed its first list.
    pub fn is_ready(&self) -> bool {
        self.pods_ready.load(Ordering::Acquire)
    }

    /// Some volume's PV is being read: until it is, what the volumes here
    /// use is not known in full.
    pub fn resolving(&self) -> bool {
        self.pvs.any_pending()
    }

    /// Stops reading PVs that none of `volumes` names.
    pub fn forget_pvs_except<'a>(&self, volumes: impl Iterator<Item = &'a KubeletVolume>) {
        let wanted = volumes.filter_map(|v| v.pv.as_deref()).collect();
        self.pvs.forget_unwanted(&wanted);
    }

    /// Resolves when the store changed or a PV answer came since the last
    /// call.
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

    /// Where a kubelet volume's Events go; `None` while its pod is unknown
    /// or its PV is being read (the view wakes when it is).
    /// The PV's `spec.storageClassName`, where its GET has answered.
    pub fn storage_class(&self, pv: &str) -> Option<String> {
        match self.pvs.lookup(pv) {
            Lookup::Known(Some(pv)) => pv.spec.storage_class_name.clone(),
            _ => None,
        }
    }

    pub fn targets(&self, v: &KubeletVolume) -> Option<Targets> {
        let pod = self
            .pods
            .state()
            .into_iter()
            .find(|p| p.metadata.uid.as_deref() == Some(v.pod_uid.as_str()))?;
        let pv = match v.pv.as_deref().map(|name| self.pvs.lookup(name)) {
            None => None,
            Some(Lookup::Known(pv)) => pv,
            Some(Lookup::Pending) => return None,
        };
        Some(resolve(&pod, pv.as_deref(), v))
    }
}

/// Keeps what [`resolve`] reads of a pod: identity and `spec.volumes`.
fn slim_pod(pod: &mut Pod) {
    pod.managed_fields_mut().clear();
    pod.annotations_mut().clear();
    // Of the status, only each container's name and runtime id: a stalled
    // bio's cgroup names the container by that id (`volumes::waiters`).
    let slim = |statuses: Option<Vec<ContainerStatus>>| {
        statuses.map(|all| {
            all.into_iter()
                .map(|c| ContainerStatus {
                    name: c.name,
                    container_id: c.container_id,
                    ..ContainerStatus::default()
                })
                .collect::<Vec<_>>()
        })
    };
    pod.status = pod.status.take().map(|s| PodStatus {
        container_statuses: slim(s.container_statuses),
        init_container_statuses: slim(s.init_container_statuses),
        ..PodStatus::default()
    });
    if let Some(spec) = pod.spec.as_mut() {
        spec.containers.clear();
        spec.init_containers = None;
        spec.ephemeral_containers = None;
        spec.affinity = None;
        spec.tolerations = None;
    }
}

impl PodNames for ClusterView {
    /// This node's pod with `uid` as `namespace/name`, and the name of its
    /// container whose runtime id (`containerd://<id>`) is `container_id`.
    fn pod_name(&self, uid: &str, container_id: Option<&str>) -> Option<(String, Option<String>)> {
        let pods = self.pods.state();
        let pod = pods
            .iter()
            .find(|p| p.metadata.uid.as_deref() == Some(uid))?;
        let container = container_id.and_then(|id| {
            let status = pod.status.as_ref()?;
            let all = status.container_statuses.iter().flatten();
            all.chain(status.init_container_statuses.iter().flatten())
                .find(|c| {
                    c.container_id
                        .as_deref()
                        .and_then(|cid| cid.split_once("://"))
                        .is_some_and(|(_, cid)| cid == id)
                })
                .map(|c| c.name.clone())
        });
        Some((
            format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any()),
            container,
        ))
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
    //! The exact requests (kube's mock API service, tower-test): this
    //! node's pods listed then watched, each PV read once when a volume
    //! needs it, and the objects a kubelet volume's Events go on.

    use health_kube::testing::{client, next, respond, ApiRequest};
    use http::Method;
    use serde_json::{json, Value};

    use super::*;
    use crate::volumes::kubelet::VolumeMode;

    const CONTAINER_ID: &str = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";

    fn pod_list() -> Value {
        json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
        "items": [{
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "uid-web-0",
                         "resourceVersion": "9", "managedFields": [{"manager": "kubectl"}]},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "busybox"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]},
            "status": {"phase": "Running", "containerStatuses": [{
                "name": "c", "containerID": format!("containerd://{CONTAINER_ID}"),
                "image": "busybox", "imageID": "sha256:1", "ready": true, "restartCount": 0}]}
        }]})
    }

    fn pv() -> Value {
        json!({"apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": "pv-1", "resourceVersion": "8", "annotations": {"a": "b"}},
            "spec": {"claimRef": {"namespace": "shop", "name": "data", "uid": "uid-pvc"},
                     "csi": {"driver": "test.csi", "volumeHandle": "h-1"}}
        })
    }

    /// Waits for the view's wake-ups until no PV is being read.
    async fn answered(view: &ClusterView) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while view.resolving() {
            tokio::time::timeout_at(deadline, view.changed())
                .await
                .expect("the answer wakes the view");
        }
    }

    #[tokio::test]
    async fn this_nodes_pods_are_watched_and_each_pv_read_once() {
        let (client, mut handle) = client();
        let (view, tasks) = ClusterView::start(client, "node-1");
        // This node's pods, from the watch cache, then watched.
        let (ApiRequest { method, uri, .. }, send) = next(&mut handle).await;
        assert_eq!(method, Method::GET);
        assert_eq!(
            uri,
            "/api/v1/pods?&fieldSelector=spec.nodeName%3Dnode-1&resourceVersion=0&resourceVersionMatch=NotOlderThan"
        );
        respond(send, 200, &pod_list());
        let (ApiRequest { uri, .. }, watch) = next(&mut handle).await;
        assert_eq!(
            uri,
            "/api/v1/pods?&watch=true&timeoutSeconds=290&fieldSelector=spec.nodeName%3Dnode-1&allowWatchBookmarks=true&resourceVersion=10"
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
        // The PV is not known yet: asked for, and the volume waits.
        assert_eq!(view.targets(&v), None);
        assert!(view.resolving());
        let (ApiRequest { method, uri, .. }, send) = next(&mut handle).await;
        assert_eq!(
            (method, uri.as_str()),
            (Method::GET, "/api/v1/persistentvolumes/pv-1")
        );
        respond(send, 200, &pv());
        answered(&view).await;
        let t = view.targets(&v).expect("the pod and the PV are known");
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
        // A stalled bio's cgroup named: the pod by uid, the container by
        // its runtime id, kept through the slimming of the status.
        assert_eq!(
            view.pod_name("uid-web-0", Some(CONTAINER_ID)),
            Some(("shop/web-0".to_string(), Some("c".to_string())))
        );
        assert_eq!(
            view.pod_name("uid-web-0", Some(&CONTAINER_ID[1..])),
            Some(("shop/web-0".to_string(), None))
        );
        assert_eq!(view.pod_name("uid-other", None), None);
        let kept = view.pods.state()[0]
            .status
            .clone()
            .expect("the slim status");
        assert_eq!(kept.phase, None);
        assert_eq!(kept.container_statuses.unwrap()[0].image, "");
        // An unknown pod is not guessed at.
        let other = KubeletVolume {
            pod_uid: "uid-other".into(),
            ..v.clone()
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
        // A PV the server does not have: the volume reports to its pod only.
        let orphan = KubeletVolume {
            pv: Some("pv-gone".into()),
            ..v.clone()
        };
        assert_eq!(view.targets(&orphan), None);
        let (ApiRequest { uri, .. }, send) = next(&mut handle).await;
        assert_eq!(uri, "/api/v1/persistentvolumes/pv-gone");
        respond(
            send,
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404,
                    "message": "persistentvolumes \"pv-gone\" not found"}),
        );
        answered(&view).await;
        let t = view.targets(&orphan).expect("the pod is known");
        assert_eq!((t.pvc, t.pod_volume.as_str()), (None, "pv-1"));
        // Each PV was read once: the answers are kept.
        assert!(view.targets(&v).is_some());
        assert!(view.targets(&orphan).is_some());
        drop(watch);
        for task in tasks {
            task.abort();
        }
    }
}
