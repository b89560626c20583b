//! All node plugins of this node, probed together.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use tokio::sync::Semaphore;

use crate::error::CsiError;
use crate::node::NodeClient;
use crate::types::{NodeVolumeReport, StorageHealthEntry};

/// `driver=socket`: use this socket for this driver name, without asking the
/// driver its name (for sockets outside the kubelet layout, or drivers whose
/// GetPluginInfo is broken).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverOverride {
    pub driver: String,
    pub socket: PathBuf,
}

impl FromStr for DriverOverride {
    type Err = CsiError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        match spec.split_once('=') {
            Some((driver, socket)) if !driver.trim().is_empty() && !socket.trim().is_empty() => {
                Ok(DriverOverride {
                    driver: driver.trim().to_string(),
                    socket: PathBuf::from(socket.trim()),
                })
            }
            _ => Err(CsiError::InvalidOverride {
                spec: spec.to_string(),
            }),
        }
    }
}

/// One volume to ask a node plugin about.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeRequest {
    /// CSI driver name (PV `spec.csi.driver`).
    pub driver: String,
    pub volume_id: String,
    pub publish_path: PathBuf,
    pub staging_path: Option<PathBuf>,
}

/// One answer of [`DriverSet::probe_all_timed`].
#[derive(Debug)]
pub struct TimedProbe {
    pub request: ProbeRequest,
    pub result: Result<NodeVolumeReport, CsiError>,
    /// How long this volume's own RPC took; zero when none was made for it
    /// (unknown driver, skipped after a timeout, or the driver did not answer
    /// its capabilities call), so that latency histograms see only real
    /// round trips.
    pub elapsed: Duration,
}

/// One driver's answer of [`DriverSet::storage_health_all`].
#[derive(Debug)]
pub struct StorageProbe {
    pub driver: String,
    pub result: Result<Vec<StorageHealthEntry>, CsiError>,
}

#[derive(Debug)]
struct Driver {
    client: NodeClient,
}

/// Default cap on concurrent RPCs to one driver within `probe_all`: enough to
/// keep many volumes moving, few enough not to swamp a driver that serialises
/// work internally.
pub const DEFAULT_MAX_IN_FLIGHT_PER_DRIVER: usize = 4;

/// One [`NodeClient`] per driver name.
#[derive(Debug)]
pub struct DriverSet {
    drivers: BTreeMap<String, Driver>,
    failures: Vec<(PathBuf, CsiError)>,
    max_in_flight_per_driver: usize,
}

impl DriverSet {
    /// Connects to every socket, names discovered ones by GetPluginInfo, and
    /// caches each driver's capabilities. Overrides win over discovery for
    /// their driver name and their socket. All sockets are asked concurrently,
    /// each call bounded by `call_timeout`.
    ///
    /// A socket that cannot be used is logged and kept in
    /// [`DriverSet::failures`]; it never fails the whole set. The set is a
    /// snapshot: rebuild it when drivers come and go.
    pub async fn build(
        discovered: &[PathBuf],
        overrides: &[DriverOverride],
        call_timeout: Duration,
    ) -> DriverSet {
        let discovered: Vec<&PathBuf> = discovered
            .iter()
            .filter(|socket| !overrides.iter().any(|o| &o.socket == *socket))
            .collect();

        let named = join_all(discovered.iter().map(|socket| async move {
            let result = async {
                let client = NodeClient::connect(socket, call_timeout).await?;
                let info = client.plugin_info().await?;
                Ok::<_, CsiError>((info.name, client))
            }
            .await;
            ((*socket).clone(), result)
        }));
        let overridden = join_all(overrides.iter().map(|o| async move {
            let result = NodeClient::connect(&o.socket, call_timeout)
                .await
                .map(|client| (o.driver.clone(), client));
            (o.socket.clone(), result)
        }));
        let (named, overridden) = tokio::join!(named, overridden);

        let mut drivers: BTreeMap<String, Driver> = BTreeMap::new();
        let mut failures = Vec::new();
        // Overrides first so a discovered socket claiming the same name loses.
        for (socket, result) in overridden.into_iter().chain(named) {
            match result {
                Ok((name, client)) => {
                    if let Some(existing) = drivers.get(&name) {
                        tracing::warn!(
                            driver = %name,
                            kept = %existing.client.socket().display(),
                            ignored = %socket.display(),
                            "two CSI sockets for one driver name"
                        );
                        continue;
                    }
                    drivers.insert(name, Driver { client });
                }
                Err(e) => {
                    tracing::warn!(socket = %socket.display(), error = %e, "CSI socket unusable");
                    failures.push((socket, e));
                }
            }
        }

        // Capabilities decide which health RPC each driver is asked; read
        // here so the first round can use them, and again every round by
        // `probe_all`. A failure is not fatal here.
        join_all(drivers.iter().map(|(name, d)| async move {
            if let Err(e) = d.client.capabilities().await {
                tracing::warn!(driver = %name, error = %e, "cannot read CSI node capabilities");
            }
        }))
        .await;

        DriverSet {
            drivers,
            failures,
            max_in_flight_per_driver: DEFAULT_MAX_IN_FLIGHT_PER_DRIVER,
        }
    }

    /// Caps concurrent RPCs per driver in `probe_all` (minimum 1).
    pub fn with_max_in_flight_per_driver(mut self, limit: usize) -> Self {
        self.max_in_flight_per_driver = limit.max(1);
        self
    }

    /// Driver names and their sockets, sorted by name.
    pub fn drivers(&self) -> impl Iterator<Item = (&str, &Path)> {
        self.drivers
            .iter()
            .map(|(name, d)| (name.as_str(), d.client.socket()))
    }

    pub fn client(&self, driver: &str) -> Option<&NodeClient> {
        self.drivers.get(driver).map(|d| &d.client)
    }

    /// Sockets that could not be used when the set was built, and why.
    pub fn failures(&self) -> &[(PathBuf, CsiError)] {
        &self.failures
    }

    /// Asks every request's driver about its volume, concurrently, and
    /// returns each request with its result in the order given.
    ///
    /// Each driver is first asked NodeGetCapabilities (once per round, as a
    /// driver upgraded in place may have gained or lost a capability), which
    /// decides the RPC its volumes are asked ([`NodeClient::volume_health`]);
    /// a driver advertising no health capability gets no volume calls, only
    /// [`CsiError::NotAdvertised`] answers.
    ///
    /// Drivers are probed independently, so a slow or hung driver delays only
    /// its own results (each RPC is bounded by the call timeout). Within one
    /// driver at most `max_in_flight_per_driver` calls run at once, and once a
    /// call to a driver times out, its requests not yet started in this round
    /// get [`CsiError::Skipped`] instead of each waiting out a timeout too.
    pub async fn probe_all(
        &self,
        requests: Vec<ProbeRequest>,
    ) -> Vec<(ProbeRequest, Result<NodeVolumeReport, CsiError>)> {
        self.probe_all_timed(requests)
            .await
            .into_iter()
            .map(|p| (p.request, p.result))
            .collect()
    }

    /// [`DriverSet::probe_all`], with how long each volume's own RPC took,
    /// for latency metrics.
    pub async fn probe_all_timed(&self, requests: Vec<ProbeRequest>) -> Vec<TimedProbe> {
        let mut results: Vec<Option<(Result<NodeVolumeReport, CsiError>, Duration)>> =
            (0..requests.len()).map(|_| None).collect();
        let mut by_driver: BTreeMap<&str, Vec<(usize, &ProbeRequest)>> = BTreeMap::new();
        for (index, request) in requests.iter().enumerate() {
            if self.drivers.contains_key(&request.driver) {
                by_driver
                    .entry(request.driver.as_str())
                    .or_default()
                    .push((index, request));
            } else if let Some(slot) = results.get_mut(index) {
                *slot = Some((
                    Err(CsiError::UnknownDriver {
                        driver: request.driver.clone(),
                    }),
                    Duration::ZERO,
                ));
            }
        }

        let groups = by_driver.into_iter().filter_map(|(name, batch)| {
            self.drivers
                .get(name)
                .map(|driver| self.probe_driver(name, &driver.client, batch))
        });
        for (index, result, elapsed) in join_all(groups).await.into_iter().flatten() {
            if let Some(slot) = results.get_mut(index) {
                *slot = Some((result, elapsed));
            }
        }

        requests
            .into_iter()
            .zip(results)
            .map(|(request, result)| {
                // Every index was filled above; the fallback only guards the
                // bookkeeping without a panic.
                let (result, elapsed) = result.unwrap_or_else(|| {
                    (
                        Err(CsiError::Skipped {
                            driver: request.driver.clone(),
                        }),
                        Duration::ZERO,
                    )
                });
                TimedProbe {
                    request,
                    result,
                    elapsed,
                }
            })
            .collect()
    }

    /// Asks every driver of the set advertising GET_STORAGE_HEALTH
    /// NodeGetStorageHealth once, concurrently, each call bounded by the call
    /// timeout; results sorted by driver name. The others answer
    /// [`CsiError::NotAdvertised`] without a call (see
    /// [`NodeClient::storage_health`]).
    pub async fn storage_health_all(&self) -> Vec<StorageProbe> {
        join_all(self.drivers.iter().map(|(name, d)| async move {
            StorageProbe {
                driver: name.clone(),
                result: d.client.storage_health().await,
            }
        }))
        .await
    }

    async fn probe_driver(
        &self,
        name: &str,
        client: &NodeClient,
        batch: Vec<(usize, &ProbeRequest)>,
    ) -> Vec<(usize, Result<NodeVolumeReport, CsiError>, Duration)> {
        match client.capabilities().await {
            Ok(_) => {}
            // The driver answered something else than its capabilities but
            // told them before: decide by what it said last.
            Err(e) if !e.is_transport() && client.cached_capabilities().is_some() => {
                tracing::debug!(driver = %name, error = %e, "CSI node capabilities not refreshed; using the last ones");
            }
            // Without capabilities there is no knowing what to ask; and a
            // driver that did not answer at all would only have the volume
            // calls wait out the same timeout again.
            Err(e) => {
                return batch
                    .into_iter()
                    .map(|(index, _)| (index, Err(clone_capability_error(&e)), Duration::ZERO))
                    .collect();
            }
        }

        let permits = Semaphore::new(self.max_in_flight_per_driver);
        let timed_out = AtomicBool::new(false);
        join_all(batch.into_iter().map(|(index, request)| {
            let permits = &permits;
            let timed_out = &timed_out;
            async move {
                // The semaphore is never closed, so acquiring cannot fail;
                // without a permit we would just run unthrottled.
                let _permit = permits.acquire().await.ok();
                if timed_out.load(Ordering::Relaxed) {
                    return (
                        index,
                        Err(CsiError::Skipped {
                            driver: name.to_string(),
                        }),
                        Duration::ZERO,
                    );
                }
                // Timed from the permit on: the driver's latency, not our
                // own queueing in front of it.
                let started = Instant::now();
                let result = client
                    .volume_health(
                        &request.volume_id,
                        &request.publish_path,
                        request.staging_path.as_deref(),
                    )
                    .await;
                if matches!(result, Err(CsiError::Timeout { .. })) {
                    timed_out.store(true, Ordering::Relaxed);
                }
                (index, result, started.elapsed())
            }
        }))
        .await
    }
}

/// `CsiError` is not `Clone` (it owns a boxed cause); the capability errors
/// shared by a whole batch are rebuilt from their parts.
fn clone_capability_error(e: &CsiError) -> CsiError {
    match e {
        CsiError::Connect { socket, error } => CsiError::Connect {
            socket: socket.clone(),
            error: error.to_string().into(),
        },
        CsiError::Timeout { rpc, after } => CsiError::Timeout { rpc, after: *after },
        CsiError::Skipped { driver } => CsiError::Skipped {
            driver: driver.clone(),
        },
        CsiError::Unsupported { rpc } => CsiError::Unsupported { rpc },
        CsiError::Status { rpc, code, message } => CsiError::Status {
            rpc,
            code: *code,
            message: message.clone(),
        },
        other => CsiError::InvalidResponse {
            rpc: "NodeGetCapabilities",
            detail: other.to_string(),
        },
    }
}
