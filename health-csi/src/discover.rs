//! Finding node plugin sockets the way kubelet lays them out.

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// Directory name of kubelet's plugin *registration* sockets. Those belong
/// to node-driver-registrar and speak the registration API, not CSI.
const REGISTRY_DIR: &str = "plugins_registry";

/// Unix sockets under `<kubelet_root>/plugins/`, at depth 1 or 2
/// (`plugins/csi.sock`, `plugins/<driver>/csi.sock`), sorted.
///
/// Deeper levels are not searched: `plugins/kubernetes.io/csi/...` holds
/// per-volume mount directories, which can be many and can hang on a dead
/// network filesystem. Any `plugins_registry` directory is skipped. Symlinks
/// are followed only to see whether they point at a socket, never into
/// directories. Unreadable directories are logged and skipped.
pub fn discover_node_sockets(kubelet_root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    walk(&kubelet_root.join("plugins"), 1, &mut found);
    found.sort();
    found.dedup();
    found
}

fn walk(dir: &Path, depth: u32, found: &mut Vec<PathBuf>) {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot read CSI plugin directory");
            return;
        }
    };
    for entry in entries {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot read CSI plugin directory entry");
                continue;
            }
        };
        let path = entry.path();
        let file_type = match entry.file_type() {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot stat CSI plugin entry");
                continue;
            }
        };
        if file_type.is_socket() {
            found.push(path);
        } else if file_type.is_dir() {
            if depth < 2 && entry.file_name() != REGISTRY_DIR {
                walk(&path, depth + 1, found);
            }
        } else if file_type.is_symlink() {
            // Dangling links are common after a driver is removed; not worth
            // a warning.
            if fs::metadata(&path).is_ok_and(|m| m.file_type().is_socket()) {
                found.push(path);
            }
        }
    }
}
