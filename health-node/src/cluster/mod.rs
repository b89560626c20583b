//! Cluster mode (`health-agent run`): this node's pods and the PVs they use
//! ([`pod_volumes`]), and Kubernetes Events and `VolumeHealth` entries on every pod
//! and PVC a volume condition concerns ([`report`]). The last stage: uses
//! [`crate::volumes`], [`crate::report`] and `health_kube`, and runs the
//! agent loop with its own reporter; nothing uses it but the binary.
//!
//! Where an error travels in cluster mode: the collector's batch reaches
//! [`crate::volumes::VolumeMonitor`], whose condition changes go to the
//! event recorder (`health_kube::events`), which aggregates them per
//! (object, reason) and writes core/v1 Events within a per-object budget.
//! A recovery Event on a PVC is written once this node's `VolumeHealth`
//! entries on the claim (and so the label) no longer assert the condition,
//! as the controller's are: the Events, the object and the label tell one
//! story, across a restart too. Pods have no such object: their Events do
//! not wait.

/// Everything the agent asks of the API server. Nothing it reads grows with
/// the cluster: it reads this node's pods, the PVs they use, and the
/// objects it wrote itself (docs/large-clusters.md).
/// - pods: a reflector over this node's pods (`fieldSelector=spec.nodeName=NODE`,
///   from the watch cache);
/// - persistentvolumes: a GET of each PV a kubelet volume directory here
///   names; its `spec.claimRef` names the PVC (namespace, name, uid), so no
///   PVC read is needed;
/// - events (core/v1, which the Node authorizer also allows): created with
///   this node's label (`health_kube::node_label`), then aggregated by
///   patching `count`, `lastTimestamp` and `message`; never listed: the
///   episodes open across a restart continue from the node's own copy
///   ([`EVENTS_FILE`]);
/// - volumehealths (the project's CRD): read, created by server-side apply
///   (patch), labelled with this node while it has entries there, listed
///   once at start by that label to continue this node's entries;
///   volumehealths/status: this node's entries by server-side apply;
/// - persistentvolumeclaims: patch, for the label `volume-health.io/health`
///   only (the admission policy in deploy/ holds the agent to that);
/// - daemonsets (apps): get, of the agent's own DaemonSet only (RBAC's
///   resourceNames), once as it stops: removed means uninstalled.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list", "watch"],
        names: &[],
    },
    ApiAccess {
        group: "",
        resource: "persistentvolumes",
        verbs: &["get"],
        names: &[],
    },
    ApiAccess {
        group: "",
        resource: "events",
        verbs: &["create", "patch"],
        names: &[],
    },
    ApiAccess {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["patch"],
        names: &[],
    },
    ApiAccess {
        group: status::types::GROUP,
        resource: "volumehealths",
        verbs: &["get", "list", "create", "patch"],
        names: &[],
    },
    ApiAccess {
        group: status::types::GROUP,
        resource: "volumehealths/status",
        verbs: &["patch"],
        names: &[],
    },
    // Its own DaemonSet only (resourceNames), once as it stops ([`uninstall`]).
    ApiAccess {
        group: "apps",
        resource: "daemonsets",
        verbs: &["get"],
        names: &[DAEMONSET_NAME],
    },
];

pub mod pod_volumes;
pub mod pvs;
pub mod report;
mod uninstall;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use health_kube::http::{self, Health};
use health_kube::{config, events, request_metrics, status, writer, ApiAccess};

use crate::agent::{self, AgentOptions};
use crate::report::metrics::Metrics;

/// Where the conditions socket is, and whether the agent can do without it.
#[derive(Clone, Debug)]
pub enum ConditionsSocket {
    /// Asked for (`--volume-health-socket`): a CSI proxy depends on it, so
    /// not serving it is an error.
    Required(PathBuf),
    /// The default, in the state directory, for `health-agent volumes`:
    /// not serving it is logged and the agent goes on.
    Default(PathBuf),
}

#[derive(Clone, Debug)]
pub struct RunOptions {
    pub agent: AgentOptions,
    pub node: String,
    /// `None`: in-cluster configuration (or `KUBECONFIG`, for development).
    pub kubeconfig: Option<PathBuf>,
    pub metrics_addr: SocketAddr,
    pub events: events::RecorderConfig,
    /// Where the agent answers `health-agent csi-proxy` and `health-agent
    /// volumes` with its conditions (`crate::conditions_socket`).
    pub volume_health_socket: ConditionsSocket,
    /// A directory on the node that outlives the agent's container: the
    /// copy of this node's Events ([`EVENTS_FILE`]) is kept there.
    pub state_dir: PathBuf,
    /// The DaemonSet the agent runs in: asked about as the agent stops,
    /// whose removal (an uninstall) removes the pins ([`uninstall`]).
    pub daemonset: Option<DaemonSetRef>,
}

/// The name of the agents' DaemonSet in deploy/ and the chart, the one
/// object of its kind they may read.
pub const DAEMONSET_NAME: &str = "volume-health-agent";

/// A DaemonSet by namespace and name (`--daemonset NAMESPACE/NAME`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DaemonSetRef {
    pub namespace: String,
    pub name: String,
}

/// The file in `--state-dir` that holds this node's Events as the API
/// server last accepted them ([`events::LocalCopy`]): a restarted agent
/// continues its open episodes from it without listing Events, which the
/// API server would read in full from etcd (Events are not in its watch
/// cache).
pub const EVENTS_FILE: &str = "events.json";

/// How long the agent may go without a loop iteration before `/healthz`
/// fails. The loop wakes at least once a second (the reconcile tick).
const STALE_AFTER: Duration = Duration::from_secs(30);
/// On shutdown, Events still unwritten get this long.
const FINAL_FLUSH: Duration = Duration::from_secs(3);
/// How long a recovery Event on a PVC waits at most for this node's
/// `VolumeHealth` entries and the label (a write takes a few requests;
/// this is for a status writer that keeps failing: the Event then goes out
/// anyway). The controller's value, for the same reason.
const RECOVERY_WAITS_FOR_STATUS: Duration = Duration::from_secs(10);

/// `health-agent run`: the DaemonSet agent.
pub async fn run(opts: RunOptions) -> anyhow::Result<()> {
    let config = config(opts.kubeconfig.as_deref()).await?;
    // Both clients count every request they send in the metrics.
    let metrics = Arc::new(Metrics::new());
    let observer: Arc<dyn health_kube::observer::Observer> = metrics.clone();
    let client = request_metrics::client(config.clone(), Arc::clone(&observer))
        .context("creating the Kubernetes client")?;
    // The Event writer's own client: built here, where building can fail,
    // and started on the event thread's runtime (its request queue and
    // connections are tasks of the runtime it starts on).
    let writer_client = request_metrics::client_builder(config, Arc::clone(&observer))
        .context("creating the Kubernetes client")?;
    let health = Health::new(STALE_AFTER);
    let listener = http::bind(opts.metrics_addr).await?;
    let served = match &opts.volume_health_socket {
        ConditionsSocket::Required(path) => Some(
            crate::conditions_socket::serve(path)
                .await
                .context("serving the conditions socket (--volume-health-socket)")?,
        ),
        ConditionsSocket::Default(path) => match crate::conditions_socket::serve(path).await {
            Ok(served) => Some(served),
            Err(e) => {
                tracing::error!(
                    socket = %path.display(),
                    error = %format!("{:#}", anyhow::Error::from(e)),
                    "not serving the conditions socket: `health-agent volumes` on this node judges alone"
                );
                None
            }
        },
    };
    let server = tokio::spawn(http::serve(listener, metrics.clone(), health.clone()));

    // Nothing below waits for the API server: detection starts at once,
    // the reflectors and the writer retry in the background.
    let (view, watchers) = pod_volumes::ClusterView::start(client.clone(), &opts.node);
    // Held before anything is recorded or continued: a recovery on a claim
    // recorded now waits for the status writer started below, whose
    // results reach this recorder through the metrics' observer.
    let mut recorder = events::Recorder::new(opts.events.clone());
    recorder.hold_recoveries(RECOVERY_WAITS_FOR_STATUS);
    let shared = events::Shared::new(recorder);
    metrics.status_follower().follow(&shared);
    // The open Events of an earlier process on this node go on from the
    // node's copy of them, before anything is recorded.
    let kept = local_copy(&opts.state_dir);
    writer::recover_from(&kept, &shared);
    let companion = agent::Companion {
        task: Box::pin({
            let (shared, observer) = (Arc::clone(&shared), Arc::clone(&observer));
            async move { writer::write(writer_client.build(), shared, Some(observer), Some(kept)).await }
        }),
        drain: Box::pin(final_flush(Arc::clone(&shared))),
    };
    let board = status::SharedWritePlan::new(
        status::WritePlan::new(
            opts.events.min_update_interval,
            opts.events.unclaimed_clear_after,
        )
        .with_settle(status::SETTLE),
    );
    let status_api = status::StatusApi::new(
        client.clone(),
        status::node_manager(&opts.node),
        status::node_entry_names(&opts.node),
        Some(Arc::clone(&observer)),
    )
    .with_node_label(&opts.node);
    let status_writer = tokio::spawn(status::run(status_api, Arc::clone(&board), client.clone()));
    let sink = report::StatusSink {
        node: opts.node.clone(),
        board,
    };
    let reporter =
        report::ClusterReporter::new(view, Arc::clone(&shared), metrics, health, Some(sink));
    let reporter =
        crate::conditions_socket::Publishing::new(reporter, served.as_ref().map(|s| s.board()));
    let pin_root = opts.agent.probes.pin_root.clone();
    let sys_root = opts.agent.host.sys_root.clone();
    let result = agent::run(opts.agent, reporter, Some(companion)).await;
    drop(served);
    // After the programs' last reader is gone (the pins' lock with it).
    if let (Ok(()), Some(ds), Some(root)) = (&result, &opts.daemonset, &pin_root) {
        uninstall::unpin_if_uninstalled(client.clone(), ds, root, &sys_root).await;
    }

    status_writer.abort();
    server.abort();
    for w in watchers {
        w.abort();
    }
    result
}

/// The copy of this node's Events in `state_dir`. A copy that cannot be
/// read is reported and replaced: open episodes then start new Events, as
/// on a first start. It is written back at once (the directory made if
/// missing), so that a directory the agent cannot write is reported now
/// rather than at the first Event; neither stops the agent, whose detection
/// does not depend on it (a node whose disk failed needs the agent most),
/// and the writing never holds it (`LocalCopy::save_in_background`).
fn local_copy(state_dir: &Path) -> events::LocalCopy {
    let path = state_dir.join(EVENTS_FILE);
    let mut copy = events::LocalCopy::load(&path).unwrap_or_else(|e| {
        tracing::error!("{e}; starting without this node's earlier Events");
        events::LocalCopy::empty(&path)
    });
    copy.save_in_background(SystemTime::now());
    copy
}

/// Gives Events recorded at the end (the final reconcile) a moment to be
/// written, on the runtime the writer runs on.
async fn final_flush(shared: Arc<events::Shared>) {
    let deadline = tokio::time::Instant::now() + FINAL_FLUSH;
    shared.wake();
    while shared.lock().has_pending() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if shared.lock().has_pending() {
        tracing::warn!("stopping with Events not yet written (API server slow or away)");
    }
}
