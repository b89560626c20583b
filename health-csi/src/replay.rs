//! A CSI client that sends a call's bytes and keeps the answer's bytes
//! (feature `testing`): how tests and benchmarks compare a driver's answers
//! directly and through `proxy`, down to the byte and the trailer.
//!
//! [`node_session`] is the kubelet's life of one volume on a node, as
//! encoded requests: NodeGetInfo, NodeStageVolume, NodePublishVolume,
//! NodeGetVolumeStats, NodeExpandVolume, NodeUnpublishVolume,
//! NodeUnstageVolume, then two methods no driver knows. The requests are
//! the messages of the project's `csi.proto` ([`crate::proto`]).

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use tokio::net::UnixStream;

use crate::proto::volume_capability::access_mode::Mode;
use crate::proto::volume_capability::{AccessMode, AccessType, MountVolume};
use crate::proto::{
    CapacityRange, CreateVolumeRequest, CreateVolumeResponse, DeleteVolumeRequest,
    NodeExpandVolumeRequest, NodePublishVolumeRequest, NodeStageVolumeRequest,
    NodeUnpublishVolumeRequest, NodeUnstageVolumeRequest, VolumeCapability,
};

/// The authority grpc-go clients (the kubelet among them) send for unix
/// socket targets.
const AUTHORITY: &str = "localhost";

/// A driver's answer as it came: HTTP status, headers (but `date`, a
/// server's clock), body bytes and trailers. Header values are kept as
/// text; gRPC metadata that is binary is base64 text on the wire anyway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawAnswer {
    pub status: u16,
    pub headers: BTreeMap<String, Vec<String>>,
    pub body: Bytes,
    pub trailers: BTreeMap<String, Vec<String>>,
}

impl RawAnswer {
    /// grpc-status: from the trailers, or the headers of a trailers-only
    /// answer.
    pub fn grpc_status(&self) -> Option<&str> {
        self.grpc("grpc-status")
    }

    pub fn grpc_message(&self) -> Option<&str> {
        self.grpc("grpc-message")
    }

    fn grpc(&self, name: &str) -> Option<&str> {
        self.trailers
            .get(name)
            .or_else(|| self.headers.get(name))
            .and_then(|v| v.first())
            .map(String::as_str)
    }

    /// The one message of a unary answer (after the 5-byte frame prefix).
    pub fn message(&self) -> Option<&[u8]> {
        let (prefix, message) = self.body.split_at_checked(5)?;
        let len = u32::from_be_bytes(prefix[1..].try_into().ok()?);
        (prefix[0] == 0 && usize::try_from(len).ok()? == message.len()).then_some(message)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error("connecting to {socket}")]
    Connect {
        socket: String,
        #[source]
        error: io::Error,
    },
    #[error("HTTP/2 with {socket}")]
    Handshake {
        socket: String,
        #[source]
        error: hyper::Error,
    },
    #[error("calling {path}")]
    Call {
        path: String,
        #[source]
        error: hyper::Error,
    },
    #[error("building the request for {path}")]
    Request {
        path: String,
        #[source]
        error: http::Error,
    },
}

/// One HTTP/2 connection to a CSI socket, as a gRPC client makes it.
#[derive(Clone, Debug)]
pub struct RawClient {
    send: SendRequest<Full<Bytes>>,
}

impl RawClient {
    /// Connects; the connection lives until every clone is dropped.
    pub async fn connect(socket: &Path) -> Result<RawClient, ReplayError> {
        let name = || socket.display().to_string();
        let stream = UnixStream::connect(socket)
            .await
            .map_err(|error| ReplayError::Connect {
                socket: name(),
                error,
            })?;
        let (send, conn) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
                .await
                .map_err(|error| ReplayError::Handshake {
                    socket: name(),
                    error,
                })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "replay connection ended");
            }
        });
        Ok(RawClient { send })
    }

    /// One unary call: `message` framed as gRPC sends it, the answer kept
    /// whole.
    pub async fn call(&self, path: &str, message: &[u8]) -> Result<RawAnswer, ReplayError> {
        let request = Request::builder()
            .method(Method::POST)
            .uri(format!("http://{AUTHORITY}{path}"))
            .header(CONTENT_TYPE, "application/grpc")
            .header(TE, "trailers")
            .body(Full::new(frame(message)))
            .map_err(|error| ReplayError::Request {
                path: path.to_string(),
                error,
            })?;
        let failed = |error| ReplayError::Call {
            path: path.to_string(),
            error,
        };
        let response = self
            .send
            .clone()
            .send_request(request)
            .await
            .map_err(failed)?;
        let (head, body) = response.into_parts();
        let collected = body.collect().await.map_err(failed)?;
        let trailers = collected.trailers().map(text).unwrap_or_default();
        let mut headers = text(&head.headers);
        headers.remove("date");
        Ok(RawAnswer {
            status: head.status.as_u16(),
            headers,
            body: collected.to_bytes(),
            trailers,
        })
    }
}

fn text(map: &HeaderMap) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (name, value) in map {
        out.entry(name.as_str().to_string())
            .or_default()
            .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
    }
    out
}

/// `message` in gRPC's length-prefixed frame.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(u32::try_from(message.len()).expect("a test message fits a frame"));
    out.put_slice(message);
    out.freeze()
}

/// One call of a session: what it is, where it goes, its request's bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionCall {
    pub name: &'static str,
    pub path: String,
    pub message: Vec<u8>,
}

/// A method of the Node service no driver implements, and a service no
/// driver serves: a pass-through must forward both as it forwards the rest.
pub const UNKNOWN_METHOD: &str = "/csi.v1.Node/NodeFrobnicateVolume";
pub const UNKNOWN_SERVICE: &str = "/csi.v1.Unknown/Call";

/// What the volume of a [`node_session`] is and where it goes.
#[derive(Clone, Debug)]
pub struct SessionVolume<'a> {
    pub volume_id: &'a str,
    pub staging_path: &'a Path,
    pub target_path: &'a Path,
    /// The size NodeExpandVolume asks for.
    pub expand_to: i64,
}

/// The kubelet's calls for one filesystem volume, single-node writer, from
/// NodeGetInfo to NodeUnstageVolume, then the two unknown methods.
pub fn node_session(v: &SessionVolume<'_>) -> Vec<SessionCall> {
    let staging = v.staging_path.to_string_lossy().into_owned();
    let target = v.target_path.to_string_lossy().into_owned();
    let capability = || Some(mount_capability());
    let id = v.volume_id.to_string();
    let node = |name: &'static str, message: Vec<u8>| SessionCall {
        name,
        path: format!("/csi.v1.Node/{name}"),
        message,
    };
    vec![
        node("NodeGetInfo", Vec::new()),
        node(
            "NodeStageVolume",
            NodeStageVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.clone(),
                volume_capability: capability(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        node(
            "NodePublishVolume",
            NodePublishVolumeRequest {
                volume_id: id.clone(),
                staging_target_path: staging.clone(),
                target_path: target.clone(),
                volume_capability: capability(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        node(
            "NodeGetVolumeStats",
            crate::proto::NodeGetVolumeStatsRequest {
                volume_id: id.clone(),
                volume_path: target.clone(),
                staging_target_path: staging.clone(),
            }
            .encode_to_vec(),
        ),
        node(
            "NodeExpandVolume",
            NodeExpandVolumeRequest {
                volume_id: id.clone(),
                volume_path: target.clone(),
                capacity_range: Some(CapacityRange {
                    required_bytes: v.expand_to,
                    limit_bytes: 0,
                }),
                staging_target_path: staging.clone(),
                volume_capability: capability(),
            }
            .encode_to_vec(),
        ),
        node(
            "NodeUnpublishVolume",
            NodeUnpublishVolumeRequest {
                volume_id: id.clone(),
                target_path: target,
            }
            .encode_to_vec(),
        ),
        node(
            "NodeUnstageVolume",
            NodeUnstageVolumeRequest {
                volume_id: id,
                staging_target_path: staging,
            }
            .encode_to_vec(),
        ),
        SessionCall {
            name: "unknown method",
            path: UNKNOWN_METHOD.to_string(),
            message: b"\x0a\x03abc".to_vec(),
        },
        SessionCall {
            name: "unknown service",
            path: UNKNOWN_SERVICE.to_string(),
            message: Vec::new(),
        },
    ]
}

/// A filesystem volume, single node writer.
pub fn mount_capability() -> VolumeCapability {
    VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// `Controller.CreateVolume`'s request for a filesystem volume of `bytes`
/// (how a test makes the volume a real driver then stages).
pub fn create_volume_request(name: &str, bytes: i64) -> Vec<u8> {
    CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![mount_capability()],
        ..Default::default()
    }
    .encode_to_vec()
}

/// The volume id in a `CreateVolumeResponse`.
pub fn created_volume_id(message: &[u8]) -> Result<String, prost::DecodeError> {
    let response = CreateVolumeResponse::decode(message)?;
    Ok(response.volume.map(|v| v.volume_id).unwrap_or_default())
}

/// `Controller.DeleteVolume`'s request.
pub fn delete_volume_request(volume_id: &str) -> Vec<u8> {
    DeleteVolumeRequest {
        volume_id: volume_id.to_string(),
    }
    .encode_to_vec()
}
