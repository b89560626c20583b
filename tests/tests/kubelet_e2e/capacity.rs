//! The README's step 4 ("See an Event"), as a user runs it: a pod fills a
//! volume that has a filesystem of its own until "No space left on
//! device"; the agent's check raises `CapacityExhausted` on the pod and its
//! PVC, `kubectl get volumehealth` and the Events' field selector show it;
//! the file removed, `CapacityExhaustedCleared` follows on both.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use serde_json::Value;

use crate::reports::{about, agent_events, source, wait_counts, wait_volume_health, Object};
use crate::workload::{self, exec, exec_ok, Mode, APP_NS, MOUNT};
use crate::E2e;

const PVC: &str = "full";
const POD: &str = "filler";
const OBJECTS: [Object<'static>; 2] = [("Pod", POD), ("PersistentVolumeClaim", PVC)];
const REASON: &str = "CapacityExhausted";

pub fn fill_and_free(e2e: &E2e) -> Result<()> {
    let cluster = &e2e.cluster;
    // A filesystem volume other than the shared claim's (still Released).
    let storage = cluster.info.storage()?;
    let volume = storage
        .volumes
        .iter()
        .filter(|v| v.mode == "Filesystem")
        .nth(1)
        .with_context(|| format!("a second Filesystem PV: {:?}", storage.volumes))?;
    workload::claim(cluster, PVC, &volume.pv, &e2e.class, Mode::Filesystem)?;
    workload::pod(cluster, POD, PVC, Mode::Filesystem)?;
    let fill = format!("of={MOUNT}/fill");
    let out = exec(cluster, POD, &["dd", "if=/dev/zero", &fill, "bs=1M"])?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(
        !out.status.success() && stderr.contains("No space left on device"),
        "dd did not fill {}: {stderr}",
        volume.pv
    );
    let raised = wait_counts(cluster, &OBJECTS, REASON, 1, Duration::from_secs(30))?;
    for e in &raised {
        let message = e["message"].as_str().unwrap_or_default();
        ensure!(
            e["type"] == "Warning"
                && message.contains(&format!("(PV {}", volume.pv))
                && message.ends_with("no space left"),
            "{e:#}"
        );
    }
    // The node's own entry holds the check's condition; the claim's one-line
    // reason may be the driver's condition of the same status (this driver
    // raises VolumeConditionAbnormal on every volume).
    let node = e2e.node_source();
    let vh = wait_volume_health(cluster, PVC, REASON, Duration::from_secs(30), |vh| {
        source(vh, &node)["conditions"]
            .as_array()
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["status"] == "Degraded" && c["reason"] == REASON)
            })
    })?;
    ensure!(
        vh["status"]["health"] == "Degraded",
        "VolumeHealth {PVC}: {vh:#}"
    );
    // What the README tells the user to run shows it.
    let listed = cluster
        .tools
        .kubectl(&["get", "volumehealth", "-n", APP_NS, PVC])?;
    ensure!(
        listed
            .lines()
            .any(|l| l.starts_with(&format!("{PVC} ")) && l.contains("Degraded")),
        "kubectl get volumehealth:\n{listed}"
    );
    let selected = cluster.tools.kubectl(&[
        "get",
        "events",
        "-n",
        APP_NS,
        "--field-selector",
        "reportingComponent=volume-health-agent",
        "-o",
        "name",
    ])?;
    let ours = agent_events(cluster)?;
    ensure!(
        selected.lines().count() == ours.len() && !ours.is_empty(),
        "the field selector listed {selected:?}, the agent wrote {} Events",
        ours.len()
    );

    exec_ok(cluster, POD, &["rm", &format!("{MOUNT}/fill")])?;
    let cleared_reason = format!("{REASON}Cleared");
    let cleared = wait_counts(
        cluster,
        &OBJECTS,
        &cleared_reason,
        1,
        Duration::from_secs(30),
    )?;
    ensure!(
        cleared.iter().all(|e| e["type"] == "Normal"),
        "{cleared:#?}"
    );
    // Exactly one Warning each: the episode was one.
    let events = agent_events(cluster)?;
    for object in OBJECTS {
        let warnings: Vec<&Value> = about(&events, object, REASON);
        ensure!(warnings.len() == 1, "{object:?}: {warnings:#?}");
    }
    Ok(())
}
