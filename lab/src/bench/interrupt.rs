//! Ctrl-C without leaks.
//!
//! The demo and the benchmarks hold loop devices, mounts, a FUSE server and
//! an agent. A terminal Ctrl-C sends SIGINT to the whole foreground process
//! group; if it killed us (or the FUSE server) midway, loop devices and
//! mounts would stay behind. So the signal only sets a flag, the long-running
//! steps poll it, and the error they return unwinds through the Drop guards
//! that clean up in order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Signals that mean "stop and clean up".
const STOP_SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];
/// Signals a terminal sends to the whole foreground process group.
const TERMINAL_SIGNALS: [Signal; 2] = [Signal::SIGINT, Signal::SIGHUP];

/// The error a step returns when the user asked to stop; `main` turns it into
/// exit status 130 like a shell would.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted")
    }
}

impl std::error::Error for Interrupted {}

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: the one thing that is async-signal-safe here.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn set_all(signals: &[Signal], handler: SigHandler) -> anyhow::Result<()> {
    // SA_RESTART: the reader threads and waits should not see EINTR.
    let action = SigAction::new(handler, SaFlags::SA_RESTART, SigSet::empty());
    for &sig in signals {
        // SAFETY: the handler only stores to an atomic.
        unsafe { sigaction(sig, &action) }
            .with_context(|| format!("installing a {sig} handler"))?;
    }
    Ok(())
}

/// Makes SIGINT, SIGTERM and SIGHUP set the flag instead of killing us.
pub fn install() -> anyhow::Result<()> {
    set_all(&STOP_SIGNALS, SigHandler::Handler(on_signal))
}

/// Runs `f` (which spawns children) with the terminal's signals ignored.
///
/// An ignored disposition survives exec while a handler does not, so
/// children spawned inside `f` never see the terminal's Ctrl-C: we stop them
/// ourselves, in the right order, from the Drop guards. A Ctrl-C during `f`
/// itself is lost; `f` should be short.
pub fn spawn_shielded<T>(f: impl FnOnce() -> anyhow::Result<T>) -> anyhow::Result<T> {
    set_all(&TERMINAL_SIGNALS, SigHandler::SigIgn)?;
    let result = f();
    install()?;
    result
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// `Err(Interrupted)` once a stop signal arrived.
pub fn check() -> anyhow::Result<()> {
    if interrupted() {
        return Err(Interrupted.into());
    }
    Ok(())
}

/// Sleeps `d`, waking early (with `Err(Interrupted)`) on a stop signal.
pub fn sleep(d: Duration) -> anyhow::Result<()> {
    let end = Instant::now() + d;
    loop {
        check()?;
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(());
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}
