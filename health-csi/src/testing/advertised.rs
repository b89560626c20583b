//! What the test driver advertises: the capabilities of its mode's driver
//! generation, less those of RPCs a test made UNIMPLEMENTED, unless the
//! test set them itself.

use super::{lock, ControllerCapability, DriverMode, NodeCapability, Rpc, State};

impl State {
    /// What NodeGetCapabilities answers in `mode`.
    pub(super) fn node_capabilities(&self, mode: DriverMode) -> Vec<NodeCapability> {
        if let Some(set) = lock(&self.node_capabilities).clone() {
            return set;
        }
        let mut caps = vec![
            NodeCapability::StageUnstageVolume,
            NodeCapability::GetVolumeStats,
        ];
        match mode {
            DriverMode::Modern | DriverMode::Hang => caps.extend([
                NodeCapability::GetVolumeHealth,
                NodeCapability::GetStorageHealth,
            ]),
            DriverMode::LegacyOnly => caps.push(NodeCapability::VolumeCondition),
            DriverMode::LegacyNoCondition | DriverMode::Unimplemented => {}
        }
        let lacking = lock(&self.unimplemented).clone();
        caps.retain(|cap| {
            !lacking
                .iter()
                .any(|rpc| node_capability_of(*rpc) == Some(*cap))
        });
        caps
    }

    /// What ControllerGetCapabilities answers in `mode`.
    pub(super) fn controller_capabilities(&self, mode: DriverMode) -> Vec<ControllerCapability> {
        if let Some(set) = lock(&self.controller_capabilities).clone() {
            return set;
        }
        let mut caps = vec![
            ControllerCapability::ListVolumes,
            ControllerCapability::GetVolume,
        ];
        match mode {
            DriverMode::Modern | DriverMode::Hang => caps.extend([
                ControllerCapability::GetVolumeHealth,
                ControllerCapability::ListVolumeHealth,
            ]),
            DriverMode::LegacyOnly => caps.push(ControllerCapability::VolumeCondition),
            DriverMode::LegacyNoCondition | DriverMode::Unimplemented => {}
        }
        let lacking = lock(&self.unimplemented).clone();
        caps.retain(|cap| {
            !lacking
                .iter()
                .any(|rpc| controller_capability_of(*rpc) == Some(*cap))
        });
        caps
    }
}

/// The node capability that announces `rpc`, if one does.
fn node_capability_of(rpc: Rpc) -> Option<NodeCapability> {
    match rpc {
        Rpc::NodeGetVolumeStats => Some(NodeCapability::GetVolumeStats),
        Rpc::NodeGetVolumeHealth => Some(NodeCapability::GetVolumeHealth),
        Rpc::NodeGetStorageHealth => Some(NodeCapability::GetStorageHealth),
        _ => None,
    }
}

/// The controller capability that announces `rpc`, if one does.
fn controller_capability_of(rpc: Rpc) -> Option<ControllerCapability> {
    match rpc {
        Rpc::ListVolumes => Some(ControllerCapability::ListVolumes),
        Rpc::ControllerGetVolume => Some(ControllerCapability::GetVolume),
        Rpc::ControllerListVolumeHealth => Some(ControllerCapability::ListVolumeHealth),
        Rpc::ControllerGetVolumeHealth => Some(ControllerCapability::GetVolumeHealth),
        _ => None,
    }
}
