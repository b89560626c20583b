//! A mount namespace of a test's own: what is mounted or unmounted in it is
//! seen by no other process, and goes away with it. For the agent on a host
//! where nothing mounted bpffs at /sys/fs/bpf, without touching the host.

use std::fs::File;
use std::os::fd::AsFd as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};

/// The namespace, held by a sleeping `unshare` process; killed on drop.
pub struct PrivateMounts {
    holder: Child,
    ns: File,
}

impl PrivateMounts {
    /// A copy of this process's mounts, propagation private, with each of
    /// `unmount` unmounted in it (lazily, with whatever is mounted below).
    pub fn new(unmount: &[&str]) -> Result<PrivateMounts> {
        let script = unmount
            .iter()
            .map(|path| format!("while mountpoint -q {path}; do umount -l {path}; done; "))
            .collect::<String>()
            + "echo ready; exec sleep 3600";
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting unshare (util-linux)")?;
        let mut stdout = holder.stdout.take().context("unshare's stdout")?;
        let mut ready = [0u8; 6];
        std::io::Read::read_exact(&mut stdout, &mut ready)
            .context("the mount namespace's holder did not start")?;
        let ns = File::open(format!("/proc/{}/ns/mnt", holder.id()))
            .context("opening the mount namespace")?;
        Ok(PrivateMounts { holder, ns })
    }

    /// `command` will run in this namespace.
    pub fn enter(&self, command: &mut Command) -> Result<()> {
        let ns = self.ns.try_clone()?;
        // SAFETY: setns is async-signal-safe and touches only the fd, which
        // lives in the closure.
        unsafe {
            command.pre_exec(move || {
                nix::sched::setns(ns.as_fd(), nix::sched::CloneFlags::CLONE_NEWNS)
                    .map_err(std::io::Error::from)
            });
        }
        Ok(())
    }

    /// `path` as this namespace sees it, from outside (through its holder's
    /// root).
    pub fn path(&self, path: &Path) -> std::path::PathBuf {
        Path::new(&format!("/proc/{}/root", self.holder.id()))
            .join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Whether `path` is a BPF filesystem in this namespace.
    pub fn is_bpffs(&self, path: &Path) -> Result<bool> {
        let fs = nix::sys::statfs::statfs(&self.path(path))
            .with_context(|| format!("statfs {} in the namespace", path.display()))?;
        Ok(fs.filesystem_type().0 as i64 == 0xcafe_4a11)
    }
}

impl Drop for PrivateMounts {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}
