//! A configurable in-process CSI driver for tests (feature `testing`).
//!
//! [`TestDriver::start`] serves the Identity, Node and Controller services on
//! a unix socket in a directory of the caller's choosing, behaving like one
//! of the driver generations in [`DriverMode`]. What it advertises follows
//! the mode unless a test sets the capabilities itself, so a test can show
//! which RPCs a client calls for which capabilities. Volumes and their
//! health are set per volume at any time, and every RPC is counted so tests
//! can assert exactly which calls a client made.

mod advertised;
mod service;

use std::collections::BTreeMap;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::Status;

use crate::proto::controller_server::ControllerServer;
use crate::proto::identity_server::IdentityServer;
use crate::proto::node_server::NodeServer;
use crate::types::{HealthEntry, StorageHealthEntry, Usage};
use service::Service;

/// A controller capability as the generated code names it.
pub use crate::proto::controller_service_capability::rpc::Type as ControllerCapability;
/// A node capability as the generated code names it
/// (`NodeCapability::GetVolumeHealth` is GET_VOLUME_HEALTH).
pub use crate::proto::node_service_capability::rpc::Type as NodeCapability;

/// Which kind of driver the test server imitates. The capabilities each
/// advertises (unless set with [`TestDriverHandle::set_node_capabilities`]
/// or [`TestDriverHandle::set_controller_capabilities`]) are those of a
/// driver of that generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverMode {
    /// CSI 1.13: advertises and serves NodeGetVolumeHealth (GET_VOLUME_HEALTH),
    /// NodeGetStorageHealth (GET_STORAGE_HEALTH), ControllerGetVolumeHealth
    /// (GET_VOLUME_HEALTH) and ControllerListVolumeHealth
    /// (LIST_VOLUME_HEALTH), besides GET_VOLUME_STATS, LIST_VOLUMES and
    /// GET_VOLUME, which answer without `volume_condition` (gone in 1.13).
    Modern,
    /// CSI <= 1.12 with VOLUME_CONDITION (node and controller):
    /// NodeGetVolumeStats, ControllerGetVolume and ListVolumes carry
    /// `volume_condition`; no 1.13 capability, and the 1.13 RPCs answer
    /// UNIMPLEMENTED.
    LegacyOnly,
    /// CSI <= 1.12 without VOLUME_CONDITION: like `LegacyOnly`, but no
    /// `volume_condition` is ever sent and the capability is not advertised.
    /// No health capability at all.
    LegacyNoCondition,
    /// Identity and capability RPCs answer (advertising what `Modern` does);
    /// every health, stats and volume RPC never answers (until the driver is
    /// shut down).
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

/// A list token of this driver: the last volume of the page before, after
/// this prefix (so that a token of another form is refused as invalid).
const AFTER: &str = "after:";

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
    /// Node capabilities set by the test; `None`: the mode's.
    node_capabilities: Mutex<Option<Vec<NodeCapability>>>,
    /// Controller capabilities set by the test; `None`: the mode's.
    controller_capabilities: Mutex<Option<Vec<ControllerCapability>>>,
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

    /// The page `token` names, and the token of the next: without explicit
    /// pages, every volume in pages of `max_entries` (0: one page), as a
    /// driver honouring the request would. Only the page asked for is
    /// built, and it is found by its token, which names the last volume of
    /// the page before ([`AFTER`]): a driver of 100,000 volumes serves each
    /// page from where the last one ended instead of counting its way there
    /// from the first volume (which made a listed cycle quadratic;
    /// docs/benchmarks.md, "Scale").
    #[allow(clippy::type_complexity)]
    fn page(
        &self,
        max_entries: i32,
        token: &str,
    ) -> Result<(Vec<(String, Vec<HealthEntry>)>, String), Status> {
        lock(&self.list_max_entries).push(max_entries);
        let explicit = lock(&self.list_pages).is_some();
        match usize::try_from(max_entries) {
            Ok(size) if size > 0 && !explicit => {
                let volumes = lock(&self.volumes);
                let after = match token {
                    "" => Bound::Unbounded,
                    _ => match token.strip_prefix(AFTER) {
                        Some(id) => Bound::Excluded(id),
                        None => return Err(Self::invalid(token)),
                    },
                };
                let mut rest = volumes.range::<str, _>((after, Bound::Unbounded));
                let entries: Vec<_> = rest
                    .by_ref()
                    .take(size)
                    .map(|(id, v)| (id.clone(), v.health.clone()))
                    .collect();
                let next = match (rest.next(), entries.last()) {
                    (Some(_), Some((last, _))) => format!("{AFTER}{last}"),
                    _ => String::new(),
                };
                Ok((entries, next))
            }
            _ => {
                let pages = self.pages();
                let count = pages.len();
                let index = Self::page_index(token, count)?;
                let entries = pages.into_iter().nth(index).unwrap_or_default();
                Ok((entries, Self::next_token(index, count)))
            }
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
            _ => Err(Self::invalid(token)),
        }
    }

    fn invalid(token: &str) -> Status {
        Status::aborted(format!("invalid starting_token {token:?}"))
    }

    fn next_token(index: usize, pages: usize) -> String {
        if index + 1 < pages {
            (index + 1).to_string()
        } else {
            String::new()
        }
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
            node_capabilities: Mutex::new(None),
            controller_capabilities: Mutex::new(None),
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

    /// Makes `rpc` answer UNIMPLEMENTED whatever the mode, and takes the
    /// capability that announces it (if any) out of what the mode
    /// advertises: a driver that lacks just that RPC. Capabilities set
    /// explicitly are advertised all the same, which makes a driver that
    /// advertises an RPC it does not serve.
    pub fn set_unimplemented(&self, rpc: Rpc) {
        lock(&self.state.unimplemented).push(rpc);
    }

    /// Advertises exactly these node capabilities from now on, whatever the
    /// mode and [`TestDriverHandle::set_unimplemented`]; which RPCs answer
    /// is still the mode's.
    pub fn set_node_capabilities(&self, capabilities: Vec<NodeCapability>) {
        *lock(&self.state.node_capabilities) = Some(capabilities);
    }

    /// Advertises exactly these controller capabilities from now on, as
    /// [`TestDriverHandle::set_node_capabilities`] does for the node.
    pub fn set_controller_capabilities(&self, capabilities: Vec<ControllerCapability>) {
        *lock(&self.state.controller_capabilities) = Some(capabilities);
    }

    /// The node capabilities NodeGetCapabilities answers now.
    pub fn node_capabilities(&self) -> Vec<NodeCapability> {
        self.state.node_capabilities(self.mode())
    }

    /// The controller capabilities ControllerGetCapabilities answers now.
    pub fn controller_capabilities(&self) -> Vec<ControllerCapability> {
        self.state.controller_capabilities(self.mode())
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
