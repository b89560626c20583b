//! `health-agent`: the volume-health node agent.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use health_agent::dev::Dev;
use health_agent::probes::{ProbeError, ProbeOptions};
use health_agent::topology::HostPaths;
use health_agent::watch::{self, WatchOptions};

#[derive(Parser)]
#[command(name = "health-agent", version, about = "Catches storage failures the moment the kernel sees them")]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Where the host's /proc is (in a container, the host's /proc mounted elsewhere).
    #[arg(long, global = true, default_value = "/proc", env = "HEALTH_HOST_PROC")]
    host_proc: PathBuf,
    /// Where the host's /sys is.
    #[arg(long, global = true, default_value = "/sys", env = "HEALTH_HOST_SYS")]
    host_sys: PathBuf,
    /// Log filter (tracing's env-filter syntax), e.g. `info` or `health_agent=debug`.
    #[arg(long, global = true, default_value = "info", env = "HEALTH_LOG")]
    log: String,
}

#[derive(Subcommand)]
enum Command {
    /// Watch this host's block and filesystem errors live (no cluster needed).
    Watch(WatchArgs),
}

#[derive(clap::Args)]
struct WatchArgs {
    /// JSON Lines on stdout, one object per event (schema in README.md).
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
    /// Also catch failed cache flushes (attaches block_rq_complete, which runs on every I/O).
    #[arg(long)]
    flush_errors: bool,
    /// Samples per device per second per CPU (counting is never limited).
    #[arg(long, default_value_t = 100)]
    sample_rate: u32,
}

fn seconds(name: &str, v: f64) -> Result<Duration, String> {
    Duration::try_from_secs_f64(v).map_err(|_| format!("--{name} must be a non-negative number of seconds, got {v}"))
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_new(&cli.log).unwrap_or_else(|e| {
        eprintln!("health-agent: invalid --log filter {:?} ({e}); using `info`", cli.log);
        tracing_subscriber::EnvFilter::new("info")
    });
    tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).init();

    let host = HostPaths { proc_root: cli.host_proc.clone(), sys_root: cli.host_sys.clone() };
    let result = match cli.command {
        Command::Watch(args) => watch_options(args, host).and_then(|opts| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)?;
            rt.block_on(watch::run(opts))
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("health-agent: {e:#}");
            let code = e.downcast_ref::<ProbeError>().map_or(1, ProbeError::exit_code);
            ExitCode::from(code as u8)
        }
    }
}

fn watch_options(args: WatchArgs, host: HostPaths) -> anyhow::Result<WatchOptions> {
    let duration = args.duration.map(|d| seconds("duration", d)).transpose().map_err(anyhow::Error::msg)?;
    let totals_interval = seconds("totals-interval", args.totals_interval).map_err(anyhow::Error::msg)?;
    anyhow::ensure!(!totals_interval.is_zero(), "--totals-interval must be greater than zero");
    Ok(WatchOptions {
        probes: ProbeOptions {
            sys_root: host.sys_root.clone(),
            proc_root: host.proc_root.clone(),
            flush_errors: args.flush_errors,
            samples_per_sec: args.sample_rate,
        },
        host,
        json: args.json,
        duration,
        totals_interval,
        devices: args.devices,
    })
}
