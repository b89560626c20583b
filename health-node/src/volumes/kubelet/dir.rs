//! The kubelet tree, opened without following links: [`Tree`] holds a
//! descriptor of the kubelet root and opens everything below it one path
//! component at a time (`openat` with `O_NOFOLLOW`), so a symlink anywhere
//! below the root (a `pods/<uid>/volumes` or a `vol_data.json` pointing at a
//! host path) is refused instead of followed, and a FIFO, socket or device
//! where a directory belongs fails (`O_DIRECTORY`) without being opened.
//! The root itself is the administrator's choice and may be a link.
//!
//! Listings take each entry's type from the entry itself (`d_type`), so the
//! walk never stats a path that may be a (possibly hung) mount point.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{openat, OFlag, AT_FDCWD};
use nix::sys::stat::{fstatat, Mode, SFlag};
use tracing::warn;

use super::names::check_name;
use super::{unexpected, Skip};

/// An entry's type, from its directory entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct EntryType(pub(super) Type);

impl EntryType {
    pub(super) fn is_dir(self) -> bool {
        self.0 == Type::Directory
    }

    pub(super) fn is_file(self) -> bool {
        self.0 == Type::File
    }

    /// A block volume's path: kubelet's symlink to the device, or the node.
    pub(super) fn is_device_like(self) -> bool {
        matches!(self.0, Type::Symlink | Type::BlockDevice)
    }

    /// What to call it in a message.
    pub(super) fn name(self) -> &'static str {
        match self.0 {
            Type::Fifo => "a FIFO",
            Type::CharacterDevice => "a character device",
            Type::Directory => "a directory",
            Type::BlockDevice => "a block device",
            Type::File => "a regular file",
            Type::Symlink => "a symbolic link",
            Type::Socket => "a socket",
        }
    }
}

/// Flags of every open below the root: never follow the last component,
/// never wait (a FIFO's open would), never leak into children, never make
/// a terminal ours.
const NO_FOLLOW: OFlag = OFlag::O_NOFOLLOW
    .union(OFlag::O_NONBLOCK)
    .union(OFlag::O_CLOEXEC)
    .union(OFlag::O_NOCTTY);

/// The kubelet root, open.
#[derive(Debug)]
pub(super) struct Tree {
    root: PathBuf,
    fd: OwnedFd,
}

impl Tree {
    pub(super) fn open(root: &Path) -> Result<Tree, Skip> {
        let fd = openat(
            AT_FDCWD,
            root,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| io_skip(root, errno))?;
        Ok(Tree {
            root: root.to_path_buf(),
            fd,
        })
    }

    pub(super) fn root(&self) -> &Path {
        &self.root
    }

    /// Opens `path` (below the root) with `last` on its final component;
    /// every component before it must be a directory, not a link.
    fn open_below(&self, path: &Path, last: OFlag) -> Result<OwnedFd, Skip> {
        let rel = path
            .strip_prefix(&self.root)
            .map_err(|_| unexpected(path, "outside the kubelet root"))?;
        let mut names = Vec::new();
        for c in rel.components() {
            match c {
                Component::Normal(name) => names.push(name),
                _ => return Err(unexpected(path, "not a plain path below the kubelet root")),
            }
        }
        let Some((file, dirs)) = names.split_last() else {
            return Err(unexpected(path, "the kubelet root itself"));
        };
        let mut dir: Option<OwnedFd> = None;
        let mut walked = self.root.clone();
        for name in dirs {
            walked.push(name);
            let at = dir.as_ref().unwrap_or(&self.fd);
            let next = openat(
                at,
                *name,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | NO_FOLLOW,
                Mode::empty(),
            )
            .map_err(|errno| io_skip(&walked, errno))?;
            dir = Some(next);
        }
        let at = dir.as_ref().unwrap_or(&self.fd);
        openat(at, *file, OFlag::O_RDONLY | last | NO_FOLLOW, Mode::empty())
            .map_err(|errno| io_skip(path, errno))
    }

    /// Opens the regular file `path` for reading, without following a link
    /// and without waiting on a FIFO; the caller checks the open file.
    pub(super) fn open_file(&self, path: &Path) -> Result<std::fs::File, Skip> {
        self.open_below(path, OFlag::empty())
            .map(std::fs::File::from)
    }

    /// Names and types of a directory's entries. Names kubelet does not
    /// make (`names`: a newline, invalid UTF-8, ...) are left out with one
    /// warning per directory, which shows the first of them escaped.
    pub(super) fn read_entries(&self, dir: &Path) -> Result<BTreeMap<String, EntryType>, Skip> {
        let fd = self.open_below(dir, OFlag::O_DIRECTORY)?;
        let mut listing = Dir::from_fd(fd).map_err(|errno| io_skip(dir, errno))?;
        let mut out = BTreeMap::new();
        let mut odd: BTreeSet<Vec<u8>> = BTreeSet::new();
        let mut untyped = Vec::new();
        for entry in listing.iter() {
            let entry = entry.map_err(|errno| io_skip(dir, errno))?;
            let raw = entry.file_name().to_bytes();
            if raw == b"." || raw == b".." {
                continue;
            }
            let name = match check_name(raw).map(|()| std::str::from_utf8(raw)) {
                Ok(Ok(name)) => name,
                _ => {
                    odd.insert(raw.to_vec());
                    continue;
                }
            };
            match entry.file_type() {
                Some(ty) => {
                    out.insert(name.to_string(), EntryType(ty));
                }
                // Filesystems without d_type (xfs without ftype): ask below.
                None => untyped.push(name.to_string()),
            }
        }
        for name in untyped {
            // As std's DirEntry::file_type does: lstat the entry. This one
            // stat may cross into a mount point at that entry; only
            // filesystems without d_type come here.
            let st = fstatat(
                &listing,
                name.as_str(),
                nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|errno| io_skip(&dir.join(&name), errno))?;
            out.insert(name, EntryType(type_of_mode(st.st_mode)));
        }
        if let Some(first) = odd.first() {
            warn!(
                path = ?dir,
                count = odd.len(),
                first = ?String::from_utf8_lossy(first),
                "ignoring entries whose names kubelet does not make"
            );
        }
        Ok(out)
    }

    /// The type of what is mounted at the regular file `path`: kubelet
    /// bind-mounts a block volume's device over an empty file (the global
    /// map file), and the listing's `d_type` shows the file underneath.
    /// This is the walk's one stat through a mount point; kubelet only
    /// mounts device nodes there, whose stat touches no device.
    pub(super) fn mounted_type(&self, path: &Path) -> Result<EntryType, Skip> {
        let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(unexpected(path, "not a plain path below the kubelet root"));
        };
        let fd = self.open_below(dir, OFlag::O_DIRECTORY)?;
        let st = fstatat(&fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|errno| io_skip(path, errno))?;
        Ok(EntryType(type_of_mode(st.st_mode)))
    }

    /// Names, paths and types of a directory's entries. Missing directory:
    /// empty, silently; other errors: warn.
    pub(super) fn list_dir(&self, dir: &Path) -> Vec<(String, PathBuf, EntryType)> {
        match self.read_entries(dir) {
            Ok(entries) => with_paths(dir, entries),
            Err(Skip::Io { error, .. }) if error.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                warn!(path = %dir.display(), "skipping directory: {e}");
                Vec::new()
            }
        }
    }

    /// Like [`Tree::list_dir`] but without warnings: for optional places.
    pub(super) fn list_dir_quiet(&self, dir: &Path) -> Vec<(String, PathBuf, EntryType)> {
        self.read_entries(dir)
            .map(|e| with_paths(dir, e))
            .unwrap_or_default()
    }

    pub(super) fn has_entry(&self, dir: &Path, name: &str) -> bool {
        self.read_entries(dir).is_ok_and(|e| e.contains_key(name))
    }
}

fn with_paths(
    dir: &Path,
    entries: BTreeMap<String, EntryType>,
) -> Vec<(String, PathBuf, EntryType)> {
    entries
        .into_iter()
        .map(|(name, ty)| {
            let path = dir.join(&name);
            (name, path, ty)
        })
        .collect()
}

fn type_of_mode(mode: libc::mode_t) -> Type {
    match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => Type::Directory,
        SFlag::S_IFREG => Type::File,
        SFlag::S_IFLNK => Type::Symlink,
        SFlag::S_IFBLK => Type::BlockDevice,
        SFlag::S_IFCHR => Type::CharacterDevice,
        SFlag::S_IFIFO => Type::Fifo,
        _ => Type::Socket,
    }
}

/// An open or listing that failed, with what it means here: ELOOP from
/// `O_NOFOLLOW` is a link we refuse, ENOTDIR from `O_DIRECTORY` a
/// non-directory where one belongs, ENXIO a socket.
fn io_skip(path: &Path, errno: Errno) -> Skip {
    match errno {
        Errno::ELOOP => unexpected(path, "a symbolic link (not followed)"),
        Errno::ENOTDIR => unexpected(path, "not a directory (or a link to one: not followed)"),
        Errno::ENXIO => unexpected(path, "a socket or a device without a driver (not opened)"),
        errno => Skip::Io {
            path: path.to_path_buf(),
            error: io::Error::from_raw_os_error(errno as i32),
        },
    }
}
