//! Healthy-path overhead: does an attached agent slow down I/O that never
//! fails?
//!
//! A loop device (direct I/O) over a file in /dev/shm: no FUSE and no disk,
//! so a request costs a few microseconds of CPU and any per-request cost the
//! agent adds is as visible as it can be. A run issues O_DIRECT 4 KiB writes
//! and reads (alternating, pseudo-random offsets, queue depth 1) for a fixed
//! time and times every request. Runs without (A) and with (B) the agent
//! alternate, A B then B A, so that slow drift of the machine cancels; each
//! round gives one ratio.
//!
//! The main figure compares the *median request latency* of the two runs of
//! a round: on a shared machine, other tenants' bursts stretch some requests
//! by milliseconds (scheduling delay of our thread or of the loop worker),
//! which swings throughput by tens of percent between identical runs while
//! leaving the median request alone. Throughput ratios are reported too.
//!
//! Apart from the timed rounds, one extra run per configuration has
//! kernel.bpf_stats_enabled on and reads the agent's programs' run count and
//! run time from /proc/<pid>/fdinfo: a direct measurement of the in-kernel
//! cost that does not drown in the noise at all.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::devices::BlockDev;
use health_tests::kubelet_tree::Kubelet;
use health_tests::sys::{self, FileId};

use super::agent::{AgentProc, BpfStatsGuard, ProgStats};
use super::dio::DirectIo;
use super::stats::{median, percentile_sorted};
use super::{interrupt, Tools};

const MIB: u64 = 1 << 20;
const FILE_SIZE: u64 = 256 * MIB;
const BLOCK: u64 = 4096;

pub struct Config {
    pub rounds: u32,
    /// How long each run issues requests.
    pub run_time: Duration,
}

/// What one fixed-time run did.
#[derive(Clone, Copy, Debug)]
pub struct Run {
    pub requests: u64,
    pub elapsed: Duration,
    /// Median request latency, ns.
    pub p50_ns: f64,
}

impl Run {
    pub fn per_sec(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64()
    }
}

/// One A/B round.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub agent_first: bool,
    pub base: Run,
    pub agent: Run,
}

impl Round {
    /// How much longer the median request took with the agent, in percent
    /// (negative: shorter).
    pub fn latency_pct(&self) -> f64 {
        (self.agent.p50_ns / self.base.p50_ns - 1.0) * 100.0
    }

    /// How much throughput the agent cost, in percent (negative: more
    /// requests with it).
    pub fn throughput_pct(&self) -> f64 {
        (1.0 - self.agent.per_sec() / self.base.per_sec()) * 100.0
    }
}

pub struct ConfigResult {
    pub name: &'static str,
    /// The agent's arguments; `TREE` stands for the temporary kubelet tree
    /// with the loop device as a pod's block volume.
    pub args: Vec<String>,
    pub rounds: Vec<Round>,
    /// The agent's programs during one extra run with bpf stats on.
    pub progs: ProgStats,
    /// Block requests the device completed during that run.
    pub device_requests: u64,
}

pub struct OverheadResult {
    pub run_time: Duration,
    pub configs: Vec<ConfigResult>,
}

/// A loop device over a file in /dev/shm, detached and deleted on drop.
struct ShmLoop {
    name: String,
    path: PathBuf,
    file_id: FileId,
    _dir: tempfile::TempDir,
}

impl ShmLoop {
    fn create() -> Result<ShmLoop> {
        let dir = tempfile::Builder::new()
            .prefix("health-bench-")
            .tempdir_in("/dev/shm")
            .context("creating a work dir in /dev/shm")?;
        let image = dir.path().join("disk.img");
        // Written out in full: tmpfs would otherwise allocate pages during
        // the first timed writes.
        let chunk = vec![0x5au8; MIB as usize];
        {
            use std::io::Write;
            let mut f = std::fs::File::create(&image)
                .with_context(|| format!("creating {}", image.display()))?;
            for _ in 0..FILE_SIZE / MIB {
                f.write_all(&chunk)
                    .with_context(|| format!("filling {}", image.display()))?;
            }
        }
        let file_id = FileId::of(&image)?;
        let image_arg = image.to_string_lossy().into_owned();
        let out = health_tests::cmd::run(
            "losetup",
            &["-f", "--show", "--direct-io=on", image_arg.as_str()],
        )?;
        let dev = out.stdout.trim().to_string();
        let name = dev
            .strip_prefix("/dev/")
            .with_context(|| format!("losetup printed {dev:?}"))?
            .to_string();
        let lo = ShmLoop {
            name,
            path: PathBuf::from(&dev),
            file_id,
            _dir: dir,
        };
        let dio = sys::read_sysfs(format!("/sys/block/{}/loop/dio", lo.name))?;
        if dio != "1" {
            bail!(
                "{dev}: the kernel did not enable direct I/O on the loop device (loop/dio = {dio})"
            );
        }
        Ok(lo)
    }

    fn requests(&self) -> Result<u64> {
        let s = sys::block_stat(&self.name)?;
        Ok(s.reads + s.writes + s.flushes + s.discards)
    }
}

impl Drop for ShmLoop {
    fn drop(&mut self) {
        if let Err(e) = sys::detach_loop_device(&self.name, Some(self.file_id)) {
            eprintln!("xtask: detaching {}: {e:#}", self.path.display());
        }
    }
}

/// Requests for `run_time` at queue depth 1, alternating writes and reads at
/// offsets from a fixed pseudo-random sequence, each one timed.
fn workload(io: &mut DirectIo, run_time: Duration, lat_ns: &mut Vec<u32>) -> Result<Run> {
    let blocks = FILE_SIZE / BLOCK;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    lat_ns.clear();
    let start = Instant::now();
    let mut k = 0u64;
    loop {
        if k.is_multiple_of(1024) {
            interrupt::check()?;
            if start.elapsed() >= run_time {
                break;
            }
        }
        // xorshift64: cheap, and the same offsets every run.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % blocks) * BLOCK;
        let t = Instant::now();
        let n = if k.is_multiple_of(2) {
            io.write_at(at)
        } else {
            io.read_at(at)
        }
        .with_context(|| format!("I/O at {at} on the benchmark loop device"))?;
        lat_ns.push(u32::try_from(t.elapsed().as_nanos()).unwrap_or(u32::MAX));
        if n as u64 != BLOCK {
            bail!("short I/O at {at}: {n} bytes");
        }
        k += 1;
    }
    let elapsed = start.elapsed();
    lat_ns.sort_unstable();
    let sorted: Vec<f64> = lat_ns.iter().map(|&v| f64::from(v)).collect();
    Ok(Run {
        requests: k,
        elapsed,
        p50_ns: percentile_sorted(&sorted, 50.0),
    })
}

fn agent_args(extra: &[&str]) -> Vec<String> {
    std::iter::once("--json")
        .chain(extra.iter().copied())
        .map(String::from)
        .collect()
}

pub fn run(tools: &Tools, cfg: &Config) -> Result<OverheadResult> {
    let lo = ShmLoop::create()?;
    let mut io = DirectIo::open(&lo.path, BLOCK as usize)?;
    let mut lat = Vec::with_capacity(1 << 20);
    // Warm up: page tables, the loop worker, caches.
    workload(&mut io, Duration::from_millis(500), &mut lat)?;

    // The loop device as a pod's block volume: `watch` follows bios
    // (`--stall-after`, `--latency-window`) only with pod volumes.
    let kubelet = Kubelet::new()?;
    kubelet.block_volume(
        "b0b0b0b0-0000-4000-8000-0000000000b0",
        "pv-bench",
        &BlockDev::of(&lo.name)?,
    )?;
    let root = kubelet.root_arg();
    let volumes = ["--kubelet-root", root];
    let stalls = [&volumes[..], &["--stall-after", "10", "--follow-bios"]].concat();
    let latency = [&stalls[..], &["--latency-window", "10"]].concat();

    let mut configs = Vec::new();
    for (name, extra) in [
        ("default", &[][..]),
        // Stalls judged from the devices' counters (the default with pod
        // volumes): no program per request.
        ("pod volumes", &volumes[..]),
        // Every bio followed from submission to completion (stalls).
        ("--stall-after 10 --follow-bios", &stalls[..]),
        // And its latency counted at completion.
        (
            "--stall-after 10 --follow-bios --latency-window 10",
            &latency[..],
        ),
        ("--flush-errors", &["--flush-errors"][..]),
        // Failed requests counted at block_rq_complete, before the kernel's
        // console line: the same program on every completion.
        ("--early-block-errors", &["--early-block-errors"][..]),
        // What a host with dm/md devices pays: block_bio_complete attached
        // (it is otherwise attached only once such a device appears).
        ("--bio-errors always", &["--bio-errors", "always"][..]),
    ] {
        let args = agent_args(extra);
        let mut rounds = Vec::new();
        for r in 0..cfg.rounds {
            let agent_first = r % 2 == 1;
            let (base, agent) = if agent_first {
                let b = with_agent(tools, &args, &mut io, cfg.run_time, &mut lat)?;
                (workload(&mut io, cfg.run_time, &mut lat)?, b)
            } else {
                let a = workload(&mut io, cfg.run_time, &mut lat)?;
                (
                    a,
                    with_agent(tools, &args, &mut io, cfg.run_time, &mut lat)?,
                )
            };
            let round = Round {
                agent_first,
                base,
                agent,
            };
            super::say_progress(format!(
                "overhead {name} round {}/{}: median request {:.2} -> {:.2} µs ({:+.2} %), {:.0} -> {:.0} requests/s ({:+.2} %)",
                r + 1,
                cfg.rounds,
                base.p50_ns / 1000.0,
                agent.p50_ns / 1000.0,
                round.latency_pct(),
                base.per_sec(),
                agent.per_sec(),
                round.throughput_pct(),
            ));
            rounds.push(round);
        }
        let (progs, device_requests) =
            program_cost(tools, &args, &lo, &mut io, cfg.run_time, &mut lat)?;
        // As the tables show it: the tree's temporary path said in words.
        let args = args
            .into_iter()
            .map(|a| match a == root {
                true => "TREE".to_string(),
                false => a,
            })
            .collect();
        configs.push(ConfigResult {
            name,
            args,
            rounds,
            progs,
            device_requests,
        });
    }
    Ok(OverheadResult {
        run_time: cfg.run_time,
        configs,
    })
}

/// One run with an agent attached (started before, stopped after).
fn with_agent(
    tools: &Tools,
    args: &[String],
    io: &mut DirectIo,
    run_time: Duration,
    lat: &mut Vec<u32>,
) -> Result<Run> {
    let agent = AgentProc::start(&tools.agent, args, None)?;
    let run = workload(io, run_time, lat)?;
    let stopped = agent.stop_ok()?;
    if !stopped.lines.is_empty() {
        // Some device on this host failed during the run: the agent did
        // more than a healthy-path agent would.
        super::say_progress(format!(
            "note: the agent reported {} error line(s) on this host during a healthy-path run",
            stopped.lines.len()
        ));
    }
    Ok(run)
}

/// Program runs and run time during one run with bpf stats enabled.
fn program_cost(
    tools: &Tools,
    args: &[String],
    lo: &ShmLoop,
    io: &mut DirectIo,
    run_time: Duration,
    lat: &mut Vec<u32>,
) -> Result<(ProgStats, u64)> {
    let _stats = BpfStatsGuard::enable()?;
    let agent = AgentProc::start(&tools.agent, args, None)?;
    let before = agent.bpf_prog_stats()?;
    let req_before = lo.requests()?;
    workload(io, run_time, lat)?;
    let progs = agent.bpf_prog_stats()?.since(before);
    let requests = lo.requests()?.saturating_sub(req_before);
    agent.stop()?;
    Ok((progs, requests))
}

fn min_max(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

impl ConfigResult {
    fn latency_pcts(&self) -> Vec<f64> {
        self.rounds.iter().map(Round::latency_pct).collect()
    }

    fn throughput_pcts(&self) -> Vec<f64> {
        self.rounds.iter().map(Round::throughput_pct).collect()
    }

    pub fn median_latency_pct(&self) -> f64 {
        median(&self.latency_pcts())
    }

    pub fn median_throughput_pct(&self) -> f64 {
        median(&self.throughput_pcts())
    }

    /// Program run time per block request the device completed, ns.
    pub fn prog_ns_per_request(&self) -> f64 {
        self.progs.run_time_ns as f64 / self.device_requests.max(1) as f64
    }

    pub fn ns_per_run(&self) -> Option<f64> {
        (self.progs.run_cnt > 0).then(|| self.progs.run_time_ns as f64 / self.progs.run_cnt as f64)
    }

    /// Median request latency without the agent over all rounds, ns.
    fn base_p50_ns(&self) -> f64 {
        median(
            &self
                .rounds
                .iter()
                .map(|r| r.base.p50_ns)
                .collect::<Vec<_>>(),
        )
    }

    /// Program time as a share of the median request, percent: the
    /// overhead the in-kernel part alone implies for this device.
    pub fn implied_pct(&self) -> f64 {
        self.prog_ns_per_request() / self.base_p50_ns() * 100.0
    }
}

impl OverheadResult {
    pub fn markdown(&self, device: &Path) -> String {
        let mut out = format!(
            "Each run: O_DIRECT 4 KiB writes and reads, alternating, queue depth 1, for {:.1} s, on a loop device \
             with direct I/O over a 256 MiB file in {}. Overhead = with agent / without - 1, per A/B round.\n\n",
            self.run_time.as_secs_f64(),
            device.display()
        );
        out.push_str(
            "| agent | rounds | median request without → with (µs) | overhead, median request: median (min … max) | \
             overhead, throughput: median (min … max) |\n|---|---:|---:|---:|---:|\n",
        );
        for c in &self.configs {
            let (llo, lhi) = min_max(&c.latency_pcts());
            let (tlo, thi) = min_max(&c.throughput_pcts());
            let with = median(&c.rounds.iter().map(|r| r.agent.p50_ns).collect::<Vec<_>>());
            out.push_str(&format!(
                "| `watch {}` | {} | {:.2} → {:.2} | {:+.2} % ({:+.2} … {:+.2}) | {:+.2} % ({:+.2} … {:+.2}) |\n",
                c.args.join(" "),
                c.rounds.len(),
                c.base_p50_ns() / 1000.0,
                with / 1000.0,
                c.median_latency_pct(),
                llo,
                lhi,
                c.median_throughput_pct(),
                tlo,
                thi,
            ));
        }
        out.push_str("\nPer round (median-request overhead %, throughput overhead %, order):\n\n");
        for c in &self.configs {
            let per: Vec<String> = c
                .rounds
                .iter()
                .map(|r| {
                    format!(
                        "{:+.2}/{:+.2} {}",
                        r.latency_pct(),
                        r.throughput_pct(),
                        if r.agent_first { "BA" } else { "AB" }
                    )
                })
                .collect();
            out.push_str(&format!(
                "- `watch {}`: {}\n",
                c.args.join(" "),
                per.join(", ")
            ));
        }
        out.push_str(
            "\nIn-kernel cost, from one extra run per configuration with `kernel.bpf_stats_enabled=1` \
             (run time as the kernel accounts it, including the stats' own two clock reads per run):\n\n",
        );
        out.push_str(
            "| agent | block requests | program runs | ns per run | program ns per request | \
             share of the median request |\n|---|---:|---:|---:|---:|---:|\n",
        );
        for c in &self.configs {
            out.push_str(&format!(
                "| `watch {}` | {} | {} | {} | {:.0} | {:.2} % |\n",
                c.args.join(" "),
                c.device_requests,
                c.progs.run_cnt,
                c.ns_per_run()
                    .map_or("-".to_string(), |n| format!("{n:.0}")),
                c.prog_ns_per_request(),
                c.implied_pct(),
            ));
        }
        out
    }

    pub fn headline(&self) -> String {
        let parts: Vec<String> = self
            .configs
            .iter()
            .map(|c| {
                format!(
                    "{}: median request {:+.2} %, throughput {:+.2} %, programs {:.0} ns/request ({:.2} % of a request)",
                    c.name,
                    c.median_latency_pct(),
                    c.median_throughput_pct(),
                    c.prog_ns_per_request(),
                    c.implied_pct()
                )
            })
            .collect();
        format!("overhead: {}", parts.join("; "))
    }
}
