//! The kernel's NFS server (knfsd) in a guest, exporting a filesystem of the
//! test's own over loopback, and NFS mounts of it: the guest suite `nfs`.
//!
//! The programs (rpc.nfsd, exportfs, rpc.mountd, nfsdcld, rpcbind,
//! mount.nfs) come from Debian's packages unpacked by `cargo xtask vm`
//! into its cache (`HEALTH_VM_NFS_TOOLS`, xtask/src/vm/nfs_tools.rs); they
//! are not installed on the machine. The daemons run in the foreground as
//! children of the test and are killed when the server is dropped.
//!
//! knfsd cannot export the guest's root (the host's, shared in): the
//! export is a filesystem the test made, mounted here, with `fsid=0` so
//! that NFSv4 clients mount it as `/`. nfsdcld running lets a restarted
//! server skip the NFSv4 grace period, so that opens work at once after
//! [`NfsServer::resume`].

use std::ffi::OsStr;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tempfile::TempDir;

use crate::cmd;
use crate::fs::Mount;

/// Where `cargo xtask vm` says the unpacked programs are.
const TOOLS_ENV: &str = "HEALTH_VM_NFS_TOOLS";
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
    tools: PathBuf,
    export: PathBuf,
    daemons: Vec<(&'static str, Child)>,
    _export_mount: Mount,
    _export_dir: TempDir,
}

impl NfsServer {
    /// ext4 on `dev`, exported read-write to 127.0.0.1, the server running.
    pub fn start(dev: &Path) -> Result<NfsServer> {
        crate::require_root()?;
        let tools = std::env::var_os(TOOLS_ENV)
            .map(PathBuf::from)
            .with_context(|| {
                format!(
                    "{TOOLS_ENV} is not set: the NFS suite runs in `cargo xtask vm` guests, \
                 which unpack Debian's NFS programs for it"
                )
            })?;
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
        std::fs::write(
            "/etc/exports",
            format!(
                "{} 127.0.0.1(rw,fsid=0,no_root_squash,insecure,no_subtree_check,sync)\n",
                server.export.display()
            ),
        )
        .context("writing /etc/exports")?;
        server.tool("usr/sbin/exportfs", &["-ra"])?;
        server.spawn("rpc.mountd", "usr/sbin/rpc.mountd", &["-F"])?;
        server.spawn("nfsdcld", "usr/sbin/nfsdcld", &["-F"])?;
        server.resume()?;
        Ok(server)
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
    pub fn mount(&self, version: Version, options: &str, at: &Path) -> Result<NfsMount> {
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
        Ok(NfsMount {
            path: at.to_path_buf(),
        })
    }

    /// Runs one of the unpacked programs, its libraries first.
    fn tool(&self, program: &str, args: &[&str]) -> Result<cmd::Output> {
        let path = self.tools.join(program);
        let libs = self.library_path();
        cmd::run_env(
            &path.to_string_lossy(),
            args,
            &[("LD_LIBRARY_PATH", OsStr::new(&libs))],
        )
    }

    fn library_path(&self) -> String {
        ["lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu"]
            .iter()
            .map(|d| self.tools.join(d).display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    /// Starts a daemon in the foreground, its output discarded; it must
    /// still run a moment later.
    fn spawn(&mut self, name: &'static str, program: &str, args: &[&str]) -> Result<()> {
        let mut child = Command::new(self.tools.join(program))
            .args(args)
            .env("LD_LIBRARY_PATH", self.library_path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        std::thread::sleep(Duration::from_millis(300));
        if let Some(status) = child.try_wait()? {
            bail!("{name} exited at once ({status})");
        }
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

/// An NFS mount of the test's, unmounted on drop: forced and lazy, since
/// the server may be gone by then.
pub struct NfsMount {
    path: PathBuf,
}

impl NfsMount {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for NfsMount {
    fn drop(&mut self) {
        let flags = nix::mount::MntFlags::MNT_FORCE | nix::mount::MntFlags::MNT_DETACH;
        if let Err(e) = nix::mount::umount2(&self.path, flags) {
            eprintln!("unmounting NFS at {}: {e}", self.path.display());
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

/// Waits until 127.0.0.1:`port` accepts a connection (10 s at most).
fn wait_for_port(port: u16) -> Result<()> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let accepts = || TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok();
    if !crate::sys::wait_for(Duration::from_secs(10), Duration::from_millis(100), accepts) {
        bail!("nothing accepts on {addr} after 10 s");
    }
    Ok(())
}
