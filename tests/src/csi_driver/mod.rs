//! The project's own CSI driver, for the tests and the local cluster (never
//! shipped; the binary is `csi-loop-driver`). Each volume is a block device
//! of its own: a loop device, direct I/O on, over a stretch of a file,
//! `(file, offset, size)`, which travels in the volume's `volume_context`.
//! A volume made without parameters gets a file of its own in the state
//! directory; one made with `file`/`offset` parameters is a stretch of an
//! existing file (the local cluster's fault disk image), so that a fault
//! injected into a stretch hits exactly one volume.
//!
//! Identity, Controller and Node on one socket (tonic, from health-csi's
//! proto; what it does not serve answers UNIMPLEMENTED), the kubelet's
//! plugin registration on another; every call logged on one line
//! ([`error::logged`]). Capabilities: node STAGE_UNSTAGE_VOLUME,
//! GET_VOLUME_STATS and VOLUME_CONDITION; controller CREATE_DELETE_VOLUME,
//! LIST_VOLUMES, GET_VOLUME and VOLUME_CONDITION; with `volume_health`,
//! CSI 1.13's node GET_VOLUME_HEALTH and controller GET_VOLUME_HEALTH and
//! LIST_VOLUME_HEALTH too, with the same conditions as entries.
//!
//! - [`backing`]: a volume's stretch of a file, as context and parameters
//! - [`requests`]: checks of requests that need no state, ids, pages
//! - [`records`]: what the driver keeps under its state directory
//! - [`loops`]: loop devices found, attached, detached
//! - [`mounts`]: ext4, mounts and bind mounts, usage
//! - [`condition`]: what is wrong with a volume
//! - `identity`, `controller`, `node`: the CSI services
//! - [`registration`]: the kubelet's plugin registration, and [`authority`]
//!   the rewriter that lets the kubelet's requests through to it
//! - [`socket`]: endpoints and listening
//! - [`client`]: the other side: CreateVolume, the driver as a process
//! - [`error`]: the errors, their codes, the call log

pub mod authority;
pub mod backing;
pub mod client;
pub mod condition;
mod controller;
pub mod error;
mod identity;
pub mod loops;
pub mod mounts;
mod node;
pub mod records;
pub mod registration;
pub mod requests;
pub mod socket;

use std::future::Future;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use anyhow::Context;
use health_csi::proto::controller_server::ControllerServer;
use health_csi::proto::identity_server::IdentityServer;
use health_csi::proto::node_server::NodeServer;
use tokio_stream::wrappers::UnixListenerStream;

use error::{DriverError, DriverResult};
use records::Store;

/// The name the driver registers under unless told otherwise.
pub const DEFAULT_DRIVER_NAME: &str = "loop.csi.volume-health.io";

/// How the driver runs (the binary's flags).
#[derive(Debug, Clone)]
pub struct Config {
    pub driver_name: String,
    pub node_id: String,
    /// The CSI socket.
    pub endpoint: PathBuf,
    pub state_dir: PathBuf,
    /// Where to serve the kubelet's plugin registration, if anywhere.
    pub registration_socket: Option<PathBuf>,
    /// The CSI socket registration announces (default: `endpoint`; a
    /// proxy's socket when one fronts the driver).
    pub kubelet_endpoint: Option<PathBuf>,
    /// NodeGetInfo's `max_volumes_per_node`, enforced at NodeStageVolume
    /// (0: no limit).
    pub max_volumes_per_node: i64,
    /// Also serve CSI 1.13's health RPCs.
    pub volume_health: bool,
}

/// What the services answer from.
#[derive(Debug)]
pub struct Driver {
    config: Config,
    store: Store,
    /// One change of volumes at a time: calls that stage, publish, create
    /// or delete run one after another, as the kubelet expects of a driver
    /// per volume anyway.
    lock: Mutex<()>,
}

impl Driver {
    pub fn new(config: Config) -> DriverResult<Driver> {
        let store = Store::open(&config.state_dir)?;
        Ok(Driver {
            config,
            store,
            lock: Mutex::new(()),
        })
    }

    fn hold(&self) -> MutexGuard<'_, ()> {
        // The lock guards no data, only the order of calls: a call that
        // panicked holding it leaves nothing half-changed in memory.
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn health_served(&self, rpc: &str) -> DriverResult<()> {
        if self.config.volume_health {
            Ok(())
        } else {
            Err(DriverError::Unimplemented(format!(
                "{rpc} is served with --volume-health only"
            )))
        }
    }
}

/// The gRPC services over one driver.
#[derive(Debug, Clone)]
pub struct Service(Arc<Driver>);

impl Service {
    /// Runs `work` on a thread that may block (mkfs, mount, ioctls).
    fn blocking<T, F>(&self, work: F) -> impl Future<Output = DriverResult<T>>
    where
        T: Send + 'static,
        F: FnOnce(&Driver) -> DriverResult<T> + Send + 'static,
    {
        let driver = Arc::clone(&self.0);
        async move {
            tokio::task::spawn_blocking(move || work(&driver))
                .await
                .map_err(|e| DriverError::Record(format!("the call's thread failed: {e}")))?
        }
    }
}

/// Serves the driver (and its registration, when configured) until
/// `shutdown` completes; removes its sockets then.
pub async fn serve(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let driver = Arc::new(Driver::new(config.clone()).context("opening the state directory")?);
    let service = Service(driver);
    let listener = socket::bind(&config.endpoint)?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let until = move || {
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    };
    let csi = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(service.clone()))
        .add_service(ControllerServer::new(service.clone()))
        .add_service(NodeServer::new(service))
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), until());
    let registration = match &config.registration_socket {
        Some(socket) => {
            let announced = config.kubelet_endpoint.as_ref().unwrap_or(&config.endpoint);
            let service = registration::Registration::new(&config.driver_name, announced);
            let listener = socket::bind(socket)?;
            tracing::info!(
                socket = %socket.display(),
                announced = %announced.display(),
                "serving the kubelet's plugin registration"
            );
            // The kubelet's grpc-go sends the socket's path as
            // `:authority`, which tonic's HTTP/2 refuses: each connection
            // goes through the rewriter of `authority`.
            let incoming = tokio_stream::StreamExt::map(UnixListenerStream::new(listener), |c| {
                c.and_then(authority::accept)
            });
            Some(
                tonic::transport::Server::builder()
                    .add_service(service.server())
                    .serve_with_incoming_shutdown(incoming, until()),
            )
        }
        None => None,
    };
    tracing::info!(
        driver = %config.driver_name,
        node = %config.node_id,
        endpoint = %config.endpoint.display(),
        state = %config.state_dir.display(),
        "serving CSI"
    );
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop.send(true);
    });
    let registration = async move {
        match registration {
            Some(server) => server.await,
            None => Ok(()),
        }
    };
    let (csi, registration) = tokio::join!(csi, registration);
    let mut sockets = vec![config.endpoint.clone()];
    sockets.extend(config.registration_socket.clone());
    for socket in sockets {
        if let Err(e) = std::fs::remove_file(&socket) {
            tracing::warn!(socket = %socket.display(), error = %e, "removing the socket");
        }
    }
    csi.context("serving CSI")?;
    registration.context("serving the plugin registration")
}
