//! Client for a CSI node plugin (Identity + Node services on one socket).

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::capabilities::NodeCapabilities;
use crate::conn::{path_arg, volume_gone, Conn};
use crate::error::CsiError;
use crate::proto;
use crate::proto::identity_client::IdentityClient;
use crate::proto::node_client::NodeClient as NodeStub;
use crate::types::{
    entries_from_condition, entries_from_wire, usage_from_wire, HealthSource, NodeInfo,
    NodeVolumeReport, PluginInfo, StorageHealthEntry,
};

/// Node plugin client. Cheap to clone; clones share the connection and the
/// cached capabilities.
#[derive(Debug, Clone)]
pub struct NodeClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: Conn,
    /// The last NodeGetCapabilities answer: what the health calls decide by.
    capabilities: Mutex<Option<NodeCapabilities>>,
}

const GET_PLUGIN_INFO: &str = "GetPluginInfo";
const PROBE: &str = "Probe";
const NODE_GET_CAPABILITIES: &str = "NodeGetCapabilities";
const NODE_GET_INFO: &str = "NodeGetInfo";
const NODE_GET_VOLUME_STATS: &str = "NodeGetVolumeStats";
const NODE_GET_VOLUME_HEALTH: &str = "NodeGetVolumeHealth";
const NODE_GET_STORAGE_HEALTH: &str = "NodeGetStorageHealth";

/// The capabilities that let us ask a node plugin about one volume.
const VOLUME_HEALTH_CAPABILITIES: &str =
    "GET_VOLUME_HEALTH, or VOLUME_CONDITION with GET_VOLUME_STATS";

impl NodeClient {
    /// Prepares a client for the driver listening on `socket`. Fails (naming
    /// the socket) if the path is not a unix socket; the actual dial happens
    /// on the first RPC and is redone after the driver restarts. Every RPC is
    /// bounded by `call_timeout`.
    pub async fn connect(socket: &Path, call_timeout: Duration) -> Result<Self, CsiError> {
        let conn = Conn::open(socket, call_timeout).await?;
        Ok(NodeClient {
            inner: Arc::new(Inner {
                conn,
                capabilities: Mutex::new(None),
            }),
        })
    }

    pub fn socket(&self) -> &Path {
        self.inner.conn.socket()
    }

    pub fn call_timeout(&self) -> Duration {
        self.inner.conn.timeout()
    }

    fn identity(&self) -> IdentityClient<tonic::transport::Channel> {
        IdentityClient::new(self.inner.conn.channel())
    }

    fn node(&self) -> NodeStub<tonic::transport::Channel> {
        NodeStub::new(self.inner.conn.channel())
    }

    pub async fn plugin_info(&self) -> Result<PluginInfo, CsiError> {
        let conn = &self.inner.conn;
        let response = conn
            .call(
                GET_PLUGIN_INFO,
                self.identity()
                    .get_plugin_info(conn.request(proto::GetPluginInfoRequest {})),
            )
            .await?;
        // The name keys drivers everywhere (CSINode, PV spec.csi.driver); an
        // empty one is a spec violation we cannot work around.
        if response.name.is_empty() {
            return Err(CsiError::InvalidResponse {
                rpc: GET_PLUGIN_INFO,
                detail: "empty driver name".to_string(),
            });
        }
        Ok(PluginInfo {
            name: response.name,
            vendor_version: response.vendor_version,
        })
    }

    /// Identity.Probe: `Some(ready)`, or `None` when the driver left `ready`
    /// unset (which the spec asks COs to read as ready; left to the caller).
    pub async fn probe(&self) -> Result<Option<bool>, CsiError> {
        let conn = &self.inner.conn;
        let response = conn
            .call(
                PROBE,
                self.identity().probe(conn.request(proto::ProbeRequest {})),
            )
            .await?;
        Ok(response.ready)
    }

    /// Asks the driver for its node capabilities and caches the answer (see
    /// [`NodeClient::cached_capabilities`]).
    pub async fn capabilities(&self) -> Result<NodeCapabilities, CsiError> {
        let conn = &self.inner.conn;
        let response = conn
            .call(
                NODE_GET_CAPABILITIES,
                self.node()
                    .node_get_capabilities(conn.request(proto::NodeGetCapabilitiesRequest {})),
            )
            .await?;
        let caps = NodeCapabilities::from_wire(response.capabilities);
        *self
            .inner
            .capabilities
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(caps.clone());
        Ok(caps)
    }

    /// Capabilities from the last successful [`NodeClient::capabilities`].
    pub fn cached_capabilities(&self) -> Option<NodeCapabilities> {
        self.inner
            .capabilities
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The cached capabilities, asking the driver only when there are none.
    async fn known_capabilities(&self) -> Result<NodeCapabilities, CsiError> {
        match self.cached_capabilities() {
            Some(caps) => Ok(caps),
            None => self.capabilities().await,
        }
    }

    pub async fn node_info(&self) -> Result<NodeInfo, CsiError> {
        let conn = &self.inner.conn;
        let response = conn
            .call(
                NODE_GET_INFO,
                self.node()
                    .node_get_info(conn.request(proto::NodeGetInfoRequest {})),
            )
            .await?;
        Ok(NodeInfo {
            node_id: response.node_id,
            max_volumes_per_node: response.max_volumes_per_node,
        })
    }

    /// Health of one volume, asked the way the driver's capabilities allow
    /// (see [`NodeCapabilities::volume_health_rpc`]): CSI 1.13
    /// NodeGetVolumeHealth for drivers advertising GET_VOLUME_HEALTH, legacy
    /// NodeGetVolumeStats (volume_condition + usage) for drivers advertising
    /// VOLUME_CONDITION and GET_VOLUME_STATS, and nothing at all for the
    /// rest ([`CsiError::NotAdvertised`]).
    ///
    /// Decides by the cached capabilities (asked once if there are none;
    /// [`crate::DriverSet`] refreshes them every round). An RPC answering
    /// UNIMPLEMENTED despite its capability is [`CsiError::Unsupported`]
    /// every time, never a reason to try the other generation: a failed
    /// probe, not an answer. NOT_FOUND becomes [`CsiError::VolumeGone`].
    pub async fn volume_health(
        &self,
        volume_id: &str,
        publish_path: &Path,
        staging_path: Option<&Path>,
    ) -> Result<NodeVolumeReport, CsiError> {
        let caps = self.known_capabilities().await?;
        match caps.volume_health_rpc() {
            Some(HealthSource::NodeGetVolumeHealth) => {
                self.node_volume_health(volume_id, publish_path, staging_path)
                    .await
            }
            Some(HealthSource::NodeGetVolumeStats) => {
                self.volume_stats(volume_id, publish_path, staging_path)
                    .await
            }
            None => Err(CsiError::NotAdvertised {
                rpc: NODE_GET_VOLUME_HEALTH,
                needs: VOLUME_HEALTH_CAPABILITIES,
            }),
        }
    }

    async fn node_volume_health(
        &self,
        volume_id: &str,
        publish_path: &Path,
        staging_path: Option<&Path>,
    ) -> Result<NodeVolumeReport, CsiError> {
        let conn = &self.inner.conn;
        let request = proto::NodeGetVolumeHealthRequest {
            volume_id: volume_id.to_string(),
            volume_publish_path: path_arg(publish_path)?,
            staging_target_path: staging_path.map(path_arg).transpose()?.unwrap_or_default(),
        };
        let response = conn
            .call(
                NODE_GET_VOLUME_HEALTH,
                self.node().node_get_volume_health(conn.request(request)),
            )
            .await
            .map_err(|e| volume_gone(e, volume_id))?;
        let entries = match response.volume_health {
            Some(health) => {
                check_volume_id(NODE_GET_VOLUME_HEALTH, volume_id, &health.volume_id)?;
                Some(entries_from_wire(health.health_statuses))
            }
            // An OK answer without the message is not a statement of health.
            None => None,
        };
        Ok(NodeVolumeReport {
            source: HealthSource::NodeGetVolumeHealth,
            entries,
            usage: None,
        })
    }

    /// Legacy NodeGetVolumeStats alone: usage plus `volume_condition`.
    ///
    /// A response without `volume_condition` yields `entries: None` (no
    /// health information), never "healthy". If cached capabilities say the
    /// driver lacks GET_VOLUME_STATS the RPC is not sent at all.
    pub async fn volume_stats(
        &self,
        volume_id: &str,
        publish_path: &Path,
        staging_path: Option<&Path>,
    ) -> Result<NodeVolumeReport, CsiError> {
        if let Some(caps) = self.cached_capabilities() {
            if !caps.get_volume_stats {
                return Err(CsiError::NotAdvertised {
                    rpc: NODE_GET_VOLUME_STATS,
                    needs: "GET_VOLUME_STATS",
                });
            }
        }
        let conn = &self.inner.conn;
        let request = proto::NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_string(),
            volume_path: path_arg(publish_path)?,
            staging_target_path: staging_path.map(path_arg).transpose()?.unwrap_or_default(),
        };
        let response = conn
            .call(
                NODE_GET_VOLUME_STATS,
                self.node().node_get_volume_stats(conn.request(request)),
            )
            .await
            .map_err(|e| volume_gone(e, volume_id))?;
        Ok(NodeVolumeReport {
            source: HealthSource::NodeGetVolumeStats,
            entries: entries_from_condition(response.volume_condition),
            usage: usage_from_wire(response.usage),
        })
    }

    /// CSI 1.13 NodeGetStorageHealth: adverse backend conditions seen from
    /// this node (empty = none known).
    ///
    /// Called only for drivers advertising GET_STORAGE_HEALTH (cached
    /// capabilities, asked once if there are none); for the rest this is
    /// [`CsiError::NotAdvertised`] without a call. UNIMPLEMENTED despite the
    /// capability is [`CsiError::Unsupported`], every time it happens.
    pub async fn storage_health(&self) -> Result<Vec<StorageHealthEntry>, CsiError> {
        if !self.known_capabilities().await?.get_storage_health {
            return Err(CsiError::NotAdvertised {
                rpc: NODE_GET_STORAGE_HEALTH,
                needs: "GET_STORAGE_HEALTH",
            });
        }
        let conn = &self.inner.conn;
        let response = conn
            .call(
                NODE_GET_STORAGE_HEALTH,
                self.node().node_get_storage_health(conn.request(
                    proto::NodeGetStorageHealthRequest {
                        secrets: Default::default(),
                    },
                )),
            )
            .await?;
        Ok(response
            .backend_health
            .into_iter()
            .map(StorageHealthEntry::from_wire)
            .collect())
    }
}

/// A health message about a different volume than asked for must not be
/// attributed to the one asked about. An empty id is tolerated: some drivers
/// leave fields they consider implied unset.
pub(crate) fn check_volume_id(rpc: &'static str, asked: &str, got: &str) -> Result<(), CsiError> {
    if got.is_empty() || got == asked {
        Ok(())
    } else {
        Err(CsiError::InvalidResponse {
            rpc,
            detail: format!("asked about volume {asked:?}, answer is about {got:?}"),
        })
    }
}
