//! One function per benchmark part: its progress line, its run with the
//! options `cargo xtask bench` was given, and what it records (the section
//! id in docs/benchmarks.md, the command that repeats it, its headline and
//! its body).

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use xtask::util::say;

use super::{
    controller, csi_proxy, event_watch, events, flood, latency, micro, overhead, returned, scale,
    status, BenchArgs, Part, Tools,
};

/// What a part measured, ready to record.
pub struct Measured {
    /// Its section in docs/benchmarks.md.
    pub id: &'static str,
    /// The command that repeats it.
    pub command: String,
    pub headline: String,
    pub body: String,
    /// The body brings its own machine line (a guest's).
    pub headed: bool,
    /// Totals that did not match what was injected, unreported: recorded,
    /// then the run fails.
    pub inexact: bool,
}

impl Measured {
    fn new(id: &'static str, command: String, headline: String, body: String) -> Measured {
        Measured {
            id,
            command,
            headline,
            body,
            headed: false,
            inexact: false,
        }
    }
}

/// What the parts run: the kernel parts' binaries, the controller's.
pub struct Prepared {
    pub kernel: Option<Tools>,
    pub controller: Option<controller::Tools>,
}

impl Prepared {
    fn kernel(&self) -> Result<&Tools> {
        self.kernel
            .as_ref()
            .context("the kernel parts' tools were not prepared")
    }
}

/// Runs one part.
pub fn run(part: Part, args: &BenchArgs, tools: &Prepared) -> Result<Measured> {
    match part {
        Part::Latency => latency(args, tools.kernel()?),
        Part::Overhead => overhead(args, tools.kernel()?),
        Part::Returned => returned(args, tools.kernel()?),
        Part::Flood => flood(args, tools.kernel()?),
        Part::Micro => micro(),
        Part::Events => events(args, tools.kernel()?),
        Part::EventWatch => event_watch(args, tools.kernel()?),
        Part::Status => status(args, tools.kernel()?),
        Part::Controller => controller(
            args,
            tools
                .controller
                .as_ref()
                .context("the controller's tools were not prepared")?,
        ),
        Part::CsiProxy => csi_proxy(args, tools.kernel()?),
        Part::Scale => scale(args, tools),
    }
}

fn latency(args: &BenchArgs, tools: &Tools) -> Result<Measured> {
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
    let r = latency::run(tools, &cfg)?;
    let priority = args
        .latency_priority
        .as_ref()
        .map(|p| format!(" --latency-priority {p}"))
        .unwrap_or_default();
    Ok(Measured::new(
        "latency",
        format!(
            "cargo xtask bench --only latency --latency-errors {} --latency-gap-ms {} --load {}{priority}",
            args.latency_errors, args.latency_gap_ms, args.load
        ),
        r.headline(),
        r.markdown(),
    ))
}

fn overhead(args: &BenchArgs, tools: &Tools) -> Result<Measured> {
    say(format!(
        "overhead: {} A/B rounds per configuration",
        args.rounds
    ));
    let cfg = overhead::Config {
        rounds: args.rounds,
        run_time: Duration::try_from_secs_f64(args.run_secs).context("--run-secs")?,
    };
    let r = overhead::run(tools, &cfg)?;
    Ok(Measured::new(
        "overhead",
        format!(
            "cargo xtask bench --only overhead --rounds {} --run-secs {}",
            args.rounds, args.run_secs
        ),
        r.headline(),
        r.markdown(Path::new("/dev/shm")),
    ))
}

fn returned(args: &BenchArgs, tools: &Tools) -> Result<Measured> {
    let at = returned::Where::from_env()?;
    let command = at.command(args.rounds);
    if at.here() {
        say(format!("returned: {} A/B rounds", args.rounds));
        let r = returned::run(tools, args.rounds)?;
        return Ok(Measured::new(at.id(), command, r.headline(), r.markdown()));
    }
    let (body, headline) = returned::in_guest(tools, &at, args.rounds)?;
    Ok(Measured {
        headed: true,
        ..Measured::new(at.id(), command, headline, body)
    })
}

fn flood(args: &BenchArgs, tools: &Tools) -> Result<Measured> {
    say(format!(
        "flood: {} writers failing for {} s",
        args.flood_threads, args.flood_secs
    ));
    let cfg = flood::Config {
        threads: args.flood_threads,
        duration: Duration::try_from_secs_f64(args.flood_secs).context("--flood-secs")?,
        beside_tracer: args.flood_beside_tracer,
        early_block_errors: args.early_block_errors,
    };
    let r = flood::run(tools, &cfg)?;
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
    Ok(Measured {
        // Recorded anyway (the file says NOT EXACT), then reported as a
        // failure once everything else ran.
        inexact: !r.exact() && !r.accounted(),
        ..Measured::new(
            id,
            format!(
                "cargo xtask bench --only flood --flood-threads {} --flood-secs {}{beside}",
                args.flood_threads, args.flood_secs
            ),
            r.headline(),
            r.markdown(),
        )
    })
}

fn micro() -> Result<Measured> {
    say("micro: criterion benchmark of the event path");
    let r = micro::run_all(Duration::from_secs(1), Duration::from_secs(3))?;
    Ok(Measured::new(
        "micro",
        "cargo xtask bench --only micro".to_string(),
        r.headline(),
        r.markdown(),
    ))
}

fn events(args: &BenchArgs, tools: &Tools) -> Result<Measured> {
    say(format!(
        "events: {} rounds of failure, Events, recovery",
        args.event_rounds
    ));
    let r = events::run(
        tools,
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
    Ok(Measured::new(
        id,
        format!(
            "cargo xtask bench --only events --event-rounds {}{early}",
            args.event_rounds
        ),
        r.headline(),
        r.markdown(),
    ))
}

fn event_watch(args: &BenchArgs, tools: &Tools) -> Result<Measured> {
    say(format!(
        "event-watch: {} rounds on the real API server, {} busy threads",
        args.event_watch_rounds, args.load
    ));
    let r = event_watch::run(
        tools,
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
    Ok(Measured::new(
        id,
        format!(
            "cargo xtask bench --only event-watch --event-watch-rounds {} --load {}",
            args.event_watch_rounds, args.load
        ),
        r.headline(),
        r.markdown(),
    ))
}

fn status(args: &BenchArgs, tools: &Tools) -> Result<Measured> {
    say(format!(
        "status: {} storms of {} errors, VolumeHealth writes, recovery",
        args.status_rounds, args.status_errors
    ));
    let r = status::run(
        tools,
        &status::Config {
            rounds: args.status_rounds,
            errors: args.status_errors,
        },
    )?;
    Ok(Measured::new(
        "status",
        format!(
            "cargo xtask bench --only status --status-rounds {} --status-errors {}",
            args.status_rounds, args.status_errors
        ),
        r.headline(),
        r.markdown(),
    ))
}

fn controller(args: &BenchArgs, bins: &controller::Tools) -> Result<Measured> {
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
    let r = controller::run(bins, &cfg)?;
    Ok(Measured::new(
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
    ))
}

fn csi_proxy(args: &BenchArgs, tools: &Tools) -> Result<Measured> {
    say(format!(
        "csi-proxy: {} calls of each kind, directly and through the proxy",
        args.proxy_calls
    ));
    let r = csi_proxy::run(
        tools,
        &csi_proxy::Config {
            calls: args.proxy_calls,
        },
    )?;
    Ok(Measured::new(
        "csi-proxy",
        format!(
            "cargo xtask bench --only csi-proxy --proxy-calls {}",
            args.proxy_calls
        ),
        r.headline(),
        r.markdown(),
    ))
}

fn scale(args: &BenchArgs, tools: &Prepared) -> Result<Measured> {
    say(format!(
        "scale: PVs {:?}, {} starts each, {} agents at once at {} PVs",
        args.scale_pvs, args.scale_starts, args.scale_agents, args.scale_agents_at
    ));
    let r = scale::run(
        &scale::Tools {
            agent: &tools.kernel()?.agent,
            controller: tools.controller.as_ref(),
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
    let flags = [
        (args.scale_no_controller, " --scale-no-controller"),
        (args.scale_grant_pv_list, " --scale-grant-pv-list"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, flag)| *flag)
    .collect::<String>();
    Ok(Measured::new(
        "scale",
        format!(
            "cargo xtask bench --only scale --scale-pvs {} --scale-starts {} --scale-agents {} --scale-agents-at {}{flags}",
            pvs.join(","),
            args.scale_starts,
            args.scale_agents,
            args.scale_agents_at
        ),
        r.headline(),
        r.markdown(),
    ))
}
