//! The project's CSI driver (`csi-loop-driver`, built by cargo with these
//! tests) as the controller's driver, a child process on a socket of its
//! own: its volumes created through CSI CreateVolume, made abnormal the way
//! the driver itself tells it (the volume's file gone) and healthy again
//! (the file back), and its gRPC calls counted from its own log. The
//! controller side needs no root: CreateVolume only makes a file.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use health_tests::csi_driver::client::DriverProcess;
use health_tests::csi_driver::requests::Access;
pub use health_tests::csi_driver::DEFAULT_DRIVER_NAME as DRIVER;

/// The binary cargo built for this test.
const BIN: &str = env!("CARGO_BIN_EXE_csi-loop-driver");

/// A running driver; killed when dropped.
pub struct LoopDriver {
    process: DriverProcess,
}

impl LoopDriver {
    /// Starts the driver in `dir` and waits for its socket.
    pub fn start(dir: &Path) -> Result<LoopDriver> {
        Ok(LoopDriver {
            process: DriverProcess::start(Path::new(BIN), dir, "node-1", &[])?,
        })
    }

    pub fn socket(&self) -> &Path {
        self.process.socket()
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        self.process.log()
    }

    /// How many calls of `method` (`ListVolumes`) it has answered.
    pub fn calls(&self, method: &str) -> usize {
        self.process.calls(method)
    }

    /// Creates a filesystem volume `name` of `bytes`; returns its id.
    pub async fn create_volume(&self, name: &str, bytes: i64) -> Result<String> {
        Ok(self
            .process
            .create_volume(name, bytes, Access::Mount)
            .await?
            .id)
    }

    /// The file that holds the volume's data: gone, the driver calls the
    /// volume abnormal.
    pub fn volume_file(&self, id: &str) -> PathBuf {
        self.process
            .state_dir()
            .join("data")
            .join(format!("{id}.img"))
    }

    fn away(&self, id: &str) -> PathBuf {
        self.volume_file(id).with_extension("away")
    }

    /// Takes the volume's file away, renamed (the volume goes abnormal).
    pub fn break_volume(&self, id: &str) -> Result<()> {
        let (file, away) = (self.volume_file(id), self.away(id));
        std::fs::rename(&file, &away)
            .with_context(|| format!("renaming {} to {}", file.display(), away.display()))
    }

    /// Gives it back (the volume is healthy again).
    pub fn restore_volume(&self, id: &str) -> Result<()> {
        let (file, away) = (self.volume_file(id), self.away(id));
        std::fs::rename(&away, &file)
            .with_context(|| format!("renaming {} to {}", away.display(), file.display()))
    }
}
