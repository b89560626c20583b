//! `cargo xtask bench`: measures the agent against real kernel errors and
//! records the figures in docs/benchmarks.md.
//!
//! The parts, each a submodule ([`parts`] runs one with the given options):
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
mod parts;
mod report;
mod returned;
mod scale;
mod stats;
mod status;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

pub use agent::AgentProc;
use anyhow::{bail, Context, Result};
use xtask::build;
pub use xtask::lab_cli::bench::{BenchArgs, Kubernetes, Part};
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
    let parts = selected(args);
    let tools = prepare_for(&parts, args)?;
    let machine = Machine::read();
    let file = workspace_root().join("docs/benchmarks.md");
    let mut headlines = Vec::new();
    let mut inexact = false;
    for part in parts {
        interrupt::check()?;
        let t = Instant::now();
        let m = parts::run(part, args, &tools)?;
        say(&m.headline);
        inexact |= m.inexact;
        let body = match m.headed {
            true => m.body,
            false => format!("{}{}", machine.line(&m.command, t.elapsed()), m.body),
        };
        if args.no_write {
            println!("\n{body}");
        } else {
            report::update(&file, &block_id(part, m.id, args.kubernetes), &body)?;
        }
        headlines.push(m.headline);
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

/// The block of docs/benchmarks.md a part's results replace: the oldest
/// Kubernetes's figures beside the newest's, not over them.
fn block_id(part: Part, id: &str, version: Kubernetes) -> String {
    match (part.starts_kubernetes(), version) {
        (true, Kubernetes::Oldest) => format!("{id}-kubernetes-oldest"),
        _ => id.to_string(),
    }
}

/// `--only`'s parts, or all of them in the order docs/benchmarks.md has.
fn selected(args: &BenchArgs) -> Vec<Part> {
    if !args.only.is_empty() {
        return args.only.clone();
    }
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
}

/// Builds what the selected parts run. The controller part drives no
/// kernel: it needs neither root nor the kernel programs, only its two
/// binaries.
fn prepare_for(parts: &[Part], args: &BenchArgs) -> Result<parts::Prepared> {
    let kernel = match parts.iter().any(|p| *p != Part::Controller) {
        true => Some(prepare()?),
        false => None,
    };
    let wants_controller = parts.contains(&Part::Controller)
        || (parts.contains(&Part::Scale) && !args.scale_no_controller);
    let controller = match wants_controller {
        true => Some(controller::prepare()?),
        false => None,
    };
    Ok(parts::Prepared { kernel, controller })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_kubernetes_figures_go_beside_the_newest() {
        assert_eq!(block_id(Part::Scale, "scale", Kubernetes::Newest), "scale");
        assert_eq!(
            block_id(Part::Scale, "scale", Kubernetes::Oldest),
            "scale-kubernetes-oldest"
        );
        assert_eq!(
            block_id(Part::Controller, "controller", Kubernetes::Oldest),
            "controller-kubernetes-oldest"
        );
        // A part without an API server is the same on either.
        assert_eq!(
            block_id(Part::Latency, "latency", Kubernetes::Oldest),
            "latency"
        );
    }
}
