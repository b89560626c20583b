//! A second count of failed block requests, kept by the kernel's tracer.
//!
//! The programs count every failed request the kernel runs them for. A
//! kernel may call a tracepoint's ftrace probe and not its BPF programs:
//! this project's VM kind runs no BPF program and no perf event while one
//! of its PID 1's threads is current, and a block completion in a softirq
//! that happens to interrupt such a thread is lost to every BPF tool, with
//! no miss counted anywhere (docs/benchmarks.md, "Error flood"). The agent cannot count
//! those errors, but it must not hide them.
//!
//! So, where the kernel has `block:block_rq_error`, the agent keeps a
//! tracefs instance of its own (`instances/volume-health-<pid>`) with only
//! that event enabled, in a ring buffer of one page per CPU. Nothing ever
//! reads the events; the ring buffer's per-CPU statistics count every one
//! written (`entries` still there, plus `overrun`, `commit overrun` and
//! `dropped events`), so their sum is how many failed requests the kernel
//! traced since the instance was made. The cost is the tracer's write of
//! one record per failed request; healthy requests never reach the event.
//!
//! [`Uncounted`] turns that and the programs' own count into the number of
//! traced failures no program counted, never over-estimated (see there).
//!
//! How long an instance lives follows the counters it is compared with
//! ([`Lifetime`]). With pinned state the programs count while no agent
//! runs, so the instance does too: `instances/volume-health-pins-<id>`,
//! named for the kernel id of the pinned `STATS` map, is kept on exit and
//! adopted by the next process, and its baseline (the programs' count when
//! it was made) is kept in that map. It goes with the pins: `uninstall`
//! removes it, and one whose map is gone (pins replaced) is removed at the
//! next start. With `--no-pin` it is the process's, `volume-health-<pid>`,
//! removed on drop, and one left by a process that is gone (SIGKILL) is
//! removed at start.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// The event the witness counts.
const EVENT: &str = "events/block/block_rq_error/enable";
/// Instances are named `<PREFIX><pid>` or `<PREFIX><PINS><map id>`.
const PREFIX: &str = "volume-health-";
const PINS: &str = "pins-";
/// The ring buffer size asked for, per CPU; the kernel rounds it up to a
/// page. The events are only counted, never read.
const BUFFER_KB: &str = "4";

#[derive(Debug, thiserror::Error)]
pub enum TracerCountError {
    #[error("this kernel has no block:block_rq_error tracepoint")]
    NoEvent,
    #[error("{}: {error}", .path.display())]
    Io { path: PathBuf, error: io::Error },
    #[error("{}: no `{field}` figure", .path.display())]
    Stats { path: PathBuf, field: &'static str },
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> TracerCountError + '_ {
    move |error| TracerCountError::Io {
        path: path.to_path_buf(),
        error,
    }
}

/// Whose the instance is, and so how long it lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lifetime {
    /// This process's (`--no-pin`): removed on drop.
    Process,
    /// The pinned state's, whose `STATS` map has kernel id `map_id`: kept
    /// on exit. `base`: the programs' count when it was made, as kept in
    /// that map (0 if never written: the figure then only falls short).
    Pins { map_id: u32, base: u64 },
}

/// A tracefs instance counting `block_rq_error` events, and the figure
/// drawn from it.
#[derive(Debug)]
pub struct TracerCount {
    dir: PathBuf,
    lifetime: Lifetime,
    /// Made by this process (else adopted from an earlier one).
    made: bool,
    figures: Uncounted,
}

impl TracerCount {
    /// Makes (or, pinned, adopts) the instance under the tracefs at
    /// `tracefs_root` and enables the event in it. `counted`: the
    /// programs' count for `block_rq_error`, read first (see
    /// [`Uncounted::new`]); a pinned instance made now has it as its base,
    /// which the caller keeps (see [`TracerCount::made`]).
    pub fn start(
        tracefs_root: &Path,
        counted: u64,
        lifetime: Lifetime,
    ) -> Result<Self, TracerCountError> {
        if !tracefs_root.join(EVENT).exists() {
            return Err(TracerCountError::NoEvent);
        }
        let instances = tracefs_root.join("instances");
        remove_stale(&instances);
        let dir = instances.join(name(lifetime));
        if let (Lifetime::Pins { base, .. }, true) = (lifetime, dir.exists()) {
            let witness = Self {
                dir,
                lifetime,
                made: false,
                figures: Uncounted::new(0, base),
            };
            // Whatever switched it off, it counts from here on.
            witness.enable()?;
            return Ok(witness);
        }
        // Only a process that is gone could have left one with our pid.
        if dir.exists() {
            remove(&dir)?;
        }
        fs::create_dir(&dir).map_err(io_error(&dir))?;
        // Owned from here on: a failure below removes it again.
        let mut witness = Self {
            dir,
            lifetime: Lifetime::Process,
            made: true,
            figures: Uncounted::default(),
        };
        let size = witness.dir.join("buffer_size_kb");
        fs::write(&size, BUFFER_KB).map_err(io_error(&size))?;
        witness.enable()?;
        witness.figures = Uncounted::new(witness.traced()?, counted);
        witness.lifetime = lifetime;
        Ok(witness)
    }

    fn enable(&self) -> Result<(), TracerCountError> {
        let enable = self.dir.join(EVENT);
        fs::write(&enable, "1").map_err(io_error(&enable))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether this process made the instance (a pinned one made now needs
    /// its base kept), rather than adopting it.
    pub fn made(&self) -> bool {
        self.made
    }

    /// See [`Uncounted::observe`].
    pub fn observe(&mut self, traced: u64, counted: u64) -> u64 {
        self.figures.observe(traced, counted)
    }

    pub fn figures(&self) -> Uncounted {
        self.figures
    }

    /// How many `block_rq_error` events the kernel traced since the
    /// instance was made, summed over CPUs; read it before the programs'
    /// count (see [`Uncounted`]).
    pub fn traced(&self) -> Result<u64, TracerCountError> {
        let per_cpu = self.dir.join("per_cpu");
        let mut total = 0;
        for entry in fs::read_dir(&per_cpu).map_err(io_error(&per_cpu))? {
            let entry = entry.map_err(io_error(&per_cpu))?;
            if !entry.file_name().to_string_lossy().starts_with("cpu") {
                continue;
            }
            let path = entry.path().join("stats");
            let text = read_once(&path).map_err(io_error(&path))?;
            let n = written(&text).map_err(|field| TracerCountError::Stats { path, field })?;
            total = n.saturating_add(total);
        }
        Ok(total)
    }
}

impl Drop for TracerCount {
    fn drop(&mut self) {
        if self.lifetime != Lifetime::Process {
            return;
        }
        if let Err(e) = remove(&self.dir) {
            tracing::warn!("removing the tracer witness: {e}");
        }
    }
}

fn name(lifetime: Lifetime) -> String {
    match lifetime {
        Lifetime::Process => format!("{PREFIX}{}", std::process::id()),
        Lifetime::Pins { map_id, .. } => format!("{PREFIX}{PINS}{map_id}"),
    }
}

/// Removes the instance kept with the pinned state whose `STATS` map had
/// id `map_id` (`uninstall`); whether there was one.
pub fn remove_pinned(tracefs_root: &Path, map_id: u32) -> Result<bool, TracerCountError> {
    let dir = tracefs_root
        .join("instances")
        .join(name(Lifetime::Pins { map_id, base: 0 }));
    if !dir.exists() {
        return Ok(false);
    }
    remove(&dir)?;
    Ok(true)
}

/// Events written to one CPU's ring buffer, from its `stats` file: those
/// still in it and those overwritten or dropped. Names the missing figure.
pub(crate) fn written(stats: &str) -> Result<u64, &'static str> {
    let figure = |name: &'static str| {
        stats
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .ok_or(name)
    };
    // `dropped events` counts only in a non-overwriting buffer (0 here),
    // and older kernels lack it.
    let dropped = figure("dropped events").unwrap_or(0);
    // Saturating: the figures are the kernel's, not to be trusted to fit.
    let figures = [
        figure("entries")?,
        figure("overrun")?,
        figure("commit overrun")?,
        dropped,
    ];
    Ok(figures.into_iter().fold(0, u64::saturating_add))
}

/// Reads a tracefs statistics file in one `read`: the kernel formats it
/// anew on every call, so a second read (which `read_to_string` makes
/// after a short first one) continues at an offset into figures that have
/// changed length meanwhile, and splices two versions into a broken line.
fn read_once(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut buf = [0u8; 4096];
    let n = fs::File::open(path)?.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Disables the event and removes the instance (the kernel refuses to
/// remove one whose files are open; nothing here keeps one open).
fn remove(dir: &Path) -> Result<(), TracerCountError> {
    let enable = dir.join(EVENT);
    if enable.exists() {
        fs::write(&enable, "0").map_err(io_error(&enable))?;
    }
    fs::remove_dir(dir).map_err(io_error(dir))
}

/// Removes the instances of agent processes that no longer exist, and
/// those of pinned state whose maps are gone (replaced or uninstalled).
fn remove_stale(instances: &Path) {
    let Ok(entries) = fs::read_dir(instances) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(PREFIX)) else {
            continue;
        };
        let whose = if let Some(id) = rest.strip_prefix(PINS) {
            match id.parse::<u32>() {
                Ok(id) if map_is_gone(id) => "gone pinned state",
                _ => continue,
            }
        } else {
            match rest.parse::<u32>() {
                Ok(pid)
                    if pid != std::process::id()
                        && !Path::new(&format!("/proc/{pid}")).exists() =>
                {
                    "gone agent"
                }
                _ => continue,
            }
        };
        match remove(&entry.path()) {
            Ok(()) => tracing::info!("removed the tracer witness of a {whose}: {rest}"),
            Err(e) => tracing::warn!("removing the tracer witness of a {whose}: {e}"),
        }
    }
}

/// Whether the kernel has no map of id `id` any more. Any other answer
/// (no privilege, an old kernel) keeps the instance.
// Public for tests/tests/host/tracefs.rs (waits for its own map to go).
#[doc(hidden)]
pub fn map_is_gone(id: u32) -> bool {
    use aya::maps::MapError;
    match aya::maps::MapInfo::from_id(id) {
        Err(MapError::SyscallError(e)) => e.io_error.raw_os_error() == Some(libc::ENOENT),
        _ => false,
    }
}

/// Failed requests the kernel traced that no program counted.
///
/// Both counts only grow. `observe` is given the traced count read
/// *before* the programs' count: errors in between are then in the
/// programs' count only, so the estimate can only fall short of the truth,
/// never exceed it, and the largest estimate so far is kept. Once errors
/// stop, the two reads agree and the figure is exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Uncounted {
    traced_at_start: u64,
    counted_at_start: u64,
    /// Traced since start, at the last observation.
    pub traced: u64,
    /// The largest estimate so far.
    pub uncounted: u64,
}

impl Uncounted {
    /// `counted` is read before the instance is made (and `traced` is then
    /// 0 or read right after it), so the errors in between are counted
    /// without being traced: again an under-estimate.
    pub fn new(traced: u64, counted: u64) -> Self {
        Self {
            traced_at_start: traced,
            counted_at_start: counted,
            traced: 0,
            uncounted: 0,
        }
    }

    /// Takes a new pair of reads; returns how much the figure grew.
    pub fn observe(&mut self, traced: u64, counted: u64) -> u64 {
        self.traced = traced.saturating_sub(self.traced_at_start);
        let counted = counted.saturating_sub(self.counted_at_start);
        let estimate = self.traced.saturating_sub(counted);
        let grew = estimate.saturating_sub(self.uncounted);
        self.uncounted += grew;
        grew
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATS: &str = "entries: 127\noverrun: 336096\ncommit overrun: 2\nbytes: 4064\n\
    oldest event ts: 10301.480733\nnow ts: 10310.002146\ndropped events: 0\nread events: 0\n";

    #[test]
    fn written_adds_what_is_left_overwritten_and_dropped() {
        assert_eq!(written(STATS), Ok(127 + 336096 + 2));
        // Kernels without the `dropped events` line.
        assert_eq!(
            written("entries: 3\noverrun: 4\ncommit overrun: 0\n"),
            Ok(7)
        );
        // `read events` is not a prefix match of anything counted.
        assert_eq!(
            written("entries: 0\noverrun: 0\ncommit overrun: 0\nread events: 9\n"),
            Ok(0)
        );
    }

    #[test]
    fn written_names_a_missing_figure() {
        assert_eq!(written("entries: 3\ncommit overrun: 0\n"), Err("overrun"));
        assert_eq!(written("entries: x\noverrun: 1\n"), Err("entries"));
        assert_eq!(written(""), Err("entries"));
    }

    #[test]
    fn uncounted_is_what_was_traced_beyond_what_was_counted_since_start() {
        // 40 traced before the instance existed (another process's), 1000
        // counted before this process started.
        let mut u = Uncounted::new(40, 1000);
        assert_eq!(u.observe(40, 1000), 0);
        // 500 failures, the programs ran for 497 of them.
        assert_eq!(u.observe(540, 1497), 3);
        assert_eq!((u.traced, u.uncounted), (500, 3));
        // Read mid-flood: the programs' count was read later and is ahead.
        assert_eq!(u.observe(600, 1610), 0);
        assert_eq!((u.traced, u.uncounted), (560, 3));
        // Quiet again: exact, and one more was lost meanwhile.
        assert_eq!(u.observe(700, 1656), 1);
        assert_eq!((u.traced, u.uncounted), (660, 4));
    }

    #[test]
    fn uncounted_never_goes_down() {
        let mut u = Uncounted::new(0, 0);
        assert_eq!(u.observe(10, 7), 3);
        // The programs counted one the tracer did not (it dropped a record it
        // could not write): the figure stays.
        assert_eq!(u.observe(11, 11), 0);
        assert_eq!(u.uncounted, 3);
    }

    proptest::proptest! {
        /// The kernel's layout, any figures: their sum, never an overflow.
        #[test]
        fn written_sums_the_kernel_layout(
            f in proptest::array::uniform4(proptest::prelude::any::<u64>()),
            read_events in proptest::prelude::any::<u64>(),
        ) {
            let text = format!(
                "entries: {}\noverrun: {}\ncommit overrun: {}\nbytes: 4064\n\
                 oldest event ts: 10301.480733\nnow ts: 10310.002146\n\
                 dropped events: {}\nread events: {read_events}\n",
                f[0], f[1], f[2], f[3]
            );
            let want = f.iter().fold(0u64, |a, &b| a.saturating_add(b));
            proptest::prop_assert_eq!(written(&text), Ok(want));
        }

        /// Any text: a sum or the name of a figure it lacks, never a panic.
        #[test]
        fn written_takes_any_text(text in "(?s).{0,400}") {
            if let Err(name) = written(&text) {
                proptest::prop_assert!(["entries", "overrun", "commit overrun"].contains(&name));
            }
        }
    }
}
