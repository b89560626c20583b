//! The CSI driver's own condition. The project's driver answers
//! NodeGetVolumeStats with the legacy `volume_condition`; the agent asks it
//! about each pod volume every `--csi-interval` and shows what it says. The
//! test asks the driver the same question on its own socket and requires
//! the agent's Events, its `VolumeHealth` entry and its probe metrics to
//! say exactly that.

use std::path::Path;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use health_csi::proto;
use health_csi::proto::node_client::NodeClient;
use health_tests::csi_driver::client::unix_channel;
use health_tests::node_cluster::{poll, NodeCluster};

use crate::agent;
use crate::episode::{Shared, PODS, PVC};
use crate::reports::{
    about, agent_events, sample, source, wait_counts, wait_volume_health, Object,
};
use crate::workload::{self, APP_NS};
use crate::E2e;

/// The reason the agent gives a legacy `abnormal: true`
/// (health_csi::LEGACY_ABNORMAL_REASON).
pub const REASON: &str = "VolumeConditionAbnormal";
const OBJECTS: [Object<'static>; 3] = [
    ("Pod", "web-0"),
    ("Pod", "web-1"),
    ("PersistentVolumeClaim", PVC),
];

/// What the driver says of a volume: its `volume_condition`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverSays {
    pub abnormal: bool,
    pub message: String,
}

/// The driver's `volume_condition` of volume `handle` at `volume_path` (a
/// pod's publish path), asked on the driver's own socket as the agent asks
/// it.
pub fn driver_condition(
    cluster: &NodeCluster,
    handle: &str,
    volume_path: &Path,
) -> Result<DriverSays> {
    let socket = cluster.info.storage()?.csi_socket.clone();
    let request = proto::NodeGetVolumeStatsRequest {
        volume_id: handle.to_string(),
        volume_path: volume_path.display().to_string(),
        staging_target_path: String::new(),
    };
    let answer = cluster.block_on(async {
        let mut node = NodeClient::new(unix_channel(&socket).await?);
        node.node_get_volume_stats(request)
            .await
            .with_context(|| format!("NodeGetVolumeStats {handle} on {}", socket.display()))
    })?;
    let condition = answer
        .into_inner()
        .volume_condition
        .context("the driver advertises VOLUME_CONDITION and answered none")?;
    Ok(DriverSays {
        abnormal: condition.abnormal,
        message: condition.message,
    })
}

/// Waits until the agent has counted a probe of the driver as `series`
/// says (it asks every `--csi-interval`).
fn probed(cluster: &NodeCluster, agent_pod: &str, series: &str) -> Result<()> {
    poll(
        &format!("the agent to count {series}"),
        Duration::from_secs(3 * agent::CSI_INTERVAL_SECS + 10),
        || {
            let text = agent::metrics(cluster, agent_pod)?;
            Ok(if sample(&text, series) >= 1.0 {
                Ok(())
            } else {
                Err(text)
            })
        },
    )
}

/// What the agent shows of the driver's condition on the shared claim is
/// what the driver answered: abnormal, one Warning per pod and one on the
/// PVC with the driver's message, and the claim's `CSIDriver/<node>`
/// entry; healthy, none of them. Returns the driver's condition.
pub fn shown(e2e: &E2e, shared: &Shared, agent_pod: &str) -> Result<DriverSays> {
    let cluster = &e2e.cluster;
    let handle = &cluster.info.volume("Filesystem")?.volume_handle;
    let path = workload::fs_publish_path(cluster, &shared.uids[0], &e2e.fs_pv);
    let says = driver_condition(cluster, handle, &path)?;
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
        probed(cluster, agent_pod, &probes("abnormal"))?;
    } else {
        let events = agent_events(cluster)?;
        for o in OBJECTS {
            ensure!(about(&events, o, REASON).is_empty(), "{events:#?}");
        }
        let vh = crate::reports::volume_health(cluster, PVC)?;
        ensure!(source(&vh, &e2e.csi_source()).is_null(), "{vh:#}");
        probed(cluster, agent_pod, &probes("healthy"))?;
    }
    Ok(says)
}
