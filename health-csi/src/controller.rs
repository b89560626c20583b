//! Client for a CSI controller plugin.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::atomic::AtomicU8;
use std::sync::Arc;
use std::time::Duration;

use crate::conn::{volume_gone, Conn};
use crate::error::CsiError;
use crate::node::{check_volume_id, RpcSupport};
use crate::proto;
use crate::proto::controller_client::ControllerClient as ControllerStub;
use crate::types::{
    entries_from_condition, entries_from_wire, merge_entries, ControllerCapabilities,
    ControllerHealthSource, ControllerVolumeReport, HealthEntry, VolumeHealthList,
};

const CONTROLLER_GET_CAPABILITIES: &str = "ControllerGetCapabilities";
const LIST_VOLUMES: &str = "ListVolumes";
const CONTROLLER_GET_VOLUME: &str = "ControllerGetVolume";
const CONTROLLER_LIST_VOLUME_HEALTH: &str = "ControllerListVolumeHealth";
const CONTROLLER_GET_VOLUME_HEALTH: &str = "ControllerGetVolumeHealth";

/// Controller plugin client. Cheap to clone; clones share the connection and
/// what was learnt about RPC support.
#[derive(Debug, Clone)]
pub struct ControllerClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: Conn,
    /// Support for CSI 1.13 ControllerGetVolumeHealth, learnt by calling it.
    get_health_rpc: AtomicU8,
    /// Support for CSI 1.13 ControllerListVolumeHealth, learnt by calling it.
    list_health_rpc: AtomicU8,
}

/// One page as both list generations see it.
struct Page {
    volumes: Vec<(String, Option<Vec<HealthEntry>>)>,
    next_token: String,
}

impl ControllerClient {
    /// Same contract as [`crate::NodeClient::connect`].
    pub async fn connect(socket: &Path, call_timeout: Duration) -> Result<Self, CsiError> {
        let conn = Conn::open(socket, call_timeout).await?;
        Ok(ControllerClient {
            inner: Arc::new(Inner {
                conn,
                get_health_rpc: AtomicU8::new(0),
                list_health_rpc: AtomicU8::new(0),
            }),
        })
    }

    pub fn socket(&self) -> &Path {
        self.inner.conn.socket()
    }

    /// What this client has learnt about ControllerGetVolumeHealth so far.
    pub fn get_volume_health_support(&self) -> RpcSupport {
        RpcSupport::load(&self.inner.get_health_rpc)
    }

    /// What this client has learnt about ControllerListVolumeHealth so far.
    pub fn list_volume_health_support(&self) -> RpcSupport {
        RpcSupport::load(&self.inner.list_health_rpc)
    }

    fn stub(&self) -> ControllerStub<tonic::transport::Channel> {
        ControllerStub::new(self.inner.conn.channel())
    }

    pub async fn capabilities(&self) -> Result<ControllerCapabilities, CsiError> {
        let conn = &self.inner.conn;
        let response = conn
            .call(
                CONTROLLER_GET_CAPABILITIES,
                self.stub().controller_get_capabilities(
                    conn.request(proto::ControllerGetCapabilitiesRequest {}),
                ),
            )
            .await?;
        Ok(ControllerCapabilities::from_wire(response.capabilities))
    }

    /// Health of one volume: CSI 1.13 ControllerGetVolumeHealth, or after an
    /// UNIMPLEMENTED (remembered per client) legacy ControllerGetVolume's
    /// `status.volume_condition`. NOT_FOUND from either is
    /// [`CsiError::VolumeGone`].
    pub async fn get_volume_health(
        &self,
        volume_id: &str,
    ) -> Result<ControllerVolumeReport, CsiError> {
        let conn = &self.inner.conn;
        if self.get_volume_health_support() != RpcSupport::Unsupported {
            let request = proto::ControllerGetVolumeHealthRequest {
                volume_id: volume_id.to_string(),
                secrets: Default::default(),
            };
            match conn
                .call(
                    CONTROLLER_GET_VOLUME_HEALTH,
                    self.stub()
                        .controller_get_volume_health(conn.request(request)),
                )
                .await
            {
                Ok(response) => {
                    RpcSupport::Supported.store(&self.inner.get_health_rpc);
                    let entries = match response.volume_health {
                        Some(health) => {
                            check_volume_id(
                                CONTROLLER_GET_VOLUME_HEALTH,
                                volume_id,
                                &health.volume_id,
                            )?;
                            Some(entries_from_wire(health.health_statuses))
                        }
                        None => None,
                    };
                    return Ok(ControllerVolumeReport {
                        source: ControllerHealthSource::ControllerGetVolumeHealth,
                        entries,
                    });
                }
                Err(CsiError::Unsupported { .. }) => {
                    tracing::debug!(
                        socket = %self.socket().display(),
                        "driver lacks ControllerGetVolumeHealth; using ControllerGetVolume"
                    );
                    RpcSupport::Unsupported.store(&self.inner.get_health_rpc);
                }
                Err(e) => return Err(volume_gone(e, volume_id)),
            }
        }
        let request = proto::ControllerGetVolumeRequest {
            volume_id: volume_id.to_string(),
        };
        let response = conn
            .call(
                CONTROLLER_GET_VOLUME,
                self.stub().controller_get_volume(conn.request(request)),
            )
            .await
            .map_err(|e| volume_gone(e, volume_id))?;
        if let Some(volume) = &response.volume {
            check_volume_id(CONTROLLER_GET_VOLUME, volume_id, &volume.volume_id)?;
        }
        Ok(ControllerVolumeReport {
            source: ControllerHealthSource::ControllerGetVolume,
            entries: entries_from_condition(response.status.and_then(|s| s.volume_condition)),
        })
    }

    /// Walks every page of CSI 1.13 ControllerListVolumeHealth, or after an
    /// UNIMPLEMENTED on the first page (remembered per client) of legacy
    /// ListVolumes.
    ///
    /// `page_size` is sent as `max_entries` (0 lets the driver choose). At
    /// most `max_pages` pages are fetched so a driver that never ends its
    /// token chain cannot keep us forever; a repeated token also stops the
    /// walk. Either stop yields `complete: false`. Any failed page fails the
    /// whole walk: a partial cycle must not be mistaken for a complete one.
    pub async fn list_volume_health(
        &self,
        page_size: u32,
        max_pages: u32,
    ) -> Result<VolumeHealthList, CsiError> {
        let max_entries = i32::try_from(page_size).unwrap_or(i32::MAX);
        let mut source = if self.list_volume_health_support() == RpcSupport::Unsupported {
            ControllerHealthSource::ListVolumes
        } else {
            ControllerHealthSource::ControllerListVolumeHealth
        };
        let mut volumes: BTreeMap<String, Option<Vec<HealthEntry>>> = BTreeMap::new();
        let mut seen_tokens: HashSet<String> = HashSet::new();
        let mut token = String::new();
        let mut pages = 0u32;
        let complete = loop {
            if pages >= max_pages {
                tracing::warn!(
                    socket = %self.socket().display(),
                    pages,
                    "controller volume list still had more pages at the page limit"
                );
                break false;
            }
            let page = match self.list_page(source, max_entries, &token).await {
                Ok(page) => page,
                Err(CsiError::Unsupported { .. })
                    if pages == 0
                        && source == ControllerHealthSource::ControllerListVolumeHealth =>
                {
                    tracing::debug!(
                        socket = %self.socket().display(),
                        "driver lacks ControllerListVolumeHealth; using ListVolumes"
                    );
                    RpcSupport::Unsupported.store(&self.inner.list_health_rpc);
                    source = ControllerHealthSource::ListVolumes;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if source == ControllerHealthSource::ControllerListVolumeHealth {
                RpcSupport::Supported.store(&self.inner.list_health_rpc);
            }
            pages += 1;
            for (volume_id, entries) in page.volumes {
                merge_volume(volumes.entry(volume_id).or_insert(None), entries);
            }
            if page.next_token.is_empty() {
                break true;
            }
            if !seen_tokens.insert(page.next_token.clone()) {
                tracing::warn!(
                    socket = %self.socket().display(),
                    token = %page.next_token,
                    "controller volume list repeated a page token; stopping"
                );
                break false;
            }
            token = page.next_token;
        };
        Ok(VolumeHealthList {
            source,
            volumes,
            complete,
            pages,
        })
    }

    async fn list_page(
        &self,
        source: ControllerHealthSource,
        max_entries: i32,
        token: &str,
    ) -> Result<Page, CsiError> {
        let conn = &self.inner.conn;
        if source == ControllerHealthSource::ListVolumes {
            let request = proto::ListVolumesRequest {
                max_entries,
                starting_token: token.to_string(),
            };
            let response = conn
                .call(
                    LIST_VOLUMES,
                    self.stub().list_volumes(conn.request(request)),
                )
                .await?;
            let volumes = response
                .entries
                .into_iter()
                .filter_map(|entry| {
                    // An entry without a volume names nothing we could
                    // attribute health to.
                    let volume = entry.volume?;
                    let entries =
                        entries_from_condition(entry.status.and_then(|s| s.volume_condition));
                    Some((volume.volume_id, entries))
                })
                .collect();
            return Ok(Page {
                volumes,
                next_token: response.next_token,
            });
        }
        let request = proto::ControllerListVolumeHealthRequest {
            max_entries,
            starting_token: token.to_string(),
            secrets: Default::default(),
        };
        let response = conn
            .call(
                CONTROLLER_LIST_VOLUME_HEALTH,
                self.stub()
                    .controller_list_volume_health(conn.request(request)),
            )
            .await?;
        let volumes = response
            .entries
            .into_iter()
            .filter(|health| !health.volume_id.is_empty())
            .map(|health| {
                (
                    health.volume_id,
                    Some(entries_from_wire(health.health_statuses)),
                )
            })
            .collect();
        Ok(Page {
            volumes,
            next_token: response.next_token,
        })
    }
}

/// Folds a duplicate listing of one volume into what was already seen.
/// Information beats no information; two reports are united (worst case).
fn merge_volume(slot: &mut Option<Vec<HealthEntry>>, new: Option<Vec<HealthEntry>>) {
    match (slot.as_mut(), new) {
        (_, None) => {}
        (None, Some(new)) => *slot = Some(new),
        (Some(existing), Some(new)) => merge_entries(existing, new),
    }
}
