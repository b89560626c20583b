//! A CSI endpoint that answers with bytes the test chose (feature `testing`).
//!
//! [`crate::testing::TestDriver`] can only send what the generated types can
//! hold. A hostile or broken driver sends anything: strings that are not
//! UTF-8, lengths that lie, messages larger than the client's limit. This
//! server frames the test's bytes as the gRPC answer of the named method, so
//! tests see how the client copes with them over a real socket.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::io;
use std::marker::PhantomData;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::oneshot;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service};
use tonic::server::NamedService;
use tonic::Status;

/// Method path (`/csi.v1.Node/NodeGetVolumeHealth`) → the answer's bytes.
pub type RawAnswers = BTreeMap<String, Vec<u8>>;

/// A running raw endpoint; dropping it stops the server.
#[derive(Debug)]
pub struct RawDriver {
    socket: PathBuf,
    _stop: oneshot::Sender<()>,
}

impl RawDriver {
    /// Serves the Node and Controller services on `dir/csi.sock`; methods not
    /// in `answers` answer UNIMPLEMENTED. Needs a running tokio runtime.
    pub async fn start(dir: &Path, answers: RawAnswers) -> io::Result<RawDriver> {
        let socket = dir.join("csi.sock");
        let listener = UnixListener::bind(&socket)?;
        let answers = Arc::new(answers);
        let router = tonic::transport::Server::builder()
            .add_service(Raw::<NodeService>::new(&answers))
            .add_service(Raw::<ControllerService>::new(&answers));
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let stopped = async move {
                let _ = stopped.await;
            };
            if let Err(e) = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), stopped)
                .await
            {
                tracing::warn!(error = %e, "raw CSI endpoint stopped with an error");
            }
        });
        Ok(RawDriver {
            socket,
            _stop: stop,
        })
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }
}

trait ServiceName: Send + Sync + 'static {
    const NAME: &'static str;
}
struct NodeService;
impl ServiceName for NodeService {
    const NAME: &'static str = "csi.v1.Node";
}
struct ControllerService;
impl ServiceName for ControllerService {
    const NAME: &'static str = "csi.v1.Controller";
}

struct Raw<N> {
    answers: Arc<RawAnswers>,
    name: PhantomData<N>,
}

impl<N> Raw<N> {
    fn new(answers: &Arc<RawAnswers>) -> Self {
        Raw {
            answers: Arc::clone(answers),
            name: PhantomData,
        }
    }
}

impl<N> Clone for Raw<N> {
    fn clone(&self) -> Self {
        Raw::new(&self.answers)
    }
}

impl<N: ServiceName> NamedService for Raw<N> {
    const NAME: &'static str = N::NAME;
}

impl<N: ServiceName> Service<http::Request<Body>> for Raw<N> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let answer = self.answers.get(request.uri().path()).cloned();
        Box::pin(async move {
            let Some(bytes) = answer else {
                return Ok(Status::unimplemented("not in this raw endpoint's answers").into_http());
            };
            let reply = tower::service_fn(move |_: tonic::Request<Vec<u8>>| {
                let bytes = bytes.clone();
                async move { Ok::<_, Status>(tonic::Response::new(bytes)) }
            });
            Ok(tonic::server::Grpc::new(RawCodec)
                .unary(reply, request)
                .await)
        })
    }
}

/// Bytes in, bytes out: the gRPC framing without protobuf.
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        use bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}
