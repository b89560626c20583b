//! Whether the DaemonSet an agent runs in was removed (`helm uninstall`,
//! `kubectl delete -k deploy/`), asked once when the agent stops: only then
//! may it remove the kernel state it pinned on the node. A rolling update,
//! a node drain or an eviction stops the agent too, and the next agent on
//! the node adopts the pins and loses nothing; a pod cannot tell those from
//! an uninstall by its SIGTERM alone.
//!
//! The answer comes from one GET of the DaemonSet, by name. Helm deletes the
//! DaemonSet first and the agent's RBAC right after it, so by the time the
//! pods are stopped the agent may no longer be allowed to ask: a refusal
//! (401: its service account is gone; 403: its role or binding is) is an
//! uninstall too, since both were installed with the DaemonSet. Anything
//! else that fails (a timeout, an API server away) keeps the pins: lost
//! counts are worse than pins left behind, which `health-agent uninstall`
//! removes.

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::Api;

use crate::backoff::REQUEST_TIMEOUT;

/// What became of the agent's DaemonSet.
#[derive(Debug)]
pub enum DaemonSetFate {
    /// It is there and not being deleted: another agent takes over.
    Running,
    /// It was removed, or the agent's access with it; why, for the log.
    Removed(String),
    /// The question could not be answered.
    Unknown(String),
}

/// Asks the API server whether DaemonSet `namespace/name` still runs.
pub async fn daemonset_fate(client: kube::Client, namespace: &str, name: &str) -> DaemonSetFate {
    let api: Api<DaemonSet> = Api::namespaced(client, namespace);
    let asked = tokio::time::timeout(REQUEST_TIMEOUT, api.get_opt(name)).await;
    let what = format!("DaemonSet {namespace}/{name}");
    match asked {
        Err(_) => DaemonSetFate::Unknown(format!(
            "asking for {what}: no answer within {REQUEST_TIMEOUT:?}"
        )),
        Ok(Ok(None)) => DaemonSetFate::Removed(format!("{what} is gone")),
        Ok(Ok(Some(ds))) if ds.metadata.deletion_timestamp.is_some() => {
            DaemonSetFate::Removed(format!("{what} is being deleted"))
        }
        Ok(Ok(Some(_))) => DaemonSetFate::Running,
        Ok(Err(kube::Error::Api(e))) if e.code == 401 || e.code == 403 => {
            DaemonSetFate::Removed(format!(
                "the agent may no longer read {what} (HTTP {}: its service account or role went with it)",
                e.code
            ))
        }
        Ok(Err(e)) => DaemonSetFate::Unknown(format!("asking for {what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::testing::{self, respond};

    const PATH: &str = "/apis/apps/v1/namespaces/team-storage/daemonsets/volume-health-agent";

    fn status(code: u16, reason: &str) -> serde_json::Value {
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "message": reason, "reason": reason, "code": code})
    }

    fn daemonset(deleting: bool) -> serde_json::Value {
        let mut meta = json!({"name": "volume-health-agent", "namespace": "team-storage"});
        if deleting {
            meta["deletionTimestamp"] = json!("2026-12-02T14:00:00Z");
        }
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": meta})
    }

    /// One GET of the DaemonSet by name, and what each answer means.
    #[tokio::test]
    async fn each_answer_is_a_fate() {
        let cases: [(u16, serde_json::Value, &str); 5] = [
            (200, daemonset(false), "Running"),
            (200, daemonset(true), "Removed(\"DaemonSet team-storage/volume-health-agent is being deleted\")"),
            (404, status(404, "NotFound"), "Removed(\"DaemonSet team-storage/volume-health-agent is gone\")"),
            (403, status(403, "Forbidden"), "Removed(\"the agent may no longer read DaemonSet team-storage/volume-health-agent (HTTP 403: its service account or role went with it)\")"),
            (500, status(500, "InternalError"), "Unknown"),
        ];
        for (code, body, want) in cases {
            let (client, mut handle) = testing::client();
            let asked = tokio::spawn(daemonset_fate(
                client,
                "team-storage",
                "volume-health-agent",
            ));
            let (req, send) = testing::next(&mut handle).await;
            assert_eq!((req.method.as_str(), req.uri.as_str()), ("GET", PATH));
            respond(send, code, &body);
            let fate = format!("{:?}", asked.await.unwrap());
            assert!(fate.starts_with(want), "HTTP {code}: {fate}");
        }
    }
}
