//! A cgroup of the io controller's hierarchy for one test, and a process
//! in it: the agent names a stalled bio's pod or cgroup from the cgroup the
//! block layer charges the bio to (`health_node::volumes::waiters`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command};

use anyhow::{Context as _, Result};
use health_node::volumes::waiters::io_hierarchy;

/// Made under the hierarchy's root and removed on drop (on cgroup v2 with
/// the io controller enabled for the root's children first).
pub struct TestCgroup {
    dir: PathBuf,
    /// As the agent names it: the path from the hierarchy's root.
    pub path: String,
}

impl TestCgroup {
    pub fn new(name: &str) -> Result<Self> {
        let root = io_hierarchy(Path::new("/sys/fs/cgroup"), Path::new("/proc"))
            .map_err(anyhow::Error::msg)
            .context("the io controller's cgroup hierarchy")?;
        let control = root.join("cgroup.subtree_control");
        if control.is_file() {
            std::fs::write(&control, "+io")
                .with_context(|| format!("enabling io in {}", control.display()))?;
        }
        let path = format!("/volume-health-{name}-{}", std::process::id());
        let dir = root.join(&path[1..]);
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(TestCgroup { dir, path })
    }

    /// One O_DIRECT write of 4 KiB at `offset` (a multiple of 4 KiB) by
    /// `dd`, a process of this cgroup: it moves itself in, then execs.
    pub fn o_direct_write(&self, dev: &Path, offset: u64) -> Result<Child> {
        let script = format!(
            "echo $$ > {}/cgroup.procs && exec dd if=/dev/zero of={} bs=4096 count=1 seek={} oflag=direct conv=notrunc status=none",
            self.dir.display(),
            dev.display(),
            offset / 4096
        );
        Command::new("sh")
            .args(["-c", &script])
            .spawn()
            .context("starting dd")
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.dir) {
            eprintln!("removing {}: {e}", self.dir.display());
        }
    }
}
