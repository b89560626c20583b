//! `health-controller`: the cluster-side controller, a sidecar of a CSI
//! driver's controller pod (see the crate's library for what it does).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use health_controller::ControllerOptions;
use health_kube::events::EventArgs;

/// CSI controller volume health and node-down, as Events on PVCs, the
/// `VolumeHealth` object and `pvc.status.healthStatus`.
#[derive(Parser)]
#[command(name = "health-controller", version)]
struct Cli {
    /// The CSI driver's controller socket (shared with the driver's container).
    #[arg(
        long,
        value_name = "PATH",
        default_value = "/csi/csi.sock",
        env = "CSI_ADDRESS"
    )]
    csi_address: PathBuf,
    /// kubeconfig to use instead of the pod's service account.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The driver's name as PVs give it (spec.csi.driver); default: the driver's GetPluginInfo name.
    #[arg(long, value_name = "NAME")]
    driver: Option<String>,
    /// Seconds between two health cycles over the driver's volumes.
    #[arg(long, value_name = "SECS", default_value_t = 15.0)]
    monitor_interval: f64,
    /// max_entries of each ControllerListVolumeHealth / ListVolumes page.
    #[arg(long, value_name = "N", default_value_t = 500)]
    list_page_size: u32,
    /// Seconds one CSI call may take.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    call_timeout: f64,
    /// Per-volume Get calls in flight at once (drivers without a health list).
    #[arg(long, value_name = "N", default_value_t = 4)]
    get_concurrency: usize,
    /// Seconds a node must be NotReady or unreachable before its volumes are reported Inaccessible.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    node_grace: f64,
    /// The Lease electing the active replica; default: volume-health-<driver>.
    #[arg(long, value_name = "NAME")]
    lease_name: Option<String>,
    /// The Lease's namespace (the controller's own).
    #[arg(long, value_name = "NS", env = "POD_NAMESPACE")]
    lease_namespace: Option<String>,
    /// This replica's identity in the Lease and Events (reportingInstance); default: hostname.
    #[arg(long, value_name = "ID", env = "POD_NAME")]
    identity: Option<String>,
    /// Seconds the Lease is valid without renewal (a standby takes over within this).
    #[arg(long, value_name = "SECS", default_value_t = 15)]
    lease_duration: u64,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = "0.0.0.0:9810",
        env = "HEALTH_METRICS_ADDR"
    )]
    metrics_addr: std::net::SocketAddr,
    #[command(flatten)]
    events: EventArgs,
    /// Log filter (tracing's env-filter syntax), e.g. `info` or `health_controller=debug`.
    #[arg(long, default_value = "info", env = "HEALTH_LOG")]
    log: String,
}

fn seconds(name: &str, v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| anyhow::anyhow!("--{name} must be a non-negative number of seconds, got {v}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    health_kube::logging::init("health-controller", &cli.log);
    let result = options(cli).and_then(|opts| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .context("starting the runtime")?;
        let result = rt.block_on(health_controller::run(opts));
        rt.shutdown_timeout(Duration::from_millis(200));
        result
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("health-controller: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn options(args: Cli) -> anyhow::Result<ControllerOptions> {
    let monitor_interval = seconds("monitor-interval", args.monitor_interval)?;
    anyhow::ensure!(
        !monitor_interval.is_zero(),
        "--monitor-interval must be above 0"
    );
    let call_timeout = seconds("call-timeout", args.call_timeout)?;
    anyhow::ensure!(!call_timeout.is_zero(), "--call-timeout must be above 0");
    anyhow::ensure!(
        args.list_page_size > 0,
        "--list-page-size must be at least 1"
    );
    anyhow::ensure!(
        args.get_concurrency > 0,
        "--get-concurrency must be at least 1"
    );
    anyhow::ensure!(
        args.lease_duration >= 2,
        "--lease-duration must be at least 2 seconds"
    );
    let (event_writes_per_minute, event_update_interval) = args.events.checked()?;
    let lease_namespace = args
        .lease_namespace
        .filter(|ns| !ns.is_empty())
        .context("no namespace for the lease: pass --lease-namespace or set POD_NAMESPACE")?;
    let identity = match args.identity.filter(|id| !id.is_empty()) {
        Some(id) => id,
        // The kernel's view of the hostname: the pod's name in a pod.
        None => std::fs::read_to_string("/proc/sys/kernel/hostname")
            .context("no --identity (POD_NAME) and the hostname is unreadable")?
            .trim()
            .to_string(),
    };
    Ok(ControllerOptions {
        csi_address: args.csi_address,
        kubeconfig: args.kubeconfig,
        driver: args.driver.filter(|d| !d.is_empty()),
        monitor_interval,
        list_page_size: args.list_page_size,
        call_timeout,
        get_concurrency: args.get_concurrency,
        node_grace: seconds("node-grace", args.node_grace)?,
        lease_name: args.lease_name.filter(|n| !n.is_empty()),
        lease_namespace,
        identity,
        lease_duration: Duration::from_secs(args.lease_duration),
        metrics_addr: args.metrics_addr,
        event_writes_per_minute,
        event_update_interval,
    })
}
