//! What the image test's aarch64 guests boot (`tests/tests/host/image/arm64_guest.rs`):
//! Debian's arm64 kernels of every series the amd64 guests run, their
//! modules in a root of their own, and Debian's static busybox for arm64
//! (the guests' shell and tools). The test builds each guest's initramfs
//! from these and the image's own arm64 files, and boots it under
//! qemu-system-aarch64 (TCG); this only fetches, once.
//!
//! The directory [`ensure`] returns ([`ENV`]):
//!
//! ```text
//! busybox        the static arm64 busybox
//! 5.10/ 6.1/ 6.12/  each kernel's vmlinuz, its package record
//!                and root/lib/modules/<release>/ (depmod'ed)
//! ```

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use anyhow::Context;

use super::kernels::{self, Series};
use crate::bootstrap::cache_dir;
use crate::cross::ARM64;
use crate::image::foreign;

/// The variable the image test reads the directory from.
pub const ENV: &str = "HEALTH_ARM64_GUESTS";

/// Fetches what is not cached yet and returns the directory. `refresh`
/// looks up the newest kernel of each series again.
pub fn ensure(refresh: bool) -> anyhow::Result<PathBuf> {
    let cache = cache_dir().join("vm");
    let dir = cache.join("arm64-guests");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    for series in Series::ALL {
        let kernel = kernels::ensure(&cache, series, &ARM64, refresh)
            .with_context(|| format!("preparing Debian's {} arm64 kernel", series.name()))?;
        replace_link(&kernel.dir, &dir.join(series.name()))?;
    }
    let busybox = foreign::unpacked(&ARM64, "busybox-static")?;
    // bookworm's package installs /bin/busybox, later ones /usr/bin/busybox.
    let binary = ["bin/busybox", "usr/bin/busybox"]
        .iter()
        .map(|p| busybox.join(p))
        .find(|p| p.is_file())
        .with_context(|| {
            format!(
                "busybox-static unpacked no busybox in {}",
                busybox.display()
            )
        })?;
    replace_link(&binary, &dir.join("busybox"))?;
    Ok(dir)
}

fn replace_link(target: &Path, link: &Path) -> anyhow::Result<()> {
    if link.symlink_metadata().is_ok() {
        fs::remove_file(link).with_context(|| format!("removing {}", link.display()))?;
    }
    symlink(target, link).with_context(|| format!("linking {}", link.display()))
}
