//! A FUSE mount whose server never answers, for tests of hung paths.
//!
//! The test opens /dev/fuse and mounts with that descriptor but never reads
//! it, so the kernel's INIT stays unanswered and every request on the mount
//! (statfs, stat or open of the root, an ioctl) waits: exactly what a
//! SIGSTOPped or wedged FUSE daemon (or a dead NFS server, for the caller)
//! does, without a daemon. Closing the descriptor aborts the connection:
//! waiters get ENOTCONN and the mount can go.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::TempDir;

pub struct HungFuse {
    path: PathBuf,
    fd: Option<OwnedFd>,
    /// Set when the mount point is a temporary directory of ours.
    _dir: Option<TempDir>,
}

impl HungFuse {
    /// Mounts on `path` (created if missing). Needs root.
    pub fn mount(path: &Path) -> Result<HungFuse> {
        crate::require_root()?;
        std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))?;
        let fd: OwnedFd = OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .context("open /dev/fuse")?
            .into();
        let data = format!("fd={},rootmode=40000,user_id=0,group_id=0", fd.as_raw_fd());
        nix::mount::mount(
            Some("volume-health-test-hang"),
            path,
            Some("fuse"),
            nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV,
            Some(data.as_str()),
        )
        .with_context(|| format!("mounting a FUSE filesystem on {}", path.display()))?;
        Ok(HungFuse {
            path: path.to_path_buf(),
            fd: Some(fd),
            _dir: None,
        })
    }

    /// Mounts on a new temporary directory.
    pub fn in_temp_dir() -> Result<HungFuse> {
        let dir = tempfile::tempdir().context("creating a temporary directory")?;
        let mut me = HungFuse::mount(dir.path())?;
        me._dir = Some(dir);
        Ok(me)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Like the daemon dying: abort the connection; waiters get ENOTCONN.
    pub fn abort(&mut self) {
        self.fd = None;
    }
}

impl Drop for HungFuse {
    fn drop(&mut self) {
        self.abort();
        if let Err(e) = crate::sys::unmount(&self.path, true) {
            eprintln!("HungFuse: {e:#}");
        }
    }
}
