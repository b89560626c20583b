//! `pvc.status.healthStatus`: the upstream place for the controller side's
//! view of a claim (the 2026 revision of KEP-1432; alpha behind the
//! `CSIVolumeHealth` feature gate, and absent from k8s-openapi, so the body
//! is raw JSON). Written through the PVC's status subresource by
//! server-side apply under the controller's field manager, as a list of
//! `(status, reason, message, lastTransitionTime)`; the kubelet's
//! `pod.status.volumeHealth` is never written.
//!
//! Whether the server has the field is learnt from the first write: a
//! server without it refuses the field (`field not declared in schema`),
//! one with the gate off drops it from what it stores. Either way the
//! controller stops trying for the rest of its leadership.

use std::collections::HashMap;
use std::sync::Arc;

use health_core::conditions::Condition;
use health_kube::status::{types, Claim, CONTROLLER_MANAGER};
use health_kube::writer::{Observer, REQUEST_TIMEOUT};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{json, Value};

/// The field's name in `PersistentVolumeClaimStatus`.
pub const FIELD: &str = "healthStatus";

pub struct HealthStatusWriter {
    client: Client,
    observer: Option<Arc<dyn Observer>>,
    /// `None` until a write tells; `Some(false)`: the server lacks the field.
    supported: Option<bool>,
    /// What each claim has from this writer (write on change only).
    written: HashMap<(String, String), Value>,
}

impl HealthStatusWriter {
    pub fn new(client: Client, observer: Option<Arc<dyn Observer>>) -> Self {
        HealthStatusWriter {
            client,
            observer,
            supported: None,
            written: HashMap::new(),
        }
    }

    pub fn supported(&self) -> Option<bool> {
        self.supported
    }

    /// Makes the claim's `healthStatus` say `conditions` (empty: none).
    pub async fn write(&mut self, claim: &Claim, conditions: &[Condition]) {
        if self.supported == Some(false) {
            return;
        }
        let key = (claim.namespace.clone(), claim.name.clone());
        let list = health_status(conditions);
        let previous = self.written.get(&key);
        if previous == Some(&list) || (previous.is_none() && list == json!([])) {
            return;
        }
        let body = json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
            "status": {FIELD: list},
        });
        // Dynamic: k8s-openapi's type would drop the field it lacks.
        let resource = ApiResource::erase::<PersistentVolumeClaim>(&());
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &claim.namespace, &resource);
        let params = PatchParams::apply(CONTROLLER_MANAGER).force();
        let result = tokio::time::timeout(
            REQUEST_TIMEOUT,
            api.patch_status(&claim.name, &params, &Patch::Apply(&body)),
        )
        .await;
        let code = match &result {
            Ok(Ok(_)) => Some(200),
            Ok(Err(kube::Error::Api(s))) => Some(s.code),
            _ => None,
        };
        if let Some(o) = &self.observer {
            o.api_request("patch", "persistentvolumeclaims/status", code);
        }
        match result {
            Ok(Ok(pvc)) => {
                // A gate that is off drops the field: the stored object tells.
                let stored = pvc.data.pointer(&format!("/status/{FIELD}")).cloned();
                if list != json!([]) && stored.is_none() {
                    tracing::info!("this API server drops pvc.status.{FIELD} (CSIVolumeHealth off); writing VolumeHealth objects only");
                    self.supported = Some(false);
                    return;
                }
                self.supported = Some(true);
                self.written.insert(key, list);
            }
            Ok(Err(kube::Error::Api(s)))
                if s.message.contains("not declared in schema") || s.message.contains(FIELD) =>
            {
                tracing::info!(
                    "this API server has no pvc.status.{FIELD} (before the 2026 KEP-1432 API); writing VolumeHealth objects only"
                );
                self.supported = Some(false);
            }
            Ok(Err(e)) => tracing::warn!(
                "writing pvc.status.{FIELD} of {}/{}: {e}; retried on the next change",
                claim.namespace,
                claim.name
            ),
            Err(_) => tracing::warn!(
                "writing pvc.status.{FIELD} of {}/{}: no answer within {REQUEST_TIMEOUT:?}",
                claim.namespace,
                claim.name
            ),
        }
    }
}

/// The upstream shape: one entry per `(status, reason)`, worst first.
pub fn health_status(conditions: &[Condition]) -> Value {
    let mut c: Vec<&Condition> = conditions.iter().collect();
    c.sort_by(|a, b| (a.status, &a.reason).cmp(&(b.status, &b.reason)));
    c.dedup_by(|a, b| a.status == b.status && a.reason == b.reason);
    Value::Array(
        c.into_iter()
            .map(|c| {
                json!({
                    "status": c.status.to_string(),
                    "reason": c.reason,
                    "message": types::bounded(c.message.clone(), types::MAX_MESSAGE),
                    "lastTransitionTime": types::time(c.since),
                })
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    //! The exact requests against kube's mock service (the real 1.26 server
    //! has no such field; tests/tests/apiserver_status.rs checks it refuses it).
    use std::time::{Duration, UNIX_EPOCH};

    use health_core::conditions::{Source, Status};
    use health_kube::testing::MockApi;
    use serde_json::{json, Value};

    use super::*;

    /// Answers every request with `answer(body)`; records them.
    fn server(answer: fn(&Value) -> (u16, Value)) -> (Client, MockApi) {
        MockApi::start(move |req| answer(&req.body))
    }

    fn claim() -> Claim {
        Claim {
            namespace: "shop".into(),
            name: "data".into(),
            uid: "u-1".into(),
            pv: Some("pv-1".into()),
        }
    }

    fn condition() -> Condition {
        Condition {
            source: Source::CsiController,
            status: Status::Inaccessible,
            reason: "VolumeGone".into(),
            message: "gone from the backend".into(),
            since: health_core::testing::t(0),
            last_probe: UNIX_EPOCH + Duration::from_secs(1_800_000_100),
            occurrences: None,
        }
    }

    const URI: &str = "/api/v1/namespaces/shop/persistentvolumeclaims/data/status?&force=true&fieldManager=volume-health-controller";

    #[tokio::test]
    async fn a_server_with_the_field_gets_it_on_change_only() {
        let (client, api) = server(|body| (200, body.clone()));
        let mut w = HealthStatusWriter::new(client, None);
        w.write(&claim(), &[]).await;
        assert!(api.seen().is_empty(), "nothing to say, nothing written");
        w.write(&claim(), &[condition()]).await;
        w.write(&claim(), &[condition()]).await;
        assert_eq!(w.supported(), Some(true));
        w.write(&claim(), &[]).await;
        let seen = api.seen();
        assert_eq!(seen.len(), 2, "{seen:#?}");
        assert_eq!(
            (seen[0].method.as_str(), seen[0].uri.as_str()),
            ("PATCH", URI)
        );
        assert_eq!(
            seen[0].body,
            json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "namespace": "shop", "uid": "u-1"},
                "status": {"healthStatus": [{
                    "status": "Inaccessible", "reason": "VolumeGone",
                    "message": "gone from the backend",
                    "lastTransitionTime": "2027-01-15T08:00:00Z",
                }]},
            })
        );
        assert_eq!(
            seen[1].body["status"]["healthStatus"],
            json!([]),
            "recovery empties it"
        );
    }

    #[tokio::test]
    async fn a_server_without_the_field_is_asked_once() {
        let (client, api) = server(|_| {
            (
                500,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 500,
                       "message": "failed to create typed patch object (shop/data; /v1, Kind=PersistentVolumeClaim): .status.healthStatus: field not declared in schema"}),
            )
        });
        let mut w = HealthStatusWriter::new(client, None);
        w.write(&claim(), &[condition()]).await;
        assert_eq!(w.supported(), Some(false));
        let mut other = claim();
        other.name = "logs".into();
        w.write(&other, &[condition()]).await;
        assert_eq!(api.seen().len(), 1);
    }

    #[tokio::test]
    async fn a_server_that_drops_the_field_is_asked_once() {
        // The feature gate off: the field is known but not stored.
        let (client, api) = server(|body| {
            let mut stored = body.clone();
            stored["status"] = json!({"phase": "Bound"});
            (200, stored)
        });
        let mut w = HealthStatusWriter::new(client, None);
        w.write(&claim(), &[condition()]).await;
        w.write(&claim(), &[]).await;
        assert_eq!(w.supported(), Some(false));
        assert_eq!(api.seen().len(), 1);
    }
}
