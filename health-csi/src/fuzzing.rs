//! Bytes as a driver's answer, for the fuzz target and property tests: the
//! decoding and conversion every RPC's answer goes through, without a socket.
//!
//! The first byte picks the response message; the rest is decoded as that
//! message by prost (as tonic does: invalid UTF-8 in a string field, a bad
//! length or a truncated field is a decode error) and converted by the same
//! functions the clients use.

use prost::Message;

use crate::capabilities::{ControllerCapabilities, NodeCapabilities};
use crate::node::check_volume_id;
use crate::proto;
use crate::types::{
    entries_from_condition, entries_from_wire, merge_entries, usage_from_wire, HealthEntry,
    StorageHealthEntry,
};

/// The volume every decoded answer is taken to be about.
pub const ASKED_VOLUME: &str = "vol-1";

/// What a decoded answer said.
#[derive(Debug, Default)]
pub struct Answer {
    /// The volume entries (`None`: no health information, or not decodable).
    pub entries: Option<Vec<HealthEntry>>,
    pub storage: Vec<StorageHealthEntry>,
}

/// Decodes `data` as one of the health answers and converts it.
pub fn answer(data: &[u8]) -> Answer {
    let Some((&kind, bytes)) = data.split_first() else {
        return Answer::default();
    };
    let mut out = Answer::default();
    match kind % 8 {
        0 => {
            if let Ok(r) = proto::NodeGetVolumeHealthResponse::decode(bytes) {
                out.entries = r.volume_health.and_then(about_the_asked_volume);
            }
        }
        1 => {
            if let Ok(r) = proto::NodeGetVolumeStatsResponse::decode(bytes) {
                let _ = usage_from_wire(r.usage);
                out.entries = entries_from_condition(r.volume_condition);
            }
        }
        2 => {
            if let Ok(r) = proto::NodeGetStorageHealthResponse::decode(bytes) {
                out.storage = r
                    .backend_health
                    .into_iter()
                    .map(StorageHealthEntry::from_wire)
                    .collect();
            }
        }
        3 => {
            if let Ok(r) = proto::ControllerListVolumeHealthResponse::decode(bytes) {
                let mut all = Vec::new();
                for health in r.entries {
                    merge_entries(&mut all, entries_from_wire(health.health_statuses));
                }
                out.entries = Some(all);
            }
        }
        4 => {
            if let Ok(r) = proto::ListVolumesResponse::decode(bytes) {
                let mut all = Vec::new();
                for entry in r.entries {
                    let condition = entry.status.and_then(|s| s.volume_condition);
                    merge_entries(
                        &mut all,
                        entries_from_condition(condition).unwrap_or_default(),
                    );
                }
                out.entries = Some(all);
            }
        }
        5 => {
            if let Ok(r) = proto::ControllerGetVolumeHealthResponse::decode(bytes) {
                out.entries = r.volume_health.and_then(about_the_asked_volume);
            }
        }
        6 => {
            if let Ok(r) = proto::NodeGetCapabilitiesResponse::decode(bytes) {
                let _ = NodeCapabilities::from_wire(r.capabilities);
            }
        }
        _ => {
            if let Ok(r) = proto::ControllerGetCapabilitiesResponse::decode(bytes) {
                let _ = ControllerCapabilities::from_wire(r.capabilities);
            }
        }
    }
    out
}

fn about_the_asked_volume(health: proto::VolumeHealth) -> Option<Vec<HealthEntry>> {
    check_volume_id("fuzz", ASKED_VOLUME, &health.volume_id).ok()?;
    Some(entries_from_wire(health.health_statuses))
}
