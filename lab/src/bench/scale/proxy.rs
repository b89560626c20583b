//! A TCP proxy in front of kube-apiserver that counts the bytes each way:
//! what one client (an agent, the controller) received, exactly, watch
//! streams and TLS included, where the API server's
//! `apiserver_response_sizes` mixes every client's responses and leaves
//! watch streams out.
//!
//! The client keeps speaking TLS to the API server through it (the
//! envtest kubeconfigs skip verification), so the count is what crosses
//! the wire: response bodies, headers, TLS records and handshakes.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use kube::config::Kubeconfig;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// Bytes each way since the proxy started, over all its connections.
#[derive(Default)]
struct Counts {
    /// Server -> client.
    down: AtomicU64,
    /// Client -> server.
    up: AtomicU64,
    connections: AtomicU64,
}

pub struct CountingProxy {
    addr: SocketAddr,
    counts: Arc<Counts>,
    task: tokio::task::JoinHandle<()>,
}

impl CountingProxy {
    /// Listens on a free loopback port and forwards every connection to
    /// `upstream`. Call inside a multi-thread runtime: the proxy keeps
    /// running on its workers.
    pub async fn start(upstream: SocketAddr) -> Result<CountingProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the counting proxy")?;
        let addr = listener.local_addr()?;
        let counts = Arc::new(Counts::default());
        let shared = Arc::clone(&counts);
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                shared.connections.fetch_add(1, Ordering::Relaxed);
                let counts = Arc::clone(&shared);
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let _ = client.set_nodelay(true);
                    let _ = server.set_nodelay(true);
                    let (client_r, client_w) = client.into_split();
                    let (server_r, server_w) = server.into_split();
                    let up = pump(client_r, server_w, &counts.up);
                    let down = pump(server_r, client_w, &counts.down);
                    let _ = tokio::join!(up, down);
                });
            }
        });
        Ok(CountingProxy { addr, counts, task })
    }

    /// Bytes the client received so far.
    pub fn received(&self) -> u64 {
        self.counts.down.load(Ordering::Relaxed)
    }

    /// Bytes the client sent so far.
    pub fn sent(&self) -> u64 {
        self.counts.up.load(Ordering::Relaxed)
    }

    /// TCP connections the client opened so far.
    pub fn connections(&self) -> u64 {
        self.counts.connections.load(Ordering::Relaxed)
    }

    /// A copy of `kubeconfig` whose server is this proxy, written to `to`.
    pub fn kubeconfig(&self, kubeconfig: &Path, to: PathBuf) -> Result<PathBuf> {
        let mut config = Kubeconfig::read_from(kubeconfig)
            .with_context(|| format!("reading {}", kubeconfig.display()))?;
        for named in &mut config.clusters {
            if let Some(cluster) = named.cluster.as_mut() {
                cluster.server = Some(format!("https://{}", self.addr));
            }
        }
        let text = serde_json::to_string_pretty(&config).context("serializing a kubeconfig")?;
        std::fs::write(&to, text).with_context(|| format!("writing {}", to.display()))?;
        Ok(to)
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        // Open connections end with their client (every client is stopped
        // before its proxy is dropped).
        self.task.abort();
    }
}

/// Copies `from` to `to`, counting, until either side closes.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    count: &AtomicU64,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
        count.fetch_add(n as u64, Ordering::Relaxed);
    }
    let _ = to.shutdown().await;
}

/// `https://127.0.0.1:PORT` -> the socket address.
pub fn upstream(url: &str) -> Result<SocketAddr> {
    url.trim_start_matches("https://")
        .trim_end_matches('/')
        .parse()
        .with_context(|| format!("the API server's address in {url}"))
}
