//! `health-agent csi-proxy`: a node-side proxy between the kubelet and a CSI
//! driver's node socket, so that the kubelet's `pod.status.volumeHealth`
//! (which it fills only from the driver's NodeGetVolumeHealth) carries the
//! node agent's kernel evidence too.
//!
//! Every call is forwarded as the bytes it is: an HTTP/2 server on the
//! proxy's socket hands each request, headers and streaming body, to an
//! HTTP/2 connection to the driver's socket, and the driver's answer back
//! (status, headers, body, trailers), with no gRPC decoding and no
//! re-encoding; methods the proxy has never heard of pass the same way.
//! Each kubelet connection gets its own driver connection, opened when the
//! kubelet connects and closed with it, so the driver sees the kubelet's
//! connections one for one, and a driver that is down or goes away closes
//! the kubelet's connection as its own socket would have ([`forward`]).
//!
//! Three methods are intercepted ([`intercept`], [`storage`]):
//! - `Node/NodeGetCapabilities`: the driver's answer, with `GET_VOLUME_HEALTH`
//!   and `GET_STORAGE_HEALTH` appended where it lacks them (protobuf merges
//!   a repeated field by concatenation, so the driver's bytes stay as they
//!   are);
//! - `Node/NodeGetVolumeHealth`: the driver's own entries, when it advertises
//!   the capability, merged with the agent's conditions for that volume
//!   ([`merge`]: the Kubernetes 1.37 limits). Without the capability the
//!   driver is not asked, as the kubelet would not ask it;
//! - `Node/NodeGetStorageHealth`: likewise, the driver's backend entries
//!   merged with what the agent found in the storage stack under this
//!   driver's volumes on the node (the kubelet's
//!   `CSINode.status.storageHealth`).
//!
//! The agent's conditions come through [`Evidence`] (the agent's local socket
//! in `health-node`). Fail-open: an agent that does not answer in time costs
//! the answer its entries, never the call; it is counted and logged.

mod agent_conditions;
mod forward;
mod grpc;
mod intercept;
mod merge;
mod outage;
mod storage;
mod upstream;

use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::UnixListener;

pub use agent_conditions::{AgentCondition, Evidence};
pub use merge::{MAX_ENTRIES, MAX_MESSAGE_BYTES, MAX_REASON_BYTES};

use outage::Outage;

/// The kubelet's gRPC method paths the proxy answers differently.
pub const NODE_GET_CAPABILITIES: &str = "/csi.v1.Node/NodeGetCapabilities";
pub const NODE_GET_VOLUME_HEALTH: &str = "/csi.v1.Node/NodeGetVolumeHealth";
pub const NODE_GET_STORAGE_HEALTH: &str = "/csi.v1.Node/NodeGetStorageHealth";

/// Default bound on one question to the agent: far below the kubelet's own
/// call timeout, so a stuck agent delays an answer by at most this.
pub const DEFAULT_AGENT_TIMEOUT: Duration = Duration::from_millis(250);

/// How long what the driver advertised is taken as known. The kubelet asks
/// NodeGetCapabilities itself (and the proxy learns from that answer); this
/// bounds how stale the proxy's own view can get across a driver upgrade.
const CAPABILITY_TTL: Duration = Duration::from_secs(60);

#[derive(Clone, Debug)]
pub struct ProxyConfig {
    /// The driver's node socket (`csi.sock` in its socket directory).
    pub driver_socket: PathBuf,
    /// Bound on one question to the agent.
    pub agent_timeout: Duration,
    /// Add GET_VOLUME_HEALTH and GET_STORAGE_HEALTH to the driver's
    /// NodeGetCapabilities answer where it lacks them: what makes the
    /// kubelet ask NodeGetVolumeHealth and NodeGetStorageHealth at all. Off,
    /// NodeGetCapabilities passes as the driver answers, for conformance
    /// runs of a csi-sanity built before CSI 1.13, which fails on any
    /// capability it does not know.
    pub add_capability: bool,
}

/// What the proxy did since it started; for logs, metrics and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Client connections closed at once because the driver's socket did
    /// not accept a connection.
    pub driver_unreachable: u64,
    /// NodeGetCapabilities answers the proxy added capabilities to.
    pub capabilities_added: u64,
    /// NodeGetVolumeHealth answers the proxy merged or made.
    pub health_answers: u64,
    /// NodeGetStorageHealth answers the proxy merged or made.
    pub storage_answers: u64,
    /// Of those, answers without the agent's entries because the agent did
    /// not answer (down, slow, or refusing).
    pub agent_unavailable: u64,
}

/// The proxy: cheap to clone, all clones share one state.
#[derive(Clone)]
pub struct Proxy {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    driver_unreachable: AtomicU64,
    capabilities_added: AtomicU64,
    health_answers: AtomicU64,
    storage_answers: AtomicU64,
    agent_unavailable: AtomicU64,
}

/// The health calls a driver's NodeGetCapabilities advertises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Advertised {
    volume_health: bool,
    storage_health: bool,
}

impl Advertised {
    const NONE: Advertised = Advertised {
        volume_health: false,
        storage_health: false,
    };
}

/// What the driver said about itself, as far as the proxy needs it.
#[derive(Default)]
struct DriverFacts {
    /// GetPluginInfo's name: the agent keys volumes by driver and handle.
    name: Option<String>,
    /// The health calls it advertises, and when that was learnt.
    capabilities: Option<(Advertised, Instant)>,
}

struct Shared {
    config: ProxyConfig,
    evidence: Arc<dyn Evidence>,
    facts: Mutex<DriverFacts>,
    counters: Counters,
    driver_outage: Outage,
    agent_outage: Outage,
}

impl Proxy {
    pub fn new(config: ProxyConfig, evidence: Arc<dyn Evidence>) -> Self {
        Proxy {
            shared: Arc::new(Shared {
                config,
                evidence,
                facts: Mutex::new(DriverFacts::default()),
                counters: Counters::default(),
                driver_outage: Outage::new("the CSI driver's socket"),
                agent_outage: Outage::new("the volume-health agent"),
            }),
        }
    }

    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProxyStats {
            connections: load(&c.connections),
            driver_unreachable: load(&c.driver_unreachable),
            capabilities_added: load(&c.capabilities_added),
            health_answers: load(&c.health_answers),
            storage_answers: load(&c.storage_answers),
            agent_unavailable: load(&c.agent_unavailable),
        }
    }

    /// Accepts kubelet connections on `listener` until `shutdown` resolves,
    /// each served in a task of its own. Fails only if accepting fails for
    /// another reason than a lack of descriptors or memory.
    pub async fn serve(
        &self,
        listener: UnixListener,
        shutdown: impl Future<Output = ()>,
    ) -> io::Result<()> {
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                () = &mut shutdown => return Ok(()),
                accepted = listener.accept() => accepted,
            };
            match accepted {
                Ok((stream, _)) => {
                    self.shared
                        .counters
                        .connections
                        .fetch_add(1, Ordering::Relaxed);
                    tokio::spawn(forward::connection(Arc::clone(&self.shared), stream));
                }
                Err(e) if is_resource_shortage(&e) => {
                    tracing::warn!(error = %e, "accepting a connection; retrying shortly");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// A pause after EMFILE and the like, instead of spinning on the error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

fn is_resource_shortage(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

impl Shared {
    fn count(&self, counter: impl Fn(&Counters) -> &AtomicU64) {
        counter(&self.counters).fetch_add(1, Ordering::Relaxed);
    }

    /// The health calls the driver advertised, if learnt recently enough.
    fn known_capabilities(&self) -> Option<Advertised> {
        let facts = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        facts
            .capabilities
            .filter(|(_, at)| at.elapsed() < CAPABILITY_TTL)
            .map(|(advertised, _)| advertised)
    }

    /// Keeps what a NodeGetCapabilities answer of the driver advertises.
    fn learn_capabilities(&self, answer: &crate::proto::NodeGetCapabilitiesResponse) -> Advertised {
        use crate::proto::node_service_capability::rpc::Type as NodeRpc;
        let advertised = Advertised {
            volume_health: intercept::advertises(answer, NodeRpc::GetVolumeHealth),
            storage_health: intercept::advertises(answer, NodeRpc::GetStorageHealth),
        };
        let mut facts = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        facts.capabilities = Some((advertised, Instant::now()));
        advertised
    }

    fn driver_name(&self) -> Option<String> {
        let facts = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        facts.name.clone()
    }

    fn learn_driver_name(&self, name: String) {
        let mut facts = self.facts.lock().unwrap_or_else(|p| p.into_inner());
        facts.name = Some(name);
    }
}

/// Bytes as a driver's NodeGetVolumeHealth answer body, handled as the
/// proxy handles it: read as one gRPC frame, decoded, merged with an agent
/// condition, framed again. Panics when a promise of the merged answer is
/// broken (the fuzz target `csi_proxy`, `health_node::fuzz_targets`).
#[doc(hidden)]
pub fn fuzz_driver_answer(data: &[u8]) {
    use prost::Message as _;
    let Some(message) = grpc::unary_message(data) else {
        return;
    };
    let Ok(answer) = crate::proto::NodeGetVolumeHealthResponse::decode(message) else {
        return;
    };
    let driver = answer
        .volume_health
        .map(|h| h.health_statuses)
        .unwrap_or_default();
    let agent = [AgentCondition {
        status: health_core::conditions::Status::DataLoss,
        reason: "MediumErrors".into(),
        message: "2 medium errors on sdb".into(),
        source: "kernel".into(),
    }];
    let out = merge::merged(driver, &agent);
    assert!(out.len() <= MAX_ENTRIES, "{} entries", out.len());
    // The agent's condition goes only behind 16 at least as bad.
    let data_loss = crate::proto::VolumeHealthErrorType::DataLoss as i32;
    let inaccessible = crate::proto::VolumeHealthErrorType::Inaccessible as i32;
    assert!(
        out.iter()
            .any(|e| e.status == data_loss && e.reason == "MediumErrors")
            || (out.len() == MAX_ENTRIES
                && out
                    .iter()
                    .all(|e| e.status == data_loss || e.status == inaccessible)),
        "the agent's condition was dropped: {out:?}"
    );
    for (i, e) in out.iter().enumerate() {
        assert!(
            e.reason.len() <= MAX_REASON_BYTES,
            "reason of {} bytes",
            e.reason.len()
        );
        assert!(
            e.message.len() <= MAX_MESSAGE_BYTES,
            "message of {} bytes",
            e.message.len()
        );
        assert!(
            !out[..i]
                .iter()
                .any(|o| o.status == e.status && o.reason == e.reason),
            "({}, {:?}) twice",
            e.status,
            e.reason
        );
    }
    let reply = crate::proto::NodeGetVolumeHealthResponse {
        volume_health: Some(crate::proto::VolumeHealth {
            volume_id: String::new(),
            health_statuses: out,
        }),
    };
    let framed = grpc::frame(&reply.encode_to_vec());
    assert_eq!(
        grpc::unary_message(&framed).map(<[u8]>::to_vec),
        Some(reply.encode_to_vec()),
        "the proxy's own frame does not read back"
    );
}
