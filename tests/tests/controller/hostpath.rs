//! The real csi-driver-host-path (`hostpathplugin`, built from upstream's
//! source: `shared/csi/README.md`) as a child process on a socket of its
//! own: its volumes created through CSI CreateVolume, made abnormal the way
//! the driver itself tells it (the volume's directory gone) and healthy
//! again, and its gRPC calls counted from its own log.
//!
//! The binary is `$HEALTH_CSI_ASSETS/hostpathplugin`, else
//! `shared/csi/bin/hostpathplugin` beside the checkout or in a directory
//! above it (where `cargo xtask test` finds the API server's binaries).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use health_tests::controller::wait_for;
pub use health_tests::hostpath::{binary, ASSETS_ENV, DRIVER, PLUGIN as BINARY};
use health_tests::hostpath::{create_volume, Access};

/// What a test does without the driver: under `CI=true` it fails, elsewhere
/// it says so loudly and the caller returns.
pub fn missing(why: &str) {
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("CI=true and the real CSI driver cannot run: {why}");
    }
    let bar = "!".repeat(78);
    eprintln!(
        "\n{bar}\n!! TEST NOT RUN: it needs csi-driver-host-path's {BINARY}.\n!! {why}\n\
         !! Point {ASSETS_ENV} at a directory holding it. Under CI=true this is a failure.\n{bar}\n"
    );
}

/// A running driver; killed when dropped.
pub struct HostPath {
    child: Child,
    socket: PathBuf,
    state: PathBuf,
    log: Arc<Mutex<String>>,
}

impl Drop for HostPath {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HostPath {
    /// Starts the driver in `dir` and waits for its socket. It logs every
    /// gRPC call (`-v=5`): what [`HostPath::calls`] counts.
    pub async fn start(bin: &Path, dir: &Path) -> Result<HostPath> {
        let socket = dir.join("csi.sock");
        let state = dir.join("state");
        let mut child = Command::new(bin)
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .args(["--nodeid=node-1", "--drivername", DRIVER, "-v=5"])
            .arg(format!("--statedir={}", state.display()))
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
                if let Ok(mut l) = sink.lock() {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        let driver = HostPath {
            child,
            socket,
            state,
            log,
        };
        wait_for("the driver's socket", Duration::from_secs(10), || async {
            Ok(driver.socket.exists().then_some(()))
        })
        .await?;
        Ok(driver)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.log.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// How many calls of `method` (`ListVolumes`) it has logged.
    pub fn calls(&self, method: &str) -> usize {
        let call = format!("GRPC call: /csi.v1.Controller/{method}");
        self.log().lines().filter(|l| l.contains(&call)).count()
    }

    /// Creates a mounted-filesystem volume `name` of `bytes`; returns its id.
    pub async fn create_volume(&self, name: &str, bytes: i64) -> Result<String> {
        Ok(create_volume(&self.socket, name, bytes, Access::Mount)
            .await?
            .id)
    }

    /// The directory that holds the volume's data: gone, the driver calls
    /// the volume abnormal.
    pub fn volume_dir(&self, id: &str) -> PathBuf {
        self.state.join(id)
    }

    /// Takes the volume's directory away (the volume goes abnormal).
    pub fn break_volume(&self, id: &str) -> Result<()> {
        let dir = self.volume_dir(id);
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))
    }

    /// Gives it back, empty (the volume is healthy again).
    pub fn restore_volume(&self, id: &str) -> Result<()> {
        let dir = self.volume_dir(id);
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))
    }
}
