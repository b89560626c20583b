//! What the agent wrote, read back as admin: its Events in the tests'
//! namespace, the claims' `VolumeHealth` objects and the health label.

use std::time::Duration;

use anyhow::Result;
use health_kube::status::VolumeHealth;
use health_tests::node_cluster::{poll, NodeCluster};
use k8s_openapi::api::core::v1::{Event, PersistentVolumeClaim};
use kube::api::{Api, DynamicObject};
use kube::core::ApiResource;
use serde_json::{json, Value};

use crate::workload::APP_NS;

/// `reportingComponent` of the agent's Events.
pub const COMPONENT: &str = "volume-health-agent";
pub const HEALTH_LABEL: &str = "volume-health.io/health";

/// An object Events are about: `("Pod", "web-0")`.
pub type Object<'a> = (&'a str, &'a str);

/// The agent's Events in the tests' namespace, as JSON, by name.
pub fn agent_events(cluster: &NodeCluster) -> Result<Vec<Value>> {
    let api = Api::<Event>::namespaced(cluster.admin.clone(), APP_NS);
    let list = cluster.block_on(api.list(&Default::default()))?;
    let mut events: Vec<Value> = list
        .items
        .into_iter()
        .filter(|e| e.reporting_component.as_deref() == Some(COMPONENT))
        .map(serde_json::to_value)
        .collect::<Result<_, _>>()?;
    events.sort_by(|a, b| {
        a["metadata"]["name"]
            .as_str()
            .cmp(&b["metadata"]["name"].as_str())
    });
    Ok(events)
}

/// The agent's Events about `object` with `reason`.
pub fn about<'e>(events: &'e [Value], object: Object<'_>, reason: &str) -> Vec<&'e Value> {
    events
        .iter()
        .filter(|e| {
            e["involvedObject"]["kind"] == object.0
                && e["involvedObject"]["name"] == object.1
                && e["reason"] == reason
        })
        .collect()
}

/// Waits until each of `objects` has exactly one `reason` Event with
/// `count`; returns them in that order.
pub fn wait_counts(
    cluster: &NodeCluster,
    objects: &[Object<'_>],
    reason: &str,
    count: i64,
    within: Duration,
) -> Result<Vec<Value>> {
    poll(
        &format!("one {reason} Event with count {count} on each of {objects:?}"),
        within,
        || {
            let events = agent_events(cluster)?;
            let found: Vec<Value> = objects
                .iter()
                .filter_map(|o| match about(&events, *o, reason).as_slice() {
                    [e] if e["count"] == count => Some((*e).clone()),
                    _ => None,
                })
                .collect();
            Ok(if found.len() == objects.len() {
                Ok(found)
            } else {
                Err(format!("{:#}", Value::Array(events)))
            })
        },
    )
}

/// `(name, uid)` of each Event: the same pair later is the same object,
/// patched.
pub use health_tests::real_cluster::identities;

/// Every Event the agent wrote in the namespace, as
/// `(kind, name, type, reason, count)`, sorted.
pub fn tally(events: &[Value]) -> Vec<(String, String, String, String, i64)> {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    let mut all: Vec<_> = events
        .iter()
        .map(|e| {
            (
                s(&e["involvedObject"]["kind"]),
                s(&e["involvedObject"]["name"]),
                s(&e["type"]),
                s(&e["reason"]),
                e["count"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    all.sort();
    all
}

fn volume_health_api(cluster: &NodeCluster) -> Api<DynamicObject> {
    let resource = ApiResource::erase::<VolumeHealth>(&());
    Api::namespaced_with(cluster.admin.clone(), APP_NS, &resource)
}

/// The VolumeHealth of claim `pvc` (`null` when there is none).
pub fn volume_health(cluster: &NodeCluster, pvc: &str) -> Result<Value> {
    Ok(
        match cluster.block_on(volume_health_api(cluster).get_opt(pvc))? {
            Some(o) => serde_json::to_value(o)?,
            None => Value::Null,
        },
    )
}

/// The VolumeHealth of `pvc` once `done` holds for it.
pub fn wait_volume_health(
    cluster: &NodeCluster,
    pvc: &str,
    what: &str,
    within: Duration,
    done: impl Fn(&Value) -> bool,
) -> Result<Value> {
    poll(
        &format!("VolumeHealth {APP_NS}/{pvc} to be {what}"),
        within,
        || {
            let now = volume_health(cluster, pvc)?;
            Ok(if done(&now) {
                Ok(now)
            } else {
                Err(format!("{now:#}"))
            })
        },
    )
}

/// `status.conditions` as `(type, status, reason)`.
pub fn conditions(vh: &Value) -> Vec<(String, String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    vh["status"]["conditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| (s(&c["type"]), s(&c["status"]), s(&c["reason"])))
                .collect()
        })
        .unwrap_or_default()
}

/// The entry of `status.sources` named `name` (`Node/<node>`), or null.
pub fn source<'v>(vh: &'v Value, name: &str) -> &'v Value {
    vh["status"]["sources"]
        .as_array()
        .and_then(|s| s.iter().find(|e| e["name"] == name))
        .unwrap_or(&Value::Null)
}

/// Names of `status.sources`, in order.
pub fn source_names(vh: &Value) -> Vec<String> {
    vh["status"]["sources"]
        .as_array()
        .map(|s| {
            s.iter()
                .map(|e| e["name"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until claim `pvc`'s health label is `want` (`None`: no label),
/// its other labels kept.
pub fn wait_label(cluster: &NodeCluster, pvc: &str, want: Option<&str>) -> Result<()> {
    let api = Api::<PersistentVolumeClaim>::namespaced(cluster.admin.clone(), APP_NS);
    poll(
        &format!("PVC {pvc}'s label {HEALTH_LABEL} to be {want:?}"),
        Duration::from_secs(15),
        || {
            let c = cluster.block_on(api.get(pvc))?;
            let labels = c.metadata.labels.unwrap_or_default();
            let mut expected =
                std::collections::BTreeMap::from([("app".to_string(), "e2e".to_string())]);
            if let Some(w) = want {
                expected.insert(HEALTH_LABEL.to_string(), w.to_string());
            }
            Ok(if labels == expected {
                Ok(())
            } else {
                Err(format!("{labels:?}"))
            })
        },
    )
}

/// The value of Prometheus sample `series` (name and labels exactly) in
/// `text`, 0 when absent.
pub fn sample(text: &str, series: &str) -> f64 {
    health_tests::kubelet::sample(text, series).unwrap_or(0.0)
}

/// Fails unless the agent's Events are exactly `want`:
/// `(kind, name, type, reason, count)`, where a count of `None` is any.
pub fn check_tally(events: &[Value], want: &[(&str, &str, &str, &str, Option<i64>)]) -> Result<()> {
    let have = tally(events);
    let mut want: Vec<_> = want.to_vec();
    want.sort_by_key(|w| (w.0, w.1, w.2, w.3));
    let matches = have.len() == want.len()
        && have.iter().zip(&want).all(|(h, w)| {
            (h.0.as_str(), h.1.as_str(), h.2.as_str(), h.3.as_str()) == (w.0, w.1, w.2, w.3)
                && w.4.is_none_or(|c| c == h.4)
        });
    anyhow::ensure!(matches, "the agent's Events are {have:?}, not {want:?}");
    Ok(())
}

/// `{"apiVersion": "v1", "kind": ..., "name": ..., "uid": ...}` of an owner.
pub fn owner(kind: &str, name: &str, uid: &str) -> Value {
    json!({"apiVersion": "v1", "kind": kind, "name": name, "uid": uid})
}
