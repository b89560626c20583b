//! `cargo xtask bench`: measures the agent against real kernel errors and
//! records the figures in docs/benchmarks.md.
//!
//! Four parts, each a submodule:
//! * [`latency`]: from a failed request to the agent's line;
//! * [`overhead`]: healthy I/O with and without the agent, A/B;
//! * [`returned`]: what `--returned-errors` adds to a successful read or
//!   write, A/B, in a QEMU guest by default (the host refuses fexit);
//! * [`flood`]: exact totals, CPU and memory under an error flood;
//! * [`micro`]: criterion benchmark of the per-event userspace path;
//! * [`events`]: cluster mode, from a failed request to the Event request;
//! * [`event_watch`]: cluster mode on the real API server, from a failed
//!   request to the Warning at a client watching Events;
//! * [`status`]: cluster mode, the VolumeHealth and label writes of an error
//!   storm;
//! * [`controller`]: `health-controller` over 10,000 volumes on a real
//!   API server, and from a backend condition to the PVC's Event (needs no
//!   root, only kube-apiserver);
//! * [`csi_proxy`]: the latency `health-agent csi-proxy` adds to a CSI call
//!   of the kubelet, in front of the real csi-driver-host-path;
//! * [`scale`]: the agent's start (requests, bytes, memory) and the
//!   controller on a real API server holding 1,000 to 100,000 PVs, and many
//!   agents starting at once.
//!
//! These are measurements, not tests: nothing here asserts a target, but
//! every part checks that what it measured is real (errors reported equal
//! errors injected) and fails loudly when it is not.

mod agent;
mod controller;
mod csi_proxy;
pub mod dio;
mod event_watch;
mod events;
mod flood;
pub mod interrupt;
mod latency;
mod micro;
mod overhead;
mod report;
mod returned;
mod scale;
mod stats;
mod status;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

pub use agent::AgentProc;
use anyhow::{bail, Context, Result};
use xtask::build;
pub use xtask::lab_cli::bench::{BenchArgs, Part};
use xtask::util::{is_root, output, say, workspace_root};

/// The binaries the measurements run.
pub struct Tools {
    pub agent: PathBuf,
    pub faultdisk: PathBuf,
}

/// Builds the agent (with its kernel programs) and the faultdisk server, or
/// takes both from HEALTH_AGENT_BIN and FAULTDISK_BIN.
pub fn prepare() -> Result<Tools> {
    if !is_root() {
        bail!("this drives the real kernel (eBPF programs, loop devices, FUSE, mounts) and must run as root");
    }
    // Prebuilt binaries (e.g. from CI artifacts, or to repeat a run against
    // the very same build): both given means nothing is built.
    if let (Some(agent), Some(faultdisk)) = (
        std::env::var_os("HEALTH_AGENT_BIN"),
        std::env::var_os("FAULTDISK_BIN"),
    ) {
        let tools = Tools {
            agent: PathBuf::from(agent),
            faultdisk: PathBuf::from(faultdisk),
        };
        for bin in [&tools.agent, &tools.faultdisk] {
            if !bin.is_file() {
                bail!(
                    "{} (from HEALTH_AGENT_BIN / FAULTDISK_BIN) does not exist",
                    bin.display()
                );
            }
        }
        say(format!("using {} and {} as they are (HEALTH_AGENT_BIN and FAULTDISK_BIN are set; nothing built)", tools.agent.display(), tools.faultdisk.display()));
        health_tests::require_env(&[])?;
        return Ok(tools);
    }
    // The fault disk server comes from the workspace build, which also
    // leaves its own agent (the test suites' feature set) at
    // target/release/health-agent; the agent measured is a user's build of
    // its package, built after it and copied apart, so that no later
    // workspace build (the csi_proxy part's driver) replaces it midway.
    let faultdisk = build::release_test_binary("faultdisk")?;
    // The tools the measurements drive install while the agent compiles.
    let built = build::binaries(&build::Wanted {
        packages: xtask::bootstrap::TEST_PACKAGES,
        ..Default::default()
    })?;
    // Check them anyway, so that a missing one is named with its package
    // before anything is set up.
    health_tests::require_env(&[])?;
    let agent = xtask::util::target_dir().join("bench/health-agent");
    std::fs::create_dir_all(agent.parent().context("a parent")?)?;
    std::fs::copy(&built.agent, &agent)
        .with_context(|| format!("copying {} to {}", built.agent.display(), agent.display()))?;
    Ok(Tools { agent, faultdisk })
}

/// Progress on stderr, so stdout stays for results.
pub fn say_progress(msg: impl AsRef<str>) {
    say(msg);
}

/// What the figures were measured on.
struct Machine {
    date: String,
    kernel: String,
    cpu: String,
    cores: usize,
    mem_gib: f64,
    commit: String,
}

impl Machine {
    fn read() -> Machine {
        let date = time::OffsetDateTime::now_utc()
            .format(time::macros::format_description!(
                "[year]-[month]-[day] [hour]:[minute] UTC"
            ))
            .unwrap_or_else(|_| "unknown date".into());
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_or_else(|_| "unknown".into(), |s| s.trim().to_string());
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| {
                l.strip_prefix("model name")
                    .and_then(|r| r.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let mem_gib = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                m.lines()
                    .find_map(|l| l.strip_prefix("MemTotal:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            })
            .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
        let commit = output(
            Command::new("git")
                .current_dir(workspace_root())
                .args(["describe", "--always", "--dirty"]),
        )
        .map_or_else(|_| "unknown".into(), |s| s.trim().to_string());
        Machine {
            date,
            kernel,
            cpu,
            cores,
            mem_gib,
            commit,
        }
    }

    /// The italic line heading each result block. Called right after the
    /// part ran, so the load average describes the machine during it: on a
    /// shared machine that explains more of the variance than anything else.
    fn line(&self, command: &str, took: Duration) -> String {
        let load = std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_string))
            .unwrap_or_else(|| "?".into());
        format!(
            "_Measured {} on Linux {}, {} ({} cores), {:.0} GiB RAM; commit {}; `{command}`, {:.0} s; \
             1-minute load average {load} at the end._\n\n",
            self.date,
            self.kernel,
            self.cpu,
            self.cores,
            self.mem_gib,
            self.commit,
            took.as_secs_f64()
        )
    }
}

/// Runs the selected parts, prints their headlines and updates docs/benchmarks.md.
pub fn run_bench(args: &BenchArgs) -> Result<()> {
    interrupt::install()?;
    let started = Instant::now();
    let parts: Vec<Part> = if args.only.is_empty() {
        vec![
            Part::Latency,
            Part::Overhead,
            Part::Returned,
            Part::Flood,
            Part::Micro,
            Part::Events,
            Part::EventWatch,
            Part::Status,
            Part::Controller,
            Part::CsiProxy,
            Part::Scale,
        ]
    } else {
        args.only.clone()
    };
    // The controller part drives no kernel: it needs neither root nor the
    // kernel programs, only its two binaries.
    let kernel_tools = if parts.iter().any(|p| *p != Part::Controller) {
        Some(prepare()?)
    } else {
        None
    };
    let tools = || {
        kernel_tools
            .as_ref()
            .context("the kernel parts' tools were not prepared")
    };
    let controller_tools = if parts.contains(&Part::Controller)
        || (parts.contains(&Part::Scale) && !args.scale_no_controller)
    {
        Some(controller::prepare()?)
    } else {
        None
    };
    let machine = Machine::read();
    let file = workspace_root().join("docs/benchmarks.md");
    let mut headlines = Vec::new();
    let mut inexact = false;
    for part in parts {
        interrupt::check()?;
        let t = Instant::now();
        // The guest's section comes with its own machine line.
        let mut headed = false;
        let (id, command, headline, body) = match part {
            Part::Latency => {
                say(format!(
                    "latency: {} failing writes, {} ms apart, {} busy threads",
                    args.latency_errors, args.latency_gap_ms, args.load
                ));
                let cfg = latency::Config {
                    errors: args.latency_errors,
                    gap: Duration::from_millis(args.latency_gap_ms),
                    load: args.load,
                    event_priority: args.latency_priority.clone(),
                };
                let r = latency::run(tools()?, &cfg)?;
                let priority = args
                    .latency_priority
                    .as_ref()
                    .map(|p| format!(" --latency-priority {p}"))
                    .unwrap_or_default();
                (
                    "latency",
                    format!(
                        "cargo xtask bench --only latency --latency-errors {} --latency-gap-ms {} --load {}{priority}",
                        args.latency_errors, args.latency_gap_ms, args.load
                    ),
                    r.headline(),
                    r.markdown(),
                )
            }
            Part::Overhead => {
                say(format!(
                    "overhead: {} A/B rounds per configuration",
                    args.rounds
                ));
                let cfg = overhead::Config {
                    rounds: args.rounds,
                    run_time: Duration::try_from_secs_f64(args.run_secs).context("--run-secs")?,
                };
                let r = overhead::run(tools()?, &cfg)?;
                (
                    "overhead",
                    format!(
                        "cargo xtask bench --only overhead --rounds {} --run-secs {}",
                        args.rounds, args.run_secs
                    ),
                    r.headline(),
                    r.markdown(Path::new("/dev/shm")),
                )
            }
            Part::Returned => {
                let at = returned::Where::from_env()?;
                let command = at.command(args.rounds);
                if at.here() {
                    say(format!("returned: {} A/B rounds", args.rounds));
                    let r = returned::run(tools()?, args.rounds)?;
                    (at.id(), command, r.headline(), r.markdown())
                } else {
                    let (body, headline) = returned::in_guest(tools()?, &at, args.rounds)?;
                    headed = true;
                    (at.id(), command, headline, body)
                }
            }
            Part::Flood => {
                say(format!(
                    "flood: {} writers failing for {} s",
                    args.flood_threads, args.flood_secs
                ));
                let cfg = flood::Config {
                    threads: args.flood_threads,
                    duration: Duration::try_from_secs_f64(args.flood_secs)
                        .context("--flood-secs")?,
                    beside_tracer: args.flood_beside_tracer,
                    early_block_errors: args.early_block_errors,
                };
                let r = flood::run(tools()?, &cfg)?;
                // Recorded anyway (the file says NOT EXACT), then reported
                // as a failure once everything else ran.
                inexact |= !r.exact() && !r.accounted();
                let id = match (args.flood_beside_tracer, args.early_block_errors) {
                    (true, true) => "flood-beside-early",
                    (true, false) => "flood-beside",
                    (false, true) => "flood-early",
                    (false, false) => "flood",
                };
                let flag = |on: bool, name: &'static str| if on { name } else { "" };
                let beside = [
                    flag(args.flood_beside_tracer, " --flood-beside-tracer"),
                    flag(args.early_block_errors, " --early-block-errors"),
                ]
                .concat();
                (
                    id,
                    format!(
                        "cargo xtask bench --only flood --flood-threads {} --flood-secs {}{beside}",
                        args.flood_threads, args.flood_secs
                    ),
                    r.headline(),
                    r.markdown(),
                )
            }
            Part::Events => {
                say(format!(
                    "events: {} rounds of failure, Events, recovery",
                    args.event_rounds
                ));
                let r = events::run(
                    tools()?,
                    &events::Config {
                        rounds: args.event_rounds,
                        trace: args.event_trace,
                        early_block_errors: args.early_block_errors,
                    },
                )?;
                let (id, early) = if args.early_block_errors {
                    ("events-early", " --early-block-errors")
                } else {
                    ("events", "")
                };
                (
                    id,
                    format!(
                        "cargo xtask bench --only events --event-rounds {}{early}",
                        args.event_rounds
                    ),
                    r.headline(),
                    r.markdown(),
                )
            }
            Part::Status => {
                say(format!(
                    "status: {} storms of {} errors, VolumeHealth writes, recovery",
                    args.status_rounds, args.status_errors
                ));
                let r = status::run(
                    tools()?,
                    &status::Config {
                        rounds: args.status_rounds,
                        errors: args.status_errors,
                    },
                )?;
                (
                    "status",
                    format!(
                        "cargo xtask bench --only status --status-rounds {} --status-errors {}",
                        args.status_rounds, args.status_errors
                    ),
                    r.headline(),
                    r.markdown(),
                )
            }
            Part::Controller => {
                say(format!(
                    "controller: {} volumes, {} rounds per interval",
                    args.controller_volumes, args.controller_rounds
                ));
                let cfg = controller::Config {
                    volumes: args.controller_volumes,
                    rounds: args.controller_rounds,
                    cycles: args.controller_cycles,
                    in_flight: args.controller_in_flight,
                    get_interval: args.controller_get_interval,
                };
                let bins = controller_tools
                    .as_ref()
                    .context("the controller's tools were not prepared")?;
                let r = controller::run(bins, &cfg)?;
                (
                    "controller",
                    format!(
                        "cargo xtask bench --only controller --controller-volumes {} --controller-rounds {} --controller-cycles {} --controller-get-interval {}",
                        args.controller_volumes,
                        args.controller_rounds,
                        args.controller_cycles,
                        args.controller_get_interval
                    ),
                    r.headline(),
                    r.markdown(),
                )
            }
            Part::EventWatch => {
                say(format!(
                    "event-watch: {} rounds on the real API server, {} busy threads",
                    args.event_watch_rounds, args.load
                ));
                let r = event_watch::run(
                    tools()?,
                    &event_watch::Config {
                        rounds: args.event_watch_rounds,
                        load: args.load,
                    },
                )?;
                let id = if args.load > 0 {
                    "event-watch-load"
                } else {
                    "event-watch"
                };
                (
                    id,
                    format!(
                        "cargo xtask bench --only event-watch --event-watch-rounds {} --load {}",
                        args.event_watch_rounds, args.load
                    ),
                    r.headline(),
                    r.markdown(),
                )
            }
            Part::CsiProxy => {
                say(format!(
                    "csi-proxy: {} calls of each kind, directly and through the proxy",
                    args.proxy_calls
                ));
                let r = csi_proxy::run(
                    tools()?,
                    &csi_proxy::Config {
                        calls: args.proxy_calls,
                    },
                )?;
                (
                    "csi-proxy",
                    format!(
                        "cargo xtask bench --only csi-proxy --proxy-calls {}",
                        args.proxy_calls
                    ),
                    r.headline(),
                    r.markdown(),
                )
            }
            Part::Scale => {
                say(format!(
                    "scale: PVs {:?}, {} starts each, {} agents at once at {} PVs",
                    args.scale_pvs, args.scale_starts, args.scale_agents, args.scale_agents_at
                ));
                let r = scale::run(
                    &scale::Tools {
                        agent: &tools()?.agent,
                        controller: controller_tools.as_ref(),
                    },
                    &scale::Config {
                        pvs: args.scale_pvs.clone(),
                        starts: args.scale_starts,
                        agents: args.scale_agents,
                        agents_at: args.scale_agents_at,
                        in_flight: args.scale_in_flight,
                        grant_pv_list: args.scale_grant_pv_list,
                    },
                )?;
                let pvs: Vec<String> = args.scale_pvs.iter().map(|n| n.to_string()).collect();
                let no_controller = [
                    (args.scale_no_controller, " --scale-no-controller"),
                    (args.scale_grant_pv_list, " --scale-grant-pv-list"),
                ]
                .iter()
                .filter(|(on, _)| *on)
                .map(|(_, flag)| *flag)
                .collect::<String>();
                (
                    "scale",
                    format!(
                        "cargo xtask bench --only scale --scale-pvs {} --scale-starts {} --scale-agents {} --scale-agents-at {}{no_controller}",
                        pvs.join(","),
                        args.scale_starts,
                        args.scale_agents,
                        args.scale_agents_at
                    ),
                    r.headline(),
                    r.markdown(),
                )
            }
            Part::Micro => {
                say("micro: criterion benchmark of the event path");
                let r = micro::run_all(Duration::from_secs(1), Duration::from_secs(3))?;
                (
                    "micro",
                    "cargo xtask bench --only micro".to_string(),
                    r.headline(),
                    r.markdown(),
                )
            }
        };
        say(&headline);
        headlines.push(headline);
        let body = match headed {
            true => body,
            false => format!("{}{body}", machine.line(&command, t.elapsed())),
        };
        if args.no_write {
            println!("\n{body}");
        } else {
            report::update(&file, id, &body)?;
        }
    }
    println!("{}", headlines.join("\n"));
    if !args.no_write {
        say(format!("results written to {}", file.display()));
    }
    say(format!("took {:.0} s", started.elapsed().as_secs_f64()));
    if inexact {
        bail!("the agent's totals under the flood did not match what was injected, and the difference was not reported (see above)");
    }
    Ok(())
}
