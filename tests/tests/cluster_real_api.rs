//! Cluster mode against the real kube-apiserver (`health_tests::envtest`):
//! the real agent binary on the real kernel, authenticated as the
//! ServiceAccount that deploy/ binds to its RBAC, never as admin.
//!
//! The fake API server (cluster.rs) asserts the exact requests the agent
//! makes; this one decides what a cluster would: whether the server accepts
//! the agent's Events and their patches, its field selectors, the PVC label
//! patch and the VolumeHealth applies, and whether deploy/'s RBAC allows each
//! of those calls. The scenario is a rolling update or crash as the
//! DaemonSet runs it: errors on a PVC shared by two pods, the agent killed
//! (SIGKILL) mid-episode, errors while no agent runs (counted by the pinned
//! programs), the agent restarted on the same bpffs, more errors, then the
//! recovery, read back as admin. The server assigns the UIDs, so an Event
//! that keeps its UID across the restart is the same object, patched. The
//! same restart without pinned state, with the exact requests, is
//! `cluster.rs`'s `a_restart_mid_episode_continues_the_same_events`.
//!
//! Needs root (fails without it) and the API server's binaries
//! (`HEALTH_K8S_ASSETS`; a missing server fails under `CI=true`).

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use health_agent::k8s::API_ACCESS;
use health_tests::agent::Agent;
use health_tests::bpffs::Bpffs;
use health_tests::envtest::{wait_allowed, Options, RealApiServer};
use health_tests::kubelet::{free_port, http_get, wait_ready, CsiVolume};
use health_tests::manifests::{apply_all, manifests, repo_root};
use health_tests::{multi_thread_runtime, require_env, shared_kernel};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim, Pod};
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::Client;
use serde_json::{json, Value};
use tokio::runtime::Runtime;

/// The agent's namespace and ServiceAccount in deploy/.
const AGENT_NS: &str = "volume-health";
const AGENT_SA: &str = "volume-health";
const APP_NS: &str = "shop";
const PV: &str = "pv-real";
const DRIVER: &str = "disk.csi.volume-health.test";
/// `reportingComponent` of the agent's Events.
const COMPONENT: &str = "volume-health-agent";

/// The objects the agent reports on: both pods and their PVC.
const OBJECTS: [(&str, &str); 3] = [
    ("Pod", "web-0"),
    ("Pod", "web-1"),
    ("PersistentVolumeClaim", "data"),
];

/// The server with deploy/ applied, and the admin's view of it.
struct Cluster {
    server: RealApiServer,
    admin: Client,
    rt: Runtime,
}

impl Cluster {
    fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// deploy/ applied as it ships (namespace, ServiceAccount, RBAC, CRD,
    /// DaemonSet), the agent's every call allowed, and the app namespace.
    fn prepare(server: RealApiServer) -> Result<Cluster> {
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
            for a in API_ACCESS {
                for verb in a.verbs {
                    wait_allowed(admin, agent, (a.group, a.resource, verb), None).await?;
                }
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
    fn workload(&self) -> Result<[String; 2]> {
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
    fn events(&self) -> Result<Vec<Value>> {
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
    fn wait_counts(&self, reason: &str, count: i64, timeout: Duration) -> Result<Vec<Value>> {
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
    fn wait_volume_health(&self, what: &str, done: impl Fn(&Value) -> bool) -> Result<Value> {
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
    fn pvc_labels(&self) -> Result<Vec<String>> {
        let api = Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), APP_NS);
        let pvc = self.block_on(api.get("data"))?;
        let labels = pvc.metadata.labels.unwrap_or_default();
        Ok(labels.iter().map(|(k, v)| format!("{k}={v}")).collect())
    }

    fn wait_labels(&self, want: &[&str]) -> Result<()> {
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
async fn create(admin: &Client, ns: &str, kind: &str, mut body: Value) -> Result<Value> {
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
fn identities(events: &[Value]) -> Vec<(String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    events
        .iter()
        .map(|e| (s(&e["metadata"]["name"]), s(&e["metadata"]["uid"])))
        .collect()
}

/// Every API request of the agent process serving `metrics` got an answer
/// the protocol expects: 2xx, or 404 for a `get` of what it creates next.
/// A refusal (400, 403, 422...) would show here first.
fn check_requests(metrics: SocketAddr) -> Result<Vec<String>> {
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

fn agent_args(
    cluster: &Cluster,
    root: &Path,
    metrics: SocketAddr,
    bpffs: &Bpffs,
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
        "--metrics-addr",
        &metrics.to_string(),
        "--check-interval",
        "1",
        "--event-update-interval",
        "1",
        // Outlasts the restart: the episode is still open when the new
        // process starts.
        "--kernel-quiet-window",
        "12",
        // As the DaemonSet: the kernel side outlives the process.
        "--pin-dir",
        &bpffs.pin_dir_arg(),
    ];
    Ok(args.iter().map(|s| s.to_string()).collect())
}

#[test]
fn a_restart_mid_episode_continues_the_same_events_on_a_real_api_server() -> Result<()> {
    require_env(&[])?;
    let _kernel = shared_kernel();
    let Some(server) = Options::new().service_account(AGENT_NS, AGENT_SA).require() else {
        return Ok(());
    };
    let cluster = Cluster::prepare(server)?;
    let [web_0, web_1] = cluster.workload()?;
    let root = tempfile::Builder::new().prefix("kubelet-").tempdir()?;
    let volume = CsiVolume::publish(root.path(), PV, DRIVER, "node-1", &[&web_0, &web_1])?;
    let dev = volume.device_name();
    let metrics = free_port()?;
    let bpffs = Bpffs::mount()?;
    let args = agent_args(&cluster, root.path(), metrics, &bpffs)?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let agent = Agent::start_cluster(&args)?;
    wait_ready(metrics)?;
    volume.fail_writes(5)?;
    let before = cluster.wait_counts("BlockIOErrors", 5, Duration::from_secs(15))?;
    for e in &before {
        assert_eq!(
            (&e["type"], &e["source"]["host"], &e["reportingInstance"]),
            (&json!("Warning"), &json!("node-1"), &json!("node-1")),
            "{e:#}"
        );
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.contains(&format!(
                "Degraded BlockIOErrors: 5 block I/O errors (write, EIO) on {dev} "
            )),
            "{m}"
        );
    }
    // The server's UIDs of the pods, as the agent found them through
    // kubelet's directories.
    assert_eq!(before[0]["involvedObject"]["uid"], web_0.as_str());
    assert_eq!(before[1]["involvedObject"]["uid"], web_1.as_str());
    let ids = identities(&before);
    let degraded = |vh: &Value, count: u64| {
        let c = &vh["status"]["sources"][0]["conditions"][0];
        vh["status"]["health"] == "Degraded"
            && vh["status"]["sources"].as_array().map(Vec::len) == Some(1)
            && vh["status"]["sources"][0]["name"] == "Node/node-1"
            && c["reason"] == "BlockIOErrors"
            && c["count"] == count
    };
    cluster.wait_volume_health("Degraded x5", |vh| degraded(vh, 5))?;
    cluster.wait_labels(&["app=shop", "volume-health.io/health=Degraded"])?;
    let first = check_requests(metrics)?;

    // SIGKILL: no final flush, no clean detach; the pinned programs go on
    // counting while no agent runs.
    drop(agent);
    volume.fail_writes(2)?;
    let agent = Agent::start_cluster(&args)?;
    wait_ready(metrics)?;
    volume.fail_writes(3)?;
    // The same three objects (same UIDs: patched, not created again), and
    // the count is the episode's: the 5 reported before, then the 2 of the
    // gap and the 3 after, which the new process reports (it starts from
    // what the earlier one reported, kept pinned), each once.
    let after = cluster.wait_counts("BlockIOErrors", 10, Duration::from_secs(20))?;
    assert_eq!(identities(&after), ids);
    for e in &after {
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.contains(&format!(
                ": Degraded BlockIOErrors: 5 block I/O errors (write, EIO) on {dev} "
            )) && m.ends_with(" (and 5 reported before the agent restarted)"),
            "{m}"
        );
    }
    cluster.wait_volume_health("Degraded x10", |vh| degraded(vh, 10))?;

    // The episode ends in the new process: one recovery on each object,
    // the union Healthy, the label gone and the PVC's own label kept.
    let cleared = cluster.wait_counts("BlockIOErrorsCleared", 1, Duration::from_secs(30))?;
    for e in &cleared {
        assert_eq!(e["type"], "Normal", "{e:#}");
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("Degraded BlockIOErrors cleared; it was: 5 block I/O errors")
                && m.ends_with(" (and 5 reported before the agent restarted)"),
            "{m}"
        );
    }
    let vh = cluster.wait_volume_health("Healthy", |vh| vh["status"]["health"] == "Healthy")?;
    assert_eq!(
        vh["status"]["sources"][0]["conditions"],
        json!([]),
        "{vh:#}"
    );
    cluster.wait_labels(&["app=shop"])?;
    let second = check_requests(metrics)?;
    eprintln!("the first process's requests: {first:#?}\nthe second's: {second:#?}");

    // Nothing else: six Events in all, none on the other node's pod.
    let all = cluster.events()?;
    assert_eq!(all.len(), 6, "{:#}", Value::Array(all.clone()));
    assert_eq!(
        identities(&cluster.wait_counts("BlockIOErrors", 10, Duration::ZERO)?),
        ids
    );
    let pods = Api::<Pod>::namespaced(cluster.admin.clone(), APP_NS);
    let far = cluster.block_on(pods.get("far-away"))?;
    assert!(all
        .iter()
        .all(|e| e["involvedObject"]["uid"] != json!(far.metadata.uid)));
    agent.stop_cleanly()?;
    Ok(())
}
