//! `health-controller` from start to stop: it finds the driver's controller
//! service, serves `/metrics` and the health probes, keeps the inventory
//! and runs for the Lease; while it leads, a [`Worker`] does the work.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use health_csi::{ControllerCapabilities, ControllerClient, CsiError, NodeClient};
use health_kube::http::{self, Health};
use kube::Client;
use tokio::sync::watch;
use tokio::time::MissedTickBehavior;

use crate::cycle::{CycleConfig, Prober};
use crate::inventory::Inventory;
use crate::leader::{Election, LeaseConfig};
use crate::metrics::ControllerMetrics;
use crate::status::StatusWriter;
use crate::worker::{recorder_config, Worker};

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
/// `/healthz` fails when the main loop has not beaten for this long.
const STALE_AFTER: Duration = Duration::from_secs(60);
const NODE_CHECK_EVERY: Duration = Duration::from_secs(1);
/// What a stopping leader gives the Events not yet written.
const FINAL_FLUSH: Duration = Duration::from_secs(3);

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

/// Why the CSI side cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("the CSI driver at {socket} serves no controller service (ControllerGetCapabilities is UNIMPLEMENTED); run the controller beside the driver's controller plugin")]
    NoControllerService { socket: String },
}

/// The driver's controller service, as found at start.
struct Driver {
    name: String,
    csi: ControllerClient,
    caps: ControllerCapabilities,
}

/// How a stand-by or a term as leader ended.
#[derive(PartialEq, Eq)]
enum Ended {
    /// Lost (or never had) the lead: stand by again.
    Lead,
    /// SIGTERM, or the election is over: stop.
    Process,
}

/// `health-controller`: the driver first, then metrics, health and the
/// inventory, then stand-by and leading in turn until stopped.
pub async fn run(opts: ControllerOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        !opts.lease_namespace.is_empty(),
        "no namespace for the lease: pass --lease-namespace or set POD_NAMESPACE"
    );
    let driver = find_driver(&opts).await?;
    let metrics = Arc::new(ControllerMetrics::new());
    // Every request of this client is counted in the metrics.
    let client = health_kube::client(opts.kubeconfig.as_deref(), metrics.clone()).await?;
    let health = Health::new(STALE_AFTER);
    let listener = http::bind(opts.metrics_addr).await?;
    let server = tokio::spawn(http::serve(listener, metrics.clone(), health.clone()));
    let (inventory, watchers) = Inventory::start(client.clone(), &driver.name);
    let election = Election::start(client.clone(), lease(&opts, &driver.name));
    let mut leader = election.leader.clone();
    let mut shutdown = std::pin::pin!(shutdown_signal());
    loop {
        metrics.set_leader(false);
        if stand_by(&mut leader, &health, &inventory, &mut shutdown).await == Ended::Process {
            break;
        }
        health.set_ready(true);
        metrics.set_leader(true);
        let worker = start_worker(&opts, &driver, &client, &metrics, &inventory).await;
        if lead(
            worker,
            &opts,
            &mut leader,
            &health,
            &inventory,
            &mut shutdown,
        )
        .await
            == Ended::Process
        {
            break;
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

/// The driver's name (`--driver`, or GetPluginInfo's) and its controller
/// service, which must exist.
async fn find_driver(opts: &ControllerOptions) -> anyhow::Result<Driver> {
    let socket = opts.csi_address.display().to_string();
    let identity_client = NodeClient::connect(&opts.csi_address, opts.call_timeout)
        .await
        .with_context(|| format!("CSI socket {socket} (--csi-address)"))?;
    let name = match &opts.driver {
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
    tracing::info!(driver = %name, ?caps, "monitoring the CSI driver's volumes");
    Ok(Driver { name, csi, caps })
}

fn lease(opts: &ControllerOptions, driver: &str) -> LeaseConfig {
    LeaseConfig {
        name: opts
            .lease_name
            .clone()
            .unwrap_or_else(|| default_lease_name(driver)),
        namespace: opts.lease_namespace.clone(),
        identity: opts.identity.clone(),
        duration: opts.lease_duration,
    }
}

/// Waits for the lead, then for the inventory's first lists.
async fn stand_by(
    leader: &mut watch::Receiver<bool>,
    health: &Health,
    inventory: &Inventory,
    shutdown: &mut Pin<&mut impl Future<Output = ()>>,
) -> Ended {
    loop {
        health.beat();
        health.set_ready(inventory.is_ready());
        tokio::select! {
            led = leader.wait_for(|l| *l) => match led {
                Ok(_) => break,
                // The election ended: nothing to lead any more.
                Err(_) => return Ended::Process,
            },
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
            _ = shutdown.as_mut() => return Ended::Process,
        }
    }
    while !inventory.is_ready() {
        health.beat();
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            _ = shutdown.as_mut() => return Ended::Process,
        }
    }
    Ended::Lead
}

/// A new leader's worker, with the claims' status writer.
async fn start_worker(
    opts: &ControllerOptions,
    driver: &Driver,
    client: &Client,
    metrics: &Arc<ControllerMetrics>,
    inventory: &Inventory,
) -> Worker {
    let cycle = CycleConfig {
        page_size: opts.list_page_size,
        max_pages: MAX_PAGES,
        get_concurrency: opts.get_concurrency,
    };
    let prober = Prober::new(driver.csi.clone(), driver.caps.clone(), cycle);
    let recorder = recorder_config(
        &opts.identity,
        opts.event_writes_per_minute,
        opts.event_update_interval,
    );
    let status = StatusWriter::start(
        client.clone(),
        &driver.name,
        opts.event_update_interval,
        metrics.clone(),
    )
    .await;
    Worker::start(
        client.clone(),
        recorder,
        prober,
        opts.node_grace,
        opts.call_timeout,
        Arc::clone(metrics),
        inventory,
    )
    .await
    .with_status(status, inventory)
    .await
}

/// The CSI cycles and node checks, each on its own tick, until the lead is
/// lost (the worker is dropped: no write after that) or the process stops
/// (the Events not yet written get [`FINAL_FLUSH`]).
async fn lead(
    mut worker: Worker,
    opts: &ControllerOptions,
    leader: &mut watch::Receiver<bool>,
    health: &Health,
    inventory: &Inventory,
    shutdown: &mut Pin<&mut impl Future<Output = ()>>,
) -> Ended {
    let mut csi_tick = tokio::time::interval(opts.monitor_interval);
    csi_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut node_tick = tokio::time::interval(NODE_CHECK_EVERY);
    node_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        health.beat();
        let step = async {
            tokio::select! {
                _ = csi_tick.tick() => worker.csi_cycle(inventory).await,
                _ = node_tick.tick() => worker.node_check(inventory).await,
            }
        };
        tokio::select! {
            _ = step => {}
            _ = lost(leader) => {
                // Dropping the worker aborts its writer: no write after this.
                drop(worker);
                return Ended::Lead;
            }
            _ = shutdown.as_mut() => {
                worker.flush(FINAL_FLUSH).await;
                return Ended::Process;
            }
        }
    }
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
