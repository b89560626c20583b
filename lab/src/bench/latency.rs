//! Detection latency: how long after a request fails does the agent's line
//! reach a reader?
//!
//! The fault disk fails O_DIRECT 4 KiB writes, one at a time, each at its
//! own sector, and logs the CLOCK_MONOTONIC time it answered the kernel with
//! the error. The agent's JSON line carries the sector and the tracepoint's
//! CLOCK_MONOTONIC time; our reader stamps the time the line arrived. Same
//! clock everywhere, so per error:
//!
//! * injection -> line: the whole path a user waits for (kernel completion,
//!   the kernel's own error printk, the program, ring buffer, agent, pipe);
//! * tracepoint -> line: the agent's part (ring buffer wakeup, decoding,
//!   topology lookup, JSON, write, pipe to us);
//! * injection -> tracepoint: the kernel's part, for reference.
//!
//! With `load`, that many threads spin on the CPU for the whole measurement
//! (more than the cores: oversubscription). Our line reader then runs at
//! SCHED_FIFO so that it stamps lines when they arrive, not when it gets a
//! CPU: the figure stays the agent's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::{FaultDisk, Op, Rule};
use serde_json::Value;

use super::agent::AgentProc;
use super::dio::DirectIo;
use super::stats::Summary;
use super::{interrupt, Tools};

const MIB: u64 = 1 << 20;
/// Writes land in the first 32 MiB, one 4 KiB block each, so every failed
/// request has its own sector (up to 8192 errors).
const AREA: u64 = 32 * MIB;
const BLOCK: u64 = 4096;
/// Our stdout reader's real-time priority under load (above the agent's 5:
/// the instrument must not wait for what it measures).
const READER_PRIORITY: i32 = 10;

pub struct Config {
    pub errors: u32,
    /// Pause after each failed write returns. The agent samples at most 100
    /// errors per second per device per CPU by default; pacing below that
    /// keeps every error a sample with its own timestamps.
    pub gap: Duration,
    /// CPU-bound busy threads running through the measurement.
    pub load: u32,
    /// Passed on as the agent's `--event-priority` (its default when `None`).
    pub event_priority: Option<String>,
}

pub struct LatencyResult {
    pub errors: u64,
    pub load: u32,
    pub cores: usize,
    /// What the agent logged as its event path's priority.
    pub agent_priority: String,
    pub gap: Duration,
    pub elapsed: Duration,
    /// Errors reported in sampled lines matched to an injection.
    pub matched: usize,
    /// Errors reported only in summary lines (rate-limited, no timestamps).
    pub summarized: u64,
    /// Sum of `count` over the agent's lines for the device.
    pub reported: u64,
    /// All in microseconds.
    pub inject_to_line: Summary,
    pub tracepoint_to_line: Summary,
    pub inject_to_tracepoint: Summary,
    /// How many of each interval took over 1 ms (same order as above).
    pub over_1ms: [usize; 3],
}

pub fn run(tools: &Tools, cfg: &Config) -> Result<LatencyResult> {
    if u64::from(cfg.errors) * BLOCK > AREA {
        bail!(
            "at most {} errors (one per 4 KiB block of {AREA} bytes)",
            AREA / BLOCK
        );
    }
    let disk = interrupt::spawn_shielded(|| FaultDisk::start_with(&tools.faultdisk, 64 * MIB))?;
    let lo = disk.attach_loop(false)?;
    let mut args: Vec<String> = ["--json", "--device", lo.maj_min()]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if let Some(p) = &cfg.event_priority {
        args.extend(["--event-priority".to_string(), p.clone()]);
    }
    let agent = if cfg.load > 0 {
        AgentProc::start_timed(&tools.agent, &args, READER_PRIORITY)?
    } else {
        AgentProc::start(&tools.agent, &args, None)?
    };
    let agent_priority = logged_priority(&agent.stderr_so_far())?;
    disk.add_rule(Rule::new(Op::Write, libc::EIO).range(0, AREA))?;
    let io = DirectIo::open(lo.path(), BLOCK as usize)?;

    let load = Load::start(cfg.load)?;
    let start = Instant::now();
    for i in 0..u64::from(cfg.errors) {
        interrupt::check()?;
        match io.write_at(i * BLOCK) {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {}
            other => bail!("write {i} at {}: expected EIO, got {other:?}", i * BLOCK),
        }
        std::thread::sleep(cfg.gap);
    }
    let elapsed = start.elapsed();
    load.stop()?;
    disk.clear_rules()?;
    let injected = disk.stats()?.injected(Op::Write, libc::EIO);
    if injected != u64::from(cfg.errors) {
        bail!(
            "the fault disk failed {injected} writes for {} issued",
            cfg.errors
        );
    }
    let dev = lo.maj_min().to_string();
    let reported_of = |lines: &[super::agent::Line]| -> u64 {
        lines
            .iter()
            .filter_map(|l| serde_json::from_str::<Value>(&l.text).ok())
            .filter(|v| v["device"] == dev.as_str())
            .map(|v| v["count"].as_u64().unwrap_or(0))
            .sum()
    };
    // Summaries of rate-limited errors come with the next reconcile tick.
    agent.wait_until(Duration::from_secs(10), |lines| {
        reported_of(lines) >= injected
    })?;
    let injections = disk.injections()?;
    let stopped = agent.stop_ok()?;

    let by_offset: HashMap<u64, u64> = injections.iter().map(|i| (i.offset, i.mono_ns)).collect();
    let (mut inject_to_line, mut tracepoint_to_line, mut inject_to_tracepoint) =
        (Vec::new(), Vec::new(), Vec::new());
    let (mut summarized, mut reported, mut matched) = (0u64, 0u64, 0usize);
    let us = |a: u64, b: u64| (a as f64 - b as f64) / 1000.0;
    for line in &stopped.lines {
        let v: Value = serde_json::from_str(&line.text)
            .with_context(|| format!("agent printed a non-JSON line: {:?}", line.text))?;
        if v["device"] != dev.as_str() {
            continue;
        }
        let count = v["count"].as_u64().unwrap_or(0);
        reported += count;
        let (Some(tp_ns), Some(sector)) = (v["mono_ns"].as_u64(), v["sector"].as_u64()) else {
            summarized += count;
            continue;
        };
        let Some(&inj_ns) = by_offset.get(&(sector * 512)) else {
            bail!(
                "the agent reported sector {sector}, where nothing was injected: {}",
                line.text
            );
        };
        matched += 1;
        inject_to_line.push(us(line.recv_ns, inj_ns));
        tracepoint_to_line.push(us(line.recv_ns, tp_ns));
        inject_to_tracepoint.push(us(tp_ns, inj_ns));
    }
    if reported != injected {
        bail!("the agent reported {reported} errors for {injected} injected");
    }
    let over = |v: &[f64]| v.iter().filter(|&&us| us > 1000.0).count();
    let over_1ms = [
        over(&inject_to_line),
        over(&tracepoint_to_line),
        over(&inject_to_tracepoint),
    ];
    let summary = |v: &[f64], what: &str| {
        Summary::of(v).with_context(|| format!("no sampled lines to measure {what}"))
    };
    Ok(LatencyResult {
        errors: injected,
        load: cfg.load,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        agent_priority,
        gap: cfg.gap,
        elapsed,
        matched,
        summarized,
        reported,
        inject_to_line: summary(&inject_to_line, "injection -> line")?,
        tracepoint_to_line: summary(&tracepoint_to_line, "tracepoint -> line")?,
        inject_to_tracepoint: summary(&inject_to_tracepoint, "injection -> tracepoint")?,
        over_1ms,
    })
}

/// The priority in the agent's "event path priority" log line, e.g.
/// `SCHED_FIFO priority 5`.
fn logged_priority(stderr: &str) -> Result<String> {
    let line = stderr
        .lines()
        .find(|l| l.contains("event path priority"))
        .with_context(|| {
            format!("the agent logged no event path priority; its stderr:\n{stderr}")
        })?;
    let (_, rest) = line
        .split_once("priority=")
        .with_context(|| format!("no priority= in {line:?}"))?;
    // tracing prints a Display field with spaces as is, up to the message.
    let value = rest.split(" event path priority").next().unwrap_or(rest);
    Ok(value.trim().to_string())
}

/// Threads spinning on the CPU until stopped (a CPU-bound workload).
pub(super) struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<u64>>,
}

impl Load {
    pub(super) fn start(n: u32) -> Result<Load> {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|i| {
                let stop = Arc::clone(&stop);
                std::thread::Builder::new()
                    .name(format!("load-{i}"))
                    .spawn(move || {
                        let mut spins = 0u64;
                        while !stop.load(Ordering::Relaxed) {
                            spins = std::hint::black_box(spins.wrapping_add(1));
                        }
                        spins
                    })
                    .context("starting a load thread")
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Load { stop, threads })
    }

    pub(super) fn stop(mut self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            t.join()
                .map_err(|_| anyhow::anyhow!("a load thread panicked"))?;
        }
        Ok(())
    }
}

impl Drop for Load {
    /// On an early return (an error, Ctrl-C) the spinning must end too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

impl LatencyResult {
    pub fn markdown(&self) -> String {
        let row = |name: &str, s: &Summary, over_1ms: usize| {
            format!(
                "| {name} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {over_1ms} |\n",
                s.n, s.min, s.p50, s.p90, s.p99, s.max
            )
        };
        let mut out = String::new();
        out.push_str(&format!(
            "{} O_DIRECT 4 KiB writes failed with EIO, one at a time with a {} ms pause after each ({:.1} s, {:.0} errors/s); \
             {} errors arrived as sampled lines matched by sector to their injection, {} only in summary lines; \
             the agent's counts add up to {} of {} injected. \
             Load: {}; the agent's event path ran at {}.\n\n",
            self.errors,
            self.gap.as_millis(),
            self.elapsed.as_secs_f64(),
            self.errors as f64 / self.elapsed.as_secs_f64(),
            self.matched,
            self.summarized,
            self.reported,
            self.errors,
            self.load_text(),
            self.agent_priority,
        ));
        out.push_str("| interval (µs) | n | min | p50 | p90 | p99 | max | over 1 ms |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
        out.push_str(&row(
            "tracepoint → line received (agent's part)",
            &self.tracepoint_to_line,
            self.over_1ms[1],
        ));
        out.push_str(&row(
            "fault disk fails request → line received",
            &self.inject_to_line,
            self.over_1ms[0],
        ));
        out.push_str(&row(
            "fault disk fails request → tracepoint (kernel's part)",
            &self.inject_to_tracepoint,
            self.over_1ms[2],
        ));
        out
    }

    fn load_text(&self) -> String {
        match self.load {
            0 => "none (idle but for other tenants)".into(),
            n => format!(
                "{n} CPU-bound busy threads on {} cores for the whole measurement (our line reader at SCHED_FIFO {READER_PRIORITY})",
                self.cores
            ),
        }
    }

    pub fn headline(&self) -> String {
        format!(
            "latency (load {}, agent at {}): tracepoint->line p50 {:.0} µs, p99 {:.0} µs, max {:.0} µs; injection->line p50 {:.0} µs, p99 {:.0} µs ({} matched)",
            self.load,
            self.agent_priority,
            self.tracepoint_to_line.p50,
            self.tracepoint_to_line.p99,
            self.tracepoint_to_line.max,
            self.inject_to_line.p50,
            self.inject_to_line.p99,
            self.matched,
        )
    }
}
