//! The scheduling priority of the event path.
//!
//! A health monitor is useful exactly when the node is in trouble, and a
//! node whose CPUs are saturated is one kind of trouble: with every core
//! busy, a normal-priority reader waits for a time slice behind the busy
//! tasks (milliseconds, docs/benchmarks.md, "Detection latency"). The agent's loop therefore
//! runs on its own thread, `health-events`, which waits for the sample ring
//! buffer and carries an error to its line (or, in cluster mode, to the
//! reporter's hand-off) at a raised priority when the kernel grants one:
//!
//! * `rt`: `SCHED_FIFO` at [`RT_PRIORITY`] (the low end of 1-99: kernel
//!   threads and other real-time work keep precedence). Needs `CAP_SYS_NICE`
//!   (or an `RLIMIT_RTPRIO`), and, where real-time group scheduling is on,
//!   an RT budget in the agent's cgroup.
//! * `nice`: `SCHED_OTHER` at nice [`NICE`]. Needs `CAP_SYS_NICE` (or an
//!   `RLIMIT_NICE`); shortens the wait but does not remove it.
//! * `normal`: as every other process.
//!
//! What is refused falls back (rt → nice → normal) with one warning that
//! names what is missing; it never fails the agent.
//!
//! The node must never be starved by its monitor, so everything periodic or
//! bulky the loop does (reconcile, topology rescans, volume check results,
//! totals, the reporter's own wake-ups) runs inside [`EventThread::bulk`],
//! which drops the thread to normal priority for that duration. What stays
//! prioritized per wake-up is bounded: one drain of the ring buffer (at most
//! its size in samples, `SAMPLES` in health-ebpf: 256 KiB / 112-byte records,
//! about 2300) and their lines, and a [`super::Companion`] task (cluster
//! mode's Event writer, bounded by its recorder: a few writes in flight, a
//! per-object cap). `SCHED_RESET_ON_FORK` keeps the priority to this thread:
//! threads it creates (tokio's blocking pool, where the volume probes run)
//! start at normal priority.

use std::cell::Cell;
use std::fmt;
use std::io;

/// The real-time priority of the event thread: low, so that kernel threads
/// and any real-time workload of the node keep precedence.
pub const RT_PRIORITY: i32 = 5;
/// The nice value of the event thread when real-time scheduling is refused
/// or not asked for.
pub const NICE: i32 = -10;
/// Bit of `CAP_SYS_NICE` in the capability sets (linux/capability.h).
const CAP_SYS_NICE: u32 = 23;

/// What the operator asks for (`--event-priority`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EventPriority {
    /// SCHED_FIFO (real-time, low priority), falling back to nice, then normal.
    #[default]
    Rt,
    /// A raised nice value, falling back to normal.
    Nice,
    /// No change.
    Normal,
}

/// What the event thread runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    Fifo(i32),
    Nice(i32),
    Normal,
}

impl fmt::Display for Applied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Applied::Fifo(p) => write!(f, "SCHED_FIFO priority {p}"),
            Applied::Nice(n) => write!(f, "SCHED_OTHER nice {n}"),
            Applied::Normal => write!(f, "SCHED_OTHER nice 0 (normal)"),
        }
    }
}

/// The outcome of [`EventThread::raise`]: what was applied and, when less
/// than asked, why (the one warning the agent prints).
#[derive(Debug)]
pub struct Outcome {
    pub applied: Applied,
    pub fallback: Option<String>,
}

/// The calling thread, raised as far as permitted; [`Self::bulk`] lowers it
/// for a stretch of bulk work.
pub struct EventThread {
    applied: Cell<Applied>,
    /// Inside a [`Bulk`] guard: a nested guard changes nothing.
    lowered: Cell<bool>,
}

impl EventThread {
    /// Raises the calling thread (only it) as far as `asked` and the kernel
    /// allow.
    pub fn raise(asked: EventPriority) -> (Self, Outcome) {
        let mut refused = Vec::new();
        if asked == EventPriority::Rt {
            match set_fifo(RT_PRIORITY) {
                Ok(()) => return done(Applied::Fifo(RT_PRIORITY), refused),
                Err(e) => refused.push(format!("SCHED_FIFO priority {RT_PRIORITY}: {e}")),
            }
        }
        if asked != EventPriority::Normal {
            match set_nice(NICE) {
                Ok(()) => return done(Applied::Nice(NICE), refused),
                Err(e) => refused.push(format!("nice {NICE}: {e}")),
            }
        }
        done(Applied::Normal, refused)
    }

    pub fn applied(&self) -> Applied {
        self.applied.get()
    }

    /// Runs at normal priority until the guard drops: periodic and bulk work
    /// must not take CPU from the node's workloads. Guards nest.
    pub fn bulk(&self) -> Bulk<'_> {
        let lowered = !self.lowered.get()
            && match self.applied.get() {
                Applied::Fifo(_) => set_other().is_ok(),
                Applied::Nice(_) => set_nice(0).is_ok(),
                Applied::Normal => false,
            };
        if lowered {
            self.lowered.set(true);
        }
        Bulk {
            thread: self,
            lowered,
        }
    }
}

fn done(applied: Applied, refused: Vec<String>) -> (EventThread, Outcome) {
    let fallback = (!refused.is_empty()).then(|| {
        format!(
            "the event path runs at {applied}, not the priority asked: {} refused ({})",
            refused.join("; "),
            missing()
        )
    });
    let thread = EventThread {
        applied: Cell::new(applied),
        lowered: Cell::new(false),
    };
    (thread, Outcome { applied, fallback })
}

/// What the kernel wants and this thread lacks, for the warning.
fn missing() -> String {
    match has_cap_sys_nice() {
        Ok(false) => "CAP_SYS_NICE is missing: add SYS_NICE to the container's capabilities".into(),
        Ok(true) => "CAP_SYS_NICE is present; the kernel refused anyway, e.g. real-time group scheduling gives this cgroup no RT budget (cpu.rt_runtime_us)".into(),
        Err(e) => format!("could not read this thread's capabilities: {e}"),
    }
}

/// Whether the calling thread's effective set holds `CAP_SYS_NICE`
/// (capabilities are per thread, hence thread-self).
pub fn has_cap_sys_nice() -> io::Result<bool> {
    let status = std::fs::read_to_string("/proc/thread-self/status")?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| io::Error::other("no CapEff line in /proc/thread-self/status"))?;
    let bits = u64::from_str_radix(hex.trim(), 16).map_err(io::Error::other)?;
    Ok(bits & (1 << CAP_SYS_NICE) != 0)
}

/// Normal priority for bulk work; the thread's priority comes back on drop.
pub struct Bulk<'a> {
    thread: &'a EventThread,
    lowered: bool,
}

impl Drop for Bulk<'_> {
    fn drop(&mut self) {
        if !self.lowered {
            return;
        }
        self.thread.lowered.set(false);
        let applied = self.thread.applied.get();
        let restored = match applied {
            Applied::Fifo(p) => set_fifo(p),
            Applied::Nice(n) => set_nice(n),
            Applied::Normal => Ok(()),
        };
        if let Err(e) = restored {
            // Only if the capability was dropped while running: say so once
            // and from now on report what the thread really has.
            tracing::warn!(
                "the event path could not get {applied} back after bulk work ({e}); it runs at normal priority from now on"
            );
            self.thread.applied.set(Applied::Normal);
        }
    }
}

// nix has no sched_setscheduler; these are the plain libc calls, each on
// the calling thread only (pid 0 / its tid).

fn set_fifo(priority: i32) -> io::Result<()> {
    set_scheduler(libc::SCHED_FIFO, priority)
}

fn set_other() -> io::Result<()> {
    set_scheduler(libc::SCHED_OTHER, 0)
}

fn set_scheduler(policy: i32, priority: i32) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: plain syscall on the calling thread with a valid parameter.
    let rc = unsafe { libc::sched_setscheduler(0, policy | libc::SCHED_RESET_ON_FORK, &param) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn set_nice(nice: i32) -> io::Result<()> {
    if nice < 0 {
        // Threads this one creates must not inherit the raised nice value.
        set_other()?;
    }
    // On Linux PRIO_PROCESS with a thread id sets that thread's nice value.
    let tid = nix::unistd::gettid().as_raw() as libc::id_t;
    // SAFETY: plain syscall on the calling thread.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
