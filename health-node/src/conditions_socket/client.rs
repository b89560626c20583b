//! The proxy's side: one HTTP/1.1 exchange per question, on a fresh
//! connection (a unix socket connects in microseconds, and nothing is left
//! half-open when the agent restarts). The proxy bounds each in time.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures_util::future::BoxFuture;
use health_csi::proxy::{AgentCondition, Evidence};
use health_csi::BoxError;
use http::header::{CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;

use super::{
    Answer, PodVolumesAnswer, PodVolumesQuestion, Question, StorageQuestion, PATH,
    POD_VOLUMES_PATH, STORAGE_PATH,
};

/// A volume's answer is a few dozen conditions; the node's pod volumes
/// (`volumes`) a few hundred volumes with a condition each at most, each
/// message cut at 4 KiB.
const MAX_ANSWER: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum AskError {
    #[error("connecting to {}", socket.display())]
    Connect {
        socket: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("HTTP with {}", socket.display())]
    Http {
        socket: PathBuf,
        #[source]
        error: hyper::Error,
    },
    #[error("building the question")]
    Request(#[source] http::Error),
    #[error("encoding the question")]
    Encode(#[source] serde_json::Error),
    #[error("reading the answer")]
    Body(#[source] BoxError),
    #[error("the agent answered {status}: {body}")]
    Status { status: StatusCode, body: String },
    #[error("the agent's answer is not JSON of the expected shape")]
    Decode(#[source] serde_json::Error),
}

/// The agent's conditions socket, as `health-agent csi-proxy` and
/// `health-agent volumes` ask it.
#[derive(Clone, Debug)]
pub struct AgentSocket {
    socket: PathBuf,
}

impl AgentSocket {
    pub fn new(socket: &Path) -> Self {
        AgentSocket {
            socket: socket.to_path_buf(),
        }
    }

    /// The agent's answer for one volume.
    pub async fn ask(&self, question: &Question) -> Result<Answer, AskError> {
        self.exchange(PATH, question).await
    }

    /// The agent's answer for one driver's storage.
    pub async fn ask_storage(&self, question: &StorageQuestion) -> Result<Answer, AskError> {
        self.exchange(STORAGE_PATH, question).await
    }

    /// The agent's conditions of every pod volume on its node (what
    /// `health-agent volumes` shows when an agent answers).
    pub async fn ask_pod_volumes(&self) -> Result<PodVolumesAnswer, AskError> {
        self.exchange(POD_VOLUMES_PATH, &PodVolumesQuestion {})
            .await
    }

    async fn exchange<A: serde::de::DeserializeOwned>(
        &self,
        path: &'static str,
        question: &impl serde::Serialize,
    ) -> Result<A, AskError> {
        let stream =
            UnixStream::connect(&self.socket)
                .await
                .map_err(|error| AskError::Connect {
                    socket: self.socket.clone(),
                    error,
                })?;
        let http = |error| AskError::Http {
            socket: self.socket.clone(),
            error,
        };
        let (mut send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        let connection = tokio::spawn(connection);
        let body = serde_json::to_vec(question).map_err(AskError::Encode)?;
        let request = Request::builder()
            .method(Method::POST)
            .uri(path)
            .header(HOST, "localhost")
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(AskError::Request)?;
        let response = send.send_request(request).await.map_err(http)?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(AskError::Body)?
            .to_bytes();
        // The exchange is over; the connection task ends with the socket.
        connection.abort();
        if status != StatusCode::OK {
            return Err(AskError::Status {
                status,
                body: String::from_utf8_lossy(&body).trim().to_string(),
            });
        }
        serde_json::from_slice(&body).map_err(AskError::Decode)
    }
}

impl Evidence for AgentSocket {
    fn conditions<'a>(
        &'a self,
        driver: Option<&'a str>,
        volume_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AgentCondition>, BoxError>> {
        Box::pin(async move {
            let question = Question {
                driver: driver.map(str::to_string),
                volume_handle: volume_id.to_string(),
            };
            Ok(agent_conditions(self.ask(&question).await?))
        })
    }

    fn storage_conditions<'a>(
        &'a self,
        driver: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<AgentCondition>, BoxError>> {
        Box::pin(async move {
            let question = StorageQuestion {
                driver: driver.map(str::to_string),
            };
            Ok(agent_conditions(self.ask_storage(&question).await?))
        })
    }
}

fn agent_conditions(answer: Answer) -> Vec<AgentCondition> {
    answer
        .conditions
        .into_iter()
        .map(|c| AgentCondition {
            status: c.status,
            reason: c.reason,
            message: c.message,
            source: c.source,
        })
        .collect()
}
