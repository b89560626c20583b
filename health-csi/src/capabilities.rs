//! What a driver advertises, and which health RPC that makes us call.
//!
//! The decision is the kubelet's (and external-health-monitor's): a CSI 1.13
//! health RPC is called only when its capability is advertised; the legacy
//! `volume_condition` is read only from drivers advertising VOLUME_CONDITION
//! together with the RPC that carries it; a driver advertising neither is
//! not asked about health at all. Nothing is learnt by calling: an RPC that
//! answers UNIMPLEMENTED despite its capability is an error every time.

use serde::{Deserialize, Serialize};

use crate::proto;
use crate::types::{ControllerHealthSource, HealthSource};

/// Node service capabilities with known numbers, plus the raw values of any
/// others (a newer spec's, never interpreted).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct NodeCapabilities {
    pub stage_unstage_volume: bool,
    pub get_volume_stats: bool,
    pub expand_volume: bool,
    /// CSI <= 1.12 only (the number is reserved since 1.13).
    pub volume_condition: bool,
    pub single_node_multi_writer: bool,
    pub volume_mount_group: bool,
    /// CSI 1.13 GET_VOLUME_HEALTH: NodeGetVolumeHealth is served.
    pub get_volume_health: bool,
    /// CSI 1.13 GET_STORAGE_HEALTH: NodeGetStorageHealth is served.
    pub get_storage_health: bool,
    pub other: Vec<i32>,
}

impl NodeCapabilities {
    pub(crate) fn from_wire(caps: Vec<proto::NodeServiceCapability>) -> Self {
        use proto::node_service_capability::rpc::Type;
        use proto::node_service_capability::Type as Arm;
        let mut out = NodeCapabilities::default();
        for cap in caps {
            // Non-RPC arms do not exist in the node service today; skipping
            // them keeps us working against a newer spec.
            let Some(Arm::Rpc(rpc)) = cap.r#type else {
                continue;
            };
            match Type::try_from(rpc.r#type) {
                Ok(Type::StageUnstageVolume) => out.stage_unstage_volume = true,
                Ok(Type::GetVolumeStats) => out.get_volume_stats = true,
                Ok(Type::ExpandVolume) => out.expand_volume = true,
                Ok(Type::VolumeCondition) => out.volume_condition = true,
                Ok(Type::SingleNodeMultiWriter) => out.single_node_multi_writer = true,
                Ok(Type::VolumeMountGroup) => out.volume_mount_group = true,
                Ok(Type::GetVolumeHealth) => out.get_volume_health = true,
                Ok(Type::GetStorageHealth) => out.get_storage_health = true,
                Ok(Type::Unknown) | Err(_) => out.other.push(rpc.r#type),
            }
        }
        out
    }

    /// The RPC that tells one volume's health, or `None` when the driver
    /// advertises no way to ask. NodeGetVolumeHealth wins over the legacy
    /// condition of a driver advertising both; the legacy condition rides on
    /// NodeGetVolumeStats, so it needs GET_VOLUME_STATS as well.
    pub fn volume_health_rpc(&self) -> Option<HealthSource> {
        if self.get_volume_health {
            Some(HealthSource::NodeGetVolumeHealth)
        } else if self.volume_condition && self.get_volume_stats {
            Some(HealthSource::NodeGetVolumeStats)
        } else {
            None
        }
    }
}

/// Controller service capabilities with known numbers, plus raw others.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ControllerCapabilities {
    pub list_volumes: bool,
    pub list_volumes_published_nodes: bool,
    /// CSI <= 1.12 only (the number is reserved since 1.13).
    pub volume_condition: bool,
    pub get_volume: bool,
    /// CSI 1.13 GET_VOLUME_HEALTH: ControllerGetVolumeHealth is served.
    pub get_volume_health: bool,
    /// CSI 1.13 LIST_VOLUME_HEALTH: ControllerListVolumeHealth is served.
    pub list_volume_health: bool,
    pub other: Vec<i32>,
}

impl ControllerCapabilities {
    pub(crate) fn from_wire(caps: Vec<proto::ControllerServiceCapability>) -> Self {
        use proto::controller_service_capability::rpc::Type;
        use proto::controller_service_capability::Type as Arm;
        let mut out = ControllerCapabilities::default();
        for cap in caps {
            let Some(Arm::Rpc(rpc)) = cap.r#type else {
                continue;
            };
            match Type::try_from(rpc.r#type) {
                Ok(Type::ListVolumes) => out.list_volumes = true,
                Ok(Type::ListVolumesPublishedNodes) => out.list_volumes_published_nodes = true,
                Ok(Type::VolumeCondition) => out.volume_condition = true,
                Ok(Type::GetVolume) => out.get_volume = true,
                Ok(Type::GetVolumeHealth) => out.get_volume_health = true,
                Ok(Type::ListVolumeHealth) => out.list_volume_health = true,
                // CREATE_DELETE_VOLUME is named in the proto for the test
                // driver; to the agent it is one more capability it does
                // not use, kept raw as before.
                Ok(Type::Unknown | Type::CreateDeleteVolume) | Err(_) => out.other.push(rpc.r#type),
            }
        }
        out
    }

    /// The RPC that lists every volume's health in pages, or `None`.
    /// ControllerListVolumeHealth wins over a legacy ListVolumes, which
    /// carries conditions only from drivers advertising VOLUME_CONDITION.
    pub fn list_health_rpc(&self) -> Option<ControllerHealthSource> {
        if self.list_volume_health {
            Some(ControllerHealthSource::ControllerListVolumeHealth)
        } else if self.list_volumes && self.volume_condition {
            Some(ControllerHealthSource::ListVolumes)
        } else {
            None
        }
    }

    /// The RPC that tells one volume's health, or `None`; as
    /// [`ControllerCapabilities::list_health_rpc`] for one volume.
    pub fn get_health_rpc(&self) -> Option<ControllerHealthSource> {
        if self.get_volume_health {
            Some(ControllerHealthSource::ControllerGetVolumeHealth)
        } else if self.get_volume && self.volume_condition {
            Some(ControllerHealthSource::ControllerGetVolume)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::controller_service_capability::rpc::Type as C;
    use proto::node_service_capability::rpc::Type as N;

    fn node(types: &[N]) -> NodeCapabilities {
        use proto::node_service_capability::{Rpc, Type as Arm};
        NodeCapabilities::from_wire(
            types
                .iter()
                .map(|t| proto::NodeServiceCapability {
                    r#type: Some(Arm::Rpc(Rpc { r#type: *t as i32 })),
                })
                .collect(),
        )
    }

    fn controller(types: &[C]) -> ControllerCapabilities {
        use proto::controller_service_capability::{Rpc, Type as Arm};
        ControllerCapabilities::from_wire(
            types
                .iter()
                .map(|t| proto::ControllerServiceCapability {
                    r#type: Some(Arm::Rpc(Rpc { r#type: *t as i32 })),
                })
                .collect(),
        )
    }

    /// The numbers of CSI v1.13.0 (see the header of `proto/csi.proto`):
    /// a driver sends these integers, whatever we call them.
    #[test]
    fn capability_numbers_are_the_published_ones() {
        assert_eq!(N::VolumeCondition as i32, 4);
        assert_eq!(N::GetVolumeHealth as i32, 7);
        assert_eq!(N::GetStorageHealth as i32, 8);
        assert_eq!(C::VolumeCondition as i32, 11);
        assert_eq!(C::GetVolumeHealth as i32, 16);
        assert_eq!(C::ListVolumeHealth as i32, 17);
        assert_eq!(proto::VolumeHealthErrorType::Degraded as i32, 1);
        assert_eq!(proto::VolumeHealthErrorType::Inaccessible as i32, 2);
        assert_eq!(proto::VolumeHealthErrorType::DataLoss as i32, 3);
        assert_eq!(proto::StorageHealthErrorType::StorageDegraded as i32, 1);
        assert_eq!(proto::StorageHealthErrorType::StorageUnreachable as i32, 2);
    }

    #[test]
    fn node_health_rpc_follows_the_capabilities() {
        let modern = node(&[N::GetVolumeStats, N::GetVolumeHealth, N::GetStorageHealth]);
        assert!(modern.get_volume_health && modern.get_storage_health);
        assert!(modern.other.is_empty());
        assert_eq!(
            modern.volume_health_rpc(),
            Some(HealthSource::NodeGetVolumeHealth)
        );
        // A driver advertising both generations is asked the 1.13 way.
        let both = node(&[N::GetVolumeStats, N::VolumeCondition, N::GetVolumeHealth]);
        assert_eq!(
            both.volume_health_rpc(),
            Some(HealthSource::NodeGetVolumeHealth)
        );
        let legacy = node(&[N::GetVolumeStats, N::VolumeCondition]);
        assert_eq!(
            legacy.volume_health_rpc(),
            Some(HealthSource::NodeGetVolumeStats)
        );
        // The condition rides on the stats RPC: without it there is none.
        assert_eq!(node(&[N::VolumeCondition]).volume_health_rpc(), None);
        assert_eq!(node(&[N::GetVolumeStats]).volume_health_rpc(), None);
        assert_eq!(node(&[]).volume_health_rpc(), None);
        // A newer spec's number is kept, not interpreted.
        let newer = NodeCapabilities::from_wire(vec![proto::NodeServiceCapability {
            r#type: Some(proto::node_service_capability::Type::Rpc(
                proto::node_service_capability::Rpc { r#type: 99 },
            )),
        }]);
        assert_eq!(newer.other, vec![99]);
        assert_eq!(newer.volume_health_rpc(), None);
    }

    #[test]
    fn controller_health_rpcs_follow_the_capabilities() {
        let modern = controller(&[C::GetVolumeHealth, C::ListVolumeHealth]);
        assert_eq!(
            modern.list_health_rpc(),
            Some(ControllerHealthSource::ControllerListVolumeHealth)
        );
        assert_eq!(
            modern.get_health_rpc(),
            Some(ControllerHealthSource::ControllerGetVolumeHealth)
        );
        let legacy = controller(&[C::ListVolumes, C::GetVolume, C::VolumeCondition]);
        assert_eq!(
            legacy.list_health_rpc(),
            Some(ControllerHealthSource::ListVolumes)
        );
        assert_eq!(
            legacy.get_health_rpc(),
            Some(ControllerHealthSource::ControllerGetVolume)
        );
        let get_only = controller(&[C::ListVolumes, C::GetVolumeHealth]);
        assert_eq!(get_only.list_health_rpc(), None);
        assert_eq!(
            get_only.get_health_rpc(),
            Some(ControllerHealthSource::ControllerGetVolumeHealth)
        );
        let none = controller(&[C::ListVolumes, C::GetVolume]);
        assert_eq!(none.list_health_rpc(), None);
        assert_eq!(none.get_health_rpc(), None);
    }
}
