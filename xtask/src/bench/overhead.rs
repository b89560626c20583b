//! Healthy-path overhead: does an attached agent slow down I/O that never
//! fails?
//!
//! A loop device (direct I/O) over a file in /dev/shm: no FUSE and no disk,
//! so a request costs a few microseconds of CPU and any per-request cost the
//! agent adds is as visible as it can be. Each run is a fixed amount of work:
//! the same pseudo-random sequence of O_DIRECT 4 KiB writes and reads at
//! queue depth 1. Runs with and without the agent alternate (A B, then B A,
//! so slow drift of the machine cancels) and each round gives one ratio.
//!
//! Apart from the timed rounds, one extra run per configuration has
//! kernel.bpf_stats_enabled on and reads the agent's programs' run count and
//! run time from /proc/<pid>/fdinfo: a direct measurement of the in-kernel
//! cost that does not drown in the noise of a shared machine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::sys::{self, FileId};

use super::agent::{AgentProc, BpfStatsGuard, ProgStats};
use super::dio::DirectIo;
use super::stats::median;
use super::{interrupt, Tools};

const MIB: u64 = 1 << 20;
const FILE_SIZE: u64 = 256 * MIB;
const BLOCK: u64 = 4096;

pub struct Config {
    pub rounds: u32,
    /// Wall time one run should take; the op count is calibrated to it once.
    pub run_target: Duration,
}

/// One A/B round: the same work without and with the agent.
#[derive(Clone, Copy, Debug)]
pub struct Round {
    pub agent_first: bool,
    pub base: Duration,
    pub agent: Duration,
}

impl Round {
    /// Extra time with the agent, in percent (negative: faster with it).
    pub fn overhead_pct(&self) -> f64 {
        (self.agent.as_secs_f64() / self.base.as_secs_f64() - 1.0) * 100.0
    }
}

pub struct ConfigResult {
    pub name: &'static str,
    pub args: Vec<String>,
    pub rounds: Vec<Round>,
    /// The agent's programs during one extra run with bpf stats on.
    pub progs: ProgStats,
    /// Block requests the device completed during that run.
    pub requests: u64,
    pub prog_run_wall: Duration,
}

pub struct OverheadResult {
    pub ops: u64,
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
        let out = health_tests::cmd::run(
            "losetup",
            &["-f", "--show", "--direct-io=on", &image.to_string_lossy()],
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

/// `ops` requests at queue depth 1, alternating writes and reads, at offsets
/// from a fixed pseudo-random sequence (the same in every run).
fn workload(io: &mut DirectIo, ops: u64) -> Result<Duration> {
    let blocks = FILE_SIZE / BLOCK;
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let start = Instant::now();
    for k in 0..ops {
        if k % 4096 == 0 {
            interrupt::check()?;
        }
        // xorshift64: cheap, and the same offsets every run.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % blocks) * BLOCK;
        let n = if k % 2 == 0 {
            io.write_at(at)
        } else {
            io.read_at(at)
        }
        .with_context(|| format!("I/O at {at} on the benchmark loop device"))?;
        if n as u64 != BLOCK {
            bail!("short I/O at {at}: {n} bytes");
        }
    }
    Ok(start.elapsed())
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

    // Warm up (page tables, loop worker, caches), then size a run.
    let probe_ops = 4000;
    workload(&mut io, probe_ops)?;
    let per_op = workload(&mut io, probe_ops)?.as_secs_f64() / probe_ops as f64;
    let ops =
        ((cfg.run_target.as_secs_f64() / per_op) as u64).clamp(10_000, 1_000_000) / 1000 * 1000;

    let mut configs = Vec::new();
    for (name, extra) in [
        ("default", &[][..]),
        ("--flush-errors", &["--flush-errors"][..]),
    ] {
        let args = agent_args(extra);
        let mut rounds = Vec::new();
        for r in 0..cfg.rounds {
            let agent_first = r % 2 == 1;
            let (base, agent) = if agent_first {
                let a = timed_with_agent(tools, &args, &mut io, ops)?;
                (workload(&mut io, ops)?, a)
            } else {
                let b = workload(&mut io, ops)?;
                (b, timed_with_agent(tools, &args, &mut io, ops)?)
            };
            let round = Round {
                agent_first,
                base,
                agent,
            };
            super::say_progress(format!(
                "overhead {name} round {}/{}: without {:.3} s, with {:.3} s ({:+.2} %)",
                r + 1,
                cfg.rounds,
                base.as_secs_f64(),
                agent.as_secs_f64(),
                round.overhead_pct()
            ));
            rounds.push(round);
        }
        let (progs, requests, prog_run_wall) = program_cost(tools, &args, &lo, &mut io, ops)?;
        configs.push(ConfigResult {
            name,
            args,
            rounds,
            progs,
            requests,
            prog_run_wall,
        });
    }
    Ok(OverheadResult { ops, configs })
}

/// One timed run with an agent attached (started before, stopped after).
fn timed_with_agent(
    tools: &Tools,
    args: &[String],
    io: &mut DirectIo,
    ops: u64,
) -> Result<Duration> {
    let agent = AgentProc::start(&tools.agent, args, None)?;
    let t = workload(io, ops)?;
    let stopped = agent.stop()?;
    if !stopped.status.success() {
        bail!(
            "the agent exited with {}:\n{}",
            stopped.status,
            stopped.stderr
        );
    }
    if !stopped.lines.is_empty() {
        // A line means some device on this host failed during the run: the
        // round then measured error handling, not the healthy path.
        super::say_progress(format!(
            "note: the agent reported {} error line(s) during a healthy-path run",
            stopped.lines.len()
        ));
    }
    Ok(t)
}

/// Program runs and run time during one run with bpf stats enabled.
fn program_cost(
    tools: &Tools,
    args: &[String],
    lo: &ShmLoop,
    io: &mut DirectIo,
    ops: u64,
) -> Result<(ProgStats, u64, Duration)> {
    let _stats = BpfStatsGuard::enable()?;
    let agent = AgentProc::start(&tools.agent, args, None)?;
    let before = agent.bpf_prog_stats()?;
    let req_before = lo.requests()?;
    let wall = workload(io, ops)?;
    let progs = agent.bpf_prog_stats()?.since(before);
    let requests = lo.requests()?.saturating_sub(req_before);
    agent.stop()?;
    Ok((progs, requests, wall))
}

impl ConfigResult {
    pub fn median_pct(&self) -> f64 {
        median(
            &self
                .rounds
                .iter()
                .map(Round::overhead_pct)
                .collect::<Vec<_>>(),
        )
    }

    fn spread(&self) -> (f64, f64) {
        let v: Vec<f64> = self.rounds.iter().map(Round::overhead_pct).collect();
        (
            v.iter().copied().fold(f64::INFINITY, f64::min),
            v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        )
    }

    /// Share of the run's wall time spent in the agent's programs, percent.
    pub fn program_pct(&self) -> f64 {
        self.progs.run_time_ns as f64 / self.prog_run_wall.as_nanos().max(1) as f64 * 100.0
    }

    pub fn ns_per_run(&self) -> Option<f64> {
        (self.progs.run_cnt > 0).then(|| self.progs.run_time_ns as f64 / self.progs.run_cnt as f64)
    }
}

impl OverheadResult {
    pub fn markdown(&self, device: &Path) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "{} requests per run (O_DIRECT 4 KiB, writes and reads alternating, queue depth 1) on a loop device with direct I/O over a 256 MiB file in {}.\n\n",
            self.ops,
            device.display()
        ));
        out.push_str("| agent | rounds | median overhead | min | max | per-round overhead (%, order) |\n|---|---:|---:|---:|---:|---|\n");
        for c in &self.configs {
            let (lo, hi) = c.spread();
            let per: Vec<String> = c
                .rounds
                .iter()
                .map(|r| {
                    format!(
                        "{:+.2}{}",
                        r.overhead_pct(),
                        if r.agent_first { " BA" } else { " AB" }
                    )
                })
                .collect();
            out.push_str(&format!(
                "| `watch {}` | {} | {:+.2} % | {:+.2} % | {:+.2} % | {} |\n",
                c.args.join(" "),
                c.rounds.len(),
                c.median_pct(),
                lo,
                hi,
                per.join(", ")
            ));
        }
        out.push_str("\nIn-kernel cost, from one extra run per configuration with `kernel.bpf_stats_enabled=1`:\n\n");
        out.push_str("| agent | block requests | program runs | ns per run | program time / run time |\n|---|---:|---:|---:|---:|\n");
        for c in &self.configs {
            out.push_str(&format!(
                "| `watch {}` | {} | {} | {} | {:.3} % |\n",
                c.args.join(" "),
                c.requests,
                c.progs.run_cnt,
                c.ns_per_run()
                    .map_or("-".to_string(), |n| format!("{n:.0}")),
                c.program_pct()
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
                    "{}: median {:+.2} % (programs {:.3} % of run time{})",
                    c.name,
                    c.median_pct(),
                    c.program_pct(),
                    c.ns_per_run()
                        .map_or(String::new(), |n| format!(", {n:.0} ns/run"))
                )
            })
            .collect();
        format!("overhead: {}", parts.join("; "))
    }
}
