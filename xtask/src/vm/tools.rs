//! What booting a guest needs: QEMU and a static busybox from Debian,
//! virtme-ng from PyPI in a venv in our cache (it is not packaged for
//! bookworm, and a venv keeps it off the system Python).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::util::{run, say};

/// Pinned so that a new release cannot change how guests boot under us.
const VIRTME_NG: &str = "virtme-ng==1.42";

pub struct Tools {
    pub vng: PathBuf,
    /// Goes first on vng's PATH: it starts virtme-run from there.
    pub venv_bin: PathBuf,
}

/// QEMU and busybox from Debian, virtme-ng from PyPI in a venv in the cache.
pub fn ensure(cache: &Path) -> anyhow::Result<Tools> {
    crate::bootstrap::ensure_commands(&[
        ("qemu-system-x86_64", "qemu-system-x86"),
        // virtme-ng builds its initramfs around a static busybox.
        ("busybox", "busybox-static"),
        ("depmod", "kmod"),
        ("dpkg-deb", "dpkg"),
        ("mkfs.ext4", "e2fsprogs"),
        ("python3", "python3-venv"),
        // The device-fault scenarios (tests/tests/device_faults.rs) run
        // these inside the guest, from the shared root.
        ("dmsetup", "dmsetup"),
        ("mdadm", "mdadm"),
        ("udevadm", "udev"),
        // The iSCSI scenarios (tests/tests/iscsi.rs) run the open-iscsi
        // initiator (iscsid, iscsiadm) in the guest against the kernel's LIO
        // target over loopback.
        ("iscsiadm", "open-iscsi"),
    ])
    .context("installing the VM tools (Debian packages)")?;
    let venv = cache.join(format!("venv-{}", VIRTME_NG.replace("==", "-")));
    let venv_bin = venv.join("bin");
    let vng = venv_bin.join("vng");
    // Written after pip succeeded: a venv without it is half-made.
    let done = venv.join(".installed");
    if !done.is_file() {
        let _ = fs::remove_dir_all(&venv);
        say(format!(
            "installing {VIRTME_NG} into {} (once)",
            venv.display()
        ));
        let venv_cmd = || {
            Command::new("python3")
                .arg("-m")
                .arg("venv")
                .arg(&venv)
                .status()
        };
        if !venv_cmd().is_ok_and(|s| s.success()) {
            // Debian's python3 has no venv module without python3-venv.
            let _ = fs::remove_dir_all(&venv);
            let apt = |args: &[&str]| {
                run(Command::new("apt-get")
                    .args(args)
                    .env("DEBIAN_FRONTEND", "noninteractive"))
            };
            apt(&["update", "-qq"])
                .and_then(|_| {
                    apt(&[
                        "install",
                        "-y",
                        "-qq",
                        "--no-install-recommends",
                        "python3-venv",
                    ])
                })
                .context("installing python3-venv")?;
            run(Command::new("python3").arg("-m").arg("venv").arg(&venv))
                .with_context(|| format!("creating a Python venv in {}", venv.display()))?;
        }
        run(Command::new(venv_bin.join("pip")).args(["install", "-q", VIRTME_NG]))
            .with_context(|| format!("installing {VIRTME_NG} from PyPI"))?;
        fs::write(&done, VIRTME_NG).with_context(|| format!("writing {}", done.display()))?;
    }
    if !vng.is_file() {
        bail!("{} is missing after installing {VIRTME_NG}", vng.display());
    }
    Ok(Tools { vng, venv_bin })
}
