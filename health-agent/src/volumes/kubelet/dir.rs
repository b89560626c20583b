//! Directory listings that take each entry's type from the entry itself, so
//! that the walk never stats a path that may be a (possibly hung) mount point.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{self, FileType};
use std::io;
use std::path::{Path, PathBuf};

use tracing::warn;

use super::Skip;

/// Names and types (from the directory entry, without stat-ing the entry) of
/// a directory. Missing directory: empty, silently; other errors: warn.
pub(super) fn list_dir(dir: &Path) -> Vec<(String, PathBuf, FileType)> {
    match read_entries(dir) {
        Ok(entries) => entries
            .into_iter()
            .map(|(name, ty)| {
                let path = dir.join(&name);
                (name, path, ty)
            })
            .collect(),
        Err(Skip::Io { source, .. }) if source.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => {
            warn!(path = %dir.display(), "skipping directory: {e}");
            Vec::new()
        }
    }
}

/// Like [`list_dir`] but without warnings: for optional places.
pub(super) fn list_dir_quiet(dir: &Path) -> Vec<(String, PathBuf, FileType)> {
    read_entries(dir)
        .map(|e| {
            e.into_iter()
                .map(|(n, t)| (n.clone(), dir.join(n), t))
                .collect()
        })
        .unwrap_or_default()
}

pub(super) fn read_entries(dir: &Path) -> Result<BTreeMap<String, FileType>, Skip> {
    let io_err = |source| Skip::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut out = BTreeMap::new();
    let mut odd = BTreeSet::new();
    for entry in fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        // DirEntry::file_type comes from d_type, which does not cross into a
        // mount at that entry.
        let ty = entry.file_type().map_err(io_err)?;
        match entry.file_name().into_string() {
            Ok(name) => {
                out.insert(name, ty);
            }
            // Pod UIDs, PV and driver names are ASCII.
            Err(name) => {
                odd.insert(name);
            }
        }
    }
    if !odd.is_empty() {
        warn!(path = %dir.display(), count = odd.len(), "ignoring entries with non-UTF-8 names");
    }
    Ok(out)
}

pub(super) fn has_entry(dir: &Path, name: &str) -> bool {
    read_entries(dir).is_ok_and(|e| e.contains_key(name))
}

pub(super) fn is_device_like(ty: FileType) -> bool {
    use std::os::unix::fs::FileTypeExt;
    ty.is_symlink() || ty.is_block_device()
}
