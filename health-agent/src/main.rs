//! `health-agent`: the volume-health node agent's command line, over the
//! `health-node` library. The kernel object is embedded here (build.rs), so
//! that every library below compiles without it.

mod csi_proxy;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use health_core::conditions::ConditionConfig;
use health_core::dev::Dev;
use health_csi::DriverOverride;
use health_kernel::probes::{self, pins, BioErrors, BlockAttach, ProbeError, ProbeOptions};
use health_kube::events::EventArgs;
use health_node::agent::{self, AgentOptions, EventPriority};
use health_node::cluster::ConditionsSocket;
use health_node::conditions_socket::volumes_command;
use health_node::report::watch::View;
use health_node::volumes::checks::CheckConfig;
use health_node::volumes::kubelet::DEFAULT_KUBELET_ROOT;
use health_node::volumes::{self, one_shot, LiveVolumesConfig};
use health_topology::HostPaths;

/// The kernel programs (`health-ebpf`): the committed object (build.rs).
static KERNEL_OBJECT: &[u8] =
    health_kernel::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/health-ebpf.o"));

#[derive(Parser)]
#[command(
    name = "health-agent",
    version,
    about = "Catches storage failures the moment the kernel sees them"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Where the host's /proc is (in a container, the host's /proc mounted elsewhere).
    #[arg(long, global = true, default_value = "/proc", env = "HEALTH_HOST_PROC")]
    host_proc: PathBuf,
    /// Where the host's /sys is.
    #[arg(long, global = true, default_value = "/sys", env = "HEALTH_HOST_SYS")]
    host_sys: PathBuf,
    /// Log filter (tracing's env-filter syntax), e.g. `info` or `health_node=debug`.
    #[arg(long, global = true, default_value = "info", env = "HEALTH_LOG")]
    log: String,
}

#[derive(Subcommand)]
enum Command {
    /// Watch this host's block and filesystem errors live (no cluster needed).
    Watch(WatchArgs),
    /// One-shot view of every pod volume on this node and its conditions.
    Volumes(VolumesArgs),
    /// Cluster mode (the DaemonSet): Events on pods and PVCs, metrics.
    Run(RunArgs),
    /// Detach the programs an agent left pinned and remove every pin.
    Uninstall(PinArgs),
    /// Sidecar of a CSI driver's node pod: pass the kubelet's calls to the
    /// driver, adding this node's conditions to NodeGetVolumeHealth and
    /// NodeGetStorageHealth.
    CsiProxy(csi_proxy::CsiProxyArgs),
    /// Moved to its own binary and image: `health-controller`.
    #[command(hide = true, disable_help_flag = true)]
    Controller {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        _args: Vec<String>,
    },
}

#[derive(clap::Args)]
struct PinArgs {
    /// Where agents pin their programs, links and maps (on a BPF filesystem).
    #[arg(long, value_name = "DIR", default_value = pins::DEFAULT_PIN_ROOT, env = "HEALTH_PIN_DIR")]
    pin_dir: PathBuf,
}

#[derive(clap::Args)]
struct RunArgs {
    /// This node's name (the downward API's spec.nodeName).
    #[arg(long, env = "NODE_NAME")]
    node_name: String,
    /// kubeconfig to use instead of the pod's service account.
    #[arg(long, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// A directory on the node that outlives the agent's container (the
    /// DaemonSet mounts /var/lib/volume-health): the agent keeps its copy
    /// of this node's Events there, and continues the open episodes from it
    /// after a restart instead of listing Events (docs/large-clusters.md).
    #[arg(long, value_name = "DIR", env = "HEALTH_STATE_DIR")]
    state_dir: PathBuf,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(
        long,
        value_name = "ADDR:PORT",
        default_value = "0.0.0.0:9808",
        env = "HEALTH_METRICS_ADDR"
    )]
    metrics_addr: std::net::SocketAddr,
    #[command(flatten)]
    events: EventArgs,
    #[command(flatten)]
    kernel: KernelArgs,
    #[command(flatten)]
    volume: VolumeArgs,
    #[command(flatten)]
    intervals: IntervalArgs,
    /// Answer `health-agent csi-proxy` sidecars with this node's conditions per CSI volume,
    /// and `health-agent volumes` with every pod volume's, on this unix socket
    /// (docs/controller.md, "CSI proxy"); by default conditions.sock in --state-dir.
    #[arg(long, value_name = "PATH", env = "HEALTH_VOLUME_HEALTH_SOCKET")]
    volume_health_socket: Option<PathBuf>,
    /// The DaemonSet this agent runs in: when the agent stops and it is gone or being
    /// deleted (an uninstall), the agent removes the kernel state it pinned on the node
    /// (docs/install.md, "Uninstall"). Without it the pins always stay for the next agent.
    #[arg(long, value_name = "NAMESPACE/NAME", env = "HEALTH_DAEMONSET", value_parser = daemonset_ref)]
    daemonset: Option<health_node::cluster::DaemonSetRef>,
}

fn daemonset_ref(s: &str) -> Result<health_node::cluster::DaemonSetRef, String> {
    match s.split_once('/') {
        Some((namespace, name))
            if !namespace.is_empty() && !name.is_empty() && !name.contains('/') =>
        {
            Ok(health_node::cluster::DaemonSetRef {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
        }
        _ => Err(format!("must be NAMESPACE/NAME, got {s:?}")),
    }
}

/// What the kernel side catches; shared by `watch` and `run`.
#[derive(clap::Args)]
struct KernelArgs {
    /// Also catch failed cache flushes (attaches block_rq_complete, which runs on every I/O).
    #[arg(long)]
    flush_errors: bool,
    /// Also count the errors reads, writes and fsyncs return to applications, on every
    /// volume, block device or not (EIO, ENOSPC, EDQUOT, EROFS, ESTALE, ETIMEDOUT, ENOTCONN),
    /// with the pod and container told: fexit programs on the VFS functions, which run on
    /// every such call of the node (docs/benchmarks.md, "Returned errors").
    #[arg(long, env = "HEALTH_RETURNED_ERRORS")]
    returned_errors: bool,
    /// Samples per device per second per CPU (counting is never limited).
    #[arg(long, default_value_t = probes::DEFAULT_SAMPLES_PER_SEC)]
    sample_rate: u32,
    /// Errors raised inside device-mapper and md (block_bio_complete, which runs on every bio):
    /// attached once such a device exists (auto), at start (always), or not at all (never).
    #[arg(long, value_enum, default_value_t = BioErrors::Auto)]
    bio_errors: BioErrors,
    #[command(flatten)]
    pins: PinArgs,
    /// Pin nothing: the programs detach when this process exits, and errors
    /// until the next start go uncounted.
    #[arg(long)]
    no_pin: bool,
    /// How the block request programs attach: BTF raw tracepoints where the kernel has them
    /// (auto; not skipped while another BPF tracing program or a map syscall runs on the CPU),
    /// or always tracefs tracepoints (then the programs --stall-after attaches are plain raw
    /// tracepoints, which read each field with a helper call).
    #[arg(long, value_enum, default_value_t = BlockAttach::Auto)]
    block_attach: BlockAttach,
    /// Count failed requests at block_rq_complete, before the kernel prints them to its console
    /// (a serial console takes milliseconds per line), instead of at block_rq_error, after it.
    /// The same requests are counted; the program then runs on every block completion (as
    /// with --flush-errors). Needs tp_btf and a kernel whose BTF names the request flag bits;
    /// elsewhere a warning says why and block_rq_error counts.
    #[arg(long)]
    early_block_errors: bool,
    /// Scheduling priority of the event path (ring buffer to line or Event hand-off):
    /// real-time SCHED_FIFO 5 (rt) or nice -10 (nice) where CAP_SYS_NICE grants it,
    /// falling back with a warning; periodic work always runs at normal priority.
    #[arg(long, value_enum, default_value_t = EventPriority::Rt, env = "HEALTH_EVENT_PRIORITY")]
    event_priority: EventPriority,
    /// Seconds a volume's I/O may wait before it is IOStalled (Inaccessible): judged from its
    /// devices' counters (requests in flight, none completed for that long), which cost nothing
    /// per request, or with --follow-bios from the bios themselves; 0: off. Default 30 (the
    /// SCSI and NVMe command timeout) where there are pod volumes.
    #[arg(long, value_name = "SECS")]
    stall_after: Option<f64>,
    /// Follow every bio from submission to completion for --stall-after: the oldest bio's own
    /// age and operation, the pod and container whose I/O it is, and a bio stuck while others
    /// on its device complete; about 0.5 µs per request (docs/benchmarks.md, "Stalls").
    #[arg(long)]
    follow_bios: bool,
    /// Where the host's cgroup filesystem is: a stalled volume's message names the pod and
    /// container (or cgroup) its oldest I/O is charged to, found there by the cgroup's id.
    #[arg(
        long,
        value_name = "DIR",
        default_value = "/sys/fs/cgroup",
        env = "HEALTH_HOST_CGROUP"
    )]
    host_cgroup: PathBuf,
    /// Seconds per window of read and write latencies: a volume whose p99 stays at or above
    /// its limit for 3 windows is HighLatency (Degraded), e.g. 10; 0, the default, counts
    /// none (it follows every bio, as --follow-bios does, and stalls are then judged so).
    #[arg(long, value_name = "SECS", default_value_t = 0.0)]
    latency_window: f64,
    /// A device class's p99 limit, CLASS=MS with CLASS rotational (500), ssd (100) or network
    /// (200); repeatable.
    #[arg(long, value_name = "CLASS=MS")]
    latency_limit: Vec<String>,
    /// A StorageClass's p99 limit, NAME=MS, for the volumes whose PV is of that class, before
    /// their device class's (run: the class is read from the PV); repeatable.
    #[arg(long, value_name = "NAME=MS")]
    storage_class_latency_limit: Vec<String>,
    /// Also a limit of this many times the volume's own baseline p99 (never under 50 ms),
    /// where tighter than its class's; 0: none.
    #[arg(long, value_name = "FACTOR", default_value_t = 10.0)]
    latency_relative: f64,
}

impl KernelArgs {
    /// `--latency-window` and its limits, `None` for 0 (off).
    fn latency(&self) -> anyhow::Result<Option<volumes::latency::LatencyConfig>> {
        if self.latency_window == 0.0 {
            anyhow::ensure!(
                self.latency_limit.is_empty() && self.storage_class_latency_limit.is_empty(),
                "--latency-limit and --storage-class-latency-limit need --latency-window"
            );
            return Ok(None);
        }
        let window = seconds("latency-window", self.latency_window).map_err(anyhow::Error::msg)?;
        let mut limits = volumes::latency::LatencyLimits::default();
        for spec in &self.latency_limit {
            limits
                .set(spec)
                .map_err(|e| anyhow::anyhow!("--latency-limit {e}"))?;
        }
        let mut storage_classes = std::collections::BTreeMap::new();
        for spec in &self.storage_class_latency_limit {
            let (name, limit) =
                volumes::latency::named_limit(spec, "NAME=MS, e.g. fast-nvme=20")
                    .map_err(|e| anyhow::anyhow!("--storage-class-latency-limit {e}"))?;
            storage_classes.insert(name.to_string(), limit);
        }
        anyhow::ensure!(
            self.latency_relative == 0.0 || self.latency_relative >= 1.0,
            "--latency-relative {} must be 0 (none) or at least 1",
            self.latency_relative
        );
        Ok(Some(volumes::latency::LatencyConfig {
            window,
            limits,
            relative: self.latency_relative,
            storage_classes,
        }))
    }

    /// `--stall-after`, `None` for 0 (off); its default where there are pod
    /// volumes, and off where there are none (`watch` on a host without a
    /// kubelet), since IOStalled is a volume condition.
    fn stall_after(&self, volumes: bool) -> anyhow::Result<Option<Duration>> {
        let after = match self.stall_after {
            None if volumes => return Ok(Some(volumes::stalls::DEFAULT_STALL_AFTER)),
            None | Some(0.0) => None,
            Some(secs) => Some(seconds("stall-after", secs).map_err(anyhow::Error::msg)?),
        };
        anyhow::ensure!(
            volumes || after.is_none(),
            "--stall-after needs pod volumes: no kubelet root here (pass --kubelet-root)"
        );
        anyhow::ensure!(
            after.is_some() || !self.follow_bios,
            "--follow-bios needs --stall-after above 0"
        );
        Ok(after)
    }
}

#[derive(clap::Args)]
struct IntervalArgs {
    /// Seconds between volume checks and kubelet rediscoveries.
    #[arg(long, value_name = "SECS", default_value_t = volumes::DEFAULT_CHECK_INTERVAL.as_secs_f64())]
    check_interval: f64,
    /// Seconds between CSI node health calls for each volume (and storage
    /// health calls for each driver).
    #[arg(long, value_name = "SECS", default_value_t = volumes::DEFAULT_CSI_INTERVAL.as_secs_f64())]
    csi_interval: f64,
    /// Seconds between reads of the layers under each volume (multipath
    /// paths, thin pool space, md members, disk state): sysfs and one
    /// device-mapper status call per dm device, no I/O on the devices.
    #[arg(long, value_name = "SECS", default_value_t = volumes::DEFAULT_STACK_INTERVAL.as_secs_f64())]
    stack_interval: f64,
    /// A kernel error condition clears after this many seconds without a
    /// new error of its kind.
    #[arg(long, value_name = "SECS", default_value_t = ConditionConfig::default().kernel_quiet_window.as_secs_f64())]
    kernel_quiet_window: f64,
}

/// Where pod volumes are and how they are checked; shared by `watch` and `volumes`.
#[derive(clap::Args)]
struct VolumeArgs {
    /// kubelet's root directory, where pod volumes are found. `watch` uses
    /// /var/lib/kubelet when this is not given and that directory exists.
    #[arg(long, value_name = "DIR", env = "HEALTH_KUBELET_ROOT")]
    kubelet_root: Option<PathBuf>,
    /// Seconds one volume probe (statvfs, stat) or CSI call may take before
    /// it counts as hung / failed.
    #[arg(long, value_name = "SECS", default_value_t = CheckConfig::default().timeout.as_secs_f64())]
    check_timeout: f64,
    /// Use this socket for this CSI driver (DRIVER=PATH); repeatable. Sockets
    /// under `<kubelet-root>/plugins` are found without this.
    #[arg(long = "csi-socket", value_name = "DRIVER=PATH")]
    csi_sockets: Vec<DriverOverride>,
    /// Degraded (CapacityLow) below this percentage of free bytes.
    #[arg(long, value_name = "PERCENT", default_value_t = CheckConfig::default().capacity_low_percent)]
    capacity_low_percent: f64,
    /// Degraded (InodesLow) below this percentage of free inodes.
    #[arg(long, value_name = "PERCENT", default_value_t = CheckConfig::default().inodes_low_percent)]
    inodes_low_percent: f64,
    /// Degraded (ThinPoolLow) when a thin pool under a volume uses this
    /// percentage of its data or metadata space or more.
    #[arg(long, value_name = "PERCENT", default_value_t = CheckConfig::default().thin_pool_low_percent)]
    thin_pool_low_percent: f64,
    /// Seconds between reads of each NVMe controller's SMART / health log
    /// (critical warnings), and at once after a kernel error; 0: never.
    /// Needs CAP_SYS_ADMIN (said once when missing).
    #[arg(long, value_name = "SECS", default_value_t = CheckConfig::default().nvme_health_interval.as_secs_f64())]
    nvme_health_interval: f64,
}

#[derive(clap::Args)]
struct VolumesArgs {
    /// A JSON array, one object per pod volume (schema in docs/reference/json-schema.md).
    #[arg(long)]
    json: bool,
    /// Show the conditions of the agent running on this node, asked on its conditions
    /// socket (its --volume-health-socket; by default conditions.sock in --state-dir);
    /// where none answers, this command judges alone and says so.
    #[arg(long, value_name = "PATH", env = "HEALTH_VOLUME_HEALTH_SOCKET")]
    agent_socket: Option<PathBuf>,
    /// The running agent's state directory (its --state-dir), where its conditions
    /// socket is by default.
    #[arg(
        long,
        value_name = "DIR",
        env = "HEALTH_STATE_DIR",
        default_value = DEFAULT_STATE_DIR
    )]
    state_dir: PathBuf,
    #[command(flatten)]
    pins: PinArgs,
    #[command(flatten)]
    volume: VolumeArgs,
}

#[derive(clap::Args)]
struct WatchArgs {
    /// JSON Lines on stdout, one object per event (schema in docs/reference/json-schema.md).
    #[arg(long)]
    json: bool,
    /// Stop after this many seconds (detaching cleanly, exit 0).
    #[arg(long, value_name = "SECS")]
    duration: Option<f64>,
    /// Seconds between per-device totals in the human view.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    totals_interval: f64,
    /// Only report this device (MAJ:MIN); repeatable.
    #[arg(long = "device", value_name = "MAJ:MIN")]
    devices: Vec<Dev>,
    #[command(flatten)]
    kernel: KernelArgs,
    #[command(flatten)]
    volume: VolumeArgs,
    #[command(flatten)]
    intervals: IntervalArgs,
}

/// The agent's conditions socket in its state directory, unless
/// `--volume-health-socket` puts it elsewhere (beside a CSI driver's, for
/// its csi-proxy).
const AGENT_SOCKET_NAME: &str = "conditions.sock";
/// Where the DaemonSet keeps the agent's state (deploy/daemonset.yaml).
const DEFAULT_STATE_DIR: &str = "/var/lib/volume-health";

fn seconds(name: &str, v: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(v)
        .map_err(|_| format!("--{name} must be a non-negative number of seconds, got {v}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    health_kube::logging::init("health-agent", &cli.log);

    let host = HostPaths {
        proc_root: cli.host_proc.clone(),
        sys_root: cli.host_sys.clone(),
    };
    let result = match cli.command {
        Command::Watch(args) => watch_options(args, host)
            .and_then(|(opts, view)| block_on(Runtime::CurrentThread, agent::run(opts, view, None))?),
        Command::Volumes(args) => volumes_command(args, host),
        Command::Uninstall(args) => uninstall(&args.pin_dir, &host.sys_root),
        Command::CsiProxy(args) => block_on(Runtime::CurrentThread, csi_proxy::run(args))
            .and_then(|served| served),
        Command::Controller { .. } => Err(anyhow::anyhow!(
            "the controller is its own binary now: run `health-controller` (image volume-health-controller)"
        )),
        Command::Run(args) => run_options(args, host)
            .and_then(|opts| block_on(Runtime::TwoWorkers, health_node::cluster::run(opts))?),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("health-agent: {e:#}");
            let code = e
                .downcast_ref::<ProbeError>()
                .map_or(1, ProbeError::exit_code);
            ExitCode::from(code as u8)
        }
    }
}

enum Runtime {
    CurrentThread,
    TwoWorkers,
}

/// Runs `work` on a tokio runtime of that kind. A volume probe stuck on a
/// hung mount holds a blocking thread that may never return: the runtime
/// gives such threads a moment, then is dropped without them, so that a
/// finding never turns into a hang of the agent.
fn block_on<F: std::future::Future>(kind: Runtime, work: F) -> anyhow::Result<F::Output> {
    let mut builder = match kind {
        Runtime::CurrentThread => tokio::runtime::Builder::new_current_thread(),
        Runtime::TwoWorkers => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
    };
    let rt = builder
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let output = rt.block_on(work);
    rt.shutdown_timeout(Duration::from_millis(200));
    Ok(output)
}

fn run_options(args: RunArgs, host: HostPaths) -> anyhow::Result<health_node::cluster::RunOptions> {
    anyhow::ensure!(
        !args.node_name.is_empty(),
        "--node-name (NODE_NAME) is empty"
    );
    anyhow::ensure!(
        !args.state_dir.as_os_str().is_empty(),
        "--state-dir (HEALTH_STATE_DIR) is empty"
    );
    let (writes_per_minute, update) = args.events.checked()?;
    let kubelet_root = args
        .volume
        .kubelet_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBELET_ROOT));
    anyhow::ensure!(
        kubelet_root.is_dir(),
        "kubelet root {} is not a directory (mount the host's kubelet root at the same path, or pass --kubelet-root)",
        kubelet_root.display()
    );
    let kubelet_root = std::fs::canonicalize(&kubelet_root).unwrap_or(kubelet_root);
    let volumes = volumes_config(kubelet_root, &args.volume, &args.intervals, &host)?;
    let agent = AgentOptions {
        probes: probe_options(&args.kernel, &host),
        event_priority: args.kernel.event_priority,
        stall_after: args.kernel.stall_after(true)?,
        cgroup_root: args.kernel.host_cgroup.clone(),
        latency: args.kernel.latency()?,
        host,
        duration: None,
        totals_interval: Duration::from_secs(60),
        volumes: Some(volumes),
    };
    let mut events = health_kube::events::RecorderConfig::new(&args.node_name);
    events.writes_per_object_per_minute = writes_per_minute;
    events.min_update_interval = update;
    events.unclaimed_clear_after = agent
        .volumes
        .as_ref()
        .map_or(events.unclaimed_clear_after, |v| {
            v.conditions.kernel_quiet_window
        });
    Ok(health_node::cluster::RunOptions {
        agent,
        node: args.node_name,
        kubeconfig: args.kubeconfig,
        metrics_addr: args.metrics_addr,
        events,
        // Always served: `health-agent volumes` asks it too (in the
        // DaemonSet's container, by the state directory both know).
        volume_health_socket: match args.volume_health_socket {
            Some(path) => ConditionsSocket::Required(path),
            None => ConditionsSocket::Default(args.state_dir.join(AGENT_SOCKET_NAME)),
        },
        state_dir: args.state_dir,
        daemonset: args.daemonset,
    })
}

fn probe_options(args: &KernelArgs, host: &HostPaths) -> ProbeOptions {
    ProbeOptions {
        object: KERNEL_OBJECT,
        sys_root: host.sys_root.clone(),
        proc_root: host.proc_root.clone(),
        flush_errors: args.flush_errors,
        samples_per_sec: args.sample_rate,
        bio_errors: args.bio_errors,
        pin_root: (!args.no_pin).then(|| args.pins.pin_dir.clone()),
        block_attach: args.block_attach,
        early_errors: args.early_block_errors,
        follow_bios: args.follow_bios || args.latency_window != 0.0,
        latency: args.latency_window != 0.0,
        returned_errors: args.returned_errors,
    }
}

fn volumes_config(
    kubelet_root: PathBuf,
    volume: &VolumeArgs,
    intervals: &IntervalArgs,
    host: &HostPaths,
) -> anyhow::Result<LiveVolumesConfig> {
    let check_interval =
        seconds("check-interval", intervals.check_interval).map_err(anyhow::Error::msg)?;
    let csi_interval =
        seconds("csi-interval", intervals.csi_interval).map_err(anyhow::Error::msg)?;
    let stack_interval =
        seconds("stack-interval", intervals.stack_interval).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !stack_interval.is_zero(),
        "--stack-interval must be greater than zero"
    );
    anyhow::ensure!(
        !check_interval.is_zero(),
        "--check-interval must be greater than zero"
    );
    anyhow::ensure!(
        !csi_interval.is_zero(),
        "--csi-interval must be greater than zero"
    );
    let kernel_quiet_window = seconds("kernel-quiet-window", intervals.kernel_quiet_window)
        .map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !kernel_quiet_window.is_zero(),
        "--kernel-quiet-window must be greater than zero"
    );
    Ok(LiveVolumesConfig {
        kubelet_root,
        check: check_config(volume, host)?,
        check_interval,
        csi_interval,
        stack_interval,
        csi_overrides: volume.csi_sockets.clone(),
        conditions: ConditionConfig {
            kernel_quiet_window,
            ..ConditionConfig::default()
        },
    })
}

fn watch_options(args: WatchArgs, host: HostPaths) -> anyhow::Result<(AgentOptions, View)> {
    let volumes = match volumes::kubelet_root(args.volume.kubelet_root.as_deref()) {
        Some(kubelet_root) => Some(volumes_config(
            kubelet_root,
            &args.volume,
            &args.intervals,
            &host,
        )?),
        None => None,
    };
    let duration = args
        .duration
        .map(|d| seconds("duration", d))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let totals_interval =
        seconds("totals-interval", args.totals_interval).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !totals_interval.is_zero(),
        "--totals-interval must be greater than zero"
    );
    anyhow::ensure!(
        volumes.is_some() || args.kernel.latency_window == 0.0,
        "--latency-window needs pod volumes: no kubelet root here (pass --kubelet-root)"
    );
    // A volume's StorageClass is its PV's, which only `run` reads.
    anyhow::ensure!(
        args.kernel.storage_class_latency_limit.is_empty(),
        "--storage-class-latency-limit needs `run`: watch reads no PersistentVolume"
    );
    let view = View::new(args.json, &args.devices);
    let opts = AgentOptions {
        probes: probe_options(&args.kernel, &host),
        event_priority: args.kernel.event_priority,
        stall_after: args.kernel.stall_after(volumes.is_some())?,
        cgroup_root: args.kernel.host_cgroup.clone(),
        latency: args.kernel.latency()?,
        host,
        duration,
        totals_interval,
        volumes,
    };
    Ok((opts, view))
}

fn check_config(args: &VolumeArgs, host: &HostPaths) -> anyhow::Result<CheckConfig> {
    let timeout = seconds("check-timeout", args.check_timeout).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(
        !timeout.is_zero(),
        "--check-timeout must be greater than zero"
    );
    for (name, v) in [
        ("capacity-low-percent", args.capacity_low_percent),
        ("inodes-low-percent", args.inodes_low_percent),
        ("thin-pool-low-percent", args.thin_pool_low_percent),
    ] {
        anyhow::ensure!(
            (0.0..=100.0).contains(&v),
            "--{name} must be between 0 and 100, got {v}"
        );
    }
    Ok(CheckConfig {
        timeout,
        capacity_low_percent: args.capacity_low_percent,
        inodes_low_percent: args.inodes_low_percent,
        sys_root: host.sys_root.clone(),
        proc_root: host.proc_root.clone(),
        thin_pool_low_percent: args.thin_pool_low_percent,
        nvme_health_interval: seconds("nvme-health-interval", args.nvme_health_interval)
            .map_err(anyhow::Error::msg)?,
    })
}

fn uninstall(root: &std::path::Path, sys_root: &std::path::Path) -> anyhow::Result<()> {
    let done = health_kernel::uninstall::uninstall(root, sys_root)?;
    match done.removed {
        None => println!("nothing pinned at {}", root.display()),
        Some(r) => println!(
            "removed {}: {} links detached, {} programs and {} maps unpinned",
            root.display(),
            r.links,
            r.programs,
            r.maps
        ),
    }
    // One that cannot be removed is said, not fatal: the pins are gone, and
    // the next agent removes it as stale.
    match done.witness {
        Ok(true) => println!("removed the tracer witness kept with them"),
        Ok(false) => {}
        Err(e) => eprintln!(
            "health-agent: the tracer witness kept with the pins may remain (the next agent removes it): {e}"
        ),
    }
    Ok(())
}

fn volumes_command(args: VolumesArgs, host: HostPaths) -> anyhow::Result<()> {
    let check = check_config(&args.volume, &host)?;
    let given = args
        .volume
        .kubelet_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_KUBELET_ROOT));
    // mountinfo shows real paths; volume paths are compared with them.
    let root = std::fs::canonicalize(&given).unwrap_or(given);
    if !root.is_dir() {
        tracing::warn!(root = %root.display(), "no kubelet directory: no pod volumes to show");
    }
    let opts = one_shot::ViewOptions {
        pin_root: args.pins.pin_dir,
        host,
        kubelet_root: root,
        check,
        csi_overrides: args.volume.csi_sockets,
    };
    let socket = args
        .agent_socket
        .unwrap_or_else(|| args.state_dir.join(AGENT_SOCKET_NAME));
    let (views, evidence, judged) = block_on(Runtime::TwoWorkers, async {
        let (mut views, evidence) = one_shot::collect(&opts).await?;
        let judged = volumes_command::adopt_running_agents(&mut views, &socket).await;
        Ok::<_, one_shot::ViewError>((views, evidence, judged))
    })??;
    if let one_shot::KernelEvidence::Unavailable(why) = &evidence {
        eprintln!("volume-health: {why}");
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        // Each volume's `conditions_from` says whose; stderr says why not
        // the agent's.
        if let volumes_command::Judged::Alone(_) = &judged {
            eprint!("volume-health: {}", judged.line());
        }
        serde_json::to_writer_pretty(&mut out, &views)?;
        writeln!(out)?;
    } else {
        out.write_all(judged.line().as_bytes())?;
        out.write_all(one_shot::human(&views).as_bytes())?;
    }
    out.flush()?;
    Ok(())
}
