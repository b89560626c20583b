//! The go command's build and module caches for one `components` run
//! (GOCACHE, GOMODCACHE), removed when it ends: the programs are kept by
//! version ([`super::gomod`]), and what built them (~6 GiB of compiled
//! packages, ~3 GiB of module sources for the four sets) is of no use
//! once they are built.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;

use crate::util::say;

/// GOCACHE and GOMODCACHE for the sets one run builds (they share the
/// standard library's packages and some modules), removed with this value.
pub struct GoCaches {
    dir: PathBuf,
}

impl GoCaches {
    /// `<cache>/.go-caches-<pid>`, created when a set is built; those of
    /// processes that are gone (killed mid-build) are removed first.
    pub fn new(cache: &Path) -> GoCaches {
        GoCaches {
            dir: cache.join(format!("{CACHES_PREFIX}{}", std::process::id())),
        }
    }

    /// Creates the folder, after removing those of gone processes.
    pub fn prepare(&self) -> anyhow::Result<()> {
        let cache = self.dir.parent().context("the go caches' parent")?;
        for entry in fs::read_dir(cache).with_context(|| format!("listing {}", cache.display()))? {
            let path = entry?.path();
            let pid = path
                .file_name()
                .and_then(|n| n.to_str()?.strip_prefix(CACHES_PREFIX)?.parse::<i32>().ok());
            if let Some(pid) = pid {
                if pid != std::process::id() as i32 && !process_exists(pid) {
                    remove_caches(&path)?;
                }
            }
        }
        fs::create_dir_all(&self.dir).with_context(|| format!("creating {}", self.dir.display()))
    }

    /// GOCACHE and GOMODCACHE for `cmd`.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("GOCACHE", self.dir.join("build"))
            .env("GOMODCACHE", self.dir.join("mod"));
    }
}

impl Drop for GoCaches {
    fn drop(&mut self) {
        if self.dir.exists() {
            if let Err(e) = remove_caches(&self.dir) {
                say(format!(
                    "go: could not remove {}: {e:#}",
                    self.dir.display()
                ));
            }
        }
    }
}

const CACHES_PREFIX: &str = ".go-caches-";

fn process_exists(pid: i32) -> bool {
    // Signal 0 checks only: EPERM means it exists under another user.
    !matches!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Removable as it is: every go command given these caches runs with
/// `-modcacherw` (`gomod::go`), so the module cache is not read-only.
fn remove_caches(dir: &Path) -> anyhow::Result<()> {
    fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_caches_of_gone_processes_are_removed_and_their_own_with_them() {
        let cache = tempfile::tempdir().unwrap();
        // A process that has exited, and pid 1, which lives.
        let mut child = Command::new("true").spawn().unwrap();
        let gone = child.id();
        child.wait().unwrap();
        let stale = cache.path().join(format!("{CACHES_PREFIX}{gone}"));
        let module = stale.join("mod/example.com/m@v1.0.0");
        fs::create_dir_all(&module).unwrap();
        fs::write(module.join("go.mod"), "module example.com/m\n").unwrap();
        let living = cache.path().join(format!("{CACHES_PREFIX}1"));
        fs::create_dir_all(&living).unwrap();
        let other = cache.path().join(".go-caches-x");
        fs::create_dir_all(&other).unwrap();

        let caches = GoCaches::new(cache.path());
        caches.prepare().unwrap();
        let mut cmd = Command::new("go");
        caches.apply(&mut cmd);
        let own = cache
            .path()
            .join(format!("{CACHES_PREFIX}{}", std::process::id()));
        let envs: Vec<_> = cmd.get_envs().collect();
        assert_eq!(
            envs,
            [
                ("GOCACHE".as_ref(), Some(own.join("build").as_os_str())),
                ("GOMODCACHE".as_ref(), Some(own.join("mod").as_os_str())),
            ]
        );
        assert!(!stale.exists());
        assert!(living.is_dir() && other.is_dir() && own.is_dir());
        drop(caches);
        assert!(!own.exists());
        assert!(living.is_dir());
    }
}
