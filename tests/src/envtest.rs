//! A real kube-apiserver (and etcd) for tests, in the spirit of controller-runtime's
//! envtest: the real API machinery (validation, strict field decoding, server-side
//! apply, RBAC, the Node authorizer, NodeRestriction, Leases, watches) with no
//! kubelet and no controllers.
//!
//! Where [`crate::FakeApiServer`] records exactly what a client asks, this one decides
//! what a real cluster would: whether a manifest is accepted, whether an identity
//! may do a call.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use health_tests::envtest::{require_api_server, Options};
//! let Some(server) = Options::new().service_account("ns", "sa").require() else {
//!     return Ok(()); // binaries missing, outside CI: a notice was printed
//! };
//! let admin_kubeconfig = server.kubeconfig(server.admin());
//! let sa = server.service_account("ns", "sa").unwrap();
//! # let _ = (admin_kubeconfig, sa, require_api_server);
//! # Ok(()) }
//! ```
//!
//! Binaries: `$HEALTH_K8S_ASSETS/kube-apiserver` (like envtest's KUBEBUILDER_ASSETS,
//! so users point it at their own build), and `$HEALTH_K8S_ASSETS/etcd` or else
//! `etcd` from PATH; [`Options::oldest`] takes them from
//! `$HEALTH_K8S_OLDEST_ASSETS` instead, the oldest API server the README claims.
//! `cargo xtask test` builds both from Go modules and sets the variables
//! (`cargo xtask components` prints them). `openssl` makes the ServiceAccount
//! signing key. Both processes listen on random loopback ports, keep their data in
//! a temporary directory, and are killed with their process groups on drop.
//!
//! Not there, as in envtest: no controller-manager (namespaces other than
//! `default`, `kube-system`, `kube-public` and `kube-node-lease` must be created,
//! ServiceAccounts get no token Secrets, nothing is garbage-collected).

mod access;
mod identity;
mod impersonate;
mod process;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use kube::config::{KubeConfigOptions, Kubeconfig};

pub use self::access::{attributes, may, wait_allowed, wait_granted};
pub use self::identity::{service_account_user, Identity};
pub use self::impersonate::{Impersonation, NODE_NAME_EXTRA};
use self::process::{exited, free_port, kill_group, Keeper};

/// Names the directory holding `kube-apiserver` (and optionally `etcd`).
pub const ASSETS_ENV: &str = "HEALTH_K8S_ASSETS";
/// Names the directory holding the oldest supported `kube-apiserver` (and
/// optionally `etcd`), for [`Options::oldest`].
pub const OLDEST_ASSETS_ENV: &str = "HEALTH_K8S_OLDEST_ASSETS";
/// The kubelets every server knows unless [`Options::nodes`] says otherwise.
pub const DEFAULT_NODES: &[&str] = &["node-1", "node-2"];
/// How long kube-apiserver may take to become ready. It takes ~4 s alone on two
/// cores; the margin is for a machine busy compiling.
const READY_TIMEOUT: Duration = Duration::from_secs(90);
/// Starts that lost a port race (see [`free_port`]) are tried again this often.
const START_ATTEMPTS: usize = 3;

/// Why [`Options::start`] failed: binaries that are simply not installed are told
/// apart from a server that would not run, since only the first may be skipped.
#[derive(Debug, thiserror::Error)]
pub enum EnvtestError {
    #[error("{0}")]
    MissingAssets(String),
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

/// What the server is started with: the identities it knows (tokens are read once
/// at start) and extra kube-apiserver flags.
#[derive(Clone, Debug)]
pub struct Options {
    nodes: Vec<String>,
    users: Vec<(String, Vec<String>)>,
    service_accounts: Vec<(String, String)>,
    apiserver_args: Vec<String>,
    assets: Option<PathBuf>,
    oldest: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

impl Options {
    /// Admin plus the kubelets of [`DEFAULT_NODES`].
    pub fn new() -> Self {
        Options {
            nodes: DEFAULT_NODES.iter().map(|n| n.to_string()).collect(),
            users: Vec::new(),
            service_accounts: Vec::new(),
            apiserver_args: Vec::new(),
            assets: None,
            oldest: false,
        }
    }

    /// The kubelets (`system:node:<name>`) that get a token, instead of the defaults.
    pub fn nodes(mut self, names: &[&str]) -> Self {
        self.nodes = names.iter().map(|n| n.to_string()).collect();
        self
    }

    /// A token for ServiceAccount `namespace/name` (see [`Identity::service_account`]).
    /// The ServiceAccount object itself need not exist.
    pub fn service_account(mut self, namespace: &str, name: &str) -> Self {
        self.service_accounts
            .push((namespace.to_string(), name.to_string()));
        self
    }

    /// A token for any user in any groups.
    pub fn user(mut self, name: &str, groups: &[&str]) -> Self {
        let groups = groups.iter().map(|g| g.to_string()).collect();
        self.users.push((name.to_string(), groups));
        self
    }

    /// An extra kube-apiserver flag, e.g. `--feature-gates=...`.
    pub fn apiserver_arg(mut self, arg: &str) -> Self {
        self.apiserver_args.push(arg.to_string());
        self
    }

    /// Where the binaries are, instead of `$HEALTH_K8S_ASSETS`.
    pub fn assets(mut self, dir: &Path) -> Self {
        self.assets = Some(dir.to_path_buf());
        self
    }

    /// The oldest API server the project supports
    /// (`$HEALTH_K8S_OLDEST_ASSETS`), for what an old cluster must accept.
    pub fn oldest(mut self) -> Self {
        self.oldest = true;
        self
    }

    /// Starts etcd and kube-apiserver and waits until `/readyz` answers `ok`.
    pub fn start(self) -> Result<RealApiServer, EnvtestError> {
        let env = if self.oldest {
            OLDEST_ASSETS_ENV
        } else {
            ASSETS_ENV
        };
        let assets = Assets::find(self.assets.clone(), env)?;
        let identities = self.identities()?;
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            match RealApiServer::start_once(&assets, &identities, &self.apiserver_args) {
                Ok(server) => return Ok(server),
                Err(e) if format!("{e:#}").contains("address already in use") => last = Some(e),
                Err(e) => return Err(e.into()),
            }
        }
        Err(last.expect("at least one attempt").into())
    }

    /// [`Options::start`] for a test: the server, or `None` when the binaries are
    /// missing outside CI (after a loud notice on stderr; the test then returns
    /// early). Under `CI=true` missing binaries fail the test, and a server that
    /// does not start fails it everywhere.
    pub fn require(self) -> Option<RealApiServer> {
        match self.start() {
            Ok(server) => Some(server),
            Err(EnvtestError::MissingAssets(why)) => {
                skip_missing(&why);
                None
            }
            Err(e) => panic!("the test API server did not start: {e:#}"),
        }
    }

    fn identities(&self) -> Result<Vec<Identity>> {
        let mut all = vec![Identity::admin()?];
        for node in &self.nodes {
            all.push(Identity::node(node)?);
        }
        for (namespace, name) in &self.service_accounts {
            all.push(Identity::service_account(namespace, name)?);
        }
        for (user, groups) in &self.users {
            let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
            all.push(Identity::new(user, &groups)?);
        }
        Ok(all)
    }
}

/// [`Options::require`] with the default identities (admin, [`DEFAULT_NODES`]).
pub fn require_api_server() -> Option<RealApiServer> {
    Options::new().require()
}

/// What a test does when the binaries are missing: under `CI=true` it fails
/// (panics), elsewhere it prints a loud notice to stderr and the caller returns.
pub fn skip_missing(why: &str) {
    if under_ci() {
        panic!("CI=true and the test API server cannot run: {why}");
    }
    eprintln!("{}", missing_notice(why));
}

fn under_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true" || v == "1")
}

fn missing_notice(why: &str) -> String {
    let bar = "!".repeat(78);
    format!(
        "\n{bar}\n!! TEST NOT RUN: it needs a real kube-apiserver and etcd.\n!! {why}\n\
         !! Point {ASSETS_ENV} (and {OLDEST_ASSETS_ENV}) at a directory holding\n\
         !! kube-apiserver and etcd; `cargo xtask test` builds them and does this by\n\
         !! itself, `cargo xtask components` prints them.\n\
         !! Under CI=true this is a failure.\n{bar}\n"
    )
}

/// The binaries, found before anything is started.
struct Assets {
    apiserver: PathBuf,
    etcd: PathBuf,
    openssl: PathBuf,
}

impl Assets {
    fn find(dir: Option<PathBuf>, env: &str) -> Result<Self, EnvtestError> {
        let dir = dir
            .or_else(|| std::env::var_os(env).map(PathBuf::from))
            .ok_or_else(|| EnvtestError::MissingAssets(format!("{env} is not set.")))?;
        let apiserver = dir.join("kube-apiserver");
        if !apiserver.is_file() {
            return Err(EnvtestError::MissingAssets(format!(
                "{} holds no kube-apiserver (set {env} to a directory that does).",
                dir.display()
            )));
        }
        let bundled = dir.join("etcd");
        let etcd = if bundled.is_file() {
            bundled
        } else {
            crate::cmd::find_tool("etcd").map_err(|e| {
                EnvtestError::MissingAssets(format!("no etcd in {}, and {e:#}", dir.display()))
            })?
        };
        let openssl = crate::cmd::find_tool("openssl")
            .map_err(|e| EnvtestError::MissingAssets(format!("{e:#}")))?;
        Ok(Assets {
            apiserver,
            etcd,
            openssl,
        })
    }
}

/// A running etcd + kube-apiserver; both are killed when this is dropped.
pub struct RealApiServer {
    url: String,
    identities: Vec<Identity>,
    kubeconfigs: Vec<PathBuf>,
    startup: Duration,
    // Field order is drop order: the processes are killed by `Drop` below, then
    // the keeper thread ends, then the directory goes.
    apiserver: Child,
    etcd: Child,
    _keeper: Keeper,
    dir: tempfile::TempDir,
}

impl RealApiServer {
    /// [`Options::new`]`.start()`.
    pub fn start() -> Result<Self, EnvtestError> {
        Options::new().start()
    }

    /// The process ids of kube-apiserver and etcd (a benchmark gives them a
    /// priority of their own).
    pub fn pids(&self) -> [u32; 2] {
        [self.apiserver.id(), self.etcd.id()]
    }

    fn start_once(assets: &Assets, identities: &[Identity], extra: &[String]) -> Result<Self> {
        let began = Instant::now();
        let dir = tempfile::Builder::new()
            .prefix("envtest-")
            .tempdir()
            .context("creating the envtest directory")?;
        let d = dir.path();
        std::fs::write(d.join("tokens.csv"), identity::token_file(identities))
            .context("writing tokens.csv")?;
        signing_key(&assets.openssl, d)?;

        let keeper = Keeper::new()?;
        let etcd_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{}", free_port()?);
        let mut etcd = Command::new(&assets.etcd);
        etcd.arg("--data-dir")
            .arg(d.join("etcd"))
            .args(["--listen-client-urls", &etcd_url])
            .args(["--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("default={peer_url}")])
            // Throwaway data: fsync would only slow every write down.
            .arg("--unsafe-no-fsync");
        let etcd = spawn_logged(&keeper, etcd, &d.join("etcd.log"), "etcd")?;

        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let mut apiserver = Command::new(&assets.apiserver);
        apiserver
            .arg(format!("--etcd-servers={etcd_url}"))
            .arg(format!("--secure-port={port}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            // No endpoint reconciler: from 1.27 on the API server refuses to
            // advertise a loopback address into the `kubernetes` Service's
            // endpoints, which a test server has no use for.
            .arg("--endpoint-reconciler-type=none")
            .arg(format!("--cert-dir={}", d.join("certs").display()))
            .arg(format!(
                "--token-auth-file={}",
                d.join("tokens.csv").display()
            ))
            .args([
                "--authorization-mode=Node,RBAC",
                "--enable-admission-plugins=NodeRestriction",
            ])
            .arg(format!(
                "--service-account-key-file={}",
                d.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ))
            .args([
                "--service-account-issuer=https://kubernetes.default.svc",
                "--api-audiences=https://kubernetes.default.svc",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--allow-privileged=true",
            ])
            .args(extra);
        let apiserver = spawn_logged(
            &keeper,
            apiserver,
            &d.join("apiserver.log"),
            "kube-apiserver",
        )?;

        let kubeconfigs = identities
            .iter()
            .map(|who| identity::write_kubeconfig(d, &url, who))
            .collect::<Result<Vec<_>>>()?;
        let mut server = RealApiServer {
            url,
            identities: identities.to_vec(),
            kubeconfigs,
            startup: Duration::ZERO,
            apiserver,
            etcd,
            _keeper: keeper,
            dir,
        };
        server.wait_ready()?;
        server.startup = began.elapsed();
        Ok(server)
    }

    /// Polls `/readyz` as admin until it says `ok`, failing early (with the log's
    /// tail) if either process exits.
    fn wait_ready(&mut self) -> Result<()> {
        let kubeconfig = self.kubeconfigs[0].clone();
        let deadline = Instant::now() + READY_TIMEOUT;
        // kube's client needs a tokio runtime; it gets its own thread so that
        // `start` works from async tests too (a runtime cannot block inside one).
        let outcome = std::thread::scope(|scope| {
            scope
                .spawn(|| -> Result<()> {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .context("building the readiness runtime")?;
                    rt.block_on(async {
                        let client = client_from(&kubeconfig, false).await?;
                        loop {
                            for (name, child) in [("kube-apiserver", &mut self.apiserver), ("etcd", &mut self.etcd)] {
                                if let Some(status) = exited(child) {
                                    bail!("{name} exited ({status}) before the server was ready");
                                }
                            }
                            let last = match readyz(&client).await {
                                Ok(body) if body == "ok" => return Ok(()),
                                Ok(body) => body,
                                Err(e) => e,
                            };
                            if Instant::now() >= deadline {
                                bail!("kube-apiserver not ready after {READY_TIMEOUT:?}; last /readyz: {last}");
                            }
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    })
                })
                .join()
                .map_err(|_| anyhow!("the readiness thread panicked"))?
        });
        outcome.with_context(|| {
            format!(
                "kube-apiserver log (last lines):\n{}\netcd log (last lines):\n{}",
                self.log_tail("apiserver.log", 25),
                self.log_tail("etcd.log", 10)
            )
        })
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// From [`Options::start`] until `/readyz` said `ok`.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// Where the server keeps its data, logs (`apiserver.log`, `etcd.log`) and
    /// kubeconfig files; removed on drop.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Every identity with a token, admin first.
    pub fn identities(&self) -> &[Identity] {
        &self.identities
    }

    /// The administrator (`system:masters`).
    pub fn admin(&self) -> &Identity {
        &self.identities[0]
    }

    /// The identity whose user name is `user`.
    pub fn identity(&self, user: &str) -> Option<&Identity> {
        self.identities.iter().find(|id| id.user == user)
    }

    /// Kubelet `name`, if it was given a token.
    pub fn node(&self, name: &str) -> Option<&Identity> {
        self.identity(&format!("system:node:{name}"))
    }

    /// ServiceAccount `namespace/name`, if it was given a token.
    pub fn service_account(&self, namespace: &str, name: &str) -> Option<&Identity> {
        self.identity(&service_account_user(namespace, name))
    }

    /// The kubeconfig file (written at start) that authenticates as `who`, for
    /// binaries under test (`--kubeconfig`, `KUBECONFIG`).
    ///
    /// Panics if `who` is not one of [`Self::identities`]: its token would be refused.
    pub fn kubeconfig(&self, who: &Identity) -> &Path {
        let i = self
            .identities
            .iter()
            .position(|id| id == who)
            .unwrap_or_else(|| panic!("{} has no token on this server", who.user));
        &self.kubeconfigs[i]
    }

    /// A kube client authenticated as `who`, with kube's default retries.
    pub async fn client(&self, who: &Identity) -> Result<kube::Client> {
        client_from(self.kubeconfig(who), true).await
    }

    /// The last `lines` lines of a log in [`Self::dir`].
    pub fn log_tail(&self, log: &str, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.path().join(log)).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for RealApiServer {
    fn drop(&mut self) {
        kill_group(&mut self.apiserver);
        kill_group(&mut self.etcd);
    }
}

/// The ServiceAccount token signing key pair, as kube-apiserver requires one even
/// when no token is ever issued.
fn signing_key(openssl: &Path, dir: &Path) -> Result<()> {
    let key = dir.join("sa.key");
    let public = dir.join("sa.pub");
    let steps: [Vec<&std::ffi::OsStr>; 2] = [
        vec![
            "genrsa".as_ref(),
            "-out".as_ref(),
            key.as_os_str(),
            "2048".as_ref(),
        ],
        vec![
            "rsa".as_ref(),
            "-in".as_ref(),
            key.as_os_str(),
            "-pubout".as_ref(),
            "-out".as_ref(),
            public.as_os_str(),
        ],
    ];
    for args in steps {
        let out = Command::new(openssl)
            .args(&args)
            .output()
            .with_context(|| format!("running {}", openssl.display()))?;
        if !out.status.success() {
            bail!(
                "openssl {args:?} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
    }
    Ok(())
}

fn spawn_logged(keeper: &Keeper, mut command: Command, log: &Path, name: &str) -> Result<Child> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    command
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    keeper
        .spawn(command)
        .with_context(|| format!("starting {name}"))
}

async fn client_from(kubeconfig: &Path, retry: bool) -> Result<kube::Client> {
    let kubeconfig = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .context("kube config from an envtest kubeconfig")?;
    config.default_retry = retry;
    kube::Client::try_from(config).context("building a kube client")
}

/// `/readyz`'s body, or why there was none.
async fn readyz(client: &kube::Client) -> Result<String, String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(2), client.request_text(request)).await {
        Ok(Ok(body)) => Ok(body.trim().to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_string()),
    }
}

/// A current-thread tokio runtime for a test that talks to the server.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building the test's tokio runtime")
}

/// The field manager of everything the tests apply.
pub const FIELD_MANAGER: &str = "volume-health-tests";

/// Server-side apply of one manifest (any kind the server knows) with
/// `fieldValidation=Strict`, as `kubectl apply --server-side` does: the
/// server decides what it accepts.
pub async fn apply_manifest(
    client: &kube::Client,
    doc: &serde_json::Value,
) -> Result<(), kube::Error> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube::core::GroupVersionKind;
    use kube::discovery::{pinned_kind, Scope};

    let api_version = doc["apiVersion"].as_str().unwrap_or_default();
    let kind = doc["kind"].as_str().unwrap_or_default();
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, caps) = pinned_kind(client, &gvk).await?;
    let api: Api<DynamicObject> = match (caps.scope, doc["metadata"]["namespace"].as_str()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        _ => Api::all_with(client.clone(), &resource),
    };
    let name = doc["metadata"]["name"].as_str().unwrap_or_default();
    let params = PatchParams::apply(FIELD_MANAGER).validation_strict();
    api.patch(name, &params, &Patch::Apply(doc)).await?;
    Ok(())
}
