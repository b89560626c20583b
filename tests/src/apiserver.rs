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

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context as TaskContext, Poll};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::sync::{mpsc, oneshot, watch};

use crate::protocol::mono_ns;

/// Changes to pods and PVs kept for resuming watches. Watches from a version older
/// than the oldest kept change get 410 Gone, as from a compacted etcd.
const HISTORY_LIMIT: usize = 1000;

/// Paginated list snapshots kept for `continue` tokens; older tokens get 410.
const PAGE_SNAPSHOT_LIMIT: usize = 64;

/// A watch without `timeoutSeconds` (kube-rs always sends one) ends after this, the
/// real server's default `--min-request-timeout`.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Lines buffered per watch before the sender waits for the client to read.
const WATCH_BUFFER: usize = 256;

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
    /// CLOCK_MONOTONIC ns when the request head arrived.
    pub at_mono_ns: u64,
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
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("fake apiserver: binding 127.0.0.1:0")?;
        listener
            .set_nonblocking(true)
            .context("fake apiserver: making the listener non-blocking")?;
        let addr = listener
            .local_addr()
            .context("fake apiserver: local address")?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("fake apiserver: building its tokio runtime")?;
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

    /// Creates or replaces a Pod or PersistentVolume (chosen by its `kind`), as a
    /// controller or the kubelet would, and tells matching watches (`ADDED` or
    /// `MODIFIED`; `DELETED` to a watch the object no longer matches).
    ///
    /// The server sets `apiVersion: v1`, a new `metadata.resourceVersion`, and keeps
    /// or assigns `metadata.uid` and `metadata.creationTimestamp`. A pod without a
    /// namespace goes to `default`; a PV's namespace is removed.
    ///
    /// # Panics
    /// If `kind` is neither `Pod` nor `PersistentVolume` or `metadata.name` is
    /// missing: a bug in the test, reported where it is made.
    pub fn put(&self, obj: Value) {
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .and_then(Kind::from_kind)
            .unwrap_or_else(|| {
                panic!(
                    "FakeApiServer::put: `kind` must be \"Pod\" or \"PersistentVolume\", got {}",
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

    /// Deletes a Pod or PersistentVolume (`kind` as in the object: `Pod`,
    /// `PersistentVolume`) and sends `DELETED` to the watches it matched. Returns
    /// whether it existed. `namespace` is ignored for PVs; `None` means `default`
    /// for pods.
    ///
    /// # Panics
    /// If `kind` is not one of the two.
    pub fn delete(&self, kind: &str, namespace: Option<&str>, name: &str) -> bool {
        let Some(kind) = Kind::from_kind(kind) else {
            panic!(
                "FakeApiServer::delete: kind must be \"Pod\" or \"PersistentVolume\", got {kind:?}"
            );
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

    /// The stored Pod or PersistentVolume, as the server would return it.
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

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
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

// ---------------------------------------------------------------------------------
// State

/// What the server thread and the test thread share.
struct Shared {
    state: Mutex<State>,
    /// The resourceVersion of the latest change (or compaction); watch tasks wait on
    /// it and then read the history under the lock.
    changes: watch::Sender<u64>,
    mode: watch::Sender<Mode>,
}

impl Shared {
    /// The state, even after a panic elsewhere poisoned the lock: the server keeps
    /// answering so the failing test reports its own error, not a cascade.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The two watched kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Pod,
    PersistentVolume,
}

impl Kind {
    fn from_kind(kind: &str) -> Option<Kind> {
        match kind {
            "Pod" => Some(Kind::Pod),
            "PersistentVolume" => Some(Kind::PersistentVolume),
            _ => None,
        }
    }

    fn kind(self) -> &'static str {
        match self {
            Kind::Pod => "Pod",
            Kind::PersistentVolume => "PersistentVolume",
        }
    }

    fn list_kind(self) -> &'static str {
        match self {
            Kind::Pod => "PodList",
            Kind::PersistentVolume => "PersistentVolumeList",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Kind::Pod => "pods",
            Kind::PersistentVolume => "persistentvolumes",
        }
    }

    fn namespaced(self) -> bool {
        self == Kind::Pod
    }
}

/// (kind, namespace or "" for cluster-scoped, name)
type ObjKey = (Kind, String, String);

/// One put or delete, for watches.
struct Change {
    rv: u64,
    kind: Kind,
    /// The object before (None: created).
    before: Option<Value>,
    /// The object after (None: deleted).
    after: Option<Value>,
}

/// The rest of a paginated list, served by `continue`.
struct PageSnapshot {
    token: String,
    rv: u64,
    kind: Kind,
    items: Vec<Value>,
}

#[derive(Default)]
struct State {
    /// The one resourceVersion counter for everything, as etcd's revision.
    rv: u64,
    /// Counter for uids, generated names and continue tokens.
    serial: u64,
    objects: BTreeMap<ObjKey, Value>,
    history: VecDeque<Change>,
    /// Changes up to this version are gone from `history`.
    compacted_rv: u64,
    /// Events by (namespace, name).
    events: BTreeMap<(String, String), Value>,
    requests: Vec<Recorded>,
    pages: VecDeque<PageSnapshot>,
}

impl State {
    fn next_serial(&mut self) -> u64 {
        self.serial += 1;
        self.serial
    }

    fn new_uid(&mut self) -> String {
        format!("00000000-fa4e-4000-8000-{:012x}", self.next_serial())
    }

    fn put_object(&mut self, kind: Kind, mut obj: Value) {
        self.rv += 1;
        let rv = self.rv;
        let namespace = if kind.namespaced() {
            let ns = namespace_of(&obj);
            if ns.is_empty() {
                "default".to_string()
            } else {
                ns.to_string()
            }
        } else {
            String::new()
        };
        let key = (kind, namespace.clone(), name_of(&obj).to_string());
        let before = self.objects.get(&key).cloned();
        let uid = before
            .as_ref()
            .and_then(|b| meta_str(b, "uid"))
            .map(str::to_string);
        let created = before
            .as_ref()
            .and_then(|b| meta_str(b, "creationTimestamp"))
            .map(str::to_string);
        let uid = match uid {
            Some(uid) => uid,
            None => self.new_uid(),
        };
        if let Some(o) = obj.as_object_mut() {
            o.insert("apiVersion".into(), "v1".into());
        }
        if kind.namespaced() {
            meta_mut(&mut obj)["namespace"] = namespace.into();
        } else {
            meta_remove(&mut obj, "namespace");
        }
        let meta = meta_mut(&mut obj);
        meta["resourceVersion"] = rv.to_string().into();
        if meta.get("uid").is_none() {
            meta["uid"] = uid.into();
        }
        if meta.get("creationTimestamp").is_none() {
            meta["creationTimestamp"] = created.unwrap_or_else(now_rfc3339).into();
        }
        self.objects.insert(key, obj.clone());
        self.record_change(Change {
            rv,
            kind,
            before,
            after: Some(obj),
        });
    }

    fn delete_object(&mut self, kind: Kind, namespace: &str, name: &str) -> bool {
        let key = (kind, namespace.to_string(), name.to_string());
        let Some(before) = self.objects.remove(&key) else {
            return false;
        };
        self.rv += 1;
        self.record_change(Change {
            rv: self.rv,
            kind,
            before: Some(before),
            after: None,
        });
        true
    }

    fn record_change(&mut self, change: Change) {
        self.history.push_back(change);
        while self.history.len() > HISTORY_LIMIT {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
    }

    /// Watch lines for the changes after `cursor` that concern `spec`, and the
    /// version they bring the watch to; Err(the 410 ERROR line) if some are gone.
    fn drain(&self, spec: &WatchSpec, cursor: u64) -> Result<(Vec<Bytes>, u64), Bytes> {
        if cursor < self.compacted_rv {
            return Err(too_old_line(cursor, self.compacted_rv));
        }
        let lines = self
            .history
            .iter()
            .filter(|c| c.rv > cursor && c.kind == spec.kind)
            .filter_map(|c| spec.event_for(c))
            .collect();
        Ok((lines, self.rv.max(cursor)))
    }

    /// The objects of `spec` as they are now, sorted by (namespace, name).
    fn current(&self, spec: &WatchSpec) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|((kind, _, _), obj)| *kind == spec.kind && spec.matches(obj))
            .map(|(_, obj)| obj.clone())
            .collect()
    }
}

// ---------------------------------------------------------------------------------
// Selection

/// A field a selector may test: the ones the real server indexes for these kinds
/// that the agent could use. Others are refused, as the real server refuses them.
#[derive(Clone, Copy, Debug)]
enum Field {
    Name,
    Namespace,
    NodeName,
}

#[derive(Clone, Debug)]
struct Term {
    field: Field,
    negate: bool,
    value: String,
}

/// What a list or watch selects: kind, namespace (None: all) and field terms (all
/// must hold).
#[derive(Clone, Debug)]
struct WatchSpec {
    kind: Kind,
    namespace: Option<String>,
    terms: Vec<Term>,
}

impl WatchSpec {
    /// From the request's namespace and `fieldSelector`/`labelSelector`; Err is the
    /// 400 message.
    fn parse(
        kind: Kind,
        namespace: Option<&str>,
        query: &[(String, String)],
    ) -> Result<Self, String> {
        if let Some(labels) = param(query, "labelSelector").filter(|s| !s.trim().is_empty()) {
            return Err(format!(
                "labelSelector {labels:?} is not supported by the fake apiserver (only fieldSelector)"
            ));
        }
        let mut terms = Vec::new();
        for term in param(query, "fieldSelector").unwrap_or("").split(',') {
            let term = term.trim();
            if term.is_empty() {
                continue;
            }
            let (field, negate, value) = if let Some((f, v)) = term.split_once("!=") {
                (f, true, v)
            } else if let Some((f, v)) = term.split_once("==") {
                (f, false, v)
            } else if let Some((f, v)) = term.split_once('=') {
                (f, false, v)
            } else {
                return Err(format!(
                    "invalid selector: '{term}'; can't understand '{term}'"
                ));
            };
            let field = match (field.trim(), kind) {
                ("metadata.name", _) => Field::Name,
                ("metadata.namespace", _) => Field::Namespace,
                ("spec.nodeName", Kind::Pod) => Field::NodeName,
                (other, _) => return Err(format!("field label not supported: {other}")),
            };
            terms.push(Term {
                field,
                negate,
                value: value.trim().to_string(),
            });
        }
        Ok(WatchSpec {
            kind,
            namespace: namespace.map(str::to_string),
            terms,
        })
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace {
            if namespace_of(obj) != ns {
                return false;
            }
        }
        self.terms.iter().all(|t| {
            let actual = match t.field {
                Field::Name => name_of(obj),
                Field::Namespace => namespace_of(obj),
                // An unscheduled pod has nodeName "" for selectors.
                Field::NodeName => obj
                    .get("spec")
                    .and_then(|s| s.get("nodeName"))
                    .and_then(Value::as_str)
                    .unwrap_or(""),
            };
            (actual == t.value) != t.negate
        })
    }

    /// The watch event a change means for this selection, if any: an object that
    /// starts matching is ADDED, one that stops is DELETED with its previous content
    /// at the change's version (as the real watch cache does).
    fn event_for(&self, change: &Change) -> Option<Bytes> {
        let before = change.before.as_ref().filter(|o| self.matches(o));
        let after = change.after.as_ref().filter(|o| self.matches(o));
        match (before, after) {
            (Some(_), Some(obj)) => Some(watch_line("MODIFIED", obj)),
            (None, Some(obj)) => Some(watch_line("ADDED", obj)),
            (Some(obj), None) => {
                let mut obj = obj.clone();
                meta_mut(&mut obj)["resourceVersion"] = change.rv.to_string().into();
                Some(watch_line("DELETED", &obj))
            }
            (None, None) => None,
        }
    }
}

// ---------------------------------------------------------------------------------
// HTTP

/// Response bodies: a whole JSON document or a watch stream.
type Body = BoxBody<Bytes, Infallible>;

/// The service's error when the request meets [`Mode::Refuse`]: hyper then closes
/// the connection without writing a response.
#[derive(Debug)]
struct Refused;

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("fake apiserver in Mode::Refuse: connection closed without a response")
    }
}

impl std::error::Error for Refused {}

/// A watch body: the lines a watch task sends, ended when the task drops its sender.
struct WatchBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for WatchBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut TaskContext<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0
            .poll_recv(cx)
            .map(|line| line.map(|l| Ok(Frame::data(l))))
    }
}

/// What a handler decided.
enum Reply {
    Json(StatusCode, Value),
    Watch(mpsc::Receiver<Bytes>),
}

async fn accept_loop(
    shared: Arc<Shared>,
    listener: tokio::net::TcpListener,
    mut shutdown: oneshot::Receiver<()>,
) {
    loop {
        let accepted = tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: transient, keep serving.
                eprintln!("fake apiserver: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        if *shared.mode.borrow() == Mode::Refuse {
            drop(stream);
            continue;
        }
        let _ = stream.set_nodelay(true);
        tokio::spawn(serve_connection(shared.clone(), stream));
    }
}

/// Serves one connection until it ends or the mode becomes [`Mode::Refuse`], which
/// drops it (closing the socket, whatever it was doing).
async fn serve_connection(shared: Arc<Shared>, stream: tokio::net::TcpStream) {
    let svc_shared = shared.clone();
    let service = hyper::service::service_fn(move |req| handle(svc_shared.clone(), req));
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let mut mode = shared.mode.subscribe();
    loop {
        tokio::select! {
            // Errors here are clients going away or Refused: nothing to report.
            _ = &mut conn => return,
            changed = mode.changed() => {
                if changed.is_err() || *mode.borrow_and_update() == Mode::Refuse {
                    return;
                }
            }
        }
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Refused> {
    let at_mono_ns = mono_ns();
    let (parts, body) = req.into_parts();
    let header = |name| {
        parts
            .headers
            .get(name)
            .and_then(|v: &HeaderValue| v.to_str().ok())
            .map(str::to_string)
    };
    let record = Recorded {
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        query: parse_query(parts.uri.query().unwrap_or("")),
        content_type: header(CONTENT_TYPE),
        authorization: header(AUTHORIZATION),
        body: None,
        at_mono_ns,
        status: 0,
    };
    // Recorded before the body is read, so the order is that of the heads.
    let index = {
        let mut st = shared.lock();
        st.requests.push(record.clone());
        st.requests.len() - 1
    };
    if *shared.mode.borrow() == Mode::Refuse {
        return Err(Refused);
    }
    let bytes = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        // The client went away mid-body: nobody to answer.
        Err(_) => return Err(Refused),
    };
    let json_body = if bytes.is_empty() {
        None
    } else {
        serde_json::from_slice::<Value>(&bytes).ok()
    };
    if let Some(r) = shared.lock().requests.get_mut(index) {
        r.body = json_body.clone();
    }

    // Copied out: a `borrow()` guard in the scrutinee would be held through routing.
    let mode = *shared.mode.borrow();
    let reply = match mode {
        Mode::Refuse => return Err(Refused),
        Mode::Unavailable => Reply::Json(
            StatusCode::SERVICE_UNAVAILABLE,
            status_json(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the fake apiserver is unavailable (Mode::Unavailable)",
                None,
            ),
        ),
        Mode::Up => route(&shared, &parts.method, &record, &bytes, json_body),
    };

    let (status, body) = match reply {
        Reply::Json(status, value) => (status, Full::new(Bytes::from(value.to_string())).boxed()),
        Reply::Watch(rx) => (StatusCode::OK, WatchBody(rx).boxed()),
    };
    if let Some(r) = shared.lock().requests.get_mut(index) {
        r.status = status.as_u16();
    }
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(response)
}

/// The API paths the agent uses (and a few neighbours that cost nothing).
fn route(
    shared: &Arc<Shared>,
    method: &Method,
    req: &Recorded,
    raw: &[u8],
    body: Option<Value>,
) -> Reply {
    let segments: Vec<&str> = req.path.trim_matches('/').split('/').collect();
    let get = method == Method::GET;
    match segments.as_slice() {
        ["version"] if get => Reply::Json(StatusCode::OK, version_json()),
        ["api", "v1", "pods"] if get => collection(shared, Kind::Pod, None, &req.query),
        ["api", "v1", "namespaces", ns, "pods"] if get => {
            collection(shared, Kind::Pod, Some(ns), &req.query)
        }
        ["api", "v1", "namespaces", ns, "pods", name] if get => {
            get_object(shared, Kind::Pod, ns, name)
        }
        ["api", "v1", "persistentvolumes"] if get => {
            collection(shared, Kind::PersistentVolume, None, &req.query)
        }
        ["api", "v1", "persistentvolumes", name] if get => {
            get_object(shared, Kind::PersistentVolume, "", name)
        }
        ["api", "v1", "events"] if get => list_events(shared, None),
        ["api", "v1", "namespaces", ns, "events"] if get => list_events(shared, Some(ns)),
        ["api", "v1", "namespaces", ns, "events"] if method == Method::POST => {
            create_event(shared, ns, &req.query, raw, body)
        }
        ["api", "v1", "namespaces", ns, "events", name] if get => get_event(shared, ns, name),
        ["api", "v1", "namespaces", ns, "events", name] if method == Method::PATCH => {
            patch_event(shared, ns, name, req, body)
        }
        ["version"]
        | ["api", "v1", "pods"]
        | ["api", "v1", "namespaces", _, "pods" | "events"]
        | ["api", "v1", "namespaces", _, "pods" | "events", _]
        | ["api", "v1", "persistentvolumes"]
        | ["api", "v1", "persistentvolumes", _]
        | ["api", "v1", "events"] => error(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!(
                "the server does not allow this method on the requested resource ({method} {} on the fake apiserver)",
                req.path
            ),
            None,
        ),
        _ => error(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the server could not find the requested resource ({} is not served by the fake apiserver)",
                req.path
            ),
            None,
        ),
    }
}

/// List or watch of pods or PVs.
fn collection(
    shared: &Arc<Shared>,
    kind: Kind,
    namespace: Option<&str>,
    query: &[(String, String)],
) -> Reply {
    let spec = match WatchSpec::parse(kind, namespace, query) {
        Ok(spec) => spec,
        Err(message) => return error(StatusCode::BAD_REQUEST, "BadRequest", message, None),
    };
    if is_watch(query) {
        start_watch(shared, spec, query)
    } else {
        list(&mut shared.lock(), spec, query)
    }
}

/// A list, paginated over a snapshot when `limit` is given (kube-rs's watcher sends
/// `limit=500`), so `continue` pages are consistent with the first.
fn list(st: &mut State, spec: WatchSpec, query: &[(String, String)]) -> Reply {
    let limit = match param(query, "limit").map(str::parse::<usize>) {
        None => 0,
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("invalid limit {:?}", param(query, "limit").unwrap_or("")),
                None,
            )
        }
    };
    let (rv, mut items) = match param(query, "continue").filter(|c| !c.is_empty()) {
        Some(token) => {
            let Some(pos) = st
                .pages
                .iter()
                .position(|p| p.token == token && p.kind == spec.kind)
            else {
                return error(
                    StatusCode::GONE,
                    "Expired",
                    format!(
                        "The provided continue parameter is too old to display a consistent list result ({token:?} is unknown to the fake apiserver). You can start a new list without the continue parameter."
                    ),
                    None,
                );
            };
            match st.pages.remove(pos) {
                Some(page) => (page.rv, page.items),
                None => (st.rv, Vec::new()),
            }
        }
        None => {
            if param(query, "resourceVersionMatch") == Some("Exact") {
                let asked = param(query, "resourceVersion").unwrap_or("");
                if asked != st.rv.to_string() {
                    return error(
                        StatusCode::GONE,
                        "Expired",
                        format!(
                            "too old resource version: {asked} ({}); the fake apiserver serves only the current version exactly",
                            st.rv
                        ),
                        None,
                    );
                }
            }
            (st.rv, st.current(&spec))
        }
    };
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), rv.to_string().into());
    if limit > 0 && items.len() > limit {
        let rest = items.split_off(limit);
        let token = format!("fake-continue-{}", st.next_serial());
        metadata.insert("continue".into(), token.clone().into());
        metadata.insert("remainingItemCount".into(), rest.len().into());
        st.pages.push_back(PageSnapshot {
            token,
            rv,
            kind: spec.kind,
            items: rest,
        });
        while st.pages.len() > PAGE_SNAPSHOT_LIMIT {
            st.pages.pop_front();
        }
    }
    Reply::Json(
        StatusCode::OK,
        list_json(spec.kind.list_kind(), metadata, items),
    )
}

/// Starts a watch: decides where it starts under the lock, then hands the rest to a
/// task that streams lines into the response body.
fn start_watch(shared: &Arc<Shared>, spec: WatchSpec, query: &[(String, String)]) -> Reply {
    let timeout = match param(query, "timeoutSeconds").map(str::parse::<u64>) {
        // 0 means "the server's default", as on the real server.
        None | Some(Ok(0)) => DEFAULT_WATCH_TIMEOUT,
        Some(Ok(secs)) => Duration::from_secs(secs),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!(
                    "invalid timeoutSeconds {:?}",
                    param(query, "timeoutSeconds").unwrap_or("")
                ),
                None,
            )
        }
    };
    let bookmarks = param(query, "allowWatchBookmarks") == Some("true");
    let send_initial = param(query, "sendInitialEvents") == Some("true");
    if send_initial && (!bookmarks || param(query, "resourceVersionMatch") != Some("NotOlderThan"))
    {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "sendInitialEvents=true requires allowWatchBookmarks=true and resourceVersionMatch=NotOlderThan"
                .to_string(),
            None,
        );
    }
    let resource_version = param(query, "resourceVersion").unwrap_or("");

    let mut initial = Vec::new();
    let cursor = {
        let st = shared.lock();
        if send_initial || resource_version.is_empty() || resource_version == "0" {
            // The current state as synthetic ADDED events, then changes.
            initial.extend(st.current(&spec).iter().map(|o| watch_line("ADDED", o)));
            if send_initial {
                initial.push(bookmark_line(spec.kind, st.rv, true));
            }
            st.rv
        } else {
            match resource_version.parse::<u64>() {
                Ok(rv) => rv,
                Err(_) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "BadRequest",
                        format!("invalid resource version: {resource_version:?}"),
                        None,
                    )
                }
            }
        }
    };
    let (tx, rx) = mpsc::channel(WATCH_BUFFER);
    tokio::spawn(run_watch(
        shared.clone(),
        WatchTask {
            spec,
            cursor,
            initial,
            timeout,
            bookmarks,
        },
        tx,
    ));
    Reply::Watch(rx)
}

struct WatchTask {
    spec: WatchSpec,
    /// The version the client has seen everything up to.
    cursor: u64,
    initial: Vec<Bytes>,
    timeout: Duration,
    bookmarks: bool,
}

/// Streams a watch until its timeout (then a last BOOKMARK, so the client resumes
/// from the newest version even if nothing it selects changed), the client leaving,
/// a history gap (410 ERROR event), or a mode other than [`Mode::Up`].
async fn run_watch(shared: Arc<Shared>, task: WatchTask, tx: mpsc::Sender<Bytes>) {
    let mut changes = shared.changes.subscribe();
    let mut mode = shared.mode.subscribe();
    for line in task.initial {
        if tx.send(line).await.is_err() {
            return;
        }
    }
    let deadline = tokio::time::sleep(task.timeout);
    tokio::pin!(deadline);
    let mut cursor = task.cursor;
    let mut ending = false;
    loop {
        if *mode.borrow_and_update() != Mode::Up {
            return;
        }
        let drained = shared.lock().drain(&task.spec, cursor);
        match drained {
            Ok((lines, reached)) => {
                cursor = reached;
                for line in lines {
                    if tx.send(line).await.is_err() {
                        return;
                    }
                }
            }
            Err(gone) => {
                let _ = tx.send(gone).await;
                return;
            }
        }
        if ending {
            if task.bookmarks {
                let _ = tx.send(bookmark_line(task.spec.kind, cursor, false)).await;
            }
            return;
        }
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = &mut deadline => ending = true,
            () = tx.closed() => return,
        }
    }
}

fn get_object(shared: &Arc<Shared>, kind: Kind, namespace: &str, name: &str) -> Reply {
    let st = shared.lock();
    match st
        .objects
        .get(&(kind, namespace.to_string(), name.to_string()))
    {
        Some(obj) => Reply::Json(StatusCode::OK, obj.clone()),
        None => not_found(kind.plural(), name),
    }
}

fn list_events(shared: &Arc<Shared>, namespace: Option<&str>) -> Reply {
    let st = shared.lock();
    let items = st
        .events
        .iter()
        .filter(|((ns, _), _)| namespace.is_none_or(|want| ns == want))
        .map(|(_, e)| e.clone())
        .collect();
    let mut metadata = Map::new();
    metadata.insert("resourceVersion".into(), st.rv.to_string().into());
    Reply::Json(StatusCode::OK, list_json("EventList", metadata, items))
}

fn get_event(shared: &Arc<Shared>, namespace: &str, name: &str) -> Reply {
    match shared
        .lock()
        .events
        .get(&(namespace.to_string(), name.to_string()))
    {
        Some(event) => Reply::Json(StatusCode::OK, event.clone()),
        None => not_found("events", name),
    }
}

/// `POST /api/v1/namespaces/{ns}/events`, with the real server's checks that matter
/// to an event writer: a name (or generateName), the namespace agreeing with the path
/// and with `involvedObject.namespace`, no resourceVersion, no duplicate name.
fn create_event(
    shared: &Arc<Shared>,
    namespace: &str,
    query: &[(String, String)],
    raw: &[u8],
    body: Option<Value>,
) -> Reply {
    let Some(mut event) = body.filter(Value::is_object) else {
        return bad_body(raw);
    };
    if let Some(kind) = event.get("kind").and_then(Value::as_str) {
        if kind != "Event" {
            return error(
                StatusCode::BAD_REQUEST,
                "BadRequest",
                format!("the body is a {kind:?}, not an Event"),
                None,
            );
        }
    }
    let body_ns = namespace_of(&event);
    if !body_ns.is_empty() && body_ns != namespace {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!(
                "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({namespace})"
            ),
            None,
        );
    }
    if meta_str(&event, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
        return error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            "resourceVersion should not be set on objects to be created".to_string(),
            None,
        );
    }
    let mut st = shared.lock();
    let mut name = name_of(&event).to_string();
    if name.is_empty() {
        let prefix = meta_str(&event, "generateName").unwrap_or("").to_string();
        if prefix.is_empty() {
            return invalid(
                "",
                "metadata.name: Required value: name or generateName is required".to_string(),
            );
        }
        name = format!("{prefix}{}", generated_suffix(st.next_serial()));
    }
    if let Some(reply) = validate_event(&event, namespace, &name) {
        return reply;
    }
    if st
        .events
        .contains_key(&(namespace.to_string(), name.clone()))
    {
        return error(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("events {name:?} already exists"),
            Some(json!({"name": name, "kind": "events"})),
        );
    }
    let uid = st.new_uid();
    let rv = st.rv + 1;
    if let Some(o) = event.as_object_mut() {
        o.insert("kind".into(), "Event".into());
        o.insert("apiVersion".into(), "v1".into());
    }
    let meta = meta_mut(&mut event);
    meta["name"] = name.clone().into();
    meta["namespace"] = namespace.into();
    meta["uid"] = uid.into();
    meta["resourceVersion"] = rv.to_string().into();
    meta["creationTimestamp"] = now_rfc3339().into();
    if !dry_run(query) {
        st.rv = rv;
        st.events
            .insert((namespace.to_string(), name), event.clone());
    }
    Reply::Json(StatusCode::CREATED, event)
}

/// `PATCH /api/v1/namespaces/{ns}/events/{name}`: both merge-patch content types are
/// applied as an RFC 7386 merge patch (for an Event's fields strategic merge is the
/// same, as none of them is a list with a merge key). A `metadata.resourceVersion` in
/// the patch is a precondition, as on the real server.
fn patch_event(
    shared: &Arc<Shared>,
    namespace: &str,
    name: &str,
    req: &Recorded,
    body: Option<Value>,
) -> Reply {
    let content_type = req
        .content_type
        .as_deref()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if content_type != "application/merge-patch+json"
        && content_type != "application/strategic-merge-patch+json"
    {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/merge-patch+json, application/strategic-merge-patch+json (the fake apiserver does not do {content_type:?})"
            ),
            None,
        );
    }
    let Some(patch) = body.filter(Value::is_object) else {
        return error(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "the patch is not a JSON object".to_string(),
            None,
        );
    };
    let mut st = shared.lock();
    let key = (namespace.to_string(), name.to_string());
    let Some(current) = st.events.get(&key) else {
        return not_found("events", name);
    };
    let current_rv = meta_str(current, "resourceVersion")
        .unwrap_or("")
        .to_string();
    if let Some(want) = meta_str(&patch, "resourceVersion") {
        if want != current_rv {
            return error(
                StatusCode::CONFLICT,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on events {name:?}: the object has been modified; please apply your changes to the latest version and try again (patch has resourceVersion {want}, stored {current_rv})"
                ),
                Some(json!({"name": name, "kind": "events"})),
            );
        }
    }
    let mut patched = current.clone();
    merge_patch(&mut patched, &patch);
    // What a patch may not change.
    for field in ["name", "namespace", "uid", "creationTimestamp"] {
        match current.get("metadata").and_then(|m| m.get(field)) {
            Some(v) => meta_mut(&mut patched)[field] = v.clone(),
            None => meta_remove(&mut patched, field),
        }
    }
    if let Some(o) = patched.as_object_mut() {
        o.insert("kind".into(), "Event".into());
        o.insert("apiVersion".into(), "v1".into());
    }
    if let Some(reply) = validate_event(&patched, namespace, name) {
        return reply;
    }
    let rv = st.rv + 1;
    meta_mut(&mut patched)["resourceVersion"] = rv.to_string().into();
    if !dry_run(&req.query) {
        st.rv = rv;
        st.events.insert(key, patched.clone());
    }
    Reply::Json(StatusCode::OK, patched)
}

/// The real server's rule for core/v1 Events: the event lives in its involved
/// object's namespace, and one about a cluster-scoped object (a PV, a node) in
/// `default`.
fn validate_event(event: &Value, namespace: &str, name: &str) -> Option<Reply> {
    let involved_ns = event
        .get("involvedObject")
        .and_then(|o| o.get("namespace"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let ok = if involved_ns.is_empty() {
        namespace.is_empty() || namespace == "default"
    } else {
        involved_ns == namespace
    };
    if ok {
        None
    } else {
        Some(invalid(
            name,
            format!(
                "involvedObject.namespace: Invalid value: {involved_ns:?}: does not match event.namespace ({namespace:?})"
            ),
        ))
    }
}

/// RFC 7386 JSON merge patch: objects merge recursively, `null` removes, anything
/// else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    if let Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(key);
            } else {
                merge_patch(target.entry(key.clone()).or_insert(Value::Null), value);
            }
        }
    }
}

// ---------------------------------------------------------------------------------
// JSON helpers

fn name_of(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

fn namespace_of(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

/// `obj.metadata`, made an object (and `obj` too) if it was not, so indexing it
/// with a string never panics.
fn meta_mut(obj: &mut Value) -> &mut Value {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    // Indexing an object by a string inserts the key if missing.
    let meta = &mut obj["metadata"];
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta
}

/// Removes `obj.metadata.field`.
fn meta_remove(obj: &mut Value, field: &str) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove(field);
    }
}

/// A list body; items lose `kind`/`apiVersion`, as in a real server's lists.
fn list_json(kind: &str, metadata: Map<String, Value>, items: Vec<Value>) -> Value {
    let items: Vec<Value> = items
        .into_iter()
        .map(|mut item| {
            if let Some(o) = item.as_object_mut() {
                o.remove("kind");
                o.remove("apiVersion");
            }
            item
        })
        .collect();
    json!({"kind": kind, "apiVersion": "v1", "metadata": metadata, "items": items})
}

fn watch_line(kind: &str, obj: &Value) -> Bytes {
    line(&json!({"type": kind, "object": obj}))
}

/// A BOOKMARK: only kind, apiVersion and resourceVersion (what kube-rs parses), plus
/// the end-of-initial-events annotation for streaming lists.
fn bookmark_line(kind: Kind, rv: u64, initial_events_end: bool) -> Bytes {
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if initial_events_end {
        metadata["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    line(&json!({
        "type": "BOOKMARK",
        "object": {"kind": kind.kind(), "apiVersion": "v1", "metadata": metadata},
    }))
}

/// The 410 a watch from a compacted version gets: a 200 stream with one ERROR event,
/// as the real server does (kube-rs's watcher relists on it; an HTTP 410 instead would
/// make it retry the same watch forever).
fn too_old_line(asked: u64, compacted: u64) -> Bytes {
    line(&json!({
        "type": "ERROR",
        "object": status_json(
            StatusCode::GONE,
            "Expired",
            &format!("too old resource version: {asked} ({compacted})"),
            None,
        ),
    }))
}

fn line(value: &Value) -> Bytes {
    let mut text = value.to_string();
    text.push('\n');
    Bytes::from(text)
}

fn status_json(code: StatusCode, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut status = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    if let Some(details) = details {
        status["details"] = details;
    }
    status
}

fn error(code: StatusCode, reason: &str, message: String, details: Option<Value>) -> Reply {
    Reply::Json(code, status_json(code, reason, &message, details))
}

fn not_found(resource: &str, name: &str) -> Reply {
    error(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{resource} {name:?} not found"),
        Some(json!({"name": name, "kind": resource})),
    )
}

fn invalid(name: &str, cause: String) -> Reply {
    error(
        StatusCode::UNPROCESSABLE_ENTITY,
        "Invalid",
        format!("Event {name:?} is invalid: {cause}"),
        Some(json!({"name": name, "kind": "Event"})),
    )
}

fn bad_body(raw: &[u8]) -> Reply {
    let shown: String = String::from_utf8_lossy(raw).chars().take(200).collect();
    error(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        format!("the request body is not a JSON object: {shown:?}"),
        None,
    )
}

fn version_json() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": "v1.33.0-fake",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T00:00:00Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

fn dry_run(query: &[(String, String)]) -> bool {
    param(query, "dryRun").is_some_and(|v| !v.is_empty())
}

fn is_watch(query: &[(String, String)]) -> bool {
    matches!(param(query, "watch"), Some("true" | "1"))
}

fn param<'a>(query: &'a [(String, String)], key: &str) -> Option<&'a str> {
    query
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// `a=1&&b=x%3Dy` → [(a, 1), (b, x=y)], decoded as forms are (`+` is a space).
fn parse_query(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Five characters in the alphabet Kubernetes uses for generateName suffixes.
fn generated_suffix(mut n: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut out = String::with_capacity(5);
    // Spread consecutive serials apart so names do not look sequential.
    n = n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for _ in 0..5 {
        out.push(ALPHABET[(n % ALPHABET.len() as u64) as usize] as char);
        n /= ALPHABET.len() as u64;
    }
    out
}

/// Now in the second-precision RFC 3339 form of Kubernetes timestamps.
fn now_rfc3339() -> String {
    let format =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::now_utc()
        .format(format)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_is_split_and_decoded() {
        assert_eq!(
            parse_query("&fieldSelector=spec.nodeName%3Dnode-1&limit=500&x=a+b&flag"),
            vec![
                (
                    "fieldSelector".to_string(),
                    "spec.nodeName=node-1".to_string()
                ),
                ("limit".to_string(), "500".to_string()),
                ("x".to_string(), "a b".to_string()),
                ("flag".to_string(), String::new()),
            ]
        );
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }

    #[test]
    fn merge_patch_follows_rfc7386() {
        let mut target = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(
            &mut target,
            &json!({"a": "z", "c": {"f": null}, "l": [3], "n": {"x": 1}}),
        );
        assert_eq!(
            target,
            json!({"a": "z", "c": {"d": "e"}, "l": [3], "n": {"x": 1}})
        );
    }

    #[test]
    fn selector_terms() {
        let q = vec![(
            "fieldSelector".to_string(),
            "spec.nodeName=node-1".to_string(),
        )];
        let spec = WatchSpec::parse(Kind::Pod, None, &q).unwrap();
        assert!(spec.matches(&json!({"metadata": {"name": "a"}, "spec": {"nodeName": "node-1"}})));
        assert!(!spec.matches(&json!({"metadata": {"name": "a"}, "spec": {"nodeName": "node-2"}})));
        assert!(!spec.matches(&json!({"metadata": {"name": "a"}, "spec": {}})));
        let q = vec![(
            "fieldSelector".to_string(),
            "spec.nodeName!=,metadata.namespace==ns".to_string(),
        )];
        let spec = WatchSpec::parse(Kind::Pod, None, &q).unwrap();
        assert!(spec.matches(&json!({"metadata": {"namespace": "ns"}, "spec": {"nodeName": "x"}})));
        assert!(!spec.matches(&json!({"metadata": {"namespace": "ns"}, "spec": {}})));
        let q = vec![("fieldSelector".to_string(), "spec.nodeName=x".to_string())];
        let err = WatchSpec::parse(Kind::PersistentVolume, None, &q).unwrap_err();
        assert_eq!(err, "field label not supported: spec.nodeName");
    }

    #[test]
    fn generated_names_are_distinct() {
        let names: std::collections::BTreeSet<String> = (1..100).map(generated_suffix).collect();
        assert_eq!(names.len(), 99);
        assert!(names.iter().all(|n| n.len() == 5));
    }
}
