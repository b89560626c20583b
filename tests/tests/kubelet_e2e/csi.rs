//! The CSI driver's own condition. csi-driver-host-path v1.18's node
//! service answers NodeGetVolumeStats with `volume_condition`; the agent
//! asks it about each pod volume every `--csi-interval` and shows what it
//! says. The driver logs every gRPC answer (`-v=5`), so the test reads the
//! driver's own words from its log and requires the agent's Events, its
//! `VolumeHealth` entry and its probe metrics to say exactly that.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use health_tests::node_cluster::{poll, state_dir};
use serde_json::Value;

use crate::agent::{self, CSI_INTERVAL_SECS};
use crate::episode::{Shared, PODS, PVC};
use crate::reports::{
    about, agent_events, sample, source, wait_counts, wait_volume_health, Object,
};
use crate::workload::APP_NS;
use crate::E2e;

/// The reason the agent gives a legacy `abnormal: true`
/// (health_csi::LEGACY_ABNORMAL_REASON).
pub const REASON: &str = "VolumeConditionAbnormal";
const OBJECTS: [Object; 3] = [
    ("Pod", "web-0"),
    ("Pod", "web-1"),
    ("PersistentVolumeClaim", PVC),
];

/// The driver's log (the lab's daemon log of `hostpathplugin`).
fn driver_log() -> PathBuf {
    state_dir().join("logs/hostpathplugin.log")
}

/// What the driver says of a volume: its `volume_condition`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverSays {
    pub abnormal: bool,
    pub message: String,
}

/// The newest `volume_condition` the driver answered NodeGetVolumeStats
/// with for volume `handle`, once it has answered one.
pub fn driver_condition(handle: &str) -> Result<DriverSays> {
    let log = driver_log();
    poll(
        &format!(
            "the driver to answer NodeGetVolumeStats for {handle} (in {})",
            log.display()
        ),
        Duration::from_secs(3 * CSI_INTERVAL_SECS + 10),
        || {
            let text = std::fs::read_to_string(&log)
                .with_context(|| format!("reading {}", log.display()))?;
            let mut asked_for_it = false;
            let mut last = None;
            for line in text.lines() {
                if let Some(request) = json_after(line, "GRPC request: ") {
                    asked_for_it =
                        request["volume_id"] == handle && request.get("volume_path").is_some();
                } else if let Some(answer) = json_after(line, "GRPC response: ") {
                    if asked_for_it && answer.get("usage").is_some() {
                        let c = &answer["volume_condition"];
                        last = Some(DriverSays {
                            abnormal: c["abnormal"].as_bool().unwrap_or(false),
                            message: c["message"].as_str().unwrap_or_default().to_string(),
                        });
                    }
                    asked_for_it = false;
                }
            }
            Ok(last.ok_or_else(|| "no answer yet".to_string()))
        },
    )
}

fn json_after(line: &str, marker: &str) -> Option<Value> {
    let (_, rest) = line.split_once(marker)?;
    serde_json::from_str(rest.trim()).ok()
}

/// What the agent shows of the driver's condition on the shared claim is
/// what the driver answered: abnormal, one Warning per pod and one on the
/// PVC with the driver's message, and the claim's `CSIDriver/<node>`
/// entry; healthy, none of them. Returns the driver's condition.
pub fn shown(e2e: &E2e, shared: &Shared, agent_pod: &str) -> Result<DriverSays> {
    let cluster = &e2e.cluster;
    let handle = &cluster.info.volume("Filesystem")?.volume_handle;
    let says = driver_condition(handle)?;
    let DriverSays { abnormal, message } = says.clone();
    eprintln!("the driver says of {handle}: abnormal {abnormal}, {message:?}");
    let driver = &cluster.info.storage()?.driver;
    let probes = |result: &str| {
        format!("volume_health_csi_probes_total{{driver=\"{driver}\",rpc=\"NodeGetVolumeStats\",result=\"{result}\"}}")
    };
    if abnormal {
        let events = wait_counts(cluster, &OBJECTS, REASON, 1, Duration::from_secs(20))?;
        let condition = format!("Degraded {REASON}: {message}");
        let heads = [
            format!("PVC {APP_NS}/{PVC} (PV {}, volume \"vol\"): ", e2e.fs_pv),
            format!("PVC {APP_NS}/{PVC} (PV {}, volume \"vol\"): ", e2e.fs_pv),
            format!(
                "pods {APP_NS}/{}, {APP_NS}/{} (PV {}): ",
                PODS[0], PODS[1], e2e.fs_pv
            ),
        ];
        for ((e, head), uid) in
            events
                .iter()
                .zip(&heads)
                .zip([&shared.uids[0], &shared.uids[1], &shared.pvc_uid])
        {
            let m = e["message"].as_str().unwrap_or_default();
            ensure!(
                e["type"] == "Warning"
                    && m == format!("{head}{condition}")
                    && e["involvedObject"]["uid"] == uid.as_str(),
                "{e:#}\nnot the driver's condition {condition:?}"
            );
        }
        crate::episode::show("the driver's condition", &events);
        let vh = wait_volume_health(
            cluster,
            PVC,
            "the driver's condition",
            Duration::from_secs(15),
            |vh| !source(vh, &e2e.csi_source())["conditions"].is_null(),
        )?;
        let entry = source(&vh, &e2e.csi_source());
        let c = &entry["conditions"];
        ensure!(
            c.as_array().map(Vec::len) == Some(1)
                && c[0]["status"] == "Degraded"
                && c[0]["reason"] == REASON
                && c[0]["message"] == message.as_str()
                && c[0]["origin"] == "csi-node",
            "the driver's entry: {vh:#}"
        );
        let text = agent::metrics(cluster, agent_pod)?;
        ensure!(
            sample(&text, &probes("abnormal")) >= 1.0,
            "no abnormal probe counted:\n{text}"
        );
    } else {
        let events = agent_events(cluster)?;
        for o in OBJECTS {
            ensure!(about(&events, o, REASON).is_empty(), "{events:#?}");
        }
        let vh = crate::reports::volume_health(cluster, PVC)?;
        ensure!(source(&vh, &e2e.csi_source()).is_null(), "{vh:#}");
        let text = agent::metrics(cluster, agent_pod)?;
        ensure!(
            sample(&text, &probes("healthy")) >= 1.0,
            "no healthy probe counted:\n{text}"
        );
    }
    Ok(says)
}
