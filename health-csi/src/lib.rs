//! CSI health client for volume-health.
//!
//! Speaks both generations of CSI volume health to drivers over their unix
//! sockets: CSI 1.13's dedicated health RPCs (NodeGetVolumeHealth,
//! ControllerGetVolumeHealth, ControllerListVolumeHealth) and, for drivers
//! that answer those with UNIMPLEMENTED, the legacy `VolumeCondition` carried
//! by NodeGetVolumeStats, ControllerGetVolume and ListVolumes. Results come
//! out as one driver-independent shape ([`HealthEntry`] lists), with "no
//! health information" kept distinct from "healthy".
//!
//! The gRPC stubs are generated at build time from `proto/csi.proto` by a
//! pure-Rust protobuf compiler, so no `protoc` is needed.

mod conn;
mod controller;
mod discover;
mod driver_set;
mod error;
/// Decoding and conversion of answers without a socket (fuzz targets).
#[doc(hidden)]
pub mod fuzzing;
mod node;
mod types;

#[cfg(feature = "testing")]
pub mod raw_driver;
#[cfg(feature = "testing")]
pub mod testing;

/// Generated CSI messages and stubs (`csi.v1`), for callers that need a field
/// this crate does not surface.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod proto {
    tonic::include_proto!("csi.v1");
}

pub use controller::ControllerClient;
pub use discover::discover_node_sockets;
pub use driver_set::{
    DriverOverride, DriverSet, ProbeRequest, StorageProbe, TimedProbe,
    DEFAULT_MAX_IN_FLIGHT_PER_DRIVER,
};
pub use error::{BoxError, CsiError};
pub use node::{NodeClient, RpcSupport};
pub use types::{
    AccessType, ControllerCapabilities, ControllerHealthSource, ControllerVolumeReport,
    HealthEntry, HealthSource, HealthStatus, NodeCapabilities, NodeInfo, NodeVolumeReport,
    PluginInfo, StorageHealthEntry, StorageHealthStatus, Usage, UsageNumbers, VolumeHealthList,
    LEGACY_ABNORMAL_REASON, MAX_ENTRIES_PER_VOLUME,
};
