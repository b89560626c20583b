//! The single-node cluster `cargo xtask cluster up` runs on this machine
//! (lab/src/cluster/), as the end-to-end tests (`tests/kubelet_e2e.rs`) use
//! it: its description (`cluster.json` in its state directory), an admin
//! kube client from its kubeconfig, kubectl and helm pointed at it, and the
//! fault disk under its CSI driver, steered through the disk's control
//! socket.
//!
//! Nothing here starts or stops the cluster: a test that finds no
//! description, or a Node that is not Ready, fails and says how to bring it
//! up (never a skip).

use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use serde::Deserialize;
use tempfile::TempDir;
use tokio::runtime::Runtime;

use crate::manifests::repo_root;
use crate::protocol::{ByteRange, Request, Response, Rule, ServerInfo, Stats};
use crate::{fs, k8s_tools, multi_thread_runtime};

/// Overrides the state directory (the lab's `--state-dir` default).
pub const CLUSTER_DIR_ENV: &str = "HEALTH_CLUSTER_DIR";

/// How a test brings the cluster up when it finds none.
const HOW_TO_START: &str = "bring it up first, as root: `cargo xtask cluster up` \
     (or point HEALTH_CLUSTER_DIR at the state directory of a running one)";

/// `cluster.json`, as `cargo xtask cluster up` writes it.
#[derive(Clone, Debug, Deserialize)]
pub struct Description {
    pub kubeconfig: PathBuf,
    pub node: String,
    pub apiserver: String,
    pub kubelet_root: PathBuf,
    pub images: Images,
    /// The storage part; `null` until the storage is up.
    pub storage: Option<Storage>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Images {
    pub agent: String,
    pub busybox: String,
}

/// The storage part of `cluster.json` (lab/src/cluster/storage/): the fault
/// disk, the project's CSI driver over it behind `health-agent csi-proxy`,
/// and the PVs.
#[derive(Clone, Debug, Deserialize)]
pub struct Storage {
    /// The faultdisk server's control socket.
    pub control_socket: PathBuf,
    /// The disk image every volume's loop device reads and writes.
    pub image: PathBuf,
    pub driver: String,
    /// The driver's own socket.
    pub csi_socket: PathBuf,
    /// The proxy's socket, which the kubelet calls.
    pub proxy_socket: PathBuf,
    pub storage_class: String,
    pub volumes: Vec<Volume>,
}

/// A PV and what backs it.
#[derive(Clone, Debug, Deserialize)]
pub struct Volume {
    pub pv: String,
    pub volume_handle: String,
    /// `Filesystem` or `Block`.
    pub mode: String,
    /// The loop device over its stretch of the image.
    pub device: PathBuf,
    pub maj_min: String,
    pub region: Region,
}

/// A stretch of the disk image.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
pub struct Region {
    pub offset: u64,
    pub bytes: u64,
}

impl Description {
    pub fn storage(&self) -> Result<&Storage> {
        self.storage
            .as_ref()
            .with_context(|| format!("cluster.json has no storage part (null): {HOW_TO_START}"))
    }

    /// The first PV of `mode` (`Filesystem`, `Block`).
    pub fn volume(&self, mode: &str) -> Result<&Volume> {
        let storage = self.storage()?;
        storage
            .volumes
            .iter()
            .find(|v| v.mode == mode)
            .with_context(|| format!("the cluster has no {mode} PV: {:?}", storage.volumes))
    }
}

/// The state directory: `$HEALTH_CLUSTER_DIR`, else `target/cluster` of the
/// workspace.
pub fn state_dir() -> PathBuf {
    match std::env::var_os(CLUSTER_DIR_ENV) {
        Some(dir) => PathBuf::from(dir),
        None => repo_root().join("target/cluster"),
    }
}

/// The running cluster: its description, an admin client, kubectl and helm.
pub struct NodeCluster {
    pub info: Description,
    pub admin: Client,
    pub tools: Tools,
    rt: Runtime,
}

impl NodeCluster {
    /// Reads the description and checks that the Node is Ready and the
    /// storage is up; fails loudly otherwise.
    pub fn open() -> Result<NodeCluster> {
        let file = state_dir().join("cluster.json");
        let text = std::fs::read_to_string(&file).with_context(|| {
            format!(
                "no cluster description at {}: {HOW_TO_START}",
                file.display()
            )
        })?;
        let info: Description = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a cluster description", file.display()))?;
        ensure!(
            info.storage.is_some(),
            "{}: the cluster's storage is not up (storage: null): {HOW_TO_START}",
            file.display()
        );
        let rt = multi_thread_runtime()?;
        let admin = rt.block_on(client(&info.kubeconfig))?;
        rt.block_on(node_ready(&admin, &info.node))?;
        let tools = Tools::new(&info.kubeconfig)?;
        Ok(NodeCluster {
            info,
            admin,
            tools,
            rt,
        })
    }

    pub fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.rt.block_on(f)
    }

    /// A GET of `path` on `port` of pod `ns/pod` through the API server's
    /// pod proxy (as `kubectl get --raw` does): the body.
    pub fn pod_get(&self, ns: &str, pod: &str, port: u16, path: &str) -> Result<String> {
        let uri = format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy{path}");
        let request = http::Request::get(&uri).body(Vec::new())?;
        self.block_on(self.admin.request_text(request))
            .with_context(|| format!("GET {uri}"))
    }
}

/// An admin client from the cluster's kubeconfig, without retries (a test
/// wants the server's first answer).
async fn client(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading the cluster's kubeconfig {}", kubeconfig.display()))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .context("a kube config from the cluster's kubeconfig")?;
    config.default_retry = false;
    Client::try_from(config).context("building a kube client")
}

/// Fails unless Node `name` exists with condition Ready True.
async fn node_ready(admin: &Client, name: &str) -> Result<()> {
    let nodes = Api::<Node>::all(admin.clone());
    let node = tokio::time::timeout(Duration::from_secs(10), nodes.get_opt(name))
        .await
        .with_context(|| format!("the API server did not answer in 10 s: {HOW_TO_START}"))?
        .with_context(|| format!("reading Node {name}: is the cluster up? {HOW_TO_START}"))?
        .with_context(|| format!("no Node {name}: {HOW_TO_START}"))?;
    let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
    let ready = conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    ensure!(
        ready,
        "Node {name} is not Ready: {:?}",
        conditions
            .iter()
            .map(|c| format!(
                "{}={} ({})",
                c.type_,
                c.status,
                c.message.as_deref().unwrap_or("")
            ))
            .collect::<Vec<_>>()
    );
    Ok(())
}

/// kubectl and helm (`cargo xtask tools`' copies, see [`k8s_tools`]) with a
/// home of their own, pointed at the cluster by `--kubeconfig`.
pub struct Tools {
    pub kubectl: PathBuf,
    pub helm: PathBuf,
    kubeconfig: String,
    home: TempDir,
}

impl Tools {
    fn new(kubeconfig: &Path) -> Result<Tools> {
        Ok(Tools {
            kubectl: k8s_tools::find("KUBECTL_BIN", "kubectl")?,
            helm: k8s_tools::find("HELM_BIN", "helm")?,
            kubeconfig: kubeconfig.to_string_lossy().into_owned(),
            home: tempfile::Builder::new().prefix("e2e-tools-").tempdir()?,
        })
    }

    fn with_kubeconfig<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec!["--kubeconfig", self.kubeconfig.as_str()];
        all.extend_from_slice(args);
        all
    }

    /// kubectl `args`, which must succeed: its stdout.
    pub fn kubectl(&self, args: &[&str]) -> Result<String> {
        k8s_tools::run(&self.kubectl, &self.with_kubeconfig(args), self.home.path())
    }

    /// kubectl `args`, whatever its exit status.
    pub fn kubectl_output(&self, args: &[&str]) -> Result<Output> {
        k8s_tools::output(&self.kubectl, &self.with_kubeconfig(args), self.home.path())
    }

    /// helm `args`, which must succeed: its stdout.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        k8s_tools::run(&self.helm, &self.with_kubeconfig(args), self.home.path())
    }

    /// helm `args`, whatever its exit status.
    pub fn helm_output(&self, args: &[&str]) -> Result<Output> {
        k8s_tools::output(&self.helm, &self.with_kubeconfig(args), self.home.path())
    }
}

/// The cluster's fault disk, through the control socket of its running
/// `faultdisk` server (the protocol of [`crate::protocol`]).
pub struct DiskControl {
    socket: PathBuf,
}

impl DiskControl {
    pub fn new(socket: &Path) -> Result<DiskControl> {
        let meta = std::fs::metadata(socket)
            .with_context(|| format!("the fault disk's control socket {}", socket.display()))?;
        ensure!(
            meta.file_type().is_socket(),
            "{} is not a socket",
            socket.display()
        );
        Ok(DiskControl {
            socket: socket.to_path_buf(),
        })
    }

    /// One request and its answer; an answer with `ok: false` is an error.
    pub fn call(&self, request: &Request) -> Result<Response> {
        crate::faultdisk::call(&self.socket, request)
    }

    pub fn info(&self) -> Result<ServerInfo> {
        self.call(&Request::Info)?
            .info
            .context("an info answer without info")
    }

    pub fn stats(&self) -> Result<Stats> {
        self.call(&Request::Stats)?
            .stats
            .context("a stats answer without stats")
    }

    /// Adds `rule`; it is removed when the returned guard is dropped (so a
    /// failing test leaves no fault behind).
    pub fn add_rule(&self, rule: Rule) -> Result<RuleGuard<'_>> {
        let id = self
            .call(&Request::AddRule { rule })?
            .rule_id
            .context("an add_rule answer without a rule id")?;
        Ok(RuleGuard {
            disk: self,
            ids: vec![id],
        })
    }

    /// One rule per range, all removed together when the guard is dropped.
    pub fn add_rules(&self, rules: impl IntoIterator<Item = Rule>) -> Result<RuleGuard<'_>> {
        let mut guard = RuleGuard {
            disk: self,
            ids: Vec::new(),
        };
        for rule in rules {
            let id = self
                .call(&Request::AddRule { rule })?
                .rule_id
                .context("an add_rule answer without a rule id")?;
            guard.ids.push(id);
        }
        Ok(guard)
    }

    /// The byte ranges of the disk image that hold `file`'s data. `file`
    /// must be on a filesystem whose device is a loop device over this
    /// disk's image (checked: its backing file is the image the server
    /// serves); every extent must be plain written data.
    pub fn file_ranges(&self, file: &Path) -> Result<Vec<ByteRange>> {
        let dev = std::fs::metadata(file)
            .with_context(|| format!("stat {}", file.display()))?
            .dev();
        let (offset, limit) = self
            .loop_region(libc::major(dev), libc::minor(dev))
            .with_context(|| format!("the filesystem of {}", file.display()))?;
        fs::sync_fs(file)?;
        let extents = fs::file_extents(file)?;
        ensure!(!extents.is_empty(), "{} has no extents", file.display());
        let odd = fs::Extent::FLAG_UNKNOWN
            | fs::Extent::FLAG_DELALLOC
            | fs::Extent::FLAG_ENCODED
            | fs::Extent::FLAG_DATA_INLINE
            | fs::Extent::FLAG_UNWRITTEN
            | fs::Extent::FLAG_NOT_ALIGNED;
        extents
            .iter()
            .map(|e| {
                ensure!(
                    e.flags & odd == 0 && e.physical + e.len <= limit,
                    "{}: an extent that is not plain data within its loop device's {limit} \
                     bytes: {e:?}",
                    file.display()
                );
                Ok(ByteRange {
                    start: e.disk_offset(offset),
                    end: e.disk_offset(offset) + e.len,
                })
            })
            .collect()
    }

    /// Where loop device `major:minor` sits in this disk's image: its offset
    /// and how many bytes it covers. Fails unless it is a loop device over
    /// the image the server serves.
    pub fn loop_region(&self, major: u32, minor: u32) -> Result<(u64, u64)> {
        let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
        let backing = read_trimmed(&sys.join("loop/backing_file"))
            .with_context(|| format!("{major}:{minor} is no bound loop device"))?;
        let image = self.info()?.image_path;
        ensure!(
            Path::new(&backing) == Path::new(&image),
            "loop device {major}:{minor} is over {backing}, not over the fault disk's image {image}"
        );
        let number = |name: &str| -> Result<u64> {
            let path = sys.join(name);
            read_trimmed(&path)?
                .parse()
                .with_context(|| format!("{} is not a number", path.display()))
        };
        // `size` counts 512-byte sectors whatever the logical block size.
        Ok((number("loop/offset")?, number("size")? * 512))
    }
}

/// Rules on the fault disk, removed on drop.
#[must_use = "the rules are removed when this is dropped"]
pub struct RuleGuard<'a> {
    disk: &'a DiskControl,
    ids: Vec<u64>,
}

impl RuleGuard<'_> {
    /// Removes the rules now, reporting a failure.
    pub fn remove(mut self) -> Result<()> {
        for id in std::mem::take(&mut self.ids) {
            self.disk.call(&Request::RemoveRule { rule_id: id })?;
        }
        Ok(())
    }
}

impl Drop for RuleGuard<'_> {
    fn drop(&mut self) {
        for id in std::mem::take(&mut self.ids) {
            if let Err(e) = self.disk.call(&Request::RemoveRule { rule_id: id }) {
                eprintln!("removing fault rule {id}: {e:#}");
            }
        }
    }
}

/// The kernel's name and numbers of the block device node at (or linked
/// from) `path`: `("loop3", 7, 3)`.
pub fn block_device(path: &Path) -> Result<(String, u32, u32)> {
    let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
    ensure!(
        meta.file_type().is_block_device(),
        "{} is not a block device",
        path.display()
    );
    let (major, minor) = (libc::major(meta.rdev()), libc::minor(meta.rdev()));
    let uevent = read_trimmed(Path::new(&format!("/sys/dev/block/{major}:{minor}/uevent")))?;
    let name = uevent
        .lines()
        .find_map(|l| l.strip_prefix("DEVNAME="))
        .with_context(|| format!("no DEVNAME for {major}:{minor} in {uevent:?}"))?;
    Ok((name.to_string(), major, minor))
}

/// The file a bound loop device reads and writes.
pub fn loop_backing_file(major: u32, minor: u32) -> Result<PathBuf> {
    let file = format!("/sys/dev/block/{major}:{minor}/loop/backing_file");
    read_trimmed(Path::new(&file)).map(PathBuf::from)
}

fn read_trimmed(path: &Path) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(text.trim_end().to_string())
}

/// Polls `check` every 200 ms until it gives `Ok(Ok(value))`, for at most
/// `within`. `Ok(Err(state))` means not yet (the last state is in the
/// timeout's error); `Err` ends the wait at once.
pub fn poll<T>(
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Result<Result<T, String>>,
) -> Result<T> {
    let deadline = Instant::now() + within;
    loop {
        let state = match check()? {
            Ok(done) => return Ok(done),
            Err(state) => state,
        };
        if Instant::now() >= deadline {
            bail!("waited {within:?} for {what}; last seen: {state}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
