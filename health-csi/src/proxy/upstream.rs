//! The driver's side of a call, as every handler sees it: the bodies that
//! go each way ([`ToDriver`], [`ToKubelet`], [`held`]), the handle on the
//! driver connection that the calls of one kubelet connection share
//! ([`Upstream`]), and why a call got no answer ([`ProxyError`]). Its own
//! module so that [`super::forward`], which routes calls to the handlers,
//! and the handlers ([`super::intercept`], [`super::storage`]) both build
//! on it without importing each other in a loop.
//!
//! A stream the driver resets is reset towards the kubelet with the
//! driver's reason; a driver connection that fails makes the call wait for
//! the kubelet's connection to be closed, so that no reset of the proxy's
//! own reaches the kubelet first.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Body, Frame, Incoming};
use hyper::client::conn::http2::SendRequest;
use tokio::sync::watch;

/// What goes to the driver: the kubelet's body as it streams in, or bytes
/// the proxy holds (a body it had to read, a call of its own).
pub(super) type ToDriver = Either<Incoming, Full<Bytes>>;
/// What goes to the kubelet: the driver's body as it streams in, or an
/// answer the proxy holds, with its trailers.
pub(super) type ToKubelet = Either<Incoming, Held>;

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
    /// The handle on a driver connection that `connection` opened; `closed`
    /// turns true once the kubelet's connection was closed because the
    /// driver's ended.
    pub(super) fn new(send: SendRequest<ToDriver>, closed: watch::Receiver<bool>) -> Self {
        Upstream { send, closed }
    }

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
