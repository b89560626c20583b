//! The kubelet's plugin registration, served by the driver itself on
//! `--registration-socket` (what node-driver-registrar does for drivers
//! that do not): the kubelet's plugin watcher finds the socket in
//! `plugins_registry/`, asks GetInfo (a CSI plugin, its name, where its
//! CSI services are, the registration versions it speaks) and tells the
//! outcome with NotifyRegistrationStatus, which is logged and kept.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};

use tonic::{Request, Response, Status};

/// The generated messages and stubs of `proto/pluginregistration.proto`.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod wire {
    tonic::include_proto!("pluginregistration");
}

use wire::registration_server::{Registration as Service, RegistrationServer};

/// `PluginInfo.type` of a CSI driver (the kubelet's `CSIPlugin`).
pub const CSI_PLUGIN: &str = "CSIPlugin";
/// The registration protocol versions the kubelet's CSI plugin handler
/// accepts.
pub const SUPPORTED_VERSIONS: &[&str] = &["1.0.0"];

/// What the kubelet said of a registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub registered: bool,
    pub error: String,
}

/// The registration service of one driver.
#[derive(Debug, Clone)]
pub struct Registration {
    info: wire::PluginInfo,
    outcomes: Arc<Mutex<Vec<Outcome>>>,
}

impl Registration {
    /// Announces `driver_name`, reachable at `endpoint` (the socket the
    /// kubelet dials for CSI: the driver's own, or a proxy's in front).
    pub fn new(driver_name: &str, endpoint: &Path) -> Registration {
        Registration {
            info: wire::PluginInfo {
                r#type: CSI_PLUGIN.to_string(),
                name: driver_name.to_string(),
                endpoint: endpoint.display().to_string(),
                supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
            },
            outcomes: Arc::default(),
        }
    }

    /// Every status the kubelet notified, in order.
    pub fn outcomes(&self) -> Vec<Outcome> {
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn server(self) -> RegistrationServer<Registration> {
        RegistrationServer::new(self)
    }
}

#[tonic::async_trait]
impl Service for Registration {
    async fn get_info(
        &self,
        _: Request<wire::InfoRequest>,
    ) -> Result<Response<wire::PluginInfo>, Status> {
        tracing::info!(
            name = %self.info.name,
            endpoint = %self.info.endpoint,
            "registration: the kubelet asked for the plugin's info"
        );
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<wire::RegistrationStatus>,
    ) -> Result<Response<wire::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(name = %self.info.name, "registration: the kubelet registered the driver");
        } else {
            tracing::error!(
                name = %self.info.name,
                error = %status.error,
                "registration: the kubelet refused the driver"
            );
        }
        self.outcomes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Outcome {
                registered: status.plugin_registered,
                error: status.error,
            });
        Ok(Response::new(wire::RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::wire::registration_client::RegistrationClient;
    use super::*;
    use crate::csi_driver::client::unix_channel;
    use crate::csi_driver::socket::bind;

    /// The kubelet's side of a registration, over a real unix socket: the
    /// numbers of `pluginregistration` on the wire.
    #[tokio::test]
    async fn the_kubelet_learns_the_driver_and_its_endpoint_and_its_verdict_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("reg.sock");
        let registration = Registration::new(
            "loop.csi.volume-health.io",
            Path::new("/var/lib/kubelet/plugins/loop/csi.sock"),
        );
        let listener = bind(&socket).unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(registration.clone().server())
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let mut kubelet = RegistrationClient::new(unix_channel(&socket).await.unwrap());
        let info = kubelet
            .get_info(wire::InfoRequest {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            info,
            wire::PluginInfo {
                r#type: "CSIPlugin".into(),
                name: "loop.csi.volume-health.io".into(),
                endpoint: "/var/lib/kubelet/plugins/loop/csi.sock".into(),
                supported_versions: vec!["1.0.0".into()],
            }
        );
        // Field 1 `type`, 2 `name`, 3 `endpoint`, 4 `supported_versions`.
        let bytes = prost::Message::encode_to_vec(&wire::PluginInfo {
            r#type: "t".into(),
            name: "n".into(),
            endpoint: "e".into(),
            supported_versions: vec!["v".into()],
        });
        assert_eq!(bytes, b"\x0a\x01t\x12\x01n\x1a\x01e\x22\x01v");
        for (registered, error) in [(false, "no such driver version"), (true, "")] {
            kubelet
                .notify_registration_status(wire::RegistrationStatus {
                    plugin_registered: registered,
                    error: error.into(),
                })
                .await
                .unwrap();
        }
        assert_eq!(
            registration.outcomes(),
            vec![
                Outcome {
                    registered: false,
                    error: "no such driver version".into()
                },
                Outcome {
                    registered: true,
                    error: String::new()
                },
            ]
        );
        server.abort();
    }
}
