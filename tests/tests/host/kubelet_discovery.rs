//! Discovery of pod volumes in a kubelet tree (`health_node::volumes::kubelet`)
//! with every layout, block volumes included: their device nodes need root
//! (CAP_MKNOD), so this runs here and fails (not skips) without it.

use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use anyhow::Result;
use health_core::dev::Dev;
use health_node::volumes::kubelet::{
    discover, resolve_device, KubeletVolume, VolumeKind, VolumeMode,
};
use health_tests::fs::Mount;
use health_tests::sys::require_root;
use sha2::{Digest, Sha256};

// kubelet's own names in its tree, as health-node's kubelet module reads them.
const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";
const LOCAL_PLUGIN_DIR: &str = "kubernetes.io~local-volume";
const VOL_DATA: &str = "vol_data.json";

/// Lower-case hex, as kubelet names newer CSI staging dirs by
/// sha256(volumeHandle).
fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

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
fn discovers_every_layout_and_skips_the_bad() -> Result<()> {
    require_root()?;
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
    // ...and an in-tree NFS volume (kubelet mounts the export there).
    fs::create_dir_all(
        root.join("pods")
            .join(POD_B)
            .join("volumes/kubernetes.io~nfs/pv-nfs"),
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
    // ...and a global map file for a pod whose link is gone, as kubelet
    // makes it: the device bind-mounted over an empty regular file, which
    // the directory listing shows as a regular file.
    let node = tmp.path().join("node-7-242");
    mknod_block(&node, 7, 242);
    let global_a = blk.join("pv-blk/dev").join(POD_A);
    fs::write(&global_a, "").unwrap();
    let _mapped = Mount::at(&node, &global_a, "none", "bind")?;
    // One being mapped (or unmapped): the file with nothing over it yet.
    fs::write(blk.join("pv-blk/dev").join(POD_B), "").unwrap();

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
    for quiet in ["pv-torn-down", &format!("pv-blk/dev/{POD_B}")] {
        assert!(
            !log.lines().any(|l| l.contains("WARN") && l.contains(quiet)),
            "a volume being set up or torn down is not worth a warning: {log}"
        );
    }
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
            ("2", "pv-nfs"),
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

    let nfs = find(&vols, POD_B, "pv-nfs");
    assert_eq!(
        (
            nfs.kind,
            nfs.volume_mode,
            nfs.pv.as_deref(),
            nfs.path.clone()
        ),
        (
            VolumeKind::Nfs,
            VolumeMode::Filesystem,
            Some("pv-nfs"),
            root.join("pods")
                .join(POD_B)
                .join("volumes/kubernetes.io~nfs/pv-nfs")
        )
    );

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
    Ok(())
}
