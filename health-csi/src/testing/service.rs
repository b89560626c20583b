//! The test driver's gRPC services: what each RPC answers in each mode.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use super::{lock, DriverMode, Rpc, SeenNodeRequest, State};
use crate::proto;
use crate::proto::controller_server::Controller;
use crate::proto::identity_server::Identity;
use crate::proto::node_server::Node;
use crate::types::{HealthEntry, StorageHealthEntry, Usage, UsageNumbers};

fn wire_health(volume_id: &str, health: &[HealthEntry]) -> proto::VolumeHealth {
    proto::VolumeHealth {
        volume_id: volume_id.to_string(),
        health_statuses: health
            .iter()
            .map(|e| proto::volume_health::VolumeHealthEntry {
                status: e.status.to_wire() as i32,
                reason: e.reason.clone(),
                message: e.message.clone(),
            })
            .collect(),
    }
}

/// The legacy view of a volume's health: abnormal iff any entry, messages
/// joined. Only a `LegacyOnly` driver sends it: CSI 1.13 removed the field,
/// and `LegacyNoCondition` never had it.
fn wire_condition(mode: DriverMode, health: &[HealthEntry]) -> Option<proto::VolumeCondition> {
    if mode != DriverMode::LegacyOnly {
        return None;
    }
    Some(proto::VolumeCondition {
        abnormal: !health.is_empty(),
        message: health
            .iter()
            .map(|e| e.message.as_str())
            .collect::<Vec<_>>()
            .join("; "),
    })
}

fn wire_usage(usage: Option<Usage>) -> Vec<proto::VolumeUsage> {
    use proto::volume_usage::Unit;
    let Some(usage) = usage else {
        return Vec::new();
    };
    let one = |n: UsageNumbers, unit: Unit| proto::VolumeUsage {
        available: n.available,
        total: n.total,
        used: n.used,
        unit: unit as i32,
    };
    usage
        .bytes
        .map(|n| one(n, Unit::Bytes))
        .into_iter()
        .chain(usage.inodes.map(|n| one(n, Unit::Inodes)))
        .collect()
}

fn unimplemented<T>(rpc: Rpc) -> Result<T, Status> {
    Err(Status::unimplemented(format!("{rpc:?} is not implemented")))
}

#[derive(Debug, Clone)]
pub(super) struct Service(pub(super) Arc<State>);

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<proto::GetPluginInfoRequest>,
    ) -> Result<Response<proto::GetPluginInfoResponse>, Status> {
        if self.0.count(Rpc::GetPluginInfo) == DriverMode::Unimplemented {
            return unimplemented(Rpc::GetPluginInfo);
        }
        Ok(Response::new(proto::GetPluginInfoResponse {
            name: self.0.name.clone(),
            vendor_version: "0.0.0-test".to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<proto::GetPluginCapabilitiesResponse>, Status> {
        use proto::plugin_capability::{service::Type, Service as Svc, Type as Arm};
        if self.0.count(Rpc::GetPluginCapabilities) == DriverMode::Unimplemented {
            return unimplemented(Rpc::GetPluginCapabilities);
        }
        Ok(Response::new(proto::GetPluginCapabilitiesResponse {
            capabilities: vec![proto::PluginCapability {
                r#type: Some(Arm::Service(Svc {
                    r#type: Type::ControllerService as i32,
                })),
            }],
        }))
    }

    async fn probe(
        &self,
        _: Request<proto::ProbeRequest>,
    ) -> Result<Response<proto::ProbeResponse>, Status> {
        if self.0.count(Rpc::Probe) == DriverMode::Unimplemented {
            return unimplemented(Rpc::Probe);
        }
        Ok(Response::new(proto::ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Service {
    async fn node_get_capabilities(
        &self,
        _: Request<proto::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<proto::NodeGetCapabilitiesResponse>, Status> {
        use proto::node_service_capability::{Rpc as WireRpc, Type as Arm};
        let mode = self.0.count(Rpc::NodeGetCapabilities);
        if mode == DriverMode::Unimplemented {
            return unimplemented(Rpc::NodeGetCapabilities);
        }
        Ok(Response::new(proto::NodeGetCapabilitiesResponse {
            capabilities: self
                .0
                .node_capabilities(mode)
                .into_iter()
                .map(|t| proto::NodeServiceCapability {
                    r#type: Some(Arm::Rpc(WireRpc { r#type: t as i32 })),
                })
                .collect(),
        }))
    }

    async fn node_get_info(
        &self,
        _: Request<proto::NodeGetInfoRequest>,
    ) -> Result<Response<proto::NodeGetInfoResponse>, Status> {
        if self.0.count(Rpc::NodeGetInfo) == DriverMode::Unimplemented {
            return unimplemented(Rpc::NodeGetInfo);
        }
        Ok(Response::new(proto::NodeGetInfoResponse {
            node_id: "test-node".to_string(),
            max_volumes_per_node: 0,
        }))
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<proto::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<proto::NodeGetVolumeStatsResponse>, Status> {
        let mode = self.0.count(Rpc::NodeGetVolumeStats);
        let request = request.into_inner();
        *lock(&self.0.last_node_request) = Some(SeenNodeRequest {
            rpc: Rpc::NodeGetVolumeStats,
            volume_id: request.volume_id.clone(),
            path: request.volume_path.clone(),
            staging_path: request.staging_target_path.clone(),
        });
        match mode {
            DriverMode::Unimplemented => unimplemented(Rpc::NodeGetVolumeStats),
            DriverMode::Hang => self.0.hang().await,
            _ => {
                let volume = self.0.volume(&request.volume_id)?;
                Ok(Response::new(proto::NodeGetVolumeStatsResponse {
                    usage: wire_usage(volume.usage),
                    volume_condition: wire_condition(mode, &volume.health),
                }))
            }
        }
    }

    async fn node_get_volume_health(
        &self,
        request: Request<proto::NodeGetVolumeHealthRequest>,
    ) -> Result<Response<proto::NodeGetVolumeHealthResponse>, Status> {
        let mode = self.0.count(Rpc::NodeGetVolumeHealth);
        let request = request.into_inner();
        *lock(&self.0.last_node_request) = Some(SeenNodeRequest {
            rpc: Rpc::NodeGetVolumeHealth,
            volume_id: request.volume_id.clone(),
            path: request.volume_publish_path.clone(),
            staging_path: request.staging_target_path.clone(),
        });
        match mode {
            DriverMode::Modern => {
                let volume = self.0.volume(&request.volume_id)?;
                Ok(Response::new(proto::NodeGetVolumeHealthResponse {
                    volume_health: Some(wire_health(&request.volume_id, &volume.health)),
                }))
            }
            DriverMode::Hang => self.0.hang().await,
            _ => unimplemented(Rpc::NodeGetVolumeHealth),
        }
    }

    async fn node_get_storage_health(
        &self,
        _: Request<proto::NodeGetStorageHealthRequest>,
    ) -> Result<Response<proto::NodeGetStorageHealthResponse>, Status> {
        match self.0.count(Rpc::NodeGetStorageHealth) {
            DriverMode::Modern => Ok(Response::new(proto::NodeGetStorageHealthResponse {
                backend_health: lock(&self.0.storage_health)
                    .iter()
                    .map(StorageHealthEntry::to_wire)
                    .collect(),
            })),
            DriverMode::Hang => self.0.hang().await,
            _ => unimplemented(Rpc::NodeGetStorageHealth),
        }
    }
}

#[tonic::async_trait]
impl Controller for Service {
    async fn controller_get_capabilities(
        &self,
        _: Request<proto::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<proto::ControllerGetCapabilitiesResponse>, Status> {
        use proto::controller_service_capability::{Rpc as WireRpc, Type as Arm};
        let mode = self.0.count(Rpc::ControllerGetCapabilities);
        if mode == DriverMode::Unimplemented {
            return unimplemented(Rpc::ControllerGetCapabilities);
        }
        Ok(Response::new(proto::ControllerGetCapabilitiesResponse {
            capabilities: self
                .0
                .controller_capabilities(mode)
                .into_iter()
                .map(|t| proto::ControllerServiceCapability {
                    r#type: Some(Arm::Rpc(WireRpc { r#type: t as i32 })),
                })
                .collect(),
        }))
    }

    async fn list_volumes(
        &self,
        request: Request<proto::ListVolumesRequest>,
    ) -> Result<Response<proto::ListVolumesResponse>, Status> {
        use proto::list_volumes_response::{Entry, VolumeStatus};
        let mode = self.0.count(Rpc::ListVolumes);
        match mode {
            DriverMode::Unimplemented => return unimplemented(Rpc::ListVolumes),
            DriverMode::Hang => return self.0.hang().await,
            _ => {}
        }
        let (page, next_token) = self.0.page(
            request.get_ref().max_entries,
            &request.get_ref().starting_token,
        )?;
        let entries = page
            .iter()
            .map(|(id, health)| Entry {
                volume: Some(proto::Volume {
                    capacity_bytes: 0,
                    volume_id: id.clone(),
                    volume_context: Default::default(),
                }),
                status: Some(VolumeStatus {
                    published_node_ids: Vec::new(),
                    volume_condition: wire_condition(mode, health),
                }),
            })
            .collect();
        Ok(Response::new(proto::ListVolumesResponse {
            entries,
            next_token,
        }))
    }

    async fn controller_get_volume(
        &self,
        request: Request<proto::ControllerGetVolumeRequest>,
    ) -> Result<Response<proto::ControllerGetVolumeResponse>, Status> {
        use proto::controller_get_volume_response::VolumeStatus;
        let mode = self.0.count(Rpc::ControllerGetVolume);
        match mode {
            DriverMode::Unimplemented => return unimplemented(Rpc::ControllerGetVolume),
            DriverMode::Hang => return self.0.hang().await,
            _ => {}
        }
        let volume_id = request.into_inner().volume_id;
        let volume = self.0.volume(&volume_id)?;
        Ok(Response::new(proto::ControllerGetVolumeResponse {
            volume: Some(proto::Volume {
                capacity_bytes: 0,
                volume_id,
                volume_context: Default::default(),
            }),
            status: Some(VolumeStatus {
                published_node_ids: Vec::new(),
                volume_condition: wire_condition(mode, &volume.health),
            }),
        }))
    }

    async fn controller_list_volume_health(
        &self,
        request: Request<proto::ControllerListVolumeHealthRequest>,
    ) -> Result<Response<proto::ControllerListVolumeHealthResponse>, Status> {
        match self.0.count(Rpc::ControllerListVolumeHealth) {
            DriverMode::Modern => {}
            DriverMode::Hang => return self.0.hang().await,
            _ => return unimplemented(Rpc::ControllerListVolumeHealth),
        }
        let explicit = lock(&self.0.list_pages).is_some();
        let (page, next_token) = self.0.page(
            request.get_ref().max_entries,
            &request.get_ref().starting_token,
        )?;
        let entries = page
            .iter()
            // Like the spec's SHOULD, the default listing omits healthy
            // volumes; explicit pages are served as the test wrote them.
            .filter(|(_, health)| explicit || !health.is_empty())
            .map(|(id, health)| wire_health(id, health))
            .collect();
        Ok(Response::new(proto::ControllerListVolumeHealthResponse {
            entries,
            next_token,
        }))
    }

    async fn controller_get_volume_health(
        &self,
        request: Request<proto::ControllerGetVolumeHealthRequest>,
    ) -> Result<Response<proto::ControllerGetVolumeHealthResponse>, Status> {
        match self.0.count(Rpc::ControllerGetVolumeHealth) {
            DriverMode::Modern => {}
            DriverMode::Hang => return self.0.hang().await,
            _ => return unimplemented(Rpc::ControllerGetVolumeHealth),
        }
        let volume_id = request.into_inner().volume_id;
        let volume = self.0.volume(&volume_id)?;
        Ok(Response::new(proto::ControllerGetVolumeHealthResponse {
            volume_health: Some(wire_health(&volume_id, &volume.health)),
        }))
    }
}
