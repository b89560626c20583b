//! NodeGetStorageHealth through the proxy: the driver's own backend entries
//! (when it advertises GET_STORAGE_HEALTH) and what the node agent found in
//! the storage stack under this driver's volumes on the node (paths down, a
//! thin pool full, an array degraded, an NVMe critical warning), which the
//! kubelet (1.37+, gate `CSIVolumeHealth`) writes into
//! `CSINode.status.storageHealth`.
//!
//! Within what the kubelet and the API server accept (Kubernetes 1.37,
//! `pkg/volume/csi/csi_client.go` and the CSINode status validation): at
//! most [`MAX_ENTRIES`] conditions (more makes the kubelet drop the whole
//! answer), reasons and messages cut like the volume entries. Worst first
//! (unreachable before degraded, the driver's before the agent's at the
//! same status), one entry per distinct (status, reason, message): two
//! multipath maps with paths down are two findings.

use http::{Request, Response};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use prost::Message as _;

use health_core::conditions::{clip_to, Status};

use super::intercept::{advertised, answered, ask_agent, own_answer, Question};
use super::merge::{MAX_ENTRIES, MAX_MESSAGE_BYTES, MAX_REASON_BYTES};
use super::upstream::{held, ProxyError, ToKubelet, Upstream};
use super::{AgentCondition, Shared};
use crate::proto;
use crate::proto::node_get_storage_health_response::StorageBackendHealth;
use crate::proto::StorageHealthErrorType as Wire;

/// The agent's and the driver's backend conditions as one answer.
pub(super) async fn node_storage_health(
    shared: &Shared,
    upstream: &Upstream,
    request: Request<Incoming>,
) -> Result<Response<ToKubelet>, ProxyError> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map_err(ProxyError::Request)?
        .to_bytes();
    let uri = parts.uri.clone();
    let driver_answers = advertised(shared, upstream, &uri, "NodeGetStorageHealth")
        .await
        .storage_health;
    let agent = ask_agent(shared, upstream, &uri, Question::Storage);
    if !driver_answers {
        let agent = agent.await;
        shared.count(|c| &c.storage_answers);
        let answer = proto::NodeGetStorageHealthResponse {
            backend_health: merged(Vec::new(), &agent),
        };
        return Ok(own_answer(&answer.encode_to_vec()));
    }
    let request = Request::from_parts(parts, Either::Right(Full::new(body)));
    let (response, agent) = tokio::join!(upstream.send(request), agent);
    let (head, body) = response?.into_parts();
    let (body, trailers) = upstream.collect(body).await?;
    let decoded = answered(&head.headers, trailers.as_ref(), &body)
        .and_then(|m| proto::NodeGetStorageHealthResponse::decode(m).ok());
    let Some(decoded) = decoded else {
        // The driver's error, or an answer the proxy cannot read: as it is.
        return Ok(Response::from_parts(head, held(body, trailers)));
    };
    let answer = proto::NodeGetStorageHealthResponse {
        backend_health: merged(decoded.backend_health, &agent),
    };
    shared.count(|c| &c.storage_answers);
    Ok(Response::from_parts(
        head,
        held(super::grpc::frame(&answer.encode_to_vec()), trailers),
    ))
}

/// The driver's entries and the agent's findings as one list (see the
/// module's comment). Agent messages say where they come from
/// (`volume-health check/stack: ...`).
pub(super) fn merged(
    driver: Vec<StorageBackendHealth>,
    agent: &[AgentCondition],
) -> Vec<StorageBackendHealth> {
    let agent = agent.iter().map(|c| StorageBackendHealth {
        status: wire_status(c.status) as i32,
        reason: c.reason.clone(),
        message: format!("volume-health {}: {}", c.source, c.message),
        volume_capability: None,
    });
    let mut all: Vec<StorageBackendHealth> = driver
        .into_iter()
        .chain(agent)
        .map(|e| StorageBackendHealth {
            reason: clip_to(e.reason, MAX_REASON_BYTES),
            message: clip_to(e.message, MAX_MESSAGE_BYTES),
            ..e
        })
        .collect();
    // Stable: the driver-before-agent and in-list orders survive.
    all.sort_by_key(|e| rank(e.status));
    let mut out: Vec<StorageBackendHealth> = Vec::with_capacity(MAX_ENTRIES);
    for e in all {
        if out.len() == MAX_ENTRIES {
            break;
        }
        let same = |o: &StorageBackendHealth| {
            o.status == e.status && o.reason == e.reason && o.message == e.message
        };
        if !out.iter().any(same) {
            out.push(e);
        }
    }
    out
}

/// The agent's volume statuses on the backend's scale: a stack that keeps
/// volumes from being reached is unreachable storage, anything milder
/// degraded storage.
fn wire_status(status: Status) -> Wire {
    match status {
        Status::Inaccessible => Wire::StorageUnreachable,
        Status::DataLoss | Status::Degraded => Wire::StorageDegraded,
    }
}

/// Unreachable first, then degraded, then values this build does not know.
fn rank(status: i32) -> u8 {
    match Wire::try_from(status) {
        Ok(Wire::StorageUnreachable) => 0,
        Ok(Wire::StorageDegraded) => 1,
        Ok(Wire::UnknownStorageHealthErrorType) | Err(_) => 2,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNREACHABLE: i32 = Wire::StorageUnreachable as i32;
    const DEGRADED: i32 = Wire::StorageDegraded as i32;

    fn wire(status: i32, reason: &str, message: &str) -> StorageBackendHealth {
        StorageBackendHealth {
            status,
            reason: reason.into(),
            message: message.into(),
            volume_capability: None,
        }
    }

    fn stack(status: Status, reason: &str, message: &str) -> AgentCondition {
        AgentCondition {
            status,
            reason: reason.into(),
            message: message.into(),
            source: "check/stack".into(),
        }
    }

    #[test]
    fn unreachable_first_driver_before_agent_each_finding_once() {
        let driver = vec![
            wire(DEGRADED, "ReplicaSlow", "replica 2 lags"),
            wire(UNREACHABLE, "ArrayOffline", "array b is offline"),
        ];
        let agent = [
            stack(
                Status::Degraded,
                "PathsDown",
                "dm-3 (mpatha): 1 of 2 paths down",
            ),
            stack(
                Status::Degraded,
                "PathsDown",
                "dm-5 (mpathb): 2 of 4 paths down",
            ),
            stack(
                Status::Inaccessible,
                "ThinPoolFull",
                "pool vg/tp: data 100%",
            ),
            stack(Status::DataLoss, "ArrayDegraded", "md0: 1 of 2 members"),
        ];
        assert_eq!(
            merged(driver, &agent),
            vec![
                wire(UNREACHABLE, "ArrayOffline", "array b is offline"),
                wire(
                    UNREACHABLE,
                    "ThinPoolFull",
                    "volume-health check/stack: pool vg/tp: data 100%"
                ),
                wire(DEGRADED, "ReplicaSlow", "replica 2 lags"),
                wire(
                    DEGRADED,
                    "PathsDown",
                    "volume-health check/stack: dm-3 (mpatha): 1 of 2 paths down"
                ),
                wire(
                    DEGRADED,
                    "PathsDown",
                    "volume-health check/stack: dm-5 (mpathb): 2 of 4 paths down"
                ),
                wire(
                    DEGRADED,
                    "ArrayDegraded",
                    "volume-health check/stack: md0: 1 of 2 members"
                ),
            ]
        );
    }

    #[test]
    fn at_most_sixteen_the_mildest_go_and_texts_are_cut() {
        let agent: Vec<AgentCondition> = (0..20)
            .map(|i| {
                let status = if i < 4 {
                    Status::Inaccessible
                } else {
                    Status::Degraded
                };
                stack(status, &format!("R{i:02}"), &"m".repeat(2000))
            })
            .collect();
        let out = merged(Vec::new(), &agent);
        assert_eq!(out.len(), MAX_ENTRIES);
        assert_eq!(
            out.iter().filter(|e| e.status == UNREACHABLE).count(),
            4,
            "every unreachable finding kept"
        );
        assert_eq!(out[15].reason, "R15");
        assert!(out.iter().all(|e| e.message.len() <= MAX_MESSAGE_BYTES));
    }

    #[test]
    fn nothing_and_nothing_is_nothing() {
        assert_eq!(merged(Vec::new(), &[]), Vec::<StorageBackendHealth>::new());
    }
}
