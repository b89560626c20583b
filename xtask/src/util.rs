//! Running commands with their output visible and failures explained.

use std::fs::File;
use std::path::{Path, PathBuf};
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

/// Cargo's target directory (`CARGO_TARGET_DIR`, else the workspace's).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"))
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

/// The cargo that runs xtask (rustup's proxy, the stable toolchain),
/// without the variables `cargo run` set for xtask itself.
///
/// Build scripts that read such a variable (ring's reads
/// CARGO_MANIFEST_DIR and CARGO_PKG_*) make cargo rebuild their crate
/// whenever its value changes; leaked from xtask (xtask's own manifest
/// directory and name), they made every build from `cargo xtask` and every
/// plain `cargo build` or `cargo test` rebuild ring, rustls, kube and all
/// above them for the other (minutes on 2 cores).
pub fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    without_cargo_run_env(&mut cmd);
    cmd
}

/// Leaves out of `cmd`'s environment what `cargo run` set for xtask (see
/// [`cargo`]).
pub fn without_cargo_run_env(cmd: &mut Command) -> &mut Command {
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(is_set_by_cargo_run) {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Whether cargo sets `key` for a binary it runs (about that package), as
/// opposed to configuration of the user's (CARGO_HOME, CARGO_TARGET_DIR,
/// CARGO_BUILD_*, ...), which is passed on.
fn is_set_by_cargo_run(key: &str) -> bool {
    key.starts_with("CARGO_PKG_")
        || matches!(
            key,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}

/// An exclusive lock on the file `path` (created, with its folder), held
/// until the value is dropped. When another process holds it, `waiting` is
/// said first, then this waits for it.
pub fn lock_exclusive(
    path: &Path,
    waiting: impl FnOnce() -> String,
) -> anyhow::Result<nix::fcntl::Flock<File>> {
    use nix::fcntl::{Flock, FlockArg};
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(lock),
        Err((file, _)) => {
            say(waiting());
            Flock::lock(file, FlockArg::LockExclusive)
                .map_err(|(_, e)| e)
                .with_context(|| format!("locking {}", path.display()))
        }
    }
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

#[cfg(test)]
mod tests {
    /// A second holder waits, having said so, until the first lets go.
    #[test]
    fn an_exclusive_lock_waits_for_its_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/.x.lock");
        let first = super::lock_exclusive(&path, || unreachable!("free at first")).unwrap();
        let (said_tx, said_rx) = std::sync::mpsc::channel();
        let second = std::thread::spawn(move || {
            let _lock = super::lock_exclusive(&path, move || {
                said_tx.send(()).unwrap();
                "waiting".into()
            })
            .unwrap();
        });
        said_rx.recv().unwrap();
        assert!(!second.is_finished());
        drop(first);
        second.join().unwrap();
    }

    #[test]
    fn only_what_cargo_run_sets_is_left_out_of_nested_cargo() {
        for key in [
            "CARGO_MANIFEST_DIR",
            "CARGO_MANIFEST_PATH",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "CARGO_CRATE_NAME",
            "CARGO_PRIMARY_PACKAGE",
        ] {
            assert!(super::is_set_by_cargo_run(key), "{key}");
        }
        for key in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_JOBS",
            "CARGO_TERM_COLOR",
            "RUSTUP_TOOLCHAIN",
            "HEALTH_EBPF_OBJECT",
        ] {
            assert!(!super::is_set_by_cargo_run(key), "{key}");
        }
    }

    /// The variables `cargo run` gives xtask (this test runs under cargo
    /// too, with the same ones) do not reach a nested cargo.
    #[test]
    fn nested_cargo_does_not_inherit_this_packages_variables() {
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let cmd = super::cargo();
        let removed: Vec<String> = cmd
            .get_envs()
            .filter(|(_, value)| value.is_none())
            .map(|(key, _)| key.to_string_lossy().into_owned())
            .collect();
        assert!(
            removed.iter().any(|k| k == "CARGO_MANIFEST_DIR"),
            "{removed:?}"
        );
        assert!(removed.iter().any(|k| k == "CARGO_PKG_NAME"), "{removed:?}");
        assert!(!removed.iter().any(|k| k == "CARGO_HOME"), "{removed:?}");
    }
}
