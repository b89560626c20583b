//! Kernel state that outlives the agent process: the object's maps, its
//! programs and their links, pinned under bpffs, so a restarted agent (a
//! crash, an OOM kill, a rolling update) adopts programs that never stopped
//! counting.
//!
//! One directory per kernel-side layout:
//!
//! ```text
//! <root>/<stamp>/maps/<MAP>          every map but the object's data sections
//! <root>/<stamp>/programs/<PROGRAM>  every program loaded
//! <root>/<stamp>/links/<PROGRAM>     every attachment: keeps its program attached
//! ```
//!
//! The stamp hashes everything that fixes the kernel side: the embedded
//! object's bytes and every load-time option (field offsets, the
//! `block_rq_complete` mode, the sample rate, the bio errors mode). An agent
//! adopts the directory of its own stamp; every other entry under `<root>` is
//! another layout and is removed first (removing a link's last pin detaches
//! it; maps and programs go with their last reference). A new directory is
//! built under a `partial-` name and renamed when complete, so a crash while
//! pinning never leaves a directory that looks adoptable.

use std::fmt::Display;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use aya::maps::MapInfo;
use aya::programs::links::FdLink;
use aya::programs::{ProgramFd, ProgramInfo};
use aya::Ebpf;
use nix::fcntl::{Flock, FlockArg};

/// Where the DaemonSet's agents pin (the host's bpffs is mounted there).
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/volume-health";

const MAPS: &str = "maps";
const PROGRAMS: &str = "programs";
const LINKS: &str = "links";
/// bpffs refuses names with a dot, so the unfinished directory of a stamp
/// is told apart by this prefix.
const PARTIAL: &str = "partial-";
/// `BPF_FS_MAGIC` of include/uapi/linux/magic.h.
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

#[derive(Debug, thiserror::Error)]
pub enum PinError {
    #[error(
        "{0} is not on a BPF filesystem (mount one with `mount -t bpf bpf /sys/fs/bpf`, \
         or run with --no-pin)"
    )]
    NotBpffs(PathBuf),
    #[error(
        "{0}: managing the agent's pinned kernel state needs root (CAP_SYS_ADMIN and CAP_BPF)"
    )]
    NotRoot(PathBuf),
    #[error(
        "another agent holds the pinned kernel state at {0}: stop it first, or give this \
         one --no-pin or another --pin-dir"
    )]
    InUse(PathBuf),
    #[error("{what} {}", path.display())]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("pinning {what} {name}: {detail}")]
    Pin {
        what: &'static str,
        name: String,
        detail: String,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> PinError + 'a {
    move |source| PinError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The stamp of a kernel-side layout: FNV-1a (64 bit) over `parts`, in hex.
/// Written here rather than taken from a crate because it must stay the
/// same across builds and Rust versions (std's hasher promises neither),
/// and it guards against mismatch, not against an adversary.
pub fn stamp(parts: &[&[u8]]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        // The length first, so that moving bytes between parts changes it.
        for b in (part.len() as u64).to_le_bytes().iter().chain(part.iter()) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    format!("{h:016x}")
}

/// The pinned state of one layout, adopted or being built.
#[derive(Debug)]
pub struct PinSet {
    /// The directory in use: `<root>/partial-<stamp>` until committed.
    dir: PathBuf,
    committed: PathBuf,
    adopted: bool,
    /// The kernel ids of the `STATS` maps of layouts removed here (what
    /// the tracer witness kept with them is named for).
    replaced: Vec<u32>,
    /// An exclusive lock on `<root>` for as long as this process runs: two
    /// agents on one pin directory would steal each other's samples (one
    /// ring buffer), or one would remove the other's programs (another
    /// stamp). The kernel drops it when the process dies, however it dies.
    _lock: Flock<File>,
}

impl PinSet {
    /// Adopts `<root>/<stamp>` when it exists; otherwise removes whatever
    /// else `<root>` holds (another layout, or a build that never finished)
    /// and starts a new directory.
    pub fn open(root: &Path, stamp: &str) -> Result<PinSet, PinError> {
        check_root(root)?;
        std::fs::create_dir_all(root).map_err(io_err("creating", root))?;
        let lock = lock(root)?;
        let committed = root.join(stamp);
        let mut replaced = Vec::new();
        for entry in std::fs::read_dir(root).map_err(io_err("reading", root))? {
            let entry = entry.map_err(io_err("reading", root))?;
            if entry.file_name().to_str() == Some(stamp) {
                continue;
            }
            let path = entry.path();
            tracing::info!(
                "removing pinned kernel state of another layout: {}",
                path.display()
            );
            // A build that never finished may have no STATS pinned.
            if let Ok(id) = stats_map_id(&path) {
                replaced.push(id);
            }
            remove(&path)?;
        }
        if committed.join(MAPS).is_dir() {
            tracing::info!(
                "adopting the pinned kernel state at {}",
                committed.display()
            );
            return Ok(PinSet {
                dir: committed.clone(),
                committed,
                adopted: true,
                replaced,
                _lock: lock,
            });
        }
        if committed.exists() {
            remove(&committed)?;
        }
        let dir = root.join(format!("{PARTIAL}{stamp}"));
        for sub in [MAPS, PROGRAMS, LINKS] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path).map_err(io_err("creating", &path))?;
        }
        Ok(PinSet {
            dir,
            committed,
            adopted: false,
            replaced,
            _lock: lock,
        })
    }

    /// Whether this process found the state of an earlier one.
    pub fn adopted(&self) -> bool {
        self.adopted
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// See `replaced` in [`PinSet`].
    pub fn replaced(&self) -> &[u32] {
        &self.replaced
    }

    /// The maps pinned so far, by name (for `EbpfLoader::map_pin_path`).
    pub fn pinned_maps(&self) -> Result<Vec<(String, PathBuf)>, PinError> {
        let dir = self.dir.join(MAPS);
        let mut out = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io_err("reading", &dir))? {
            let entry = entry.map_err(io_err("reading", &dir))?;
            if let Some(name) = entry.file_name().to_str() {
                out.push((name.to_string(), entry.path()));
            }
        }
        out.sort();
        Ok(out)
    }

    /// Pins every map of `ebpf` not pinned yet. The data sections
    /// (`.rodata`, `.bss`) are left out: aya writes and freezes them at
    /// load, which a pinned, frozen one refuses, and each load makes them
    /// again from the same object (the stamp says so).
    pub fn pin_maps(&self, ebpf: &Ebpf) -> Result<(), PinError> {
        for (name, map) in ebpf.maps() {
            if name.starts_with('.') {
                continue;
            }
            let path = self.dir.join(MAPS).join(name);
            if path.exists() {
                continue;
            }
            map.pin(&path).map_err(|e| PinError::Pin {
                what: "map",
                name: name.to_string(),
                detail: e.to_string(),
            })?;
        }
        Ok(())
    }

    /// Whether `program` has a pinned link: it is attached and counting.
    pub fn has_link(&self, program: &str) -> bool {
        self.dir.join(LINKS).join(program).exists()
    }

    /// Pins a loaded program (its fdinfo shows the runs the kernel skipped).
    fn pin_program(&self, ebpf: &mut Ebpf, program: &str) -> Result<(), PinError> {
        let path = self.dir.join(PROGRAMS).join(program);
        if path.exists() {
            return Ok(());
        }
        let p = ebpf.program_mut(program).ok_or_else(|| PinError::Pin {
            what: "program",
            name: program.to_string(),
            detail: "not in the kernel object".into(),
        })?;
        p.pin(&path).map_err(|e| PinError::Pin {
            what: "program",
            name: program.to_string(),
            detail: e.to_string(),
        })
    }

    /// Pins the link of `program`'s attachment, of any program type whose
    /// link is a bpf link (tracepoints are perf links since 5.15; fentry and
    /// BTF tracepoints always are). The link stays attached once pinned.
    fn keep_link<L>(&self, program: &str, link: L) -> Result<(), PinError>
    where
        L: TryInto<FdLink>,
        L::Error: Display,
    {
        let fail = |detail: String| PinError::Pin {
            what: "link of",
            name: program.to_string(),
            detail,
        };
        let link: FdLink = link.try_into().map_err(|e| fail(e.to_string()))?;
        link.pin(self.dir.join(LINKS).join(program))
            .map_err(|e| fail(e.to_string()))?;
        Ok(())
    }

    /// Pins a link just attached and its program (whose fdinfo shows the
    /// runs the kernel skipped): what every attach does to outlive this
    /// process.
    pub fn keep_attached<L>(&self, ebpf: &mut Ebpf, program: &str, link: L) -> Result<(), PinError>
    where
        L: TryInto<FdLink>,
        L::Error: Display,
    {
        self.keep_link(program, link)?;
        self.pin_program(ebpf, program)
    }

    /// Makes a new directory adoptable; a no-op for an adopted one.
    pub fn commit(&mut self) -> Result<(), PinError> {
        if self.dir != self.committed {
            std::fs::rename(&self.dir, &self.committed).map_err(io_err("renaming", &self.dir))?;
            self.dir = self.committed.clone();
        }
        Ok(())
    }

    /// Descriptors of every pinned program (for their run statistics).
    pub fn program_fds(&self) -> Vec<ProgramFd> {
        let dir = self.dir.join(PROGRAMS);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| ProgramInfo::from_pin(e.path()).and_then(|i| i.fd()).ok())
            .collect()
    }
}

/// The committed layout directory under `root`, if an agent left one.
pub fn committed_layout(root: &Path) -> Result<Option<PathBuf>, PinError> {
    check_root(root)?;
    if !root.exists() {
        return Ok(None);
    }
    let mut found = None;
    for entry in std::fs::read_dir(root).map_err(io_err("reading", root))? {
        let entry = entry.map_err(io_err("reading", root))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with(PARTIAL) && entry.path().join(MAPS).is_dir() {
            found = Some(entry.path());
        }
    }
    Ok(found)
}

/// A pinned map of a committed layout directory.
pub fn map_path(layout: &Path, name: &str) -> PathBuf {
    layout.join(MAPS).join(name)
}

/// The kernel id of a layout's pinned `STATS` map: what the pinned state
/// is known by outside bpffs (the tracer witness kept with it is named for
/// it).
pub fn stats_map_id(layout: &Path) -> Result<u32, aya::maps::MapError> {
    MapInfo::from_pin(map_path(layout, "STATS")).map(|info| info.id())
}

/// What `uninstall` removed.
#[derive(Debug, PartialEq, Eq)]
pub struct Removed {
    pub links: usize,
    pub programs: usize,
    pub maps: usize,
}

/// Removes every pin under `root` and `root` itself: the links detach, and
/// programs and maps are freed once no process holds them. `None` when
/// nothing was pinned.
pub fn uninstall(root: &Path) -> Result<Option<Removed>, PinError> {
    // Without root, a pin directory it cannot read would look empty.
    if !nix::unistd::geteuid().is_root() {
        return Err(PinError::NotRoot(root.to_path_buf()));
    }
    check_root(root)?;
    if !root.exists() {
        return Ok(None);
    }
    let _lock = lock(root)?;
    let mut removed = Removed {
        links: 0,
        programs: 0,
        maps: 0,
    };
    for entry in std::fs::read_dir(root).map_err(io_err("reading", root))? {
        let layout = entry.map_err(io_err("reading", root))?.path();
        for (sub, n) in [
            (LINKS, &mut removed.links),
            (PROGRAMS, &mut removed.programs),
            (MAPS, &mut removed.maps),
        ] {
            if let Ok(entries) = std::fs::read_dir(layout.join(sub)) {
                *n += entries.count();
            }
        }
    }
    remove(root)?;
    Ok(Some(removed))
}

/// Takes the exclusive lock on `root` (a directory: flock works on any
/// inode, bpffs ones included, across mount namespaces).
fn lock(root: &Path) -> Result<Flock<File>, PinError> {
    let dir = File::open(root).map_err(io_err("opening", root))?;
    Flock::lock(dir, FlockArg::LockExclusiveNonblock).map_err(|(_, errno)| {
        if errno == nix::errno::Errno::EWOULDBLOCK {
            PinError::InUse(root.to_path_buf())
        } else {
            PinError::Io {
                what: "locking",
                path: root.to_path_buf(),
                source: errno.into(),
            }
        }
    })
}

/// Pins and their directories; links first, so programs stop before the
/// maps they write are let go.
fn remove(path: &Path) -> Result<(), PinError> {
    if !path.is_dir() {
        return std::fs::remove_file(path).map_err(io_err("removing", path));
    }
    let links = path.join(LINKS);
    if links.is_dir() {
        std::fs::remove_dir_all(&links).map_err(io_err("removing", &links))?;
    }
    std::fs::remove_dir_all(path).map_err(io_err("removing", path))
}

/// Mounts a BPF filesystem at `at` (`mount -t bpf bpf AT`), for a host
/// where nothing mounted one at the usual place: a fresh instance, so its
/// pins are the agents' alone until the host mounts its own there.
pub fn mount_bpffs(at: &Path) -> nix::Result<()> {
    nix::mount::mount(
        Some("bpf"),
        at,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        Some("mode=0700"),
    )
}

/// `root` (or the nearest existing parent) must be on bpffs. Who may pin
/// there is the filesystem's own permissions' business (an agent with
/// CAP_BPF need not be uid 0).
fn check_root(root: &Path) -> Result<(), PinError> {
    let mut probe = root;
    while !probe.exists() {
        match probe.parent() {
            Some(p) => probe = p,
            None => break,
        }
    }
    let fs = nix::sys::statfs::statfs(probe).map_err(|e| PinError::Io {
        what: "checking the filesystem of",
        path: probe.to_path_buf(),
        source: e.into(),
    })?;
    if fs.filesystem_type().0 as i64 != BPF_FS_MAGIC {
        return Err(PinError::NotBpffs(probe.to_path_buf()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::stamp;

    #[test]
    fn stamps_are_stable_and_tell_layouts_apart() {
        // Fixed value: a changed hash would make every deployed agent
        // replace its pins on upgrade for no reason.
        assert_eq!(
            stamp(&[b"object", &100u32.to_le_bytes()]),
            stamp(&[b"object", &100u32.to_le_bytes()])
        );
        assert_eq!(stamp(&[]), "cbf29ce484222325");
        assert_ne!(stamp(&[b"ab", b"c"]), stamp(&[b"a", b"bc"]));
        assert_ne!(
            stamp(&[b"object", &100u32.to_le_bytes()]),
            stamp(&[b"object", &50u32.to_le_bytes()])
        );
    }
}
