//! The agent's small HTTP endpoint: `/metrics` for Prometheus, `/healthz`
//! and `/readyz` for the kubelet's probes.
//!
//! Plain hyper on purpose: three fixed routes need no framework. Every
//! connection is served in its own task, so a slow client delays only
//! itself, and each is bounded in time (headers must arrive within
//! [`HEADER_READ_TIMEOUT`], the whole connection lives at most
//! [`CONNECTION_LIFETIME`]) and in number ([`MAX_CONNECTIONS`]), so clients
//! that never finish cannot pile up file descriptors in a node agent.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use http::header::{ALLOW, CONTENT_TYPE};
use http::{HeaderValue, Method, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// What `/metrics` answers with: the OpenMetrics text format, which is what
/// prometheus-client's encoder writes (`# EOF`, `_total` counters, units).
pub const METRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const TEXT_CONTENT_TYPE: &str = "text/plain; charset=utf-8";

/// A request's headers must be complete this long after the server starts
/// reading them; it also closes idle keep-alive connections.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest life of one connection, whatever it is doing: a client that sends
/// its request and then never reads the answer is dropped after this.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(60);

/// Connections served at once; further clients wait in the listen backlog.
/// Prometheus and the kubelet need a handful.
pub const MAX_CONNECTIONS: usize = 128;

/// How long to pause accepting when the process is out of descriptors or
/// memory, instead of spinning on the same error.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Liveness and readiness as the main loop reports them. Cheap to clone;
/// all clones share one state.
#[derive(Clone, Debug)]
pub struct Health(Arc<HealthState>);

#[derive(Debug)]
struct HealthState {
    epoch: Instant,
    /// Nanoseconds from `epoch` to the last [`Health::beat`].
    last_beat: AtomicU64,
    stale_after: Duration,
    /// `None`: ready; otherwise why not.
    not_ready: Mutex<Option<String>>,
}

impl Health {
    /// Alive (as if it had just beaten) and not ready ("starting").
    /// `/healthz` fails once no [`Health::beat`] came for `stale_after`:
    /// choose it well above the main loop's longest regular iteration, so
    /// only a loop that is really stuck gets the agent restarted.
    pub fn new(stale_after: Duration) -> Self {
        Health(Arc::new(HealthState {
            epoch: Instant::now(),
            last_beat: AtomicU64::new(0),
            stale_after,
            not_ready: Mutex::new(Some("starting".to_string())),
        }))
    }

    /// The main loop is alive; call it on every iteration.
    pub fn beat(&self) {
        let nanos = u64::try_from(self.0.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.0.last_beat.store(nanos, Ordering::Relaxed);
    }

    /// Ready, or not ready without a particular reason.
    pub fn set_ready(&self, ready: bool) {
        *self.not_ready() = (!ready).then(|| "not ready".to_string());
    }

    /// Not ready, and why (shown by `/readyz`).
    pub fn set_not_ready(&self, reason: String) {
        *self.not_ready() = Some(reason);
    }

    /// `Err` with a message when the main loop has not beaten for longer
    /// than the staleness limit.
    pub fn liveness(&self) -> Result<(), String> {
        let last = Duration::from_nanos(self.0.last_beat.load(Ordering::Relaxed));
        let age = self.0.epoch.elapsed().saturating_sub(last);
        if age > self.0.stale_after {
            Err(format!(
                "main loop stalled: last beat {} ms ago (limit {} ms)",
                age.as_millis(),
                self.0.stale_after.as_millis()
            ))
        } else {
            Ok(())
        }
    }

    /// `Err` with the reason while not ready.
    pub fn readiness(&self) -> Result<(), String> {
        match &*self.not_ready() {
            None => Ok(()),
            Some(reason) => Err(reason.clone()),
        }
    }

    fn not_ready(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        // Only whole values are ever stored: a poisoned lock holds a valid one.
        self.0
            .not_ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What `/metrics` serves: the node agent's metrics, or the controller's.
pub trait Exposition: Send + Sync + 'static {
    /// The whole exposition in the OpenMetrics text format.
    fn try_encode(&self) -> Result<String, std::fmt::Error>;

    /// Called before each encoding with the probes' state, for expositions
    /// that export it; the default exports nothing.
    fn observe_health(&self, _health: &Health) {}
}

/// Binds the endpoint's address, saying which one failed.
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} for /metrics, /healthz and /readyz"))
}

/// Serves `/metrics`, `/healthz` and `/readyz` on `listener` until the task
/// is dropped. Returns only when accepting fails for a reason other than a
/// client or a passing shortage (descriptors, memory).
pub async fn serve(
    listener: TcpListener,
    metrics: Arc<dyn Exposition>,
    health: Health,
) -> io::Result<()> {
    serve_with(listener, metrics, health, Limits::default()).await
}

#[derive(Clone, Copy, Debug)]
struct Limits {
    header_read_timeout: Duration,
    connection_lifetime: Duration,
    max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_read_timeout: HEADER_READ_TIMEOUT,
            connection_lifetime: CONNECTION_LIFETIME,
            max_connections: MAX_CONNECTIONS,
        }
    }
}

async fn serve_with(
    listener: TcpListener,
    metrics: Arc<dyn Exposition>,
    health: Health,
    limits: Limits,
) -> io::Result<()> {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        // The semaphore is never closed; without it there is nothing to do.
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return Ok(());
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => match accept_error(&e) {
                AcceptError::Client => continue,
                AcceptError::Shortage => {
                    tracing::warn!(error = %e, "accepting on the metrics endpoint; retrying");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                    continue;
                }
                AcceptError::Fatal => return Err(e),
            },
        };
        let http = http.clone();
        let metrics = Arc::clone(&metrics);
        let health = health.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                let response = respond(req.method(), req.uri().path(), metrics.as_ref(), &health);
                async move { Ok::<_, Infallible>(response) }
            });
            let conn = http.serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.connection_lifetime, conn).await {
                Ok(Ok(())) => {}
                // Clients hanging up or timing out are routine.
                Ok(Err(e)) => tracing::debug!(%peer, error = %e, "metrics endpoint connection"),
                Err(_) => tracing::debug!(%peer, "metrics endpoint connection open too long"),
            }
        });
    }
}

enum AcceptError {
    /// About one client only (it hung up before we accepted).
    Client,
    /// The process or system is short of something for now.
    Shortage,
    /// The listener itself is unusable.
    Fatal,
}

fn accept_error(e: &io::Error) -> AcceptError {
    use io::ErrorKind::*;
    match e.kind() {
        ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | TimedOut => {
            AcceptError::Client
        }
        _ => match e.raw_os_error() {
            Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM) => {
                AcceptError::Shortage
            }
            // Errors the kernel passes on from the new socket (Linux accept(2)).
            Some(libc::EPROTO | libc::ENETDOWN | libc::ENOPROTOOPT | libc::EHOSTDOWN)
            | Some(libc::ENONET | libc::EHOSTUNREACH | libc::EOPNOTSUPP | libc::ENETUNREACH) => {
                AcceptError::Client
            }
            _ => AcceptError::Fatal,
        },
    }
}

#[derive(Clone, Copy)]
enum Route {
    Metrics,
    Healthz,
    Readyz,
}

fn respond(
    method: &Method,
    path: &str,
    metrics: &dyn Exposition,
    health: &Health,
) -> Response<Full<Bytes>> {
    let route = match path {
        "/metrics" => Route::Metrics,
        "/healthz" => Route::Healthz,
        "/readyz" => Route::Readyz,
        _ => return text(StatusCode::NOT_FOUND, "not found".to_string()),
    };
    if method != Method::GET {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            "method not allowed".to_string(),
        );
        r.headers_mut()
            .insert(ALLOW, HeaderValue::from_static("GET"));
        return r;
    }
    let verdict = match route {
        Route::Metrics => {
            metrics.observe_health(health);
            return match metrics.try_encode() {
                Ok(body) => {
                    let mut r = Response::new(Full::new(Bytes::from(body)));
                    r.headers_mut()
                        .insert(CONTENT_TYPE, HeaderValue::from_static(METRICS_CONTENT_TYPE));
                    r
                }
                Err(e) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("encoding metrics: {e}"),
                ),
            };
        }
        Route::Healthz => health.liveness(),
        Route::Readyz => health.readiness(),
    };
    match verdict {
        Ok(()) => text(StatusCode::OK, "ok".to_string()),
        Err(why) => text(StatusCode::SERVICE_UNAVAILABLE, why),
    }
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(TEXT_CONTENT_TYPE));
    r
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::*;

    struct Reply {
        status: u16,
        /// Lower-cased `name: value` lines.
        headers: Vec<String>,
        body: String,
    }

    impl Reply {
        fn header(&self, name: &str) -> Option<&str> {
            let prefix = format!("{name}: ");
            self.headers
                .iter()
                .find_map(|h| h.strip_prefix(prefix.as_str()))
        }
    }

    /// An exposition of one gauge and of the probes' answers as
    /// [`Exposition::observe_health`] last saw them.
    #[derive(Default)]
    struct Metrics {
        volumes: AtomicU64,
        probes: Mutex<(bool, bool)>,
    }

    impl Metrics {
        fn set_volumes(&self, n: u64) {
            self.volumes.store(n, Ordering::Relaxed);
        }
    }

    impl Exposition for Metrics {
        fn try_encode(&self) -> Result<String, std::fmt::Error> {
            let (live, ready) = *self.probes.lock().unwrap();
            Ok(format!(
                "volume_health_volumes {}\nvolume_health_ready {}\nvolume_health_live {}\n# EOF\n",
                self.volumes.load(Ordering::Relaxed),
                u8::from(ready),
                u8::from(live)
            ))
        }

        fn observe_health(&self, health: &Health) {
            *self.probes.lock().unwrap() = (health.liveness().is_ok(), health.readiness().is_ok());
        }
    }

    async fn start(health: Health) -> (SocketAddr, Arc<Metrics>) {
        start_with(health, Limits::default()).await
    }

    async fn start_with(health: Health, limits: Limits) -> (SocketAddr, Arc<Metrics>) {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let metrics = Arc::new(Metrics::default());
        tokio::spawn(serve_with(listener, metrics.clone(), health, limits));
        (addr, metrics)
    }

    async fn request(addr: SocketAddr, method: &str, path: &str) -> Reply {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut raw))
            .await
            .expect("reply within 5s")
            .unwrap();
        let raw = String::from_utf8(raw).unwrap();
        let (head, body) = raw.split_once("\r\n\r\n").unwrap();
        let mut head = head.lines();
        let status = head.next().unwrap();
        let status = status.split(' ').nth(1).unwrap().parse().unwrap();
        Reply {
            status,
            headers: head.map(str::to_ascii_lowercase).collect(),
            body: body.to_string(),
        }
    }

    #[tokio::test]
    async fn metrics_are_served_as_openmetrics() {
        let (addr, metrics) = start(Health::new(Duration::from_secs(60))).await;
        metrics.set_volumes(7);
        let r = request(addr, "GET", "/metrics").await;
        assert_eq!(r.status, 200);
        assert_eq!(
            r.header("content-type"),
            Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
        );
        assert!(
            r.body.lines().any(|l| l == "volume_health_volumes 7"),
            "{}",
            r.body
        );
        assert!(r.body.ends_with("# EOF\n"), "{}", r.body);
        // The query string is not part of the route.
        assert_eq!(request(addr, "GET", "/metrics?x=1").await.status, 200);
    }

    #[tokio::test]
    async fn healthz_follows_the_heartbeat() {
        let health = Health::new(Duration::from_millis(100));
        let (addr, _) = start(health.clone()).await;
        let r = request(addr, "GET", "/healthz").await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));

        tokio::time::sleep(Duration::from_millis(250)).await;
        let r = request(addr, "GET", "/healthz").await;
        assert_eq!(r.status, 503);
        assert!(
            r.body.starts_with("main loop stalled: last beat ")
                && r.body.ends_with(" ms ago (limit 100 ms)"),
            "{}",
            r.body
        );

        health.beat();
        let r = request(addr, "GET", "/healthz").await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));
    }

    #[tokio::test]
    async fn readyz_follows_readiness() {
        let health = Health::new(Duration::from_secs(60));
        let (addr, _) = start(health.clone()).await;
        let r = request(addr, "GET", "/readyz").await;
        assert_eq!((r.status, r.body.as_str()), (503, "starting"));

        health.set_ready(true);
        let r = request(addr, "GET", "/readyz").await;
        assert_eq!((r.status, r.body.as_str()), (200, "ok"));

        health.set_not_ready("pod informer not synced".to_string());
        let r = request(addr, "GET", "/readyz").await;
        assert_eq!(
            (r.status, r.body.as_str()),
            (503, "pod informer not synced")
        );

        health.set_ready(false);
        let r = request(addr, "GET", "/readyz").await;
        assert_eq!((r.status, r.body.as_str()), (503, "not ready"));
        // Readiness is not liveness.
        assert_eq!(request(addr, "GET", "/healthz").await.status, 200);
    }

    /// The `volume_health_ready` and `volume_health_live` samples of a scrape.
    async fn scraped_health(addr: SocketAddr) -> Vec<String> {
        let r = request(addr, "GET", "/metrics").await;
        assert_eq!(r.status, 200);
        r.body
            .lines()
            .filter(|l| {
                l.starts_with("volume_health_ready ") || l.starts_with("volume_health_live ")
            })
            .map(str::to_string)
            .collect()
    }

    #[tokio::test]
    async fn metrics_say_what_the_probes_would_answer_at_the_scrape() {
        let health = Health::new(Duration::from_millis(200));
        let (addr, _) = start(health.clone()).await;
        assert_eq!(
            scraped_health(addr).await,
            ["volume_health_ready 0", "volume_health_live 1"]
        );
        health.set_ready(true);
        assert_eq!(
            scraped_health(addr).await,
            ["volume_health_ready 1", "volume_health_live 1"]
        );
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(request(addr, "GET", "/healthz").await.status, 503);
        assert_eq!(
            scraped_health(addr).await,
            ["volume_health_ready 1", "volume_health_live 0"]
        );
        health.beat();
        health.set_not_ready("pod informer not synced".to_string());
        assert_eq!(
            scraped_health(addr).await,
            ["volume_health_ready 0", "volume_health_live 1"]
        );
    }

    #[tokio::test]
    async fn unknown_paths_and_other_methods_are_refused() {
        let (addr, _) = start(Health::new(Duration::from_secs(60))).await;
        let r = request(addr, "GET", "/").await;
        assert_eq!((r.status, r.body.as_str()), (404, "not found"));
        assert_eq!(request(addr, "GET", "/metrics/x").await.status, 404);
        for method in ["POST", "PUT", "DELETE", "HEAD"] {
            let r = request(addr, method, "/metrics").await;
            assert_eq!(r.status, 405, "{method}");
            assert_eq!(r.header("allow"), Some("get"), "{method}");
        }
        assert_eq!(request(addr, "POST", "/nowhere").await.status, 404);
    }

    #[tokio::test]
    async fn a_slow_client_blocks_no_one_and_is_cut_off() {
        let health = Health::new(Duration::from_secs(60));
        health.set_ready(true);
        let (addr, _) = start_with(
            health,
            Limits {
                header_read_timeout: Duration::from_millis(300),
                connection_lifetime: CONNECTION_LIFETIME,
                max_connections: MAX_CONNECTIONS,
            },
        )
        .await;
        let mut slow = TcpStream::connect(addr).await.unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: te")
            .await
            .unwrap();

        let started = Instant::now();
        assert_eq!(request(addr, "GET", "/readyz").await.status, 200);
        assert!(started.elapsed() < Duration::from_millis(300));

        // Headers never completed: the server closes without an answer.
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(5), slow.read_to_end(&mut rest)).await;
        assert!(read.is_ok(), "the slow connection is still open");
        assert!(
            !String::from_utf8_lossy(&rest).starts_with("HTTP/1.1 200"),
            "{rest:?}"
        );
    }

    #[tokio::test]
    async fn bind_names_the_address_it_could_not_use() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap();
        let err = bind(addr).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("cannot listen on {addr} for /metrics, /healthz and /readyz")
        );
    }
}
