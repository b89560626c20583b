//! The cluster the scale benchmark measures in, as the admin writes it:
//! realistic CSI PVs (as external-provisioner and the PV controller leave
//! them), bound claims, pods spread over [`NODES`] nodes (10 each), the
//! agent Events and `VolumeHealth` objects other nodes' agents wrote, and
//! kubelet Events. Everything but the PVs is made once; the PVs grow
//! between measurements (1,000, then 10,000, ...).
//!
//! Node `node-NNN` (1-based) runs pods `10·(NNN-1)` to `10·NNN-1`; pod `j`
//! uses claim `j` (bound to PV `j`) when `j < CLAIMS`, else an emptyDir.
//! The measured agents run as nodes 1 to 50, whose pods all have claims;
//! the agent Events and `VolumeHealth` entries are those of nodes 51 and
//! up.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures_util::{stream, StreamExt as _, TryStreamExt as _};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::Client;
use serde_json::{json, Value};

use crate::bench::controller::cluster::{claim_name, handle};
use crate::bench::controller::DRIVER;

pub const NODES: usize = 200;
pub const PODS_PER_NODE: usize = 10;
pub const PODS: usize = NODES * PODS_PER_NODE;
/// Claims (and pods using one): pods 0..CLAIMS.
pub const CLAIMS: usize = 1000;
pub const NAMESPACES: usize = 20;
pub const AGENT_EVENTS: usize = 2000;
/// With the agents' Events, 100,000: a busy cluster's hour of Events
/// (issue 40 measures an agent's start against that many).
pub const KUBELET_EVENTS: usize = 98_000;
pub const VOLUME_HEALTHS: usize = 500;
/// The first node whose agent wrote Events and `VolumeHealth` entries: the
/// measured agents are nodes below it.
pub const FIRST_OTHER_NODE: usize = 51;
/// The agent's `reportingComponent` (health_kube::events::COMPONENT).
const AGENT_COMPONENT: &str = "volume-health-agent";
/// The label the agent puts on its Events (issue 29).
pub const EVENT_NODE_LABEL: &str = "volume-health.io/node";
/// The label prefix of a `VolumeHealth` a node's agent has entries on.
pub const VH_NODE_LABEL_PREFIX: &str = "node.volume-health.io/";

pub fn node_name(n: usize) -> String {
    format!("node-{n:03}")
}
/// The node pod `j` runs on.
pub fn pod_node(j: usize) -> usize {
    j / PODS_PER_NODE + 1
}
pub fn namespace(j: usize) -> String {
    format!("app-{:02}", j * NAMESPACES / PODS.max(CLAIMS))
}
pub fn pod_name(j: usize) -> String {
    format!("app-{j:04}")
}
/// PV `i`: named as external-provisioner names them (`pvc-<claim uid>`).
pub fn pv_name(i: usize) -> String {
    format!("pvc-5ca1e000-0000-4000-8000-{i:012}")
}
fn claim_uid(i: usize) -> String {
    format!("c1a10000-0000-4000-8000-{i:012}")
}

/// The pod UIDs the server gave, by pod number, and what setting up took.
pub struct Base {
    pub pod_uids: Vec<String>,
    pub took: Vec<(&'static str, usize, Duration)>,
}

fn core(kind: &str) -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: format!("{}s", kind.to_lowercase()),
    }
}

fn volume_health() -> ApiResource {
    ApiResource {
        group: "volume-health.io".into(),
        version: "v1alpha1".into(),
        api_version: "volume-health.io/v1alpha1".into(),
        kind: "VolumeHealth".into(),
        plural: "volumehealths".into(),
    }
}

fn api(client: &Client, resource: &ApiResource, ns: Option<&str>) -> Api<DynamicObject> {
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
        None => Api::all_with(client.clone(), resource),
    }
}

fn object(resource: &ApiResource, mut body: Value) -> Result<DynamicObject> {
    body["apiVersion"] = json!(resource.api_version);
    body["kind"] = json!(resource.kind);
    serde_json::from_value(body).context("an object as JSON")
}

fn post(manager: &str) -> PostParams {
    PostParams {
        field_manager: Some(manager.into()),
        ..PostParams::default()
    }
}

/// Runs `each(i)` for `0..count`, `in_flight` at a time.
async fn concurrently<F, Fut, T>(
    range: std::ops::Range<usize>,
    in_flight: usize,
    each: F,
) -> Result<Vec<T>>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(usize, T)>>,
    T: Default + Clone,
{
    let start = range.start;
    let mut out = vec![T::default(); range.len()];
    let done: Vec<(usize, T)> = stream::iter(range)
        .map(each)
        .buffer_unordered(in_flight.max(1))
        .try_collect()
        .await?;
    for (i, v) in done {
        out[i - start] = v;
    }
    Ok(out)
}

/// Namespaces, their `default` ServiceAccounts, Nodes, claims, pods,
/// Events and `VolumeHealth` objects (every PV a claim is bound to is
/// created with the first PVs, by [`pvs`]).
pub async fn base(client: &Client, in_flight: usize) -> Result<Base> {
    let mut took = Vec::new();
    let t = Instant::now();
    for n in 0..NAMESPACES {
        let ns = format!("app-{n:02}");
        api(client, &core("Namespace"), None)
            .create(
                &post("kubectl-create"),
                &object(&core("Namespace"), json!({"metadata": {"name": ns}}))?,
            )
            .await
            .with_context(|| format!("creating namespace {ns}"))?;
        // The ServiceAccount admission plugin refuses pods without it (no
        // controller-manager here makes it).
        api(client, &core("ServiceAccount"), Some(&ns))
            .create(
                &post("kube-controller-manager"),
                &object(
                    &core("ServiceAccount"),
                    json!({"metadata": {"name": "default"}}),
                )?,
            )
            .await
            .with_context(|| format!("creating {ns}/default"))?;
    }
    took.push(("namespaces", NAMESPACES, t.elapsed()));

    let t = Instant::now();
    concurrently(1..NODES + 1, in_flight, |n| async move {
        api(client, &core("Node"), None)
            .create(&post("kubelet"), &object(&core("Node"), node(n))?)
            .await
            .with_context(|| format!("creating node {}", node_name(n)))?;
        anyhow::Ok((n, ()))
    })
    .await?;
    took.push(("nodes", NODES, t.elapsed()));

    let t = Instant::now();
    concurrently(0..CLAIMS, in_flight, |i| async move {
        let ns = namespace(i);
        let pvcs = api(client, &core("PersistentVolumeClaim"), Some(&ns));
        pvcs.create(
            &post("kubectl-client-side-apply"),
            &object(&core("PersistentVolumeClaim"), claim(i))?,
        )
        .await
        .with_context(|| format!("creating claim {ns}/{}", claim_name(i)))?;
        let status = json!({"status": {"phase": "Bound", "accessModes": ["ReadWriteOnce"],
                                       "capacity": {"storage": "10Gi"}}});
        pvcs.patch_status(
            &claim_name(i),
            &PatchParams {
                field_manager: Some("kube-controller-manager".into()),
                ..Default::default()
            },
            &Patch::Merge(&status),
        )
        .await
        .with_context(|| format!("binding claim {ns}/{}", claim_name(i)))?;
        anyhow::Ok((i, ()))
    })
    .await?;
    took.push(("claims (bound)", CLAIMS, t.elapsed()));

    let t = Instant::now();
    let pod_uids = concurrently(0..PODS, in_flight, |j| async move {
        let created = api(client, &core("Pod"), Some(&namespace(j)))
            .create(
                &post("kube-controller-manager"),
                &object(&core("Pod"), pod(j))?,
            )
            .await
            .with_context(|| format!("creating pod {}", pod_name(j)))?;
        let uid = created.metadata.uid.context("a pod without a uid")?;
        anyhow::Ok((j, uid))
    })
    .await?;
    took.push(("pods", PODS, t.elapsed()));

    let t = Instant::now();
    concurrently(0..AGENT_EVENTS, in_flight, |e| {
        let uids = &pod_uids;
        async move {
            let (ns, body) = agent_event(e, uids);
            api(client, &core("Event"), Some(&ns))
                .create(&post("volume-health-agent"), &object(&core("Event"), body)?)
                .await
                .with_context(|| format!("creating agent Event {e}"))?;
            anyhow::Ok((e, ()))
        }
    })
    .await?;
    took.push(("agent Events of other nodes", AGENT_EVENTS, t.elapsed()));

    let t = Instant::now();
    concurrently(0..KUBELET_EVENTS, in_flight, |e| {
        let uids = &pod_uids;
        async move {
            let (ns, body) = kubelet_event(e, uids);
            api(client, &core("Event"), Some(&ns))
                .create(&post("kubelet"), &object(&core("Event"), body)?)
                .await
                .with_context(|| format!("creating kubelet Event {e}"))?;
            anyhow::Ok((e, ()))
        }
    })
    .await?;
    took.push(("kubelet Events", KUBELET_EVENTS, t.elapsed()));

    let t = Instant::now();
    let first = (FIRST_OTHER_NODE - 1) * PODS_PER_NODE;
    concurrently(first..first + VOLUME_HEALTHS, in_flight, |i| async move {
        write_volume_health(client, i).await?;
        anyhow::Ok((i, ()))
    })
    .await?;
    took.push((
        "VolumeHealth objects of other nodes",
        VOLUME_HEALTHS,
        t.elapsed(),
    ));
    Ok(Base { pod_uids, took })
}

/// Creates PVs `from..to` (each as external-provisioner creates it, then
/// bound by the PV controller's status update), `in_flight` at a time.
pub async fn pvs(client: &Client, from: usize, to: usize, in_flight: usize) -> Result<Duration> {
    let t = Instant::now();
    let pvs = api(client, &core("PersistentVolume"), None);
    let pvs = &pvs;
    concurrently(from..to, in_flight, |i| async move {
        pvs.create(
            &post("csi-provisioner"),
            &object(&core("PersistentVolume"), pv(i))?,
        )
        .await
        .with_context(|| format!("creating PV {}", pv_name(i)))?;
        pvs.patch_status(
            &pv_name(i),
            &PatchParams {
                field_manager: Some("kube-controller-manager".into()),
                ..Default::default()
            },
            &Patch::Merge(&json!({"status": {"phase": "Bound"}})),
        )
        .await
        .with_context(|| format!("binding PV {}", pv_name(i)))?;
        anyhow::Ok((i, ()))
    })
    .await?;
    Ok(t.elapsed())
}

/// A PV as external-provisioner writes one for a CSI driver (annotations,
/// finalizers, topology, the provisioner's identity attribute).
fn pv(i: usize) -> Value {
    let (ns, claim, uid) = if i < CLAIMS {
        (namespace(i), claim_name(i), claim_uid(i))
    } else {
        // Claims beyond CLAIMS are not created (nothing reads them here).
        (
            format!("app-{:02}", i % NAMESPACES),
            claim_name(i),
            claim_uid(i),
        )
    };
    json!({
        "metadata": {
            "name": pv_name(i),
            "annotations": {"pv.kubernetes.io/provisioned-by": DRIVER},
            "finalizers": ["kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"]
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "10Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": ns,
                         "name": claim, "uid": uid},
            "csi": {
                "driver": DRIVER,
                "fsType": "ext4",
                "volumeHandle": handle(i),
                "volumeAttributes": {
                    "storage.kubernetes.io/csiProvisionerIdentity": format!("1732600000000-8081-{DRIVER}"),
                    "type": "pd-balanced"
                }
            },
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.bench.csi.volume-health/zone", "operator": "In", "values": [format!("zone-{}", ["a", "b", "c"][i % 3])]}
            ]}]}},
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "standard-rwo",
            "volumeMode": "Filesystem"
        }
    })
}

fn claim(i: usize) -> Value {
    json!({
        "metadata": {
            "name": claim_name(i),
            "uid": claim_uid(i),
            "labels": {"app": "shop"},
            "annotations": {
                "pv.kubernetes.io/bind-completed": "yes",
                "pv.kubernetes.io/bound-by-controller": "yes",
                "volume.beta.kubernetes.io/storage-provisioner": DRIVER,
                "volume.kubernetes.io/storage-provisioner": DRIVER
            },
            "finalizers": ["kubernetes.io/pvc-protection"]
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "10Gi"}},
            "storageClassName": "standard-rwo",
            "volumeMode": "Filesystem",
            "volumeName": pv_name(i)
        }
    })
}

fn pod(j: usize) -> Value {
    let volume = if j < CLAIMS {
        json!({"name": "data", "persistentVolumeClaim": {"claimName": claim_name(j)}})
    } else {
        json!({"name": "data", "emptyDir": {}})
    };
    json!({
        "metadata": {
            "name": pod_name(j),
            "labels": {"app": "shop", "pod-template-hash": "5d8f7c9b6d"}
        },
        "spec": {
            "nodeName": node_name(pod_node(j)),
            "containers": [{
                "name": "app",
                "image": "registry.example/shop/app:1.4.2",
                "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]
            }],
            "volumes": [volume]
        }
    })
}

fn node(n: usize) -> Value {
    let images: Vec<Value> = (0..20)
        .map(|k| json!({"names": [format!("registry.example/team-{k}/service@sha256:{:064x}", n * 100 + k),
                                   format!("registry.example/team-{k}/service:v{k}.{n}")],
                         "sizeBytes": 50_000_000 + k * 1_000_000}))
        .collect();
    json!({
        "metadata": {
            "name": node_name(n),
            "labels": {"kubernetes.io/hostname": node_name(n), "kubernetes.io/os": "linux",
                       "topology.kubernetes.io/zone": format!("zone-{}", ["a", "b", "c"][n % 3])}
        },
        "spec": {"podCIDR": format!("10.{}.{}.0/24", n / 256, n % 256)},
        "status": {
            "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            "allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status",
                            "lastHeartbeatTime": "2026-11-27T00:00:00Z", "lastTransitionTime": "2026-11-27T00:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": format!("10.0.{}.{}", n / 256, n % 256)},
                          {"type": "Hostname", "address": node_name(n)}],
            "nodeInfo": {"machineID": format!("{n:032x}"), "systemUUID": format!("{n:032x}"), "bootID": format!("{n:032x}"),
                         "kernelVersion": "6.1.0-27-cloud-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "containerRuntimeVersion": "containerd://1.7.22", "kubeletVersion": "v1.26.1",
                         "kubeProxyVersion": "v1.26.1", "operatingSystem": "linux", "architecture": "amd64"},
            "images": images
        }
    })
}

fn time(secs_ago: usize) -> String {
    let t = time::OffsetDateTime::now_utc() - time::Duration::seconds(secs_ago as i64);
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "2026-11-27T00:00:00Z".into())
        // Seconds only, as the API server serves Event times.
        .split('.')
        .next()
        .map(|s| format!("{}Z", s.trim_end_matches('Z')))
        .unwrap_or_default()
}

/// An Event another node's agent wrote (health_kube::events::writes,
/// `event_object`, with the node label of issue 29).
fn agent_event(e: usize, uids: &[String]) -> (String, Value) {
    let first = (FIRST_OTHER_NODE - 1) * PODS_PER_NODE;
    let j = first + e % (PODS - first);
    let node = node_name(pod_node(j));
    let ns = namespace(j);
    let on_claim = j < CLAIMS && e % 4 == 3;
    let (kind, name, uid) = if on_claim {
        ("PersistentVolumeClaim", claim_name(j), claim_uid(j))
    } else {
        ("Pod", pod_name(j), uids[j].clone())
    };
    let warning = e.is_multiple_of(2);
    let subject = if on_claim {
        format!("pod {ns}/{} (PV {})", pod_name(j), pv_name(j))
    } else if j < CLAIMS {
        format!(
            "PVC {ns}/{} (PV {}, volume \"data\")",
            claim_name(j),
            pv_name(j)
        )
    } else {
        "volume \"data\"".to_string()
    };
    let (reason, message) = if warning {
        ("BlockIOErrors", format!("{subject}: Inaccessible BlockIOErrors: 3 failed write requests on sdc (EIO), last at sector 2048"))
    } else {
        ("BlockIOErrorsCleared", format!("{subject}: Inaccessible BlockIOErrors cleared; it was: 3 failed write requests on sdc (EIO), last at sector 2048"))
    };
    let body = json!({
        "metadata": {"name": format!("{name}.{:x}", 0x1870_0000_0000_0000u64 + e as u64), "namespace": ns,
                     "labels": {EVENT_NODE_LABEL: node}},
        "involvedObject": {"apiVersion": "v1", "kind": kind, "namespace": ns, "name": name, "uid": uid},
        "reason": reason,
        "message": message,
        "type": if warning { "Warning" } else { "Normal" },
        "count": 3,
        "firstTimestamp": time(600),
        "lastTimestamp": time(300),
        "source": {"component": AGENT_COMPONENT, "host": node},
        "reportingComponent": AGENT_COMPONENT,
        "reportingInstance": node
    });
    (ns, body)
}

/// An Event a kubelet wrote about one of its pods.
fn kubelet_event(e: usize, uids: &[String]) -> (String, Value) {
    let j = e % PODS;
    let node = node_name(pod_node(j));
    let ns = namespace(j);
    let (reason, message) = match e % 3 {
        0 => (
            "Pulled",
            "Container image \"registry.example/shop/app:1.4.2\" already present on machine",
        ),
        1 => ("Created", "Created container app"),
        _ => ("Started", "Started container app"),
    };
    let body = json!({
        "metadata": {"name": format!("{}.{:x}", pod_name(j), 0x1871_0000_0000_0000u64 + e as u64), "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": ns, "name": pod_name(j),
                           "uid": uids[j], "fieldPath": "spec.containers{app}", "resourceVersion": "4242"},
        "reason": reason,
        "message": message,
        "type": "Normal",
        "count": 1,
        "firstTimestamp": time(900),
        "lastTimestamp": time(900),
        "source": {"component": "kubelet", "host": node},
        "reportingComponent": "kubelet",
        "reportingInstance": node
    });
    (ns, body)
}

/// Claim `i`'s `VolumeHealth` with one entry of its pod's node, written
/// as that node's agent writes it (health_kube::status::api): the object
/// by the shared manager, the entry and the union by the node's own
/// manager on the status, and the node label by the node's manager.
async fn write_volume_health(client: &Client, i: usize) -> Result<()> {
    let node = node_name(pod_node(i));
    let ns = namespace(i);
    let name = claim_name(i);
    let vh = api(client, &volume_health(), Some(&ns));
    let manager = format!("volume-health-agent/{node}");
    let object = json!({
        "apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
        "metadata": {"name": name, "namespace": ns,
                     "ownerReferences": [{"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                                          "name": name, "uid": claim_uid(i)}]},
        "spec": {"persistentVolumeClaimName": name, "persistentVolumeName": pv_name(i)}
    });
    vh.patch(
        &name,
        &PatchParams::apply("volume-health").force(),
        &Patch::Apply(&object),
    )
    .await
    .with_context(|| format!("creating VolumeHealth {ns}/{name}"))?;
    let label = json!({
        "apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
        "metadata": {"name": name, "namespace": ns, "labels": {format!("{VH_NODE_LABEL_PREFIX}{node}"): ""}}
    });
    vh.patch(
        &name,
        &PatchParams::apply(&manager).force(),
        &Patch::Apply(&label),
    )
    .await
    .with_context(|| format!("labelling VolumeHealth {ns}/{name}"))?;
    let (since, seen) = (time(600), time(300));
    let message = "3 failed write requests on sdc (EIO), last at sector 2048";
    let status = json!({
        "apiVersion": "volume-health.io/v1alpha1", "kind": "VolumeHealth",
        "metadata": {"name": name, "namespace": ns},
        "status": {
            "health": "Inaccessible", "reason": "BlockIOErrors", "since": since, "nodes": node,
            "conditions": [{"type": "Inaccessible", "status": "True", "reason": "BlockIOErrors",
                            "message": format!("Node/{node}: {message}"), "lastTransitionTime": since,
                            "observedGeneration": 1}],
            "sources": [{"name": format!("Node/{node}"), "kind": "Node", "node": node,
                         "pods": [format!("{ns}/{}", pod_name(i))], "updateTime": seen,
                         "conditions": [{"status": "Inaccessible", "reason": "BlockIOErrors", "message": message,
                                         "since": since, "lastSeen": seen, "count": 3, "origin": "kernel"}]}]
        }
    });
    vh.patch_status(
        &name,
        &PatchParams::apply(&manager).force(),
        &Patch::Apply(&status),
    )
    .await
    .with_context(|| format!("writing VolumeHealth {ns}/{name}'s status"))?;
    Ok(())
}

/// The served size of one PV (its JSON from a GET), to compare with the
/// issue's 2,084 bytes.
pub async fn pv_bytes(client: &Client, i: usize) -> Result<usize> {
    let request = http::Request::get(format!("/api/v1/persistentvolumes/{}", pv_name(i)))
        .body(Vec::new())
        .context("building a GET")?;
    let text = client
        .request_text(request)
        .await
        .with_context(|| format!("GET PV {}", pv_name(i)))?;
    Ok(text.len())
}
