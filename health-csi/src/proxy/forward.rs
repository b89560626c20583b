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
//! resets is reset towards the kubelet with the driver's reason.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::UnixStream;
use tokio::sync::watch;

use super::{
    intercept, storage, Shared, NODE_GET_CAPABILITIES, NODE_GET_STORAGE_HEALTH,
    NODE_GET_VOLUME_HEALTH,
};

/// What goes to the driver: the kubelet's body as it streams in, or bytes
/// the proxy holds (a body it had to read, a call of its own).
pub(super) type ToDriver = Either<Incoming, Full<Bytes>>;
/// What goes to the kubelet: the driver's body as it streams in, or an
/// answer the proxy holds, with its trailers.
pub(super) type ToKubelet = Either<Incoming, Held>;

/// gRPC's own limit on a header list (grpc-go's default is 16 MiB); hyper's
/// default of 16 KiB would refuse a long grpc-message the driver sends.
const MAX_HEADER_LIST: u32 = 16 << 20;
/// How long a call whose driver connection failed waits for the kubelet's
/// connection to be closed (which happens at once) before giving up.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// An answer the proxy holds: `body` then `trailers`.
pub(super) fn held(body: Bytes, trailers: Option<HeaderMap>) -> ToKubelet {
    Either::Right(Held {
        data: (!body.is_empty()).then_some(body),
        trailers,
    })
}

/// A body the proxy holds whole: its bytes, then its trailers. Written by
/// hand because the body types of http-body-util announce their length,
/// for which hyper adds a content-length header the driver never sent, and
/// an empty one does not say it is over, which would turn a trailers-only
/// answer (headers ending the stream) into headers and an empty DATA frame:
/// a gRPC client then misses the status.
pub(super) struct Held {
    data: Option<Bytes>,
    trailers: Option<HeaderMap>,
}

impl Body for Held {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && self.trailers.is_none()
    }
}

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
    let upstream = Upstream { send, closed };
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

/// The connection to the driver, shared by the calls of one kubelet
/// connection.
#[derive(Clone)]
pub(super) struct Upstream {
    send: SendRequest<ToDriver>,
    /// True once the kubelet's connection was closed because the driver's
    /// ended.
    closed: watch::Receiver<bool>,
}

impl Upstream {
    /// Sends `request` to the driver and waits for its answer's head.
    pub(super) async fn send(
        &self,
        request: Request<ToDriver>,
    ) -> Result<Response<Incoming>, ProxyError> {
        match self.send.clone().send_request(request).await {
            Ok(response) => Ok(response),
            Err(e) => Err(self.failed(e).await),
        }
    }

    /// Reads a driver answer's whole body and trailers.
    pub(super) async fn collect(
        &self,
        body: Incoming,
    ) -> Result<(Bytes, Option<HeaderMap>), ProxyError> {
        match body.collect().await {
            Ok(collected) => {
                let trailers = collected.trailers().cloned();
                Ok((collected.to_bytes(), trailers))
            }
            Err(e) => Err(self.failed(e).await),
        }
    }

    /// The error for a failed exchange with the driver. A stream the driver
    /// reset keeps the driver's reason. Anything else is the connection
    /// failing, which closes the kubelet's connection: the call waits for
    /// that, so that no reset of the proxy's own reaches the kubelet first.
    async fn failed(&self, error: hyper::Error) -> ProxyError {
        if driver_reset(&error) {
            return ProxyError::DriverReset(error);
        }
        let mut closed = self.closed.clone();
        // An Err means the connection task is gone: closed as well.
        let _ = tokio::time::timeout(CLOSE_WAIT, closed.wait_for(|c| *c)).await;
        ProxyError::DriverConnection {
            refused: h2::Error::from(h2::Reason::REFUSED_STREAM),
            cause: error,
        }
    }
}

/// Whether the driver reset this stream (as opposed to the connection
/// failing): an h2 error in the cause chain that says so.
fn driver_reset(error: &hyper::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = cause {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return h2.is_reset() && h2.is_remote();
        }
        cause = e.source();
    }
    false
}

/// Why a call got no answer. hyper resets the kubelet's stream with the
/// HTTP/2 reason it finds among the sources.
#[derive(Debug, thiserror::Error)]
pub(super) enum ProxyError {
    /// The driver reset the stream: its reason (in the source) goes on.
    #[error("the driver reset the stream")]
    DriverReset(#[source] hyper::Error),
    /// The driver's connection failed; by now the kubelet's connection is
    /// closed too, and REFUSED_STREAM only reaches a kubelet whose
    /// connection somehow outlived the wait.
    #[error("the connection to the driver failed: {cause}")]
    DriverConnection {
        #[source]
        refused: h2::Error,
        cause: hyper::Error,
    },
    /// The kubelet's request body could not be read (it reset the stream).
    #[error("reading the kubelet's request")]
    Request(#[source] hyper::Error),
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
