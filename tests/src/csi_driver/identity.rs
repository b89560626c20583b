//! The Identity service: the driver's name and version, and that it serves
//! the Controller service too.

use health_csi::proto;
use health_csi::proto::identity_server::Identity;
use health_csi::proto::plugin_capability::service::Type as ServiceType;
use tonic::{Request, Response, Status};

use super::error::logged;
use super::Service;

#[tonic::async_trait]
impl Identity for Service {
    async fn get_plugin_info(
        &self,
        _: Request<proto::GetPluginInfoRequest>,
    ) -> Result<Response<proto::GetPluginInfoResponse>, Status> {
        let answer = proto::GetPluginInfoResponse {
            name: self.0.config.driver_name.clone(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        };
        logged("GetPluginInfo", "", async move { Ok(answer) }).await
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<proto::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<proto::GetPluginCapabilitiesResponse>, Status> {
        use proto::plugin_capability::{Service as Arm, Type};
        let answer = proto::GetPluginCapabilitiesResponse {
            capabilities: vec![proto::PluginCapability {
                r#type: Some(Type::Service(Arm {
                    r#type: ServiceType::ControllerService as i32,
                })),
            }],
        };
        logged("GetPluginCapabilities", "", async move { Ok(answer) }).await
    }

    async fn probe(
        &self,
        _: Request<proto::ProbeRequest>,
    ) -> Result<Response<proto::ProbeResponse>, Status> {
        // Serving at all is being ready: the state directory was opened
        // before the socket was.
        logged("Probe", "", async move {
            Ok(proto::ProbeResponse { ready: Some(true) })
        })
        .await
    }
}
