//! The driver from the other side: a tonic channel to a unix socket,
//! CreateVolume (how volumes come to exist without an
//! external-provisioner: the controller tests, the local cluster's static
//! PVs), and the driver as a child process whose log counts its calls.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use health_csi::proto;
use health_csi::proto::controller_client::ControllerClient;
use health_csi::proto::volume_capability::access_mode::Mode;
use health_csi::proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::backing::FILE;
use super::error::calls_in_log;
use super::requests::Access;

/// A gRPC channel to the unix socket `socket`.
pub async fn unix_channel(socket: &Path) -> Result<Channel> {
    let path = socket.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move { UnixStream::connect(path).await.map(TokioIo::new) }
        }))
        .await
        .with_context(|| format!("connecting to {}", socket.display()))
}

/// One SINGLE_NODE_WRITER capability of `access`.
pub fn capability(access: Access) -> proto::VolumeCapability {
    proto::VolumeCapability {
        access_type: Some(match access {
            Access::Block => AccessType::Block(BlockVolume {}),
            Access::Mount => AccessType::Mount(MountVolume::default()),
        }),
        access_mode: Some(AccessMode {
            mode: Mode::SingleNodeWriter as i32,
        }),
    }
}

/// What CreateVolume answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreatedVolume {
    /// The volume handle of a PV.
    pub id: String,
    pub capacity_bytes: i64,
    /// `volume_context`: a PV's `volumeAttributes`.
    pub context: BTreeMap<String, String>,
}

impl CreatedVolume {
    /// The file its data lives in.
    pub fn file(&self) -> Result<PathBuf> {
        self.context
            .get(FILE)
            .map(PathBuf::from)
            .with_context(|| format!("volume {} has no {FILE:?} in {:?}", self.id, self.context))
    }
}

/// CSI CreateVolume `name` of `bytes` for `access`, with `parameters`
/// (none: a file of the driver's own; `file`/`offset`: a stretch of that
/// file), on the driver listening on `socket`. The driver answers the same
/// volume again for the same request.
pub async fn create_volume(
    socket: &Path,
    name: &str,
    bytes: i64,
    access: Access,
    parameters: &BTreeMap<String, String>,
) -> Result<CreatedVolume> {
    let mut client = ControllerClient::new(unix_channel(socket).await?);
    let request = proto::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: Some(proto::CapacityRange {
            required_bytes: bytes,
            limit_bytes: 0,
        }),
        volume_capabilities: vec![capability(access)],
        parameters: parameters
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect(),
        volume_content_source: None,
    };
    let answer = client
        .create_volume(request)
        .await
        .with_context(|| format!("CreateVolume {name}"))?;
    match answer.into_inner().volume {
        Some(v) if !v.volume_id.is_empty() => Ok(CreatedVolume {
            id: v.volume_id,
            capacity_bytes: v.capacity_bytes,
            context: v.volume_context.into_iter().collect(),
        }),
        other => bail!("CreateVolume {name} answered without a volume: {other:?}"),
    }
}

/// The driver as a child process, its CSI socket `csi.sock` and its state
/// `state/` in a directory of the caller's; killed when dropped. Its log
/// (stderr) is collected for [`DriverProcess::calls`].
pub struct DriverProcess {
    child: Child,
    socket: PathBuf,
    state: PathBuf,
    log: Arc<Mutex<String>>,
}

impl DriverProcess {
    /// Starts `bin` (`env!("CARGO_BIN_EXE_csi-loop-driver")` in the tests)
    /// with `--node-id node-id`, and `args` besides, and waits for its
    /// socket.
    pub fn start(bin: &Path, dir: &Path, node_id: &str, args: &[&str]) -> Result<DriverProcess> {
        let socket = dir.join("csi.sock");
        let state = dir.join("state");
        let mut child = Command::new(bin)
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .arg(format!("--node-id={node_id}"))
            .arg(format!("--state-dir={}", state.display()))
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stderr = child.stderr.take().context("the driver's stderr")?;
        let log = Arc::new(Mutex::new(String::new()));
        let sink = Arc::clone(&log);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let mut log = sink.lock().unwrap_or_else(PoisonError::into_inner);
                log.push_str(&line);
                log.push('\n');
            }
        });
        let mut driver = DriverProcess {
            child,
            socket,
            state,
            log,
        };
        driver.wait_for_socket(Duration::from_secs(10))?;
        Ok(driver)
    }

    fn wait_for_socket(&mut self, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while !self.socket.exists() {
            if let Some(status) = self.child.try_wait()? {
                bail!("the driver exited ({status}): {}", self.log());
            }
            if Instant::now() > deadline {
                bail!(
                    "the driver did not listen on {} within {within:?}: {}",
                    self.socket.display(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many calls of `method` (`ListVolumes`) it has answered.
    pub fn calls(&self, method: &str) -> usize {
        calls_in_log(&self.log(), method)
    }

    /// Creates a volume `name` of `bytes` in a file of the driver's own.
    pub async fn create_volume(
        &self,
        name: &str,
        bytes: i64,
        access: Access,
    ) -> Result<CreatedVolume> {
        create_volume(&self.socket, name, bytes, access, &BTreeMap::new()).await
    }

    /// SIGKILL, and the exit reaped.
    pub fn kill(&mut self) {
        // Already gone is fine: the point is that it is.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the exit status (the driver removes its sockets).
    pub fn terminate(&mut self) -> Result<std::process::ExitStatus> {
        let pid =
            nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).context("the driver's pid")?);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM)
            .context("signalling the driver")?;
        self.child.wait().context("waiting for the driver")
    }
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        self.kill();
    }
}
