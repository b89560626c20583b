//! kubelet's `vol_data.json`: the driver, volume handle and PV name it
//! recorded for a CSI volume.

use std::fs;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use super::{unexpected, Skip};

pub(super) const VOL_DATA: &str = "vol_data.json";
/// kubelet writes a handful of short strings; anything bigger is not ours.
const VOL_DATA_MAX_BYTES: u64 = 64 * 1024;

/// The keys kubelet writes into `vol_data.json`.
#[derive(Debug, Deserialize)]
pub(super) struct VolData {
    #[serde(rename = "driverName")]
    pub(super) driver_name: Option<String>,
    #[serde(rename = "volumeHandle")]
    pub(super) volume_handle: Option<String>,
    #[serde(rename = "specVolID")]
    pub(super) spec_vol_id: Option<String>,
    #[serde(rename = "nodeName")]
    pub(super) node_name: Option<String>,
    #[serde(rename = "volumeLifecycleMode")]
    pub(super) lifecycle_mode: Option<String>,
}

pub(super) fn required(data: &VolData, path: &Path) -> Result<(String, String), Skip> {
    match (&data.driver_name, &data.volume_handle) {
        (Some(d), Some(h)) if !d.is_empty() && !h.is_empty() => Ok((d.clone(), h.clone())),
        _ => Err(unexpected(path, "driverName or volumeHandle missing")),
    }
}

pub(super) fn read_vol_data(path: &Path) -> Result<VolData, Skip> {
    let io_err = |source| Skip::Io {
        path: path.to_path_buf(),
        source,
    };
    // Not following a symlink here keeps the walk inside the kubelet tree.
    let meta = fs::symlink_metadata(path).map_err(io_err)?;
    if !meta.file_type().is_file() {
        return Err(unexpected(path, "not a regular file"));
    }
    let mut text = String::new();
    fs::File::open(path)
        .and_then(|f| f.take(VOL_DATA_MAX_BYTES).read_to_string(&mut text))
        .map_err(io_err)?;
    serde_json::from_str(&text).map_err(|source| Skip::Json {
        path: path.to_path_buf(),
        source,
    })
}
