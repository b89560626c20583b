//! `health-agent csi-proxy`: the CSI proxy (`health_csi::proxy`) as a
//! sidecar of a CSI driver's node pod, asking the node agent's conditions
//! socket (`health_node::conditions_socket`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use health_csi::proxy::{Proxy, ProxyConfig, DEFAULT_AGENT_TIMEOUT};
use health_node::conditions_socket::{self, AgentSocket};
use tokio::signal::unix::{signal, SignalKind};

#[derive(clap::Args)]
pub struct CsiProxyArgs {
    /// Where to serve the kubelet: the socket node-driver-registrar
    /// advertises (--kubelet-registration-path, as the kubelet sees it).
    #[arg(long, value_name = "PATH", env = "CSI_PROXY_ADDRESS")]
    listen: PathBuf,
    /// The driver's own node socket, where every call goes on to.
    #[arg(long, value_name = "PATH", env = "CSI_ADDRESS")]
    csi_address: PathBuf,
    /// The node agent's conditions socket (`health-agent run
    /// --volume-health-socket`).
    #[arg(
        long,
        value_name = "PATH",
        env = "HEALTH_VOLUME_HEALTH_SOCKET",
        default_value = conditions_socket::DEFAULT_SOCKET
    )]
    volume_health_socket: PathBuf,
    /// Seconds one question to the agent may take; past it, the answer is
    /// the driver's alone.
    #[arg(long, value_name = "SECS", default_value_t = DEFAULT_AGENT_TIMEOUT.as_secs_f64())]
    agent_timeout: f64,
    /// Pass NodeGetCapabilities as the driver answers it, without adding
    /// GET_VOLUME_HEALTH and GET_STORAGE_HEALTH: for conformance runs of a
    /// csi-sanity built before CSI 1.13, which fails on a capability it does
    /// not know. The kubelet then asks NodeGetVolumeHealth and
    /// NodeGetStorageHealth only of drivers that advertise them.
    #[arg(long)]
    keep_driver_capabilities: bool,
}

/// Serves until SIGTERM or SIGINT, then removes its socket.
pub async fn run(args: CsiProxyArgs) -> anyhow::Result<()> {
    let agent_timeout = Duration::try_from_secs_f64(args.agent_timeout)
        .ok()
        .filter(|t| !t.is_zero())
        .with_context(|| {
            format!(
                "--agent-timeout must be a positive number of seconds, got {}",
                args.agent_timeout
            )
        })?;
    anyhow::ensure!(
        args.listen != args.csi_address,
        "--listen and --csi-address are the same path ({}): the proxy would replace the driver's socket",
        args.listen.display()
    );
    let listener =
        conditions_socket::bind_fresh(&args.listen).context("serving the kubelet (--listen)")?;
    let proxy = Proxy::new(
        ProxyConfig {
            driver_socket: args.csi_address.clone(),
            agent_timeout,
            add_capability: !args.keep_driver_capabilities,
        },
        Arc::new(AgentSocket::new(&args.volume_health_socket)),
    );
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let stop = async move {
        tokio::select! {
            _ = sigterm.recv() => {}
            _ = sigint.recv() => {}
        }
    };
    tracing::info!(
        listen = %args.listen.display(),
        driver = %args.csi_address.display(),
        agent = %args.volume_health_socket.display(),
        "CSI proxy serving"
    );
    let served = proxy.serve(listener, stop).await;
    let removed = std::fs::remove_file(&args.listen);
    let stats = proxy.stats();
    tracing::info!(
        connections = stats.connections,
        driver_unreachable = stats.driver_unreachable,
        capabilities_added = stats.capabilities_added,
        health_answers = stats.health_answers,
        agent_unavailable = stats.agent_unavailable,
        "CSI proxy stopped"
    );
    served.with_context(|| format!("accepting on {}", args.listen.display()))?;
    removed.with_context(|| format!("removing {}", args.listen.display()))
}
