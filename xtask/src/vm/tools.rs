//! What booting a guest needs: QEMU from Debian, a static busybox taken out
//! of Debian's busybox-static package into our cache, virtme-ng from PyPI in
//! a venv in our cache (it is not packaged for bookworm, and a venv keeps it
//! off the system Python), and virtiofsd from crates.io in our cache.
//!
//! virtiofsd shares the host's root with the guest over virtio-fs instead
//! of 9p: virtme-ng uses it when it finds one on PATH (Debian 12 packages
//! none; QEMU 7.2's C daemon, which bookworm ships, it refuses), and falls
//! back to 9p without a cache, about 3 MB/s under TCG, where every program
//! a test runs and every module it loads was read again. Measured on a
//! 5.10 guest with iscsi, nvme_multipath and returned_errors (2026-12-01):
//! boot 87.5 s and commands 343 s over 9p, 36.5 s and 136 s over virtio-fs.
//!
//! The busybox is handed to virtme-ng by path (`--busybox`). Left to itself,
//! virtme-ng takes the first of `busybox-static`, `busybox.static` and
//! `busybox` it finds on PATH or in /usr/local/bin, /usr/bin, /bin, and
//! refuses it unless `file` calls it statically linked. Debian's `busybox`
//! package (dynamic, on many images) or any other busybox earlier on PATH
//! is found first, and a check for a `busybox` command is satisfied by it,
//! so busybox-static was never installed: "a statically linked busybox
//! could not be found, please install busybox-static". Installing that
//! package would remove Debian's `busybox` (they conflict); unpacking it
//! into the cache touches nothing of the host's.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::bootstrap::run_apt;
use crate::util::{run, say};

/// Pinned so that a new release cannot change how guests boot under us.
const VIRTME_NG: &str = "virtme-ng==1.42";
/// The virtio-fs daemon's crate, pinned like virtme-ng.
const VIRTIOFSD: &str = "1.14.0";
/// What virtiofsd's build links (its seccomp filter and capabilities).
const VIRTIOFSD_BUILD_PACKAGES: &[&str] = &["libseccomp-dev", "libcap-ng-dev"];

pub struct Tools {
    pub vng: PathBuf,
    /// Goes first on vng's PATH: it starts virtme-run from there.
    pub venv_bin: PathBuf,
    /// A statically linked busybox, for virtme-ng's initramfs.
    pub busybox: PathBuf,
    /// The directory of virtiofsd ([`virtiofsd`] makes it), on vng's PATH:
    /// virtme-ng looks for the daemon there.
    pub virtiofsd_bin: PathBuf,
}

/// QEMU and the guest's tools from Debian, a static busybox and virtme-ng
/// (PyPI, in a venv) in the cache.
pub fn ensure(cache: &Path) -> anyhow::Result<Tools> {
    crate::bootstrap::ensure_commands(&[
        ("qemu-system-x86_64", "qemu-system-x86"),
        ("depmod", "kmod"),
        ("dpkg-deb", "dpkg"),
        ("mkfs.ext4", "e2fsprogs"),
        ("python3", "python3-venv"),
        // The device-fault scenarios (tests/tests/guest/device_faults.rs) run
        // these inside the guest, from the shared root.
        ("dmsetup", "dmsetup"),
        ("mdadm", "mdadm"),
        ("udevadm", "udev"),
        // The iSCSI scenarios (tests/tests/guest/iscsi.rs) run the open-iscsi
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
                run_apt(
                    Command::new("apt-get")
                        .args(args)
                        .env("DEBIAN_FRONTEND", "noninteractive"),
                )
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
    let busybox = static_busybox(cache)?;
    Ok(Tools {
        vng,
        venv_bin,
        busybox,
        virtiofsd_bin: virtiofsd_bin(cache),
    })
}

/// Where `cargo install --root` puts virtiofsd ([`virtiofsd`]).
fn virtiofsd_bin(cache: &Path) -> PathBuf {
    cache.join(format!("virtiofsd-{VIRTIOFSD}/bin"))
}

/// virtiofsd [`VIRTIOFSD`] built from crates.io into the cache, once (about
/// 200 CPU-seconds); `cargo xtask vm` runs this beside its other builds.
pub fn virtiofsd(cache: &Path) -> anyhow::Result<()> {
    let bin = virtiofsd_bin(cache);
    if bin.join("virtiofsd").is_file() {
        return Ok(());
    }
    let root = bin.parent().context("the install root is bin's parent")?;
    crate::bootstrap::ensure_packages(VIRTIOFSD_BUILD_PACKAGES)
        .context("installing what virtiofsd's build links")?;
    say(format!(
        "building virtiofsd {VIRTIOFSD} from crates.io into {} (once)",
        root.display()
    ));
    // cargo installs the binary last, so a failed build leaves none there;
    // in a temporary target directory of its own, not the workspace's.
    run(crate::util::cargo()
        .env_remove("CARGO_TARGET_DIR")
        .args(["install", "--locked", "--quiet", "--version"])
        .arg(format!("={VIRTIOFSD}"))
        .arg("--root")
        .arg(root)
        .arg("virtiofsd"))
    .with_context(|| format!("building virtiofsd {VIRTIOFSD} (cargo install)"))?;
    if !bin.join("virtiofsd").is_file() {
        bail!(
            "cargo install virtiofsd succeeded but {} has no virtiofsd",
            bin.display()
        );
    }
    Ok(())
}

/// Debian's busybox-static binary, unpacked once into the cache.
fn static_busybox(cache: &Path) -> anyhow::Result<PathBuf> {
    let bin = cache.join("busybox-static/busybox");
    if fs::read(&bin).is_ok_and(|elf| is_static_elf(&elf)) {
        return Ok(bin);
    }
    say(format!(
        "unpacking Debian's busybox-static into {} (once)",
        bin.display()
    ));
    let work = tempfile::tempdir().context("creating a directory for busybox-static")?;
    let download = || {
        run_apt(Command::new("apt-get").current_dir(work.path()).args([
            "download",
            "-qq",
            "busybox-static",
        ]))
    };
    // A fresh machine may have no package lists yet.
    if download().is_err() {
        run_apt(Command::new("apt-get").args(["update", "-qq"]))?;
        download().context("downloading busybox-static from the Debian archive")?;
    }
    let deb = crate::util::single_file(work.path(), "deb", "apt-get download busybox-static")?;
    let unpacked = work.path().join("root");
    run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    let found = unpacked.join("bin/busybox");
    let elf = fs::read(&found).with_context(|| format!("reading {}", found.display()))?;
    if !is_static_elf(&elf) {
        bail!(
            "{} from busybox-static is not a statically linked ELF executable",
            found.display()
        );
    }
    let dir = bin.parent().context("the cache path has a parent")?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Copied next to its place, then renamed: never half a binary there.
    let staged = dir.join(".busybox.tmp");
    fs::copy(&found, &staged).with_context(|| format!("copying {}", found.display()))?;
    fs::rename(&staged, &bin).with_context(|| format!("moving busybox to {}", bin.display()))?;
    Ok(bin)
}

/// Whether `elf` is a 64-bit little-endian ELF executable with no program
/// interpreter (PT_INTERP), which is what static and static-pie mean.
fn is_static_elf(elf: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u32_at = |at: usize| {
        elf.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
    };
    if elf.get(..6) != Some(b"\x7fELF\x02\x01") {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) = (u64_at(32), u16_at(54), u16_at(56)) else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(phnum)).all(|i| {
        let at = phoff + i * usize::from(phentsize);
        u32_at(at).is_some_and(|kind| kind != PT_INTERP)
    })
}

#[cfg(test)]
mod tests {
    use super::is_static_elf;

    /// A 64-bit little-endian ELF header with program headers of these types.
    fn elf(program_headers: &[u32]) -> Vec<u8> {
        let mut elf = vec![0u8; 64 + 56 * program_headers.len()];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[32..40].copy_from_slice(&64u64.to_le_bytes());
        elf[54..56].copy_from_slice(&56u16.to_le_bytes());
        elf[56..58].copy_from_slice(&(program_headers.len() as u16).to_le_bytes());
        for (i, kind) in program_headers.iter().enumerate() {
            let at = 64 + 56 * i;
            elf[at..at + 4].copy_from_slice(&kind.to_le_bytes());
        }
        elf
    }

    #[test]
    fn an_executable_with_an_interpreter_is_not_static() {
        // PT_LOAD, PT_DYNAMIC, PT_NOTE: static (or static-pie).
        assert!(is_static_elf(&elf(&[1, 2, 4])));
        // PT_PHDR, PT_INTERP, PT_LOAD: dynamically linked.
        assert!(!is_static_elf(&elf(&[6, 3, 1])));
        // Program headers cut short, not an ELF, a 32-bit one.
        let mut short = elf(&[1, 1]);
        short.truncate(64 + 56 + 2);
        assert!(!is_static_elf(&short));
        assert!(!is_static_elf(b"#!/bin/sh\n"));
        let mut elf32 = elf(&[1]);
        elf32[4] = 1;
        assert!(!is_static_elf(&elf32));
    }
}
