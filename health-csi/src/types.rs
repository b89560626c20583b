//! Driver-independent health records, and their conversion from the wire
//! messages of both CSI generations.

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use health_core::conditions::{CsiEntry, Status};
use serde::{Deserialize, Serialize};

use crate::proto;
use crate::proto::node_get_storage_health_response::StorageBackendHealth as StorageBackendHealthWire;

/// Reason given to a legacy `VolumeCondition{abnormal: true}`: the legacy
/// condition carries no reason of its own, and this is the word kubelet and
/// external-health-monitor already use for it in their events.
pub const LEGACY_ABNORMAL_REASON: &str = "VolumeConditionAbnormal";

/// Kind of adverse volume condition (CSI 1.13 `VolumeHealthErrorType`).
///
/// Serialized and displayed as the CamelCase words of the KEP-1432 status
/// vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum HealthStatus {
    Inaccessible,
    DataLoss,
    Degraded,
    /// `UNKNOWN_VOLUME_HEALTH_TYPE`, or a value newer than this crate.
    Unknown,
}

impl HealthStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Inaccessible => "Inaccessible",
            HealthStatus::DataLoss => "DataLoss",
            HealthStatus::Degraded => "Degraded",
            HealthStatus::Unknown => "Unknown",
        }
    }

    pub(crate) fn from_wire(value: i32) -> Self {
        // Proto3 enums are open: a driver speaking a newer spec may send a
        // value we do not know. It is still an adverse condition, so it is
        // kept as Unknown rather than dropped.
        match proto::VolumeHealthErrorType::try_from(value) {
            Ok(proto::VolumeHealthErrorType::Inaccessible) => HealthStatus::Inaccessible,
            Ok(proto::VolumeHealthErrorType::DataLoss) => HealthStatus::DataLoss,
            Ok(proto::VolumeHealthErrorType::Degraded) => HealthStatus::Degraded,
            Ok(proto::VolumeHealthErrorType::UnknownVolumeHealthType) | Err(_) => {
                HealthStatus::Unknown
            }
        }
    }

    #[cfg(feature = "testing")]
    pub(crate) fn to_wire(self) -> proto::VolumeHealthErrorType {
        match self {
            HealthStatus::Inaccessible => proto::VolumeHealthErrorType::Inaccessible,
            HealthStatus::DataLoss => proto::VolumeHealthErrorType::DataLoss,
            HealthStatus::Degraded => proto::VolumeHealthErrorType::Degraded,
            HealthStatus::Unknown => proto::VolumeHealthErrorType::UnknownVolumeHealthType,
        }
    }
}

impl fmt::Display for HealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One adverse condition of a volume. `(status, reason)` is its identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthEntry {
    pub status: HealthStatus,
    /// CamelCase reason from the driver (or [`LEGACY_ABNORMAL_REASON`]).
    pub reason: String,
    pub message: String,
}

impl HealthEntry {
    pub fn new(
        status: HealthStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        HealthEntry {
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    /// This entry in the condition machine's words (the node agent's CSI
    /// prober and the controller both feed these to it).
    pub fn to_evidence(&self) -> CsiEntry {
        let (status, message) = match self.status {
            HealthStatus::Inaccessible => (Status::Inaccessible, self.message.clone()),
            HealthStatus::DataLoss => (Status::DataLoss, self.message.clone()),
            HealthStatus::Degraded => (Status::Degraded, self.message.clone()),
            // An adverse condition of a type newer than we know: the mildest
            // status claims no more than the driver did, and the message says so.
            HealthStatus::Unknown => (
                Status::Degraded,
                format!("(health type unknown to this agent) {}", self.message),
            ),
        };
        CsiEntry {
            status,
            reason: self.reason.clone(),
            message,
        }
    }
}

/// One unit's numbers from `VolumeUsage`, as the driver reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageNumbers {
    pub available: i64,
    pub total: i64,
    pub used: i64,
}

/// Usage from legacy `NodeGetVolumeStats`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub bytes: Option<UsageNumbers>,
    pub inodes: Option<UsageNumbers>,
}

/// Which node RPC produced a report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HealthSource {
    /// CSI 1.13 `NodeGetVolumeHealth`.
    NodeGetVolumeHealth,
    /// Legacy `NodeGetVolumeStats` with its `volume_condition`.
    NodeGetVolumeStats,
}

/// What a node plugin said about one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeVolumeReport {
    pub source: HealthSource,
    /// `Some(vec![])`: the driver says the volume has no known adverse
    /// condition. `Some(entries)`: those conditions. `None`: the driver gave
    /// no health information at all (legacy stats without `volume_condition`,
    /// or a health response without its `volume_health` message); this must
    /// never be taken as healthy.
    pub entries: Option<Vec<HealthEntry>>,
    /// Only the legacy stats RPC carries usage.
    pub usage: Option<Usage>,
}

impl NodeVolumeReport {
    /// Whether the driver said anything about health.
    pub fn has_health_info(&self) -> bool {
        self.entries.is_some()
    }

    /// `Some(true)` only when the driver positively reported no adverse
    /// condition; `None` when it reported nothing.
    pub fn is_healthy(&self) -> Option<bool> {
        self.entries.as_ref().map(Vec::is_empty)
    }
}

/// `GetPluginInfo`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    pub name: String,
    pub vendor_version: String,
}

/// `NodeGetInfo`'s answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub node_id: String,
    pub max_volumes_per_node: i64,
}

/// Storage backend condition kind (CSI 1.13 `NodeGetStorageHealth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum StorageHealthStatus {
    StorageUnreachable,
    StorageDegraded,
    Unknown,
}

impl fmt::Display for StorageHealthStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StorageHealthStatus::StorageUnreachable => "StorageUnreachable",
            StorageHealthStatus::StorageDegraded => "StorageDegraded",
            StorageHealthStatus::Unknown => "Unknown",
        })
    }
}

/// The access type a `VolumeCapability` names (`block` or `mount`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AccessType {
    Block,
    Mount,
}

/// One adverse storage backend condition seen from this node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StorageHealthEntry {
    pub status: StorageHealthStatus,
    pub reason: String,
    pub message: String,
    /// `Some`: the condition concerns only volumes of this access type
    /// (`volume_capability` of the entry). `None`: every volume of the
    /// driver, also when the driver sent a capability without an access type.
    pub access_type: Option<AccessType>,
}

impl StorageHealthEntry {
    pub fn new(
        status: StorageHealthStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        StorageHealthEntry {
            status,
            reason: reason.into(),
            message: message.into(),
            access_type: None,
        }
    }

    /// The same entry, restricted to volumes of `access_type`.
    pub fn for_access_type(mut self, access_type: AccessType) -> Self {
        self.access_type = Some(access_type);
        self
    }

    pub(crate) fn from_wire(b: StorageBackendHealthWire) -> Self {
        use proto::volume_capability::AccessType as Wire;
        use proto::StorageHealthErrorType as Status;
        let status = match Status::try_from(b.status) {
            Ok(Status::StorageUnreachable) => StorageHealthStatus::StorageUnreachable,
            Ok(Status::StorageDegraded) => StorageHealthStatus::StorageDegraded,
            Ok(Status::UnknownStorageHealthErrorType) | Err(_) => StorageHealthStatus::Unknown,
        };
        let access_type = match b.volume_capability.and_then(|c| c.access_type) {
            Some(Wire::Block(_)) => Some(AccessType::Block),
            Some(Wire::Mount(_)) => Some(AccessType::Mount),
            None => None,
        };
        StorageHealthEntry {
            status,
            reason: b.reason,
            message: b.message,
            access_type,
        }
    }

    #[cfg(feature = "testing")]
    pub(crate) fn to_wire(&self) -> StorageBackendHealthWire {
        use proto::volume_capability::{AccessType as Wire, BlockVolume, MountVolume};
        use proto::StorageHealthErrorType as Status;
        let status = match self.status {
            StorageHealthStatus::StorageUnreachable => Status::StorageUnreachable,
            StorageHealthStatus::StorageDegraded => Status::StorageDegraded,
            StorageHealthStatus::Unknown => Status::UnknownStorageHealthErrorType,
        };
        let access_type = self.access_type.map(|a| match a {
            AccessType::Block => Wire::Block(BlockVolume {}),
            AccessType::Mount => Wire::Mount(MountVolume::default()),
        });
        StorageBackendHealthWire {
            status: status as i32,
            reason: self.reason.clone(),
            message: self.message.clone(),
            volume_capability: access_type.map(|a| proto::VolumeCapability {
                access_type: Some(a),
                access_mode: None,
            }),
        }
    }
}

/// Which controller RPC produced a controller-side report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ControllerHealthSource {
    /// CSI 1.13 `ControllerGetVolumeHealth`.
    ControllerGetVolumeHealth,
    /// Legacy `ControllerGetVolume` (`status.volume_condition`).
    ControllerGetVolume,
    /// CSI 1.13 `ControllerListVolumeHealth`.
    ControllerListVolumeHealth,
    /// Legacy `ListVolumes` (`status.volume_condition`).
    ListVolumes,
}

/// What the controller plugin said about one volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControllerVolumeReport {
    pub source: ControllerHealthSource,
    /// Same meaning as [`NodeVolumeReport::entries`].
    pub entries: Option<Vec<HealthEntry>>,
}

/// Result of walking every page of a controller volume listing.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeHealthList {
    pub source: ControllerHealthSource,
    /// Volumes seen on any page, merged across pages: a volume listed twice
    /// gets the union of its conditions (later message wins for the same
    /// `(status, reason)`), because pages may be inconsistent and the worst
    /// case is assumed. `None` = listed without any health information
    /// (legacy driver without VOLUME_CONDITION).
    ///
    /// The 1.13 list SHOULD omit healthy volumes, so absence from this map is
    /// not proof of health; the legacy list names every volume.
    pub volumes: BTreeMap<String, Option<Vec<HealthEntry>>>,
    /// True when the walk reached an empty `next_token`. False when it stopped
    /// at the page limit or on a repeated token: callers must not clear
    /// conditions of volumes missing from an incomplete list.
    pub complete: bool,
    pub pages: u32,
}

/// Distinct `(status, reason)` kept per volume. The spec sets no bound, and a
/// 4 MB answer (tonic's decoding limit) holds some 500k tiny entries; what is
/// beyond this is dropped here (the agent keeps far fewer and says so).
pub const MAX_ENTRIES_PER_VOLUME: usize = 1024;

/// Merge `new` into `into`, keyed by `(status, reason)`: an existing key gets
/// the newer message, a new key is appended while there is room (see
/// [`MAX_ENTRIES_PER_VOLUME`]). Order of first appearance is kept so output is
/// stable for the caller's change detection. Linear in the entries: a driver
/// sending hundreds of thousands of them must not cost quadratic time.
pub(crate) fn merge_entries(
    into: &mut Vec<HealthEntry>,
    new: impl IntoIterator<Item = HealthEntry>,
) {
    let mut index: HashMap<(HealthStatus, String), usize> = into
        .iter()
        .enumerate()
        .map(|(i, e)| ((e.status, e.reason.clone()), i))
        .collect();
    for entry in new {
        match index.get(&(entry.status, entry.reason.clone())) {
            Some(&i) => into[i].message = entry.message,
            None if into.len() < MAX_ENTRIES_PER_VOLUME => {
                index.insert((entry.status, entry.reason.clone()), into.len());
                into.push(entry);
            }
            None => {}
        }
    }
}

/// CSI 1.13 entries to ours; duplicates of `(status, reason)` (which the spec
/// forbids) are folded so callers can rely on the key being unique.
pub(crate) fn entries_from_wire(
    wire: Vec<proto::volume_health::VolumeHealthEntry>,
) -> Vec<HealthEntry> {
    let mut out = Vec::with_capacity(wire.len());
    merge_entries(
        &mut out,
        wire.into_iter().map(|e| HealthEntry {
            status: HealthStatus::from_wire(e.status),
            reason: e.reason,
            message: e.message,
        }),
    );
    out
}

/// Legacy condition to entries. An absent condition is "no information";
/// `abnormal: false` is a positive "healthy".
pub(crate) fn entries_from_condition(
    condition: Option<proto::VolumeCondition>,
) -> Option<Vec<HealthEntry>> {
    let condition = condition?;
    if !condition.abnormal {
        return Some(Vec::new());
    }
    // The legacy flag does not say how the volume is abnormal; Degraded is
    // the mildest adverse status and claims no more than the driver did.
    Some(vec![HealthEntry::new(
        HealthStatus::Degraded,
        LEGACY_ABNORMAL_REASON,
        condition.message,
    )])
}

pub(crate) fn usage_from_wire(usage: Vec<proto::VolumeUsage>) -> Option<Usage> {
    use proto::volume_usage::Unit;
    let mut out = Usage::default();
    for u in usage {
        let numbers = UsageNumbers {
            available: u.available,
            total: u.total,
            used: u.used,
        };
        match Unit::try_from(u.unit) {
            Ok(Unit::Bytes) => out.bytes = Some(numbers),
            Ok(Unit::Inodes) => out.inodes = Some(numbers),
            // Numbers in an unknown unit cannot be interpreted.
            Ok(Unit::Unknown) | Err(_) => {}
        }
    }
    (out.bytes.is_some() || out.inodes.is_some()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_words() {
        assert_eq!(HealthStatus::DataLoss.to_string(), "DataLoss");
        assert_eq!(
            serde_json::to_string(&HealthStatus::Inaccessible)
                .ok()
                .as_deref(),
            Some("\"Inaccessible\"")
        );
        assert_eq!(HealthStatus::from_wire(42), HealthStatus::Unknown);
        // CSI v1.13.0's numbers (rc1 had INACCESSIBLE=1 ... DEGRADED=3).
        assert_eq!(HealthStatus::from_wire(0), HealthStatus::Unknown);
        assert_eq!(HealthStatus::from_wire(1), HealthStatus::Degraded);
        assert_eq!(HealthStatus::from_wire(2), HealthStatus::Inaccessible);
        assert_eq!(HealthStatus::from_wire(3), HealthStatus::DataLoss);
    }

    #[test]
    fn legacy_condition_mapping() {
        assert_eq!(entries_from_condition(None), None);
        assert_eq!(
            entries_from_condition(Some(proto::VolumeCondition {
                abnormal: false,
                message: "fine".into()
            })),
            Some(vec![])
        );
        assert_eq!(
            entries_from_condition(Some(proto::VolumeCondition {
                abnormal: true,
                message: "bad".into()
            })),
            Some(vec![HealthEntry::new(
                HealthStatus::Degraded,
                "VolumeConditionAbnormal",
                "bad"
            )])
        );
    }

    #[test]
    fn duplicate_keys_fold() {
        let wire = vec![
            proto::volume_health::VolumeHealthEntry {
                status: 2,
                reason: "A".into(),
                message: "old".into(),
            },
            proto::volume_health::VolumeHealthEntry {
                status: 1,
                reason: "A".into(),
                message: "other".into(),
            },
            proto::volume_health::VolumeHealthEntry {
                status: 2,
                reason: "A".into(),
                message: "new".into(),
            },
        ];
        assert_eq!(
            entries_from_wire(wire),
            vec![
                HealthEntry::new(HealthStatus::Inaccessible, "A", "new"),
                HealthEntry::new(HealthStatus::Degraded, "A", "other"),
            ]
        );
    }

    #[test]
    fn half_a_million_entries_merge_in_linear_time_and_are_capped() {
        let wire: Vec<proto::volume_health::VolumeHealthEntry> = (0..500_000)
            .map(|i| proto::volume_health::VolumeHealthEntry {
                status: 2 + i % 3,
                reason: format!("R{}", i % 200_000),
                message: i.to_string(),
            })
            .collect();
        let got = entries_from_wire(wire);
        assert_eq!(got.len(), MAX_ENTRIES_PER_VOLUME);
        // All keys are distinct (they repeat every 600k); the first 1024 stay.
        // Statuses 2, 3, 4 (4 is newer than this crate: Unknown), in turn.
        assert_eq!(
            got[0],
            HealthEntry::new(HealthStatus::Inaccessible, "R0", "0")
        );
        assert_eq!(got[1], HealthEntry::new(HealthStatus::DataLoss, "R1", "1"));
        assert_eq!(got[2], HealthEntry::new(HealthStatus::Unknown, "R2", "2"));
        assert_eq!(
            got[1023],
            HealthEntry::new(HealthStatus::Inaccessible, "R1023", "1023")
        );
    }

    #[test]
    fn storage_entries_from_the_wire() {
        use proto::volume_capability::{AccessType as Wire, BlockVolume};
        let wire = |status, capability| StorageBackendHealthWire {
            status,
            reason: "R".into(),
            message: "m".into(),
            volume_capability: capability,
        };
        // A status newer than this crate is kept, as Unknown.
        assert_eq!(
            StorageHealthEntry::from_wire(wire(9, None)),
            StorageHealthEntry::new(StorageHealthStatus::Unknown, "R", "m")
        );
        assert_eq!(
            StorageHealthEntry::from_wire(wire(
                2,
                Some(proto::VolumeCapability {
                    access_type: Some(Wire::Block(BlockVolume {})),
                    access_mode: None,
                })
            )),
            StorageHealthEntry::new(StorageHealthStatus::StorageUnreachable, "R", "m")
                .for_access_type(AccessType::Block)
        );
        // CSI v1.13.0 numbers STORAGE_DEGRADED 1 (rc1 had it 2).
        assert_eq!(
            StorageHealthEntry::from_wire(wire(1, None)).status,
            StorageHealthStatus::StorageDegraded
        );
        // A capability without an access type restricts nothing.
        assert_eq!(
            StorageHealthEntry::from_wire(wire(2, Some(proto::VolumeCapability::default())))
                .access_type,
            None
        );
    }

    #[test]
    fn usage_units() {
        let usage = usage_from_wire(vec![
            proto::VolumeUsage {
                available: 1,
                total: 3,
                used: 2,
                unit: 1,
            },
            proto::VolumeUsage {
                available: 9,
                total: 9,
                used: 9,
                unit: 0,
            },
        ]);
        assert_eq!(
            usage,
            Some(Usage {
                bytes: Some(UsageNumbers {
                    available: 1,
                    total: 3,
                    used: 2
                }),
                inodes: None
            })
        );
        assert_eq!(usage_from_wire(vec![]), None);
    }
}
