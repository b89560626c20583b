//! A gRPC channel to one CSI driver over its unix socket, and the one place
//! where RPC outcomes become [`CsiError`]s.

use std::future::Future;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use crate::error::CsiError;

/// Last failure of our connector, shared with the channel's reconnect logic.
///
/// tonic turns a connector error into a plain UNAVAILABLE status and drops the
/// cause, which would make "driver socket gone" indistinguishable from a
/// driver that answered UNAVAILABLE. The connector writes its outcome here so
/// the status mapping can tell the two apart.
type ConnectState = Arc<Mutex<Option<io::Error>>>;

#[derive(Debug)]
pub(crate) struct Conn {
    socket: PathBuf,
    channel: Channel,
    timeout: Duration,
    last_connect_error: ConnectState,
}

impl Conn {
    /// Checks that `socket` is a unix socket, then builds a lazily connecting
    /// channel: the first RPC dials, and after a driver restart the channel
    /// dials again by itself.
    pub(crate) async fn open(socket: &Path, timeout: Duration) -> Result<Conn, CsiError> {
        // Checked up front so a wrong path fails at construction, naming it,
        // instead of at the first RPC.
        match tokio::fs::metadata(socket).await {
            Ok(meta) if meta.file_type().is_socket() => {}
            Ok(_) => {
                return Err(CsiError::Connect {
                    socket: socket.to_path_buf(),
                    error: Box::new(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "path exists but is not a unix socket",
                    )),
                })
            }
            Err(e) => {
                return Err(CsiError::Connect {
                    socket: socket.to_path_buf(),
                    error: Box::new(e),
                })
            }
        }

        // The URI only fills HTTP/2's :authority; the connector ignores it.
        // "localhost" is what grpc-go clients send for unix targets, so
        // drivers see the same header as from kubelet.
        let endpoint = Endpoint::from_static("http://localhost").connect_timeout(timeout);
        let state: ConnectState = Arc::new(Mutex::new(None));
        let path = Arc::new(socket.to_path_buf());
        let connector_state = Arc::clone(&state);
        let channel = endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = Arc::clone(&path);
            let state = Arc::clone(&connector_state);
            async move {
                let result = UnixStream::connect(path.as_path()).await;
                let mut last = state
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                match result {
                    Ok(stream) => {
                        *last = None;
                        Ok(TokioIo::new(stream))
                    }
                    Err(e) => {
                        *last = Some(io::Error::new(e.kind(), e.to_string()));
                        Err(e)
                    }
                }
            }
        }));
        Ok(Conn {
            socket: socket.to_path_buf(),
            channel,
            timeout,
            last_connect_error: state,
        })
    }

    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// A clone of the channel for one generated client; clones share the
    /// single HTTP/2 connection.
    pub(crate) fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// Wraps a message, telling the driver our deadline so it can stop work
    /// we will no longer wait for.
    pub(crate) fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(self.timeout);
        request
    }

    /// Runs one RPC bounded by the call timeout and maps its outcome.
    pub(crate) async fn call<T, F>(&self, rpc: &'static str, fut: F) -> Result<T, CsiError>
    where
        F: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let started = Instant::now();
        match tokio::time::timeout(self.timeout, fut).await {
            Err(_elapsed) => Err(CsiError::Timeout {
                rpc,
                after: self.timeout,
            }),
            Ok(Ok(response)) => Ok(response.into_inner()),
            // tonic's channel enforces the grpc-timeout we set as well, and
            // reports it as CANCELLED; when both timers expire in the same
            // tick its answer can win the race against ours. A cancellation
            // at or past our deadline is that timeout.
            Ok(Err(status))
                if status.code() == tonic::Code::Cancelled && started.elapsed() >= self.timeout =>
            {
                Err(CsiError::Timeout {
                    rpc,
                    after: self.timeout,
                })
            }
            Ok(Err(status)) => Err(self.map_status(rpc, status)),
        }
    }

    fn map_status(&self, rpc: &'static str, status: tonic::Status) -> CsiError {
        match status.code() {
            tonic::Code::Unimplemented => CsiError::Unsupported { rpc },
            tonic::Code::DeadlineExceeded => CsiError::Timeout {
                rpc,
                after: self.timeout,
            },
            tonic::Code::Unavailable => {
                let connect_failure = self
                    .last_connect_error
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .as_ref()
                    .map(|e| io::Error::new(e.kind(), e.to_string()));
                match connect_failure {
                    Some(source) => CsiError::Connect {
                        socket: self.socket.clone(),
                        error: Box::new(source),
                    },
                    None => CsiError::Status {
                        rpc,
                        code: status.code(),
                        message: status.message().to_string(),
                    },
                }
            }
            code => CsiError::Status {
                rpc,
                code,
                message: status.message().to_string(),
            },
        }
    }
}

/// CSI carries paths as strings; a non-UTF-8 path cannot be sent faithfully.
pub(crate) fn path_arg(path: &Path) -> Result<String, CsiError> {
    path.to_str()
        .map(str::to_owned)
        .ok_or_else(|| CsiError::NonUtf8Path {
            path: path.to_path_buf(),
        })
}

/// Turns a NOT_FOUND from a per-volume RPC into the typed "volume gone".
pub(crate) fn volume_gone(err: CsiError, volume_id: &str) -> CsiError {
    match err {
        CsiError::Status {
            rpc,
            code: tonic::Code::NotFound,
            ..
        } => CsiError::VolumeGone {
            rpc,
            volume_id: volume_id.to_string(),
        },
        other => other,
    }
}
