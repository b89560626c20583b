//! The HTTP side: accepting connections, applying the [`Mode`], recording each request
//! and routing it to the pod/PV and Event handlers.

use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use super::events::{create_event, get_event, list_events, patch_event};
use super::json::status_json;
use super::list::{collection, get_object};
use super::query::parse_query;
use super::reply::{error, Reply};
use super::stamped::{LastReceived, StampedStream};
use super::store::{Kind, Shared};
use super::volumehealth::{
    apply_pvc_labels, apply_volume_health, apply_volume_health_status, GROUP, VERSION,
};
use super::{Mode, Recorded};
use crate::protocol::mono_ns;

/// Response bodies: a whole JSON document or a watch stream.
type Body = BoxBody<Bytes, Infallible>;

/// The service's error when the request meets [`Mode::Refuse`]: hyper then closes
/// the connection without writing a response.
#[derive(Debug)]
struct Refused;

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("fake apiserver in Mode::Refuse: connection closed without a response")
    }
}

impl std::error::Error for Refused {}

/// A watch body: the lines a watch task sends, ended when the task drops its sender.
struct WatchBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for WatchBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|line| line.map(|l| Ok(Frame::data(l))))
    }
}

pub(super) async fn accept_loop(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: transient, keep serving.
                eprintln!("fake apiserver: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if *shared.mode.borrow() == Mode::Refuse {
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(shared.clone(), stream));
    }
}

/// Serves one connection until it ends or the mode becomes [`Mode::Refuse`], which
/// drops it (closing the socket, whatever it was doing).
async fn serve_connection(shared: Arc<Shared>, stream: tokio::net::TcpStream) {
    let svc_shared = shared.clone();
    let (stream, received) = StampedStream::new(stream);
    let service =
        hyper::service::service_fn(move |req| handle(svc_shared.clone(), received.clone(), req));
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut mode = shared.mode.subscribe();
    loop {
        tokio::select! {
            // Errors here are clients going away or Refused: nothing to report.
            _ = &mut conn => return,
            changed = mode.changed() => {
                if changed.is_err() || *mode.borrow_and_update() == Mode::Refuse {
                    return;
                }
            }
        }
    }
}

async fn handle(
    shared: Arc<Shared>,
    received: LastReceived,
    req: Request<Incoming>,
) -> Result<Response<Body>, Refused> {
    let at_mono_ns = mono_ns();
    // HTTP/1 without pipelining: the last read before the head was parsed
    // carried (the end of) this head.
    let rx_mono_ns = received.mono_ns();
    let (parts, body) = req.into_parts();
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_string)
    };
    let record = Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parse_query(parts.uri.query().unwrap_or("")),
        content_type: header(CONTENT_TYPE),
        authorization: header(AUTHORIZATION),
        body: None,
        at_mono_ns,
        rx_mono_ns,
        status: 0,
    };
    // Recorded before the body is read, so the order is that of the heads.
    let index = {
        let mut st = shared.lock();
        st.requests.push(record.clone());
        st.requests.len() - 1
    };
    if *shared.mode.borrow() == Mode::Refuse {
        return Err(Refused);
    }
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        // The client went away mid-body: nobody to answer.
        Err(_) => return Err(Refused),
    };
    let json_body = if bytes.is_empty() {
        None
    } else {
        serde_json::from_slice::<Value>(&bytes).ok()
    };
    if let Some(r) = shared.lock().requests.get_mut(index) {
        r.body = json_body.clone();
    }

    // Copied out: a `borrow()` guard in the scrutinee would be held through routing.
    let mode = *shared.mode.borrow();
    let reply = match mode {
        Mode::Refuse => return Err(Refused),
        Mode::Unavailable => Reply::Json(
            StatusCode::SERVICE_UNAVAILABLE,
            status_json(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the fake apiserver is unavailable (Mode::Unavailable)",
                None,
            ),
        ),
        Mode::Up => route(&shared, &parts.method, &record, &bytes, json_body),
    };

    let (status, body) = match reply {
        Reply::Json(status, value) => (status, Full::new(Bytes::from(value.to_string())).boxed()),
        Reply::Watch(rx) => (StatusCode::OK, WatchBody(rx).boxed()),
    };
    if let Some(r) = shared.lock().requests.get_mut(index) {
        r.status = status.as_u16();
    }
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

/// The API paths the agent uses (and a few neighbours that cost nothing).
fn route(
    shared: &Arc<Shared>,
    method: &Method,
    req: &Recorded,
    raw: &[u8],
    body: Option<Value>,
) -> Reply {
    let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let get = method == Method::GET;
    let patch = method == Method::PATCH;
    match segments.as_slice() {
        ["version"] if get => Reply::Json(StatusCode::OK, version_json()),
        ["api", "v1", "pods"] if get => collection(shared, Kind::Pod, None, &req.query),
        ["api", "v1", "namespaces", ns, "pods"] if get => {
            collection(shared, Kind::Pod, Some(ns), &req.query)
        }
        ["api", "v1", "namespaces", ns, "pods", name] if get => {
            get_object(shared, Kind::Pod, ns, name)
        }
        ["api", "v1", "persistentvolumes"] if get => {
            collection(shared, Kind::PersistentVolume, None, &req.query)
        }
        ["api", "v1", "persistentvolumes", name] if get => {
            get_object(shared, Kind::PersistentVolume, "", name)
        }
        ["api", "v1", "events"] if get => list_events(shared, None, &req.query),
        ["api", "v1", "namespaces", ns, "events"] if get => {
            list_events(shared, Some(ns), &req.query)
        }
        ["api", "v1", "namespaces", ns, "events"] if method == Method::POST => {
            create_event(shared, ns, &req.query, raw, body)
        }
        ["api", "v1", "namespaces", ns, "events", name] if get => get_event(shared, ns, name),
        ["api", "v1", "namespaces", ns, "events", name] if method == Method::PATCH => {
            patch_event(shared, ns, name, req, body)
        }
        ["api", "v1", "persistentvolumeclaims"] if get => {
            collection(shared, Kind::PersistentVolumeClaim, None, &req.query)
        }
        ["api", "v1", "namespaces", ns, "persistentvolumeclaims"] if get => {
            collection(shared, Kind::PersistentVolumeClaim, Some(ns), &req.query)
        }
        ["api", "v1", "namespaces", ns, "persistentvolumeclaims", name] if get => {
            get_object(shared, Kind::PersistentVolumeClaim, ns, name)
        }
        ["api", "v1", "namespaces", ns, "persistentvolumeclaims", name] if patch => {
            apply_pvc_labels(shared, ns, name, req, body)
        }
        ["apis", GROUP, VERSION, "volumehealths"] if get => {
            collection(shared, Kind::VolumeHealth, None, &req.query)
        }
        ["apis", GROUP, VERSION, "namespaces", ns, "volumehealths"] if get => {
            collection(shared, Kind::VolumeHealth, Some(ns), &req.query)
        }
        ["apis", GROUP, VERSION, "namespaces", ns, "volumehealths", name]
        | ["apis", GROUP, VERSION, "namespaces", ns, "volumehealths", name, "status"]
            if get =>
        {
            get_object(shared, Kind::VolumeHealth, ns, name)
        }
        ["apis", GROUP, VERSION, "namespaces", ns, "volumehealths", name] if patch => {
            apply_volume_health(shared, ns, name, req, body)
        }
        ["apis", GROUP, VERSION, "namespaces", ns, "volumehealths", name, "status"] if patch => {
            apply_volume_health_status(shared, ns, name, req, body)
        }
        ["version"]
        | ["api", "v1", "pods"]
        | ["api", "v1", "persistentvolumeclaims"]
        | ["api", "v1", "namespaces", _, "persistentvolumeclaims"]
        | ["api", "v1", "namespaces", _, "persistentvolumeclaims", _]
        | ["apis", GROUP, VERSION, "volumehealths"]
        | ["apis", GROUP, VERSION, "namespaces", _, "volumehealths"]
        | ["apis", GROUP, VERSION, "namespaces", _, "volumehealths", _]
        | ["apis", GROUP, VERSION, "namespaces", _, "volumehealths", _, "status"]
        | ["api", "v1", "namespaces", _, "pods" | "events"]
        | ["api", "v1", "namespaces", _, "pods" | "events", _]
        | ["api", "v1", "persistentvolumes"]
        | ["api", "v1", "persistentvolumes", _]
        | ["api", "v1", "events"] => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({method} {} on the fake apiserver)",
                req.path
            ),
            None,
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the server could not find the requested resource ({} is not served by the fake apiserver)",
                req.path
            ),
            None,
        ),
    }
}

fn version_json() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}
