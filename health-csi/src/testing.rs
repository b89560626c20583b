//! A configurable in-process CSI driver for tests (feature `testing`).
//!
//! [`TestDriver::start`] serves the Identity, Node and Controller services on
//! a unix socket in a directory of the caller's choosing, behaving like one
//! of the driver generations in [`DriverMode`]. Volumes and their health are
//! set per volume at any time, and every RPC is counted so tests can assert
//! exactly which calls a client made.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::proto;
use crate::proto::controller_server::{Controller, ControllerServer};
use crate::proto::identity_server::{Identity, IdentityServer};
use crate::proto::node_server::{Node, NodeServer};
use crate::types::{HealthEntry, StorageHealthEntry, Usage, UsageNumbers};

/// Which kind of driver the test server imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverMode {
    /// CSI 1.13: NodeGetVolumeHealth, ControllerGetVolumeHealth and
    /// ControllerListVolumeHealth, plus all the legacy RPCs.
    Modern,
    /// CSI <= 1.12 with VOLUME_CONDITION: the 1.13 RPCs answer UNIMPLEMENTED;
    /// NodeGetVolumeStats, ControllerGetVolume and ListVolumes carry
    /// `volume_condition`.
    LegacyOnly,
    /// CSI <= 1.12 without VOLUME_CONDITION: like `LegacyOnly`, but no
    /// `volume_condition` is ever sent and the capability is not advertised.
    LegacyNoCondition,
    /// Identity and capability RPCs answer; every health, stats and volume
    /// RPC never answers (until the driver is shut down).
    Hang,
    /// Every RPC answers UNIMPLEMENTED.
    Unimplemented,
}

/// Every RPC the test driver serves, for [`TestDriverHandle::calls`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rpc {
    GetPluginInfo,
    GetPluginCapabilities,
    Probe,
    NodeGetCapabilities,
    NodeGetInfo,
    NodeGetVolumeStats,
    NodeGetVolumeHealth,
    NodeGetStorageHealth,
    ControllerGetCapabilities,
    ListVolumes,
    ControllerGetVolume,
    ControllerListVolumeHealth,
    ControllerGetVolumeHealth,
}

const RPC_COUNT: usize = 13;

impl Rpc {
    /// Every RPC, in declaration order (the order of the call counters).
    pub const ALL: [Rpc; RPC_COUNT] = [
        Rpc::GetPluginInfo,
        Rpc::GetPluginCapabilities,
        Rpc::Probe,
        Rpc::NodeGetCapabilities,
        Rpc::NodeGetInfo,
        Rpc::NodeGetVolumeStats,
        Rpc::NodeGetVolumeHealth,
        Rpc::NodeGetStorageHealth,
        Rpc::ControllerGetCapabilities,
        Rpc::ListVolumes,
        Rpc::ControllerGetVolume,
        Rpc::ControllerListVolumeHealth,
        Rpc::ControllerGetVolumeHealth,
    ];
}

/// The arguments of the last node volume RPC (health or stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenNodeRequest {
    pub rpc: Rpc,
    pub volume_id: String,
    pub path: String,
    pub staging_path: String,
}

/// One entry of an explicit controller list page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedVolume {
    pub volume_id: String,
    /// Health this entry is listed with; `None` = the volume's current health.
    pub health: Option<Vec<HealthEntry>>,
}

#[derive(Debug, Clone, Default)]
struct TestVolume {
    health: Vec<HealthEntry>,
    usage: Option<Usage>,
}

#[derive(Debug)]
struct State {
    name: String,
    mode: Mutex<DriverMode>,
    volumes: Mutex<BTreeMap<String, TestVolume>>,
    /// Explicit controller list pages (duplicates allowed), each entry with
    /// its own health snapshot or `None` for the volume's current health.
    /// `None` lists every volume on one page.
    list_pages: Mutex<Option<Vec<Vec<ListedVolume>>>>,
    calls: [AtomicU64; RPC_COUNT],
    /// What Modern answers to NodeGetStorageHealth (empty: no known issue).
    storage_health: Mutex<Vec<StorageHealthEntry>>,
    /// RPCs answering UNIMPLEMENTED whatever the mode.
    unimplemented: Mutex<Vec<Rpc>>,
    /// `max_entries` of every controller list call, in order.
    list_max_entries: Mutex<Vec<i32>>,
    last_node_request: Mutex<Option<SeenNodeRequest>>,
    shutdown: watch::Receiver<bool>,
}

/// Locks ignoring poisoning: a panicking test thread must not turn every
/// later RPC of the fake driver into a second panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl State {
    fn count(&self, rpc: Rpc) -> DriverMode {
        if let Some(counter) = self.calls.get(rpc as usize) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
        if lock(&self.unimplemented).contains(&rpc) {
            return DriverMode::Unimplemented;
        }
        *lock(&self.mode)
    }

    /// Without explicit pages, every volume in pages of `max_entries`
    /// (0: one page), as a driver honouring the request would.
    fn pages_of(&self, max_entries: i32) -> Vec<Vec<(String, Vec<HealthEntry>)>> {
        lock(&self.list_max_entries).push(max_entries);
        let pages = self.pages();
        let explicit = lock(&self.list_pages).is_some();
        match usize::try_from(max_entries) {
            Ok(size) if size > 0 && !explicit => {
                let all: Vec<_> = pages.into_iter().flatten().collect();
                if all.is_empty() {
                    return vec![Vec::new()];
                }
                all.chunks(size).map(<[_]>::to_vec).collect()
            }
            _ => pages,
        }
    }

    /// What a hung driver does: nothing, until the test driver shuts down.
    async fn hang<T>(&self) -> Result<T, Status> {
        let mut shutdown = self.shutdown.clone();
        // An Err means the handle is gone, which is a shutdown as well.
        let _ = shutdown.wait_for(|stop| *stop).await;
        Err(Status::unavailable("test driver shutting down"))
    }

    fn volume(&self, volume_id: &str) -> Result<TestVolume, Status> {
        lock(&self.volumes)
            .get(volume_id)
            .cloned()
            .ok_or_else(|| Status::not_found(format!("volume {volume_id} does not exist")))
    }

    /// The pages to serve, each entry resolved to the health it is listed
    /// with.
    fn pages(&self) -> Vec<Vec<(String, Vec<HealthEntry>)>> {
        let volumes = lock(&self.volumes).clone();
        let current = |id: &String| {
            volumes
                .get(id)
                .map(|v| v.health.clone())
                .unwrap_or_default()
        };
        match lock(&self.list_pages).clone() {
            Some(pages) => pages
                .into_iter()
                .map(|page| {
                    page.into_iter()
                        .map(|listed| {
                            let health =
                                listed.health.unwrap_or_else(|| current(&listed.volume_id));
                            (listed.volume_id, health)
                        })
                        .collect()
                })
                .collect(),
            None => vec![volumes
                .iter()
                .map(|(id, v)| (id.clone(), v.health.clone()))
                .collect()],
        }
    }

    /// Page index from a token we issued ("" is the first page).
    fn page_index(token: &str, pages: usize) -> Result<usize, Status> {
        if token.is_empty() {
            return Ok(0);
        }
        match token.parse::<usize>() {
            Ok(index) if index < pages => Ok(index),
            _ => Err(Status::aborted(format!("invalid starting_token {token:?}"))),
        }
    }

    fn next_token(index: usize, pages: usize) -> String {
        if index + 1 < pages {
            (index + 1).to_string()
        } else {
            String::new()
        }
    }
}

fn wire_health(volume_id: &str, health: &[HealthEntry]) -> proto::VolumeHealth {
    proto::VolumeHealth {
        volume_id: volume_id.to_string(),
        health_statuses: health
            .iter()
            .map(|e| proto::volume_health::Entry {
                status: e.status.to_wire() as i32,
                reason: e.reason.clone(),
                message: e.message.clone(),
            })
            .collect(),
    }
}

/// The legacy view of a volume's health: abnormal iff any entry, messages
/// joined. `None` for a driver without VOLUME_CONDITION.
fn wire_condition(mode: DriverMode, health: &[HealthEntry]) -> Option<proto::VolumeCondition> {
    if mode == DriverMode::LegacyNoCondition {
        return None;
    }
    Some(proto::VolumeCondition {
        abnormal: !health.is_empty(),
        message: health
            .iter()
            .map(|e| e.message.as_str())
            .collect::<Vec<_>>()
            .join("; "),
    })
}

fn wire_usage(usage: Option<Usage>) -> Vec<proto::VolumeUsage> {
    use proto::volume_usage::Unit;
    let Some(usage) = usage else {
        return Vec::new();
    };
    let one = |n: UsageNumbers, unit: Unit| proto::VolumeUsage {
        available: n.available,
        total: n.total,
        used: n.used,
        unit: unit as i32,
    };
    usage
        .bytes
        .map(|n| one(n, Unit::Bytes))
        .into_iter()
        .chain(usage.inodes.map(|n| one(n, Unit::Inodes)))
        .collect()
}

fn unimplemented<T>(rpc: Rpc) -> Result<T, Status> {
    Err(Status::unimplemented(format!("{rpc:?} is not implemented")))
}

#[derive(Debug, Clone)]
struct Service(Arc<State>);

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<proto::GetPluginInfoRequest>,
    ) -> Result<Response<proto::GetPluginInfoResponse>, Status> {
        if self.0.count(Rpc::GetPluginInfo) == DriverMode::Unimplemented {
            return unimplemented(Rpc::GetPluginInfo);
        }
        Ok(Response::new(proto::GetPluginInfoResponse {
            name: self.0.name.clone(),
            vendor_version: "0.0.0-test".to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<proto::GetPluginCapabilitiesResponse>, Status> {
        use proto::plugin_capability::{service::Type, Service as Svc, Type as Arm};
        if self.0.count(Rpc::GetPluginCapabilities) == DriverMode::Unimplemented {
            return unimplemented(Rpc::GetPluginCapabilities);
        }
        Ok(Response::new(proto::GetPluginCapabilitiesResponse {
            capabilities: vec![proto::PluginCapability {
                r#type: Some(Arm::Service(Svc {
                    r#type: Type::ControllerService as i32,
                })),
            }],
        }))
    }

    async fn probe(
        &self,
        _: Request<proto::ProbeRequest>,
    ) -> Result<Response<proto::ProbeResponse>, Status> {
        if self.0.count(Rpc::Probe) == DriverMode::Unimplemented {
            return unimplemented(Rpc::Probe);
        }
        Ok(Response::new(proto::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Service {
    async fn node_get_capabilities(
        &self,
        _: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        use proto::node_service_capability::{rpc::Type, Rpc as WireRpc, Type as Arm};
        let mode = self.0.count(Rpc::NodeGetCapabilities);
        if mode == DriverMode::Unimplemented {
            return unimplemented(Rpc::NodeGetCapabilities);
        }
        let mut types = vec![Type::StageUnstageVolume, Type::GetVolumeStats];
        // The 1.13 GET_VOLUME_HEALTH capability is deliberately not
        // advertised by Modern: its number is unknown, and clients must
        // detect the RPC by calling it.
        if mode != DriverMode::LegacyNoCondition {
            types.push(Type::VolumeCondition);
        }
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: types
                .into_iter()
                .map(|t| proto::NodeServiceCapability {
                    r#type: Some(Arm::Rpc(WireRpc { r#type: t as i32 })),
                })
                .collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<proto::NodeGetInfoRequest>,
    ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        if self.0.count(Rpc::NodeGetInfo) == DriverMode::Unimplemented {
            return unimplemented(Rpc::NodeGetInfo);
        }
        Ok(Response::new(proto::NodeGetInfoResponse {
            node_id: "test-node".to_string(),
            max_volumes_per_node: 0,
        }))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<proto::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        let mode = self.0.count(Rpc::NodeGetVolumeStats);
        let request = request.into_inner();
        *lock(&self.0.last_node_request) = Some(SeenNodeRequest {
            rpc: Rpc::NodeGetVolumeStats,
            volume_id: request.volume_id.clone(),
            path: request.volume_path.clone(),
            staging_path: request.staging_target_path.clone(),
        });
        match mode {
            DriverMode::Unimplemented => unimplemented(Rpc::NodeGetVolumeStats),
            DriverMode::Hang => self.0.hang().await,
            _ => {
                let volume = self.0.volume(&request.volume_id)?;
                Ok(Response::new(proto::NodeGetVolumeStatsResponse {
                    usage: wire_usage(volume.usage),
                    volume_condition: wire_condition(mode, &volume.health),
                }))
            }
        }
    }

    async fn node_get_volume_health(
        &self,
        request: Request<proto::NodeGetVolumeHealthRequest>,
    ) -> Result<Response<proto::NodeGetVolumeHealthResponse>, Status> {
        let mode = self.0.count(Rpc::NodeGetVolumeHealth);
        let request = request.into_inner();
        *lock(&self.0.last_node_request) = Some(SeenNodeRequest {
            rpc: Rpc::NodeGetVolumeHealth,
            volume_id: request.volume_id.clone(),
            path: request.volume_publish_path.clone(),
            staging_path: request.staging_target_path.clone(),
        });
        match mode {
            DriverMode::Modern => {
                let volume = self.0.volume(&request.volume_id)?;
                Ok(Response::new(proto::NodeGetVolumeHealthResponse {
                    volume_health: Some(wire_health(&request.volume_id, &volume.health)),
                }))
            }
            DriverMode::Hang => self.0.hang().await,
            _ => unimplemented(Rpc::NodeGetVolumeHealth),
        }
    }

    async fn node_get_storage_health(
        &self,
        _: Request<proto::NodeGetStorageHealthRequest>,
    ) -> Result<Response<proto::NodeGetStorageHealthResponse>, Status> {
        match self.0.count(Rpc::NodeGetStorageHealth) {
            DriverMode::Modern => Ok(Response::new(proto::NodeGetStorageHealthResponse {
                backend_health: lock(&self.0.storage_health)
                    .iter()
                    .map(StorageHealthEntry::to_wire)
                    .collect(),
            })),
            DriverMode::Hang => self.0.hang().await,
            _ => unimplemented(Rpc::NodeGetStorageHealth),
        }
    }
}

#[tonic::async_trait]
impl Controller for Service {
    async fn controller_get_capabilities(
        &self,
        _: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<proto::ControllerGetCapabilitiesResponse>, Status> {
        use proto::controller_service_capability::{rpc::Type, Rpc as WireRpc, Type as Arm};
        let mode = self.0.count(Rpc::ControllerGetCapabilities);
        if mode == DriverMode::Unimplemented {
            return unimplemented(Rpc::ControllerGetCapabilities);
        }
        let mut types = vec![Type::ListVolumes, Type::GetVolume];
        if mode != DriverMode::LegacyNoCondition {
            types.push(Type::VolumeCondition);
        }
        Ok(Response::new(proto::ControllerGetCapabilitiesResponse {
            capabilities: types
                .into_iter()
                .map(|t| proto::ControllerServiceCapability {
                    r#type: Some(Arm::Rpc(WireRpc { r#type: t as i32 })),
                })
                .collect(),
        }))
    }

    async fn list_volumes(
        &self,
        request: Request<proto::ListVolumesRequest>,
    ) -> Result<Response<proto::ListVolumesResponse>, Status> {
        use proto::list_volumes_response::{Entry, VolumeStatus};
        let mode = self.0.count(Rpc::ListVolumes);
        match mode {
            DriverMode::Unimplemented => return unimplemented(Rpc::ListVolumes),
            DriverMode::Hang => return self.0.hang().await,
            _ => {}
        }
        let pages = self.0.pages_of(request.get_ref().max_entries);
        let index = State::page_index(&request.get_ref().starting_token, pages.len())?;
        let entries = pages
            .get(index)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|(id, health)| Entry {
                volume: Some(proto::Volume {
                    capacity_bytes: 0,
                    volume_id: id.clone(),
                    volume_context: Default::default(),
                }),
                status: Some(VolumeStatus {
                    published_node_ids: Vec::new(),
                    volume_condition: wire_condition(mode, health),
                }),
            })
            .collect();
        Ok(Response::new(proto::ListVolumesResponse {
            entries,
            next_token: State::next_token(index, pages.len()),
        }))
    }

    async fn controller_get_volume(
        &self,
        request: Request<proto::ControllerGetVolumeRequest>,
    ) -> Result<Response<proto::ControllerGetVolumeResponse>, Status> {
        use proto::controller_get_volume_response::VolumeStatus;
        let mode = self.0.count(Rpc::ControllerGetVolume);
        match mode {
            DriverMode::Unimplemented => return unimplemented(Rpc::ControllerGetVolume),
            DriverMode::Hang => return self.0.hang().await,
            _ => {}
        }
        let volume_id = request.into_inner().volume_id;
        let volume = self.0.volume(&volume_id)?;
        Ok(Response::new(proto::ControllerGetVolumeResponse {
            volume: Some(proto::Volume {
                capacity_bytes: 0,
                volume_id,
                volume_context: Default::default(),
            }),
            status: Some(VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: wire_condition(mode, &volume.health),
            }),
        }))
    }

    async fn controller_list_volume_health(
        &self,
        request: Request<proto::ControllerListVolumeHealthRequest>,
    ) -> Result<Response<proto::ControllerListVolumeHealthResponse>, Status> {
        match self.0.count(Rpc::ControllerListVolumeHealth) {
            DriverMode::Modern => {}
            DriverMode::Hang => return self.0.hang().await,
            _ => return unimplemented(Rpc::ControllerListVolumeHealth),
        }
        let explicit = lock(&self.0.list_pages).is_some();
        let pages = self.0.pages_of(request.get_ref().max_entries);
        let index = State::page_index(&request.get_ref().starting_token, pages.len())?;
        let entries = pages
            .get(index)
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            // Like the spec's SHOULD, the default listing omits healthy
            // volumes; explicit pages are served as the test wrote them.
            .filter(|(_, health)| explicit || !health.is_empty())
            .map(|(id, health)| wire_health(id, health))
            .collect();
        Ok(Response::new(proto::ControllerListVolumeHealthResponse {
            entries,
            next_token: State::next_token(index, pages.len()),
        }))
    }

    async fn controller_get_volume_health(
        &self,
        request: Request<proto::ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<proto::ControllerGetVolumeHealthResponse>, Status> {
        match self.0.count(Rpc::ControllerGetVolumeHealth) {
            DriverMode::Modern => {}
            DriverMode::Hang => return self.0.hang().await,
            _ => return unimplemented(Rpc::ControllerGetVolumeHealth),
        }
        let volume_id = request.into_inner().volume_id;
        let volume = self.0.volume(&volume_id)?;
        Ok(Response::new(proto::ControllerGetVolumeHealthResponse {
            volume_health: Some(wire_health(&volume_id, &volume.health)),
        }))
    }
}

/// Starts test drivers.
#[derive(Debug)]
pub struct TestDriver;

/// Driver name used by [`TestDriver::start`].
pub const DEFAULT_TEST_DRIVER_NAME: &str = "test.csi.volume-health";

impl TestDriver {
    /// Serves a driver named [`DEFAULT_TEST_DRIVER_NAME`] on `dir/csi.sock`
    /// (the kubelet layout `plugins/<driver>/csi.sock`). `dir` must exist.
    /// Needs a running tokio runtime.
    pub async fn start(dir: &Path, mode: DriverMode) -> io::Result<TestDriverHandle> {
        Self::start_named(dir, DEFAULT_TEST_DRIVER_NAME, mode).await
    }

    /// Like [`TestDriver::start`] with the given GetPluginInfo name.
    pub async fn start_named(
        dir: &Path,
        name: &str,
        mode: DriverMode,
    ) -> io::Result<TestDriverHandle> {
        let socket = dir.join("csi.sock");
        let listener = UnixListener::bind(&socket)?;
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        let state = Arc::new(State {
            name: name.to_string(),
            mode: Mutex::new(mode),
            volumes: Mutex::new(BTreeMap::new()),
            list_pages: Mutex::new(None),
            calls: Default::default(),
            storage_health: Mutex::new(Vec::new()),
            unimplemented: Mutex::new(Vec::new()),
            list_max_entries: Mutex::new(Vec::new()),
            last_node_request: Mutex::new(None),
            shutdown: shutdown_rx.clone(),
        });
        let service = Service(Arc::clone(&state));
        let router = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(service.clone()))
            .add_service(NodeServer::new(service.clone()))
            .add_service(ControllerServer::new(service));
        let mut stop = shutdown_rx;
        let task = tokio::spawn(async move {
            let stopped = async move {
                let _ = stop.wait_for(|stop| *stop).await;
            };
            if let Err(e) = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped)
                .await
            {
                tracing::warn!(error = %e, "test CSI driver stopped with an error");
            }
        });
        Ok(TestDriverHandle {
            state,
            socket,
            shutdown: shutdown_tx,
            task: Some(task),
        })
    }
}

/// A running test driver. Dropping it stops the server (hung calls are
/// released with UNAVAILABLE) and removes the socket.
#[derive(Debug)]
pub struct TestDriverHandle {
    state: Arc<State>,
    socket: PathBuf,
    shutdown: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl TestDriverHandle {
    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    pub fn name(&self) -> &str {
        &self.state.name
    }

    pub fn mode(&self) -> DriverMode {
        *lock(&self.state.mode)
    }

    /// Switches behaviour in place, e.g. to imitate a driver upgrade without
    /// a socket change.
    pub fn set_mode(&self, mode: DriverMode) {
        *lock(&self.state.mode) = mode;
    }

    /// Creates the volume if needed and sets its conditions (empty =
    /// healthy). Legacy modes report `abnormal = !health.is_empty()` with the
    /// messages joined by "; ".
    pub fn set_volume_health(&self, volume_id: &str, health: Vec<HealthEntry>) {
        lock(&self.state.volumes)
            .entry(volume_id.to_string())
            .or_default()
            .health = health;
    }

    /// Creates the volume if needed and sets the usage NodeGetVolumeStats
    /// reports.
    pub fn set_volume_usage(&self, volume_id: &str, usage: Usage) {
        lock(&self.state.volumes)
            .entry(volume_id.to_string())
            .or_default()
            .usage = Some(usage);
    }

    /// Forgets the volume: per-volume RPCs answer NOT_FOUND for it.
    pub fn remove_volume(&self, volume_id: &str) {
        lock(&self.state.volumes).remove(volume_id);
    }

    /// Serves controller listings (both generations) as exactly these pages
    /// of volume ids, in order; an id may appear on several pages. Ids not
    /// set as volumes are listed as healthy.
    pub fn set_list_pages(&self, pages: Vec<Vec<String>>) {
        let pages = pages
            .into_iter()
            .map(|page| {
                page.into_iter()
                    .map(|volume_id| ListedVolume {
                        volume_id,
                        health: None,
                    })
                    .collect()
            })
            .collect();
        *lock(&self.state.list_pages) = Some(pages);
    }

    /// Like [`TestDriverHandle::set_list_pages`], with entries that may carry
    /// their own health snapshot, e.g. a volume whose conditions changed
    /// between two pages of one walk.
    pub fn set_list_page_entries(&self, pages: Vec<Vec<ListedVolume>>) {
        *lock(&self.state.list_pages) = Some(pages);
    }

    /// Sets what NodeGetStorageHealth answers in `Modern` mode (empty = no
    /// known backend issue, the default). Other modes keep answering
    /// UNIMPLEMENTED (or hanging, for `Hang`).
    pub fn set_storage_health(&self, backends: Vec<StorageHealthEntry>) {
        *lock(&self.state.storage_health) = backends;
    }

    /// How many times `rpc` was called since start (or the last reset).
    pub fn calls(&self, rpc: Rpc) -> u64 {
        self.state
            .calls
            .get(rpc as usize)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    /// Makes `rpc` answer UNIMPLEMENTED whatever the mode (a driver that
    /// lacks just that RPC).
    pub fn set_unimplemented(&self, rpc: Rpc) {
        lock(&self.state.unimplemented).push(rpc);
    }

    /// `max_entries` of every ListVolumes and ControllerListVolumeHealth
    /// call so far, in order.
    pub fn list_max_entries(&self) -> Vec<i32> {
        lock(&self.state.list_max_entries).clone()
    }

    /// Arguments of the last NodeGetVolumeHealth or NodeGetVolumeStats.
    pub fn last_node_request(&self) -> Option<SeenNodeRequest> {
        lock(&self.state.last_node_request).clone()
    }

    /// Stops the server and waits for it to finish.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        if let Some(task) = self.task.take() {
            // A join error would only mean the server task panicked or was
            // cancelled; either way it is gone, which is all we wait for.
            let _ = task.await;
        }
    }
}

impl Drop for TestDriverHandle {
    fn drop(&mut self) {
        let _ = self.shutdown.send(true);
        // Best effort: the directory is usually a temp dir removed anyway.
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[cfg(test)]
mod tests {
    use super::Rpc;

    #[test]
    fn all_lists_every_rpc_at_its_counter_index() {
        for (i, rpc) in Rpc::ALL.iter().enumerate() {
            assert_eq!(*rpc as usize, i, "{rpc:?}");
        }
    }
}
