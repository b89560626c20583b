//! Running commands with their output visible and failures explained.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};

/// The workspace root (xtask lives one level below it).
pub fn workspace_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .expect("xtask sits inside the workspace")
        .to_path_buf()
}

pub fn say(msg: impl AsRef<str>) {
    eprintln!("xtask: {}", msg.as_ref());
}

/// Runs `cmd`, streaming its output; fails with the command line on a
/// non-zero exit.
pub fn run(cmd: &mut Command) -> anyhow::Result<()> {
    let line = format!("{cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {line}"))?;
    if !status.success() {
        bail!("{line} failed with {status}");
    }
    Ok(())
}

/// Runs `cmd` in the foreground until it exits, and returns how it
/// exited. A terminal's Ctrl-C reaches it too (the whole process group is
/// signalled): it cleans up and exits, and this process waits for that
/// instead of dying first. SIGINT is ignored here only once `cmd` started,
/// with the default disposition.
pub fn run_foreground(cmd: &mut Command) -> anyhow::Result<std::process::ExitStatus> {
    use nix::sys::signal::{signal, SigHandler, Signal};
    let line = format!("{cmd:?}");
    let mut child = cmd.spawn().with_context(|| format!("starting {line}"))?;
    // SAFETY: setting a signal to SIG_IGN runs no handler code.
    let previous = unsafe { signal(Signal::SIGINT, SigHandler::SigIgn) };
    let status = child.wait().with_context(|| format!("waiting for {line}"));
    if let Ok(previous) = previous {
        // SAFETY: restores the disposition read above.
        let _ = unsafe { signal(Signal::SIGINT, previous) };
    }
    status
}

/// Runs `cmd` and returns its stdout.
pub fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let line = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("starting {line}"))?;
    if !out.status.success() {
        bail!(
            "{line} failed with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The cargo that runs xtask (rustup's proxy, the stable toolchain).
pub fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

/// `name` found in a directory of PATH, as a shell would find it.
pub fn on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            p.metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

/// The one file ending in `.extension` that `what` left in `dir` (a download
/// or an unpacking); any other number is an error.
pub fn single_file(dir: &std::path::Path, extension: &str, what: &str) -> anyhow::Result<PathBuf> {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    match found.as_slice() {
        [one] => Ok(one.clone()),
        _ => bail!(
            "{what} left {} .{extension} files in {}",
            found.len(),
            dir.display()
        ),
    }
}

/// Moves the folder `staged` to `dir`, replacing what was there: a tool in
/// the cache is either whole or absent, never half unpacked.
pub fn replace_dir(staged: &std::path::Path, dir: &std::path::Path) -> anyhow::Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::rename(staged, dir)
        .with_context(|| format!("moving {} to {}", staged.display(), dir.display()))
}
