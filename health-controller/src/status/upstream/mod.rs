//! `pvc.status.healthStatus`: Kubernetes 1.37's field for the controller
//! side's view of a claim (KEP-1432 as merged, alpha behind the
//! `CSIVolumeHealth` feature gate). The controller writes there the union
//! of everything the claim's `VolumeHealth` object holds, the nodes'
//! kernel evidence included, so `kubectl get pvc -o yaml` shows a DataLoss
//! the kernel saw. The kubelet's `pod.status.volumeHealth` is never written.
//!
//! - [`shape`]: what the field should say (limits, `lastTransitionTime`);
//! - [`follow`]: the task that follows the `VolumeHealth` objects of this
//!   driver's claims and writes on change;
//! - [`HealthStatusWriter`]: one claim's write, by server-side apply of the
//!   typed object through the status subresource.
//!
//! Whether the server serves the field is learnt once, from the first write:
//! a server before 1.37 refuses it (`field not declared in schema`), one with
//! the gate off drops it from what it stores; either way the controller
//! stops for the rest of its leadership and says so once, at info level.
//! Where another field manager (external-health-monitor) owns a claim's
//! field, the apply conflicts (it is sent without force): the controller
//! leaves that claim's field to it, says so once, and counts the claims.

pub mod follow;
pub mod shape;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use health_kube::backoff::REQUEST_TIMEOUT;
use health_kube::status::{Claim, CONTROLLER_MANAGER};
use k8s_openapi::api::core::v1::{
    PersistentVolumeClaim, PersistentVolumeClaimStatus, VolumeHealthStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};

use crate::metrics::{ControllerMetrics, HealthStatusState};
use shape::Wanted;

/// The field's name in `PersistentVolumeClaimStatus`.
pub const FIELD: &str = "healthStatus";

/// What the server does with the field, once a write told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Support {
    /// No write yet.
    Unknown,
    /// Stored (1.37+ with `CSIVolumeHealth` on).
    Served,
    /// Refused: the server's schema has no such field (before 1.37).
    Absent,
    /// Accepted but not stored: the feature gate is off.
    Dropped,
}

/// One claim's field as this writer knows it.
#[derive(Clone, Debug)]
enum Known {
    /// What the server holds (`None`: no `healthStatus`).
    Stored(Option<VolumeHealthStatus>),
    /// Another field manager owns it: left alone.
    Yielded,
}

/// What one [`HealthStatusWriter::write`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Written,
    /// The server already says it.
    Unchanged,
    /// The server has no field, or another manager owns this claim's.
    Skipped,
    /// The request failed; the next change tries again.
    Failed,
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("{verb} persistentvolumeclaims {namespace}/{name}: {source}")]
    Api {
        verb: &'static str,
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{verb} persistentvolumeclaims {namespace}/{name}: no answer within {REQUEST_TIMEOUT:?}"
    )]
    Timeout {
        verb: &'static str,
        namespace: String,
        name: String,
    },
}

pub struct HealthStatusWriter {
    client: Client,
    metrics: Option<Arc<ControllerMetrics>>,
    support: Support,
    claims: HashMap<(String, String), Known>,
    told_yield: bool,
}

impl HealthStatusWriter {
    pub fn new(client: Client, metrics: Option<Arc<ControllerMetrics>>) -> Self {
        HealthStatusWriter {
            client,
            metrics,
            support: Support::Unknown,
            claims: HashMap::new(),
            told_yield: false,
        }
    }

    pub fn support(&self) -> Support {
        self.support
    }

    /// Forgets claims not in `keep` (no longer this driver's).
    pub fn retain(&mut self, keep: impl Fn(&str, &str) -> bool) {
        self.claims.retain(|(ns, name), _| keep(ns, name));
        self.publish();
    }

    /// Makes the claim's `healthStatus` say `wanted`, if the server has the
    /// field, nobody else owns it, and it says something else now. The first
    /// write for a claim reads what it holds (one GET), so that a restart
    /// neither rewrites an unchanged field nor moves its
    /// `lastTransitionTime`.
    pub async fn write(&mut self, claim: &Claim, wanted: Wanted, now: SystemTime) -> Outcome {
        if matches!(self.support, Support::Absent | Support::Dropped) {
            return Outcome::Skipped;
        }
        let key = (claim.namespace.clone(), claim.name.clone());
        let stored = match self.claims.get(&key) {
            Some(Known::Yielded) => return Outcome::Skipped,
            Some(Known::Stored(s)) => s.clone(),
            None if wanted.conditions.is_empty() && self.support == Support::Unknown => {
                // Nothing to say, and no sign yet that the field exists:
                // not worth a read.
                return Outcome::Unchanged;
            }
            None => match self.read(claim).await {
                Ok(Some(s)) => s,
                // The claim is gone: nothing to write.
                Ok(None) => return Outcome::Skipped,
                Err(e) => {
                    tracing::warn!("{e}; retried on the next change");
                    return Outcome::Failed;
                }
            },
        };
        let new = shape::next(stored.as_ref(), wanted, now);
        if !shape::differs(stored.as_ref(), &new) {
            self.claims.insert(key, Known::Stored(stored));
            return Outcome::Unchanged;
        }
        let outcome = match self.apply(claim, &new).await {
            Ok(pvc) => self.learn(key, &new, pvc),
            Err(WriteError::Api {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 409 && s.message.contains("conflict with") => {
                self.yield_to(key, claim, &s.message);
                Outcome::Skipped
            }
            Err(WriteError::Api {
                source: kube::Error::Api(s),
                ..
            }) if s.message.contains("not declared in schema") => {
                tracing::info!(
                    "this API server has no pvc.status.{FIELD} (it came with Kubernetes 1.37); \
                     writing VolumeHealth objects and Events only"
                );
                self.support = Support::Absent;
                Outcome::Skipped
            }
            Err(WriteError::Api {
                source: kube::Error::Api(s),
                ..
            }) if s.code == 404 || s.code == 409 => {
                // Gone, or recreated under the same name (uid precondition).
                self.claims.remove(&key);
                Outcome::Skipped
            }
            Err(e) => {
                tracing::warn!("writing pvc.status.{FIELD}: {e}; retried on the next change");
                // What the server holds is unknown now: read it again next time.
                self.claims.remove(&key);
                Outcome::Failed
            }
        };
        self.publish();
        outcome
    }

    /// What the server stored after a successful apply.
    fn learn(
        &mut self,
        key: (String, String),
        sent: &VolumeHealthStatus,
        pvc: PersistentVolumeClaim,
    ) -> Outcome {
        let stored = pvc.status.and_then(|s| s.health_status);
        let said = sent
            .health_conditions
            .as_ref()
            .is_some_and(|c| !c.is_empty());
        if said && stored.is_none() {
            tracing::info!(
                "this API server drops pvc.status.{FIELD} (feature gate CSIVolumeHealth off); \
                 writing VolumeHealth objects and Events only"
            );
            self.support = Support::Dropped;
            return Outcome::Skipped;
        }
        self.support = Support::Served;
        // The server may leave out an empty list; what was sent is what it means.
        self.claims.insert(key, Known::Stored(Some(sent.clone())));
        Outcome::Written
    }

    fn yield_to(&mut self, key: (String, String), claim: &Claim, message: &str) {
        if !self.told_yield {
            tracing::info!(
                "another writer owns pvc.status.{FIELD} of {}/{} ({message}); leaving the field \
                 to it on every claim where it writes, and reporting there through VolumeHealth \
                 objects and Events only",
                claim.namespace,
                claim.name
            );
            self.told_yield = true;
        }
        self.claims.insert(key, Known::Yielded);
    }

    /// The claims by state, on the metric.
    fn publish(&self) {
        let Some(m) = &self.metrics else { return };
        let yielded = self
            .claims
            .values()
            .filter(|k| matches!(k, Known::Yielded))
            .count();
        m.set_health_status(self.support_state(), yielded);
    }

    fn support_state(&self) -> HealthStatusState {
        match self.support {
            Support::Unknown => HealthStatusState::Unknown,
            Support::Served => HealthStatusState::Written,
            Support::Absent | Support::Dropped => HealthStatusState::Unsupported,
        }
    }

    /// The claim's `healthStatus` now; `Ok(None)`: no such claim.
    async fn read(&self, claim: &Claim) -> Result<Option<Option<VolumeHealthStatus>>, WriteError> {
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        let pvc = self.call("get", claim, api.get_opt(&claim.name)).await?;
        Ok(pvc
            .filter(|p| claim.uid.is_empty() || p.metadata.uid.as_deref() == Some(&claim.uid))
            .map(|p| p.status.and_then(|s| s.health_status)))
    }

    async fn apply(
        &self,
        claim: &Claim,
        status: &VolumeHealthStatus,
    ) -> Result<PersistentVolumeClaim, WriteError> {
        let body = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(claim.name.clone()),
                namespace: Some(claim.namespace.clone()),
                // A precondition: a claim recreated under the name is not this one.
                uid: (!claim.uid.is_empty()).then(|| claim.uid.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(PersistentVolumeClaimStatus {
                health_status: Some(status.clone()),
                ..PersistentVolumeClaimStatus::default()
            }),
        };
        let api: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &claim.namespace);
        // Not forced: a field another manager owns is a conflict, not ours.
        let params = PatchParams::apply(CONTROLLER_MANAGER);
        self.call(
            "patch",
            claim,
            api.patch_status(&claim.name, &params, &Patch::Apply(&body)),
        )
        .await
    }

    /// One request: bounded in time, its error typed (the client counts
    /// it: `health_kube::request_metrics`).
    async fn call<T>(
        &self,
        verb: &'static str,
        claim: &Claim,
        request: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, WriteError> {
        match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(source)) => Err(WriteError::Api {
                verb,
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                source,
            }),
            Err(_) => Err(WriteError::Timeout {
                verb,
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests;
