//! Client for a CSI controller plugin.

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::capabilities::ControllerCapabilities;
use crate::conn::{volume_gone, Conn};
use crate::error::CsiError;
use crate::node::check_volume_id;
use crate::proto;
use crate::proto::controller_client::ControllerClient as ControllerStub;
use crate::types::{
    entries_from_condition, entries_from_wire, merge_entries, ControllerHealthSource,
    ControllerVolumeReport, HealthEntry, VolumeHealthList,
};

const CONTROLLER_GET_CAPABILITIES: &str = "ControllerGetCapabilities";
const LIST_VOLUMES: &str = "ListVolumes";
const CONTROLLER_GET_VOLUME: &str = "ControllerGetVolume";
const CONTROLLER_LIST_VOLUME_HEALTH: &str = "ControllerListVolumeHealth";
const CONTROLLER_GET_VOLUME_HEALTH: &str = "ControllerGetVolumeHealth";

/// Controller plugin client. Cheap to clone; clones share the connection and
/// the cached capabilities.
#[derive(Debug, Clone)]
pub struct ControllerClient {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    conn: Conn,
    /// The last ControllerGetCapabilities answer: what the health calls
    /// decide by.
    capabilities: Mutex<Option<ControllerCapabilities>>,
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
                capabilities: Mutex::new(None),
            }),
        })
    }

    pub fn socket(&self) -> &Path {
        self.inner.conn.socket()
    }

    fn stub(&self) -> ControllerStub<tonic::transport::Channel> {
        ControllerStub::new(self.inner.conn.channel())
    }

    /// Asks the driver for its controller capabilities and caches the answer
    /// (see [`ControllerClient::cached_capabilities`]).
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
        let caps = ControllerCapabilities::from_wire(response.capabilities);
        *self
            .inner
            .capabilities
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(caps.clone());
        Ok(caps)
    }

    /// Capabilities from the last successful
    /// [`ControllerClient::capabilities`].
    pub fn cached_capabilities(&self) -> Option<ControllerCapabilities> {
        self.inner
            .capabilities
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The cached capabilities, asking the driver only when there are none.
    async fn known_capabilities(&self) -> Result<ControllerCapabilities, CsiError> {
        match self.cached_capabilities() {
            Some(caps) => Ok(caps),
            None => self.capabilities().await,
        }
    }

    /// Health of one volume, asked the way the driver's capabilities allow
    /// (see [`ControllerCapabilities::get_health_rpc`]): CSI 1.13
    /// ControllerGetVolumeHealth, legacy ControllerGetVolume's
    /// `status.volume_condition`, or nothing ([`CsiError::NotAdvertised`]).
    /// UNIMPLEMENTED despite the capability is [`CsiError::Unsupported`];
    /// NOT_FOUND is [`CsiError::VolumeGone`].
    pub async fn get_volume_health(
        &self,
        volume_id: &str,
    ) -> Result<ControllerVolumeReport, CsiError> {
        match self.known_capabilities().await?.get_health_rpc() {
            Some(ControllerHealthSource::ControllerGetVolumeHealth) => {
                self.get_1_13(volume_id).await
            }
            Some(_) => self.get_legacy(volume_id).await,
            None => Err(CsiError::NotAdvertised {
                rpc: CONTROLLER_GET_VOLUME_HEALTH,
                needs: "GET_VOLUME_HEALTH, or VOLUME_CONDITION with GET_VOLUME",
            }),
        }
    }

    async fn get_1_13(&self, volume_id: &str) -> Result<ControllerVolumeReport, CsiError> {
        let conn = &self.inner.conn;
        let request = proto::ControllerGetVolumeHealthRequest {
            volume_id: volume_id.to_string(),
            secrets: Default::default(),
        };
        let response = conn
            .call(
                CONTROLLER_GET_VOLUME_HEALTH,
                self.stub()
                    .controller_get_volume_health(conn.request(request)),
            )
            .await
            .map_err(|e| volume_gone(e, volume_id))?;
        let entries = match response.volume_health {
            Some(health) => {
                check_volume_id(CONTROLLER_GET_VOLUME_HEALTH, volume_id, &health.volume_id)?;
                Some(entries_from_wire(health.health_statuses))
            }
            // An OK answer without the message is not a statement of health.
            None => None,
        };
        Ok(ControllerVolumeReport {
            source: ControllerHealthSource::ControllerGetVolumeHealth,
            entries,
        })
    }

    async fn get_legacy(&self, volume_id: &str) -> Result<ControllerVolumeReport, CsiError> {
        let conn = &self.inner.conn;
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

    /// Walks every page of the health list the driver's capabilities allow
    /// (see [`ControllerCapabilities::list_health_rpc`]): CSI 1.13
    /// ControllerListVolumeHealth, or legacy ListVolumes with its
    /// `volume_condition`s; [`CsiError::NotAdvertised`] without a call when
    /// neither is advertised.
    ///
    /// `page_size` is sent as `max_entries` (0 lets the driver choose). At
    /// most `max_pages` pages are fetched so a driver that never ends its
    /// token chain cannot keep us forever; a repeated token also stops the
    /// walk. Either stop yields `complete: false`. Any failed page fails the
    /// whole walk (UNIMPLEMENTED despite the capability included): a partial
    /// cycle must not be mistaken for a complete one.
    pub async fn list_volume_health(
        &self,
        page_size: u32,
        max_pages: u32,
    ) -> Result<VolumeHealthList, CsiError> {
        let Some(source) = self.known_capabilities().await?.list_health_rpc() else {
            return Err(CsiError::NotAdvertised {
                rpc: CONTROLLER_LIST_VOLUME_HEALTH,
                needs: "LIST_VOLUME_HEALTH, or VOLUME_CONDITION with LIST_VOLUMES",
            });
        };
        let max_entries = i32::try_from(page_size).unwrap_or(i32::MAX);
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
            let page = self.list_page(source, max_entries, &token).await?;
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
