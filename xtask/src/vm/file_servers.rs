//! The file servers' programs the guest suites run, unpacked from Debian's
//! packages into our cache, not installed: knfsd's (rpc.nfsd, exportfs,
//! rpc.mountd, nfsdcld, rpcbind) and the NFS client's mount.nfs for the
//! `nfs` suite, ksmbd's userspace daemon ksmbd.mountd with ksmbd.adduser
//! and ksmbd.control for the `smb` suite. The suites mount the CIFS client
//! with mount(2) directly, so cifs-utils is not needed.
//!
//! Installing nfs-kernel-server or ksmbd-tools on the machine would start
//! their services there (rpcbind on port 111, the NFS server unit, which
//! fails on a host without the nfsd module, ksmbd's); the guests need only
//! the programs. They run from the shared root with the cache's libraries
//! first on `LD_LIBRARY_PATH` (libnfsidmap1, libwrap0 and ksmbd.tools'
//! libnl-genl-3 are not on every machine; the others they link, libnl-3
//! and glib among them, are on every Debian 12 machine). The guest finds
//! the tree through `HEALTH_VM_FILE_SERVERS`.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

use crate::bootstrap::run_apt;
use crate::util::{run, say};

/// The packages unpacked, each without its dependencies.
const PACKAGES: &[&str] = &[
    "nfs-kernel-server",
    "nfs-common",
    "rpcbind",
    "libnfsidmap1",
    "libwrap0",
    "ksmbd-tools",
    "libnl-genl-3-200",
];

/// The programs the suites run, relative to the tree: checked after
/// unpacking, so that a package that moved one fails here, not in a guest.
/// ksmbd's are relative symlinks to ../libexec/ksmbd.tools, which resolve
/// inside the tree.
const PROGRAMS: &[&str] = &[
    "usr/sbin/rpc.nfsd",
    "usr/sbin/exportfs",
    "usr/sbin/rpc.mountd",
    "usr/sbin/nfsdcld",
    "sbin/rpcbind",
    "sbin/mount.nfs",
    "usr/sbin/ksmbd.mountd",
    "usr/sbin/ksmbd.adduser",
    "usr/sbin/ksmbd.control",
];

/// The environment variable that tells the guest's tests where the tree is.
pub const ENV: &str = "HEALTH_VM_FILE_SERVERS";

/// The unpacked tree, made once (`<cache>/file-servers/root`).
pub fn ensure(cache: &Path) -> anyhow::Result<PathBuf> {
    let dir = cache.join("file-servers");
    let root = dir.join("root");
    // Written after every package was unpacked: a tree without it is half-made.
    let done = dir.join(".installed");
    if fs::read_to_string(&done).is_ok_and(|s| s == PACKAGES.join(" ")) {
        return Ok(root);
    }
    say(format!(
        "unpacking Debian's {} into {} (once)",
        PACKAGES.join(", "),
        root.display()
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let work =
        tempfile::tempdir().context("creating a directory for the file servers' packages")?;
    let download = || {
        run_apt(
            Command::new("apt-get")
                .current_dir(work.path())
                .args(["download", "-qq"])
                .args(PACKAGES),
        )
    };
    // A fresh machine may have no package lists yet.
    if download().is_err() {
        run_apt(Command::new("apt-get").args(["update", "-qq"]))?;
        download().context("downloading the file servers' packages from the Debian archive")?;
    }
    for entry in fs::read_dir(work.path()).context("listing the downloaded packages")? {
        let deb = entry?.path();
        if deb.extension().is_some_and(|e| e == "deb") {
            run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
        }
    }
    for program in PROGRAMS {
        // Through a symlink too: the tree is not at /, so only a relative
        // one (as ksmbd's are) reaches its file here, as in the guest.
        if !root.join(program).is_file() {
            bail!(
                "{program} is not in Debian's packages {}, or is a symlink that does not resolve inside their tree (unpacked in {})",
                PACKAGES.join(" "),
                root.display()
            );
        }
    }
    fs::write(&done, PACKAGES.join(" ")).with_context(|| format!("writing {}", done.display()))?;
    Ok(root)
}
