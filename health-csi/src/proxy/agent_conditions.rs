//! Where the proxy gets the node agent's conditions for a volume, and for a
//! driver's storage on this node. The agent
//! side (its socket and a client for it) lives in `health-node`; the proxy
//! only knows this interface, so it builds and is tested without the agent.

use futures_util::future::BoxFuture;
use health_core::conditions::Status;

use crate::BoxError;

/// One condition the agent holds for a volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentCondition {
    pub status: Status,
    /// CamelCase, e.g. `BlockIOErrors`.
    pub reason: String,
    pub message: String,
    /// Who in the agent says so: `kernel`, `check/read-only`, ...
    pub source: String,
}

/// The agent's current conditions for one volume. Implementations answer
/// from the agent's state; the proxy bounds each call by its own timeout.
pub trait Evidence: Send + Sync {
    /// The conditions of the volume with handle `volume_id` of the driver
    /// named `driver` (`None`: the driver's name is not known, any driver's
    /// volume with that handle). Empty: the agent knows nothing adverse.
    fn conditions<'a>(
        &'a self,
        driver: Option<&'a str>,
        volume_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AgentCondition>, BoxError>>;

    /// What the agent found in the storage stack under the volumes of the
    /// driver named `driver` on this node (`None`: every driver's): paths
    /// down, a pool full, an array degraded. Empty: nothing adverse.
    fn storage_conditions<'a>(
        &'a self,
        driver: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<AgentCondition>, BoxError>>;
}
