//! Discovery of the volumes kubelet has set up on this node, from its
//! directory tree (default `/var/lib/kubelet`). Uses `health_core::dev` and the
//! mount entries of `health_topology`; the rest of `volumes` reads its output.
//!
//! Layouts read (all relative to the kubelet root):
//! - CSI filesystem volumes: `pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`
//!   with `vol_data.json` beside `mount`. `<name>` is the PV name, or for an
//!   inline ephemeral volume the pod's volume name.
//! - CSI staging mounts: `plugins/kubernetes.io/csi/<driver>/<sha256(volumeHandle)>/globalmount`
//!   (newer kubelets) or `plugins/kubernetes.io/csi/pv/<pv>/globalmount` (older).
//! - CSI block volumes: `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>` (a
//!   symlink to the device or a device node), with metadata in
//!   `plugins/kubernetes.io/csi/volumeDevices/<pv>/data/vol_data.json`, the
//!   per-pod global map file `.../volumeDevices/<pv>/dev/<uid>` and the staging
//!   path `.../volumeDevices/staging/<pv>`.
//! - Local PVs: `pods/<uid>/volumes/kubernetes.io~local-volume/<pv>` (and
//!   `volumeDevices/kubernetes.io~local-volume/<pv>` in block mode).
//! - In-tree NFS volumes: `pods/<uid>/volumes/kubernetes.io~nfs/<name>`, the
//!   export mounted there; `<name>` is the PV's, or for a volume inline in
//!   the pod the pod's volume's (the PV lookup then finds none).
//!
//! Discovery must never hang on the storage it is meant to watch, so it never
//! stats a path that may be a mount point (on a dead NFS or FUSE mount that
//! `lstat` blocks): whether `mount` or `globalmount` exists is read from the
//! parent directory's entries instead. Nothing below a volume's mount point
//! (the tenant's) is opened, listed or read.
//!
//! Hostile trees: everything below the kubelet root is opened one component
//! at a time without following links (`dir::Tree`), so a symlink planted
//! anywhere (a pod's `volumes` dir, a volume dir, `vol_data.json`) is
//! skipped with a warning, never followed; a FIFO, socket or device node is
//! never opened where a directory or `vol_data.json` belongs (their type is
//! read from the listing, and every open is `O_NONBLOCK`); `vol_data.json`
//! is opened once and checked on the open file (regular, at most 64 KiB;
//! nothing more is read). Only [`resolve_device`] follows a link: a block
//! volume's path to its device node, with `stat` (no open).
//!
//! Anything odd (malformed `vol_data.json`, unreadable directory, a file where
//! a directory belongs) skips that one volume with a warning naming the path.
//!
//! Here: the walk and what it finds. `csi` reads one CSI volume's directory
//! and finds its staging mount, `vol_data` reads kubelet's `vol_data.json`,
//! `dir` lists directories by their entries alone.

mod csi;
mod dir;
pub(crate) mod names;
pub(crate) mod vol_data;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use csi::{csi_block_volume, csi_filesystem_volume};
use dir::Tree;
use health_core::dev::Dev;
use health_topology::MountEntry;
use serde::Serialize;
use tracing::{debug, warn};

pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";

const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";
const LOCAL_PLUGIN_DIR: &str = "kubernetes.io~local-volume";
const NFS_PLUGIN_DIR: &str = "kubernetes.io~nfs";

use health_core::volume::VolumeKey;
/// The mode kubelet's tree says: `volumes/` or `volumeDevices/`.
pub use health_core::volume::VolumeMode;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum VolumeKind {
    /// A CSI volume backed by a PV.
    Csi,
    /// An inline CSI ephemeral volume: no PV, generated volume handle.
    CsiEphemeral,
    /// A `local` PV.
    LocalVolume,
    /// An in-tree `nfs` volume: of a PV (the directory is the PV's name) or
    /// inline in the pod (the pod's volume's name; no PV has it).
    Nfs,
}

/// One volume as one pod sees it. A PV used by two pods is two entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeletVolume {
    pub pod_uid: String,
    pub pv: Option<String>,
    /// The directory name under the pod: the PV name, or for inline
    /// ephemeral volumes the pod's volume name.
    pub pod_volume_dir_name: String,
    pub driver: Option<String>,
    pub volume_handle: Option<String>,
    pub volume_mode: VolumeMode,
    pub kind: VolumeKind,
    /// Filesystem mode: the pod's mount point. Block mode: the pod's device
    /// path (symlink or device node).
    pub path: PathBuf,
    pub staging_path: Option<PathBuf>,
    pub node_name: Option<String>,
}

impl KubeletVolume {
    /// This volume's identity, stable across rediscoveries.
    pub fn key(&self) -> VolumeKey {
        VolumeKey {
            pod_uid: self.pod_uid.clone(),
            name: self.pod_volume_dir_name.clone(),
            mode: self.volume_mode,
        }
    }
}

/// Why one volume was skipped; logged, never returned.
#[derive(Debug, thiserror::Error)]
enum Skip {
    // Causes are in the messages, not `source()`s as well (logged whole).
    #[error("cannot read {path}: {error}")]
    Io { path: PathBuf, error: io::Error },
    #[error("malformed {path}: {error}")]
    Json {
        path: PathBuf,
        error: serde_json::Error,
    },
    #[error("{path}: {what}")]
    Unexpected { path: PathBuf, what: String },
}

impl Skip {
    /// `listed` was in its directory's listing a moment ago and is gone now:
    /// the kubelet tore the volume down between the listing and the read,
    /// which is a volume leaving, not a problem. A file missing below an
    /// entry that is still there (a CSI volume without its vol_data.json)
    /// is not that.
    fn vanished(&self, listed: &Path) -> bool {
        matches!(self, Skip::Io { error, .. } if error.kind() == io::ErrorKind::NotFound)
            && std::fs::symlink_metadata(listed).is_err_and(|e| e.kind() == io::ErrorKind::NotFound)
    }
}

/// Logs one skipped volume: a warning, unless it merely left mid-walk.
fn skipped(what: &str, path: &Path, skip: &Skip) {
    if skip.vanished(path) {
        debug!(path = %path.display(), "{what} gone while it was read: {skip}");
    } else {
        warn!(path = %path.display(), "skipping {what}: {skip}");
    }
}

fn unexpected(path: &Path, what: impl Into<String>) -> Skip {
    Skip::Unexpected {
        path: path.to_path_buf(),
        what: what.into(),
    }
}

/// Walks the kubelet tree under `kubelet_root`. Never fails: problems are
/// logged and the affected volume is left out.
pub fn discover(kubelet_root: &Path) -> Vec<KubeletVolume> {
    let tree = match Tree::open(kubelet_root) {
        Ok(tree) => tree,
        Err(Skip::Io { error, .. }) if error.kind() == io::ErrorKind::NotFound => {
            return Vec::new()
        }
        Err(e) => {
            warn!("no pod volumes: {e}");
            return Vec::new();
        }
    };
    let kubelet_root = tree.root();
    let csi_plugins = kubelet_root.join("plugins/kubernetes.io/csi");
    let block_dir = csi_plugins.join("volumeDevices");
    let mut found: Found = BTreeMap::new();

    let pods = kubelet_root.join("pods");
    for (uid, pod_dir, ty) in tree.list_dir(&pods) {
        if !ty.is_dir() {
            warn!(path = %pod_dir.display(), "skipping: not a pod directory ({})", ty.name());
            continue;
        }
        let volumes = pod_dir.join("volumes");
        for (name, dir, ty) in tree.list_dir(&volumes.join(CSI_PLUGIN_DIR)) {
            match csi_filesystem_volume(&tree, &csi_plugins, &uid, &name, &dir, ty) {
                Ok(Some(v)) => keep(&mut found, v),
                Ok(None) => {}
                Err(e) => skipped("CSI volume", &dir, &e),
            }
        }
        for (name, path, ty) in tree.list_dir(&volumes.join(LOCAL_PLUGIN_DIR)) {
            if ty.is_dir() {
                keep(
                    &mut found,
                    local_volume(&uid, &name, path, VolumeMode::Filesystem),
                );
            } else {
                warn!(path = %path.display(), "skipping local volume: not a directory ({})", ty.name());
            }
        }
        for (name, path, ty) in tree.list_dir(&volumes.join(NFS_PLUGIN_DIR)) {
            if ty.is_dir() {
                let mut v = local_volume(&uid, &name, path, VolumeMode::Filesystem);
                v.kind = VolumeKind::Nfs;
                keep(&mut found, v);
            } else {
                warn!(path = %path.display(), "skipping NFS volume: not a directory ({})", ty.name());
            }
        }
        let devices = pod_dir.join("volumeDevices");
        for (name, path, ty) in tree.list_dir(&devices.join(CSI_PLUGIN_DIR)) {
            match csi_block_volume(&tree, &block_dir, &uid, &name, path.clone(), ty) {
                Ok(v) => keep(&mut found, v),
                Err(e) => skipped("CSI block volume", &path, &e),
            }
        }
        for (name, path, ty) in tree.list_dir(&devices.join(LOCAL_PLUGIN_DIR)) {
            if ty.is_device_like() {
                keep(
                    &mut found,
                    local_volume(&uid, &name, path, VolumeMode::Block),
                );
            } else {
                warn!(path = %path.display(), "skipping local block volume: not a device or symlink ({})", ty.name());
            }
        }
    }

    // Block volumes whose pod-side link is gone (or not yet made) still have
    // the global map file kubelet keeps per pod: `volumeDevices/<pv>/dev/<uid>`.
    for (pv, pv_dir, ty) in tree.list_dir(&block_dir) {
        if !ty.is_dir() || pv == "staging" || pv == "publish" {
            continue;
        }
        for (uid, path, ty) in tree.list_dir_quiet(&pv_dir.join("dev")) {
            if found.contains_key(&(uid.clone(), pv.clone(), VolumeMode::Block)) {
                continue;
            }
            // The device is bind-mounted over a regular file; a file with
            // nothing over it is one being mapped or unmapped right now.
            let ty = match ty.is_file().then(|| tree.mounted_type(&path)) {
                None => ty,
                Some(Ok(mounted)) if mounted.is_file() => {
                    debug!(path = %path.display(), "CSI block volume not mapped (yet or any more)");
                    continue;
                }
                Some(Ok(mounted)) => mounted,
                Some(Err(e)) => {
                    skipped("CSI block volume", &path, &e);
                    continue;
                }
            };
            match csi_block_volume(&tree, &block_dir, &uid, &pv, path.clone(), ty) {
                Ok(v) => keep(&mut found, v),
                Err(e) => skipped("CSI block volume", &path, &e),
            }
        }
    }

    found.into_values().collect()
}

/// Discovered volumes by (pod, dir name, mode); the first sighting wins.
type Found = BTreeMap<(String, String, VolumeMode), KubeletVolume>;

fn keep(found: &mut Found, v: KubeletVolume) {
    found
        .entry((
            v.pod_uid.clone(),
            v.pod_volume_dir_name.clone(),
            v.volume_mode,
        ))
        .or_insert(v);
}

fn local_volume(uid: &str, name: &str, path: PathBuf, mode: VolumeMode) -> KubeletVolume {
    KubeletVolume {
        pod_uid: uid.to_string(),
        pv: Some(name.to_string()),
        pod_volume_dir_name: name.to_string(),
        driver: None,
        volume_handle: None,
        volume_mode: mode,
        kind: VolumeKind::LocalVolume,
        path,
        staging_path: None,
        node_name: None,
    }
}

/// The device a volume lives on: for filesystem mode the mount at its path
/// (the topmost one when mounts are stacked), for block mode the device node
/// its path resolves to. `None` when not mounted / not a block device.
pub fn resolve_device(vol: &KubeletVolume, mounts: &[MountEntry]) -> Option<Dev> {
    match vol.volume_mode {
        VolumeMode::Filesystem => mounts
            .iter()
            .rev()
            .find(|m| m.mount_point == vol.path)
            .map(|m| m.dev),
        // stat follows the symlink to the device node; it does no I/O on the
        // device itself, so it cannot hang on a dead disk.
        VolumeMode::Block => match nix::sys::stat::stat(&vol.path) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFBLK && st.st_rdev != 0 => {
                Some(Dev::from_stat(st.st_rdev))
            }
            Ok(_) => None,
            Err(e) => {
                debug!(path = %vol.path.display(), "cannot stat block volume: {e}");
                None
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn resolve_device_filesystem_mode_takes_the_topmost_mount() {
        let path = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv1/mount";
        let text = format!(
            "1 0 8:1 / / rw - ext4 /dev/vda1 rw\n\
             40 1 7:2 / {path} rw - ext4 /dev/loop2 rw\n\
             41 40 7:3 / {path} rw - xfs /dev/loop3 rw\n"
        );
        let mounts = health_topology::parse_mountinfo(&text).unwrap();
        let mut vol = local_volume("p", "pv1", PathBuf::from(path), VolumeMode::Filesystem);
        assert_eq!(resolve_device(&vol, &mounts), Some(Dev::new(7, 3)));
        vol.path = PathBuf::from("/nowhere");
        assert_eq!(resolve_device(&vol, &mounts), None);
        // A block volume whose path is not a block device resolves to nothing.
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("not-a-device");
        write(&file, "");
        let blk = local_volume("p", "pv1", file, VolumeMode::Block);
        assert_eq!(resolve_device(&blk, &mounts), None);
    }

    #[test]
    fn missing_or_unreadable_root_is_empty_not_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(discover(&tmp.path().join("absent")).is_empty());
        write(&tmp.path().join("pods"), "a file where pods/ should be");
        assert!(discover(tmp.path()).is_empty());
    }

    #[test]
    fn only_a_volume_gone_mid_walk_is_vanished() {
        let tmp = tempfile::tempdir().unwrap();
        let (here, gone) = (tmp.path().join("pv1"), tmp.path().join("pv2"));
        fs::create_dir(&here).unwrap();
        let io = |kind, path: &Path| Skip::Io {
            path: path.to_path_buf(),
            error: io::Error::from(kind),
        };
        assert!(io(io::ErrorKind::NotFound, &gone).vanished(&gone));
        // Its directory is still there: vol_data.json is missing, not the volume.
        let vol_data = here.join("vol_data.json");
        assert!(!io(io::ErrorKind::NotFound, &vol_data).vanished(&here));
        assert!(!io(io::ErrorKind::PermissionDenied, &gone).vanished(&gone));
        assert!(!unexpected(&gone, "not a directory").vanished(&gone));
    }
}
