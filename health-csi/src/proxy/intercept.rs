//! The calls the proxy answers differently: NodeGetCapabilities gains
//! GET_VOLUME_HEALTH and GET_STORAGE_HEALTH, and NodeGetVolumeHealth merges
//! the driver's entries with the agent's conditions (NodeGetStorageHealth:
//! [`super::storage`]).
//!
//! Both touch only answers they understand: a driver error, a compressed or
//! malformed message goes back exactly as the driver sent it, so what the
//! kubelet gets is never worse than without the proxy.

use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, HeaderValue, Method, Request, Response, Uri};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::Incoming;
use prost::Message as _;

use super::merge::{merged, WireEntry};
use super::upstream::{held, ProxyError, ToKubelet, Upstream};
use super::{grpc, Advertised, AgentCondition, Shared, NODE_GET_CAPABILITIES};
use crate::proto;
use crate::proto::node_service_capability::rpc::Type as NodeRpc;

const GET_PLUGIN_INFO: &str = "/csi.v1.Identity/GetPluginInfo";

/// The driver's NodeGetCapabilities answer, with GET_VOLUME_HEALTH and
/// GET_STORAGE_HEALTH appended where the driver does not advertise them.
pub(super) async fn node_capabilities(
    shared: &Shared,
    upstream: &Upstream,
    request: Request<Incoming>,
) -> Result<Response<ToKubelet>, ProxyError> {
    let response = upstream.send(request.map(Either::Left)).await?;
    let (head, body) = response.into_parts();
    let (body, trailers) = upstream.collect(body).await?;
    let message = answered(&head.headers, trailers.as_ref(), &body).and_then(|m| {
        proto::NodeGetCapabilitiesResponse::decode(m)
            .ok()
            .map(|d| (m, d))
    });
    let Some((message, decoded)) = message else {
        return Ok(Response::from_parts(head, held(body, trailers)));
    };
    let advertised = shared.learn_capabilities(&decoded);
    let missing: Vec<NodeRpc> = [
        (advertised.volume_health, NodeRpc::GetVolumeHealth),
        (advertised.storage_health, NodeRpc::GetStorageHealth),
    ]
    .into_iter()
    .filter(|(has, _)| !has)
    .map(|(_, rpc)| rpc)
    .collect();
    if missing.is_empty() || !shared.config.add_capability {
        return Ok(Response::from_parts(head, held(body, trailers)));
    }
    // Protobuf merges a repeated field by concatenation: the driver's bytes
    // followed by more `capabilities` entries decode as its list plus ours.
    let mut changed = message.to_vec();
    changed.extend_from_slice(&capabilities(&missing));
    shared.count(|c| &c.capabilities_added);
    Ok(Response::from_parts(
        head,
        held(grpc::frame(&changed), trailers),
    ))
}

/// NodeGetVolumeHealth: the driver's entries when it advertises the
/// capability, merged with the agent's; the agent's alone otherwise.
pub(super) async fn node_volume_health(
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
    let asked =
        grpc::unary_message(&body).and_then(|m| proto::NodeGetVolumeHealthRequest::decode(m).ok());
    let Some(asked) = asked else {
        // Not a request the proxy can read: the driver's answer to it.
        let request = Request::from_parts(parts, Either::Right(Full::new(body)));
        return Ok(upstream.send(request).await?.map(Either::Left));
    };
    let uri = parts.uri.clone();
    let driver_answers = advertised(shared, upstream, &uri, "NodeGetVolumeHealth")
        .await
        .volume_health;
    let agent = ask_agent(shared, upstream, &uri, Question::Volume(&asked.volume_id));
    if !driver_answers {
        // The call is the proxy's to answer, and CSI 1.13 requires a
        // volume id (csi-sanity's NodeGetVolumeHealth spec checks it).
        if asked.volume_id.is_empty() {
            return Ok(own_error(INVALID_ARGUMENT, "volume_id is required"));
        }
        let agent = agent.await;
        shared.count(|c| &c.health_answers);
        let answer = proto::NodeGetVolumeHealthResponse {
            volume_health: Some(proto::VolumeHealth {
                volume_id: asked.volume_id,
                health_statuses: merged(Vec::new(), &agent),
            }),
        };
        return Ok(own_answer(&answer.encode_to_vec()));
    }
    let request = Request::from_parts(parts, Either::Right(Full::new(body)));
    let (response, agent) = tokio::join!(upstream.send(request), agent);
    let (head, body) = response?.into_parts();
    let (body, trailers) = upstream.collect(body).await?;
    let decoded = answered(&head.headers, trailers.as_ref(), &body)
        .and_then(|m| proto::NodeGetVolumeHealthResponse::decode(m).ok());
    let Some(mut decoded) = decoded else {
        return Ok(Response::from_parts(head, held(body, trailers)));
    };
    let health = decoded
        .volume_health
        .get_or_insert_with(|| proto::VolumeHealth {
            volume_id: asked.volume_id.clone(),
            health_statuses: Vec::new(),
        });
    let driver: Vec<WireEntry> = std::mem::take(&mut health.health_statuses);
    health.health_statuses = merged(driver, &agent);
    shared.count(|c| &c.health_answers);
    Ok(Response::from_parts(
        head,
        held(grpc::frame(&decoded.encode_to_vec()), trailers),
    ))
}

/// The message of an answer with grpc-status OK, if it is one readable
/// message.
pub(super) fn answered<'a>(
    headers: &HeaderMap,
    trailers: Option<&HeaderMap>,
    body: &'a [u8],
) -> Option<&'a [u8]> {
    (grpc::status(headers, trailers) == Some(grpc::OK))
        .then(|| grpc::unary_message(body))
        .flatten()
}

/// Whether a NodeGetCapabilities answer advertises `rpc`.
pub(super) fn advertises(answer: &proto::NodeGetCapabilitiesResponse, rpc: NodeRpc) -> bool {
    use proto::node_service_capability::Type as Arm;
    answer
        .capabilities
        .iter()
        .any(|c| matches!(&c.r#type, Some(Arm::Rpc(r)) if r.r#type == rpc as i32))
}

/// `capabilities` entries of NodeGetCapabilitiesResponse saying `rpcs`,
/// encoded as fields of that message.
fn capabilities(rpcs: &[NodeRpc]) -> Vec<u8> {
    use proto::node_service_capability::{Rpc, Type as Arm};
    proto::NodeGetCapabilitiesResponse {
        capabilities: rpcs
            .iter()
            .map(|rpc| proto::NodeServiceCapability {
                r#type: Some(Arm::Rpc(Rpc {
                    r#type: *rpc as i32,
                })),
            })
            .collect(),
    }
    .encode_to_vec()
}

/// An answer of the proxy's own: OK, with `message`.
pub(super) fn own_answer(message: &[u8]) -> Response<ToKubelet> {
    let mut trailers = HeaderMap::new();
    trailers.insert(grpc::STATUS, HeaderValue::from_static("0"));
    let mut response = Response::new(held(grpc::frame(message), Some(trailers)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(grpc::CONTENT_TYPE));
    response
}

/// gRPC's INVALID_ARGUMENT.
const INVALID_ARGUMENT: u16 = 3;

/// An error answer of the proxy's own: no message, the status and its
/// text in trailers only, as gRPC servers answer a refused call.
fn own_error(code: u16, message: &'static str) -> Response<ToKubelet> {
    let mut trailers = HeaderMap::new();
    trailers.insert(grpc::STATUS, HeaderValue::from(code));
    trailers.insert("grpc-message", HeaderValue::from_static(message));
    let mut response = Response::new(held(bytes::Bytes::new(), Some(trailers)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(grpc::CONTENT_TYPE));
    response
}

/// The health calls the driver advertises: as learnt from a recent
/// NodeGetCapabilities answer, else asked. A driver that cannot say is
/// taken as advertising none (the kubelet, asking the same, would not call);
/// `answering` names the call the proxy answers without it, for the log.
pub(super) async fn advertised(
    shared: &Shared,
    upstream: &Upstream,
    uri: &Uri,
    answering: &str,
) -> Advertised {
    if let Some(known) = shared.known_capabilities() {
        return known;
    }
    match own_call::<proto::NodeGetCapabilitiesResponse>(upstream, uri, NODE_GET_CAPABILITIES).await
    {
        Ok(answer) => shared.learn_capabilities(&answer),
        Err(e) => {
            tracing::warn!(error = %e, "answering {answering} without the driver");
            Advertised::NONE
        }
    }
}

/// What the proxy asks the agent's socket.
pub(super) enum Question<'a> {
    /// The conditions of one volume (by handle).
    Volume(&'a str),
    /// The driver's storage findings.
    Storage,
}

/// The agent's answer, bounded in time; none when the agent cannot say
/// (counted and logged: the answer is the driver's alone).
pub(super) async fn ask_agent(
    shared: &Shared,
    upstream: &Upstream,
    uri: &Uri,
    question: Question<'_>,
) -> Vec<AgentCondition> {
    let driver = driver_name(shared, upstream, uri).await;
    let (asked, answering) = match question {
        Question::Volume(volume_id) => (
            shared.evidence.conditions(driver.as_deref(), volume_id),
            "NodeGetVolumeHealth",
        ),
        Question::Storage => (
            shared.evidence.storage_conditions(driver.as_deref()),
            "NodeGetStorageHealth",
        ),
    };
    let timeout = shared.config.agent_timeout;
    let failure = match tokio::time::timeout(timeout, asked).await {
        Ok(Ok(conditions)) => {
            shared.agent_outage.ok();
            return conditions;
        }
        Ok(Err(e)) => e.to_string(),
        Err(_) => format!("no answer within {timeout:?}"),
    };
    shared.count(|c| &c.agent_unavailable);
    shared.agent_outage.failed(
        &failure,
        &format!("answering {answering} with the driver's entries alone"),
    );
    Vec::new()
}

/// The driver's name (GetPluginInfo), asked once and kept; `None` while it
/// cannot be had.
pub(super) async fn driver_name(shared: &Shared, upstream: &Upstream, uri: &Uri) -> Option<String> {
    if let Some(name) = shared.driver_name() {
        return Some(name);
    }
    match own_call::<proto::GetPluginInfoResponse>(upstream, uri, GET_PLUGIN_INFO).await {
        Ok(info) if !info.name.is_empty() => {
            shared.learn_driver_name(info.name.clone());
            Some(info.name)
        }
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(error = %e, "asking the agent by volume handle alone");
            None
        }
    }
}

/// Why a call of the proxy's own to the driver gave no answer.
#[derive(Debug, thiserror::Error)]
pub(super) enum OwnCallError {
    #[error("building the request for {path}")]
    Request {
        path: &'static str,
        #[source]
        error: http::Error,
    },
    #[error("calling {path}")]
    Driver {
        path: &'static str,
        #[source]
        error: ProxyError,
    },
    #[error("{path} answered grpc-status {status:?}")]
    Status {
        path: &'static str,
        status: Option<i32>,
    },
    #[error("{path} answered a body that is not one uncompressed message")]
    Body { path: &'static str },
    #[error("decoding the answer of {path}")]
    Decode {
        path: &'static str,
        #[source]
        error: prost::DecodeError,
    },
}

/// A unary call with an empty request (all the proxy makes), on the
/// kubelet's connection to the driver, with the scheme and authority the
/// kubelet sent.
pub(super) async fn own_call<M: prost::Message + Default>(
    upstream: &Upstream,
    uri: &Uri,
    path: &'static str,
) -> Result<M, OwnCallError> {
    let mut target = http::uri::Builder::new().path_and_query(path);
    if let Some(scheme) = uri.scheme() {
        target = target.scheme(scheme.clone());
    }
    if let Some(authority) = uri.authority() {
        target = target.authority(authority.clone());
    }
    let target = target
        .build()
        .map_err(|error| OwnCallError::Request { path, error })?;
    let request = Request::builder()
        .method(Method::POST)
        .uri(target)
        .header(CONTENT_TYPE, grpc::CONTENT_TYPE)
        .header(TE, "trailers")
        .body(Either::Right(Full::new(grpc::frame(&[]))))
        .map_err(|error| OwnCallError::Request { path, error })?;
    let driver = |error| OwnCallError::Driver { path, error };
    let (head, body) = upstream.send(request).await.map_err(driver)?.into_parts();
    let (body, trailers) = upstream.collect(body).await.map_err(driver)?;
    let status = grpc::status(&head.headers, trailers.as_ref());
    if status != Some(grpc::OK) {
        return Err(OwnCallError::Status { path, status });
    }
    let message = grpc::unary_message(&body).ok_or(OwnCallError::Body { path })?;
    M::decode(message).map_err(|error| OwnCallError::Decode { path, error })
}
