//! One CSI volume's directory under a pod (filesystem or block mode) and the
//! staging mount kubelet made for it, in either kubelet's layout.

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tracing::debug;

use super::dir::{EntryType, Tree};
use super::names::check_name;
use super::vol_data::{read_vol_data, required, VOL_DATA};
use super::{unexpected, KubeletVolume, Skip, VolumeKind, VolumeMode};

/// `pods/<uid>/volumes/kubernetes.io~csi/<name>`. `Ok(None)`: no `mount` dir,
/// kubelet is setting the volume up or tearing it down.
pub(super) fn csi_filesystem_volume(
    tree: &Tree,
    csi_plugins: &Path,
    uid: &str,
    name: &str,
    dir: &Path,
    ty: EntryType,
) -> Result<Option<KubeletVolume>, Skip> {
    if !ty.is_dir() {
        return Err(unexpected(dir, format!("not a directory ({})", ty.name())));
    }
    let entries = tree.read_entries(dir)?;
    let Some(mount_ty) = entries.get("mount") else {
        debug!(path = %dir.display(), "no mount directory yet/any more");
        return Ok(None);
    };
    if !mount_ty.is_dir() {
        return Err(unexpected(
            &dir.join("mount"),
            format!("not a directory ({})", mount_ty.name()),
        ));
    }
    vol_data_listed(&entries, &dir.join(VOL_DATA))?;
    let data = read_vol_data(tree, &dir.join(VOL_DATA))?;
    let (driver, handle) = required(&data, &dir.join(VOL_DATA))?;
    let ephemeral = match data.lifecycle_mode.as_deref() {
        // Kubelets before ephemeral volumes wrote no mode.
        None | Some("Persistent") => false,
        Some("Ephemeral") => true,
        Some(other) => {
            return Err(unexpected(
                &dir.join(VOL_DATA),
                format!("unknown volumeLifecycleMode {other:?}"),
            ))
        }
    };
    let (kind, pv, staging_path) = if ephemeral {
        // Ephemeral volumes are never staged and have no PV.
        (VolumeKind::CsiEphemeral, None, None)
    } else {
        let pv = data.spec_vol_id.clone().unwrap_or_else(|| name.to_string());
        let staging = staging_path(tree, csi_plugins, &driver, &handle, &pv);
        (VolumeKind::Csi, Some(pv), staging)
    };
    Ok(Some(KubeletVolume {
        pod_uid: uid.to_string(),
        pv,
        pod_volume_dir_name: name.to_string(),
        driver: Some(driver),
        volume_handle: Some(handle),
        volume_mode: VolumeMode::Filesystem,
        kind,
        path: dir.join("mount"),
        staging_path,
        node_name: data.node_name,
    }))
}

/// The staging mount of a persistent CSI volume, if kubelet made one.
fn staging_path(
    tree: &Tree,
    csi_plugins: &Path,
    driver: &str,
    handle: &str,
    pv: &str,
) -> Option<PathBuf> {
    // Newer kubelets: <driver>/<sha256(volumeHandle)>/globalmount.
    if is_single_component(driver) {
        let sha = hex(&Sha256::digest(handle.as_bytes()));
        let dir = csi_plugins.join(driver).join(sha);
        if tree.has_entry(&dir, "globalmount") {
            return Some(dir.join("globalmount"));
        }
    }
    // Older kubelets: pv/<pv>/globalmount.
    if is_single_component(pv) {
        let dir = csi_plugins.join("pv").join(pv);
        if tree.has_entry(&dir, "globalmount") {
            return Some(dir.join("globalmount"));
        }
    }
    None
}

/// `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>` or the global map file.
pub(super) fn csi_block_volume(
    tree: &Tree,
    block_dir: &Path,
    uid: &str,
    pv_dir_name: &str,
    path: PathBuf,
    ty: EntryType,
) -> Result<KubeletVolume, Skip> {
    if !ty.is_device_like() {
        return Err(unexpected(
            &path,
            format!("not a device node or symlink ({})", ty.name()),
        ));
    }
    if !is_single_component(pv_dir_name) {
        return Err(unexpected(&path, "unusable volume name"));
    }
    let data_dir = block_dir.join(pv_dir_name).join("data");
    let vol_data = data_dir.join(VOL_DATA);
    vol_data_listed(&tree.read_entries(&data_dir)?, &vol_data)?;
    let data = read_vol_data(tree, &vol_data)?;
    let (driver, handle) = required(&data, &vol_data)?;
    let staging = tree
        .has_entry(&block_dir.join("staging"), pv_dir_name)
        .then(|| block_dir.join("staging").join(pv_dir_name));
    Ok(KubeletVolume {
        pod_uid: uid.to_string(),
        pv: Some(data.spec_vol_id.unwrap_or_else(|| pv_dir_name.to_string())),
        pod_volume_dir_name: pv_dir_name.to_string(),
        driver: Some(driver),
        volume_handle: Some(handle),
        volume_mode: VolumeMode::Block,
        kind: VolumeKind::Csi,
        path,
        staging_path: staging,
        node_name: data.node_name,
    })
}

/// `vol_data.json` must be listed as a regular file before it is opened: a
/// device node there is never opened (its driver's open could act), a link
/// never followed.
fn vol_data_listed(
    entries: &std::collections::BTreeMap<String, EntryType>,
    path: &Path,
) -> Result<(), Skip> {
    match entries.get(VOL_DATA) {
        Some(ty) if ty.is_file() => Ok(()),
        Some(ty) => Err(unexpected(
            path,
            format!("not a regular file ({}): not opened", ty.name()),
        )),
        None => Err(unexpected(path, "missing")),
    }
}

/// Guards the names taken from `vol_data.json` before they become paths.
fn is_single_component(name: &str) -> bool {
    check_name(name.as_bytes()).is_ok()
}

pub(super) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_vol_data_cannot_escape_the_tree() {
        assert!(is_single_component("disk.csi.example.com"));
        for bad in ["", ".", "..", "../../etc", "a/b"] {
            assert!(!is_single_component(bad), "{bad:?}");
        }
        // A known answer, so the staging lookup hashes like kubelet.
        assert_eq!(
            hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
