//! A private BPF filesystem for one test: every mount of bpffs is its own
//! instance, so what an agent pins there is seen by no other test, and
//! unmounting it drops every pin (links detach with their last reference).
//! The tracer witness kept with the pins is in tracefs, not here, so it is
//! removed first, as `health-agent uninstall` does.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use tempfile::TempDir;

pub struct Bpffs {
    dir: TempDir,
}

impl Bpffs {
    pub fn mount() -> Result<Bpffs> {
        let dir = tempfile::Builder::new().prefix("bpffs-").tempdir()?;
        nix::mount::mount(
            Some("bpf"),
            dir.path(),
            Some("bpf"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .with_context(|| format!("mounting bpffs at {}", dir.path().display()))?;
        Ok(Bpffs { dir })
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The directory to give the agent as `--pin-dir`.
    pub fn pin_dir(&self) -> PathBuf {
        self.dir.path().join("volume-health")
    }

    pub fn pin_dir_arg(&self) -> String {
        self.pin_dir().to_string_lossy().into_owned()
    }

    /// Sorted names in `dir` relative to the pin directory (empty when it
    /// does not exist).
    pub fn entries(&self, rel: &str) -> Vec<String> {
        let dir = if rel.is_empty() {
            self.pin_dir()
        } else {
            self.pin_dir().join(rel)
        };
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .map(|d| {
                d.filter_map(Result::ok)
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        if let Err(e) = remove_witness(&self.pin_dir()) {
            eprintln!(
                "removing the tracer witness of {}: {e:#}",
                self.pin_dir().display()
            );
        }
        if let Err(e) = nix::mount::umount2(self.dir.path(), nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("unmounting bpffs {}: {e}", self.dir.path().display());
        }
    }
}

/// Removes the tracefs instance an agent keeps with the pins at `pin_dir`,
/// if any: with the pins gone it would wait for the next agent's start.
fn remove_witness(pin_dir: &Path) -> Result<()> {
    use health_kernel::probes::pins;
    use health_kernel::{tracefs::Tracefs, tracer_count};
    let Some(layout) = pins::committed_layout(pin_dir)? else {
        return Ok(());
    };
    let id = pins::stats_map_id(&layout)?;
    let tracefs = Tracefs::locate(Path::new("/sys"))?;
    tracer_count::remove_pinned(tracefs.root(), id)?;
    Ok(())
}
