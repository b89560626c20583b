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
