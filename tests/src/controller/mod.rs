//! `health-controller` end to end: the real binary as a child process,
//! a real kube-apiserver ([`crate::envtest`]) holding the PVs, PVCs, Nodes and
//! Pods it reads, and the Events and Lease it writes read back as admin.
//!
//! The controller runs as a ServiceAccount bound to exactly the RBAC of
//! `deploy/controller/rbac` (moved into [`CSI_NS`]), never as admin: a request
//! the shipped manifests do not allow fails here as it would in a cluster.
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use health_tests::controller::{ControllerEnv, Replica};
//! let Some(env) = ControllerEnv::start().await else { return Ok(()) };
//! let socket = std::path::Path::new("/tmp/x/csi.sock");
//! let ctl = env.controller(Replica::new("ctl-a", socket))?;
//! # let _ = ctl; Ok(()) }
//! ```

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use crate::envtest::{apply_manifest, Options, RealApiServer};

mod events;
mod process;

use events::list_events;
pub use events::{key, tally, EventView};
pub use process::{ControllerProcess, Exited, Replica};

/// Where the driver's controller pod, its ServiceAccount and the Lease live.
pub const CSI_NS: &str = "csi";
/// Where the workloads' PVCs and Pods live (and so the Events).
pub const APP_NS: &str = "shop";
/// The ServiceAccount deploy/controller/rbac binds.
pub const CONTROLLER_SA: &str = "volume-health-controller";
/// `reportingComponent` of the controller's Events.
pub const COMPONENT: &str = "volume-health-controller";

/// A real API server prepared for the controller: its RBAC applied and
/// effective, the namespaces and the `default` ServiceAccount created (no
/// controller-manager does it here). Remembers every controller started, so
/// that a failure shows their logs.
pub struct ControllerEnv {
    pub server: RealApiServer,
    pub admin: Client,
    logs: Mutex<Vec<(String, Arc<Mutex<String>>)>>,
}

impl ControllerEnv {
    /// `None` (after a loud notice) when the API server's binaries are
    /// missing outside CI; see [`crate::envtest::Options::require`].
    pub async fn start() -> Option<ControllerEnv> {
        Self::start_with(Options::new()).await
    }

    /// [`ControllerEnv::start`] on a server started with `options` (extra
    /// flags; the controller's ServiceAccount is added).
    pub async fn start_with(options: Options) -> Option<ControllerEnv> {
        // `require` blocks for the few seconds the server takes to start.
        let server = tokio::task::spawn_blocking(|| {
            options.service_account(CSI_NS, CONTROLLER_SA).require()
        })
        .await
        .expect("the server start thread panicked")?;
        match Self::prepare(server).await {
            Ok(env) => Some(env),
            Err(e) => panic!("preparing the API server for the controller: {e:#}"),
        }
    }

    async fn prepare(server: RealApiServer) -> Result<ControllerEnv> {
        let admin = server.client(server.admin()).await?;
        for ns in [CSI_NS, APP_NS] {
            Api::<Namespace>::all(admin.clone())
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
                )
                .await
                .with_context(|| format!("creating namespace {ns}"))?;
        }
        // The ServiceAccount admission plugin refuses pods without it.
        Api::<ServiceAccount>::namespaced(admin.clone(), APP_NS)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "default"}}))?,
            )
            .await
            .context("creating ServiceAccount default")?;
        // The VolumeHealth CRD, as deploy/ installs it.
        let crd = crate::manifests::repo_root().join("deploy/volumehealth-crd.yaml");
        let text = std::fs::read_to_string(&crd).with_context(|| crd.display().to_string())?;
        for doc in crate::manifests::documents(&text, "volumehealth-crd.yaml")? {
            apply_manifest(&admin, &doc)
                .await
                .context("applying the VolumeHealth CRD")?;
        }
        for doc in rbac_manifests(CSI_NS)? {
            apply_manifest(&admin, &doc)
                .await
                .with_context(|| format!("applying {}", doc["kind"]))?;
        }
        let env = ControllerEnv {
            server,
            admin,
            logs: Mutex::new(Vec::new()),
        };
        // RBAC reads bindings through an informer: both bindings must be in
        // force before a controller starts, or its first requests fail.
        env.wait_allowed("", "events", "create", Some(APP_NS))
            .await?;
        env.wait_allowed("coordination.k8s.io", "leases", "patch", Some(CSI_NS))
            .await?;
        Ok(env)
    }

    async fn wait_allowed(
        &self,
        group: &str,
        resource: &str,
        verb: &str,
        ns: Option<&str>,
    ) -> Result<()> {
        let user = crate::envtest::service_account_user(CSI_NS, CONTROLLER_SA);
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.clone()),
                resource_attributes: Some(ResourceAttributes {
                    group: Some(group.to_string()),
                    resource: Some(resource.to_string()),
                    verb: Some(verb.to_string()),
                    namespace: ns.map(str::to_string),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api = Api::<SubjectAccessReview>::all(self.admin.clone());
        wait_for(
            &format!("{user} may {verb} {resource}"),
            Duration::from_secs(10),
            || async {
                let answer = api.create(&PostParams::default(), &review).await?;
                Ok(answer.status.filter(|s| s.allowed).map(|_| ()))
            },
        )
        .await
    }

    /// The `VolumeHealth` of PVC `name` in [`APP_NS`] as JSON, if any.
    pub async fn volume_health(&self, name: &str) -> Result<Option<Value>> {
        let resource = kube::core::ApiResource {
            group: "volume-health.io".into(),
            version: "v1alpha1".into(),
            api_version: "volume-health.io/v1alpha1".into(),
            kind: "VolumeHealth".into(),
            plural: "volumehealths".into(),
        };
        let api: Api<kube::core::DynamicObject> =
            Api::namespaced_with(self.admin.clone(), APP_NS, &resource);
        match api.get_opt(name).await? {
            Some(o) => Ok(Some(serde_json::to_value(&o)?)),
            None => Ok(None),
        }
    }

    /// The `volume-health.io/health` label of PVC `name` in [`APP_NS`].
    pub async fn health_label(&self, name: &str) -> Result<Option<String>> {
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), APP_NS)
            .get(name)
            .await?;
        Ok(pvc
            .metadata
            .labels
            .unwrap_or_default()
            .get("volume-health.io/health")
            .cloned())
    }

    /// The kubeconfig of the controller's ServiceAccount.
    pub fn controller_kubeconfig(&self) -> Result<PathBuf> {
        let who = self
            .server
            .service_account(CSI_NS, CONTROLLER_SA)
            .context("the controller's ServiceAccount has no token")?;
        Ok(self.server.kubeconfig(who).to_path_buf())
    }

    /// Starts a replica as the controller's ServiceAccount.
    pub fn controller(&self, replica: Replica) -> Result<ControllerProcess> {
        let process = ControllerProcess::start(&replica, &self.controller_kubeconfig()?)?;
        self.logs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((replica.identity.clone(), Arc::clone(&process.log)));
        Ok(process)
    }

    /// Every controller's log so far, for a failure message.
    pub fn logs(&self) -> String {
        let logs = self.logs.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = String::new();
        for (identity, log) in logs.iter() {
            let text = log.lock().map(|l| l.clone()).unwrap_or_default();
            out.push_str(&format!(
                "\n----- controller {identity} (stderr) -----\n{text}"
            ));
        }
        out
    }

    /// Panics with the error and every controller's log.
    pub fn check(&self, result: Result<()>) {
        if let Err(e) = result {
            panic!("{e:#}\n{}", self.logs());
        }
    }

    /// The Lease's holder as admin reads it; `None` when there is no Lease
    /// or nobody holds it.
    pub async fn lease_holder(&self, name: &str) -> Result<Option<String>> {
        let lease = Api::<Lease>::namespaced(self.admin.clone(), CSI_NS)
            .get_opt(name)
            .await
            .with_context(|| format!("reading Lease {CSI_NS}/{name}"))?;
        Ok(lease
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
            .filter(|h| !h.is_empty()))
    }

    /// Waits until `identity` holds the Lease.
    pub async fn wait_holder(&self, lease: &str, identity: &str, within: Duration) -> Result<()> {
        wait_for(
            &format!("{identity} to hold Lease {lease}"),
            within,
            || async {
                Ok((self.lease_holder(lease).await?.as_deref() == Some(identity)).then_some(()))
            },
        )
        .await
    }

    /// Every Event in [`APP_NS`].
    pub async fn events(&self) -> Result<Vec<EventView>> {
        list_events(&self.admin, &ListParams::default()).await
    }

    /// The Events about one object, as the server selects them.
    pub async fn events_about(&self, kind: &str, name: &str) -> Result<Vec<EventView>> {
        let params = ListParams::default().fields(&format!(
            "involvedObject.kind={kind},involvedObject.name={name}"
        ));
        list_events(&self.admin, &params).await
    }

    /// A PVC in [`APP_NS`] bound (by claimRef, with its uid) to a new PV of
    /// `driver` with `handle`. No PV controller runs: the PVC stays Pending,
    /// and the controller reads only the PV.
    pub async fn claim(&self, pvc: &str, pv: &str, driver: &str, handle: &str) -> Result<()> {
        let created = Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), APP_NS)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": pvc},
                    "spec": {"accessModes": ["ReadWriteOnce"], "volumeName": pv,
                             "storageClassName": "",
                             "resources": {"requests": {"storage": "1Gi"}}}
                }))?,
            )
            .await
            .with_context(|| format!("creating PVC {pvc}"))?;
        let uid = created.metadata.uid.context("a created PVC has a uid")?;
        Api::<PersistentVolume>::all(self.admin.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": pv},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteOnce"],
                        "storageClassName": "",
                        "csi": {"driver": driver, "volumeHandle": handle},
                        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                     "namespace": APP_NS, "name": pvc, "uid": uid}
                    }
                }))?,
            )
            .await
            .with_context(|| format!("creating PV {pv}"))?;
        Ok(())
    }

    /// The uid of PVC `name` in [`APP_NS`]: what its Events must name for
    /// `kubectl describe` to show them.
    pub async fn claim_uid(&self, name: &str) -> Result<String> {
        Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), APP_NS)
            .get(name)
            .await
            .with_context(|| format!("reading PVC {name}"))?
            .metadata
            .uid
            .context("a PVC without a uid")
    }

    /// A Node, Ready since now.
    pub async fn node(&self, name: &str) -> Result<()> {
        Api::<Node>::all(self.admin.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": name}}))?,
            )
            .await
            .with_context(|| format!("creating node {name}"))?;
        self.set_ready(name, true, whole_seconds_now()).await
    }

    /// Sets the node's Ready condition through the status subresource, with
    /// `since` as its lastTransitionTime.
    pub async fn set_ready(&self, name: &str, ready: bool, since: SystemTime) -> Result<()> {
        let since = rfc3339(since);
        let (status, reason) = if ready {
            ("True", "KubeletReady")
        } else {
            ("False", "KubeletNotReady")
        };
        let patch = json!({"status": {"conditions": [{
            "type": "Ready", "status": status, "reason": reason,
            "message": format!("kubelet says {reason}"),
            "lastHeartbeatTime": since, "lastTransitionTime": since
        }]}});
        Api::<Node>::all(self.admin.clone())
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .with_context(|| format!("setting node {name} Ready={status}"))?;
        Ok(())
    }

    /// A Pod in [`APP_NS`] already scheduled on `node`, using `claims`.
    pub async fn pod(&self, name: &str, node: &str, claims: &[&str]) -> Result<()> {
        let volumes: Vec<Value> = claims
            .iter()
            .map(|c| json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        Api::<Pod>::namespaced(self.admin.clone(), APP_NS)
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {"nodeName": node, "volumes": volumes,
                             "containers": [{"name": "app", "image": "example/app:1"}]}
                }))?,
            )
            .await
            .with_context(|| format!("creating pod {name}"))?;
        Ok(())
    }
}

/// Now, cut to whole seconds as the API server keeps times.
pub fn whole_seconds_now() -> SystemTime {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    UNIX_EPOCH + Duration::from_secs(secs)
}

/// `t` as RFC 3339 in UTC with whole seconds (`2027-01-15T08:00:00Z`).
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).expect("after 1970").as_secs();
    let t = time::OffsetDateTime::from_unix_timestamp(secs as i64).expect("a valid time");
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    )
}

/// The controller's RBAC (`deploy/controller/rbac`, as its kustomization
/// lists it) with every namespace it names moved to `namespace`, as a
/// kustomization of the user's would.
pub fn rbac_manifests(namespace: &str) -> Result<Vec<Value>> {
    let dir = crate::manifests::repo_root().join("deploy/controller/rbac");
    let kustomization: Value = serde_yaml::from_str(
        &std::fs::read_to_string(dir.join("kustomization.yaml")).context("kustomization")?,
    )?;
    let files = kustomization["resources"]
        .as_array()
        .context("the kustomization lists resources")?;
    let mut docs = Vec::new();
    for file in files {
        let file = dir.join(file.as_str().context("a resource path")?);
        let text = std::fs::read_to_string(&file).with_context(|| file.display().to_string())?;
        for mut value in crate::manifests::documents(&text, &file.display().to_string())? {
            if value["metadata"].get("namespace").is_some() {
                value["metadata"]["namespace"] = json!(namespace);
            }
            // `get_mut`: indexing a Value mutably would insert `subjects: null`.
            let subjects = value.get_mut("subjects").and_then(Value::as_array_mut);
            for subject in subjects.into_iter().flatten() {
                subject["namespace"] = json!(namespace);
            }
            docs.push(value);
        }
    }
    ensure!(
        docs.len() == 5,
        "deploy/controller/rbac: {} documents",
        docs.len()
    );
    Ok(docs)
}

/// Polls `check` every 100 ms until it gives `Some`, or fails after `within`.
pub async fn wait_for<T, F, Fut>(what: &str, within: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + within;
    loop {
        if let Some(found) = check().await? {
            return Ok(found);
        }
        if Instant::now() >= deadline {
            bail!("waited {within:?} for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
