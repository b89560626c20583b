//! A cluster on the real kube-apiserver (`envtest`) as node-1's agent sees
//! it: deploy/ applied as it ships, a PVC shared by two pods on node-1 (and
//! one pod on node-2), and the reads that check what the agent wrote. Used
//! by `tests/host/cluster_real_api.rs` and the Event latency benchmark.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use health_kube::ApiAccess;
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::Client;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

use crate::bpffs::Bpffs;
use crate::envtest::{wait_granted, RealApiServer};
use crate::kubelet::http_get;
use crate::manifests::{apply_all, manifests, repo_root};
use crate::multi_thread_runtime;

/// The agent's namespace and ServiceAccount in deploy/.
pub const AGENT_NS: &str = "volume-health";
pub const AGENT_SA: &str = "volume-health";
pub const APP_NS: &str = "shop";
pub const PV: &str = "pv-real";
pub const DRIVER: &str = "disk.csi.volume-health.test";
/// `reportingComponent` of the agent's Events.
pub const COMPONENT: &str = "volume-health-agent";

/// The objects the agent reports on: both pods and their PVC.
pub const OBJECTS: [(&str, &str); 3] = [
    ("Pod", "web-0"),
    ("Pod", "web-1"),
    ("PersistentVolumeClaim", "data"),
];

/// The server with deploy/ applied, and the admin's view of it.
pub struct Cluster {
    pub server: RealApiServer,
    pub admin: Client,
    rt: Runtime,
}

impl Cluster {
    pub fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// deploy/ applied as it ships (namespace, ServiceAccount, RBAC, CRD,
    /// DaemonSet), the agent's every call (`access`, the node agent's
    /// `API_ACCESS`) allowed, and the app namespace.
    pub fn prepare(server: RealApiServer, access: &[ApiAccess]) -> Result<Cluster> {
        let rt = multi_thread_runtime()?;
        let admin = rt.block_on(server.client(server.admin()))?;
        let cluster = Cluster { server, admin, rt };
        let docs = manifests(&repo_root().join("deploy"))?;
        let admin = &cluster.admin;
        cluster.block_on(async {
            let refused = apply_all(admin, &docs).await;
            ensure!(refused.is_empty(), "deploy/ refused: {refused:#?}");
            let agent = cluster
                .server
                .service_account(AGENT_NS, AGENT_SA)
                .context("the agent's identity")?;
            for a in access {
                wait_granted(admin, agent, a, None).await?;
            }
            create(
                admin,
                "",
                "Namespace",
                json!({"metadata": {"name": APP_NS}}),
            )
            .await?;
            // The ServiceAccount admission plugin refuses pods without it.
            create(
                admin,
                APP_NS,
                "ServiceAccount",
                json!({"metadata": {"name": "default"}}),
            )
            .await
        })?;
        Ok(cluster)
    }

    /// PVC shop/data bound to a CSI PV, used by web-0 and web-1 on node-1
    /// and by nothing elsewhere; far-away runs on node-2. The pods' UIDs,
    /// which the server assigned.
    pub fn workload(&self) -> Result<[String; 2]> {
        let admin = &self.admin;
        self.block_on(async {
            let pvc = create(
                admin,
                APP_NS,
                "PersistentVolumeClaim",
                json!({
                    "metadata": {"name": "data", "labels": {"app": "shop"}},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "resources": {"requests": {"storage": "64Mi"}},
                        "storageClassName": "",
                        "volumeName": PV
                    }
                }),
            )
            .await?;
            create(
                admin,
                "",
                "PersistentVolume",
                json!({
                    "metadata": {"name": PV},
                    "spec": {
                        "capacity": {"storage": "64Mi"},
                        "accessModes": ["ReadWriteOnce"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "claimRef": {"kind": "PersistentVolumeClaim", "namespace": APP_NS,
                                     "name": "data", "uid": pvc["metadata"]["uid"]},
                        "csi": {"driver": DRIVER, "volumeHandle": "handle-e2e"}
                    }
                }),
            )
            .await?;
            let mut uids = Vec::new();
            for (name, node) in [("web-0", "node-1"), ("web-1", "node-1"), ("far-away", "node-2")] {
                let pod = create(
                    admin,
                    APP_NS,
                    "Pod",
                    json!({
                        "metadata": {"name": name},
                        "spec": {
                            "nodeName": node,
                            "containers": [{"name": "app", "image": "example/app:1"}],
                            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
                        }
                    }),
                )
                .await?;
                let uid = pod["metadata"]["uid"].as_str().context("a pod UID")?;
                uids.push(uid.to_string());
            }
            Ok([uids[0].clone(), uids[1].clone()])
        })
    }

    /// The agent's Events in the app namespace, as JSON.
    pub fn events(&self) -> Result<Vec<Value>> {
        let api = Api::<Event>::namespaced(self.admin.clone(), APP_NS);
        let list = self.block_on(api.list(&Default::default()))?;
        list.items
            .into_iter()
            .filter(|e| e.reporting_component.as_deref() == Some(COMPONENT))
            .map(|e| serde_json::to_value(e).context("an Event as JSON"))
            .collect()
    }

    /// Waits until each of [`OBJECTS`] has exactly one `reason` Event with
    /// `count`; returns them in that order.
    pub fn wait_counts(&self, reason: &str, count: i64, timeout: Duration) -> Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        loop {
            let events = self.events()?;
            let found: Vec<Value> = OBJECTS
                .iter()
                .filter_map(|(kind, name)| {
                    let on: Vec<&Value> = events
                        .iter()
                        .filter(|e| {
                            e["involvedObject"]["kind"] == *kind
                                && e["involvedObject"]["name"] == *name
                                && e["reason"] == reason
                        })
                        .collect();
                    match on.as_slice() {
                        [e] if e["count"] == count => Some((*e).clone()),
                        _ => None,
                    }
                })
                .collect();
            if found.len() == OBJECTS.len() {
                return Ok(found);
            }
            if Instant::now() >= deadline {
                bail!(
                    "waiting for {reason} x{count} on both pods and the PVC; the agent's Events: {:#}",
                    Value::Array(events)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The VolumeHealth shop/data once `done` holds for it.
    pub fn wait_volume_health(&self, what: &str, done: impl Fn(&Value) -> bool) -> Result<Value> {
        let resource = ApiResource {
            group: "volume-health.io".into(),
            version: "v1alpha1".into(),
            api_version: "volume-health.io/v1alpha1".into(),
            kind: "VolumeHealth".into(),
            plural: "volumehealths".into(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(self.admin.clone(), APP_NS, &resource);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let now = match self.block_on(api.get_opt("data"))? {
                Some(o) => serde_json::to_value(o)?,
                None => Value::Null,
            };
            if done(&now) {
                return Ok(now);
            }
            if Instant::now() >= deadline {
                bail!("waiting for the VolumeHealth shop/data to be {what}; now: {now:#}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The PVC's labels, as `key=value` in order.
    pub fn pvc_labels(&self) -> Result<Vec<String>> {
        let api = Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), APP_NS);
        let pvc = self.block_on(api.get("data"))?;
        let labels = pvc.metadata.labels.unwrap_or_default();
        Ok(labels.iter().map(|(k, v)| format!("{k}={v}")).collect())
    }

    pub fn wait_labels(&self, want: &[&str]) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.pvc_labels()?;
            if now == want {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("the PVC's labels are {now:?}, not {want:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Creates one object of a core kind (or a ServiceAccount, Namespace...)
/// as admin; returns it as the server stored it.
pub async fn create(admin: &Client, ns: &str, kind: &str, mut body: Value) -> Result<Value> {
    body["apiVersion"] = json!("v1");
    body["kind"] = json!(kind);
    let resource = ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    };
    let api: Api<DynamicObject> = if ns.is_empty() {
        Api::all_with(admin.clone(), &resource)
    } else {
        Api::namespaced_with(admin.clone(), ns, &resource)
    };
    let object: DynamicObject = serde_json::from_value(body)?;
    let created = api
        .create(&PostParams::default(), &object)
        .await
        .with_context(|| format!("creating {kind} {ns}/{:?}", object.metadata.name))?;
    Ok(serde_json::to_value(created)?)
}

/// `(name, uid)` of each Event.
pub fn identities(events: &[Value]) -> Vec<(String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    events
        .iter()
        .map(|e| (s(&e["metadata"]["name"]), s(&e["metadata"]["uid"])))
        .collect()
}

/// Every API request of the agent process serving `metrics` got an answer
/// the protocol expects: 2xx, or 404 for a `get` of what it creates next.
/// A refusal (400, 403, 422...) would show here first.
pub fn check_requests(metrics: SocketAddr) -> Result<Vec<String>> {
    let (_, text) = http_get(metrics, "/metrics")?;
    let requests: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with("volume_health_api_requests_total{"))
        .map(str::to_string)
        .collect();
    let wrong: Vec<&String> = requests
        .iter()
        .filter(|l| {
            let ok = (200..300).any(|c| l.contains(&format!("code=\"{c}\"")))
                || (l.contains("verb=\"get\"") && l.contains("code=\"404\""));
            !ok
        })
        .collect();
    ensure!(wrong.is_empty(), "requests the server refused: {wrong:#?}");
    ensure!(!requests.is_empty(), "no API requests counted:\n{text}");
    Ok(requests)
}

/// `health-agent run` as node-1's agent with its ServiceAccount, against
/// kubelet root `root` (its state directory in there too, so that a
/// restart with the same arguments finds it), pinned on `bpffs`, quick to
/// report (checks and Event updates every second) and with `quiet` seconds
/// of kernel quiet window.
/// The agent's `--state-dir` inside a test's kubelet root: the agent reads
/// only `pods/` and `plugins/` there.
pub const STATE_DIR_NAME: &str = "volume-health-state";

pub fn agent_args(
    cluster: &Cluster,
    root: &Path,
    metrics: SocketAddr,
    bpffs: &Bpffs,
    quiet: &str,
) -> Result<Vec<String>> {
    let who = cluster
        .server
        .service_account(AGENT_NS, AGENT_SA)
        .context("the agent's identity")?;
    let args = [
        "--node-name",
        "node-1",
        "--kubeconfig",
        &cluster.server.kubeconfig(who).display().to_string(),
        "--kubelet-root",
        &root.display().to_string(),
        "--state-dir",
        &root.join(STATE_DIR_NAME).display().to_string(),
        "--metrics-addr",
        &metrics.to_string(),
        "--check-interval",
        "1",
        "--event-update-interval",
        "1",
        "--kernel-quiet-window",
        quiet,
        // As the DaemonSet: the kernel side outlives the process.
        "--pin-dir",
        &bpffs.pin_dir_arg(),
    ];
    Ok(args.iter().map(|s| s.to_string()).collect())
}
