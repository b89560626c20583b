//! The requests behind one `VolumeHealth` write: read the object (create it
//! if a condition needs it), put this writer's entries by server-side apply
//! under its own field manager, with the union recomputed against the
//! version read (its `resourceVersion` is the apply's precondition: a write
//! on a stale view is refused, re-read and redone, so no writer clears what
//! another asserts), then keep the PVC's label in step.

use std::sync::Arc;
use std::time::SystemTime;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

use super::aggregate;
use super::types::{
    self, Claim, SourceEntry, VolumeHealth, API_VERSION, HEALTHY, HEALTH_LABEL, KIND,
};
use crate::backoff::REQUEST_TIMEOUT;
use crate::observer::Observer;

/// Field manager of the object itself (owner reference, spec): every
/// writer applies the same, so creating it twice is harmless.
pub const OBJECT_MANAGER: &str = "volume-health";
/// Field manager of the PVC label, shared by all writers: whoever changes
/// the union sets it, and applying without it removes it.
pub const LABEL_MANAGER: &str = "volume-health-label";
/// Attempts of one write against concurrent writers before it is retried
/// later.
const MAX_ATTEMPTS: usize = 5;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Put {
    /// The server already says what this writer would write.
    Unchanged,
    /// Written; the union's health after the write.
    Written { health: String },
    /// No object, and nothing to assert: nothing to do.
    NoObject,
}

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    // The cause is in the message and not a `source()` as well: printed as
    // a chain, it would appear twice.
    #[error("{verb} {resource} {name}: {error}")]
    Api {
        verb: &'static str,
        resource: &'static str,
        name: String,
        error: kube::Error,
    },
    #[error("{verb} {resource} {name}: no answer within {REQUEST_TIMEOUT:?}")]
    Timeout {
        verb: &'static str,
        resource: &'static str,
        name: String,
    },
    #[error("{0}: still modified by other writers after {MAX_ATTEMPTS} attempts")]
    Contended(String),
}

impl StatusError {
    /// Worth trying again later (the server was away, busy or contended);
    /// anything else is a refusal a retry would not change (RBAC, schema).
    pub fn retryable(&self) -> bool {
        match self {
            StatusError::Api {
                error: kube::Error::Api(s),
                ..
            } => s.code == 409 || s.code == 429 || s.code >= 500,
            _ => true,
        }
    }
}

/// Writes the entries of one writer (a node's agent, or the controller).
#[derive(Clone)]
pub struct StatusApi {
    client: Client,
    /// This writer's field manager, e.g. `volume-health-agent.node-a`.
    manager: String,
    /// The names of the entries this writer may write (`Node/node-a`,
    /// `CSIDriver/node-a`); the admission policy holds it to them.
    owned: Vec<String>,
    /// A node's agent: the label it keeps on the objects where it has
    /// entries (`crate::node_label::volume_health_key`), so that it finds
    /// them after a restart without listing every node's. `None`: the
    /// controller, which lists them all anyway.
    node_key: Option<String>,
    observer: Option<Arc<dyn Observer>>,
}

impl StatusApi {
    pub fn new(
        client: Client,
        manager: String,
        owned: Vec<String>,
        observer: Option<Arc<dyn Observer>>,
    ) -> Self {
        StatusApi {
            client,
            manager,
            owned,
            node_key: None,
            observer,
        }
    }

    /// Keeps `node`'s label on the objects where this writer has entries
    /// (a node's agent; see `crate::node_label`).
    pub fn with_node_label(mut self, node: &str) -> Self {
        self.node_key = Some(crate::node_label::volume_health_key(node));
        self
    }

    /// The label selector of the objects this writer has entries on, for a
    /// node's agent.
    pub fn node_selector(&self) -> Option<&str> {
        self.node_key.as_deref()
    }

    pub fn owned(&self) -> &[String] {
        &self.owned
    }

    /// Tells the observer how a write of `entries` on `claim` ended
    /// (`None`: refused).
    pub fn report(&self, claim: &Claim, entries: Option<&[SourceEntry]>) {
        if let Some(o) = &self.observer {
            o.volume_health_written(claim, entries);
        }
    }

    /// Makes `entries` this writer's whole part of the claim's object (an
    /// entry it wrote before and that is not in `entries` is removed).
    pub async fn put(
        &self,
        claim: &Claim,
        entries: &[SourceEntry],
        now: SystemTime,
    ) -> Result<Put, StatusError> {
        let asserts = entries.iter().any(|e| !e.conditions.is_empty());
        for _ in 0..MAX_ATTEMPTS {
            let current = match self.get(claim).await? {
                Some(o) => o,
                None if !asserts => return Ok(Put::NoObject),
                None => self.create(claim).await?,
            };
            let before = current.status.clone().unwrap_or_default();
            let owned = |e: &&SourceEntry| self.owned.contains(&e.name);
            let mut sources: Vec<SourceEntry> = before
                .sources
                .iter()
                .filter(|e| !owned(e))
                .cloned()
                .collect();
            sources.extend(entries.iter().cloned());
            let generation = current.metadata.generation;
            let conditions =
                aggregate::conditions(&sources, &before.conditions, generation, &types::time(now));
            let summary = aggregate::summary(&sources, &conditions);
            let theirs_unchanged = {
                // Ours are sent sorted by name; the server keeps its own order.
                let mut old: Vec<&SourceEntry> = before.sources.iter().filter(owned).collect();
                old.sort_by(|a, b| a.name.cmp(&b.name));
                old.len() == entries.len()
                    && old.iter().zip(entries).all(|(a, b)| a.same_assertions(b))
            };
            let summary_unchanged = before.health.as_deref() == Some(summary.health.as_str())
                && before.reason.as_deref().unwrap_or("") == summary.reason
                && before.since == summary.since
                && before.nodes.as_deref().unwrap_or("") == summary.nodes;
            if theirs_unchanged && before.conditions == conditions && summary_unchanged {
                // An object written before the node label existed gets it
                // on the next write of its claim.
                self.follow_node_label(claim, &current, !entries.is_empty())
                    .await?;
                return Ok(Put::Unchanged);
            }
            let mut status = json!({
                "health": summary.health,
                "reason": summary.reason,
                "nodes": summary.nodes,
                "conditions": conditions,
                "sources": entries,
            });
            if let Some(since) = &summary.since {
                status["since"] = json!(since);
            }
            let body = apply_body(
                claim,
                json!({"resourceVersion": current.metadata.resource_version}),
                "status",
                status,
            );
            match self.apply_status(claim, &body).await {
                Ok(()) => {}
                // Another writer came first: read again, recompute.
                Err(StatusError::Api {
                    error: kube::Error::Api(s),
                    ..
                }) if s.code == 409 => continue,
                Err(e) => return Err(e),
            }
            self.follow_node_label(claim, &current, !entries.is_empty())
                .await?;
            let was = before.health.as_deref().unwrap_or(HEALTHY);
            if was != summary.health {
                self.follow_label(claim, &summary.health).await?;
            }
            return Ok(Put::Written {
                health: summary.health,
            });
        }
        Err(StatusError::Contended(format!(
            "{}/{}",
            claim.namespace, claim.name
        )))
    }

    async fn get(&self, claim: &Claim) -> Result<Option<VolumeHealth>, StatusError> {
        let api: Api<VolumeHealth> = Api::namespaced(self.client.clone(), &claim.namespace);
        let r = self
            .call(
                "get",
                "volumehealths",
                &claim.name,
                api.get_opt(&claim.name),
            )
            .await?;
        Ok(r)
    }

    async fn create(&self, claim: &Claim) -> Result<VolumeHealth, StatusError> {
        let api: Api<VolumeHealth> = Api::namespaced(self.client.clone(), &claim.namespace);
        let mut spec = json!({ "persistentVolumeClaimName": claim.name });
        if let Some(pv) = &claim.pv {
            spec["persistentVolumeName"] = json!(pv);
        }
        let owner = json!({"ownerReferences": [{
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "name": claim.name,
            "uid": claim.uid,
        }]});
        let body = apply_body(claim, owner, "spec", spec);
        let params = PatchParams::apply(OBJECT_MANAGER).force();
        self.call(
            "patch",
            "volumehealths",
            &claim.name,
            api.patch(&claim.name, &params, &Patch::Apply(&body)),
        )
        .await
    }

    async fn apply_status(&self, claim: &Claim, body: &Value) -> Result<(), StatusError> {
        let api: Api<VolumeHealth> = Api::namespaced(self.client.clone(), &claim.namespace);
        let params = PatchParams::apply(&self.manager).force();
        self.call(
            "patch",
            "volumehealths/status",
            &claim.name,
            api.patch_status(&claim.name, &params, &Patch::Apply(body)),
        )
        .await
        .map(drop)
    }

    /// Puts the node label on the object while this writer has entries
    /// there (`ours`), and takes it off with the last one: one apply under
    /// this writer's own field manager on the main resource (the status
    /// subresource ignores metadata), made only when the label is not
    /// already as it should be.
    async fn follow_node_label(
        &self,
        claim: &Claim,
        current: &VolumeHealth,
        ours: bool,
    ) -> Result<(), StatusError> {
        let Some(key) = &self.node_key else {
            return Ok(());
        };
        let labelled = current
            .metadata
            .labels
            .as_ref()
            .is_some_and(|l| l.contains_key(key));
        if labelled == ours {
            return Ok(());
        }
        // Applied without the label, the field manager's label goes.
        let mut metadata = json!({"name": claim.name, "namespace": claim.namespace});
        if ours {
            metadata["labels"] = json!({ key: "" });
        }
        let body = json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata});
        let api: Api<VolumeHealth> = Api::namespaced(self.client.clone(), &claim.namespace);
        let params = PatchParams::apply(&self.manager).force();
        self.call(
            "patch",
            "volumehealths",
            &claim.name,
            api.patch(&claim.name, &params, &Patch::Apply(&body)),
        )
        .await
        .map(drop)
    }

    /// Sets the PVC's label to `health`, then reads the object again: a
    /// writer that changed the union meanwhile may have set the label before
    /// this one did, so the label follows the latest union, not the last
    /// label write.
    async fn follow_label(&self, claim: &Claim, health: &str) -> Result<(), StatusError> {
        let mut health = health.to_string();
        for _ in 0..MAX_ATTEMPTS {
            self.label(claim, &health).await?;
            let now = self
                .get(claim)
                .await?
                .and_then(|o| o.status)
                .and_then(|s| s.health)
                .unwrap_or_else(|| HEALTHY.to_string());
            if now == health {
                return Ok(());
            }
            health = now;
        }
        Err(StatusError::Contended(format!(
            "label of {}/{}",
            claim.namespace, claim.name
        )))
    }

    async fn label(&self, claim: &Claim, health: &str) -> Result<(), StatusError> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        let mut metadata = json!({ "name": claim.name, "namespace": claim.namespace });
        if !claim.uid.is_empty() {
            // A precondition: a PVC recreated under the same name is not ours.
            metadata["uid"] = json!(claim.uid);
        }
        if health != HEALTHY {
            metadata["labels"] = json!({ HEALTH_LABEL: health });
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": metadata,
        });
        let params = PatchParams::apply(LABEL_MANAGER).force();
        self.call(
            "patch",
            "persistentvolumeclaims",
            &claim.name,
            api.patch(&claim.name, &params, &Patch::Apply(&body)),
        )
        .await
        .map(drop)
    }

    /// One request: bounded in time, its error typed (the client counts
    /// it: `crate::request_metrics`).
    async fn call<T>(
        &self,
        verb: &'static str,
        resource: &'static str,
        name: &str,
        request: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, StatusError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(error)) => Err(StatusError::Api {
                verb,
                resource,
                name: name.to_string(),
                error,
            }),
            Err(_) => Err(StatusError::Timeout {
                verb,
                resource,
                name: name.to_string(),
            }),
        }
    }
}

/// A server-side apply body for the claim's `VolumeHealth`: its name and
/// namespace with `metadata` added, and one top-level `field`.
fn apply_body(claim: &Claim, metadata: Value, field: &str, value: Value) -> Value {
    let mut meta = json!({"name": claim.name, "namespace": claim.namespace});
    if let (Some(m), Value::Object(extra)) = (meta.as_object_mut(), metadata) {
        m.extend(extra);
    }
    json!({"apiVersion": API_VERSION, "kind": KIND, "metadata": meta, field: value})
}
