//! The product installed as users install it, on a real node: the
//! single-node cluster `cargo xtask cluster up` runs on this machine
//! (Kubernetes 1.37 with its volume health on: kubelet, containerd, runc,
//! the project's CSI driver registered with the kubelet through
//! `health-agent csi-proxy`, PVs on a fault disk), the agent's image as
//! `cargo xtask image` builds it and the shipped names.
//!
//! - `kustomize_manifests_...`: `kubectl apply -k deploy/` as it ships;
//!   the DaemonSet pod Ready through its own probes, the metrics served;
//!   then removed.
//! - `helm_chart_...`: `helm install` with the chart's defaults and only
//!   `extraArgs` (quick checks, a short quiet window), then in order: two
//!   pods sharing a PVC; the CSI driver's own condition of it, as the
//!   driver answers it (read from the driver's log); O_DIRECT writes in
//!   both pods failing where the fault disk fails the file's extents (one
//!   Warning per pod and one on the PVC, the count the disk's own,
//!   `VolumeHealth`, the label, the metrics); the DaemonSet restarted
//!   mid-episode, with errors while it restarts and after (the same Events
//!   go on with the episode's count); the recovery; a raw block volume
//!   whose reads fail (attributed to its pod and PVC, naming the device);
//!   the README's "See an Event" step (a volume filled, then freed).
//! - `kubernetes_volume_health_...`: Kubernetes 1.37's `pod.status.volumeHealth`
//!   (through `health-agent csi-proxy`, which the driver registered with the
//!   kubelet), `pvc.status.healthStatus` (health-controller) and
//!   `CSINode.status.storageHealth`, raised by one failed write and cleared
//!   after the quiet window (kubelet_e2e/volume_health.rs).
//! - `memlock_capability_...`: the chart with `memlockCapability=true` runs
//!   where the runtime can grant CAP_SYS_RESOURCE, and where it cannot (this
//!   project's VMs) never starts, runc's refusal reported by the kubelet.
//!
//! Needs the cluster up (`cargo xtask cluster up`): without it, or with its
//! Node not Ready, every test fails saying so. Needs root (the tests read
//! the kubelet's tree and file extents on the host, and steer the fault
//! disk), and kubectl and helm (`cargo xtask tools`). Run:
//! `cargo xtask cluster test`, or on a cluster already up
//! `cargo test --release --workspace --test kubelet_e2e -- --test-threads=1`
//! (`--workspace`: the feature set of every other build, so nothing
//! compiles twice).

#[path = "kubelet_e2e/agent.rs"]
mod agent;
#[path = "kubelet_e2e/block.rs"]
mod block;
#[path = "kubelet_e2e/capacity.rs"]
mod capacity;
#[path = "kubelet_e2e/csi.rs"]
mod csi;
#[path = "kubelet_e2e/episode.rs"]
mod episode;
#[path = "kubelet_e2e/reports.rs"]
mod reports;
#[path = "kubelet_e2e/volume_health.rs"]
mod volume_health;
#[path = "kubelet_e2e/workload.rs"]
mod workload;

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use health_tests::manifests::repo_root;
use health_tests::node_cluster::{DiskControl, NodeCluster};
use health_tests::require_root;

/// The tests install and remove the same agent: one at a time.
static CLUSTER: Mutex<()> = Mutex::new(());

fn one_at_a_time() -> MutexGuard<'static, ()> {
    CLUSTER.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The cluster, its fault disk and the names the scenarios use.
pub struct E2e {
    pub cluster: NodeCluster,
    pub disk: DiskControl,
    pub fs_pv: String,
    pub class: String,
}

impl E2e {
    fn open() -> Result<E2e> {
        require_root()?;
        let cluster = NodeCluster::open()?;
        let storage = cluster.info.storage()?;
        let disk = DiskControl::new(&storage.control_socket)?;
        Ok(E2e {
            fs_pv: cluster.info.volume("Filesystem")?.pv.clone(),
            class: storage.storage_class.clone(),
            disk,
            cluster,
        })
    }

    /// The VolumeHealth entry of this node's agent (kernel and checks).
    pub fn node_source(&self) -> String {
        format!("Node/{}", self.cluster.info.node)
    }

    /// The VolumeHealth entry of the CSI node service as this node's agent
    /// saw it.
    pub fn csi_source(&self) -> String {
        format!("CSIDriver/{}", self.cluster.info.node)
    }
}

/// A block device by its kernel name and numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Device {
    pub name: String,
    pub major: u32,
    pub minor: u32,
}

impl Device {
    /// The device a file's `st_dev` names.
    pub fn of_dev_t(dev: u64) -> Result<Device> {
        let (major, minor) = (libc::major(dev), libc::minor(dev));
        let uevent = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/uevent"))
            .with_context(|| format!("no block device {major}:{minor}"))?;
        let name = uevent
            .lines()
            .find_map(|l| l.strip_prefix("DEVNAME="))
            .with_context(|| format!("no DEVNAME for {major}:{minor}"))?;
        Ok(Device {
            name: name.to_string(),
            major,
            minor,
        })
    }
}

/// Runs one scenario, saying how long it took; a failure names it.
fn step<T>(name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let started = Instant::now();
    let out = f().with_context(|| format!("scenario {name:?}"))?;
    eprintln!("scenario {name:?}: passed in {:.1?}", started.elapsed());
    Ok(out)
}

#[test]
fn kustomize_manifests_as_shipped_run_ready_and_serve_metrics() -> Result<()> {
    let _one = one_at_a_time();
    let e2e = E2e::open()?;
    let cluster = &e2e.cluster;
    agent::remove(cluster)?;
    let started = Instant::now();
    agent::apply_kustomization(cluster)?;
    let pod = agent::wait_ready(cluster, None, Duration::from_secs(90))?;
    let ready = started.elapsed();
    eprintln!("kustomize: {}", agent::startup(&pod));
    let name = pod.metadata.name.clone().context("a pod name")?;
    let (image, args, restarts) = agent::container(&pod)?;
    ensure!(
        image == cluster.info.images.agent && args == ["run"] && restarts == 0,
        "the agent runs {image} {args:?} after {restarts} restarts"
    );
    agent::check_probes(cluster, &name)?;
    let text = agent::metrics(cluster, &name)?;
    agent::check_families(&text)?;
    agent::check_pinned()?;
    // The agent removes its pins as it stops: its DaemonSet is gone.
    agent::delete_kustomization(cluster)?;
    eprintln!("kustomize: DaemonSet pod Ready {ready:.1?} after apply; removed");
    Ok(())
}

/// `memlockCapability=true` asks for CAP_SYS_RESOURCE (kernels before 5.11
/// need it). Where the node's runtime can grant it the agent runs; where it
/// cannot (this project's VMs: it is not in their capability bounding set)
/// the container never starts, and the kubelet reports runc's refusal.
#[test]
fn memlock_capability_starts_only_where_the_node_can_grant_it() -> Result<()> {
    let _one = one_at_a_time();
    let e2e = E2e::open()?;
    let cluster = &e2e.cluster;
    agent::remove(cluster)?;
    let chart = repo_root().join("deploy/helm/volume-health");
    cluster.tools.helm(&[
        "install",
        agent::RELEASE,
        &chart.to_string_lossy(),
        "-n",
        agent::AGENT_NS,
        "--create-namespace",
        "--set",
        "memlockCapability=true",
    ])?;
    let result = if agent::host_can_grant_sys_resource()? {
        agent::wait_ready(cluster, None, Duration::from_secs(90)).map(|_| ())
    } else {
        agent::wait_capability_refused(cluster, Duration::from_secs(90)).and_then(|message| {
            ensure!(
                message.contains("unable to apply caps: operation not permitted"),
                "the refusal says {message:?}"
            );
            eprintln!("memlockCapability=true here: {message}");
            Ok(())
        })
    };
    agent::remove(cluster)?;
    result
}

#[test]
fn helm_chart_reports_a_shared_claim_across_a_restart_and_the_driver_and_a_block_volume(
) -> Result<()> {
    let _one = one_at_a_time();
    let e2e = E2e::open()?;
    let cluster = &e2e.cluster;
    agent::remove(cluster)?;
    workload::fresh_namespace(cluster)?;
    let values = tempfile::tempdir()?;
    let pod = step("helm install", || {
        let notes = agent::install_chart(cluster, values.path())?;
        let pod = agent::wait_ready(cluster, None, Duration::from_secs(90))?;
        agent::run_the_notes_checks(cluster, &notes)?;
        agent::check_pinned()?;
        eprintln!("helm: {}", agent::startup(&pod));
        let name = pod.metadata.name.clone().context("a pod name")?;
        let (image, args, _) = agent::container(&pod)?;
        let mut want = vec!["run".to_string()];
        want.extend(agent::extra_args());
        ensure!(
            image == cluster.info.images.agent && args == want,
            "the chart's agent runs {image} {args:?}"
        );
        agent::check_probes(cluster, &name)?;
        agent::check_families(&agent::metrics(cluster, &name)?)?;
        Ok(pod)
    })?;
    let name = pod.metadata.name.clone().context("a pod name")?;
    let result = scenarios(&e2e, &name);
    if let Err(e) = &result {
        let pods = cluster
            .tools
            .kubectl(&["get", "pods", "-n", agent::AGENT_NS, "-o", "name"])
            .unwrap_or_default();
        for pod in pods.lines() {
            let pod = pod.trim_start_matches("pod/");
            eprintln!("{}", agent::logs(cluster, pod));
        }
        eprintln!(
            "left installed for a look (until a later test or run removes them): the chart and namespace {}; {e:#}",
            workload::APP_NS
        );
        return result;
    }
    workload::delete_namespace(cluster)?;
    agent::remove(cluster)?;
    // Leave the PVs as the cluster made them: Available.
    for volume in &cluster.info.storage()?.volumes {
        workload::free_pv(cluster, &volume.pv)?;
    }
    Ok(())
}

#[test]
fn kubernetes_volume_health_reaches_the_pod_the_claim_and_the_node() -> Result<()> {
    let _one = one_at_a_time();
    let e2e = E2e::open()?;
    let cluster = &e2e.cluster;
    agent::remove(cluster)?;
    workload::fresh_namespace(cluster)?;
    let values = tempfile::tempdir()?;
    let pod = step("helm install with csiProxy and controller", || {
        agent::install_chart_with(
            cluster,
            values.path(),
            &["csiProxy.enabled=true", "controller.enabled=true"],
        )?;
        agent::wait_ready(cluster, None, Duration::from_secs(90))
    })?;
    let name = pod.metadata.name.clone().context("a pod name")?;
    let result = step("Kubernetes 1.37's volume health", || {
        volume_health::scenario(&e2e)
    });
    if let Err(e) = &result {
        eprintln!("{}", agent::logs(cluster, &name));
        eprintln!("left installed for a look: {e:#}");
        return result;
    }
    workload::delete_namespace(cluster)?;
    agent::remove(cluster)?;
    for volume in &cluster.info.storage()?.volumes {
        workload::free_pv(cluster, &volume.pv)?;
    }
    Ok(())
}

fn scenarios(e2e: &E2e, agent_pod: &str) -> Result<()> {
    let shared = step("two pods share the claim", || episode::set_up(e2e))?;
    let driver = step("the driver's own condition", || {
        csi::shown(e2e, &shared, agent_pod)
    })?;
    let warnings = step("errors on the shared claim", || {
        episode::raise(e2e, &shared, agent_pod, &driver)
    })?;
    let (new_pod, warnings) = step("the DaemonSet restarted mid-episode", || {
        episode::restart(e2e, &shared, agent_pod, &warnings, &driver)
    })?;
    let new_name = new_pod.metadata.name.clone().context("a pod name")?;
    step("recovery", || episode::recover(e2e, &warnings, &driver))?;
    step("pods of the shared claim deleted", || {
        let uids = [shared.uids[0].as_str(), shared.uids[1].as_str()];
        workload::delete_pods(&e2e.cluster, &episode::PODS, &uids)
    })?;
    step("a raw block volume", || block::attribute(e2e, &new_name))?;
    step("the README's step 4: a full volume", || {
        capacity::fill_and_free(e2e)
    })?;
    step("the agent's log", || {
        agent::quiet_log(&e2e.cluster, &new_name)
    })
}
