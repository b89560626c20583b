//! Returned errors: what `watch --returned-errors` costs a read or write
//! that succeeds.
//!
//! Its fexit programs on vfs_read, vfs_write, vfs_readv, vfs_writev and
//! vfs_fsync run for every such call on the node and return at once
//! unless the call failed. A run times N 1-byte `pread`s, then N 1-byte
//! `pwrite`s, of a file on a tmpfs (no device below, so the call is as cheap
//! as a call gets and the trampoline as visible as it can be), each loop as
//! a whole. Runs without and with the agent alternate AB, BA as in
//! [`super::overhead`]; one more run with kernel.bpf_stats_enabled reads
//! each program's run count and run time.
//!
//! The measurement is real only if the agent counts: it must report no
//! error for the successful calls and exactly the ENOSPC writes made to a
//! full tmpfs. Kernels that refuse fexit (this project's development host)
//! fail here, loudly; by default the measurement runs in a QEMU guest of
//! Debian's 6.12 (`HEALTH_BENCH_KERNEL`: 5.10, 6.1, 6.12 or host).

use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_tests::fs::Mount;
use health_tests::sys::FileId;
use serde_json::Value;

use super::agent::{AgentProc, BpfStatsGuard, Line};
use super::stats::median;
use super::{interrupt, say_progress, Tools};

/// The programs, by their names in the object (the kernel keeps 15 bytes).
#[rustfmt::skip]
const PROGRAMS: [&str; 5] = [
    "vfs_read_exit", "vfs_write_exit", "vfs_readv_exit", "vfs_writev_exit", "vfs_fsync_exit",
];
/// Calls per loop: a fraction of a second on hardware, a few under TCG.
const CALLS: u64 = 200_000;
/// Failing writes for the check, each reported on its own.
const ENOSPC_WRITES: u64 = 3;

/// Where the measurement runs: `kernel` is a Debian series booted under
/// QEMU (`HEALTH_BENCH_KERNEL`, 6.12 by default) or `host`; `in_guest` when
/// this process is the guest side (`HEALTH_BENCH_IN_VM`, set by the host's).
pub struct Where {
    pub kernel: String,
    pub in_guest: bool,
}

impl Where {
    pub fn from_env() -> Result<Where> {
        let var = |name| std::env::var(name).ok();
        let (kernel, in_guest) = match var("HEALTH_BENCH_IN_VM") {
            Some(k) => (k, true),
            None => (var("HEALTH_BENCH_KERNEL").unwrap_or("6.12".into()), false),
        };
        if !["5.10", "6.1", "6.12", "host"].contains(&kernel.as_str()) {
            bail!("HEALTH_BENCH_KERNEL={kernel:?}: expected 5.10, 6.1, 6.12 or host");
        }
        Ok(Where { kernel, in_guest })
    }

    /// Runs here (on the host's kernel, or already inside the guest).
    pub fn here(&self) -> bool {
        self.in_guest || self.kernel == "host"
    }

    /// The section of docs/benchmarks.md: the default kernel's is `returned`.
    pub fn id(&self) -> &'static str {
        match self.kernel.as_str() {
            "5.10" => "returned-5.10",
            "6.1" => "returned-6.1",
            "host" => "returned-host",
            _ => "returned",
        }
    }

    /// The command that reproduces the run, as given on the host.
    pub fn command(&self, rounds: u32) -> String {
        let env = match self.kernel.as_str() {
            "6.12" => String::new(),
            k => format!("HEALTH_BENCH_KERNEL={k} "),
        };
        format!("{env}cargo xtask bench --only returned --rounds {rounds}")
    }
}

/// Boots the guest, runs this lab there with the tools built here, and
/// returns the section it printed (headed by the guest's machine line) and
/// its headline. The guest sees the root filesystem read-only, so the host
/// writes the file.
pub fn in_guest(tools: &Tools, at: &Where, rounds: u32) -> Result<(String, String)> {
    let lab = std::env::current_exe().context("finding this lab's binary")?;
    let k = &at.kernel;
    let vm = [
        "xtask",
        "vm",
        "--kernel",
        k,
        "--timeout",
        "40m",
        "--",
        "env",
    ];
    let out = xtask::util::cargo()
        .current_dir(xtask::util::workspace_root())
        .args(vm)
        .arg(format!("HEALTH_BENCH_IN_VM={k}"))
        .arg(format!("HEALTH_AGENT_BIN={}", tools.agent.display()))
        .arg(format!("FAULTDISK_BIN={}", tools.faultdisk.display()))
        .arg(&lab)
        .args(["bench", "--only", "returned", "--no-write", "--rounds"])
        .arg(rounds.to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo xtask vm")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "the measurement in the {k} guest failed ({}); its stdout:\n{stdout}",
            out.status
        );
    }
    from_guest_output(&stdout)
}

/// The section and the headline in what the guest's `bench --no-write`
/// printed: the section from its machine line on, then the headline.
fn from_guest_output(stdout: &str) -> Result<(String, String)> {
    let start = stdout
        .find("_Measured ")
        .context("no result section in the guest's output")?;
    let end = stdout
        .rfind("\nreturned: ")
        .context("no headline in the guest's output")?;
    if end < start {
        bail!("the guest's output is not a section and a headline:\n{stdout}");
    }
    let headline = stdout[end + 1..].lines().next().unwrap_or_default();
    Ok((
        stdout[start..end].trim_end().to_string(),
        headline.to_string(),
    ))
}

/// ns per call of one loop of each, [pread, pwrite].
type Run = [f64; 2];
const CALL_NAMES: [&str; 2] = ["pread", "pwrite"];

pub struct Round {
    pub agent_first: bool,
    pub base: Run,
    pub agent: Run,
}

pub struct ReturnedResult {
    pub rounds: Vec<Round>,
    /// (program, runs, run time ns) during the stats run.
    pub programs: Vec<(&'static str, u64, u64)>,
    /// The agent's own line about the source (`active   fexit:...`).
    pub source_line: String,
    pub enospc_reported: u64,
}

/// A loop of CALLS 1-byte pread (or pwrite) at offset 0, ns per call.
fn time_calls(f: &File, write: bool) -> Result<f64> {
    let mut byte = [0x5au8; 1];
    let (fd, buf) = (f.as_raw_fd(), byte.as_mut_ptr().cast());
    let start = Instant::now();
    for _ in 0..CALLS {
        // SAFETY: a 1-byte buffer of ours on a descriptor we hold open.
        let n = unsafe {
            match write {
                true => libc::pwrite(fd, buf, 1, 0),
                false => libc::pread(fd, buf, 1, 0),
            }
        };
        if n != 1 {
            let e = std::io::Error::last_os_error();
            bail!(
                "a 1-byte {} returned {n}: {e}",
                CALL_NAMES[usize::from(write)]
            );
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / CALLS as f64)
}

fn workload(f: &File) -> Result<Run> {
    interrupt::check()?;
    Ok([time_calls(f, false)?, time_calls(f, true)?])
}

/// Starts the agent; fails unless its returned-error programs attached.
fn start_agent(tools: &Tools) -> Result<(AgentProc, String)> {
    let args = ["--json", "--returned-errors"].map(String::from);
    let agent = AgentProc::start(&tools.agent, &args, None)?;
    let stderr = agent.stderr_so_far();
    let from = |l: &str, word| l[l.find(word).unwrap_or(0)..].trim().to_string();
    if let Some(l) = stderr
        .lines()
        .find(|l| l.contains("missing  returned_errors"))
    {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
        bail!(
            "the returned-error programs did not attach on Linux {} (nothing to \
             measure): {}\nkernels that refuse fexit cannot run this; the default \
             runs it in a 6.12 guest (HEALTH_BENCH_KERNEL unset)",
            kernel.trim(),
            from(l, "missing")
        );
    }
    let Some(line) = stderr.lines().find(|l| l.contains("active   fexit:")) else {
        bail!("the agent says nothing of its returned-error programs:\n{stderr}");
    };
    let line = from(line, "active");
    Ok((agent, line))
}

/// Sum of `count` over the agent's `returned_error` lines about `dev`.
fn returned_errors(lines: &[Line], dev: &str, errno: Option<&str>) -> u64 {
    lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(&l.text).ok())
        .filter(|v| v["kind"] == "returned_error" && v["device"] == dev)
        .filter(|v| errno.is_none_or(|e| v["errno_name"] == e))
        .map(|v| v["count"].as_u64().unwrap_or(0))
        .sum()
}

/// Fails when the agent reported an error for the successful calls.
fn expect_none(lines: &[Line], dev: &str) -> Result<()> {
    match returned_errors(lines, dev, None) {
        0 => Ok(()),
        n => bail!("the agent reported {n} returned error(s) on {dev}, where every call succeeded"),
    }
}

fn maj_min(path: &Path) -> Result<String> {
    let id = FileId::of(path)?;
    Ok(format!("{}:{}", id.major, id.minor))
}

pub fn run(tools: &Tools, rounds: u32) -> Result<ReturnedResult> {
    let data = Mount::new("tmpfs", "tmpfs", "size=16m")?;
    let path = data.path().join("file");
    std::fs::write(&path, [0u8; 4096]).context("writing the tmpfs file")?;
    let dev = maj_min(&path)?;
    let f = File::options().read(true).write(true).open(&path)?;
    // A tmpfs filled before any agent runs: the ENOSPC of its filling is
    // not counted, and every write after it fails.
    let full = Mount::new("tmpfs", "tmpfs", "size=64k")?;
    let full_path = full.path().join("file");
    let mut full_file = File::create(&full_path)?;
    let page = [0u8; 4096];
    let filled = loop {
        match std::io::Write::write(&mut full_file, &page) {
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break full_file.metadata()?.len(),
            Err(e) => return Err(e).context("filling the 64 KiB tmpfs"),
        }
    };
    let full_dev = maj_min(&full_path)?;

    workload(&f)?; // warm-up: page cache, page tables
    let mut out = Vec::new();
    let mut source_line = String::new();
    let with_agent = |source_line: &mut String| -> Result<Run> {
        let (agent, line) = start_agent(tools)?;
        *source_line = line;
        let run = workload(&f)?;
        expect_none(&agent.stop_ok()?.lines, &dev)?;
        Ok(run)
    };
    for r in 0..rounds {
        let agent_first = r % 2 == 1;
        let (base, agent) = match agent_first {
            true => {
                let b = with_agent(&mut source_line)?;
                (workload(&f)?, b)
            }
            false => (workload(&f)?, with_agent(&mut source_line)?),
        };
        let (b, a) = (base, agent);
        say_progress(format!(
            "returned round {}/{rounds}: pread {:.0} -> {:.0} ns ({:+.0}), pwrite {:.0} -> {:.0} ns ({:+.0})",
            r + 1, b[0], a[0], a[0] - b[0], b[1], a[1], a[1] - b[1]
        ));
        out.push(Round {
            agent_first,
            base,
            agent,
        });
    }

    // The stats run, then the ENOSPC check with the same agent.
    let stats = BpfStatsGuard::enable()?;
    let (agent, line) = start_agent(tools)?;
    source_line = line;
    let before = prog_stats(agent.pid())?;
    workload(&f)?;
    let after = prog_stats(agent.pid())?;
    drop(stats);
    let mut programs = Vec::new();
    for name in PROGRAMS {
        // The kernel keeps BPF_OBJ_NAME_LEN - 1 bytes of a name.
        let get = |s: &[(String, u64, u64)]| {
            let short = &name[..name.len().min(15)];
            s.iter()
                .find(|p| p.0 == short)
                .map_or((0, 0), |p| (p.1, p.2))
        };
        let ((c0, t0), (c1, t1)) = (get(&before), get(&after));
        programs.push((name, c1.saturating_sub(c0), t1.saturating_sub(t0)));
    }
    if let Some(p) = programs[..2].iter().find(|p| p.1 < CALLS) {
        bail!(
            "{} ran {} times for {CALLS} calls: not for every call",
            p.0,
            p.1
        );
    }
    for _ in 0..ENOSPC_WRITES {
        let fd = full_file.as_raw_fd();
        // SAFETY: as in time_calls.
        let n = unsafe { libc::pwrite(fd, page.as_ptr().cast(), 1, filled as i64) };
        let e = std::io::Error::last_os_error();
        if n != -1 || e.raw_os_error() != Some(libc::ENOSPC) {
            bail!("a write to the full tmpfs returned {n} ({e}), not ENOSPC");
        }
    }
    agent.wait_until(Duration::from_secs(10), |l| {
        returned_errors(l, &full_dev, None) >= ENOSPC_WRITES
    })?;
    // A little longer: a report beyond the writes made would show here.
    interrupt::sleep(Duration::from_millis(500))?;
    let lines = agent.stop_ok()?.lines;
    expect_none(&lines, &dev)?;
    let enospc = returned_errors(&lines, &full_dev, Some("ENOSPC"));
    let all = returned_errors(&lines, &full_dev, None);
    if enospc != ENOSPC_WRITES || all != ENOSPC_WRITES {
        bail!(
            "{ENOSPC_WRITES} writes failed with ENOSPC on {full_dev}; the agent reported \
             {enospc} ENOSPC ({all} returned errors in all) there: a count that is not \
             exact measures nothing"
        );
    }
    Ok(ReturnedResult {
        rounds: out,
        programs,
        source_line,
        enospc_reported: enospc,
    })
}

/// (name, run_cnt, run_time_ns) of each program process `pid` holds: the
/// counts from /proc/PID/fdinfo, the name from the kernel (fdinfo has none).
fn prog_stats(pid: i32) -> Result<Vec<(String, u64, u64)>> {
    let dir = format!("/proc/{pid}/fdinfo");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let Ok(info) = std::fs::read_to_string(entry?.path()) else {
            continue;
        };
        let get = |key: &str| {
            let v = info
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'));
            v.and_then(|v| v.trim().parse::<u64>().ok())
        };
        // A program's descriptor has run counts; a link's has a prog_id too.
        let (Some(id), Some(runs), Some(ns)) = (get("prog_id"), get("run_cnt"), get("run_time_ns"))
        else {
            continue;
        };
        out.push((prog_name(u32::try_from(id)?)?, runs, ns));
    }
    Ok(out)
}

/// The name of BPF program `id`: BPF_PROG_GET_FD_BY_ID (13), then
/// BPF_OBJ_GET_INFO_BY_FD (15) for `struct bpf_prog_info` up to its `name`,
/// bytes 64..80 (include/uapi/linux/bpf.h).
fn prog_name(id: u32) -> Result<String> {
    let bpf = |cmd: libc::c_long, attr: *const u8| {
        // SAFETY: bpf(2) reads a 16-byte attr of ours; for 15 it writes at
        // most info_len bytes to the buffer the attr names, which has them.
        let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr, 16u32) };
        match rc {
            ..0 => {
                Err(std::io::Error::last_os_error()).context(format!("bpf({cmd}) of program {id}"))
            }
            rc => Ok(rc),
        }
    };
    let by_id: [u32; 4] = [id, 0, 0, 0];
    let fd = i32::try_from(bpf(13, by_id.as_ptr().cast())?)?;
    // SAFETY: the kernel just gave us this descriptor.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut info = [0u8; 80];
    let mut attr = [0u8; 16];
    attr[..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
    attr[8..].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    bpf(15, attr.as_ptr())?;
    let name = &info[64..80];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

impl ReturnedResult {
    /// Without, with and with - without, for call `i` of each round.
    fn column(&self, i: usize, pick: fn(&Round, usize) -> f64) -> Vec<f64> {
        self.rounds.iter().map(|r| pick(r, i)).collect()
    }

    /// Medians of without, with and the added ns, and the added's range.
    fn figures(&self, i: usize) -> [f64; 5] {
        let added = self.column(i, |r, i| r.agent[i] - r.base[i]);
        let lo = added.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = added.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        [
            median(&self.column(i, |r, i| r.base[i])),
            median(&self.column(i, |r, i| r.agent[i])),
            median(&added),
            lo,
            hi,
        ]
    }

    fn ns_per_run(&(_, runs, ns): &(&str, u64, u64)) -> String {
        match runs {
            0 => "-".into(),
            n => format!("{:.0}", ns as f64 / n as f64),
        }
    }

    pub fn markdown(&self) -> String {
        let mut out = format!(
            "Each run: {CALLS} 1-byte `pread`s, then {CALLS} 1-byte `pwrite`s, at offset 0 of \
             a 4 KiB file on a tmpfs, each loop timed as a whole. Agent: `watch --json \
             --returned-errors --no-pin`, its source line `{}`. Added per call = with agent - \
             without, per A/B round.\n\n| call | rounds | ns per call without → with (median) \
             | added per call: median (min … max) |\n|---|---:|---:|---:|\n",
            self.source_line
        );
        for (i, call) in CALL_NAMES.iter().enumerate() {
            let [base, with, added, lo, hi] = self.figures(i);
            out += &format!(
                "| `{call}`, 1 byte | {} | {base:.0} → {with:.0} | {added:+.0} ns ({lo:+.0} … {hi:+.0}) |\n",
                self.rounds.len()
            );
        }
        out += "\nPer round (pread without → with, pwrite without → with, ns per call; order):\n\n";
        for (n, r) in self.rounds.iter().enumerate() {
            let (b, a) = (r.base, r.agent);
            let order = if r.agent_first { "BA" } else { "AB" };
            out += &format!(
                "- {}: {:.0} → {:.0}, {:.0} → {:.0} {order}\n",
                n + 1,
                b[0],
                a[0],
                b[1],
                a[1]
            );
        }
        out += &format!(
            "\nIn-kernel cost, from one extra run (the same {CALLS} `pread`s and `pwrite`s, and \
             whatever else the machine did) with `kernel.bpf_stats_enabled=1`, including the \
             stats' own two clock reads per run:\n\n| program | runs | ns per run |\n|---|---:|---:|\n"
        );
        for p in &self.programs {
            out += &format!("| `{}` | {} | {} |\n", p.0, p.1, Self::ns_per_run(p));
        }
        out += &format!(
            "\nCheck: no returned error reported for the tmpfs of the successful calls in any \
             run; {ENOSPC_WRITES} 1-byte writes to a full 64 KiB tmpfs failed with ENOSPC and the \
             agent reported {} (`\"kind\":\"returned_error\"`, `\"errno_name\":\"ENOSPC\"`).\n",
            self.enospc_reported
        );
        out
    }

    pub fn headline(&self) -> String {
        let [rb, rw, rd, ..] = self.figures(0);
        let [wb, ww, wd, ..] = self.figures(1);
        let progs: Vec<String> = self.programs[..2]
            .iter()
            .map(|p| format!("{} {} ns/run", p.0, Self::ns_per_run(p)))
            .collect();
        format!(
            "returned: pread {rb:.0} -> {rw:.0} ns ({rd:+.0} ns/call), pwrite {wb:.0} -> {ww:.0} \
             ns ({wd:+.0} ns/call); {}; {}/{ENOSPC_WRITES} ENOSPC reported",
            progs.join(", "),
            self.enospc_reported
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guest_output_is_split_into_section_and_headline() {
        let out = "\n_Measured x._\n\nbody\n| a |\n\nreturned: pread 1 -> 2 ns\n";
        let (body, headline) = from_guest_output(out).unwrap();
        assert_eq!(body, "_Measured x._\n\nbody\n| a |");
        assert_eq!(headline, "returned: pread 1 -> 2 ns");
        assert!(from_guest_output("nothing").is_err());
    }
}
