//! A kernel episode on a claim two pods share, end to end: O_DIRECT writes
//! in the pods fail where the fault disk fails the file's extents; the
//! agent's Warnings (one per pod, one on the PVC, count = the disk's own
//! count of failed writes), `VolumeHealth`, the label and the metrics; the
//! DaemonSet restarted mid-episode (errors while it restarts and after);
//! the recovery once the quiet window has passed.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use health_tests::node_cluster::poll;
use health_tests::{Op, Rule};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::Api;
use serde_json::{json, Value};

use crate::agent::{self, AGENT_NS, DAEMON_SET, QUIET_WINDOW};
use crate::csi::{self, DriverSays};
use crate::reports::{
    self, check_tally, conditions, identities, owner, sample, source, source_names, wait_counts,
    wait_label, wait_volume_health, Object,
};
use crate::workload::{self, exec_eio, exec_ok, Mode, APP_NS, MOUNT};
use crate::{Device, E2e};

pub const PVC: &str = "data";
pub const PODS: [&str; 2] = ["web-0", "web-1"];
const OBJECTS: [Object<'static>; 3] = [
    ("Pod", "web-0"),
    ("Pod", "web-1"),
    ("PersistentVolumeClaim", PVC),
];
/// The file both pods write, and its size in 4 KiB blocks.
const FILE: &str = "e2e.bin";
const BLOCKS: u64 = 16;
const REASON: &str = "BlockIOErrors";

/// The shared claim as the kubelet set it up.
pub struct Shared {
    /// Pod UIDs, in the order of [`PODS`].
    pub uids: [String; 2],
    pub pvc_uid: String,
    /// The file as the host sees it, through web-0's publish path.
    pub file: PathBuf,
    /// The filesystem's device (the fault disk's loop device).
    pub dev: Device,
}

/// PVC `data` on the filesystem PV, used by web-0 and web-1; web-0 writes
/// the file (healthy, O_DIRECT and fsync).
pub fn set_up(e2e: &E2e) -> Result<Shared> {
    let cluster = &e2e.cluster;
    workload::claim(cluster, PVC, &e2e.fs_pv, &e2e.class, Mode::Filesystem)?;
    let uids = [
        workload::pod(cluster, PODS[0], PVC, Mode::Filesystem)?,
        workload::pod(cluster, PODS[1], PVC, Mode::Filesystem)?,
    ];
    let claims = Api::<PersistentVolumeClaim>::namespaced(cluster.admin.clone(), APP_NS);
    let pvc_uid = cluster
        .block_on(claims.get(PVC))?
        .metadata
        .uid
        .context("a PVC UID")?;
    let of = format!("of={MOUNT}/{FILE}");
    let count = format!("count={BLOCKS}");
    exec_ok(
        cluster,
        PODS[0],
        &[
            "dd",
            "if=/dev/zero",
            &of,
            "bs=4096",
            &count,
            "oflag=direct",
            "conv=fsync",
        ],
    )?;
    let file = workload::fs_publish_path(cluster, &uids[0], &e2e.fs_pv).join(FILE);
    let meta = std::fs::metadata(&file).with_context(|| {
        format!(
            "the pod's file is not where the kubelet publishes the volume: {}",
            file.display()
        )
    })?;
    ensure!(
        meta.len() == BLOCKS * 4096,
        "{} has {} bytes",
        file.display(),
        meta.len()
    );
    let dev = Device::of_dev_t(std::os::unix::fs::MetadataExt::dev(&meta))?;
    e2e.disk.file_ranges(&file)?;
    Ok(Shared {
        uids,
        pvc_uid,
        file,
        dev,
    })
}

/// O_DIRECT writes of one block to the file, `n` in each pod of `plan`,
/// each of which must fail with EIO: the fault disk fails writes to the
/// file's extents meanwhile, and must have failed exactly these writes.
pub fn fail_writes(e2e: &E2e, shared: &Shared, plan: &[(&str, u64)]) -> Result<u64> {
    let ranges = e2e.disk.file_ranges(&shared.file)?;
    let before = e2e.disk.stats()?.injected(Op::Write, libc::EIO);
    let rules = e2e.disk.add_rules(
        ranges
            .iter()
            .map(|r| Rule::new(Op::Write, libc::EIO).range(r.start, r.end - r.start)),
    )?;
    let of = format!("of={MOUNT}/{FILE}");
    let mut made = 0;
    for (pod, n) in plan {
        for _ in 0..*n {
            let seek = format!("seek={}", made % BLOCKS);
            exec_eio(
                &e2e.cluster,
                pod,
                &[
                    "dd",
                    "if=/dev/zero",
                    &of,
                    "bs=4096",
                    "count=1",
                    &seek,
                    "oflag=direct",
                    "conv=notrunc,fsync",
                ],
            )?;
            made += 1;
        }
    }
    rules.remove()?;
    let injected = e2e.disk.stats()?.injected(Op::Write, libc::EIO) - before;
    ensure!(
        injected == made,
        "the fault disk failed {injected} writes for the {made} writes made (one 4 KiB \
         O_DIRECT write is one request)"
    );
    Ok(made)
}

/// Scenario 3: five failed writes (three from web-0, two from web-1).
/// Returns the three Warnings (web-0, web-1, the PVC).
pub fn raise(
    e2e: &E2e,
    shared: &Shared,
    agent_pod: &str,
    driver: &DriverSays,
) -> Result<Vec<Value>> {
    let n = fail_writes(e2e, shared, &[(PODS[0], 3), (PODS[1], 2)])?;
    let events = wait_counts(
        &e2e.cluster,
        &OBJECTS,
        REASON,
        n as i64,
        Duration::from_secs(20),
    )?;
    check_warnings(e2e, shared, &events, n, "")?;
    show("Warnings", &events);
    check_tally(
        &reports::agent_events(&e2e.cluster)?,
        &expected(driver, n, false),
    )?;

    let vh = wait_volume_health(
        &e2e.cluster,
        PVC,
        &format!("Degraded x{n}"),
        Duration::from_secs(15),
        |vh| source(vh, &e2e.node_source())["conditions"][0]["count"] == n,
    )?;
    check_degraded(e2e, shared, &vh, n, driver)?;
    wait_label(&e2e.cluster, PVC, Some("Degraded"))?;

    let text = agent::metrics(&e2e.cluster, agent_pod)?;
    check_metrics(e2e, shared, &text, n)?;
    Ok(events)
}

/// Scenario 4: `kubectl rollout restart` of the DaemonSet mid-episode, two
/// failed writes once the old pod is gone, one more once the new pod is
/// Ready. The same three Events go on (same names and UIDs) with the
/// episode's count; the new process's message counts its own errors and
/// says how many were reported before. Returns the new agent pod and the
/// Warnings.
pub fn restart(
    e2e: &E2e,
    shared: &Shared,
    old: &str,
    before: &[Value],
    driver: &DriverSays,
) -> Result<(Pod, Vec<Value>)> {
    let cluster = &e2e.cluster;
    let vh_before = reports::volume_health(cluster, PVC)?;
    cluster.tools.kubectl(&[
        "rollout",
        "restart",
        "-n",
        AGENT_NS,
        &format!("daemonset/{DAEMON_SET}"),
    ])?;
    let pods = Api::<Pod>::namespaced(cluster.admin.clone(), AGENT_NS);
    poll(
        &format!("the old agent pod {old} to be gone"),
        Duration::from_secs(40),
        || {
            Ok(match cluster.block_on(pods.get_opt(old))? {
                None => Ok(()),
                Some(p) => Err(format!("{:?}", p.status.and_then(|s| s.phase))),
            })
        },
    )?;
    let gone = std::time::Instant::now();
    let gap = fail_writes(e2e, shared, &[(PODS[0], 1), (PODS[1], 1)])?;
    let new = agent::wait_ready(cluster, Some(old), Duration::from_secs(60))?;
    eprintln!(
        "old agent pod gone; {gap} failed writes; new pod {:?} Ready {:.1?} after the old one went",
        new.metadata.name,
        gone.elapsed()
    );
    let new_name = new.metadata.name.clone().context("a pod name")?;
    let after = fail_writes(e2e, shared, &[(PODS[1], 1)])?;
    let first = before[0]["count"].as_u64().context("a count")?;
    let total = first + gap + after;

    let events = wait_counts(
        cluster,
        &OBJECTS,
        REASON,
        total as i64,
        Duration::from_secs(30),
    )
    .with_context(|| agent::logs(cluster, &new_name))?;
    ensure!(
        identities(&events) == identities(before),
        "the Events after the restart are not those before (patched in place): \
         before {:?}, after {:?}",
        identities(before),
        identities(&events)
    );
    let tail = format!(" (and {first} reported before the agent restarted)");
    check_warnings(e2e, shared, &events, gap + after, &tail)?;
    show("Warnings after the restart", &events);
    check_tally(
        &reports::agent_events(cluster)?,
        &expected(driver, total, false),
    )?;

    let vh = wait_volume_health(
        cluster,
        PVC,
        &format!("Degraded x{total}"),
        Duration::from_secs(15),
        |vh| source(vh, &e2e.node_source())["conditions"][0]["count"] == total,
    )?;
    check_degraded(e2e, shared, &vh, total, driver)?;
    ensure!(
        vh["status"]["since"] == vh_before["status"]["since"],
        "the episode's start moved across the restart: {} then {}",
        vh_before["status"]["since"],
        vh["status"]["since"]
    );
    wait_label(cluster, PVC, Some("Degraded"))?;
    // A new process's counters start from what it reported itself.
    let text = agent::metrics(cluster, &new_name)?;
    check_metrics(e2e, shared, &text, gap + after)?;
    Ok((new, events))
}

/// Scenario 5: no more errors; once the quiet window has passed since the
/// last one, one Normal `BlockIOErrorsCleared` per object, this node's
/// entry in the VolumeHealth asserting nothing, and the object and the
/// label Healthy (Degraded False) and gone, unless the driver still says
/// the volume is abnormal.
pub fn recover(e2e: &E2e, warnings: &[Value], driver: &DriverSays) -> Result<()> {
    let cluster = &e2e.cluster;
    let cleared = format!("{REASON}Cleared");
    let events = wait_counts(
        cluster,
        &OBJECTS,
        &cleared,
        1,
        QUIET_WINDOW + Duration::from_secs(30),
    )?;
    let was: Vec<&str> = warnings
        .iter()
        .map(|w| w["message"].as_str().unwrap_or_default())
        .collect();
    show("recoveries", &events);
    for (i, e) in events.iter().enumerate() {
        ensure!(e["type"] == "Normal", "{e:#}");
        let m = e["message"].as_str().unwrap_or_default();
        // `<subject>: Degraded BlockIOErrors cleared; it was: <the
        // Warning's condition message>`.
        let condition = was[i].splitn(3, ": ").nth(2).unwrap_or_default();
        let wanted = format!(": Degraded {REASON} cleared; it was: {condition}");
        ensure!(
            m.ends_with(&wanted),
            "recovery {m:?} does not end with {wanted:?}"
        );
        let subject = m.strip_suffix(&wanted).unwrap_or_default();
        let subjects = match i {
            2 => vec![
                format!("pod {APP_NS}/{} (PV {})", PODS[0], e2e.fs_pv),
                format!("pod {APP_NS}/{} (PV {})", PODS[1], e2e.fs_pv),
                format!(
                    "pods {APP_NS}/{}, {APP_NS}/{} (PV {})",
                    PODS[0], PODS[1], e2e.fs_pv
                ),
            ],
            _ => vec![format!(
                "PVC {APP_NS}/{PVC} (PV {}, volume \"vol\")",
                e2e.fs_pv
            )],
        };
        ensure!(
            subjects.iter().any(|s| s == subject),
            "recovery subject {subject:?}, not one of {subjects:?}"
        );
    }
    let vh = wait_volume_health(
        cluster,
        PVC,
        "without the kernel's condition",
        Duration::from_secs(15),
        |vh| source(vh, &e2e.node_source())["conditions"] == json!([]),
    )?;
    if driver.abnormal {
        ensure!(
            vh["status"]["health"] == "Degraded"
                && vh["status"]["reason"] == csi::REASON
                && conditions(&vh) == [("Degraded".into(), "True".into(), csi::REASON.into())],
            "the driver's condition is not what remains: {vh:#}"
        );
        wait_label(cluster, PVC, Some("Degraded"))?;
    } else {
        ensure!(
            vh["status"]["health"] == "Healthy"
                && conditions(&vh) == [("Degraded".into(), "False".into(), cleared.clone())],
            "not Healthy: {vh:#}"
        );
        wait_label(cluster, PVC, None)?;
    }
    let total = warnings[0]["count"].as_i64().context("a count")?;
    check_tally(
        &reports::agent_events(cluster)?,
        &expected(driver, total as u64, true),
    )
}

/// The agent's Events on the shared claim's objects: the kernel episode's
/// Warning with `count` (and its recovery), and the driver's condition
/// when it says the volume is abnormal.
fn expected(
    driver: &DriverSays,
    count: u64,
    cleared: bool,
) -> Vec<(
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<i64>,
)> {
    let mut want = Vec::new();
    for (kind, name) in OBJECTS {
        want.push((kind, name, "Warning", REASON, Some(count as i64)));
        if cleared {
            want.push((kind, name, "Normal", "BlockIOErrorsCleared", Some(1)));
        }
        if driver.abnormal {
            want.push((kind, name, "Warning", csi::REASON, None));
        }
    }
    want
}

/// Prints what the agent wrote, for the test's log.
pub fn show(what: &str, events: &[Value]) {
    for e in events {
        eprintln!(
            "  {what}: {}/{} {} {} x{}: {}",
            e["involvedObject"]["kind"].as_str().unwrap_or("?"),
            e["involvedObject"]["name"].as_str().unwrap_or("?"),
            e["type"].as_str().unwrap_or("?"),
            e["reason"].as_str().unwrap_or("?"),
            e["count"],
            e["message"].as_str().unwrap_or("?")
        );
    }
}

/// Each Warning: its object (UIDs), type, reporter, and the exact message:
/// `<subject>: Degraded BlockIOErrors: <n> block I/O errors (write, EIO) on
/// <dev> (<maj:min>) at <publish path> (in <window> (<t0> to <t1>) | at
/// <t>)<tail>`.
fn check_warnings(e2e: &E2e, shared: &Shared, events: &[Value], n: u64, tail: &str) -> Result<()> {
    let dev = &shared.dev;
    let condition = format!(
        "Degraded {REASON}: {n} block I/O error{} (write, EIO) on {} ({}:{}) at ",
        if n == 1 { "" } else { "s" },
        dev.name,
        dev.major,
        dev.minor
    );
    let mounts: Vec<String> = shared
        .uids
        .iter()
        .map(|uid| {
            workload::fs_publish_path(&e2e.cluster, uid, &e2e.fs_pv)
                .display()
                .to_string()
        })
        .collect();
    for (i, e) in events.iter().enumerate() {
        ensure!(
            e["type"] == "Warning"
                && e["reportingInstance"] == e2e.cluster.info.node.as_str()
                && e["source"]["host"] == e2e.cluster.info.node.as_str(),
            "{e:#}"
        );
        let uid = match i {
            0 | 1 => shared.uids[i].as_str(),
            _ => shared.pvc_uid.as_str(),
        };
        ensure!(e["involvedObject"]["uid"] == uid, "{e:#}");
        let m = e["message"].as_str().unwrap_or_default();
        let (head, at) = match i {
            0 | 1 => (
                format!(
                    "PVC {APP_NS}/{PVC} (PV {}, volume \"vol\"): {condition}",
                    e2e.fs_pv
                ),
                vec![mounts[i].clone()],
            ),
            _ => (
                format!(
                    "pods {APP_NS}/{}, {APP_NS}/{} (PV {}): {condition}",
                    PODS[0], PODS[1], e2e.fs_pv
                ),
                mounts.clone(),
            ),
        };
        let rest = m
            .strip_prefix(&head)
            .with_context(|| format!("message {m:?} does not start with {head:?}"))?;
        let when = at
            .iter()
            .find_map(|p| rest.strip_prefix(p.as_str())?.strip_prefix(' '))
            .with_context(|| format!("message {m:?}: no publish path of {at:?} after {head:?}"))?;
        ensure!(
            (when.starts_with("in ") || when.starts_with("at ")) && when.ends_with(tail),
            "message {m:?}: {when:?} is not the episode's window followed by {tail:?}"
        );
    }
    Ok(())
}

/// The VolumeHealth while the episode lasts: owned by the PVC, one source
/// (this node's agent) with the kernel's condition and count, the union
/// Degraded.
fn check_degraded(
    e2e: &E2e,
    shared: &Shared,
    vh: &Value,
    count: u64,
    driver: &DriverSays,
) -> Result<()> {
    ensure!(
        vh["metadata"]["ownerReferences"]
            == json!([owner("PersistentVolumeClaim", PVC, &shared.pvc_uid)]),
        "owners: {vh:#}"
    );
    let mut names = vec![e2e.node_source()];
    if driver.abnormal {
        names.push(e2e.csi_source());
    }
    let mut have = source_names(vh);
    have.sort();
    names.sort();
    ensure!(have == names, "sources: {vh:#}");
    let entry = source(vh, &e2e.node_source());
    let pods: Vec<String> = PODS.iter().map(|p| format!("{APP_NS}/{p}")).collect();
    ensure!(
        entry["pods"] == json!(pods),
        "pods of the node's entry: {vh:#}"
    );
    let c = &entry["conditions"];
    ensure!(
        c.as_array().map(Vec::len) == Some(1)
            && c[0]["status"] == "Degraded"
            && c[0]["reason"] == REASON
            && c[0]["origin"] == "kernel"
            && c[0]["count"] == count,
        "the node's conditions: {vh:#}"
    );
    // The longest-standing assertion speaks for the condition: the
    // driver's, when it says the volume is abnormal since the pods started.
    let reason = if driver.abnormal { csi::REASON } else { REASON };
    let st = &vh["status"];
    ensure!(
        st["health"] == "Degraded"
            && st["reason"] == reason
            && st["nodes"] == e2e.cluster.info.node.as_str(),
        "status: {vh:#}"
    );
    ensure!(
        conditions(vh) == [("Degraded".into(), "True".into(), reason.into())],
        "conditions {:?}",
        conditions(vh)
    );
    Ok(())
}

/// The agent's metrics: `count` errors on the claim (once, not per pod),
/// the condition on each pod's volume.
fn check_metrics(e2e: &E2e, shared: &Shared, text: &str, count: u64) -> Result<()> {
    let errors = format!(
        "volume_health_kernel_errors_total{{namespace=\"{APP_NS}\",persistentvolumeclaim=\"{PVC}\",\
         persistentvolume=\"{}\",device=\"{}\",source=\"block_rq_error\",op=\"write\",errno=\"EIO\"}}",
        e2e.fs_pv, shared.dev.name
    );
    // What reached the claim's volumes is the claim's, not "no volume"
    // (docs/reference/metrics.md: empty volume labels are for devices no pod
    // volume uses).
    let nowhere = format!(
        "volume_health_kernel_errors_total{{namespace=\"\",persistentvolumeclaim=\"\",\
         persistentvolume=\"\",device=\"{}\",source=\"block_rq_error\",op=\"write\",errno=\"EIO\"}}",
        shared.dev.name
    );
    ensure!(
        sample(text, &errors) == count as f64 && sample(text, &nowhere) == 0.0,
        "{errors} is {}, not {count}, and {nowhere} is {}:\n{text}",
        sample(text, &errors),
        sample(text, &nowhere)
    );
    for pod in PODS {
        let condition = format!(
            "volume_health_volume_condition{{namespace=\"{APP_NS}\",pod=\"{pod}\",persistentvolumeclaim=\"{PVC}\",\
             persistentvolume=\"{}\",status=\"Degraded\",reason=\"{REASON}\"}}",
            e2e.fs_pv
        );
        ensure!(
            sample(text, &condition) == 1.0,
            "{condition} is not 1:\n{text}"
        );
    }
    Ok(())
}
