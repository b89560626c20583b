//! The cluster-side controller (`health-controller`): the cluster-side half
//! of KEP-1432, a sidecar in a CSI driver's controller pod sharing its
//! socket. One replica works (the Lease holder, [`leader`]); the others
//! stand by. Uses `health-core` (conditions), `health-kube` (Events,
//! `VolumeHealth`, metrics) and `health-csi`; no aya and no kernel programs,
//! so its image carries neither.
//!
//! Where a backend condition travels: the leader's cycle ([`cycle`]) asks
//! the driver's controller service about every PV of the driver (one List
//! walk, or one Get per volume) -> one observation per PV feeds that PV's
//! [`health_core::conditions::VolumeHealth`] ([`pvs`]) -> the changes
//! go to the event recorder ([`health_kube::events`]) on the PV's claim ->
//! the writer ([`health_kube::writer`]) creates or patches the Event. Only
//! changes are written: a volume abnormal for a day costs one Warning, and
//! its recovery one Normal `<Reason>Cleared`.
//!
//! Beside it, [`nodes`] turns a node down past `--node-grace` into an
//! `Inaccessible NodeNotReady` condition on the pods there that use the
//! driver's claims, and on those claims. [`inventory`] holds the PVs and
//! Nodes (reflectors; no PVC or Pod watch).
//!
//! A takeover continues Events instead of duplicating them: the new leader
//! lists the Events of its component (any replica's), seeds its PV states
//! from the open Warnings (and from what the claims' `VolumeHealth`
//! objects say the driver asserted), and patches those same Events from
//! then on, as their `reportingInstance`. A recovery Event on a claim is
//! written once its `VolumeHealth` and label no longer say so: the Events,
//! the object and the label tell one story, across takeovers too.

pub mod cycle;
pub mod inventory;
pub mod leader;
pub mod metrics;
pub mod nodes;
pub mod pvs;
pub mod status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use cycle::{CycleConfig, Prober};
use health_core::conditions::ConditionConfig;
use health_csi::{ControllerClient, CsiError, NodeClient};
use health_kube::events::{ObjectKind, Recorder, RecorderConfig};
use health_kube::http::{self, Health};
use health_kube::writer::{self, Observer, Shared};
use health_kube::ApiAccess;
use inventory::{Inventory, MonitoredVolume, NodeState};
use kube::Client;
use leader::{Election, LeaseConfig};
use metrics::ControllerMetrics;
use nodes::NodeWatch;
use pvs::PvHealth;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

/// `source.component` and `reportingComponent` of the controller's Events.
pub const COMPONENT: &str = "volume-health-controller";

/// Everything the controller asks of the API server, cluster-wide:
/// - persistentvolumes: a reflector (this driver's are kept);
/// - nodes: a reflector (Ready condition, unreachable taint);
/// - pods: listed on demand for ONE node that went down
///   (`fieldSelector=spec.nodeName=NODE`); never watched;
/// - events: created, patched to aggregate, listed on taking the lead
///   (`fieldSelector=reportingComponent=volume-health-controller`);
/// - volumehealths: the entries `CSIDriver` and `Controller` of each claim
///   with a condition (read, created and updated by server-side apply,
///   listed on taking the lead); volumehealths/status;
/// - persistentvolumeclaims: patch, the label `volume-health.io/health`;
///   persistentvolumeclaims/status: patch, `healthStatus` where the server
///   has it.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "",
        resource: "persistentvolumes",
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list"],
    },
    ApiAccess {
        group: "",
        resource: "events",
        verbs: &["create", "patch", "list"],
    },
    ApiAccess {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get", "patch"],
    },
    ApiAccess {
        group: "",
        resource: "persistentvolumeclaims/status",
        verbs: &["patch"],
    },
    ApiAccess {
        group: health_kube::status::types::GROUP,
        resource: "volumehealths",
        verbs: &["get", "list", "watch", "create", "patch"],
    },
    ApiAccess {
        group: health_kube::status::types::GROUP,
        resource: "volumehealths/status",
        verbs: &["patch"],
    },
];

/// What kube-lease-manager 0.13 does with the Lease, in the controller's
/// own namespace: `get` (sync), `create` (when missing), `patch` (acquire,
/// renew and release, server-side apply and strategic merge).
pub const LEASE_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "patch"],
}];

#[derive(Clone, Debug)]
pub struct ControllerOptions {
    pub csi_address: PathBuf,
    pub kubeconfig: Option<PathBuf>,
    /// `None`: GetPluginInfo's name.
    pub driver: Option<String>,
    pub monitor_interval: Duration,
    pub list_page_size: u32,
    pub call_timeout: Duration,
    pub get_concurrency: usize,
    pub node_grace: Duration,
    /// `None`: `volume-health-<driver>`.
    pub lease_name: Option<String>,
    pub lease_namespace: String,
    pub identity: String,
    pub lease_duration: Duration,
    pub metrics_addr: SocketAddr,
    pub event_writes_per_minute: u32,
    pub event_update_interval: Duration,
}

/// Pages walked at most per List cycle: with the default page size, a
/// million volumes.
pub const MAX_PAGES: u32 = 2000;
const STALE_AFTER: Duration = Duration::from_secs(60);
const NODE_CHECK_EVERY: Duration = Duration::from_secs(1);
const FINAL_FLUSH: Duration = Duration::from_secs(3);
/// Continued Events are never cleared by time alone here: the controller
/// ends them on evidence (see [`Worker::start`]).
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long a recovery Event waits at most for its claim's `VolumeHealth`
/// and label (a write takes a few requests; this is for a status writer
/// that keeps failing: the Event then goes out anyway).
const RECOVERY_WAITS_FOR_STATUS: Duration = Duration::from_secs(10);

/// `volume-health-<driver>` with every character outside `[a-z0-9-]`
/// replaced by `-` (a valid object name).
pub fn default_lease_name(driver: &str) -> String {
    let name: String = driver
        .to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
                c
            } else {
                '-'
            }
        })
        .collect();
    format!("volume-health-{name}")
}

/// What the worker reads of the cluster; the reflectors in production.
pub trait ClusterState: Send + Sync {
    fn volumes(&self) -> Vec<MonitoredVolume>;
    fn nodes(&self) -> Vec<NodeState>;
}

impl ClusterState for Inventory {
    fn volumes(&self) -> Vec<MonitoredVolume> {
        Inventory::volumes(self)
    }
    fn nodes(&self) -> Vec<NodeState> {
        Inventory::nodes(self)
    }
}

/// Recorder settings of the controller.
pub fn recorder_config(
    identity: &str,
    writes_per_minute: u32,
    update_interval: Duration,
) -> RecorderConfig {
    let mut config = RecorderConfig::new(identity);
    config.component = COMPONENT.to_string();
    config.writes_per_object_per_minute = writes_per_minute;
    config.min_update_interval = update_interval;
    config.adopt_any_instance = true;
    config.unclaimed_clear_after = NEVER;
    config
}

/// The leader's work, from taking the lead to losing it. Dropping it stops
/// the writer at once.
pub struct Worker {
    client: Client,
    shared: Arc<Shared>,
    prober: Prober,
    pvs: PvHealth,
    nodes: NodeWatch,
    metrics: Arc<ControllerMetrics>,
    call_timeout: Duration,
    writer: tokio::task::JoinHandle<()>,
    /// `VolumeHealth` entries and `pvc.status.healthStatus` (`None`: Events only).
    status: Option<status::StatusWriter>,
    /// [`NodeWatch::changes`] at the last status sync.
    synced_node_changes: u64,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.writer.abort();
    }
}

impl Worker {
    /// Takes over the Events of earlier leaders (listed, then continued
    /// where the condition still holds), then starts writing.
    pub async fn start(
        client: Client,
        recorder: RecorderConfig,
        prober: Prober,
        node_grace: Duration,
        call_timeout: Duration,
        metrics: Arc<ControllerMetrics>,
        cluster: &dyn ClusterState,
    ) -> Worker {
        let shared = Shared::new(Recorder::new(recorder));
        let observer: Arc<dyn Observer> = metrics.clone();
        writer::recover(&client, &shared).await;
        let mut pvs = PvHealth::new(ConditionConfig::default());
        {
            let mut r = shared.lock();
            let adopted = r.unclaimed();
            let volumes = cluster.volumes();
            let seeded = pvs.seed(&adopted, &volumes, &mut r);
            // Warnings on claims no PV of ours has any more end without a
            // recovery; those on pods and NodeNotReady are the node
            // check's to end.
            let claims: Vec<_> = volumes.iter().filter_map(|v| v.claim.clone()).collect();
            let dropped = r.drop_unclaimed(|o| o.kind == ObjectKind::Pod || claims.contains(o));
            tracing::info!(
                open = adopted.len(),
                seeded,
                dropped,
                "took over the Events of earlier leaders"
            );
        }
        let writer = tokio::spawn(writer::write(
            client.clone(),
            Arc::clone(&shared),
            Some(observer),
        ));
        shared.wake();
        Worker {
            client,
            shared,
            prober,
            pvs,
            nodes: NodeWatch::new(node_grace),
            metrics,
            call_timeout,
            writer,
            status: None,
            synced_node_changes: 0,
        }
    }

    /// Also writes the claims' `VolumeHealth` entries from now on, going
    /// on with what they say an earlier leader saw ([`PvHealth::seed_stored`]),
    /// and from now on a recovery Event on a claim waits until its object
    /// and label say so ([`Recorder::hold_recoveries`]).
    pub async fn with_status(
        mut self,
        mut status: status::StatusWriter,
        cluster: &dyn ClusterState,
    ) -> Self {
        // The writer's own list at start: one list per takeover.
        match status.take_listed() {
            None => {}
            Some(Ok(objects)) => {
                let stored = pvs::Stored::from_objects(&objects);
                let seeded = self.pvs.seed_stored(&stored, &cluster.volumes());
                tracing::info!(
                    listed = objects.len(),
                    seeded,
                    "took over the driver's conditions from the VolumeHealth objects"
                );
            }
            Some(Err(e)) => tracing::warn!(
                "could not list VolumeHealth objects ({e}); conditions only they hold are kept until this replica sees otherwise"
            ),
        }
        self.shared
            .lock()
            .hold_recoveries(RECOVERY_WAITS_FOR_STATUS);
        self.metrics.status_follower().follow(&self.shared);
        self.status = Some(status);
        self
    }

    /// Hands the status writer the conditions as they are now; `volumes`
    /// is the inventory the caller already holds (10,000 PVs are not
    /// copied again for this).
    async fn sync_status(&mut self, volumes: &[MonitoredVolume]) {
        let Some(status) = self.status.as_mut() else {
            return;
        };
        let now = SystemTime::now();
        status
            .sync(
                self.pvs.claim_conditions(),
                self.nodes.claim_conditions(now),
                volumes,
                now,
            )
            .await;
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// One CSI cycle over the driver's PVs.
    pub async fn csi_cycle(&mut self, cluster: &dyn ClusterState) {
        let started = Instant::now();
        let volumes = cluster.volumes();
        let probed = self.prober.cycle(&volumes, &self.metrics).await;
        drop(volumes);
        // PVs deleted while the calls ran are dropped with their state.
        let current = cluster.volumes();
        {
            let mut r = self.shared.lock();
            self.pvs
                .apply(probed.observations, &current, &mut r, SystemTime::now());
        }
        // Counted once its changes are with the recorder: a reader that saw
        // the count move can expect the cycle's Events to be on their way.
        self.metrics.cycle(probed.result, started.elapsed());
        self.metrics.set_volumes(current.len(), self.pvs.abnormal());
        self.shared.wake();
        self.sync_status(&current).await;
    }

    /// Node-down: recoveries, and the pods of nodes down past the grace.
    pub async fn node_check(&mut self, cluster: &dyn ClusterState) {
        let due = {
            let mut r = self.shared.lock();
            self.nodes
                .update(&cluster.nodes(), &mut r, SystemTime::now())
        };
        for node in due {
            let volumes = cluster.volumes();
            match nodes::affected_pods(&self.client, &node, &volumes, self.call_timeout).await {
                Ok(affected) => {
                    let mut r = self.shared.lock();
                    self.nodes
                        .report(&node, affected, &mut r, SystemTime::now());
                }
                Err(e) => tracing::warn!("{e}; retrying"),
            }
        }
        self.shared.wake();
        if self.nodes.changes() != self.synced_node_changes {
            self.synced_node_changes = self.nodes.changes();
            self.sync_status(&cluster.volumes()).await;
        }
    }

    /// Gives Events not yet written a moment (on shutdown).
    async fn flush(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        self.shared.wake();
        while self.shared.lock().has_pending() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Why the CSI side cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the CSI driver at {socket} serves no controller service (ControllerGetCapabilities is UNIMPLEMENTED); run the controller beside the driver's controller plugin")]
    NoControllerService { socket: String },
}

/// `health-controller`.
pub async fn run(opts: ControllerOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        !opts.lease_namespace.is_empty(),
        "no namespace for the lease: pass --lease-namespace or set POD_NAMESPACE"
    );
    let socket = opts.csi_address.display().to_string();
    let identity_client = NodeClient::connect(&opts.csi_address, opts.call_timeout)
        .await
        .with_context(|| format!("CSI socket {socket} (--csi-address)"))?;
    let driver = match &opts.driver {
        Some(d) => d.clone(),
        None => {
            identity_client
                .plugin_info()
                .await
                .with_context(|| {
                    format!("asking the CSI driver at {socket} for its name (or pass --driver)")
                })?
                .name
        }
    };
    let csi = ControllerClient::connect(&opts.csi_address, opts.call_timeout)
        .await
        .with_context(|| format!("CSI socket {socket}"))?;
    let caps = match csi.capabilities().await {
        Ok(caps) => caps,
        Err(CsiError::Unsupported { .. }) => {
            return Err(StartError::NoControllerService { socket }.into())
        }
        Err(e) => return Err(e).context("asking the CSI driver for its controller capabilities"),
    };
    tracing::info!(%driver, ?caps, "monitoring the CSI driver's volumes");

    let metrics = Arc::new(ControllerMetrics::new());
    // Every request of this client is counted in the metrics.
    let client = health_kube::client(opts.kubeconfig.as_deref(), metrics.clone()).await?;
    let health = Health::new(STALE_AFTER);
    let listener = http::bind(opts.metrics_addr).await?;
    let server = tokio::spawn(http::serve(listener, metrics.clone(), health.clone()));
    let (inventory, watchers) = Inventory::start(client.clone(), &driver);
    let lease = LeaseConfig {
        name: opts
            .lease_name
            .clone()
            .unwrap_or_else(|| default_lease_name(&driver)),
        namespace: opts.lease_namespace.clone(),
        identity: opts.identity.clone(),
        duration: opts.lease_duration,
    };
    let election = Election::start(client.clone(), lease);
    let mut leader = election.leader.clone();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    let cycle_config = CycleConfig {
        page_size: opts.list_page_size,
        max_pages: MAX_PAGES,
        get_concurrency: opts.get_concurrency,
    };
    'outer: loop {
        // Standing by.
        metrics.set_leader(false);
        loop {
            health.beat();
            health.set_ready(inventory.is_ready());
            tokio::select! {
                led = leader.wait_for(|l| *l) => match led {
                    Ok(_) => break,
                    // The election ended: nothing to lead any more.
                    Err(_) => break 'outer,
                },
                _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                _ = &mut shutdown => break 'outer,
            }
        }
        while !inventory.is_ready() {
            health.beat();
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = &mut shutdown => break 'outer,
            }
        }
        health.set_ready(true);
        metrics.set_leader(true);
        let prober = Prober::new(csi.clone(), caps.clone(), cycle_config.clone());
        let recorder = recorder_config(
            &opts.identity,
            opts.event_writes_per_minute,
            opts.event_update_interval,
        );
        let mut worker = Worker::start(
            client.clone(),
            recorder,
            prober,
            opts.node_grace,
            opts.call_timeout,
            Arc::clone(&metrics),
            &inventory,
        )
        .await
        .with_status(
            status::StatusWriter::start(
                client.clone(),
                &driver,
                opts.event_update_interval,
                metrics.clone(),
            )
            .await,
            &inventory,
        )
        .await;
        let mut csi_tick = tokio::time::interval(opts.monitor_interval);
        csi_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut node_tick = tokio::time::interval(NODE_CHECK_EVERY);
        node_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            health.beat();
            let step = async {
                tokio::select! {
                    _ = csi_tick.tick() => worker.csi_cycle(&inventory).await,
                    _ = node_tick.tick() => worker.node_check(&inventory).await,
                }
            };
            tokio::select! {
                _ = step => {}
                _ = lost(&mut leader) => {
                    // Dropping the worker aborts its writer: no write after this.
                    drop(worker);
                    continue 'outer;
                }
                _ = &mut shutdown => {
                    worker.flush(FINAL_FLUSH).await;
                    break 'outer;
                }
            }
        }
    }
    metrics.set_leader(false);
    election.shutdown().await;
    server.abort();
    for w in watchers {
        w.abort();
    }
    Ok(())
}

async fn lost(leader: &mut watch::Receiver<bool>) {
    // A closed channel (the election ended) is a loss as well.
    let _ = leader.wait_for(|l| !*l).await;
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!("cannot catch SIGTERM ({e}); only Ctrl-C stops gracefully");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("stopping: giving up the lease");
}
