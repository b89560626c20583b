//! Loading and attaching the kernel programs. Uses `kernel::tracefs` for the
//! tracepoints' formats; the agent loop attaches, and `kernel::collector`
//! reads the maps attaching leaves behind.
//!
//! Order of work: check privileges, BPF, BTF and tracefs (each failure has
//! its own error and exit code); read every tracepoint's format and check
//! the fields each program reads; load the object with those offsets; attach
//! what this kernel has and say what is missing and why.
//!
//! Here: what is asked for and what attaching leaves ([`Attached`],
//! [`KernelMaps`], one [`SourceStatus`] per program). `preflight` checks
//! privileges and BPF, `memlock` the memory limit older kernels charge BPF
//! to, `layout` the fields each program reads, `attach` does the work,
//! `errors` names what failed and its exit code.

mod attach;
mod blk_status;
// Public for the running-kernel test in tests/ (tests/kernel_btf.rs).
#[doc(hidden)]
pub mod btf;
mod errors;
pub(crate) mod layout;
mod loader;
mod memlock;
pub mod pins;
mod plan;
pub(crate) mod preflight;
pub mod release;
mod requests;
pub mod waiting;

use std::fmt;
use std::path::PathBuf;

pub use attach::attach;
use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf};
use aya::Ebpf;
pub use errors::{BpfRefusal, ProbeError};
use health_common::{
    CounterKey, ErrorTimes, LatencyCount, LatencyKey, PartTable, StackPair, DISK_NAME_LEN,
};
pub use layout::block_tracepoints;
pub use memlock::MemlockShortfall;
// For tests/tests/host/tracefs.rs: a live BPF map, whose id a pinned witness is named for.
#[doc(hidden)]
pub use preflight::tiny_array_map;

/// Samples per device per second per CPU when not told otherwise.
pub const DEFAULT_SAMPLES_PER_SEC: u32 = 100;

/// What the agent was asked to attach.
#[derive(Clone, Debug)]
pub struct ProbeOptions {
    /// The kernel object (`health-ebpf`), as the binary embedded it with
    /// [`crate::include_bytes_aligned`]; empty when the binary was built
    /// without it (attaching then fails with [`ProbeError::NoObject`]).
    pub object: &'static [u8],
    pub sys_root: PathBuf,
    pub proc_root: PathBuf,
    /// Also count failed flushes, which only `block_rq_complete` shows. It
    /// runs on every block completion, so it is off by default; see
    /// docs/benchmarks.md, "Healthy-path overhead" for its cost.
    pub flush_errors: bool,
    /// Samples per device per second per CPU; counting is never limited.
    pub samples_per_sec: u32,
    /// When to watch bios of device-mapper and md devices.
    pub bio_errors: BioErrors,
    /// Where programs, links and maps are pinned so that they outlive this
    /// process (see [`pins`]); `None` (`--no-pin`): they detach on exit.
    pub pin_root: Option<PathBuf>,
    /// How the block request programs attach.
    pub block_attach: BlockAttach,
    /// Count failed requests at `block_rq_complete`, which the kernel runs
    /// before it prints the failure to its console, instead of at
    /// `block_rq_error`, which it runs after (`tp_btf` kernels whose BTF
    /// names the request flag bits). The program then runs on every block
    /// completion, as with `flush_errors`.
    pub early_errors: bool,
    /// Follow every bio from submission to completion (`WAITING`), so that
    /// the agent sees how long the oldest one of each device has waited
    /// (`--follow-bios`, and `--latency-window`, which needs it). Costs two
    /// program runs per bio (docs/benchmarks.md, "Stalls").
    pub follow_bios: bool,
    /// With `follow_bios`: count each read's and write's latency, per
    /// device, as its bio completes (`LATENCY`, `--latency-window`).
    pub latency: bool,
    /// Count the errors file operations returned to applications (fexit
    /// on `vfs_read` and its kin; every such call runs a program).
    pub returned_errors: bool,
}

/// BTF raw tracepoints (`tp_btf`) run whatever else runs on the CPU, even a
/// map syscall of this agent; tracefs tracepoints are skipped, uncounted,
/// whenever any kprobe or tracepoint BPF program (ours or another tool's)
/// or a map syscall is already running on the CPU. See docs/benchmarks.md,
/// "Error flood".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BlockAttach {
    /// `tp_btf` where the kernel has it, tracefs tracepoints elsewhere.
    #[default]
    Auto,
    /// Always the tracefs tracepoints (to compare, or to rule tp_btf out).
    Tracefs,
}

/// `block_bio_complete` fires for every bio of every layer, so it costs on
/// the healthy path (as `--flush-errors` does; see docs/benchmarks.md). It is only
/// needed where bio-based dm/md devices exist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum BioErrors {
    /// Attached once the first bio-based dm or md device appears.
    #[default]
    Auto,
    /// Attached at start.
    Always,
    /// Never attached: errors raised inside dm/md go unseen.
    Never,
}

/// Whether one error source is attached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceStatus {
    pub program: &'static str,
    pub state: SourceState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceState {
    Active {
        tracepoint: String,
        note: Option<String>,
    },
    Missing {
        reason: String,
    },
    Disabled {
        reason: String,
    },
}

impl fmt::Display for SourceStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.state {
            SourceState::Active {
                tracepoint,
                note: None,
            } => write!(f, "active   {tracepoint}"),
            SourceState::Active {
                tracepoint,
                note: Some(n),
            } => write!(f, "active   {tracepoint} ({n})"),
            SourceState::Missing { reason } => write!(f, "missing  {}: {reason}", self.program),
            SourceState::Disabled { reason } => write!(f, "off      {}: {reason}", self.program),
        }
    }
}

/// The kernel maps userspace reads and keeps current.
pub struct KernelMaps {
    pub samples: RingBuf<MapData>,
    pub counts: PerCpuHashMap<MapData, CounterKey, u64>,
    pub times: PerCpuHashMap<MapData, CounterKey, ErrorTimes>,
    /// What the agent already reported, per key and CPU (written by
    /// userspace only; see `kernel::collector`).
    pub accounted: PerCpuHashMap<MapData, CounterKey, u64>,
    pub stats: PerCpuArray<MapData, u64>,
    pub partitions: BpfHashMap<MapData, u32, PartTable>,
    pub block_devs: BpfHashMap<MapData, u32, u8>,
    pub bio_devs: BpfHashMap<MapData, u32, u8>,
    pub stacked: BpfHashMap<MapData, StackPair, u8>,
    pub disk_names: BpfHashMap<MapData, u32, [u8; DISK_NAME_LEN]>,
    /// The bios waiting now (`crate::waiting`); `None` where the array
    /// could not be mapped (then `Attached::waiting` says why).
    pub waiting: Option<crate::waiting::WaitingSlots>,
    /// Reads' and writes' latencies per device (`latency`).
    pub latency: BpfHashMap<MapData, LatencyKey, LatencyCount>,
}

const BIO_PROGRAM: &str = "block_bio_complete";

/// Loaded and attached programs. Dropping `Attached` detaches them unless
/// they are pinned; the maps stay readable afterwards so the last counts
/// can be collected.
pub struct Attached {
    ebpf: Ebpf,
    /// The pinned state, when pinning (the default).
    pins: Option<pins::PinSet>,
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    pub sources: Vec<SourceStatus>,
    /// `block_bio_complete`, loaded and waiting for its first dm/md device.
    bio_deferred: Option<(&'static str, &'static str)>,
    /// Which `WAITING` programs run, or why none.
    pub waiting: Result<waiting::BioPrograms, String>,
}

impl Attached {
    /// Attaches the deferred `block_bio_complete` program (see
    /// [`BioErrors::Auto`]); the first call does the work, later ones
    /// nothing. The program stays attached from then on: devices come and
    /// go, and attaching costs a tracepoint enable each time.
    pub fn attach_bio_errors(&mut self) {
        let Some((group, name)) = self.bio_deferred.take() else {
            return;
        };
        let state = match attach::attach_loaded(
            &mut self.ebpf,
            self.pins.as_ref(),
            BIO_PROGRAM,
            group,
            name,
        ) {
            Ok(tracepoint) => {
                tracing::info!("active   {tracepoint} (a bio-based dm/md device appeared)");
                SourceState::Active {
                    tracepoint,
                    note: None,
                }
            }
            Err(reason) => {
                tracing::warn!("missing  {BIO_PROGRAM}: {reason}");
                SourceState::Missing { reason }
            }
        };
        if let Some(s) = self.sources.iter_mut().find(|s| s.program == BIO_PROGRAM) {
            s.state = state;
        }
    }

    /// Whether the programs stay attached after this process exits.
    pub fn pinned(&self) -> bool {
        self.pins.is_some()
    }

    /// See [`pins::stats_map_id`]; `None` when nothing is pinned.
    pub fn pinned_stats_id(&self) -> Option<Result<u32, aya::maps::MapError>> {
        Some(pins::stats_map_id(self.pins.as_ref()?.dir()))
    }

    /// The `STATS` map ids of the pinned layouts this process replaced.
    pub fn replaced_pins(&self) -> &[u32] {
        self.pins.as_ref().map_or(&[], pins::PinSet::replaced)
    }

    /// Whether this process adopted programs an earlier one left pinned.
    pub fn adopted(&self) -> bool {
        self.pins.as_ref().is_some_and(pins::PinSet::adopted)
    }

    /// Forwards kernel debug log records (aya-log) to the tracing output.
    pub fn flush_kernel_log(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    /// Runs of our programs the kernel skipped, summed over programs.
    ///
    /// Tracepoint programs run under one per-CPU guard: when an interrupt
    /// fails a request while any BPF tracing program (ours or another
    /// tool's) runs on that CPU, the kernel skips every program on the
    /// tracepoint and counts a `recursion_misses` for each. Every skip on an
    /// error tracepoint is an error no counter saw, so it is reported, never
    /// hidden. aya does not expose the field; the kernel shows it in the
    /// program fd's fdinfo (Linux 5.12+; `None` where it is absent).
    pub fn program_misses(&self) -> Option<u64> {
        use std::os::fd::{AsFd, AsRawFd};
        let mut total = None;
        // Programs adopted from pins run without being loaded here; one
        // loaded here and pinned shows up twice, hence the ids.
        let pinned = self
            .pins
            .as_ref()
            .map(pins::PinSet::program_fds)
            .unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        let loaded = self.ebpf.programs().filter_map(|(_, p)| p.fd().ok());
        for fd in loaded.chain(pinned.iter()) {
            let path = format!("/proc/self/fdinfo/{}", fd.as_fd().as_raw_fd());
            let Ok(text) = std::fs::read_to_string(&path) else {
                continue;
            };
            if !seen.insert(fdinfo_field(&text, "prog_id:")) {
                continue;
            }
            if let Some(n) = recursion_misses(&text) {
                total = Some(total.unwrap_or(0) + n);
            }
        }
        total
    }
}

/// The `recursion_misses:` value of a BPF program's fdinfo text.
fn recursion_misses(fdinfo: &str) -> Option<u64> {
    fdinfo_field(fdinfo, "recursion_misses:")
}

fn fdinfo_field(fdinfo: &str, name: &str) -> Option<u64> {
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
}

#[cfg(test)]
mod tests {

    #[test]
    fn recursion_misses_come_from_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t2061\nprog_type:\t5\nprog_jited:\t1\nprog_tag:\t3b185187f1855c4c\nmemlock:\t4096\nprog_id:\t1429\nrun_time_ns:\t0\nrun_cnt:\t0\nrecursion_misses:\t3\nverified_insns:\t212\n";
        assert_eq!(super::recursion_misses(text), Some(3));
        assert_eq!(super::recursion_misses("prog_id:\t7\nrun_cnt:\t0\n"), None);
    }
}
