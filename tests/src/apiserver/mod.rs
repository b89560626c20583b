//! A fake kube-apiserver for end-to-end tests of cluster mode.
//!
//! Why a fake: the agent is a real binary that talks HTTP to an API server, and the
//! tests must check exactly what it asks (selectors, patches, retries after an outage)
//! and drive exactly what it sees (a pod moving to the node, a PV deleted). A real
//! control plane (kind, k3s) needs images, minutes to start and gives no such control.
//! This server speaks just enough of the protocol for the agent's calls, over plain
//! HTTP/1 on 127.0.0.1, with the behaviour kube-rs 5 depends on:
//!
//! - **Pods and PersistentVolumes**: list (`limit`/`continue` pagination over a
//!   snapshot, `fieldSelector` on `spec.nodeName`, `metadata.name`,
//!   `metadata.namespace`) and watch (`watch=true`, newline-delimited JSON events in a
//!   chunked body, ended after `timeoutSeconds`, resumable from any `resourceVersion`
//!   still in a bounded history, else an `ERROR` event with a 410 `Expired` Status,
//!   `BOOKMARK`s when `allowWatchBookmarks=true`, `sendInitialEvents=true` streaming
//!   lists). A pod leaving a watch's selection is sent to it as `DELETED`.
//! - **core/v1 Events**: create (`POST`), merge-patch (`PATCH`, both merge-patch and
//!   strategic-merge-patch content types applied as RFC 7386), get and list, with the
//!   server-assigned fields and the error Statuses (404, 409, 422) a real server gives.
//! - **PersistentVolumeClaims and `VolumeHealth`s** (the project's CRD,
//!   `volume-health.io/v1alpha1`): get, list and watch as above (all namespaces or
//!   one). Written only by server-side apply (`application/apply-patch+yaml`,
//!   `fieldManager`, `force`; `volumehealth` and `apply`): a `VolumeHealth` is created
//!   by an apply of the object (metadata, `spec`; `generation` counts spec changes),
//!   its `status` by an apply of the `status` subresource (404 when the object is
//!   missing), where `status.sources` is a list-map keyed by `name` whose entries
//!   belong to the manager that applied them (an entry it applied before and no
//!   longer sends is removed, others' are kept) and every other status field is
//!   replaced by what was sent. A PVC apply sets `metadata.labels` with the same
//!   per-manager ownership of each label (anything else in the body is a 422); a
//!   PVC the test did not [`put`](FakeApiServer::put) is 404, never created. In
//!   every apply `metadata.resourceVersion` and `metadata.uid` are preconditions
//!   (409 `Conflict`), and an unforced apply changing another manager's field is a
//!   409 too. Ownership is kept by the server, not in `metadata.managedFields`.
//! - **Outages**: [`Mode::Unavailable`] (503 for everything) and [`Mode::Refuse`]
//!   (connections closed without an answer), both ending open watches.
//!
//! Every request is recorded ([`Recorded`]) with its arrival time on CLOCK_MONOTONIC,
//! the clock the agent and the fault disk use, so tests can order API calls against
//! kernel errors.
//!
//! Errors are always `kind: Status` JSON bodies: kube-rs turns those into
//! `kube::Error::Api` with the code and reason, anything else into a vaguer error.
//!
//! The server runs on its own thread with a current-thread tokio runtime, so it can be
//! used from plain `#[test]` functions; dropping [`FakeApiServer`] stops it and closes
//! every connection.
//!
//! Layout: [`FakeApiServer`] (here) is what tests hold, and `store` the state it shares
//! with the server thread. `server` accepts connections and routes each request to a
//! handler: `list` (which hands `watch=true` on to `watches`), `events` or
//! `volumehealth` (with `apply`). Handlers work on the store under its lock with
//! `select`, `query`, `reply` and `json` as helpers;
//! nothing below `server` sees a connection.

mod apply;
mod events;
mod json;
mod labels;
mod list;
mod query;
mod reply;
mod select;
mod server;
mod stamped;
mod store;
mod volumehealth;
mod watches;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use tokio::sync::{oneshot, watch};

use self::json::name_of;
use self::query::{is_watch, param};
use self::server::accept_loop;
use self::store::{Kind, Shared, State};

/// The kinds [`FakeApiServer::put`] takes, for its messages.
const KINDS: &str = "Pod, PersistentVolume, PersistentVolumeClaim or VolumeHealth";

/// How [`FakeApiServer::wait_for`] polls.
const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The bearer token in the written kubeconfig (recorded as `Bearer test-token`).
pub const TOKEN: &str = "test-token";

/// The server's answer to everything, switchable at any time with
/// [`FakeApiServer::set_mode`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mode {
    /// Normal operation.
    #[default]
    Up,
    /// Every request is answered 503 with a `ServiceUnavailable` Status, and open
    /// watch streams end cleanly, like an apiserver that lost etcd.
    ///
    /// Note that kube-rs clients retry 503 (and 429, 504) by default, up to 15 times
    /// with exponential backoff from 5 ms (`Config::default_retry`), so a default client
    /// sees the error only after minutes, or never if the mode goes back to `Up` first.
    Unavailable,
    /// Connections are accepted and closed at once without an answer, and open
    /// connections (idle keep-alive ones and watches) are closed, like a crashed or
    /// restarting apiserver. Clients get transport errors, never a Status.
    Refuse,
}

/// One request as it arrived, in [`FakeApiServer::requests`].
#[derive(Clone, Debug, PartialEq)]
pub struct Recorded {
    pub method: String,
    /// The path without the query, e.g. `/api/v1/pods`.
    pub path: String,
    /// Query parameters in order, percent-decoded (`+` is a space); empty pairs
    /// (kube-rs's queries start with `?&`) are left out.
    pub query: Vec<(String, String)>,
    pub content_type: Option<String>,
    pub authorization: Option<String>,
    /// The body, if it was non-empty JSON.
    pub body: Option<Value>,
    /// CLOCK_MONOTONIC ns when the server's handler saw the request head.
    pub at_mono_ns: u64,
    /// CLOCK_MONOTONIC ns when the kernel received the bytes that carried
    /// the head (the socket's `SO_TIMESTAMPNS`): when the request reached
    /// this host, before the server's own scheduling and parsing. `None`
    /// when the kernel attached no time.
    pub rx_mono_ns: Option<u64>,
    /// The status answered; for a watch, the status of the stream's head (200 even
    /// when the stream carries a 410 `ERROR` event). 0 when no answer was sent: the
    /// request met [`Mode::Refuse`] or its body could not be read.
    pub status: u16,
}

impl Recorded {
    /// The first value of query parameter `key`.
    pub fn param(&self, key: &str) -> Option<&str> {
        param(&self.query, key)
    }

    /// Whether this is a watch (`watch=true`) rather than a list or get.
    pub fn is_watch(&self) -> bool {
        is_watch(&self.query)
    }

    /// What RBAC would check for this request: (API group, resource with its
    /// subresource as in `volumehealths/status`, verb); `None` for a path that
    /// names no resource (`/version`).
    pub fn access(&self) -> Option<(String, String, &'static str)> {
        let segments: Vec<&str> = self.path.trim_matches('/').split('/').collect();
        let (group, rest) = match segments.as_slice() {
            ["api", "v1", rest @ ..] => ("", rest),
            ["apis", group, _version, rest @ ..] => (*group, rest),
            _ => return None,
        };
        let rest = match rest {
            ["namespaces", _, rest @ ..] if !rest.is_empty() => rest,
            rest => rest,
        };
        let (resource, named) = match rest {
            [resource] => (resource.to_string(), false),
            [resource, _name] => (resource.to_string(), true),
            [resource, _name, sub] => (format!("{resource}/{sub}"), true),
            _ => return None,
        };
        let verb = match (self.method.as_str(), named) {
            ("GET", _) if self.is_watch() => "watch",
            ("GET", true) => "get",
            ("GET", false) => "list",
            ("POST", _) => "create",
            ("PUT", _) => "update",
            ("PATCH", _) => "patch",
            ("DELETE", true) => "delete",
            ("DELETE", false) => "deletecollection",
            _ => return None,
        };
        Some((group.to_string(), resource, verb))
    }
}

/// A fake kube-apiserver on 127.0.0.1; see the module docs. Stopped on drop.
pub struct FakeApiServer {
    shared: Arc<Shared>,
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl FakeApiServer {
    /// Binds 127.0.0.1 on a free port and starts serving on a new thread.
    pub fn start() -> Result<FakeApiServer> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("fake apiserver: building its tokio runtime")?;
        Self::start_on(rt)
    }

    /// As [`FakeApiServer::start`], with connections served by `workers`
    /// threads: for timing measurements, where one connection's handling
    /// must not delay the stamp of a request arriving on another. Tests that
    /// read the order of requests on different connections use `start`.
    pub fn start_multi_thread(workers: usize) -> Result<FakeApiServer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name("fake-apiserver-worker")
            .enable_all()
            .build()
            .context("fake apiserver: building its tokio runtime")?;
        Self::start_on(rt)
    }

    fn start_on(rt: tokio::runtime::Runtime) -> Result<FakeApiServer> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("fake apiserver: binding 127.0.0.1:0")?;
        stamped::stamp_accepted(&listener);
        listener
            .set_nonblocking(true)
            .context("fake apiserver: making the listener non-blocking")?;
        let addr = listener
            .local_addr()
            .context("fake apiserver: local address")?;
        let listener = {
            let _guard = rt.enter();
            tokio::net::TcpListener::from_std(listener)
                .context("fake apiserver: registering the listener with tokio")?
        };
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            changes: watch::Sender::new(0),
            mode: watch::Sender::new(Mode::Up),
        });
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let thread_shared = shared.clone();
        let thread = std::thread::Builder::new()
            .name("fake-apiserver".into())
            .spawn(move || {
                rt.block_on(accept_loop(thread_shared, listener, shutdown_rx));
                // Dropping the runtime here drops every connection and watch task,
                // which closes their sockets.
            })
            .context("fake apiserver: spawning its thread")?;
        Ok(FakeApiServer {
            shared,
            addr,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Writes `dir/kubeconfig` pointing at this server: one cluster, one user with the
    /// bearer token [`TOKEN`], and a current context with namespace `default`. It is
    /// JSON, which every kubeconfig reader accepts as YAML.
    pub fn write_kubeconfig(&self, dir: &Path) -> Result<PathBuf> {
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url()}}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [{
                "name": "fake",
                "context": {"cluster": "fake", "user": "fake", "namespace": "default"},
            }],
            "current-context": "fake",
            "preferences": {},
        });
        let path = dir.join("kubeconfig");
        let text = serde_json::to_string_pretty(&config).context("serializing the kubeconfig")?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// Creates or replaces a Pod, PersistentVolume, PersistentVolumeClaim or
    /// VolumeHealth (chosen by its `kind`), as a controller or the kubelet would, and
    /// tells matching watches (`ADDED` or `MODIFIED`; `DELETED` to a watch the object
    /// no longer matches).
    ///
    /// The server sets `apiVersion` (`v1`, or the CRD's), a new
    /// `metadata.resourceVersion`, and keeps or assigns `metadata.uid` and
    /// `metadata.creationTimestamp`. A namespaced object without a namespace goes to
    /// `default`; a PV's namespace is removed.
    ///
    /// # Panics
    /// If `kind` is none of these or `metadata.name` is missing: a bug in the
    /// test, reported where it is made.
    pub fn put(&self, obj: Value) {
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .and_then(Kind::from_kind)
            .unwrap_or_else(|| {
                panic!(
                    "FakeApiServer::put: `kind` must be {KINDS}, got {}",
                    obj.get("kind").unwrap_or(&Value::Null)
                )
            });
        if name_of(&obj).is_empty() {
            panic!(
                "FakeApiServer::put: the {} has no metadata.name: {obj}",
                kind.kind()
            );
        }
        let rv = {
            let mut st = self.shared.lock();
            st.put_object(kind, obj);
            st.rv
        };
        self.shared.changes.send_replace(rv);
    }

    /// Deletes a stored object (`kind` as in the object: `Pod`, `PersistentVolume`,
    /// ...) and sends `DELETED` to the watches it matched. Returns whether it
    /// existed. `namespace` is ignored for PVs; `None` means `default` otherwise.
    ///
    /// # Panics
    /// If `kind` is not one of the stored kinds.
    pub fn delete(&self, kind: &str, namespace: Option<&str>, name: &str) -> bool {
        let Some(kind) = Kind::from_kind(kind) else {
            panic!("FakeApiServer::delete: kind must be {KINDS}, got {kind:?}");
        };
        let namespace = if kind.namespaced() {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        let rv = {
            let mut st = self.shared.lock();
            if !st.delete_object(kind, namespace, name) {
                return false;
            }
            st.rv
        };
        self.shared.changes.send_replace(rv);
        true
    }

    /// Forgets the watch history, as an etcd compaction does: any watch that resumes
    /// (or has yet to catch up) from an older `resourceVersion` gets a 410 `Expired`
    /// `ERROR` event, which makes kube-rs's watcher list again.
    pub fn compact_history(&self) {
        let rv = {
            let mut st = self.shared.lock();
            st.history.clear();
            st.compacted_rv = st.rv;
            st.rv
        };
        // Wake watches so lagging ones learn of the compaction now.
        self.shared.changes.send_replace(rv);
    }

    /// The stored object, as the server would return it.
    pub fn object(&self, kind: &str, namespace: Option<&str>, name: &str) -> Option<Value> {
        let kind = Kind::from_kind(kind)?;
        let namespace = if kind.namespaced() {
            namespace.unwrap_or("default")
        } else {
            ""
        };
        let st = self.shared.lock();
        st.objects
            .get(&(kind, namespace.to_string(), name.to_string()))
            .cloned()
    }

    /// The stored `VolumeHealth` `namespace/name`.
    pub fn volume_health(&self, namespace: &str, name: &str) -> Option<Value> {
        self.object("VolumeHealth", Some(namespace), name)
    }

    /// The labels of the stored PVC `namespace/name` (empty if it has none; `None`
    /// if there is no such PVC).
    pub fn pvc_labels(&self, namespace: &str, name: &str) -> Option<BTreeMap<String, String>> {
        let pvc = self.object("PersistentVolumeClaim", Some(namespace), name)?;
        let labels = pvc["metadata"]["labels"]
            .as_object()
            .cloned()
            .unwrap_or_default();
        Some(
            labels
                .into_iter()
                .map(|(k, v)| (k, v.as_str().unwrap_or_default().to_string()))
                .collect(),
        )
    }

    /// A kube client of this server, built from the kubeconfig written to `dir`
    /// as the agent builds its own. `retry`: kube's default retry of 429/503/504.
    pub async fn kube_client(&self, dir: &Path, retry: bool) -> Result<kube::Client> {
        let path = self.write_kubeconfig(dir)?;
        let kubeconfig =
            kube::config::Kubeconfig::read_from(&path).context("reading the written kubeconfig")?;
        let mut config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .context("kube config from the written kubeconfig")?;
        config.default_retry = retry;
        kube::Client::try_from(config).context("kube client")
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// How many requests arrived so far.
    pub fn request_count(&self) -> usize {
        self.shared.lock().requests.len()
    }

    /// The requests after the first `skip`, in arrival order: for a caller
    /// polling for new ones, without copying all the earlier ones each time.
    pub fn requests_since(&self, skip: usize) -> Vec<Recorded> {
        let st = self.shared.lock();
        st.requests.get(skip..).unwrap_or_default().to_vec()
    }

    /// The stored core/v1 Events (after create and patch), sorted by (namespace, name).
    pub fn events(&self) -> Vec<Value> {
        self.shared.lock().events.values().cloned().collect()
    }

    /// Switches how the server answers; see [`Mode`]. Takes effect for the next
    /// request, and ends open watches (and, for `Refuse`, closes connections) at once.
    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    /// The current [`Mode`].
    pub fn mode(&self) -> Mode {
        *self.shared.mode.borrow()
    }

    /// Calls `f` every 20 ms until it returns `Some`, for at most `timeout`.
    /// The error on timeout lists the last requests, usually the quickest clue.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        mut f: impl FnMut(&FakeApiServer) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(v) = f(self) {
                return Ok(v);
            }
            if Instant::now() >= deadline {
                let requests = self.requests();
                let last: Vec<String> = requests
                    .iter()
                    .rev()
                    .take(8)
                    .rev()
                    .map(|r| format!("  {} {}", r.status, request_line(r)))
                    .collect();
                bail!(
                    "fake apiserver: condition not met within {timeout:?} ({} requests so far; the last ones:\n{})",
                    requests.len(),
                    last.join("\n")
                );
            }
            std::thread::sleep(POLL_INTERVAL);
        }
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("url", &self.url())
            .field("mode", &self.mode())
            .finish_non_exhaustive()
    }
}

/// `GET /api/v1/pods?fieldSelector=...` for messages.
fn request_line(r: &Recorded) -> String {
    let query: Vec<String> = r.query.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if query.is_empty() {
        format!("{} {}", r.method, r.path)
    } else {
        format!("{} {}?{}", r.method, r.path, query.join("&"))
    }
}
