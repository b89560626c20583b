//! Discovery of the volumes kubelet has set up on this node, from its
//! directory tree (default `/var/lib/kubelet`). Uses `crate::dev` and the
//! mount entries of `crate::topology`; the rest of `volumes` reads its output.
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

use serde::Serialize;
use tracing::{debug, warn};

use crate::dev::Dev;
use crate::topology::MountEntry;

use csi::{csi_block_volume, csi_filesystem_volume};
use dir::Tree;

pub const DEFAULT_KUBELET_ROOT: &str = "/var/lib/kubelet";

const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";
const LOCAL_PLUGIN_DIR: &str = "kubernetes.io~local-volume";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum VolumeMode {
    Filesystem,
    Block,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum VolumeKind {
    /// A CSI volume backed by a PV.
    Csi,
    /// An inline CSI ephemeral volume: no PV, generated volume handle.
    CsiEphemeral,
    /// A `local` PV.
    LocalVolume,
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
                Err(e) => warn!(path = %dir.display(), "skipping CSI volume: {e}"),
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
        let devices = pod_dir.join("volumeDevices");
        for (name, path, ty) in tree.list_dir(&devices.join(CSI_PLUGIN_DIR)) {
            match csi_block_volume(&tree, &block_dir, &uid, &name, path.clone(), ty) {
                Ok(v) => keep(&mut found, v),
                Err(e) => warn!(path = %path.display(), "skipping CSI block volume: {e}"),
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
            match csi_block_volume(&tree, &block_dir, &uid, &pv, path.clone(), ty) {
                Ok(v) => keep(&mut found, v),
                Err(e) => warn!(path = %path.display(), "skipping CSI block volume: {e}"),
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
    use super::csi::hex;
    use super::vol_data::VOL_DATA;
    use super::*;
    use sha2::{Digest, Sha256};
    use std::fs;
    use std::os::unix::fs::symlink;

    const POD_A: &str = "11111111-aaaa-4aaa-8aaa-000000000001";
    const POD_B: &str = "22222222-bbbb-4bbb-8bbb-000000000002";
    const POD_C: &str = "33333333-cccc-4ccc-8ccc-000000000003";

    fn write(path: &Path, text: &str) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    fn csi_pod_volume(root: &Path, uid: &str, name: &str, json: &str) -> PathBuf {
        let dir = root
            .join("pods")
            .join(uid)
            .join("volumes")
            .join(CSI_PLUGIN_DIR)
            .join(name);
        fs::create_dir_all(dir.join("mount")).unwrap();
        write(&dir.join(VOL_DATA), json);
        dir
    }

    fn persistent_json(pv: &str, handle: &str) -> String {
        format!(
            r#"{{"attachmentID":"csi-123","driverName":"disk.csi.example.com","nodeName":"node-1",
                "specVolID":"{pv}","volumeHandle":"{handle}","volumeLifecycleMode":"Persistent"}}"#
        )
    }

    fn find<'a>(vols: &'a [KubeletVolume], uid: &str, name: &str) -> &'a KubeletVolume {
        vols.iter()
            .find(|v| v.pod_uid == uid && v.pod_volume_dir_name == name)
            .unwrap_or_else(|| panic!("{uid}/{name} not discovered in {vols:#?}"))
    }

    /// Runs `f` with a tracing subscriber that records into a string.
    fn with_captured_log<T>(f: impl FnOnce() -> T) -> (T, String) {
        use std::sync::{Arc, Mutex};
        #[derive(Clone)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf(Arc::default());
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::DEBUG)
            .finish();
        let out = tracing::subscriber::with_default(subscriber, f);
        let log = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
        (out, log)
    }

    /// Makes a block device node; needs root (CAP_MKNOD).
    fn mknod_block(path: &Path, major: u64, minor: u64) {
        use nix::sys::stat::{mknod, Mode, SFlag};
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        mknod(
            path,
            SFlag::S_IFBLK,
            Mode::from_bits_truncate(0o600),
            libc::makedev(major as _, minor as _),
        )
        .unwrap_or_else(|e| {
            panic!(
                "mknod {} failed ({e}): these tests must run as root",
                path.display()
            )
        });
    }

    #[test]
    fn discovers_every_layout_and_skips_the_bad() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let csi = root.join("plugins/kubernetes.io/csi");

        // Pod A: a persistent volume (newer staging layout) and an inline
        // ephemeral one, plus a configmap that is none of our business.
        let pv_a = "pvc-0a0a";
        let handle_a = "vol-handle-a";
        csi_pod_volume(root, POD_A, pv_a, &persistent_json(pv_a, handle_a));
        let sha = hex(&Sha256::digest(handle_a.as_bytes()));
        let staging_a = csi
            .join("disk.csi.example.com")
            .join(&sha)
            .join("globalmount");
        fs::create_dir_all(&staging_a).unwrap();
        write(
            &staging_a.parent().unwrap().join(VOL_DATA),
            r#"{"driverName":"disk.csi.example.com","volumeHandle":"vol-handle-a"}"#,
        );
        csi_pod_volume(
            root,
            POD_A,
            "scratch",
            r#"{"driverName":"inline.csi.example.com","volumeHandle":"csi-5f3e9c1b2a","specVolID":"scratch",
                "nodeName":"node-1","volumeLifecycleMode":"Ephemeral"}"#,
        );
        fs::create_dir_all(
            root.join("pods")
                .join(POD_A)
                .join("volumes/kubernetes.io~configmap/cfg"),
        )
        .unwrap();

        // Pod B: shares pv_a with pod A; an old-layout volume; a malformed
        // vol_data.json; a volume without its mount dir; a stray file; a local PV.
        csi_pod_volume(root, POD_B, pv_a, &persistent_json(pv_a, handle_a));
        csi_pod_volume(
            root,
            POD_B,
            "pv-old",
            &persistent_json("pv-old", "old-handle"),
        );
        fs::create_dir_all(csi.join("pv/pv-old/globalmount")).unwrap();
        write(
            &csi.join("pv/pv-old").join(VOL_DATA),
            r#"{"driverName":"disk.csi.example.com","volumeHandle":"old-handle"}"#,
        );
        csi_pod_volume(
            root,
            POD_B,
            "pv-broken",
            r#"{"driverName": "disk.csi.example.com", "volumeHa"#,
        );
        let torn = csi_pod_volume(
            root,
            POD_B,
            "pv-torn-down",
            &persistent_json("pv-torn-down", "h"),
        );
        fs::remove_dir(torn.join("mount")).unwrap();
        write(
            &root
                .join("pods")
                .join(POD_B)
                .join("volumes")
                .join(CSI_PLUGIN_DIR)
                .join("stray"),
            "not a volume",
        );
        fs::create_dir_all(
            root.join("pods")
                .join(POD_B)
                .join("volumes")
                .join(LOCAL_PLUGIN_DIR)
                .join("local-pv-1"),
        )
        .unwrap();

        // Pod C: a CSI block volume, linked the way kubelet does it.
        let blk = csi.join("volumeDevices");
        let publish = blk.join("publish/pv-blk").join(POD_C);
        mknod_block(&publish, 7, 242);
        let pod_link = root
            .join("pods")
            .join(POD_C)
            .join("volumeDevices")
            .join(CSI_PLUGIN_DIR)
            .join("pv-blk");
        fs::create_dir_all(pod_link.parent().unwrap()).unwrap();
        symlink(&publish, &pod_link).unwrap();
        mknod_block(&blk.join("pv-blk/dev").join(POD_C), 7, 242);
        write(
            &blk.join("pv-blk/data").join(VOL_DATA),
            &persistent_json("pv-blk", "blk-handle"),
        );
        fs::create_dir_all(blk.join("staging/pv-blk")).unwrap();
        // ...and a global map file for a pod whose link is gone.
        mknod_block(&blk.join("pv-blk/dev").join(POD_A), 7, 242);

        // A symlinked "pod" pointing out of the tree is not followed.
        let outside = tempfile::tempdir().unwrap();
        csi_pod_volume(
            outside.path(),
            "evil",
            "pv-x",
            &persistent_json("pv-x", "x"),
        );
        symlink(outside.path().join("pods/evil"), root.join("pods/evil")).unwrap();

        let (vols, log) = with_captured_log(|| discover(root));
        // Each skip names the path it skipped.
        for skipped in ["pv-broken/vol_data.json", "kubernetes.io~csi/stray"] {
            assert!(
                log.lines()
                    .any(|l| l.contains("WARN") && l.contains(skipped)),
                "{skipped} in {log}"
            );
        }
        assert!(
            !log.lines()
                .any(|l| l.contains("WARN") && l.contains("pv-torn-down")),
            "a volume being torn down is not worth a warning: {log}"
        );
        let names: Vec<(&str, &str)> = vols
            .iter()
            .map(|v| (&v.pod_uid[..1], &v.pod_volume_dir_name[..]))
            .collect();
        assert_eq!(
            names,
            [
                ("1", "pv-blk"),
                ("1", pv_a),
                ("1", "scratch"),
                ("2", "local-pv-1"),
                ("2", "pv-old"),
                ("2", pv_a),
                ("3", "pv-blk")
            ],
            "{vols:#?}"
        );

        let a = find(&vols, POD_A, pv_a);
        assert_eq!(
            a,
            &KubeletVolume {
                pod_uid: POD_A.into(),
                pv: Some(pv_a.into()),
                pod_volume_dir_name: pv_a.into(),
                driver: Some("disk.csi.example.com".into()),
                volume_handle: Some(handle_a.into()),
                volume_mode: VolumeMode::Filesystem,
                kind: VolumeKind::Csi,
                path: root
                    .join("pods")
                    .join(POD_A)
                    .join("volumes/kubernetes.io~csi")
                    .join(pv_a)
                    .join("mount"),
                staging_path: Some(staging_a.clone()),
                node_name: Some("node-1".into()),
            }
        );
        // The same PV in the other pod: same staging mount, its own path.
        let b = find(&vols, POD_B, pv_a);
        assert_eq!(b.staging_path.as_deref(), Some(staging_a.as_path()));
        assert_ne!(a.path, b.path);

        let eph = find(&vols, POD_A, "scratch");
        assert_eq!(
            (eph.kind, eph.pv.as_deref(), eph.staging_path.as_deref()),
            (VolumeKind::CsiEphemeral, None, None)
        );
        assert_eq!(eph.volume_handle.as_deref(), Some("csi-5f3e9c1b2a"));

        let old = find(&vols, POD_B, "pv-old");
        assert_eq!(old.staging_path, Some(csi.join("pv/pv-old/globalmount")));

        let local = find(&vols, POD_B, "local-pv-1");
        assert_eq!(
            (local.kind, local.volume_mode, local.pv.as_deref()),
            (
                VolumeKind::LocalVolume,
                VolumeMode::Filesystem,
                Some("local-pv-1")
            )
        );

        let blk_c = find(&vols, POD_C, "pv-blk");
        assert_eq!(
            (blk_c.kind, blk_c.volume_mode),
            (VolumeKind::Csi, VolumeMode::Block)
        );
        assert_eq!(blk_c.path, pod_link);
        assert_eq!(blk_c.staging_path, Some(blk.join("staging/pv-blk")));
        assert_eq!(blk_c.volume_handle.as_deref(), Some("blk-handle"));
        let blk_a = find(&vols, POD_A, "pv-blk");
        assert_eq!(blk_a.path, blk.join("pv-blk/dev").join(POD_A));

        // Device resolution: block volumes by the node's st_rdev.
        assert_eq!(resolve_device(blk_c, &[]), Some(Dev::new(7, 242)));
        assert_eq!(resolve_device(blk_a, &[]), Some(Dev::new(7, 242)));

        // Serializes for the reporter and for `watch --json`.
        let json = serde_json::to_value(blk_c).unwrap();
        assert_eq!(json["volumeMode"], "Block");
        assert_eq!(json["pv"], "pv-blk");
    }

    #[test]
    fn resolve_device_filesystem_mode_takes_the_topmost_mount() {
        let path = "/var/lib/kubelet/pods/p/volumes/kubernetes.io~csi/pv1/mount";
        let text = format!(
            "1 0 8:1 / / rw - ext4 /dev/vda1 rw\n\
             40 1 7:2 / {path} rw - ext4 /dev/loop2 rw\n\
             41 40 7:3 / {path} rw - xfs /dev/loop3 rw\n"
        );
        let mounts = crate::topology::parse_mountinfo(&text).unwrap();
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
}
