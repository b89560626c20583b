//! CSI health client for volume-health.
//!
//! Speaks both generations of CSI volume health to drivers over their unix
//! sockets: CSI 1.13's dedicated health RPCs (NodeGetVolumeHealth,
//! NodeGetStorageHealth, ControllerGetVolumeHealth,
//! ControllerListVolumeHealth) and the legacy `VolumeCondition` carried by
//! NodeGetVolumeStats, ControllerGetVolume and ListVolumes (CSI <= 1.12).
//!
//! What to call is decided from the capabilities the driver advertises, as
//! the kubelet and external-health-monitor decide it ([`NodeCapabilities`],
//! [`ControllerCapabilities`]): a 1.13 RPC only with its capability
//! (GET_VOLUME_HEALTH, GET_STORAGE_HEALTH, LIST_VOLUME_HEALTH), the legacy
//! condition only from drivers advertising VOLUME_CONDITION, and no health
//! call at all to a driver advertising neither ([`CsiError::NotAdvertised`]).
//! Support is never guessed by calling: an advertised RPC answering
//! UNIMPLEMENTED is a failed probe ([`CsiError::Unsupported`]) each time.
//!
//! Results come out as one driver-independent shape ([`HealthEntry`]
//! lists), with "no health information" kept distinct from "healthy".
//!
//! The gRPC stubs are generated at build time from `proto/csi.proto` by a
//! pure-Rust protobuf compiler, so no `protoc` is needed. Every number in
//! it was checked against the published spec (its header says where).

mod capabilities;
mod conn;
mod controller;
mod discover;
mod driver_set;
mod error;
/// Decoding and conversion of answers without a socket (fuzz targets).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
mod node;
/// `health-agent csi-proxy`: the kubelet's CSI node calls, passed through
/// to the driver, with the agent's conditions in NodeGetVolumeHealth.
pub mod proxy;
mod types;

#[cfg(feature = "testing")]
pub mod raw_driver;
#[cfg(feature = "testing")]
pub mod replay;
#[cfg(feature = "testing")]
pub mod testing;

/// Generated CSI messages and stubs (`csi.v1`), for callers that need a field
/// this crate does not surface.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

pub use capabilities::{ControllerCapabilities, NodeCapabilities};
pub use controller::ControllerClient;
pub use discover::discover_node_sockets;
pub use driver_set::{
    DriverOverride, DriverSet, ProbeRequest, StorageProbe, TimedProbe,
    DEFAULT_MAX_IN_FLIGHT_PER_DRIVER,
};
pub use error::{BoxError, CsiError};
pub use node::NodeClient;
pub use types::{
    AccessType, ControllerHealthSource, ControllerVolumeReport, HealthEntry, HealthSource,
    HealthStatus, NodeInfo, NodeVolumeReport, PluginInfo, StorageHealthEntry, StorageHealthStatus,
    Usage, UsageNumbers, VolumeHealthList, LEGACY_ABNORMAL_REASON, MAX_ENTRIES_PER_VOLUME,
};
