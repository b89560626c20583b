//! Kubernetes 1.37's own volume health, on the cluster's real 1.37 API
//! server and kubelet (the `CSIVolumeHealth` gate on both, the kubelet
//! probing every 5 s): the chart with `csiProxy.enabled=true` (the agent
//! answers `health-agent csi-proxy`, which fronts the cluster's CSI driver
//! and which the driver's registration names to the kubelet) and
//! `controller.enabled=true` (the RBAC of `health-controller`, run here on
//! the host against the driver's controller socket as its sidecar would).
//!
//! A pod with two claims; one failed write on one of them. Then:
//! - `pod.status.volumeHealth`, which the kubelet fills from
//!   NodeGetVolumeHealth through the proxy: exactly the affected volume
//!   carries the agent's condition, the other none;
//! - `pvc.status.healthStatus`, which the controller writes: the affected
//!   claim carries the node agent's kernel evidence, the other nothing;
//! - after the quiet window both clear;
//! - and `CSINode.status.storageHealth` holds nothing adverse for the
//!   driver: loop devices have no stack state to report (a stack's findings
//!   in the proxy's NodeGetStorageHealth answer are health-csi's proxy
//!   tests, tests/csi/proxy/storage_health.rs).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use health_tests::node_cluster::{poll, NodeCluster, Volume};
use health_tests::{Op, Rule};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::Api;
use serde_json::{json, Value};

use crate::agent::QUIET_WINDOW;
use crate::reports::{source, wait_volume_health};
use crate::workload::{self, exec_eio, exec_ok, Mode, APP_NS};
use crate::E2e;

const PVC: &str = "vh";
const CALM: &str = "calm";
const POD: &str = "vh-app";
const FILE: &str = "vh.bin";
const REASON: &str = "BlockIOErrors";
/// The kubelet's probe period (lab/src/cluster/config.rs,
/// `volumeStatsAggPeriod`), and time for a probe and a status write.
const KUBELET_PROBE: Duration = Duration::from_secs(5);
const SEEN_WITHIN: Duration = Duration::from_secs(40);

/// (volume name, [(status, reason, message)]) of `pod.status.volumeHealth`.
type PodHealth = Vec<(String, Vec<(String, String, String)>)>;

pub fn scenario(e2e: &E2e) -> Result<()> {
    let cluster = &e2e.cluster;
    let filesystems: Vec<&Volume> = cluster
        .info
        .storage()?
        .volumes
        .iter()
        .filter(|v| v.mode == "Filesystem")
        .collect();
    let [_, pv, calm_pv, ..] = filesystems.as_slice() else {
        anyhow::bail!("the cluster has fewer than three filesystem PVs: {filesystems:?}");
    };
    workload::claim(cluster, PVC, &pv.pv, &e2e.class, Mode::Filesystem)?;
    workload::claim(cluster, CALM, &calm_pv.pv, &e2e.class, Mode::Filesystem)?;
    let uid = workload::pod_with(
        cluster,
        POD,
        &[
            ("data", PVC, Mode::Filesystem, "/data"),
            ("calm", CALM, Mode::Filesystem, "/calm"),
        ],
    )?;
    exec_ok(
        cluster,
        POD,
        &[
            "dd",
            "if=/dev/zero",
            &format!("of=/data/{FILE}"),
            "bs=4096",
            "count=16",
            "oflag=direct",
            "conv=fsync",
        ],
    )?;
    let controller = Controller::start(cluster)?;

    // Healthy: the kubelet has asked a few times, and nothing is said.
    std::thread::sleep(3 * KUBELET_PROBE);
    ensure!(
        pod_health(cluster)?.iter().all(|(_, c)| c.is_empty()),
        "conditions on a healthy pod: {:?}",
        pod_health(cluster)?
    );
    ensure!(
        health_status(cluster, PVC)?.is_null(),
        "healthStatus on a healthy claim: {}",
        health_status(cluster, PVC)?
    );

    // One failed write on `data`.
    let file = workload::fs_publish_path(cluster, &uid, &pv.pv).join(FILE);
    fail_one_write(e2e, &file)?;
    let vh = wait_volume_health(cluster, PVC, "Degraded x1", Duration::from_secs(20), |vh| {
        source(vh, &e2e.node_source())["conditions"][0]["count"] == 1
    })?;
    let said = source(&vh, &e2e.node_source())["conditions"][0]["message"]
        .as_str()
        .context("the agent's condition has a message")?
        .to_string();
    let affected: PodHealth = vec![(
        "data".into(),
        vec![(
            "Degraded".into(),
            REASON.into(),
            format!("volume-health kernel: {said}"),
        )],
    )];
    let on_pod = wait_pod_health(cluster, "the agent's condition on volume data", |h| {
        without_empty(h) == affected
    })?;
    eprintln!("pod.status.volumeHealth: {on_pod:?}");
    let on_claim = wait_health_status(cluster, PVC, "the kernel's evidence", |s| {
        conditions_of(s)
            == [(
                "Degraded".to_string(),
                REASON.to_string(),
                format!("{}: {said}", e2e.node_source()),
            )]
            && s["lastTransitionTime"].is_string()
    })?;
    eprintln!("pvc.status.healthStatus: {on_claim}");
    ensure!(
        health_status(cluster, CALM)?.is_null(),
        "healthStatus on the claim without errors: {}",
        health_status(cluster, CALM)?
    );

    // Recovery: the quiet window passes, and both go.
    let cleared = wait_pod_health_within(
        cluster,
        "no condition on any volume",
        QUIET_WINDOW + SEEN_WITHIN,
        |h| without_empty(h).is_empty(),
    )?;
    eprintln!("pod.status.volumeHealth after recovery: {cleared:?}");
    wait_health_status(cluster, PVC, "cleared", |s| conditions_of(s).is_empty())?;

    // Nothing adverse for the driver on the node (the proxy advertises
    // GET_STORAGE_HEALTH; this host's volumes have no stack state).
    let storage = csinode_storage_health(cluster)?;
    let driver = &cluster.info.storage()?.driver;
    ensure!(
        storage.as_array().is_none_or(|entries| entries
            .iter()
            .all(|e| e["name"] == driver.as_str() && conditions_of(e).is_empty())),
        "CSINode storageHealth: {storage:#}"
    );
    let log = controller.stop()?;
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    ensure!(errors.is_empty(), "the controller logged errors:\n{log}");
    ensure!(
        !log.contains("has no pvc.status.healthStatus"),
        "the controller took the 1.37 server for one without the field:\n{log}"
    );
    workload::delete_pods(cluster, &[POD], &[&uid])
}

/// One O_DIRECT write of the file fails (the fault disk fails its extents
/// meanwhile), and the disk failed exactly that one.
fn fail_one_write(e2e: &E2e, file: &Path) -> Result<()> {
    let ranges = e2e.disk.file_ranges(file)?;
    let before = e2e.disk.stats()?.injected(Op::Write, libc::EIO);
    let rules = e2e.disk.add_rules(
        ranges
            .iter()
            .map(|r| Rule::new(Op::Write, libc::EIO).range(r.start, r.end - r.start)),
    )?;
    exec_eio(
        &e2e.cluster,
        POD,
        &[
            "dd",
            "if=/dev/zero",
            &format!("of=/data/{FILE}"),
            "bs=4096",
            "count=1",
            "oflag=direct",
            "conv=notrunc,fsync",
        ],
    )?;
    rules.remove()?;
    let injected = e2e.disk.stats()?.injected(Op::Write, libc::EIO) - before;
    ensure!(
        injected == 1,
        "the fault disk failed {injected} writes, not 1"
    );
    Ok(())
}

fn pod_health(cluster: &NodeCluster) -> Result<PodHealth> {
    let pods = Api::<Pod>::namespaced(cluster.admin.clone(), APP_NS);
    let pod = serde_json::to_value(cluster.block_on(pods.get(POD))?)?;
    let mut out: PodHealth = pod["status"]["volumeHealth"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| {
                    let name = e["name"].as_str().unwrap_or("?").to_string();
                    (name, conditions_of(e))
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    Ok(out)
}

fn without_empty(health: &PodHealth) -> PodHealth {
    health
        .iter()
        .filter(|(_, c)| !c.is_empty())
        .cloned()
        .collect()
}

fn wait_pod_health(
    cluster: &NodeCluster,
    what: &str,
    done: impl Fn(&PodHealth) -> bool,
) -> Result<PodHealth> {
    wait_pod_health_within(cluster, what, SEEN_WITHIN, done)
}

fn wait_pod_health_within(
    cluster: &NodeCluster,
    what: &str,
    within: Duration,
    done: impl Fn(&PodHealth) -> bool,
) -> Result<PodHealth> {
    poll(
        &format!("pod {APP_NS}/{POD}'s volumeHealth to show {what}"),
        within,
        || {
            let now = pod_health(cluster)?;
            Ok(if done(&now) {
                Ok(now)
            } else {
                Err(format!("{now:?}"))
            })
        },
    )
}

/// `healthConditions` (or a CSINode entry's) as (status, reason, message).
fn conditions_of(v: &Value) -> Vec<(String, String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    v["healthConditions"]
        .as_array()
        .map(|cs| {
            cs.iter()
                .map(|c| (s(&c["status"]), s(&c["reason"]), s(&c["message"])))
                .collect()
        })
        .unwrap_or_default()
}

/// The claim's `status.healthStatus` (null when there is none).
fn health_status(cluster: &NodeCluster, pvc: &str) -> Result<Value> {
    let claims = Api::<PersistentVolumeClaim>::namespaced(cluster.admin.clone(), APP_NS);
    let claim = serde_json::to_value(cluster.block_on(claims.get(pvc))?)?;
    Ok(claim["status"]["healthStatus"].clone())
}

fn wait_health_status(
    cluster: &NodeCluster,
    pvc: &str,
    what: &str,
    done: impl Fn(&Value) -> bool,
) -> Result<Value> {
    poll(
        &format!("PVC {APP_NS}/{pvc}'s healthStatus to be {what}"),
        SEEN_WITHIN,
        || {
            let now = health_status(cluster, pvc)?;
            Ok(if done(&now) {
                Ok(now)
            } else {
                Err(format!("{now:#}"))
            })
        },
    )
}

fn csinode_storage_health(cluster: &NodeCluster) -> Result<Value> {
    let nodes = Api::<CSINode>::all(cluster.admin.clone());
    let node = serde_json::to_value(cluster.block_on(nodes.get(&cluster.info.node))?)?;
    Ok(node["status"]["storageHealth"].clone())
}

/// `health-controller` on the host, as the ServiceAccount the chart made
/// for it, against the driver's own socket; killed when dropped.
struct Controller {
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Controller {
    fn start(cluster: &NodeCluster) -> Result<Controller> {
        let dir = tempfile::tempdir()?;
        let token = cluster.tools.kubectl(&[
            "create",
            "token",
            "volume-health-controller",
            "-n",
            "kube-system",
            "--duration=3600s",
        ])?;
        let admin = std::fs::read_to_string(&cluster.info.kubeconfig)?;
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(&kubeconfig, with_token(&admin, token.trim())?)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let log = dir.path().join("controller.log");
        let bin = std::env::var_os("HEALTH_CONTROLLER_BIN")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                health_tests::manifests::repo_root().join("target/release/health-controller")
            });
        let out = std::fs::File::create(&log)?;
        let child = Command::new(&bin)
            .arg("--csi-address")
            .arg(&cluster.info.storage()?.csi_socket)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args([
                "--monitor-interval",
                "2",
                "--lease-namespace",
                "kube-system",
            ])
            .args(["--identity", "e2e-controller"])
            .arg(format!("--metrics-addr=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        Ok(Controller {
            child,
            log,
            _dir: dir,
        })
    }

    /// SIGTERM, then its log.
    fn stop(mut self) -> Result<String> {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)?;
        let status = self.child.wait()?;
        let log = std::fs::read_to_string(&self.log)?;
        ensure!(status.success(), "the controller exited {status}:\n{log}");
        Ok(log)
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The admin's kubeconfig (a bearer token, the cluster's CA) with another
/// token.
fn with_token(kubeconfig: &str, token: &str) -> Result<String> {
    let mut replaced = 0;
    let out: Vec<String> = kubeconfig
        .lines()
        .map(|l| match l.trim_start().strip_prefix("token:") {
            Some(_) => {
                replaced += 1;
                let indent = &l[..l.len() - l.trim_start().len()];
                format!("{indent}token: {}", json!(token))
            }
            None => l.to_string(),
        })
        .collect();
    ensure!(
        replaced == 1,
        "the cluster's kubeconfig has {replaced} tokens"
    );
    Ok(out.join("\n") + "\n")
}
