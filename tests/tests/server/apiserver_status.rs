//! `VolumeHealth` on a real kube-apiserver (the oldest supported, v1.26,
//! `health_tests::envtest`) with the ValidatingAdmissionPolicy alpha of 1.26
//! switched on: the CRD of
//! deploy/ installs and its schema refuses bad objects; the agents of two
//! nodes and the controller write their own entries by server-side apply
//! under the agent's real ClusterRole (deploy/clusterrole.yaml); the
//! admission policies of deploy/components/admission-policy (as v1alpha1,
//! which is what 1.26 serves) keep one node's agent from overwriting or
//! removing another's entry and from touching a PVC beyond its label;
//! `kubectl get volumehealth -A` and `kubectl get pvc -l` show the state and
//! clear on recovery. On the newest (1.37, the policies as deploy/ ships
//! them), the controller's union reaches `pvc.status.healthStatus` where the
//! `CSIVolumeHealth` gate is on and is dropped, said once, where it is off.
//!
//! Node identities: every agent runs as one ServiceAccount; Kubernetes 1.30+
//! adds the pod's node to the user info of its token, which the policy reads.
//! This server is older, so the test acts as the ServiceAccount with that
//! extra through the admin's impersonation (`envtest::Impersonation`).
//!
//! No root, no BPF; needs HEALTH_K8S_ASSETS (see the harness).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use crate::status_fixtures;
use anyhow::{bail, ensure, Context, Result};
use health_core::conditions::Status;
use health_kube::status::{
    self, Claim, EntryCondition, EntryKind, Put, SourceEntry, StatusApi, VolumeHealth,
};
use health_tests::envtest::{apply_manifest, Impersonation, Options, RealApiServer};
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, VersionMatch};
use kube::Client;
use serde::Deserialize;
use serde_json::{json, Value};
use status_fixtures::{cond, node_entry};

const NS: &str = "shop";
const PVC: &str = "data";
const AGENT_NS: &str = "volume-health";
const AGENT_SA: &str = "volume-health";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ sits in the workspace")
        .to_path_buf()
}

fn documents(file: &Path) -> Result<Vec<Value>> {
    let text = std::fs::read_to_string(file).with_context(|| file.display().to_string())?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v = Value::deserialize(doc).with_context(|| file.display().to_string())?;
        if !v.is_null() {
            docs.push(v);
        }
    }
    Ok(docs)
}

const POLICY_FILES: [&str; 4] = [
    "volumehealth-policy.yaml",
    "volumehealth-policybinding.yaml",
    "pvc-label-policy.yaml",
    "pvc-label-policybinding.yaml",
];

/// The policies of deploy/ as it ships them (admissionregistration v1, 1.30+).
fn policies_as_shipped() -> Result<Vec<Value>> {
    let dir = repo().join("deploy/components/admission-policy");
    let mut out = Vec::new();
    for f in POLICY_FILES {
        out.extend(documents(&dir.join(f))?);
    }
    Ok(out)
}

/// The policies of deploy/ as 1.26 serves them: v1alpha1, whose binding has
/// no `validationActions` (it always denies).
fn policies_for_1_26() -> Result<Vec<Value>> {
    let dir = repo().join("deploy/components/admission-policy");
    let mut out = Vec::new();
    for f in POLICY_FILES {
        for mut d in documents(&dir.join(f))? {
            ensure!(
                d["apiVersion"] == "admissionregistration.k8s.io/v1",
                "{f}: {}",
                d["apiVersion"]
            );
            d["apiVersion"] = json!("admissionregistration.k8s.io/v1alpha1");
            if d["kind"] == "ValidatingAdmissionPolicyBinding" {
                let spec = d["spec"].as_object_mut().context("binding spec")?;
                ensure!(
                    spec.remove("validationActions") == Some(json!(["Deny"])),
                    "{f}"
                );
            }
            out.push(d);
        }
    }
    Ok(out)
}

/// Which server a test runs on.
#[derive(Clone, Copy, Debug)]
enum Server {
    /// 1.26 with the ValidatingAdmissionPolicy alpha.
    Oldest,
    /// 1.37, its `CSIVolumeHealth` gate on or off.
    Newest { volume_health_gate: bool },
}

struct Env {
    server: RealApiServer,
    admin: Client,
    claim: Claim,
}

impl Env {
    async fn start() -> Result<Option<Env>> {
        Env::start_on(Server::Oldest).await
    }

    async fn start_on(on: Server) -> Result<Option<Env>> {
        let options = match on {
            Server::Oldest => Options::new()
                .oldest()
                .apiserver_arg("--feature-gates=ValidatingAdmissionPolicy=true")
                .apiserver_arg("--runtime-config=admissionregistration.k8s.io/v1alpha1=true"),
            Server::Newest { volume_health_gate } => Options::new().apiserver_arg(&format!(
                "--feature-gates=CSIVolumeHealth={volume_health_gate}"
            )),
        };
        let Some(server) = options.require() else {
            return Ok(None);
        };
        let admin = server.client(server.admin()).await?;
        for f in [
            "namespace.yaml",
            "serviceaccount.yaml",
            "clusterrole.yaml",
            "clusterrolebinding.yaml",
            "volumehealth-crd.yaml",
        ] {
            for d in documents(&repo().join("deploy").join(f))? {
                apply_manifest(&admin, &d)
                    .await
                    .with_context(|| format!("applying deploy/{f}"))?;
            }
        }
        let policies = match on {
            Server::Oldest => policies_for_1_26()?,
            Server::Newest { .. } => policies_as_shipped()?,
        };
        for d in policies {
            apply_manifest(&admin, &d)
                .await
                .context("applying the admission policies")?;
        }
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": NS}}))?,
            )
            .await?;
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": PVC, "namespace": NS, "labels": {"app": "shop"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}},
                     "volumeName": "pv-1"},
        }))?;
        let pvc = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), NS)
            .create(&PostParams::default(), &pvc)
            .await?;
        let claim = Claim {
            namespace: NS.into(),
            name: PVC.into(),
            uid: pvc.metadata.uid.clone().context("pvc uid")?,
            pv: Some("pv-1".into()),
        };
        let env = Env {
            server,
            admin,
            claim,
        };
        env.wait_for_crd().await?;
        Ok(Some(env))
    }

    /// A CRD serves a moment after it is created.
    async fn wait_for_crd(&self) -> Result<()> {
        let api: Api<VolumeHealth> = Api::namespaced(self.admin.clone(), NS);
        for _ in 0..100 {
            if api.list(&Default::default()).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        bail!("the VolumeHealth CRD never served")
    }

    async fn node_client(&self, node: &str) -> Result<Client> {
        self.server
            .impersonating_client(&Impersonation::service_account_on_node(
                AGENT_NS, AGENT_SA, node,
            ))
            .await
    }

    async fn node_api(&self, node: &str) -> Result<StatusApi> {
        Ok(StatusApi::new(
            self.node_client(node).await?,
            status::node_manager(node),
            status::node_entry_names(node),
            None,
        ))
    }

    /// The controller's ServiceAccount under deploy/controller/rbac's
    /// ClusterRole.
    async fn controller_client(&self) -> Result<Client> {
        for d in documents(&repo().join("deploy/controller/rbac/clusterrole.yaml"))? {
            apply_manifest(&self.admin, &d).await?;
        }
        let binding = json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "volume-health-controller"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "volume-health-controller"},
            "subjects": [{"kind": "ServiceAccount", "name": "volume-health-controller", "namespace": "kube-system"}],
        });
        apply_manifest(&self.admin, &binding).await?;
        self.server
            .impersonating_client(&Impersonation::service_account(
                "kube-system",
                "volume-health-controller",
            ))
            .await
    }

    async fn object(&self) -> Result<VolumeHealth> {
        Ok(Api::<VolumeHealth>::namespaced(self.admin.clone(), NS)
            .get(PVC)
            .await?)
    }

    /// The claim's `status.healthStatus` as stored: (status, reason,
    /// message) per condition, and the last transition.
    async fn health_status(
        &self,
    ) -> Result<Option<(Vec<(String, String, String)>, Option<String>)>> {
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), NS)
            .get(PVC)
            .await?;
        Ok(pvc.status.and_then(|s| s.health_status).map(|h| {
            let conditions = h
                .health_conditions
                .unwrap_or_default()
                .into_iter()
                .map(|c| (c.status, c.reason, c.message.unwrap_or_default()))
                .collect();
            (conditions, h.last_transition_time.map(|t| t.0.to_string()))
        }))
    }

    async fn label(&self) -> Result<Option<String>> {
        let pvc = Api::<PersistentVolumeClaim>::namespaced(self.admin.clone(), NS)
            .get(PVC)
            .await?;
        Ok(pvc
            .metadata
            .labels
            .unwrap_or_default()
            .get(status::HEALTH_LABEL)
            .cloned())
    }

    fn kubectl(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(kubectl()?)
            .arg("--kubeconfig")
            .arg(self.server.kubeconfig(self.server.admin()))
            .args(args)
            .output()
            .context("running kubectl")?;
        ensure!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }
}

/// The kubectl of `cargo xtask tools` (HEALTH_KUBECTL, set by `cargo xtask test`), else PATH.
fn kubectl() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("HEALTH_KUBECTL") {
        return Ok(PathBuf::from(p));
    }
    let home = std::env::var_os("HOME").context("HOME")?;
    let tools = Path::new(&home).join(".cache/volume-health/tools");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&tools)
        .with_context(|| format!("{} (run `cargo xtask tools`)", tools.display()))?
        .filter_map(|e| e.ok().map(|e| e.path().join("kubectl")))
        .filter(|p| p.is_file())
        .collect();
    found.sort();
    found
        .pop()
        .context("no kubectl under the tools cache; run `cargo xtask tools`")
}

fn names(o: &VolumeHealth) -> Vec<String> {
    o.status
        .iter()
        .flat_map(|s| &s.sources)
        .map(|e| e.name.clone())
        .collect()
}

fn true_conditions(o: &VolumeHealth) -> Vec<(String, String)> {
    o.status
        .iter()
        .flat_map(|s| &s.conditions)
        .filter(|c| c.is_true())
        .map(|c| (c.type_.to_string(), c.reason.clone()))
        .collect()
}

/// Refused by admission with exactly `message`.
fn denied_with(r: Result<impl std::fmt::Debug, kube::Error>, message: &str) -> Result<()> {
    match r {
        Err(kube::Error::Api(s)) if s.message.contains(message) => Ok(()),
        other => bail!("expected a denial saying {message:?}, got {other:?}"),
    }
}

#[test]
fn two_nodes_write_their_own_entries_and_the_union_follows() -> Result<()> {
    health_tests::multi_thread_runtime()?.block_on(async {
        let Some(env) = Env::start().await? else {
            return Ok(());
        };
        let a = env.node_api("node-a").await?;
        let b = env.node_api("node-b").await?;
        let now = SystemTime::now();

        // Nothing asserted, no object: no write at all.
        assert_eq!(a.put(&env.claim, &[], now).await?, Put::NoObject);

        let put = a
            .put(
                &env.claim,
                &[node_entry(
                    "node-a",
                    vec![cond(Status::Degraded, "BlockIOErrors", Some(25))],
                )],
                now,
            )
            .await?;
        assert_eq!(
            put,
            Put::Written {
                health: "Degraded".into()
            }
        );
        let o = env.object().await?;
        assert_eq!(names(&o), ["Node/node-a"]);
        assert_eq!(
            true_conditions(&o),
            [("Degraded".to_string(), "BlockIOErrors".to_string())]
        );
        let owner = &o.metadata.owner_references.as_ref().context("owner")?[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("PersistentVolumeClaim", PVC, env.claim.uid.as_str())
        );
        assert_eq!(env.label().await?.as_deref(), Some("Degraded"));

        // The same assertion again (only lastSeen and updateTime differ): no write.
        let mut again = node_entry(
            "node-a",
            vec![cond(Status::Degraded, "BlockIOErrors", Some(25))],
        );
        again.update_time = "2026-11-24T11:00:00Z".into();
        again.conditions[0].last_seen = Some("2026-11-24T11:00:00Z".into());
        let rv = o.metadata.resource_version.clone();
        assert_eq!(a.put(&env.claim, &[again], now).await?, Put::Unchanged);
        assert_eq!(env.object().await?.metadata.resource_version, rv);

        // node-b: worse; both entries, both conditions, the label follows the worst.
        b.put(
            &env.claim,
            &[node_entry(
                "node-b",
                vec![cond(Status::Inaccessible, "PathHung", None)],
            )],
            now,
        )
        .await?;
        let o = env.object().await?;
        assert_eq!(names(&o), ["Node/node-a", "Node/node-b"]);
        assert_eq!(
            true_conditions(&o),
            [
                ("Inaccessible".to_string(), "PathHung".to_string()),
                ("Degraded".to_string(), "BlockIOErrors".to_string())
            ]
        );
        let st = o.status.clone().context("status")?;
        assert_eq!(
            (
                st.health.as_deref(),
                st.reason.as_deref(),
                st.nodes.as_deref()
            ),
            (
                Some("Inaccessible"),
                Some("PathHung"),
                Some("node-a,node-b")
            )
        );
        assert_eq!(env.label().await?.as_deref(), Some("Inaccessible"));
        assert_eq!(
            env.kubectl(&[
                "get",
                "pvc",
                "-A",
                "-l",
                "volume-health.io/health=Inaccessible",
                "-o",
                "name"
            ])?
            .trim(),
            "persistentvolumeclaim/data"
        );
        let table = env.kubectl(&["get", "volumehealth", "-A"])?;
        let lines: Vec<Vec<&str>> = table
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            lines[0],
            [
                "NAMESPACE",
                "NAME",
                "PVC",
                "STATUS",
                "REASON",
                "SINCE",
                "NODES"
            ]
        );
        assert_eq!(lines[1][..5], [NS, PVC, PVC, "Inaccessible", "PathHung"]);
        assert_eq!(lines[1][6], "node-a,node-b");

        // node-b recovers: its entry stays, empty; Inaccessible goes False.
        b.put(&env.claim, &[node_entry("node-b", vec![])], now)
            .await?;
        let o = env.object().await?;
        assert_eq!(names(&o), ["Node/node-a", "Node/node-b"]);
        let inacc = o
            .status
            .as_ref()
            .unwrap()
            .conditions
            .iter()
            .find(|c| c.type_ == Status::Inaccessible)
            .cloned()
            .context("Inaccessible")?;
        assert_eq!(
            (inacc.status.as_str(), inacc.reason.as_str()),
            ("False", "PathHungCleared")
        );
        assert_eq!(env.label().await?.as_deref(), Some("Degraded"));

        // node-a recovers: Healthy, label gone.
        a.put(&env.claim, &[node_entry("node-a", vec![])], now)
            .await?;
        let o = env.object().await?;
        assert_eq!(
            o.status.as_ref().unwrap().health.as_deref(),
            Some("Healthy")
        );
        assert!(true_conditions(&o).is_empty());
        assert_eq!(env.label().await?, None);
        assert_eq!(
            env.kubectl(&[
                "get",
                "pvc",
                "-A",
                "-l",
                "volume-health.io/health",
                "-o",
                "name"
            ])?
            .trim(),
            ""
        );
        let pvc = Api::<PersistentVolumeClaim>::namespaced(env.admin.clone(), NS)
            .get(PVC)
            .await?;
        assert_eq!(
            pvc.metadata
                .labels
                .unwrap_or_default()
                .get("app")
                .map(String::as_str),
            Some("shop"),
            "other labels untouched"
        );

        // The pod left node-b: its entry goes (not a recovery).
        b.put(&env.claim, &[], now).await?;
        assert_eq!(names(&env.object().await?), ["Node/node-a"]);
        Ok(())
    })
}

#[test]
fn one_node_cannot_overwrite_or_remove_another_nodes_entry() -> Result<()> {
    health_tests::multi_thread_runtime()?.block_on(async {
        let Some(env) = Env::start().await? else { return Ok(()) };
        let a = env.node_api("node-a").await?;
        let now = SystemTime::now();
        a.put(&env.claim, &[node_entry("node-a", vec![cond(Status::Degraded, "BlockIOErrors", Some(3))])], now)
            .await?;
        let b = env.node_client("node-b").await?;
        let vh: Api<VolumeHealth> = Api::namespaced(b.clone(), NS);
        let rv = env.object().await?.metadata.resource_version;

        // Overwrite node-a's entry (a forced apply under node-b's manager).
        let forged = json!({
            "apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
            "metadata": {"name": PVC, "namespace": NS},
            "status": {"sources": [node_entry("node-a", vec![cond(Status::Degraded, "BlockIOErrors", Some(0))])]},
        });
        let params = PatchParams::apply(&status::node_manager("node-b")).force();
        denied_with(vh.patch_status(PVC, &params, &Patch::Apply(&forged)).await, "a node's agent may add or change only its own node's entries")?;

        // Remove it (a merge patch replaces the list).
        denied_with(
            vh.patch_status(PVC, &PatchParams::default(), &Patch::Merge(json!({"status": {"sources": []}}))).await,
            "a node's agent may remove only its own node's entries",
        )?;

        // Write an entry in node-a's name.
        let mut impostor = node_entry("node-b", vec![]);
        impostor.name = "Node/node-c".into();
        impostor.node = Some("node-c".into());
        let forged = json!({
            "apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
            "metadata": {"name": PVC, "namespace": NS},
            "status": {"sources": [impostor]},
        });
        denied_with(vh.patch_status(PVC, &params, &Patch::Apply(&forged)).await, "only its own node's entries")?;

        // Clear the union while node-a asserts (the summary and conditions are shared fields).
        let lie = json!({
            "apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
            "metadata": {"name": PVC, "namespace": NS},
            "status": {"health": "Healthy", "reason": "", "conditions": []},
        });
        denied_with(vh.patch_status(PVC, &params, &Patch::Apply(&lie)).await, "every status an entry asserts is a True condition")?;

        // A token without a node name writes nothing.
        let anonymous = env.server.impersonating_client(&Impersonation::service_account(AGENT_NS, AGENT_SA)).await?;
        let vh_anon: Api<VolumeHealth> = Api::namespaced(anonymous, NS);
        denied_with(
            vh_anon.patch_status(PVC, &params, &Patch::Apply(&json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth", "metadata": {"name": PVC, "namespace": NS}, "status": {"sources": [node_entry("node-b", vec![])]}}))).await,
            "the agent's token names no node",
        )?;
        assert_eq!(env.object().await?.metadata.resource_version, rv, "nothing was written");

        // PVCs: the label only.
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(b.clone(), NS);
        let label = |k: &str, v: &str| json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": PVC, "namespace": NS, "labels": {k: v}}});
        denied_with(pvcs.patch(PVC, &PatchParams::apply("x").force(), &Patch::Apply(label("app", "evil"))).await, "the agent may change no label but volume-health.io/health")?;
        denied_with(pvcs.patch(PVC, &PatchParams::apply("x").force(), &Patch::Apply(label(status::HEALTH_LABEL, "Broken"))).await, "volume-health.io/health is Inaccessible, DataLoss or Degraded")?;
        // A spec change: the server's own validation refuses this one (an
        // unbound claim's spec is immutable) before the policy's first rule.
        match pvcs.patch(PVC, &PatchParams::default(), &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}}))).await {
            Err(kube::Error::Api(s)) if s.code == 422 => {}
            other => bail!("a spec change must be refused, got {other:?}"),
        }
        denied_with(
            pvcs.patch(PVC, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"x": "y"}}}))).await,
            "the agent may change no annotation or finalizer of a PVC",
        )?;
        pvcs.patch(PVC, &PatchParams::apply("x").force(), &Patch::Apply(label(status::HEALTH_LABEL, "DataLoss"))).await
            .context("the label itself is allowed")?;
        Ok(())
    })
}

#[test]
fn a_stale_view_never_clears_what_another_writer_asserts() -> Result<()> {
    health_tests::multi_thread_runtime()?.block_on(async {
        let Some(env) = Env::start().await? else { return Ok(()) };
        let a = env.node_api("node-a").await?;
        let b = env.node_api("node-b").await?;
        let now = SystemTime::now();
        a.put(&env.claim, &[node_entry("node-a", vec![cond(Status::Degraded, "BlockIOErrors", Some(1))])], now).await?;
        let stale = env.object().await?;

        // The server refuses a write based on an old version.
        b.put(&env.claim, &[node_entry("node-b", vec![cond(Status::DataLoss, "FilesystemCorruption", None)])], now).await?;
        let body = json!({
            "apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
            "metadata": {"name": PVC, "namespace": NS, "resourceVersion": stale.metadata.resource_version},
            "status": {"health": "Degraded", "reason": "BlockIOErrors", "nodes": "node-a",
                       "conditions": stale.status.as_ref().unwrap().conditions,
                       "sources": [node_entry("node-a", vec![cond(Status::Degraded, "BlockIOErrors", Some(2))])]},
        });
        let vh: Api<VolumeHealth> = Api::namespaced(env.node_client("node-a").await?, NS);
        match vh.patch_status(PVC, &PatchParams::apply(&status::node_manager("node-a")).force(), &Patch::Apply(&body)).await {
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            other => bail!("a write on a stale version must be refused with 409, got {other:?}"),
        }

        // Two writers racing: 20 rounds of node-a raising/clearing while node-b
        // raises/clears its own; after every round the union equals the entries.
        for round in 0..20u64 {
            let ea = if round % 2 == 0 { vec![] } else { vec![cond(Status::Degraded, "BlockIOErrors", Some(round))] };
            let eb = if round % 3 == 0 { vec![] } else { vec![cond(Status::DataLoss, "FilesystemCorruption", None)] };
            let (na, nb) = ([node_entry("node-a", ea.clone())], [node_entry("node-b", eb.clone())]);
            let (ra, rb) = tokio::join!(a.put(&env.claim, &na, now), b.put(&env.claim, &nb, now));
            ra?;
            rb?;
            let o = env.object().await?;
            let mut want: Vec<(String, String)> = Vec::new();
            if !eb.is_empty() {
                want.push(("DataLoss".into(), "FilesystemCorruption".into()));
            }
            if !ea.is_empty() {
                want.push(("Degraded".into(), "BlockIOErrors".into()));
            }
            assert_eq!(true_conditions(&o), want, "round {round}");
            let health = o.status.as_ref().unwrap().health.clone().unwrap();
            let expected_label = want.first().map(|w| w.0.clone());
            assert_eq!(health, expected_label.clone().unwrap_or_else(|| "Healthy".into()), "round {round}");
            assert_eq!(env.label().await?, expected_label, "round {round}: the label follows the union");
        }
        Ok(())
    })
}

#[test]
fn the_schema_refuses_bad_objects() -> Result<()> {
    health_tests::multi_thread_runtime()?.block_on(async {
        let Some(env) = Env::start().await? else { return Ok(()) };
        let vh: Api<VolumeHealth> = Api::namespaced(env.admin.clone(), NS);
        vh.patch(PVC, &PatchParams::apply("t"), &Patch::Apply(json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth", "metadata": {"name": PVC}, "spec": {"persistentVolumeClaimName": PVC}}))).await?;
        let status = |s: Value| json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth", "metadata": {"name": PVC}, "status": s});
        let good_entry = node_entry("node-a", vec![cond(Status::Degraded, "BlockIOErrors", None)]);
        let cases: Vec<(Value, &str)> = vec![
            (status(json!({"health": "Sick"})), "Unsupported value: \"Sick\""),
            (status(json!({"conditions": [{"type": "Degraded", "status": "Maybe", "reason": "X", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]})), "Unsupported value: \"Maybe\""),
            (status(json!({"conditions": [{"type": "Degraded", "status": "True", "reason": "not camel", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]})), "should match '^[A-Z][A-Za-z0-9]*$'"),
            (status(json!({"conditions": [
                {"type": "Degraded", "status": "True", "reason": "A", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"},
                {"type": "Degraded", "status": "False", "reason": "B", "message": "", "lastTransitionTime": "2026-11-24T10:00:00Z"}]})), "one condition per type"),
            (status(json!({"sources": [{"name": "Node/node-b", "kind": "Node", "node": "node-a", "updateTime": "2026-11-24T10:00:00Z"}]})), "a node's entry is named <kind>/<node>"),
            (status(json!({"sources": [{"name": "Node", "kind": "Node", "updateTime": "2026-11-24T10:00:00Z"}]})), "a Node entry names its node"),
            (status(json!({"sources": [{"name": "Controller/node-a", "kind": "Controller", "node": "node-a", "updateTime": "2026-11-24T10:00:00Z"}]})), "the Controller entry names no node"),
            (status(json!({"sources": [{"name": "Node/node-a", "kind": "Node", "node": "node-a", "updateTime": "2026-11-24T10:00:00Z", "conditions": [{"status": "Healthy", "reason": "X", "message": "", "since": "2026-11-24T10:00:00Z", "origin": "kernel"}]}]})), "Unsupported value: \"Healthy\""),
            (status(json!({"sources": [good_entry.clone()], "extra": 1})), ".status.extra: field not declared in schema"),
        ];
        for (body, message) in cases {
            let r = vh.patch_status(PVC, &PatchParams::apply("t").force(), &Patch::Apply(&body)).await;
            match r {
                Err(kube::Error::Api(s)) if s.message.contains(message) => {}
                other => bail!("{body} should be refused with {message:?}, got {other:?}"),
            }
        }
        let spec_change = vh.patch(PVC, &PatchParams::apply("t").force(), &Patch::Apply(json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth", "metadata": {"name": PVC}, "spec": {"persistentVolumeClaimName": "other"}}))).await;
        denied_with(spec_change, "persistentVolumeClaimName is immutable")?;
        // And what the agent writes is accepted as it is (strict decoding).
        vh.patch_status(PVC, &PatchParams::apply("t").force().validation_strict(), &Patch::Apply(status(json!({"sources": [good_entry]})))).await?;
        Ok(())
    })
}

#[test]
fn the_controller_writes_its_own_entries_beside_the_nodes() -> Result<()> {
    use health_controller::status::entry_names;
    use health_controller::status::upstream::{shape, HealthStatusWriter, Outcome, Support};
    health_tests::multi_thread_runtime()?.block_on(async {
        let Some(env) = Env::start().await? else { return Ok(()) };
        let controller = env.controller_client().await?;
        let api = StatusApi::new(controller.clone(), status::CONTROLLER_MANAGER.into(), entry_names(), None);
        let now = SystemTime::now();
        let csi = SourceEntry {
            name: "CSIDriver".into(),
            kind: EntryKind::CsiDriver,
            node: None,
            driver: Some("loop.csi.volume-health.io".into()),
            pods: vec![],
            pod_count: None,
            update_time: "2026-11-24T10:00:00Z".into(),
            conditions: vec![EntryCondition { origin: "csi-controller".into(), ..cond(Status::Inaccessible, "VolumeGone", None) }],
        };
        assert_eq!(api.put(&env.claim, &[csi], now).await?, Put::Written { health: "Inaccessible".into() });
        env.node_api("node-a")
            .await?
            .put(&env.claim, &[node_entry("node-a", vec![cond(Status::Degraded, "BlockIOErrors", Some(2))])], now)
            .await?;
        let o = env.object().await?;
        assert_eq!(names(&o), ["CSIDriver", "Node/node-a"]);
        assert_eq!(env.label().await?.as_deref(), Some("Inaccessible"));
        // A node cannot take the controller's entry away.
        let vh: Api<VolumeHealth> = Api::namespaced(env.node_client("node-a").await?, NS);
        denied_with(
            vh.patch_status(PVC, &PatchParams::default(), &Patch::Merge(json!({"status": {"sources": [node_entry("node-a", vec![cond(Status::Degraded, "BlockIOErrors", Some(2))])]}}))).await,
            "a node's agent may remove only its own node's entries",
        )?;
        // The controller clears: the node's condition stays, and so does the label's worst.
        api.put(&env.claim, &[], now).await?;
        let o = env.object().await?;
        assert_eq!(names(&o), ["Node/node-a"]);
        assert_eq!(true_conditions(&o), [("Degraded".to_string(), "BlockIOErrors".to_string())]);
        assert_eq!(env.label().await?.as_deref(), Some("Degraded"));

        // 1.26 has no pvc.status.healthStatus: refused once, never asked
        // again. The union written there would be the object's: the node's
        // kernel evidence included.
        let o = env.object().await?;
        let wanted = shape::wanted(&o);
        assert_eq!(
            wanted.conditions.iter().map(|c| (c.status.as_str(), c.reason.as_str())).collect::<Vec<_>>(),
            [("Degraded", "BlockIOErrors")]
        );
        let mut upstream = HealthStatusWriter::new(controller, None);
        assert_eq!(upstream.write(&env.claim, wanted.clone(), now).await, Outcome::Skipped);
        assert_eq!(upstream.support(), Support::Absent);
        assert_eq!(upstream.write(&env.claim, wanted, now).await, Outcome::Skipped);
        Ok(())
    })
}

#[test]
fn on_1_37_the_union_reaches_pvc_status_health_status_where_the_gate_is_on() -> Result<()> {
    use health_controller::status::upstream::{shape, HealthStatusWriter, Outcome, Support};
    health_tests::multi_thread_runtime()?.block_on(async {
        for gate in [true, false] {
            let on = Server::Newest {
                volume_health_gate: gate,
            };
            let Some(env) = Env::start_on(on).await? else {
                return Ok(());
            };
            let controller = env.controller_client().await?;
            // A node's agent reports through its own entry, under the
            // policies as deploy/ ships them.
            env.node_api("node-a")
                .await?
                .put(
                    &env.claim,
                    &[node_entry(
                        "node-a",
                        vec![cond(Status::Degraded, "BlockIOErrors", Some(2))],
                    )],
                    SystemTime::now(),
                )
                .await?;
            let wanted = shape::wanted(&env.object().await?);
            let mut upstream = HealthStatusWriter::new(controller, None);
            let now = SystemTime::now();
            let first = upstream.write(&env.claim, wanted.clone(), now).await;
            let stored = env.health_status().await?;
            if !gate {
                // Accepted and dropped: learnt from the first answer, never
                // written again.
                assert_eq!(
                    (first, upstream.support()),
                    (Outcome::Skipped, Support::Dropped),
                    "{on:?}"
                );
                assert_eq!(stored, None, "{on:?}");
                assert_eq!(
                    upstream.write(&env.claim, wanted, now).await,
                    Outcome::Skipped
                );
                continue;
            }
            assert_eq!(
                (first, upstream.support()),
                (Outcome::Written, Support::Served),
                "{on:?}"
            );
            assert_eq!(
                stored,
                Some((
                    vec![(
                        "Degraded".to_string(),
                        "BlockIOErrors".to_string(),
                        "Node/node-a: BlockIOErrors message".to_string()
                    )],
                    Some("2026-11-24T10:00:00Z".to_string())
                )),
                "{on:?}"
            );
            // The same union again: nothing written.
            assert_eq!(
                upstream.write(&env.claim, wanted, now).await,
                Outcome::Unchanged
            );
            // Recovery: the node's entry clears, and so does the field.
            env.node_api("node-a")
                .await?
                .put(&env.claim, &[node_entry("node-a", vec![])], now)
                .await?;
            let wanted = shape::wanted(&env.object().await?);
            assert_eq!(
                upstream.write(&env.claim, wanted, now).await,
                Outcome::Written
            );
            // A new (empty) set: its transition is now.
            assert_eq!(
                env.health_status().await?,
                Some((vec![], Some(shape::to_time(now).0.to_string()))),
                "after recovery"
            );
        }
        Ok(())
    })
}

#[test]
fn each_node_marks_the_objects_it_has_entries_on_and_lists_only_those() -> Result<()> {
    health_tests::multi_thread_runtime()?.block_on(async {
        let Some(env) = Env::start().await? else {
            return Ok(());
        };
        let a = env.node_api("node-a").await?.with_node_label("node-a");
        let b = env.node_api("node-b").await?.with_node_label("node-b");
        let marks = |o: &VolumeHealth| -> Vec<String> {
            o.metadata
                .labels
                .iter()
                .flatten()
                .map(|(k, v)| format!("{k}={v}"))
                .collect()
        };
        // Listed as an agent lists them at its start: from the API server's
        // watch cache (resourceVersion 0), which may not hold yet a write
        // made a moment ago (seen once on a fresh machine: `left: []
        // right: ["data"]`). A list at the last object's own
        // resourceVersion, NotOlderThan, returns once the cache has caught
        // up with it, so the listing after it sees that write.
        let listed = |node: &'static str, seen: &VolumeHealth| {
            let admin = env.admin.clone();
            let rv = seen.metadata.resource_version.clone().unwrap_or_default();
            async move {
                Api::<VolumeHealth>::all(admin.clone())
                    .list_metadata(
                        &ListParams::default()
                            .at(&rv)
                            .matching(VersionMatch::NotOlderThan),
                    )
                    .await?;
                let selector = health_kube::node_label::volume_health_key(node);
                let found = status::list_selected(&admin, Some(&selector)).await?;
                anyhow::Ok(
                    found
                        .iter()
                        .map(|o| o.metadata.name.clone().unwrap_or_default())
                        .collect::<Vec<_>>(),
                )
            }
        };
        let raised = [node_entry(
            "node-a",
            vec![cond(Status::Degraded, "BlockIOErrors", Some(3))],
        )];
        a.put(&env.claim, &raised, SystemTime::now()).await?;
        let o = env.object().await?;
        assert_eq!(marks(&o), ["node.volume-health.io/node-a="]);
        // Each node finds the objects it has entries on, and no other node's.
        assert_eq!(listed("node-a", &o).await?, [PVC]);
        assert_eq!(listed("node-b", &o).await?, Vec::<String>::new());

        // A second node's entry adds its own mark under its own field manager.
        b.put(
            &env.claim,
            &[node_entry("node-b", vec![])],
            SystemTime::now(),
        )
        .await?;
        let o = env.object().await?;
        assert_eq!(
            marks(&o),
            [
                "node.volume-health.io/node-a=",
                "node.volume-health.io/node-b="
            ]
        );
        assert_eq!(listed("node-b", &o).await?, [PVC]);

        // A node's last entry goes, and its mark with it; the other's stays.
        a.put(&env.claim, &[], SystemTime::now()).await?;
        let o = env.object().await?;
        assert_eq!(names(&o), ["Node/node-b"]);
        assert_eq!(marks(&o), ["node.volume-health.io/node-b="]);
        assert_eq!(listed("node-a", &o).await?, Vec::<String>::new());

        // An object written before the marks existed (no label) gets it on
        // the next write of its claim, even one that changes nothing.
        let unmarked = json!({"apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
                              "metadata": {"name": PVC, "namespace": NS}});
        Api::<VolumeHealth>::namespaced(env.node_client("node-b").await?, NS)
            .patch(
                PVC,
                &PatchParams::apply(&status::node_manager("node-b")).force(),
                &Patch::Apply(&unmarked),
            )
            .await?;
        assert_eq!(marks(&env.object().await?), Vec::<String>::new());
        assert_eq!(
            b.put(
                &env.claim,
                &[node_entry("node-b", vec![])],
                SystemTime::now()
            )
            .await?,
            Put::Unchanged
        );
        assert_eq!(
            marks(&env.object().await?),
            ["node.volume-health.io/node-b="]
        );
        Ok(())
    })
}
