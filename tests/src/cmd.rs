//! Running the external tools the harness needs, with errors that say what is missing.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// How long any tool may run before the harness gives up on it.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// Debian package providing each tool the harness may call, for the error message.
const PACKAGES: &[(&str, &str)] = &[
    ("losetup", "mount"),
    ("mount", "mount"),
    ("umount", "mount"),
    ("sfdisk", "fdisk"),
    ("blkdiscard", "util-linux"),
    ("mkfs.ext4", "e2fsprogs"),
    ("filefrag", "e2fsprogs"),
    ("mkfs.xfs", "xfsprogs"),
    ("xfs_io", "xfsprogs"),
    ("mkfs.btrfs", "btrfs-progs"),
    ("btrfs", "btrfs-progs"),
    ("btrfs-map-logical", "btrfs-progs"),
    ("fusermount3", "fuse3"),
    ("dmsetup", "dmsetup"),
    ("mdadm", "mdadm"),
    ("udevadm", "udev"),
    ("partx", "util-linux"),
    ("blkid", "util-linux"),
    ("etcd", "etcd-server"),
    ("openssl", "openssl"),
    // tests/tests/host/image.rs: the OCI image read by independent tools, the
    // agent run from its root filesystem.
    ("skopeo", "skopeo"),
    ("umoci", "umoci"),
    ("unshare", "util-linux"),
    ("chroot", "coreutils"),
    ("timeout", "coreutils"),
    ("readelf", "binutils"),
    ("qemu-aarch64", "qemu-user"),
    ("qemu-system-aarch64", "qemu-system-arm"),
    ("cpio", "cpio"),
    ("xz", "xz-utils"),
    ("debugfs", "e2fsprogs"),
];

/// What tests/tests/host/image.rs drives: the OCI image read by skopeo and umoci,
/// the agent run from its root filesystem, the arm64 one under qemu-user
/// and in aarch64 guests (`cargo xtask test` installs them).
pub const IMAGE_TEST_TOOLS: &[&str] = &[
    "skopeo",
    "umoci",
    "unshare",
    "chroot",
    "timeout",
    "readelf",
    "qemu-aarch64",
    "qemu-system-aarch64",
    "cpio",
    "xz",
    "debugfs",
];

/// Debian package that ships `tool`, if the harness knows it.
pub fn package_of(tool: &str) -> Option<&'static str> {
    PACKAGES.iter().find(|(t, _)| *t == tool).map(|(_, p)| *p)
}

/// Directories searched after $PATH: the sbin dirs are often missing from a test
/// runner's PATH although root's tools live there.
const EXTRA_DIRS: &[&str] = &["/usr/local/sbin", "/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// Full path of `tool`, or an error naming the Debian package to install.
pub fn find_tool(tool: &str) -> Result<PathBuf> {
    let path_var = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path_var)
        .chain(EXTRA_DIRS.iter().map(PathBuf::from))
        .filter(|d| !d.as_os_str().is_empty());
    for dir in dirs {
        let candidate = dir.join(tool);
        if is_executable(&candidate) {
            return Ok(candidate);
        }
    }
    match package_of(tool) {
        Some(pkg) => bail!(
            "required tool `{tool}` not found in PATH or {}: install the Debian package \
             `{pkg}` (apt-get install {pkg})",
            EXTRA_DIRS.join(", ")
        ),
        None => bail!(
            "required tool `{tool}` not found in PATH or {}",
            EXTRA_DIRS.join(", ")
        ),
    }
}

/// Checks every tool in `tools` is installed; the error lists all missing ones.
pub fn require_tools(tools: &[&str]) -> Result<()> {
    let missing: Vec<String> = tools
        .iter()
        .filter_map(|t| find_tool(t).err().map(|e| format!("{e:#}")))
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        bail!("{}", missing.join("; "))
    }
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Output of a finished command.
#[derive(Debug, Clone)]
pub struct Output {
    pub stdout: String,
    pub stderr: String,
}

/// Shell-ish rendering of a command line for error messages.
pub fn display_command(tool: &str, args: &[&OsStr]) -> String {
    let mut s = tool.to_string();
    for a in args {
        s.push(' ');
        let text = a.to_string_lossy();
        if text.is_empty() || text.bytes().any(|b| b.is_ascii_whitespace()) {
            s.push('\'');
            s.push_str(&text);
            s.push('\'');
        } else {
            s.push_str(&text);
        }
    }
    s
}

/// Runs `tool args...` and fails unless it exits 0 within [`DEFAULT_TIMEOUT`].
pub fn run<S: AsRef<OsStr>>(tool: &str, args: &[S]) -> Result<Output> {
    run_timeout(tool, args, DEFAULT_TIMEOUT)
}

/// Runs `tool args...` with stdin closed, collecting stdout/stderr; fails unless it exits
/// 0 within `timeout`. The error names the full command line, the status and stderr.
pub fn run_timeout<S: AsRef<OsStr>>(tool: &str, args: &[S], timeout: Duration) -> Result<Output> {
    run_full(tool, args, None, &[], timeout)
}

/// Like [`run`], with `env` added to the tool's environment.
pub fn run_env<S: AsRef<OsStr>>(tool: &str, args: &[S], env: &[(&str, &OsStr)]) -> Result<Output> {
    run_full(tool, args, None, env, DEFAULT_TIMEOUT)
}

/// Like [`run`], feeding `input` to the tool's stdin.
pub fn run_input<S: AsRef<OsStr>>(tool: &str, args: &[S], input: &[u8]) -> Result<Output> {
    run_full(tool, args, Some(input.to_vec()), &[], DEFAULT_TIMEOUT)
}

fn run_full<S: AsRef<OsStr>>(
    tool: &str,
    args: &[S],
    input: Option<Vec<u8>>,
    env: &[(&str, &OsStr)],
    timeout: Duration,
) -> Result<Output> {
    let args: Vec<&OsStr> = args.iter().map(|a| a.as_ref()).collect();
    let shown = display_command(tool, &args);
    let exe = find_tool(tool).with_context(|| format!("cannot run `{shown}`"))?;
    let mut child = Command::new(&exe)
        .args(&args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Stable, untranslated messages for the error text.
        .env("LC_ALL", "C")
        .envs(env.iter().copied())
        .spawn()
        .with_context(|| format!("cannot start `{shown}` ({})", exe.display()))?;
    let pid = child.id();
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        // Written on its own thread: a tool that prints before reading all its input
        // must not deadlock against us. Dropping stdin at the end sends EOF.
        std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
    }
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();

    // The waiting happens on a helper thread so this one can give up after `timeout`
    // without polling; the child stays unreaped (a zombie keeps its pid) until that
    // thread's wait returns, so killing `pid` below can never hit a recycled pid.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut out = Vec::new();
        let mut err = Vec::new();
        // stderr is read on yet another thread: a tool filling one pipe while we block
        // on the other would otherwise deadlock.
        let err_thread = stderr.take().map(|mut e| {
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = e.read_to_end(&mut buf);
                buf
            })
        });
        if let Some(o) = stdout.as_mut() {
            let _ = o.read_to_end(&mut out);
        }
        if let Some(t) = err_thread {
            err = t.join().unwrap_or_default();
        }
        let status = child.wait();
        let _ = tx.send((status, out, err));
    });

    let (status, out, err) = match rx.recv_timeout(timeout) {
        Ok(v) => v,
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            bail!("`{shown}` did not finish within {timeout:?}; killed it (pid {pid})");
        }
    };
    let status = status.with_context(|| format!("waiting for `{shown}`"))?;
    let stdout = String::from_utf8_lossy(&out).into_owned();
    let stderr = String::from_utf8_lossy(&err).into_owned();
    if !status.success() {
        bail!(
            "`{shown}` failed ({status}): {}",
            first_lines(if stderr.trim().is_empty() {
                &stdout
            } else {
                &stderr
            })
        );
    }
    Ok(Output { stdout, stderr })
}

/// The text trimmed to at most a few lines, for error messages.
pub fn first_lines(text: &str) -> String {
    let lines: Vec<&str> = text.trim().lines().take(8).collect();
    if lines.is_empty() {
        "(no output)".to_string()
    } else {
        lines.join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_tool_names_package() {
        let err = find_tool("mkfs.definitely-not-here").unwrap_err();
        assert!(format!("{err}").contains("mkfs.definitely-not-here"));
        assert_eq!(package_of("mkfs.xfs"), Some("xfsprogs"));
        assert_eq!(package_of("losetup"), Some("mount"));
    }

    #[test]
    fn failing_command_reports_stderr() {
        let err = run("ls", &["/definitely/not/here"]).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("ls /definitely/not/here"), "{msg}");
        assert!(msg.contains("No such file"), "{msg}");
    }

    #[test]
    fn timeout_kills() {
        let err = run_timeout("sleep", &["5"], Duration::from_millis(200)).unwrap_err();
        assert!(format!("{err}").contains("did not finish"));
    }
}
