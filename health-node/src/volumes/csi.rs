//! CSI node health for pod volumes: which driver to ask about which volume,
//! and what its answer means for the condition machine.

use std::path::{Path, PathBuf};
use std::time::Duration;

use health_core::conditions::CsiReport;
use health_csi::{
    discover_node_sockets, CsiError, DriverOverride, DriverSet, HealthEntry, HealthSource,
    ProbeRequest, TimedProbe, Usage,
};
use serde::Serialize;

use super::storage::StorageOutcome;
use super::{IndexedVolume, VolumeKey};
use crate::volumes::kubelet::{VolumeKind, VolumeMode};

/// What the driver said about one volume, as the agent reports it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum CsiResult {
    /// The driver's complete list of adverse conditions (empty: healthy).
    Health {
        rpc: HealthSource,
        entries: Vec<HealthEntry>,
        usage: Option<Usage>,
    },
    /// The driver answered without health information (legacy stats without
    /// `volume_condition`): neither healthy nor unhealthy.
    NoHealthInfo {
        rpc: HealthSource,
        usage: Option<Usage>,
    },
    /// Not asked: the driver advertises no volume health capability
    /// (GET_VOLUME_HEALTH, or VOLUME_CONDITION with GET_VOLUME_STATS), so, as
    /// for the kubelet, there is nothing to ask. No health information.
    NotAdvertised,
    /// No answer about this volume: timeout, transport error, UNIMPLEMENTED
    /// from an RPC the driver advertises, no driver of that name. Never a
    /// recovery.
    ProbeFailed { error: String },
}

impl CsiResult {
    /// The condition machine's view of the answer.
    pub fn to_report(&self) -> CsiReport {
        match self {
            CsiResult::Health { entries, .. } => {
                CsiReport::Health(entries.iter().map(HealthEntry::to_evidence).collect())
            }
            CsiResult::NoHealthInfo { .. } | CsiResult::NotAdvertised => CsiReport::NoHealthInfo,
            CsiResult::ProbeFailed { error } => CsiReport::ProbeFailed(error.clone()),
        }
    }
}

/// One volume's CSI probe.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CsiOutcome {
    #[serde(skip)]
    pub key: VolumeKey,
    pub driver: String,
    /// The socket the driver was asked on, when one is known.
    pub socket: Option<PathBuf>,
    #[serde(flatten)]
    pub result: CsiResult,
    /// How long the driver took to answer this volume's RPC (for the latency
    /// histogram); zero when no RPC was made for it (unknown driver, skipped
    /// after a timeout, driver not answering at all). Not reported in JSON:
    /// it is about the agent's probing, not about the volume.
    #[serde(skip)]
    pub elapsed: Duration,
}

/// The node plugins of this node, by driver name.
#[derive(Debug)]
pub struct CsiProber {
    set: DriverSet,
    discovered: Vec<PathBuf>,
    overrides: Vec<DriverOverride>,
    timeout: Duration,
}

impl CsiProber {
    /// Finds the driver sockets under `kubelet_root` (plus `overrides`), asks
    /// each its name and capabilities, concurrently, each call bounded by
    /// `timeout`. Never fails: unusable sockets are remembered and named in
    /// the probe failures of their volumes.
    pub async fn connect(
        kubelet_root: Option<&Path>,
        overrides: &[DriverOverride],
        timeout: Duration,
    ) -> CsiProber {
        let discovered = match kubelet_root {
            Some(root) => discover_sockets(root).await,
            None => Vec::new(),
        };
        let set = DriverSet::build(&discovered, overrides, timeout).await;
        CsiProber {
            set,
            discovered,
            overrides: overrides.to_vec(),
            timeout,
        }
    }

    /// Re-reads the socket list and rebuilds the driver set when it changed
    /// or some socket was unusable last time (drivers come, go and restart).
    pub async fn refresh(&mut self, kubelet_root: Option<&Path>) {
        let discovered = match kubelet_root {
            Some(root) => discover_sockets(root).await,
            None => Vec::new(),
        };
        if discovered == self.discovered && self.set.failures().is_empty() {
            return;
        }
        self.set = DriverSet::build(&discovered, &self.overrides, self.timeout).await;
        self.discovered = discovered;
    }

    /// Driver names and sockets.
    pub fn drivers(&self) -> Vec<(String, PathBuf)> {
        self.set
            .drivers()
            .map(|(n, s)| (n.to_string(), s.to_path_buf()))
            .collect()
    }

    /// Asks each CSI volume's driver about it, as its advertised
    /// capabilities allow (re-read every round): NodeGetVolumeHealth with
    /// GET_VOLUME_HEALTH, NodeGetVolumeStats with VOLUME_CONDITION, nothing
    /// otherwise ([`CsiResult::NotAdvertised`]). Drivers are asked
    /// concurrently; a hung one delays only its own volumes, by at most one
    /// call timeout (the rest of its round is skipped). Volumes without a CSI
    /// driver (local PVs) are left out.
    pub async fn probe(&self, volumes: &[IndexedVolume]) -> Vec<CsiOutcome> {
        let mut keys = Vec::new();
        let mut requests = Vec::new();
        for v in volumes {
            let vol = &v.volume;
            let (Some(driver), Some(handle)) = (&vol.driver, &vol.volume_handle) else {
                continue;
            };
            if !matches!(vol.kind, VolumeKind::Csi | VolumeKind::CsiEphemeral) {
                continue;
            }
            keys.push(v.key.clone());
            requests.push(ProbeRequest {
                driver: driver.clone(),
                volume_id: handle.clone(),
                publish_path: publish_path(&vol.path, vol.volume_mode),
                staging_path: vol.staging_path.clone(),
            });
        }
        let answers = self.set.probe_all_timed(requests).await;
        keys.into_iter()
            .zip(answers)
            .map(|(key, probe)| {
                let TimedProbe {
                    request,
                    result: answer,
                    elapsed,
                } = probe;
                let socket = self
                    .set
                    .client(&request.driver)
                    .map(|c| c.socket().to_path_buf());
                let result = match answer {
                    Ok(report) => match report.entries {
                        Some(entries) => CsiResult::Health {
                            rpc: report.source,
                            entries,
                            usage: report.usage,
                        },
                        None => CsiResult::NoHealthInfo {
                            rpc: report.source,
                            usage: report.usage,
                        },
                    },
                    Err(CsiError::NotAdvertised { .. }) => CsiResult::NotAdvertised,
                    Err(e @ CsiError::UnknownDriver { .. }) => CsiResult::ProbeFailed {
                        error: self.unknown_driver(&e),
                    },
                    Err(e) => CsiResult::ProbeFailed {
                        error: e.to_string(),
                    },
                };
                CsiOutcome {
                    key,
                    driver: request.driver,
                    socket,
                    result,
                    elapsed,
                }
            })
            .collect()
    }

    /// Asks every driver of this node that advertises GET_STORAGE_HEALTH
    /// NodeGetStorageHealth, once each and concurrently, each call bounded
    /// by the call timeout. Every such driver is asked, also one without
    /// volumes here yet: a volume that appears later inherits its driver's
    /// last answer. The others are not asked
    /// ([`StorageResult::Unsupported`](super::storage::StorageResult::Unsupported)).
    pub async fn probe_storage(&self) -> Vec<StorageOutcome> {
        self.set
            .storage_health_all()
            .await
            .into_iter()
            .map(|probe| {
                let socket = self
                    .set
                    .client(&probe.driver)
                    .map(|c| c.socket().to_path_buf());
                StorageOutcome::from_probe(probe, socket)
            })
            .collect()
    }

    /// "No driver of that name", with the sockets that could not be asked
    /// their name: usually the driver is one of them.
    fn unknown_driver(&self, e: &CsiError) -> String {
        let failures = self.set.failures();
        if failures.is_empty() {
            return format!("{e} (no CSI socket answers to that name)");
        }
        let detail: Vec<String> = failures
            .iter()
            .map(|(socket, err)| format!("{}: {err}", socket.display()))
            .collect();
        format!("{e}; unusable CSI sockets: {}", detail.join("; "))
    }
}

async fn discover_sockets(root: &Path) -> Vec<PathBuf> {
    let root = root.to_path_buf();
    // Directory reads on the kubelet's own filesystem; off the async threads
    // all the same. A node without plugins/ has no drivers, which is not
    // worth the warning discovery gives for an unreadable directory.
    tokio::task::spawn_blocking(move || {
        if root.join("plugins").is_dir() {
            discover_node_sockets(&root)
        } else {
            Vec::new()
        }
    })
    .await
    .unwrap_or_default()
}

/// What CSI calls the volume path: the pod's mount for filesystem volumes;
/// for block volumes the publish path kubelet links the pod's device to
/// (reading a symlink does no I/O on the device).
fn publish_path(path: &Path, mode: VolumeMode) -> PathBuf {
    match mode {
        VolumeMode::Filesystem => path.to_path_buf(),
        VolumeMode::Block => match std::fs::read_link(path) {
            Ok(target) if target.is_absolute() => target,
            _ => path.to_path_buf(),
        },
    }
}
