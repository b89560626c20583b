//! The leader's work ([`Worker`]), from taking the lead to losing it: it
//! takes over the Events of earlier leaders, runs the CSI cycles and the
//! node check, and hands their conditions to the event recorder and the
//! status writer. [`crate::run`] starts one each time this replica leads.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use health_core::conditions::ConditionConfig;
use health_kube::events::{ObjectKind, ObjectRef, Recorder, RecorderConfig, Shared};
use health_kube::observer::Observer;
use health_kube::writer;
use kube::Client;

use crate::cycle::Prober;
use crate::inventory::{Inventory, MonitoredVolume, NodeState};
use crate::metrics::ControllerMetrics;
use crate::nodes::{self, NodeWatch};
use crate::pvs::{self, PvHealth};
use crate::status;

/// `source.component` and `reportingComponent` of the controller's Events.
pub const COMPONENT: &str = "volume-health-controller";

/// Continued Events are never cleared by time alone here: the controller
/// ends them on evidence (see [`Worker::start`]).
const NEVER: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long a recovery Event waits at most for its claim's `VolumeHealth`
/// and label (a write takes a few requests; this is for a status writer
/// that keeps failing: the Event then goes out anyway).
const RECOVERY_WAITS_FOR_STATUS: Duration = Duration::from_secs(10);

/// What the worker reads of the cluster; the reflectors in production.
pub trait ClusterState: Send + Sync {
    /// This driver's PVs, sorted by PV name.
    fn volumes(&self) -> Arc<Vec<MonitoredVolume>>;
    fn nodes(&self) -> Vec<NodeState>;
}

impl ClusterState for Inventory {
    fn volumes(&self) -> Arc<Vec<MonitoredVolume>> {
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
            let claims: std::collections::HashSet<&ObjectRef> =
                volumes.iter().filter_map(|v| v.claim.as_deref()).collect();
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
            None,
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
    async fn sync_status(&mut self, volumes: &Arc<Vec<MonitoredVolume>>) {
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
        // PVs deleted while the calls ran are dropped with their state.
        let current = cluster.volumes();
        {
            let mut r = self.shared.lock();
            let now = SystemTime::now();
            self.pvs
                .apply(&volumes, probed.observations, &current, &mut r, now);
        }
        drop(volumes);
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
    pub(crate) async fn flush(&self, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        self.shared.wake();
        while self.shared.lock().has_pending() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
