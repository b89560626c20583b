//! A raw block volume (`volumeDevices`): reads in the pod fail where the
//! fault disk fails the block volume's stretch of the image, and the agent
//! attributes them to that pod and its PVC, naming the device the kubelet
//! mapped into the pod.

use std::time::Duration;

use anyhow::{ensure, Context, Result};
use health_tests::node_cluster::{block_device, loop_backing_file};
use health_tests::{Op, Rule};
use serde_json::Value;

use crate::agent;
use crate::csi;
use crate::reports::{
    agent_events, check_tally, sample, source, source_names, wait_counts, wait_label,
    wait_volume_health, Object,
};
use crate::workload::{self, exec_eio, Mode, APP_NS, DEVICE};
use crate::{Device, E2e};

pub const PVC: &str = "raw";
pub const POD: &str = "reader";
const OBJECTS: [Object<'static>; 2] = [("Pod", POD), ("PersistentVolumeClaim", PVC)];
const REASON: &str = "BlockIOErrors";
/// Failed O_DIRECT reads the pod makes.
const READS: u64 = 3;

/// Scenario 7. The device is the one the cluster's storage says backs the
/// PV (a loop device over its stretch of the fault disk's image), reached
/// from the kubelet's `volumeDevices` path of the pod; each failed 4 KiB
/// read in the pod is one failed request on it.
pub fn attribute(e2e: &E2e, agent_pod: &str) -> Result<()> {
    let cluster = &e2e.cluster;
    let volume = cluster.info.volume("Block")?;
    workload::claim(cluster, PVC, &volume.pv, &e2e.class, Mode::Block)?;
    let uid = workload::pod(cluster, POD, PVC, Mode::Block)?;
    let link = workload::block_publish_path(cluster, &uid, &volume.pv);
    let (name, major, minor) = block_device(&link)
        .with_context(|| format!("the kubelet's volumeDevices path {}", link.display()))?;
    ensure!(
        format!("{major}:{minor}") == volume.maj_min,
        "the pod's device {name} ({major}:{minor}) is not the PV's {}",
        volume.maj_min
    );
    let backing = loop_backing_file(major, minor)?;
    let image = &cluster.info.storage()?.image;
    ensure!(
        &backing == image,
        "{name} is over {}, not the fault disk's image {}",
        backing.display(),
        image.display()
    );
    let offset = std::fs::read_to_string(format!("/sys/block/{name}/loop/offset"))?;
    ensure!(
        offset.trim() == volume.region.offset.to_string(),
        "{name} starts at byte {} of the image, not at the PV's {}",
        offset.trim(),
        volume.region.offset
    );
    let dev = Device { name, major, minor };
    // The reads below, 1 MiB apart from the volume's start: each fails.
    let region = volume.region;
    let before = e2e.disk.stats()?.injected(Op::Read, libc::EIO);
    let rules = e2e
        .disk
        .add_rules([Rule::new(Op::Read, libc::EIO).range(region.offset, READS << 20)])?;
    let input = format!("if={DEVICE}");
    for i in 0..READS {
        let skip = format!("skip={}", i * 256);
        // 256 blocks of 4 KiB: 1 MiB in, as the rule above covers.
        exec_eio(
            cluster,
            POD,
            &[
                "dd",
                &input,
                "of=/dev/null",
                "bs=4096",
                "count=1",
                &skip,
                "iflag=direct",
            ],
        )?;
    }
    rules.remove()?;
    let injected = e2e.disk.stats()?.injected(Op::Read, libc::EIO) - before;
    ensure!(
        injected == READS,
        "the fault disk failed {injected} reads for the {READS} reads made"
    );

    let events = wait_counts(
        cluster,
        &OBJECTS,
        REASON,
        READS as i64,
        Duration::from_secs(20),
    )?;
    check_warnings(e2e, &dev, &events)?;
    crate::episode::show("block Warnings", &events);
    wait_volume_health(
        cluster,
        PVC,
        &format!("Degraded x{READS}"),
        Duration::from_secs(15),
        |vh| source(vh, &e2e.node_source())["conditions"][0]["count"] == READS,
    )?;
    // The driver's own condition of the block volume, as it says it.
    // Asked where the kubelet and the agent ask it: the kubelet's per-pod
    // bind of the device under its global map path.
    let map = cluster
        .info
        .kubelet_root
        .join("plugins/kubernetes.io/csi/volumeDevices")
        .join(&volume.pv)
        .join("dev")
        .join(&uid);
    let driver = csi::driver_condition(cluster, &volume.volume_handle, &map)?;
    let mut names = vec![e2e.node_source()];
    if driver.abnormal {
        names.push(e2e.csi_source());
    }
    names.sort();
    wait_volume_health(
        cluster,
        PVC,
        &format!("Degraded with the entries {names:?}"),
        Duration::from_secs(15),
        |vh| {
            let mut have = source_names(vh);
            have.sort();
            have == names
                && vh["status"]["health"] == "Degraded"
                && source(vh, &e2e.node_source())["conditions"][0]["count"] == READS
        },
    )?;
    wait_label(cluster, PVC, Some("Degraded"))?;
    let text = agent::metrics(cluster, agent_pod)?;
    let errors = format!(
        "volume_health_kernel_errors_total{{namespace=\"{APP_NS}\",persistentvolumeclaim=\"{PVC}\",\
         persistentvolume=\"{}\",device=\"{}\",source=\"block_rq_error\",op=\"read\",errno=\"EIO\"}}",
        volume.pv, dev.name
    );
    ensure!(
        sample(&text, &errors) == READS as f64,
        "{errors} is not {READS}:\n{text}"
    );
    let mine: Vec<Value> = agent_events(cluster)?
        .into_iter()
        .filter(|e| {
            OBJECTS.iter().any(|(kind, name)| {
                e["involvedObject"]["kind"] == *kind && e["involvedObject"]["name"] == *name
            })
        })
        .collect();
    let mut want = Vec::new();
    for (kind, name) in OBJECTS {
        want.push((kind, name, "Warning", REASON, Some(READS as i64)));
        if driver.abnormal {
            want.push((kind, name, "Warning", csi::REASON, None));
        }
    }
    check_tally(&mine, &want)
}

/// `<subject>: Degraded BlockIOErrors: 3 block I/O errors (read, EIO) on
/// <dev> (<maj:min>) ...`, on the pod and on its PVC.
fn check_warnings(e2e: &E2e, dev: &Device, events: &[Value]) -> Result<()> {
    let pv = &e2e.cluster.info.volume("Block")?.pv;
    let condition = format!(
        "Degraded {REASON}: {READS} block I/O errors (read, EIO) on {} ({}:{}) ",
        dev.name, dev.major, dev.minor
    );
    let heads = [
        format!("PVC {APP_NS}/{PVC} (PV {pv}, volume \"vol\"): {condition}"),
        format!("pod {APP_NS}/{POD} (PV {pv}): {condition}"),
    ];
    for (e, head) in events.iter().zip(&heads) {
        ensure!(
            e["type"] == "Warning" && e["reportingInstance"] == e2e.cluster.info.node.as_str(),
            "{e:#}"
        );
        let m = e["message"].as_str().unwrap_or_default();
        ensure!(
            m.starts_with(head.as_str()),
            "message {m:?} does not start with {head:?}"
        );
    }
    Ok(())
}
