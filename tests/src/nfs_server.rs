//! The kernel's NFS server (knfsd) in a guest, exporting a filesystem of the
//! test's own over loopback, and NFS mounts of it: the guest suite `nfs`.
//!
//! The programs (rpc.nfsd, exportfs, rpc.mountd, nfsdcld, rpcbind,
//! mount.nfs) come from Debian's packages unpacked by `cargo xtask vm`
//! ([`crate::server_tools`]); they are not installed on the machine. The daemons run in the foreground as
//! children of the test and are killed when the server is dropped.
//!
//! knfsd cannot export the guest's root (the host's, shared in): the
//! export is a filesystem the test made, mounted here, with `fsid=0` so
//! that NFSv4 clients mount it as `/`. nfsdcld running lets a restarted
//! server skip the NFSv4 grace period, so that opens work at once after
//! [`NfsServer::resume`].

use std::path::{Path, PathBuf};
use std::process::Child;

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::cmd;
use crate::fs::{Mount, RemoteMount};
use crate::server_tools::ServerTools;
use crate::sys::wait_for_port;

/// The server's threads while it runs.
const THREADS: &str = "8";
const NFS_PORT: u16 = 2049;
const RPCBIND_PORT: u16 = 111;

/// The NFS versions the suite mounts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    V3,
    V4_2,
}

impl Version {
    pub fn name(self) -> &'static str {
        match self {
            Version::V3 => "3",
            Version::V4_2 => "4.2",
        }
    }
}

pub struct NfsServer {
    tools: ServerTools,
    export: PathBuf,
    daemons: Vec<(&'static str, Child)>,
    _export_mount: Mount,
    _export_dir: TempDir,
}

impl NfsServer {
    /// ext4 on `dev`, exported read-write to 127.0.0.1, the server running.
    pub fn start(dev: &Path) -> Result<NfsServer> {
        crate::require_root()?;
        let tools = ServerTools::from_env("NFS")?;
        crate::iscsi::loopback_up()?;
        crate::devices::modprobe("nfsd", &[])?;
        crate::devices::modprobe("nfs", &[])?;
        for dir in [
            "/var/lib/nfs/rpc_pipefs",
            "/var/lib/nfs/v4recovery",
            "/var/lib/nfs/sm",
            "/var/lib/nfs/nfsdcld",
            "/run/rpcbind",
        ] {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {dir}"))?;
        }
        mount_once("nfsd", "/proc/fs/nfsd")?;
        mount_once("rpc_pipefs", "/var/lib/nfs/rpc_pipefs")?;
        // rpcbind drops to this user and exits without it.
        let passwd = std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?;
        if !passwd.lines().any(|l| l.starts_with("_rpc:")) {
            std::fs::write(
                "/etc/passwd",
                format!("{passwd}_rpc:x:107:65534::/run/rpcbind:/usr/sbin/nologin\n"),
            )
            .context("adding rpcbind's user to /etc/passwd")?;
        }
        crate::fs::mkfs_ext4(dev)?;
        let export_dir = tempfile::Builder::new()
            .prefix("nfs-export-")
            .tempdir()
            .context("creating the export's directory")?;
        let export = export_dir.path().to_path_buf();
        let export_mount = Mount::at(dev, &export, "ext4", "errors=continue")?;
        let mut server = NfsServer {
            tools,
            export,
            daemons: Vec::new(),
            _export_mount: export_mount,
            _export_dir: export_dir,
        };
        server.spawn("rpcbind", "sbin/rpcbind", &["-f", "-w"])?;
        wait_for_port(RPCBIND_PORT)?;
        server.export_to_root(true)?;
        server.spawn("rpc.mountd", "usr/sbin/rpc.mountd", &["-F"])?;
        server.spawn("nfsdcld", "usr/sbin/nfsdcld", &["-F"])?;
        server.resume()?;
        Ok(server)
    }

    /// Exports the directory read-write to 127.0.0.1 with the client's
    /// root as root (`no_root_squash`) or, `false`, as nobody
    /// (`root_squash`), and has the server forget what it decided for the
    /// export before (`exportfs -ra` flushes its caches): an export changed
    /// under its clients.
    pub fn export_to_root(&self, root: bool) -> Result<()> {
        let squash = if root {
            "no_root_squash"
        } else {
            "root_squash"
        };
        std::fs::write(
            "/etc/exports",
            format!(
                "{} 127.0.0.1(rw,fsid=0,{squash},insecure,no_subtree_check,sync)\n",
                self.export.display()
            ),
        )
        .context("writing /etc/exports")?;
        self.tool("usr/sbin/exportfs", &["-ra"])?;
        Ok(())
    }

    /// The exported directory, on the server's side.
    pub fn export(&self) -> &Path {
        &self.export
    }

    /// Stops the server's threads (`rpc.nfsd 0`): nothing answers on 2049.
    pub fn stop(&self) -> Result<()> {
        self.tool("usr/sbin/rpc.nfsd", &["0"])?;
        Ok(())
    }

    /// Starts the server's threads again and waits until 2049 accepts.
    pub fn resume(&self) -> Result<()> {
        self.tool("usr/sbin/rpc.nfsd", &[THREADS])?;
        wait_for_port(NFS_PORT)
    }

    /// Mounts the export at `at` (an existing directory) with `options`
    /// added to the version's own (`nolock` for NFSv3: no lock daemon).
    pub fn mount(&self, version: Version, options: &str, at: &Path) -> Result<RemoteMount> {
        let (source, base) = match version {
            Version::V4_2 => ("127.0.0.1:/".to_string(), "vers=4.2".to_string()),
            Version::V3 => (
                format!("127.0.0.1:{}", self.export.display()),
                "vers=3,nolock".to_string(),
            ),
        };
        let options = if options.is_empty() {
            base
        } else {
            format!("{base},{options}")
        };
        let at_arg = at.to_string_lossy().into_owned();
        self.tool("sbin/mount.nfs", &[&source, &at_arg, "-o", &options])
            .with_context(|| format!("mounting NFS {} at {}", version.name(), at.display()))?;
        Ok(RemoteMount::new(at))
    }

    /// Runs one of the unpacked programs.
    fn tool(&self, program: &str, args: &[&str]) -> Result<cmd::Output> {
        self.tools.run(program, args)
    }

    /// Starts a daemon, kept until the server is dropped.
    fn spawn(&mut self, name: &'static str, program: &str, args: &[&str]) -> Result<()> {
        let child = self.tools.spawn(program, args)?;
        self.daemons.push((name, child));
        Ok(())
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        for (program, args) in [
            ("usr/sbin/rpc.nfsd", &["0"][..]),
            ("usr/sbin/exportfs", &["-ua"][..]),
        ] {
            if let Err(e) = self.tool(program, args) {
                eprintln!("NfsServer cleanup: {e:#}");
            }
        }
        for (name, child) in &mut self.daemons {
            if let Err(e) = child.kill().and_then(|_| child.wait()) {
                eprintln!("NfsServer cleanup: stopping {name}: {e}");
            }
        }
    }
}

/// Mounts the pseudo filesystem `fstype` at `at` unless it is there.
fn mount_once(fstype: &str, at: &str) -> Result<()> {
    if crate::sys::mount_at(Path::new(at))?.is_none() {
        cmd::run("mount", &["-t", fstype, fstype, at])?;
    }
    Ok(())
}
