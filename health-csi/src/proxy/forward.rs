//! One kubelet connection and its driver connection, and the pass-through
//! of every call that is not intercepted.
//!
//! hyper serves HTTP/2 to the kubelet and speaks HTTP/2 to the driver; a
//! request goes on as hyper received it (method, path, authority, headers
//! such as grpc-timeout and metadata, the body streamed frame by frame) and
//! the answer comes back the same way (status, headers, body, trailers with
//! grpc-status, grpc-message and any details). No date header is added.
//!
//! The driver's absence reaches the kubelet as it would without the proxy:
//! a driver socket that refuses the connection gets the kubelet's
//! connection closed before a byte is served, and a driver connection that
//! ends (exit, crash) ends the kubelet's connection at once, without a
//! stream reset or GOAWAY of the proxy's own in between. A stream the driver
//! resets is reset towards the kubelet with the driver's reason. The calls'
//! handle on the driver connection, and their bodies and errors, are in
//! [`super::upstream`].

use std::sync::Arc;

use http::{Request, Response};
use http_body_util::Either;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::upstream::{ProxyError, ToDriver, ToKubelet, Upstream};
use super::{
    intercept, storage, Shared, NODE_GET_CAPABILITIES, NODE_GET_STORAGE_HEALTH,
    NODE_GET_VOLUME_HEALTH,
};

/// gRPC's own limit on a header list (grpc-go's default is 16 MiB); hyper's
/// default of 16 KiB would refuse a long grpc-message the driver sends.
const MAX_HEADER_LIST: u32 = 16 << 20;

/// Serves one kubelet connection until either side closes it.
pub(super) async fn connection(shared: Arc<Shared>, kubelet: UnixStream) {
    let driver = match UnixStream::connect(&shared.config.driver_socket).await {
        Ok(driver) => {
            shared.driver_outage.ok();
            driver
        }
        Err(e) => {
            shared.count(|c| &c.driver_unreachable);
            shared.driver_outage.failed(
                &format_args!("{}: {e}", shared.config.driver_socket.display()),
                "closing kubelet connections, as the driver's socket would",
            );
            return;
        }
    };
    let handshake = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .max_header_list_size(MAX_HEADER_LIST)
        .handshake::<_, ToDriver>(TokioIo::new(driver))
        .await;
    let (send, driver_conn) = match handshake {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, "HTTP/2 handshake with the driver failed; closing the kubelet's connection");
            return;
        }
    };
    let (closed_tx, closed) = watch::channel(false);
    let upstream = Upstream::new(send, closed);
    let service = service_fn(move |request| {
        let (shared, upstream) = (Arc::clone(&shared), upstream.clone());
        async move { route(&shared, &upstream, request).await }
    });
    let server = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .auto_date_header(false)
        .max_header_list_size(MAX_HEADER_LIST)
        // grpc-go servers set no limit; the driver's own applies upstream.
        .max_concurrent_streams(None)
        .serve_connection(TokioIo::new(kubelet), service);
    // Boxed, not pinned on the stack: it is dropped below, before the end
    // of this function.
    let mut server = Box::pin(server);
    let mut driver_conn = std::pin::pin!(driver_conn);
    tokio::select! {
        served = &mut server => {
            if let Err(e) = served {
                tracing::debug!(error = %e, "kubelet connection ended with an error");
            }
        }
        ended = &mut driver_conn => {
            if let Err(e) = ended {
                tracing::debug!(error = %e, "driver connection ended with an error");
            }
        }
    }
    // Dropping the server closes the kubelet's socket without flushing
    // anything more; only then are calls still waiting released.
    drop(server);
    let _ = closed_tx.send(true);
}

async fn route(
    shared: &Shared,
    upstream: &Upstream,
    request: Request<Incoming>,
) -> Result<Response<ToKubelet>, ProxyError> {
    match request.uri().path() {
        NODE_GET_CAPABILITIES => intercept::node_capabilities(shared, upstream, request).await,
        NODE_GET_VOLUME_HEALTH => intercept::node_volume_health(shared, upstream, request).await,
        NODE_GET_STORAGE_HEALTH => storage::node_storage_health(shared, upstream, request).await,
        _ => pass(upstream, request).await,
    }
}

/// Every other call: the request and the answer stream through untouched.
async fn pass(
    upstream: &Upstream,
    request: Request<Incoming>,
) -> Result<Response<ToKubelet>, ProxyError> {
    let response = upstream.send(request.map(Either::Left)).await?;
    Ok(response.map(Either::Left))
}
