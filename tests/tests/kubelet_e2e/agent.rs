//! The agent as users install it: `kubectl apply -k deploy/` or the Helm
//! chart with its defaults (plus `extraArgs`), removed completely between
//! the two (Helm does not adopt what kubectl made); its DaemonSet pod, its
//! probes, its logs and its metrics through the API server's pod proxy.

use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use health_tests::manifests::repo_root;
use health_tests::node_cluster::{poll, NodeCluster};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, ListParams};

pub const AGENT_NS: &str = "volume-health";
pub const DAEMON_SET: &str = "volume-health-agent";
pub const RELEASE: &str = "volume-health";
pub const METRICS_PORT: u16 = 9808;
const SELECTOR: &str = "app.kubernetes.io/name=volume-health,app.kubernetes.io/component=agent";

/// The kernel quiet window the chart's agent runs with: long enough to
/// outlast a rolling restart of the DaemonSet (old pod stopped, new one
/// Ready after its first readiness probe, 10 s apart), short enough for CI.
pub const QUIET_WINDOW: Duration = Duration::from_secs(25);
/// Seconds between the agent's CSI calls per volume.
pub const CSI_INTERVAL_SECS: u64 = 2;

/// `extraArgs` of the chart: the only values the tests set. Quick checks,
/// CSI calls and Event updates, and the quiet window above.
pub fn extra_args() -> Vec<String> {
    vec![
        "--check-interval=1".into(),
        format!("--csi-interval={CSI_INTERVAL_SECS}"),
        "--event-update-interval=1".into(),
        format!("--kernel-quiet-window={}", QUIET_WINDOW.as_secs()),
    ]
}

/// Where the DaemonSet's agents pin (the agent's default `--pin-dir`).
const PIN_DIR: &str = "/sys/fs/bpf/volume-health";

/// Removes whatever installs the agent: the Helm release and the objects of
/// deploy/, and waits until its namespace and pods are gone. An agent that
/// ran removes the kernel state it pinned on the node as it stops (its
/// DaemonSet is gone): nothing may stay pinned.
pub fn remove(cluster: &NodeCluster) -> Result<()> {
    let daemon_sets = Api::<DaemonSet>::namespaced(cluster.admin.clone(), AGENT_NS);
    let installed = cluster.block_on(daemon_sets.get_opt(DAEMON_SET))?.is_some();
    // An agent that never started (a capability refused) pinned nothing.
    let pinned_before = installed && pinned().is_some();
    let status = cluster
        .tools
        .helm_output(&["status", RELEASE, "-n", AGENT_NS])?;
    if status.status.success() {
        cluster.tools.helm(&[
            "uninstall",
            RELEASE,
            "-n",
            AGENT_NS,
            "--wait",
            "--timeout",
            "60s",
        ])?;
    }
    let deploy = repo_root().join("deploy");
    cluster.tools.kubectl(&[
        "delete",
        "-k",
        &deploy.to_string_lossy(),
        "--ignore-not-found",
        "--wait=true",
        "--timeout=90s",
    ])?;
    let namespaces = Api::<Namespace>::all(cluster.admin.clone());
    poll(
        "the agent's namespace to be gone",
        Duration::from_secs(90),
        || {
            Ok(match cluster.block_on(namespaces.get_opt(AGENT_NS))? {
                None => Ok(()),
                Some(ns) => Err(format!("{:?}", ns.status)),
            })
        },
    )?;
    if pinned_before {
        poll(
            "the agents to remove what they pinned",
            Duration::from_secs(30),
            || {
                Ok(pinned()
                    .map(|left| Err(format!("{left:?} under {PIN_DIR}")))
                    .unwrap_or(Ok(())))
            },
        )?;
    }
    Ok(())
}

/// The running agent pinned its programs on the node (what [`remove`]
/// then finds removed).
pub fn check_pinned() -> Result<()> {
    let layouts =
        pinned().with_context(|| format!("the running agent pinned nothing under {PIN_DIR}"))?;
    ensure!(layouts.len() == 1, "pinned under {PIN_DIR}: {layouts:?}");
    Ok(())
}

/// What is pinned under [`PIN_DIR`], if anything.
fn pinned() -> Option<Vec<String>> {
    let entries: Vec<String> = std::fs::read_dir(PIN_DIR)
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    (!entries.is_empty()).then_some(entries)
}

/// `kubectl apply -k deploy/`, the manifests as they ship.
pub fn apply_kustomization(cluster: &NodeCluster) -> Result<()> {
    let deploy = repo_root().join("deploy");
    cluster
        .tools
        .kubectl(&["apply", "-k", &deploy.to_string_lossy()])?;
    Ok(())
}

/// `kubectl delete -k deploy/`, waiting for every object to go.
pub fn delete_kustomization(cluster: &NodeCluster) -> Result<()> {
    remove(cluster)
}

/// `helm install volume-health deploy/helm/volume-health -n volume-health
/// --create-namespace` with its defaults and [`extra_args`] only.
/// Returns what helm printed (its NOTES among it).
pub fn install_chart(cluster: &NodeCluster, dir: &std::path::Path) -> Result<String> {
    install_chart_with(cluster, dir, &[])
}

/// [`install_chart`] with `--set` of each of `sets` too.
pub fn install_chart_with(
    cluster: &NodeCluster,
    dir: &std::path::Path,
    sets: &[&str],
) -> Result<String> {
    let values = dir.join("values.yaml");
    let args: Vec<String> = extra_args()
        .iter()
        .map(|a| format!("  - \"{a}\"\n"))
        .collect();
    std::fs::write(&values, format!("extraArgs:\n{}", args.concat()))?;
    let chart = repo_root().join("deploy/helm/volume-health");
    let chart = chart.to_string_lossy();
    let values = values.to_string_lossy();
    let mut args = vec![
        "install",
        RELEASE,
        &chart,
        "-n",
        AGENT_NS,
        "--create-namespace",
        "-f",
        &values,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    cluster.tools.helm(&args)
}

/// Runs the commands the chart's NOTES give to check the install (each
/// `kubectl ...` line), as a user would; each must succeed, and the last
/// (`health-agent volumes` in an agent's container) must print the node's
/// volumes.
pub fn run_the_notes_checks(cluster: &NodeCluster, printed: &str) -> Result<()> {
    let checks: Vec<Vec<&str>> = printed
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("kubectl "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    ensure!(
        checks.len() == 3,
        "the NOTES give {} kubectl commands, not 3:\n{printed}",
        checks.len()
    );
    let mut last = String::new();
    for check in &checks {
        last = cluster
            .tools
            .kubectl(check)
            .with_context(|| format!("the NOTES' check kubectl {}", check.join(" ")))?;
    }
    // The running agent's conditions (asked on its socket in the state
    // directory, which the container's environment names), then its
    // node's pod volumes, one line each (conditions indented below), or
    // that there are none yet.
    let mut lines = last.lines();
    ensure!(
        lines.next()
            == Some(
                "conditions: the running agent's (asked at /var/lib/volume-health/conditions.sock)"
            )
            && lines.next().is_some_and(|l| {
                l == "no pod volumes found" || (l.starts_with("pod ") && l.contains(" pv "))
            }),
        "health-agent volumes in the agent's container printed:\n{last}"
    );
    eprintln!("the NOTES' checks passed; health-agent volumes:\n{last}");
    Ok(())
}

/// Waits until the DaemonSet has exactly one pod, updated and Ready, other
/// than `not` (the pod a restart replaces); returns it. A container that
/// cannot start (refused capabilities, a missing image, a crash loop) fails
/// at once with its reason and the pod's log.
pub fn wait_ready(cluster: &NodeCluster, not: Option<&str>, within: Duration) -> Result<Pod> {
    let sets = Api::<DaemonSet>::namespaced(cluster.admin.clone(), AGENT_NS);
    let pods = Api::<Pod>::namespaced(cluster.admin.clone(), AGENT_NS);
    poll("the agent's DaemonSet pod to be Ready", within, || {
        let Some(ds) = cluster.block_on(sets.get_opt(DAEMON_SET))? else {
            return Ok(Err("no DaemonSet yet".into()));
        };
        let listed = cluster.block_on(pods.list(&ListParams::default().labels(SELECTOR)))?;
        for pod in &listed.items {
            if let Some(stuck) = cannot_start(pod) {
                let name = pod.metadata.name.as_deref().unwrap_or("?");
                bail!(
                    "agent pod {name} cannot start: {stuck}\nits log:\n{}",
                    logs(cluster, name)
                );
            }
        }
        let status = ds.status.unwrap_or_default();
        let fresh: Vec<&Pod> = listed
            .items
            .iter()
            .filter(|p| {
                p.metadata.name.as_deref() != not && p.metadata.deletion_timestamp.is_none()
            })
            .collect();
        let settled = status.desired_number_scheduled == 1
            && status.number_ready == 1
            && status.updated_number_scheduled == Some(1)
            && listed.items.len() == 1;
        match fresh.as_slice() {
            [pod] if settled && is_ready(pod) => Ok(Ok((*pod).clone())),
            _ => Ok(Err(format!(
                "DaemonSet {status:?}; pods {:?}",
                listed
                    .items
                    .iter()
                    .map(|p| (
                        p.metadata.name.clone(),
                        p.status.as_ref().map(|s| s.phase.clone())
                    ))
                    .collect::<Vec<_>>()
            ))),
        }
    })
}

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Why a container of `pod` cannot start, if one cannot.
fn cannot_start(pod: &Pod) -> Option<String> {
    const FATAL: &[&str] = &[
        "CreateContainerError",
        "CreateContainerConfigError",
        "RunContainerError",
        "CrashLoopBackOff",
        "ErrImageNeverPull",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
    ];
    let statuses = pod.status.as_ref()?.container_statuses.as_ref()?;
    statuses.iter().find_map(|c| {
        let waiting = c.state.as_ref()?.waiting.as_ref()?;
        let reason = waiting.reason.as_deref()?;
        FATAL.contains(&reason).then(|| {
            format!(
                "container {} waiting: {reason}: {}",
                c.name,
                waiting.message.as_deref().unwrap_or("")
            )
        })
    })
}

/// Fails unless the agent's whole log is plain text without a warning
/// about what the suite did: everything it did to this node (CNI network
/// namespaces, pods starting and stopping, raw block volumes being mapped,
/// faults, the driver's conditions) is what a node does, and the agent
/// reports what it found in Events and metrics, not in its log.
///
/// One warning is about the node itself and stays: this VM's cgroups give
/// the pod no real-time budget, so the event path's SCHED_FIFO is refused
/// (docs/operations.md, "Log warnings").
pub fn quiet_log(cluster: &NodeCluster, pod: &str) -> Result<()> {
    const ABOUT_THE_NODE: &str = "WARN health_node::agent: the event path runs at SCHED_OTHER";
    let log = cluster.tools.kubectl(&["logs", "-n", AGENT_NS, pod])?;
    ensure!(
        !log.contains('\x1b'),
        "colour codes in the log of {pod}:\n{log}"
    );
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .filter(|l| !l.contains(ABOUT_THE_NODE))
        .collect();
    ensure!(
        warnings.is_empty(),
        "{} warnings in the log of {pod}:\n{}",
        warnings.len(),
        warnings.join("\n")
    );
    Ok(())
}

/// The pod's log (and the previous container's, after a restart), for
/// failure messages; what could not be read is said instead.
pub fn logs(cluster: &NodeCluster, pod: &str) -> String {
    let mut text = String::new();
    for previous in [true, false] {
        let mut args = vec!["logs", "-n", AGENT_NS, pod, "--tail=80"];
        if previous {
            args.push("--previous");
        }
        match cluster.tools.kubectl_output(&args) {
            Ok(out) if out.status.success() => {
                text += &format!(
                    "--- {pod}{} ---\n{}",
                    if previous { " (previous)" } else { "" },
                    String::from_utf8_lossy(&out.stdout)
                );
            }
            Ok(out) if !previous => {
                text += &format!("(no log: {})", String::from_utf8_lossy(&out.stderr));
            }
            Ok(_) => {}
            Err(e) => text += &format!("(no log: {e:#})"),
        }
    }
    text
}

/// The agent pod's `/metrics`, through the API server's pod proxy.
pub fn metrics(cluster: &NodeCluster, pod: &str) -> Result<String> {
    cluster.pod_get(AGENT_NS, pod, METRICS_PORT, "/metrics")
}

/// The agent's probes answer through the proxy as the kubelet's do.
pub fn check_probes(cluster: &NodeCluster, pod: &str) -> Result<()> {
    for path in ["/healthz", "/readyz"] {
        cluster
            .pod_get(AGENT_NS, pod, METRICS_PORT, path)
            .with_context(|| format!("the agent's {path}"))?;
    }
    Ok(())
}

/// The metric families the agent serves from its start, with the gauges
/// that say it is ready and live and its version.
pub fn check_families(text: &str) -> Result<()> {
    for line in [
        "volume_health_ready 1",
        "volume_health_live 1",
        "volume_health_build_info{version=\"0.1.0\"} 1",
    ] {
        ensure!(
            text.lines().any(|l| l == line),
            "no {line:?} in the agent's metrics:\n{text}"
        );
    }
    // Families with labels appear with their first series; these have
    // one from the start.
    for family in [
        "volume_health_samples_suppressed",
        "volume_health_ringbuf_lost_samples",
        "volume_health_counter_map_full",
        "volume_health_kernel_program_misses",
        "volume_health_kernel_uncounted_errors",
        "volume_health_api_requests",
        "volume_health_volumes",
        "volume_health_build_info",
    ] {
        let declared = format!("# TYPE {family} ");
        ensure!(
            text.lines().any(|l| l.starts_with(&declared)),
            "no family {family} in the agent's metrics:\n{text}"
        );
    }
    Ok(())
}

/// The running agent pod's container: the image it runs and its args.
pub fn container(pod: &Pod) -> Result<(String, Vec<String>, i32)> {
    let spec = pod.spec.as_ref().context("a pod spec")?;
    let c = spec.containers.first().context("a container")?;
    let restarts = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|s| s.first())
        .map_or(0, |s| s.restart_count);
    Ok((
        c.image.clone().unwrap_or_default(),
        c.args.clone().unwrap_or_default(),
        restarts,
    ))
}

/// When the pod was created, its container started, and it went Ready, by
/// its own status: for the test's log.
pub fn startup(pod: &Pod) -> String {
    let created = pod
        .metadata
        .creation_timestamp
        .as_ref()
        .map(|t| t.0.to_string());
    let status = pod.status.as_ref();
    let started = status
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|s| s.first())
        .and_then(|c| c.state.as_ref()?.running.as_ref()?.started_at.as_ref())
        .map(|t| t.0.to_string());
    let ready = status
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.to_string());
    format!(
        "pod {:?} created {created:?}, container started {started:?}, Ready {ready:?}",
        pod.metadata.name
    )
}

/// CAP_SYS_RESOURCE (`capability(7)`: 24), which the chart asks for with
/// `memlockCapability=true`.
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether this host's runtime can grant CAP_SYS_RESOURCE to a container:
/// runc can only keep what its own bounding set holds (`CapBnd` of
/// /proc/self/status; the containerd here runs with the same set).
pub fn host_can_grant_sys_resource() -> Result<bool> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    let bounding = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .context("no CapBnd in /proc/self/status")?;
    let set = u64::from_str_radix(bounding.trim(), 16).context("CapBnd is not hex")?;
    Ok(set & (1 << CAP_SYS_RESOURCE) != 0)
}

/// The agent's container failed to start because runc could not grant its
/// capabilities: runc's words, as the kubelet reports them.
pub fn wait_capability_refused(cluster: &NodeCluster, within: Duration) -> Result<String> {
    let pods = Api::<Pod>::namespaced(cluster.admin.clone(), AGENT_NS);
    poll("the agent's container to be refused", within, || {
        let list = cluster.block_on(pods.list(&ListParams::default()))?;
        for pod in &list.items {
            let spec = pod.spec.as_ref().context("a pod spec")?;
            let added = spec.containers[0]
                .security_context
                .as_ref()
                .and_then(|s| s.capabilities.as_ref())
                .and_then(|c| c.add.clone())
                .unwrap_or_default();
            ensure!(
                added.iter().any(|c| c == "SYS_RESOURCE"),
                "the chart did not ask for SYS_RESOURCE: {added:?}"
            );
            let statuses = pod
                .status
                .as_ref()
                .and_then(|s| s.container_statuses.clone())
                .unwrap_or_default();
            for s in statuses {
                ensure!(
                    !s.ready,
                    "the agent runs although the host cannot grant SYS_RESOURCE"
                );
                let ended = s.last_state.and_then(|l| l.terminated);
                if let Some(t) = ended {
                    let message = t.message.unwrap_or_default();
                    if t.reason.as_deref() == Some("StartError") {
                        return Ok(Ok(message));
                    }
                    return Ok(Err(format!("terminated {:?}: {message}", t.reason)));
                }
            }
        }
        Ok(Err(format!("{} pods, none refused yet", list.items.len())))
    })
}
