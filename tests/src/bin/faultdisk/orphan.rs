//! What happens when the client vanishes: stdin reaches EOF, and the server cleans up
//! as the client would have (loop devices, its own mount, the work dir), then exits.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result};

/// Set once the stdin watcher started cleaning up after a vanished client.
pub(super) static ORPHAN_CLEANUP: AtomicBool = AtomicBool::new(false);

/// Blocks until stdin reaches EOF (the client closed it or died), then cleans up what a
/// dead client left behind and exits.
pub(super) fn orphan_watch(dir: PathBuf, image: PathBuf, mnt: PathBuf) {
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
    ORPHAN_CLEANUP.store(true, Ordering::SeqCst);
    if let Err(e) = orphan_cleanup(&dir, &image, &mnt) {
        eprintln!("faultdisk: orphan cleanup: {e:#}");
    }
    // The normal path (client unmounts us) ends in real_main; getting here means the
    // client is gone or closing: leave now.
    std::process::exit(0);
}

fn orphan_cleanup(dir: &Path, image: &Path, mnt: &Path) -> Result<()> {
    let loops = health_tests::sys::loops_backed_by(image)?;
    if !loops.is_empty() {
        eprintln!("faultdisk: stdin closed with loop devices still attached: {loops:?}");
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
