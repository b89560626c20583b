//! CSI storage backend health (`NodeGetStorageHealth`, CSI 1.13): one call
//! per driver per CSI cycle, and what the driver's answer means for each of
//! its volumes on this node.
//!
//! A backend condition concerns every volume of the driver, so the answer
//! becomes the `csi-storage` conditions of each of them: STORAGE_UNREACHABLE
//! is `Inaccessible`, STORAGE_DEGRADED `Degraded`, and a type newer than this
//! agent `Degraded` with a message saying so (the mildest status claims no
//! more than the driver did, as for volume health in `csi`).
//!
//! `volume_capability`: an entry that names an access type concerns only the
//! driver's volumes of that type (block for `Block` volume mode, mount for
//! `Filesystem`). The agent always knows a volume's mode, from where kubelet
//! put it (`volumeDevices/` or `volumes/`), so the restriction is always
//! applied; an entry without an access type concerns every volume.

use std::path::PathBuf;

use health_core::conditions::{CsiEntry, CsiReport, Status};
use health_csi::{AccessType, CsiError, StorageHealthEntry, StorageHealthStatus, StorageProbe};
use serde::Serialize;

use super::IndexedVolume;
use crate::volumes::kubelet::{VolumeKind, VolumeMode};

/// What one driver said about its storage.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum StorageResult {
    /// The driver's complete list of adverse backend conditions (empty: none
    /// known).
    Health { entries: Vec<StorageHealthEntry> },
    /// The driver does not advertise GET_STORAGE_HEALTH, so it was not
    /// asked: no information, so conditions raised before are neither
    /// confirmed nor cleared.
    Unsupported,
    /// Timeout, transport or any other error, UNIMPLEMENTED from a driver
    /// advertising GET_STORAGE_HEALTH included: never a recovery.
    ProbeFailed { error: String },
}

/// One driver's storage probe.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StorageOutcome {
    pub driver: String,
    /// The socket the driver was asked on.
    pub socket: Option<PathBuf>,
    #[serde(flatten)]
    pub result: StorageResult,
}

impl StorageOutcome {
    pub(super) fn from_probe(probe: StorageProbe, socket: Option<PathBuf>) -> Self {
        let result = match probe.result {
            Ok(entries) => StorageResult::Health { entries },
            Err(CsiError::NotAdvertised { .. }) => StorageResult::Unsupported,
            Err(e) => StorageResult::ProbeFailed {
                error: e.to_string(),
            },
        };
        StorageOutcome {
            driver: probe.driver,
            socket,
            result,
        }
    }

    /// The condition machine's view of the answer for one volume of the
    /// driver; `None` when the answer carries no information.
    pub fn report_for(&self, mode: VolumeMode) -> Option<CsiReport> {
        match &self.result {
            StorageResult::Health { entries } => Some(CsiReport::Health(
                entries
                    .iter()
                    .filter(|e| applies(e, mode))
                    .map(|e| storage_entry(e, &self.driver))
                    .collect(),
            )),
            StorageResult::Unsupported => None,
            StorageResult::ProbeFailed { error } => Some(CsiReport::ProbeFailed(error.clone())),
        }
    }
}

/// The volumes a driver's storage answer is about: the CSI volumes the CSI
/// prober asks that driver about (local PVs have no driver to answer).
pub(super) fn is_csi_volume_of(v: &IndexedVolume, driver: &str) -> bool {
    v.volume.driver.as_deref() == Some(driver)
        && matches!(v.volume.kind, VolumeKind::Csi | VolumeKind::CsiEphemeral)
}

fn applies(e: &StorageHealthEntry, mode: VolumeMode) -> bool {
    match (e.access_type, mode) {
        (None, _) => true,
        (Some(AccessType::Block), VolumeMode::Block) => true,
        (Some(AccessType::Mount), VolumeMode::Filesystem) => true,
        (Some(_), _) => false,
    }
}

fn storage_entry(e: &StorageHealthEntry, driver: &str) -> CsiEntry {
    let (status, default_reason, state) = match e.status {
        StorageHealthStatus::StorageUnreachable => {
            (Status::Inaccessible, "StorageUnreachable", "unreachable")
        }
        StorageHealthStatus::StorageDegraded => (Status::Degraded, "StorageDegraded", "degraded"),
        StorageHealthStatus::Unknown => (
            Status::Degraded,
            "StorageDegraded",
            "in an adverse state of a type unknown to this agent",
        ),
    };
    let reason = match e.reason.trim() {
        "" => default_reason.to_string(),
        given => given.to_string(),
    };
    let scope = match e.access_type {
        None => "",
        Some(AccessType::Block) => " (block volumes)",
        Some(AccessType::Mount) => " (filesystem volumes)",
    };
    let mut message = format!("CSI driver {driver} reports its storage {state}{scope}");
    if !e.message.is_empty() {
        message.push_str(": ");
        message.push_str(&e.message);
    }
    CsiEntry {
        status,
        reason,
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(entries: Vec<StorageHealthEntry>) -> StorageOutcome {
        StorageOutcome {
            driver: "d.csi".into(),
            socket: None,
            result: StorageResult::Health { entries },
        }
    }

    fn entry(status: Status, reason: &str, message: &str) -> CsiEntry {
        CsiEntry {
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    #[test]
    fn statuses_reasons_and_messages() {
        let o = outcome(vec![
            StorageHealthEntry::new(
                StorageHealthStatus::StorageUnreachable,
                "ArrayOffline",
                "a1: all paths down",
            ),
            StorageHealthEntry::new(StorageHealthStatus::StorageDegraded, "", ""),
            StorageHealthEntry::new(StorageHealthStatus::Unknown, " ", "odd"),
            StorageHealthEntry::new(StorageHealthStatus::StorageUnreachable, "", "x"),
        ]);
        assert_eq!(
            o.report_for(VolumeMode::Filesystem),
            Some(CsiReport::Health(vec![
                entry(
                    Status::Inaccessible,
                    "ArrayOffline",
                    "CSI driver d.csi reports its storage unreachable: a1: all paths down"
                ),
                entry(
                    Status::Degraded,
                    "StorageDegraded",
                    "CSI driver d.csi reports its storage degraded"
                ),
                entry(
                    Status::Degraded,
                    "StorageDegraded",
                    "CSI driver d.csi reports its storage in an adverse state of a type \
                     unknown to this agent: odd"
                ),
                entry(
                    Status::Inaccessible,
                    "StorageUnreachable",
                    "CSI driver d.csi reports its storage unreachable: x"
                ),
            ]))
        );
    }

    #[test]
    fn access_type_restricts_the_entry_to_volumes_of_that_mode() {
        let o = outcome(vec![
            StorageHealthEntry::new(StorageHealthStatus::StorageDegraded, "PoolSlow", "p1")
                .for_access_type(AccessType::Block),
            StorageHealthEntry::new(StorageHealthStatus::StorageDegraded, "FsGatewayDown", "g")
                .for_access_type(AccessType::Mount),
            StorageHealthEntry::new(StorageHealthStatus::StorageUnreachable, "Net", "n"),
        ]);
        let reasons = |mode| match o.report_for(mode) {
            Some(CsiReport::Health(entries)) => entries
                .into_iter()
                .map(|e| (e.reason, e.message))
                .collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            reasons(VolumeMode::Block),
            [
                (
                    "PoolSlow".to_string(),
                    "CSI driver d.csi reports its storage degraded (block volumes): p1".to_string()
                ),
                (
                    "Net".to_string(),
                    "CSI driver d.csi reports its storage unreachable: n".to_string()
                ),
            ]
        );
        assert_eq!(
            reasons(VolumeMode::Filesystem),
            [
                (
                    "FsGatewayDown".to_string(),
                    "CSI driver d.csi reports its storage degraded (filesystem volumes): g"
                        .to_string()
                ),
                (
                    "Net".to_string(),
                    "CSI driver d.csi reports its storage unreachable: n".to_string()
                ),
            ]
        );
    }

    #[test]
    fn unsupported_says_nothing_and_failure_is_a_failed_probe() {
        let unsupported = StorageOutcome::from_probe(
            StorageProbe {
                driver: "d.csi".into(),
                result: Err(CsiError::NotAdvertised {
                    rpc: "NodeGetStorageHealth",
                    needs: "GET_STORAGE_HEALTH",
                }),
            },
            None,
        );
        assert_eq!(unsupported.result, StorageResult::Unsupported);
        assert_eq!(unsupported.report_for(VolumeMode::Filesystem), None);
        // UNIMPLEMENTED from a driver that advertised the RPC is its fault,
        // and a failed probe like any other.
        let broken = StorageOutcome::from_probe(
            StorageProbe {
                driver: "d.csi".into(),
                result: Err(CsiError::Unsupported {
                    rpc: "NodeGetStorageHealth",
                }),
            },
            None,
        );
        assert_eq!(
            broken.report_for(VolumeMode::Filesystem),
            Some(CsiReport::ProbeFailed(
                "CSI driver does not support NodeGetStorageHealth".into()
            ))
        );
        let failed = StorageOutcome::from_probe(
            StorageProbe {
                driver: "d.csi".into(),
                result: Err(CsiError::Timeout {
                    rpc: "NodeGetStorageHealth",
                    after: std::time::Duration::from_secs(5),
                }),
            },
            None,
        );
        assert_eq!(
            failed.report_for(VolumeMode::Block),
            Some(CsiReport::ProbeFailed(
                "CSI NodeGetStorageHealth timed out after 5s".into()
            ))
        );
        let json = serde_json::to_value(&failed).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "driver": "d.csi",
                "socket": null,
                "result": "probe_failed",
                "error": "CSI NodeGetStorageHealth timed out after 5s",
            })
        );
    }
}
