//! The agent's side: HTTP/1.1 on a unix socket, two routes (a volume's
//! conditions, a driver's storage), answered from the [`Answers`] without
//! waiting on anything. Bounded like the metrics
//! endpoint: a few connections at once, headers within a timeout, a small
//! request body.

use std::convert::Infallible;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::UnixListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

use super::{
    Answer, Answers, PodVolumesQuestion, Question, StorageQuestion, PATH, POD_VOLUMES_PATH,
    STORAGE_PATH,
};

/// Connections served at once: one proxy per CSI driver on the node asks.
const MAX_CONNECTIONS: usize = 32;
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// A question is a driver name and a volume handle.
const MAX_QUESTION: usize = 64 << 10;
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("creating the directory of {}", path.display())]
    Directory {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("{} exists and is not a socket; not removing it", path.display())]
    NotASocket { path: PathBuf },
    #[error("removing the stale socket {}", path.display())]
    Stale {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error("listening on {}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
}

/// The socket being served; dropping it stops serving and removes the
/// socket file.
pub struct Served {
    board: Answers,
    socket: PathBuf,
    task: JoinHandle<()>,
}

impl Served {
    /// The board the socket answers from (to publish into).
    pub fn board(&self) -> Answers {
        self.board.clone()
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.task.abort();
        if let Err(e) = std::fs::remove_file(&self.socket) {
            tracing::debug!(socket = %self.socket.display(), error = %e, "removing the conditions socket");
        }
    }
}

/// Listens on `socket` (see [`bind_fresh`]) and answers from a new, empty
/// board.
pub async fn serve(socket: &Path) -> Result<Served, ServeError> {
    let listener = bind_fresh(socket)?;
    let board = Answers::default();
    let task = tokio::spawn(accept(listener, board.clone()));
    tracing::info!(socket = %socket.display(), "answering the CSI proxy's questions");
    Ok(Served {
        board,
        socket: socket.to_path_buf(),
        task,
    })
}

/// A listener on `socket`: its directory made if missing, a socket left
/// there by an earlier process (which did not get to remove it) replaced;
/// anything else at that path is left alone and refused.
pub fn bind_fresh(socket: &Path) -> Result<UnixListener, ServeError> {
    if let Some(dir) = socket.parent() {
        std::fs::create_dir_all(dir).map_err(|error| ServeError::Directory {
            path: socket.to_path_buf(),
            error,
        })?;
    }
    remove_stale(socket)?;
    // bind(2) makes the file before listen(2) runs: a client that sees the
    // file at once (the kubelet dials a driver's socket as soon as it is
    // there, and a test waits for it) can be refused in between. So the
    // listener is made under a name of its own and renamed into place: the
    // path exists only once it accepts.
    let staged = staging_name(socket);
    remove_stale(&staged)?;
    let listener = UnixListener::bind(&staged).map_err(|error| ServeError::Bind {
        path: socket.to_path_buf(),
        error,
    })?;
    std::fs::rename(&staged, socket).map_err(|error| {
        if let Err(e) = std::fs::remove_file(&staged) {
            tracing::warn!(socket = %staged.display(), error = %e, "removing a staged socket");
        }
        ServeError::Bind {
            path: socket.to_path_buf(),
            error,
        }
    })?;
    Ok(listener)
}

/// A name beside `socket`, this process's own, and short: a socket's path
/// must fit sun_path (108 bytes), and `.<pid>-<n>` is no longer than most
/// socket names it stands in for.
fn staging_name(socket: &Path) -> PathBuf {
    static STAGED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = STAGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    socket.with_file_name(format!(".{}-{n}", std::process::id()))
}

fn remove_stale(socket: &Path) -> Result<(), ServeError> {
    match std::fs::symlink_metadata(socket) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(ServeError::Stale {
            path: socket.to_path_buf(),
            error,
        }),
        Ok(meta) if meta.file_type().is_socket() => {
            std::fs::remove_file(socket).map_err(|error| ServeError::Stale {
                path: socket.to_path_buf(),
                error,
            })
        }
        Ok(_) => Err(ServeError::NotASocket {
            path: socket.to_path_buf(),
        }),
    }
}

async fn accept(listener: UnixListener, board: Answers) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        // Never closed: an Err cannot happen while this task runs.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "accepting on the conditions socket; retrying");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
                continue;
            }
        };
        let board = board.clone();
        let connection = http.serve_connection(
            TokioIo::new(stream),
            service_fn(move |request| answer(board.clone(), request)),
        );
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "conditions socket connection");
            }
            drop(slot);
        });
    }
}

/// The three questions the socket answers.
enum Route {
    Volume,
    Storage,
    PodVolumes,
}

async fn answer(
    board: Answers,
    request: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let route = match request.uri().path() {
        PATH => Route::Volume,
        STORAGE_PATH => Route::Storage,
        POD_VOLUMES_PATH => Route::PodVolumes,
        _ => {
            return Ok(text(
                StatusCode::NOT_FOUND,
                format!("only {PATH}, {STORAGE_PATH} and {POD_VOLUMES_PATH} are served\n"),
            ))
        }
    };
    if request.method() != Method::POST {
        let mut response = text(StatusCode::METHOD_NOT_ALLOWED, "POST only\n".into());
        response
            .headers_mut()
            .insert(ALLOW, HeaderValue::from_static("POST"));
        return Ok(response);
    }
    let body = match Limited::new(request.into_body(), MAX_QUESTION)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(e) => {
            return Ok(text(
                StatusCode::BAD_REQUEST,
                format!("reading the question: {e}\n"),
            ))
        }
    };
    let answer = match route {
        Route::Volume => serde_json::from_slice::<Question>(&body)
            .map(|q| serde_json::to_vec::<Answer>(&board.answer(&q))),
        Route::Storage => serde_json::from_slice::<StorageQuestion>(&body)
            .map(|q| serde_json::to_vec::<Answer>(&board.answer_storage(&q))),
        Route::PodVolumes => serde_json::from_slice::<PodVolumesQuestion>(&body)
            .map(|_| serde_json::to_vec(&board.answer_pod_volumes())),
    };
    let json = match answer {
        Ok(Ok(json)) => json,
        Err(e) => {
            return Ok(text(
                StatusCode::BAD_REQUEST,
                format!("not a question: {e}\n"),
            ))
        }
        Ok(Err(e)) => {
            return Ok(text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("encoding the answer: {e}\n"),
            ))
        }
    };
    let mut response = Response::new(Full::new(Bytes::from(json)));
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    use health_core::conditions::{CheckKind, Condition, Source, Status};
    use health_csi::proxy::{AgentCondition, Evidence};

    use super::*;
    use crate::conditions_socket::{AgentSocket, AskError};

    fn condition(source: Source, status: Status, reason: &str, message: &str) -> Condition {
        Condition {
            source,
            status,
            reason: reason.into(),
            message: message.into(),
            since: std::time::UNIX_EPOCH,
            last_probe: std::time::UNIX_EPOCH,
            occurrences: Some(3),
        }
    }

    /// A raw HTTP/1.1 exchange: status and body.
    async fn raw(socket: &Path, method: Method, path: &str, body: &'static str) -> (u16, String) {
        let stream = tokio::net::UnixStream::connect(socket).await.unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        tokio::spawn(conn);
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "localhost")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let response = send.send_request(request).await.unwrap();
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn the_proxy_gets_the_agents_own_conditions_of_the_volume() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/conditions.sock");
        let served = serve(&path).await.unwrap();
        served.board().set([(
            Some("d.csi"),
            Some("vol-1"),
            vec![
                condition(
                    Source::Kernel,
                    Status::DataLoss,
                    "BlockIOErrors",
                    "3 write errors",
                ),
                condition(Source::CsiNode, Status::Degraded, "DriverSaid", "echo"),
                condition(
                    Source::Check(CheckKind::ReadOnly),
                    Status::Inaccessible,
                    "ReadOnlyRemount",
                    "remounted read-only",
                ),
            ],
        )]);
        let agent = AgentSocket::new(&path);
        let got = agent.conditions(Some("d.csi"), "vol-1").await.unwrap();
        let want = |status, reason: &str, message: &str, source: &str| AgentCondition {
            status,
            reason: reason.into(),
            message: message.into(),
            source: source.into(),
        };
        assert_eq!(
            got,
            [
                want(
                    Status::Inaccessible,
                    "ReadOnlyRemount",
                    "remounted read-only",
                    "check/read-only"
                ),
                want(
                    Status::DataLoss,
                    "BlockIOErrors",
                    "3 write errors",
                    "kernel"
                ),
            ]
        );
        assert_eq!(agent.conditions(None, "vol-1").await.unwrap().len(), 2);
        assert_eq!(
            agent.conditions(Some("other.csi"), "vol-1").await.unwrap(),
            []
        );
        assert_eq!(agent.conditions(Some("d.csi"), "vol-2").await.unwrap(), []);
    }

    #[tokio::test]
    async fn the_proxy_gets_the_stack_findings_under_a_drivers_volumes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conditions.sock");
        let served = serve(&path).await.unwrap();
        served.board().set([
            (
                Some("d.csi"),
                Some("vol-1"),
                vec![
                    condition(
                        Source::Check(CheckKind::Stack),
                        Status::Degraded,
                        "PathsDown",
                        "dm-3 (mpatha): 1 of 2 paths down",
                    ),
                    condition(
                        Source::Kernel,
                        Status::DataLoss,
                        "BlockIOErrors",
                        "3 errors",
                    ),
                ],
            ),
            (
                Some("other.csi"),
                Some("vol-2"),
                vec![condition(
                    Source::Check(CheckKind::Stack),
                    Status::Inaccessible,
                    "ArrayFailed",
                    "md0 failed",
                )],
            ),
        ]);
        let agent = AgentSocket::new(&path);
        assert_eq!(
            agent.storage_conditions(Some("d.csi")).await.unwrap(),
            [AgentCondition {
                status: Status::Degraded,
                reason: "PathsDown".into(),
                message: "dm-3 (mpatha): 1 of 2 paths down".into(),
                source: "check/stack".into(),
            }]
        );
        assert_eq!(agent.storage_conditions(None).await.unwrap().len(), 2);
        assert_eq!(agent.storage_conditions(Some("x.csi")).await.unwrap(), []);
        assert_eq!(
            raw(&path, Method::POST, STORAGE_PATH, r#"{"driver":"other.csi"}"#).await,
            (
                200,
                r#"{"conditions":[{"status":"Inaccessible","reason":"ArrayFailed","message":"md0 failed","source":"check/stack"}]}"#
                    .to_string()
            )
        );
    }

    #[tokio::test]
    async fn anything_but_a_question_is_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conditions.sock");
        let _served = serve(&path).await.unwrap();
        assert_eq!(
            raw(&path, Method::POST, "/elsewhere", "").await,
            (
                404,
                "only /v1/volume-conditions, /v1/storage-conditions and /v1/pod-volume-conditions are served\n".to_string()
            )
        );
        assert_eq!(
            raw(&path, Method::GET, PATH, "").await,
            (405, "POST only\n".to_string())
        );
        let (status, body) = raw(&path, Method::POST, PATH, r#"{"driver":"d"}"#).await;
        assert_eq!(status, 400);
        assert!(
            body.starts_with("not a question: missing field `volumeHandle`"),
            "{body}"
        );
        assert_eq!(
            raw(
                &path,
                Method::POST,
                PATH,
                r#"{"driver":"d","volumeHandle":"v"}"#
            )
            .await,
            (200, r#"{"conditions":[]}"#.to_string())
        );
        assert_eq!(
            raw(&path, Method::POST, POD_VOLUMES_PATH, "{}").await,
            (200, r#"{"volumes":[]}"#.to_string())
        );
        let (status, body) = raw(&path, Method::POST, POD_VOLUMES_PATH, "[").await;
        assert_eq!(status, 400);
        assert!(body.starts_with("not a question: "), "{body}");
    }

    #[tokio::test]
    async fn volumes_gets_every_pod_volumes_conditions_the_agent_holds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conditions.sock");
        let served = serve(&path).await.unwrap();
        let key = crate::volumes::VolumeKey {
            pod_uid: "p1".into(),
            name: "pv-a".into(),
            mode: health_core::volume::VolumeMode::Block,
        };
        served.board().set_pod_volumes([(
            &key,
            vec![condition(
                Source::CsiNode,
                Status::Degraded,
                "DriverSaysSo",
                "the driver says so",
            )],
        )]);
        let answer = AgentSocket::new(&path).ask_pod_volumes().await.unwrap();
        assert_eq!(answer, served.board().answer_pod_volumes());
        let held: Vec<(&str, &str, bool, &str, &str)> = answer
            .volumes
            .iter()
            .flat_map(|v| {
                v.conditions.iter().map(move |c| {
                    (
                        v.pod_uid.as_str(),
                        v.name.as_str(),
                        v.block,
                        c.reason.as_str(),
                        c.source.as_str(),
                    )
                })
            })
            .collect();
        assert_eq!(held, [("p1", "pv-a", true, "DriverSaysSo", "csi-node")]);
    }

    #[tokio::test]
    async fn an_agent_that_is_not_there_is_an_error_not_an_empty_answer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conditions.sock");
        let err = AgentSocket::new(&path)
            .ask(&Question {
                driver: None,
                volume_handle: "v".into(),
            })
            .await
            .unwrap_err();
        assert!(matches!(err, AskError::Connect { .. }), "{err:?}");
        // Served and dropped: the socket file goes with it.
        let served = serve(&path).await.unwrap();
        assert!(path.exists());
        drop(served);
        assert!(!path.exists());
    }

    #[tokio::test]
    async fn the_socket_appears_only_once_it_accepts() {
        use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("csi.sock");
        let watch = Inotify::init(InitFlags::IN_NONBLOCK).unwrap();
        watch
            .add_watch(
                dir.path(),
                AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO,
            )
            .unwrap();
        let listener = bind_fresh(&path).unwrap();
        // Made elsewhere and moved in, never created at its name (bind
        // creates the file before listen makes it accept).
        let arrived: Vec<(String, AddWatchFlags)> = watch
            .read_events()
            .unwrap()
            .into_iter()
            .filter(|e| e.name.as_deref() == Some(std::ffi::OsStr::new("csi.sock")))
            .map(|e| ("csi.sock".to_owned(), e.mask))
            .collect();
        assert_eq!(
            arrived,
            [("csi.sock".to_owned(), AddWatchFlags::IN_MOVED_TO)]
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["csi.sock"], "nothing staged is left beside it");
        tokio::net::UnixStream::connect(&path).await.unwrap();
        drop(listener);
    }

    #[tokio::test]
    async fn a_stale_socket_is_replaced_and_anything_else_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("conditions.sock");
        // A socket an earlier agent left behind (killed before removing it).
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let served = serve(&path).await.unwrap();
        let answer = AgentSocket::new(&path)
            .ask(&Question {
                driver: None,
                volume_handle: "v".into(),
            })
            .await
            .unwrap();
        assert_eq!(answer.conditions, []);
        drop(served);
        std::fs::write(&path, "not a socket").unwrap();
        let refused = serve(&path).await.err().unwrap();
        assert!(
            matches!(refused, ServeError::NotASocket { .. }),
            "{refused:?}"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
    }
}
