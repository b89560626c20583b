//! The file servers' programs the guest suites run (knfsd's tools for
//! `nfs`, ksmbd.mountd for `smb`), from Debian's packages unpacked by
//! `cargo xtask vm` into its cache (xtask/src/vm/file_servers.rs), not
//! installed: run from that tree with its libraries first.

use std::ffi::OsStr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};

use crate::cmd;

/// Where `cargo xtask vm` says the unpacked tree is.
const ENV: &str = "HEALTH_VM_FILE_SERVERS";

pub struct ServerTools {
    root: PathBuf,
}

impl ServerTools {
    /// The tree the guest was given; `suite` names who needs it.
    pub fn from_env(suite: &str) -> Result<ServerTools> {
        let root = std::env::var_os(ENV).map(PathBuf::from).with_context(|| {
            format!(
                "{ENV} is not set: the {suite} suite runs in `cargo xtask vm` guests, \
                 which unpack Debian's file server programs for it"
            )
        })?;
        Ok(ServerTools { root })
    }

    /// Runs `program` (a path in the tree) to its end.
    pub fn run(&self, program: &str, args: &[&str]) -> Result<cmd::Output> {
        let path = self.root.join(program);
        let libs = self.library_path();
        cmd::run_env(
            &path.to_string_lossy(),
            args,
            &[("LD_LIBRARY_PATH", OsStr::new(&libs))],
        )
    }

    /// Starts daemon `program` in the foreground, its output discarded;
    /// it must still run a moment later.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Result<Child> {
        let mut child = Command::new(self.root.join(program))
            .args(args)
            .env("LD_LIBRARY_PATH", self.library_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {program}"))?;
        std::thread::sleep(Duration::from_millis(300));
        if let Some(status) = child.try_wait()? {
            bail!("{program} exited at once ({status})");
        }
        Ok(child)
    }

    fn library_path(&self) -> String {
        ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"]
            .iter()
            .map(|d| self.root.join(d).display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }
}
