//! The kernel's SMB server (ksmbd) in a guest, sharing a filesystem of the
//! test's own over loopback, and SMB mounts of it by the kernel's CIFS
//! client: the guest suite `smb`.
//!
//! ksmbd's userspace half (ksmbd.mountd: users, shares, and the kernel's
//! questions about them over netlink) comes from Debian's ksmbd-tools,
//! unpacked by `cargo xtask vm` ([`crate::server_tools`]), not installed. The client needs no
//! helper: the kernel takes the share, address and credentials as mount
//! options (util-linux's mount calls mount(2) when `mount.cifs` is absent).
//!
//! ksmbd opens the share's path from its own kernel threads, which resolve
//! paths from the guest's root, not the test's: the overlays the guest
//! puts on /tmp and /var are not theirs (a share there fails its tree
//! connect, measured on 6.12: "failed to access"). The server's files
//! live under /run, a tmpfs both see.

use std::path::{Path, PathBuf};
use std::process::Child;

use anyhow::{Context, Result};

use crate::cmd;
use crate::fs::{Mount, RemoteMount};
use crate::server_tools::ServerTools;
use crate::sys::wait_for_port;

const SMB_PORT: u16 = 445;
const SHARE: &str = "share";
const USER: &str = "tester";
const PASSWORD: &str = "volume-health";

pub struct SmbServer {
    tools: ServerTools,
    /// The server's own files (configuration, user database) and the
    /// share's mount point, under /run.
    dir: PathBuf,
    share: PathBuf,
    mountd: Option<Child>,
    share_mount: Option<Mount>,
}

impl SmbServer {
    /// ext4 on `dev`, shared read-write as `\\127.0.0.1\share` to one
    /// user, the server running.
    pub fn start(dev: &Path) -> Result<SmbServer> {
        crate::require_root()?;
        let tools = ServerTools::from_env("SMB")?;
        crate::iscsi::loopback_up()?;
        crate::devices::modprobe("ksmbd", &[]).context(
            "loading ksmbd, the kernel's SMB server (in Linux since 5.15; Debian's 5.10 has none)",
        )?;
        crate::devices::modprobe("cifs", &[])?;
        // ksmbd.mountd writes its subauth file there whatever -c says.
        std::fs::create_dir_all("/etc/ksmbd").context("creating /etc/ksmbd")?;
        let dir = PathBuf::from(format!("/run/volume-health-smb-{}", std::process::id()));
        let share = dir.join(SHARE);
        std::fs::create_dir_all(&share).with_context(|| format!("creating {}", share.display()))?;
        // No blocks reserved for root: ksmbd writes with the caps of a
        // kernel thread, and a full share must be full for it too.
        crate::fs::mkfs(
            "mkfs.ext4",
            dev,
            &["-q", "-F", "-m", "0", "-E", "nodiscard"],
        )?;
        let share_mount = Mount::at(dev, &share, "ext4", "errors=continue")?;
        // ksmbd creates files as the share's user, no account here.
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&share, std::fs::Permissions::from_mode(0o777))?;
        std::fs::write(
            dir.join("ksmbd.conf"),
            format!(
                "[global]\n[{SHARE}]\n\tpath = {}\n\tread only = no\n",
                share.display()
            ),
        )
        .context("writing ksmbd.conf")?;
        let mut server = SmbServer {
            tools,
            dir,
            share,
            mountd: None,
            share_mount: Some(share_mount),
        };
        let (conf, users) = server.files();
        server.tool(
            "usr/sbin/ksmbd.adduser",
            &["-c", &conf, "-i", &users, "-a", USER, "-p", PASSWORD],
        )?;
        server.resume()?;
        Ok(server)
    }

    /// The shared directory, on the server's side.
    pub fn share(&self) -> &Path {
        &self.share
    }

    /// Stops the server (`ksmbd.control -s`: ksmbd.mountd ends and the
    /// kernel server closes its connections and stops listening).
    pub fn stop(&mut self) -> Result<()> {
        self.tool("usr/sbin/ksmbd.control", &["-s"])?;
        if let Some(mut mountd) = self.mountd.take() {
            mountd.wait().context("waiting for ksmbd.mountd to end")?;
        }
        Ok(())
    }

    /// Starts ksmbd.mountd (which starts the kernel server) and waits
    /// until 445 accepts.
    pub fn resume(&mut self) -> Result<()> {
        let (conf, users) = self.files();
        let mountd = self
            .tools
            .spawn("usr/sbin/ksmbd.mountd", &["-n", "-c", &conf, "-u", &users])?;
        self.mountd = Some(mountd);
        wait_for_port(SMB_PORT)
    }

    /// Mounts the share at `at` (an existing directory) with SMB 3.0 and
    /// `options` added.
    pub fn mount(&self, options: &str, at: &Path) -> Result<RemoteMount> {
        let mut all = format!("ip=127.0.0.1,username={USER},password={PASSWORD},vers=3.0");
        if !options.is_empty() {
            all = format!("{all},{options}");
        }
        let at_arg = at.to_string_lossy().into_owned();
        let source = format!("//127.0.0.1/{SHARE}");
        cmd::run("mount", &["-t", "cifs", "-o", &all, &source, &at_arg])
            .with_context(|| format!("mounting {source} at {}", at.display()))?;
        Ok(RemoteMount::new(at))
    }

    /// The configuration file and the user database.
    fn files(&self) -> (String, String) {
        let path = |name: &str| self.dir.join(name).display().to_string();
        (path("ksmbd.conf"), path("ksmbdpwd.db"))
    }

    /// Runs one of the unpacked programs.
    fn tool(&self, program: &str, args: &[&str]) -> Result<cmd::Output> {
        self.tools.run(program, args)
    }
}

impl Drop for SmbServer {
    fn drop(&mut self) {
        if self.mountd.is_some() {
            if let Err(e) = self.stop() {
                eprintln!("SmbServer cleanup: {e:#}");
            }
        }
        drop(self.share_mount.take());
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("SmbServer cleanup: removing {}: {e}", self.dir.display());
        }
    }
}
