//! Fixtures the unit tests of the per-poll judges (stalls, latency) share:
//! a device, a block volume on one, and the words of a report.

use std::path::PathBuf;

use health_core::conditions::{CheckKind, CheckResult};
use health_core::dev::Dev;
use health_core::volume::VolumeMode;
use health_topology::BlockDevice;

use super::checks::CheckReport;
use super::kubelet::{KubeletVolume, VolumeKind};
use super::IndexedVolume;

pub fn device(dev: Dev, name: &str, slaves: Vec<Dev>) -> BlockDevice {
    BlockDevice {
        dev,
        name: name.into(),
        whole_disk: None,
        partition: None,
        size_sectors: 131_072,
        loop_backing_file: None,
        holders: Vec::new(),
        slaves,
        read_only: false,
        diskseq: None,
    }
}

/// Pod `pod-a`'s block volume `pv-a` on `dev` (at /dev/`name`).
pub fn block_volume(dev: Dev, name: &str) -> IndexedVolume {
    let volume = KubeletVolume {
        pod_uid: "pod-a".into(),
        pv: Some("pv-a".into()),
        pod_volume_dir_name: "pv-a".into(),
        driver: None,
        volume_handle: None,
        volume_mode: VolumeMode::Block,
        kind: VolumeKind::LocalVolume,
        path: PathBuf::from(format!("/dev/{name}")),
        staging_path: None,
        node_name: None,
    };
    IndexedVolume {
        key: volume.key(),
        volume,
        device: Some(dev),
    }
}

/// The first finding's message of `kind`, `pass`, or what else it was.
pub fn verdict(report: &CheckReport, kind: CheckKind) -> String {
    match report.result(kind) {
        Some(CheckResult::Found(f)) => f[0].message(),
        Some(CheckResult::Pass) => "pass".into(),
        other => format!("{other:?}"),
    }
}
