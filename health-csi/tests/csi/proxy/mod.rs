//! The CSI proxy between a client and the project's test drivers: the same
//! calls directly and through the proxy give the same bytes, except the two
//! answers the proxy exists to change, which are asserted entry by entry.
//!
//! `pass_through`: every call but those passes as the driver answers it,
//! and a driver that goes away takes the connection with it; `volume_health`:
//! NodeGetCapabilities' addition decides and NodeGetVolumeHealth merges;
//! `storage_health`: NodeGetStorageHealth merges the driver's backends with
//! the agent's stack findings.

mod pass_through;
mod storage_health;
mod volume_health;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use health_core::conditions::Status;
use health_csi::proto;
use health_csi::proxy::{AgentCondition, Evidence, Proxy, ProxyConfig};
use health_csi::replay::{RawAnswer, RawClient};
use health_csi::BoxError;
use prost::Message;
use tokio::task::JoinHandle;

const AGENT_TIMEOUT: Duration = Duration::from_millis(200);
const VOLUME: &str = "vol-1";

/// CSI v1.13.0 `VolumeHealthErrorType` numbers.
const DEGRADED: i32 = 1;
const INACCESSIBLE: i32 = 2;
const DATA_LOSS: i32 = 3;

/// What the fake agent does when asked.
#[derive(Clone, Debug)]
enum AgentMode {
    Answer(Vec<AgentCondition>),
    Fail,
    Hang,
}

/// The agent as the proxy sees it, with every question it was asked. Its
/// mode answers both questions: a volume's, and (the same conditions) a
/// driver's storage.
struct FakeAgent {
    mode: Mutex<AgentMode>,
    asked: Mutex<Vec<(Option<String>, String)>>,
    asked_storage: Mutex<Vec<Option<String>>>,
}

impl FakeAgent {
    fn new(mode: AgentMode) -> Arc<FakeAgent> {
        Arc::new(FakeAgent {
            mode: Mutex::new(mode),
            asked: Mutex::new(Vec::new()),
            asked_storage: Mutex::new(Vec::new()),
        })
    }

    fn asked(&self) -> Vec<(Option<String>, String)> {
        self.asked.lock().unwrap().clone()
    }

    fn asked_storage(&self) -> Vec<Option<String>> {
        self.asked_storage.lock().unwrap().clone()
    }

    fn answer(&self) -> BoxFuture<'static, Result<Vec<AgentCondition>, BoxError>> {
        let mode = self.mode.lock().unwrap().clone();
        Box::pin(async move {
            match mode {
                AgentMode::Answer(c) => Ok(c),
                AgentMode::Fail => Err("connection refused".into()),
                AgentMode::Hang => std::future::pending().await,
            }
        })
    }
}

impl Evidence for FakeAgent {
    fn conditions<'a>(
        &'a self,
        driver: Option<&'a str>,
        volume_id: &'a str,
    ) -> BoxFuture<'a, Result<Vec<AgentCondition>, BoxError>> {
        self.asked
            .lock()
            .unwrap()
            .push((driver.map(str::to_string), volume_id.to_string()));
        self.answer()
    }

    fn storage_conditions<'a>(
        &'a self,
        driver: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<AgentCondition>, BoxError>> {
        self.asked_storage
            .lock()
            .unwrap()
            .push(driver.map(str::to_string));
        self.answer()
    }
}

fn condition(status: Status, reason: &str, message: &str, source: &str) -> AgentCondition {
    AgentCondition {
        status,
        reason: reason.into(),
        message: message.into(),
        source: source.into(),
    }
}

/// A proxy serving `dir/proxy.sock` in front of `driver`.
struct Running {
    proxy: Proxy,
    socket: PathBuf,
    task: JoinHandle<std::io::Result<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn start_proxy(dir: &Path, driver: &Path, agent: Arc<FakeAgent>) -> Running {
    start_proxy_adding(dir, driver, agent, true)
}

fn start_proxy_adding(
    dir: &Path,
    driver: &Path,
    agent: Arc<FakeAgent>,
    add_capability: bool,
) -> Running {
    let socket = dir.join("proxy.sock");
    let listener = tokio::net::UnixListener::bind(&socket).unwrap();
    let proxy = Proxy::new(
        ProxyConfig {
            driver_socket: driver.to_path_buf(),
            agent_timeout: AGENT_TIMEOUT,
            add_capability,
        },
        agent,
    );
    let serving = proxy.clone();
    let task = tokio::spawn(async move { serving.serve(listener, std::future::pending()).await });
    Running {
        proxy,
        socket,
        task,
    }
}

async fn client(socket: &Path) -> RawClient {
    RawClient::connect(socket)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

async fn call(client: &RawClient, path: &str, message: &[u8]) -> RawAnswer {
    client
        .call(path, message)
        .await
        .unwrap_or_else(|e| panic!("{path}: {e:#}"))
}

fn health_request(volume_id: &str) -> Vec<u8> {
    proto::NodeGetVolumeHealthRequest {
        volume_id: volume_id.into(),
        volume_publish_path: "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/pv/mount".into(),
        staging_target_path: String::new(),
    }
    .encode_to_vec()
}

/// The entries of a NodeGetVolumeHealth answer: (status, reason, message).
fn entries(answer: &RawAnswer) -> (String, Vec<(i32, String, String)>) {
    assert_eq!(answer.grpc_status(), Some("0"), "{answer:?}");
    let health = proto::NodeGetVolumeHealthResponse::decode(answer.message().unwrap())
        .unwrap()
        .volume_health
        .unwrap();
    let entries = health
        .health_statuses
        .into_iter()
        .map(|e| (e.status, e.reason, e.message))
        .collect();
    (health.volume_id, entries)
}

fn entry(status: i32, reason: &str, message: &str) -> (i32, String, String) {
    (status, reason.into(), message.into())
}
