//! `cargo xtask bench`: which parts to measure and how hard (lab/src/bench.rs
//! runs them).

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Latency,
    Overhead,
    Returned,
    Flood,
    Micro,
    Events,
    EventWatch,
    Status,
    Controller,
    CsiProxy,
    Scale,
}

impl Part {
    /// Whether the part starts a real kube-apiserver (HEALTH_K8S_ASSETS),
    /// whose version `--kubernetes` chooses.
    pub fn starts_kubernetes(self) -> bool {
        matches!(self, Part::EventWatch | Part::Controller | Part::Scale)
    }
}

/// Which supported Kubernetes the parts with a real API server start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Kubernetes {
    /// The newest supported version (`xtask::components::KUBERNETES`).
    #[default]
    Newest,
    /// The oldest supported version (`xtask::components::KUBERNETES_OLDEST`).
    Oldest,
}

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Run only these parts (comma-separated); all by default.
    #[arg(long, value_delimiter = ',', value_enum)]
    pub only: Vec<Part>,
    /// Failed requests in the latency measurement.
    #[arg(long, default_value_t = 1000)]
    pub latency_errors: u32,
    /// Pause after each failed request in the latency measurement, in ms (keeps
    /// the rate under the agent's default budget of 100 samples/s per device per CPU).
    #[arg(long, default_value_t = 11)]
    pub latency_gap_ms: u64,
    /// CPU-bound busy threads spinning through the latency measurement (the
    /// machine has 2 cores: 4 is 2x oversubscription).
    #[arg(long, default_value_t = 0)]
    pub load: u32,
    /// The agent's --event-priority in the latency measurement (rt, nice,
    /// normal); the agent's default when not given.
    #[arg(long)]
    pub latency_priority: Option<String>,
    /// A/B rounds per agent configuration in the overhead measurement.
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Seconds of requests in each overhead run.
    #[arg(long, default_value_t = 1.0)]
    pub run_secs: f64,
    /// Seconds of the error flood.
    #[arg(long, default_value_t = 10.0)]
    pub flood_secs: f64,
    /// Writer threads in the error flood.
    #[arg(long, default_value_t = 4)]
    pub flood_threads: u32,
    /// Run a second BPF tracing tool (an agent with tracefs programs) on the
    /// same tracepoints during the flood; recorded in its own section.
    #[arg(long)]
    pub flood_beside_tracer: bool,
    /// Rounds (failure, Events, recovery) in the event latency measurement.
    #[arg(long, default_value_t = 60)]
    pub event_rounds: u32,
    /// Rounds (failure, Events, recovery) on the real API server in the
    /// event-watch measurement (with `--load` busy threads).
    #[arg(long, default_value_t = 40)]
    pub event_watch_rounds: u32,
    /// Print every API request of each event round with its time after the
    /// failed request (on stderr), to see what the Events wait behind.
    #[arg(long)]
    pub event_trace: bool,
    /// Run the agent with --early-block-errors in the event latency and
    /// flood measurements (failed requests counted at block_rq_complete,
    /// before the kernel prints them); recorded in their own sections.
    #[arg(long)]
    pub early_block_errors: bool,
    /// Storms (errors, VolumeHealth writes, recovery) in the status measurement.
    #[arg(long, default_value_t = 3)]
    pub status_rounds: u32,
    /// Failed writes per storm in the status measurement.
    #[arg(long, default_value_t = 10_000)]
    pub status_errors: u64,
    /// PVs (and driver volumes) in the controller measurement.
    #[arg(long, default_value_t = 10_000)]
    pub controller_volumes: usize,
    /// Rounds (condition, Warning, recovery, Normal) per monitor interval in
    /// the controller measurement.
    #[arg(long, default_value_t = 10)]
    pub controller_rounds: u32,
    /// Steady cycles measured per CSI driver kind in the controller measurement.
    #[arg(long, default_value_t = 3)]
    pub controller_cycles: u32,
    /// PV creates in flight while setting up the controller measurement.
    #[arg(long, default_value_t = 8)]
    pub controller_in_flight: usize,
    /// The controller's --monitor-interval with the per-volume Get driver, in
    /// seconds (longer than a cycle, so calls are counted between cycles).
    #[arg(long, default_value_t = 5.0)]
    pub controller_get_interval: f64,
    /// Calls of each kind, directly and through the proxy, in the CSI
    /// proxy measurement.
    #[arg(long, default_value_t = 2000)]
    pub proxy_calls: u32,
    /// PV counts of the scale measurement, in increasing order (the PVs
    /// grow between measurements).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000")]
    pub scale_pvs: Vec<usize>,
    /// Starts of the single agent at each PV count.
    #[arg(long, default_value_t = 2)]
    pub scale_starts: u32,
    /// Agents started at once, one node identity each (0: none).
    #[arg(long, default_value_t = 50)]
    pub scale_agents: usize,
    /// The PV count at which the agents start at once.
    #[arg(long, default_value_t = 10_000)]
    pub scale_agents_at: usize,
    /// Leave the controller out of the scale measurement.
    #[arg(long)]
    pub scale_no_controller: bool,
    /// Creates in flight while populating the scale measurement's cluster.
    #[arg(long, default_value_t = 32)]
    pub scale_in_flight: usize,
    /// Also let the agents list and watch PVs: for an agent built before
    /// issue 29 (HEALTH_AGENT_BIN), which deploy/'s RBAC no longer fits.
    #[arg(long)]
    pub scale_grant_pv_list: bool,
    /// The Kubernetes whose kube-apiserver the event-watch, controller and
    /// scale parts start, built from its Go modules: the newest supported
    /// version or the oldest. The oldest's results go to blocks of their own
    /// in docs/benchmarks.md (`scale-kubernetes-oldest`, ...).
    #[arg(long, value_enum, default_value_t)]
    pub kubernetes: Kubernetes,
    /// Print the results but leave docs/benchmarks.md alone.
    #[arg(long)]
    pub no_write: bool,
}
