//! An error flood: a disk failing every write as fast as writers can issue
//! them. Are the agent's totals still exact, and what does it cost?
//!
//! The kernel counts every error and samples at most 100 per second per
//! device per CPU (the default), so the agent's work should stay bounded
//! however fast errors come; this checks the claim with real errors.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::program_runs::{witness_figures, TracerCount};
use health_tests::{FaultDisk, Op, Rule};
use serde_json::Value;

use super::agent::{AgentProc, Line};
use super::dio::DirectIo;
use super::{interrupt, Tools};

const MIB: u64 = 1 << 20;
const AREA: u64 = 32 * MIB;
const BLOCK: u64 = 4096;

pub struct Config {
    pub threads: u32,
    pub duration: Duration,
    /// Run a second BPF tracing tool on the same tracepoints during the
    /// flood: another agent with classic tracefs programs, which hold the
    /// CPU's `bpf_prog_active` while they run and make map syscalls, the two
    /// things that make the kernel skip tracefs programs. The agent under
    /// test (`tp_btf` where the kernel has it) must skip no run beside it.
    pub beside_tracer: bool,
    /// The agent counts failed requests at `block_rq_complete`
    /// (`--early-block-errors`).
    pub early_block_errors: bool,
}

/// What the second tool beside the agent saw.
pub struct Beside {
    /// Sum of `count` over its lines for the device.
    pub reported: u64,
    /// Its program runs the kernel counted as skipped (tracefs programs are
    /// skipped without being counted: see `reported`).
    pub recursion_misses: u64,
}

pub struct FloodResult {
    pub threads: u32,
    pub elapsed: Duration,
    pub injected: u64,
    /// Writes that returned EIO to the writers.
    pub eio_returned: u64,
    /// Sum of `count` over the agent's lines for the device.
    pub reported: u64,
    /// The total in the agent's final summary on stderr.
    pub final_total: Option<u64>,
    pub lines: usize,
    pub sampled_lines: usize,
    pub cpu_pct: f64,
    /// Peak RSS right after the agent attached, before any error.
    pub hwm_ready_kb: u64,
    pub vm_hwm_kb: u64,
    pub vm_rss_kb: u64,
    pub rss_anon_kb: u64,
    /// Program runs the kernel skipped because a BPF program was already
    /// running on the CPU: errors the agent cannot have seen.
    pub recursion_misses: u64,
    /// The agent's "kernel side: ..." line.
    pub kernel_side: Option<String>,
    /// From it: the failed requests the kernel's tracer saw, and how many
    /// of them no program counted (`None` without a tracer witness).
    pub witness: Option<TracerCount>,
    /// The agent's lines about its witness (why there is none).
    pub witness_notes: Vec<String>,
    pub beside: Option<Beside>,
}

fn reported(lines: &[Line], dev: &str) -> u64 {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(&l.text).ok())
        .filter(|v| v["device"] == dev)
        .map(|v| v["count"].as_u64().unwrap_or(0))
        .sum()
}

/// The number after `block_io_error write EIO (block_rq_error)` on the
/// device's line of the final totals the agent prints on stderr.
fn final_total(stderr: &str, dev: &str) -> Option<u64> {
    let line = stderr
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{dev} ")))?;
    line.split(", ")
        .find(|item| item.contains("block_io_error write EIO"))?
        .rsplit(' ')
        .next()?
        .parse()
        .ok()
}

pub fn run(tools: &Tools, cfg: &Config) -> Result<FloodResult> {
    let disk = interrupt::spawn_shielded(|| FaultDisk::start_with(&tools.faultdisk, 64 * MIB))?;
    let lo = disk.attach_loop(false)?;
    let dev = lo.maj_min().to_string();
    let mut args: Vec<String> = ["--json", "--device", &dev]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if cfg.early_block_errors {
        args.push("--early-block-errors".into());
    }
    let agent = AgentProc::start(&tools.agent, &args, None)?;
    agent.expect_early_counting(cfg.early_block_errors)?;
    let hwm_ready_kb = agent.status_kb("VmHWM")?;
    let beside = if cfg.beside_tracer {
        let mut tracefs = args.clone();
        tracefs.extend(["--block-attach".to_string(), "tracefs".to_string()]);
        Some(AgentProc::start(&tools.agent, &tracefs, None)?)
    } else {
        None
    };
    disk.add_rule(Rule::new(Op::Write, libc::EIO).range(0, AREA))?;

    let stop = AtomicBool::new(false);
    let unexpected = AtomicU64::new(0);
    let eio_returned = AtomicU64::new(0);
    let ticks_before = agent.cpu_ticks()?;
    let start = Instant::now();
    // Opened up front: once writers run, nothing may return early without
    // telling them to stop (the scope would wait for them forever).
    let ios = (0..cfg.threads)
        .map(|_| DirectIo::open(lo.path(), BLOCK as usize))
        .collect::<Result<Vec<_>>>()?;
    std::thread::scope(|s| -> Result<()> {
        for (t, io) in (0u64..).zip(ios) {
            let (stop, unexpected, eio_returned) = (&stop, &unexpected, &eio_returned);
            s.spawn(move || {
                let (mut i, mut eio, mut other) = (t, 0, 0);
                while !stop.load(Ordering::Relaxed) {
                    let at = (i * BLOCK) % AREA;
                    if io.write_at(at).map_err(|e| e.raw_os_error()) == Err(Some(libc::EIO)) {
                        eio += 1;
                    } else {
                        other += 1;
                    }
                    i += u64::from(cfg.threads);
                }
                eio_returned.fetch_add(eio, Ordering::Relaxed);
                unexpected.fetch_add(other, Ordering::Relaxed);
            });
        }
        let r = interrupt::sleep(cfg.duration);
        stop.store(true, Ordering::Relaxed);
        r
    })?;
    let elapsed = start.elapsed();
    let ticks = agent.cpu_ticks()?.saturating_sub(ticks_before);
    disk.clear_rules()?;
    let unexpected = unexpected.load(Ordering::Relaxed);
    if unexpected > 0 {
        bail!("{unexpected} writes in the flood did not fail with EIO");
    }
    let injected = disk.stats()?.injected(Op::Write, libc::EIO);
    let eio_returned = eio_returned.load(Ordering::Relaxed);
    // Summaries for the rate-limited errors follow within two reconcile ticks.
    agent.wait_until(Duration::from_secs(15), |lines| {
        reported(lines, &dev) >= injected
    })?;
    let recursion_misses = agent.bpf_prog_stats()?.recursion_misses;
    let beside = match beside {
        Some(tool) => {
            // A tracefs program skips silently, so its lines may never add
            // up: waited for with the same bound, then taken as they are.
            tool.wait_until(Duration::from_secs(15), |lines| {
                reported(lines, &dev) >= injected
            })?;
            let recursion_misses = tool.bpf_prog_stats()?.recursion_misses;
            let stopped = tool.stop_ok()?;
            Some(Beside {
                reported: reported(&stopped.lines, &dev),
                recursion_misses,
            })
        }
        None => None,
    };
    let vm_hwm_kb = agent.status_kb("VmHWM")?;
    let vm_rss_kb = agent.status_kb("VmRSS")?;
    let rss_anon_kb = agent.status_kb("RssAnon")?;
    let stopped = agent.stop_ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz)
        .ok()
        .filter(|&h| h > 0)
        .context("sysconf(_SC_CLK_TCK)")?;
    let kernel_side = stopped
        .stderr
        .lines()
        .find(|l| l.starts_with("kernel side:"))
        .map(str::to_string);
    let sampled_lines = stopped
        .lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(&l.text).ok())
        .filter(|v| v["device"] == dev.as_str() && v["sampled"] == true)
        .count();
    Ok(FloodResult {
        threads: cfg.threads,
        elapsed,
        injected,
        eio_returned,
        reported: reported(&stopped.lines, &dev),
        final_total: final_total(&stopped.stderr, &dev),
        lines: stopped.lines.len(),
        sampled_lines,
        cpu_pct: ticks as f64 / hz as f64 / elapsed.as_secs_f64() * 100.0,
        recursion_misses,
        hwm_ready_kb,
        vm_hwm_kb,
        vm_rss_kb,
        rss_anon_kb,
        witness: witness_figures(&stopped.stderr),
        witness_notes: stopped
            .stderr
            .lines()
            .filter(|l| l.contains("tracer witness") && !l.starts_with("kernel side:"))
            .map(str::to_string)
            .collect(),
        kernel_side,
        beside,
    })
}

impl FloodResult {
    pub fn exact(&self) -> bool {
        self.reported == self.injected && self.final_total == Some(self.injected)
    }

    /// Not exact, but every error is either counted or reported by the
    /// agent as traced by the kernel without a program run: the tracer saw
    /// exactly the injected errors, and the lines, the final total and the
    /// uncounted figure add up to them.
    pub fn accounted(&self) -> bool {
        let Some(w) = self.witness else {
            return false;
        };
        w.traced == self.injected
            && self.reported + w.uncounted == self.injected
            && self.final_total.map(|t| t + w.uncounted) == Some(self.injected)
    }

    pub fn verdict(&self) -> String {
        match (self.exact(), self.accounted(), self.witness) {
            (true, _, _) => "exact".to_string(),
            (false, true, Some(w)) => format!(
                "{} short, all {} reported by the agent as traced by the kernel with no program run",
                w.uncounted, w.uncounted
            ),
            _ => "NOT EXACT".to_string(),
        }
    }

    pub fn markdown(&self) -> String {
        let verdict = self.verdict();
        let mut out = format!(
            "{} threads of O_DIRECT 4 KiB writes, every one failing with EIO, for {:.1} s.\n\n",
            self.threads,
            self.elapsed.as_secs_f64()
        );
        out.push_str("| measure | value |\n|---|---:|\n");
        out.push_str(&format!(
            "| errors injected | {} ({:.0} /s) |\n",
            self.injected,
            self.injected as f64 / self.elapsed.as_secs_f64()
        ));
        out.push_str(&format!(
            "| writes that returned EIO to the writers | {} |\n",
            self.eio_returned
        ));
        out.push_str(&format!(
            "| sum of `count` over the agent's lines | {} ({verdict}) |\n",
            self.reported
        ));
        out.push_str(&format!(
            "| program runs the kernel skipped (fdinfo `recursion_misses`) | {} |\n",
            self.recursion_misses
        ));
        match self.witness {
            Some(w) => out.push_str(&format!(
                "| failed requests the kernel's tracer saw (the agent's witness) | {} |\n\
                 | of them counted by no program: the kernel ran none (the agent's report) | {} |\n",
                w.traced, w.uncounted
            )),
            None => out.push_str(&format!(
                "| tracer witness | none: {} |\n",
                self.witness_notes.join(" / ")
            )),
        }
        out.push_str(&format!(
            "| agent's final total (stderr) | {} |\n",
            self.final_total
                .map_or("not found".to_string(), |t| t.to_string())
        ));
        out.push_str(&format!(
            "| lines printed (sampled / summaries) | {} ({} / {}) |\n",
            self.lines,
            self.sampled_lines,
            self.lines - self.sampled_lines
        ));
        out.push_str(&format!(
            "| agent CPU during the flood (utime+stime, one core = 100 %) | {:.1} % |\n",
            self.cpu_pct
        ));
        let mb = |kb: u64| kb as f64 / 1024.0;
        out.push_str(&format!(
            "| agent peak RSS (VmHWM) once attached, before any error | {:.1} MB |\n",
            mb(self.hwm_ready_kb)
        ));
        out.push_str(&format!(
            "| agent peak RSS (VmHWM) after the flood | {:.1} MB |\n",
            mb(self.vm_hwm_kb)
        ));
        out.push_str(&format!(
            "| agent RSS after the flood (VmRSS; of it anonymous, RssAnon) | {:.1} MB ({:.1} MB) |\n",
            mb(self.vm_rss_kb),
            mb(self.rss_anon_kb)
        ));
        if let Some(b) = &self.beside {
            out.push_str(&format!(
                "| beside it, a second agent with tracefs programs on the same tracepoints: sum of its lines | {} (short by {}) |\n",
                b.reported,
                self.injected.saturating_sub(b.reported)
            ));
            out.push_str(&format!(
                "| the second agent's program runs the kernel counted as skipped | {} |\n",
                b.recursion_misses
            ));
        }
        if let Some(k) = &self.kernel_side {
            out.push_str(&format!("\nThe agent's own account: `{k}`\n"));
        }
        out
    }

    pub fn headline(&self) -> String {
        let beside = self.beside.as_ref().map_or(String::new(), |b| {
            format!(
                "; beside it a tracefs BPF tool reported {} ({} short)",
                b.reported,
                self.injected.saturating_sub(b.reported)
            )
        });
        format!(
            "flood: {} errors in {:.1} s ({} EIO returned), agent reported {} ({}; {} program runs skipped by the kernel; {}), CPU {:.1} %, peak RSS {:.1} MB (at start {:.1} MB), RSS {:.1} MB{beside}",
            self.injected,
            self.elapsed.as_secs_f64(),
            self.eio_returned,
            self.reported,
            self.verdict(),
            self.recursion_misses,
            self.witness.map_or("no tracer witness".to_string(), |w| format!(
                "the kernel traced {} failed requests, the agent reported {} of them as run through no program",
                w.traced, w.uncounted
            )),
            self.cpu_pct,
            self.vm_hwm_kb as f64 / 1024.0,
            self.hwm_ready_kb as f64 / 1024.0,
            self.vm_rss_kb as f64 / 1024.0
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn final_totals_line() {
        let stderr = "totals:\n  7:3 loop3: block_io_error write EIO (block_rq_error) 51234\n  7:4 loop4: block_io_error read EIO (block_rq_error) 2, block_io_error write EIO (block_rq_error) 9\nkernel side: 1 samples rate-limited\n";
        assert_eq!(final_total(stderr, "7:3"), Some(51234));
        assert_eq!(final_total(stderr, "7:4"), Some(9));
        assert_eq!(final_total(stderr, "7:5"), None);
    }
}
