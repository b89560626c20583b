//! Typed errors of every CSI call this crate makes.

use std::path::PathBuf;
use std::time::Duration;

/// Boxed cause of a connection failure (an `io::Error` in practice).
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a CSI call gave no answer.
///
/// Callers decide policy from the variant: a `Timeout` or `Connect` is a failed
/// probe (never a recovery), `NotAdvertised` means the driver's capabilities
/// rule the question out (nothing was asked), `Unsupported` that the driver
/// answered UNIMPLEMENTED, `VolumeGone` that the driver no longer knows the
/// volume.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CsiError {
    /// The driver's unix socket could not be reached (missing, not a socket,
    /// nobody listening).
    #[error("cannot connect to CSI socket {}: {error}", socket.display())]
    Connect { socket: PathBuf, error: BoxError },
    /// The RPC did not finish within the call timeout (ours, or the deadline
    /// we sent to the driver).
    #[error("CSI {rpc} timed out after {after:?}")]
    Timeout { rpc: &'static str, after: Duration },
    /// The driver answered UNIMPLEMENTED. For an RPC whose capability it
    /// advertises that is a driver fault, and a failed probe.
    #[error("CSI driver does not support {rpc}")]
    Unsupported { rpc: &'static str },
    /// Not called: the driver does not advertise `needs`, the capability (or
    /// capabilities) `rpc` requires, so the kubelet would not call it either.
    #[error("CSI driver does not advertise {needs}: {rpc} not called")]
    NotAdvertised {
        rpc: &'static str,
        needs: &'static str,
    },
    /// The driver answered NOT_FOUND for this volume.
    #[error("CSI {rpc}: volume {volume_id} not found by the driver")]
    VolumeGone {
        rpc: &'static str,
        volume_id: String,
    },
    /// Any other gRPC error status.
    #[error("CSI {rpc} failed with {code:?}: {message}")]
    Status {
        rpc: &'static str,
        code: tonic::Code,
        message: String,
    },
    /// The driver answered, but with something we cannot use.
    #[error("CSI {rpc} returned an unusable response: {detail}")]
    InvalidResponse { rpc: &'static str, detail: String },
    /// CSI carries paths as strings, and this path is not UTF-8.
    #[error("path {} is not valid UTF-8 and cannot be sent to a CSI driver", path.display())]
    NonUtf8Path { path: PathBuf },
    /// A probe named a driver that the `DriverSet` does not hold.
    #[error("no CSI driver named {driver:?} is known")]
    UnknownDriver { driver: String },
    /// A `driver=socket` override could not be parsed.
    #[error("invalid CSI driver override {spec:?}: expected DRIVER=SOCKET_PATH")]
    InvalidOverride { spec: String },
    /// Not attempted: an earlier call to the same driver in the same
    /// `DriverSet::probe_all` round timed out, so this one would most likely
    /// have waited out its timeout too.
    #[error("CSI driver {driver} skipped: it timed out earlier in this round")]
    Skipped { driver: String },
}

impl CsiError {
    /// True when the failure says nothing about the volume itself (the driver
    /// could not be asked), as opposed to an answer from the driver.
    pub fn is_transport(&self) -> bool {
        matches!(
            self,
            CsiError::Connect { .. } | CsiError::Timeout { .. } | CsiError::Skipped { .. }
        )
    }
}
