//! How the server ends without its client: stdin reaches EOF (the client vanished), or,
//! run as a daemon (`--no-stdin`), SIGTERM/SIGINT/SIGHUP arrives. Either way it cleans up
//! as the client would have (loop devices, its own mount, the work dir), then exits.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};
use nix::sys::signal::{SigSet, SigmaskHow, Signal};

/// Set once the watcher started cleaning up after a vanished client or a signal.
pub(super) static ORPHAN_CLEANUP: AtomicBool = AtomicBool::new(false);

/// Where the server's work lies: what the cleanup removes.
pub(super) struct WorkDir {
    pub(super) dir: PathBuf,
    pub(super) image: PathBuf,
    pub(super) mnt: PathBuf,
}

/// Blocks until stdin reaches EOF (the client closed it or died), then cleans up what a
/// dead client left behind and exits.
pub(super) fn orphan_watch(work: WorkDir) {
    let mut stdin = std::io::stdin().lock();
    let mut sink = [0u8; 64];
    loop {
        match stdin.read(&mut sink) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    drop(stdin);
    clean_up_and_exit(&work, "stdin closed");
}

/// The signals a daemon ends on.
fn stop_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
        set.add(s);
    }
    set
}

/// Blocks the stop signals in the calling thread, and so in every thread it starts
/// afterwards: only [`signal_watch`] (which waits for them) ever receives them. Called
/// first thing in main, before any thread exists.
pub(super) fn block_stop_signals() -> Result<()> {
    nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&stop_signals()), None)
        .context("blocking SIGTERM/SIGINT/SIGHUP")
}

/// Waits for SIGTERM, SIGINT or SIGHUP (blocked by [`block_stop_signals`]), then cleans
/// up and exits: a daemon's end.
pub(super) fn signal_watch(work: WorkDir) {
    match stop_signals().wait() {
        Ok(sig) => clean_up_and_exit(&work, sig.as_str()),
        Err(e) => {
            // sigwait only fails on an invalid set; stay up rather than vanish unasked.
            eprintln!("faultdisk: waiting for a stop signal: {e}");
        }
    }
}

fn clean_up_and_exit(work: &WorkDir, why: &str) -> ! {
    eprintln!("faultdisk: {why}: cleaning up");
    ORPHAN_CLEANUP.store(true, Ordering::SeqCst);
    if let Err(e) = orphan_cleanup(&work.dir, &work.image, &work.mnt) {
        eprintln!("faultdisk: orphan cleanup: {e:#}");
    }
    // The normal path (client unmounts us) ends in real_main; getting here means the
    // client is gone or closing: leave now.
    std::process::exit(0);
}

fn orphan_cleanup(dir: &Path, image: &Path, mnt: &Path) -> Result<()> {
    let loops = health_tests::sys::loops_backed_by(image)?;
    if !loops.is_empty() {
        eprintln!("faultdisk: loop devices still attached at exit: {loops:?}");
    }
    // We serve the image, so stat works; it is the identity the loop driver recorded.
    let id = health_tests::sys::FileId::of(image)?;
    for name in &loops {
        if let Err(e) = health_tests::sys::detach_loop_device(name, Some(id)) {
            eprintln!("faultdisk: detaching {name}: {e:#}");
        }
    }
    // Unmounting ourselves ends the FUSE session; lazily if something still holds it.
    health_tests::sys::unmount(mnt, true)?;
    if health_tests::sys::is_owned_work_dir(dir) {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}
