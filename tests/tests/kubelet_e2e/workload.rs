//! The application side: a namespace of its own, PVCs bound to the
//! cluster's pre-created PVs, busybox pods that use them (mounted or as a
//! raw device), commands run in those pods, and where the kubelet put each
//! volume on the host.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use health_tests::node_cluster::{poll, NodeCluster};
use k8s_openapi::api::core::v1::{
    Namespace, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use crate::agent::is_ready;

/// The tests' namespace; made afresh by each test that uses it.
pub const APP_NS: &str = "vh-e2e";
/// Where a pod mounts its filesystem claim, and where its raw device is.
pub const MOUNT: &str = "/data";
pub const DEVICE: &str = "/dev/e2e-raw";

/// How a pod uses its claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Filesystem,
    Block,
}

/// Deletes `APP_NS` if it exists (waiting until it is gone: its pods and
/// PVCs with it) and makes it again, with its default ServiceAccount.
pub fn fresh_namespace(cluster: &NodeCluster) -> Result<()> {
    delete_namespace(cluster)?;
    let namespaces = Api::<Namespace>::all(cluster.admin.clone());
    let ns = serde_json::from_value(json!({"metadata": {"name": APP_NS}}))?;
    cluster.block_on(namespaces.create(&PostParams::default(), &ns))?;
    // The controller-manager makes it; pods are refused until it exists.
    let accounts = Api::<ServiceAccount>::namespaced(cluster.admin.clone(), APP_NS);
    poll(
        "the namespace's default ServiceAccount",
        Duration::from_secs(30),
        || {
            Ok(match cluster.block_on(accounts.get_opt("default"))? {
                Some(_) => Ok(()),
                None => Err("none yet".into()),
            })
        },
    )
}

pub fn delete_namespace(cluster: &NodeCluster) -> Result<()> {
    let namespaces = Api::<Namespace>::all(cluster.admin.clone());
    if cluster.block_on(namespaces.get_opt(APP_NS))?.is_none() {
        return Ok(());
    }
    cluster.block_on(namespaces.delete(APP_NS, &DeleteParams::default()))?;
    poll(
        "the tests' namespace to be gone",
        Duration::from_secs(90),
        || {
            Ok(match cluster.block_on(namespaces.get_opt(APP_NS))? {
                None => Ok(()),
                Some(ns) => Err(format!("{:?}", ns.status)),
            })
        },
    )
}

/// Makes PV `pv` Available again when an earlier run's claim released it
/// (its `claimRef` names a claim that is gone).
pub fn free_pv(cluster: &NodeCluster, pv: &str) -> Result<()> {
    let pvs = Api::<PersistentVolume>::all(cluster.admin.clone());
    let phase = |v: &PersistentVolume| {
        v.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default()
    };
    let now = cluster
        .block_on(pvs.get_opt(pv))?
        .with_context(|| format!("no PV {pv}: the cluster's storage did not make it"))?;
    if phase(&now) == "Available" {
        return Ok(());
    }
    let patch = json!({"spec": {"claimRef": null}});
    cluster.block_on(pvs.patch(pv, &PatchParams::default(), &Patch::Merge(&patch)))?;
    poll(
        &format!("PV {pv} to be Available"),
        Duration::from_secs(30),
        || {
            let v = cluster.block_on(pvs.get(pv))?;
            Ok(match phase(&v).as_str() {
                "Available" => Ok(()),
                other => Err(other.to_string()),
            })
        },
    )
}

/// Claim `name` for PV `pv` of class `class`, waited for until Bound.
pub fn claim(cluster: &NodeCluster, name: &str, pv: &str, class: &str, mode: Mode) -> Result<()> {
    free_pv(cluster, pv)?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(cluster.admin.clone(), APP_NS);
    let pvc = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "e2e"}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "volumeMode": match mode { Mode::Filesystem => "Filesystem", Mode::Block => "Block" },
            "storageClassName": class,
            "volumeName": pv,
            "resources": {"requests": {"storage": "1Mi"}}
        }
    }))?;
    cluster.block_on(claims.create(&PostParams::default(), &pvc))?;
    poll(
        &format!("PVC {name} to bind to {pv}"),
        Duration::from_secs(30),
        || {
            let c = cluster.block_on(claims.get(name))?;
            let phase = c.status.and_then(|s| s.phase).unwrap_or_default();
            Ok(if phase == "Bound" { Ok(()) } else { Err(phase) })
        },
    )
}

/// A busybox pod using claim `claim` as volume `vol` at [`MOUNT`] or
/// [`DEVICE`], waited for until Ready; its UID.
pub fn pod(cluster: &NodeCluster, name: &str, claim: &str, mode: Mode) -> Result<String> {
    let at = match mode {
        Mode::Filesystem => MOUNT,
        Mode::Block => DEVICE,
    };
    pod_with(cluster, name, &[("vol", claim, mode, at)])
}

/// A busybox pod with one volume per (volume name, claim, mode, mount
/// path or device path) of `volumes`, waited for until Ready; its UID.
pub fn pod_with(
    cluster: &NodeCluster,
    name: &str,
    volumes: &[(&str, &str, Mode, &str)],
) -> Result<String> {
    let pods = Api::<Pod>::namespaced(cluster.admin.clone(), APP_NS);
    let mut container = json!({
        "name": "app",
        "image": cluster.info.images.busybox,
        "imagePullPolicy": "Never",
        "command": ["sleep", "100000"],
    });
    let mut mounts = Vec::new();
    let mut devices = Vec::new();
    for (volume, _, mode, at) in volumes {
        match mode {
            Mode::Filesystem => mounts.push(json!({"name": volume, "mountPath": at})),
            Mode::Block => devices.push(json!({"name": volume, "devicePath": at})),
        }
    }
    if !mounts.is_empty() {
        container["volumeMounts"] = json!(mounts);
    }
    if !devices.is_empty() {
        container["volumeDevices"] = json!(devices);
    }
    let specs: Vec<Value> = volumes
        .iter()
        .map(|(volume, claim, _, _)| {
            json!({"name": volume, "persistentVolumeClaim": {"claimName": claim}})
        })
        .collect();
    let pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            // sleep as PID 1 ignores SIGTERM: deletion would wait the
            // whole grace period.
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
            "volumes": specs
        }
    }))?;
    cluster.block_on(pods.create(&PostParams::default(), &pod))?;
    let ready = poll(
        &format!("pod {name} to be Ready"),
        Duration::from_secs(60),
        || {
            let p = cluster.block_on(pods.get(name))?;
            Ok(if is_ready(&p) {
                Ok(p)
            } else {
                Err(format!("{:?}", p.status))
            })
        },
    )?;
    ready.metadata.uid.context("a pod UID")
}

/// Deletes the pods `names` and waits until they are gone from the API and
/// the kubelet has taken their directories (`uids`) away: their volumes
/// are unpublished.
pub fn delete_pods(cluster: &NodeCluster, names: &[&str], uids: &[&str]) -> Result<()> {
    let pods = Api::<Pod>::namespaced(cluster.admin.clone(), APP_NS);
    for name in names {
        cluster.block_on(pods.delete(name, &DeleteParams::default()))?;
    }
    poll("the pods to be gone", Duration::from_secs(60), || {
        let mut left = Vec::new();
        for name in names {
            if cluster.block_on(pods.get_opt(name))?.is_some() {
                left.push(*name);
            }
        }
        for uid in uids {
            let dir = cluster.info.kubelet_root.join("pods").join(uid);
            if dir.exists() {
                left.push(uid);
            }
        }
        Ok(if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        })
    })
}

/// `args` run in pod `pod` (`kubectl exec`), whatever their exit status.
pub fn exec(cluster: &NodeCluster, pod: &str, args: &[&str]) -> Result<Output> {
    let mut all = vec!["exec", "-n", APP_NS, pod, "--"];
    all.extend_from_slice(args);
    cluster.tools.kubectl_output(&all)
}

/// `args` run in pod `pod`, which must succeed.
pub fn exec_ok(cluster: &NodeCluster, pod: &str, args: &[&str]) -> Result<()> {
    let out = exec(cluster, pod, args)?;
    ensure!(
        out.status.success(),
        "{args:?} in pod {pod} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `args` run in pod `pod`, which must fail with EIO.
pub fn exec_eio(cluster: &NodeCluster, pod: &str, args: &[&str]) -> Result<()> {
    let out = exec(cluster, pod, args)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("Input/output error"),
        "{args:?} in pod {pod} did not fail with EIO ({}): {stderr}",
        out.status
    );
    Ok(())
}

/// Where the kubelet publishes a CSI filesystem volume of PV `pv` for pod
/// `uid`: `<root>/pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`.
pub fn fs_publish_path(cluster: &NodeCluster, uid: &str, pv: &str) -> PathBuf {
    cluster
        .info
        .kubelet_root
        .join("pods")
        .join(uid)
        .join("volumes/kubernetes.io~csi")
        .join(pv)
        .join("mount")
}

/// Where the kubelet links a CSI block volume of PV `pv` for pod `uid`:
/// `<root>/pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`.
pub fn block_publish_path(cluster: &NodeCluster, uid: &str, pv: &str) -> PathBuf {
    cluster
        .info
        .kubelet_root
        .join("pods")
        .join(uid)
        .join("volumeDevices/kubernetes.io~csi")
        .join(pv)
}
