//! `csi-loop-driver`: the project's CSI driver for the tests and the local
//! cluster (`health_tests::csi_driver`): each volume a loop device over a
//! stretch of a file. Serves until SIGTERM or SIGINT; every call is logged
//! on stderr.

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use health_tests::csi_driver::{self, socket::endpoint_path, Config, DEFAULT_DRIVER_NAME};
use tokio::signal::unix::{signal, SignalKind};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "A CSI driver whose volumes are loop devices over stretches of files (tests and the local cluster only)"
)]
struct Args {
    /// The CSI socket: unix:///path/csi.sock, or a bare path.
    #[arg(long)]
    endpoint: String,
    /// This node's id (NodeGetInfo).
    #[arg(long)]
    node_id: String,
    /// Where the driver keeps its records and the files of the volumes it makes.
    #[arg(long)]
    state_dir: PathBuf,
    /// The name the driver registers under.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    driver_name: String,
    /// Serve the kubelet's plugin registration on this socket (in plugins_registry/).
    #[arg(long)]
    registration_socket: Option<PathBuf>,
    /// The CSI socket registration announces to the kubelet (default: --endpoint's; a csi-proxy's when one fronts the driver).
    #[arg(long)]
    kubelet_endpoint: Option<PathBuf>,
    /// NodeGetInfo's max_volumes_per_node, enforced at NodeStageVolume (0: no limit).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(i64).range(0..))]
    max_volumes_per_node: i64,
    /// Also serve CSI 1.13's health RPCs (node GET_VOLUME_HEALTH, controller GET/LIST_VOLUME_HEALTH).
    #[arg(long)]
    volume_health: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(false)
        .init();
    if args.node_id.is_empty() {
        anyhow::bail!("--node-id is empty: NodeGetInfo must name the node");
    }
    let config = Config {
        driver_name: args.driver_name,
        node_id: args.node_id,
        endpoint: endpoint_path(&args.endpoint)?,
        state_dir: args.state_dir,
        registration_socket: args.registration_socket,
        kubelet_endpoint: args.kubelet_endpoint,
        max_volumes_per_node: args.max_volumes_per_node,
        volume_health: args.volume_health,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the runtime")?;
    runtime.block_on(async {
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::info!("stopping");
        };
        csi_driver::serve(config, shutdown).await
    })
}
