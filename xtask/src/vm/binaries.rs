//! The programs the guests run most, on a disk of their own.
//!
//! virtme-ng shares the host's root with the guest over 9p without a cache,
//! and under TCG that reads at about 3 MB/s: in a 6.12 guest the agent (an
//! 80 MB release binary) took 13-30 s to start from the shared root and
//! 4.6-4.9 s from a guest disk, and a copy of it over 9p 27 s (2026-12-01).
//! The suites start an agent in almost every test, so the agent and the
//! test binaries go into an ext4 image made here (`mkfs.ext4 -d`, a second
//! or two), attached read-only to every guest as a virtio disk and mounted
//! at [`MOUNT`]; the steps' commands, `HEALTH_AGENT_BIN` and
//! `FAULTDISK_BIN` name the copies there. A disk's pages stay in the guest's page cache like any other, so
//! only the first start reads them.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};
use tempfile::TempDir;

use super::devices::BINARIES_SERIAL as SERIAL;
use super::script::{Env, Step};
use crate::util::run;

/// By path: a user's PATH (the unprivileged tests') lacks /sbin.
const MKFS: &str = "/sbin/mkfs.ext4";
/// Where the guest mounts it.
pub const MOUNT: &str = "/run/xtask-vm-bin";
/// Room for ext4's own metadata beyond the files (their sizes rounded up
/// to blocks, the journal, inode tables): about 4 % of the size and at
/// least this much.
const SLACK: u64 = 64 << 20;

/// The image and where each host program is found in the guest.
pub struct BinariesDisk {
    /// Removed with the disk.
    _dir: TempDir,
    pub image: PathBuf,
    /// (host path, guest path).
    map: Vec<(PathBuf, String)>,
}

impl BinariesDisk {
    /// An image holding `programs` (host paths; duplicates once).
    pub fn make(programs: &[PathBuf]) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("xtask-vm-bin-")
            .tempdir()
            .context("creating a directory for the guests' binaries disk")?;
        let files = dir.path().join("files");
        fs::create_dir(&files).with_context(|| format!("creating {}", files.display()))?;
        let mut map: Vec<(PathBuf, String)> = Vec::new();
        let mut bytes = 0;
        for program in programs {
            if map.iter().any(|(host, _)| host == program) {
                continue;
            }
            let name = guest_name(program, map.len())?;
            let staged = files.join(&name);
            // A hard link costs nothing; a copy where the two are on
            // different filesystems.
            if fs::hard_link(program, &staged).is_err() {
                fs::copy(program, &staged).with_context(|| {
                    format!("copying {} to {}", program.display(), staged.display())
                })?;
            }
            bytes += fs::metadata(&staged)
                .with_context(|| format!("reading {}", staged.display()))?
                .len();
            map.push((program.clone(), format!("{MOUNT}/{name}")));
        }
        let image = dir.path().join("binaries.img");
        let size = bytes + (bytes / 25).max(SLACK);
        // Made first: mkfs.ext4 says so when it creates the file, -q or not.
        fs::File::create(&image).with_context(|| format!("creating {}", image.display()))?;
        run(Command::new(MKFS)
            .args(["-q", "-F", "-E", "nodiscard", "-d"])
            .arg(&files)
            .arg(&image)
            .arg(format!("{}k", size.div_ceil(1024))))
        .context("making the guests' binaries disk (mkfs.ext4 -d, package e2fsprogs)")?;
        fs::remove_dir_all(&files).with_context(|| format!("removing {}", files.display()))?;
        Ok(Self {
            _dir: dir,
            image,
            map,
        })
    }

    /// The guest's path of host program `path`, if it is on the disk.
    fn guest_path(&self, path: &str) -> Option<&str> {
        self.map
            .iter()
            .find(|(host, _)| host.as_os_str() == path)
            .map(|(_, guest)| guest.as_str())
    }

    /// `steps` and `env` naming the disk's copies instead of the host's
    /// programs: each step's program, and every variable whose value is one.
    pub fn rewrite(&self, steps: &mut [Step], env: &mut Env) {
        for step in steps {
            if let Some(guest) = step.argv.first().and_then(|p| self.guest_path(p)) {
                step.argv[0] = guest.to_string();
            }
        }
        for (_, value) in env.iter_mut() {
            if let Some(guest) = self.guest_path(value) {
                *value = guest.to_string();
            }
        }
    }
}

/// The program's file name, prefixed with its index (two test binaries of
/// different builds may share a name).
fn guest_name(program: &Path, index: usize) -> anyhow::Result<String> {
    let Some(name) = program.file_name().and_then(|n| n.to_str()) else {
        bail!("{}: not a program's path", program.display());
    };
    Ok(format!("{index}-{name}"))
}

/// The guest script's lines that mount the disk read-only at [`MOUNT`], or
/// end the run: without it the steps' programs do not exist. `d` is the
/// guest's directory, quoted for sh.
pub fn mount_lines(d: &str) -> String {
    format!(
        "{find}\
         if [ -z \"$bin\" ] || ! mkdir -p {MOUNT} || ! mount -t ext4 -o ro,noload $bin {MOUNT}; then \
         echo 'xtask vm: could not mount the binaries disk (serial {SERIAL}) at {MOUNT}' >&2; \
         echo 1 > {d}/status.tmp && mv {d}/status.tmp {d}/status; exit 1; fi\n",
        find = super::devices::find_by_serial("bin", SERIAL)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(argv: &[&str]) -> Step {
        Step {
            label: "s".into(),
            cwd: PathBuf::from("/"),
            argv: argv.iter().map(|s| s.to_string()).collect(),
            only: None,
        }
    }

    #[test]
    fn the_disk_holds_each_program_once_and_the_steps_name_its_copies() {
        let src = tempfile::tempdir().unwrap();
        let agent = src.path().join("health-agent");
        let guest = src.path().join("guest-0123");
        fs::write(&agent, b"agent").unwrap();
        fs::write(&guest, b"guest").unwrap();
        let disk = BinariesDisk::make(&[agent.clone(), guest.clone(), agent.clone()]).unwrap();
        assert_eq!(disk.map.len(), 2);
        let mut steps = vec![
            step(&[guest.to_str().unwrap(), "--exact", "a::b"]),
            step(&["/bin/true"]),
        ];
        let mut env = vec![
            ("HEALTH_AGENT_BIN".to_string(), agent.display().to_string()),
            ("PATH".to_string(), "/usr/bin".to_string()),
        ];
        disk.rewrite(&mut steps, &mut env);
        assert_eq!(
            steps[0].argv,
            [format!("{MOUNT}/1-guest-0123").as_str(), "--exact", "a::b"]
        );
        assert_eq!(steps[1].argv, ["/bin/true"]);
        assert_eq!(env[0].1, format!("{MOUNT}/0-health-agent"));
        assert_eq!(env[1].1, "/usr/bin");
        // The image is an ext4 with both files in it.
        let out = Command::new("/sbin/debugfs")
            .args(["-R", "ls -l /"])
            .arg(&disk.image)
            .output()
            .unwrap();
        let listing = String::from_utf8_lossy(&out.stdout);
        assert!(listing.contains("0-health-agent"), "{listing}");
        assert!(listing.contains("1-guest-0123"), "{listing}");
        // Each holds its program's bytes.
        for (name, bytes) in [("0-health-agent", "agent"), ("1-guest-0123", "guest")] {
            let out = Command::new("/sbin/debugfs")
                .args(["-R", &format!("cat /{name}")])
                .arg(&disk.image)
                .output()
                .unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), bytes, "{name}");
        }
    }
}
