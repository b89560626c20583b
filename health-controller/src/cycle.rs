//! One poll of the CSI controller service: every monitored PV gets exactly
//! one observation per cycle.
//!
//! What is called follows the driver's advertised capabilities, as
//! external-health-monitor decides it
//! ([`ControllerCapabilities::list_health_rpc`] and
//! [`ControllerCapabilities::get_health_rpc`]):
//!
//! List mode (preferred, one walk for all volumes), for drivers advertising
//! LIST_VOLUME_HEALTH (CSI 1.13 ControllerListVolumeHealth) or LIST_VOLUMES
//! with VOLUME_CONDITION (legacy ListVolumes): walked in pages of
//! `--list-page-size` up to a page limit. A volume on a page is `Listed`; a
//! volume on no page is `Absent` only if the walk completed (the condition
//! machine clears after two such cycles), and `CycleFailed` otherwise; a
//! failed walk (UNIMPLEMENTED despite the capability included) is
//! `CycleFailed` for all.
//!
//! Get mode, for drivers with no health list but GET_VOLUME_HEALTH (CSI 1.13
//! ControllerGetVolumeHealth) or GET_VOLUME with VOLUME_CONDITION (legacy
//! ControllerGetVolume), or whose legacy list turns out to carry no
//! condition: one call per volume handle, once per cycle, a bounded number
//! at a time. Every call is bounded by the client's call timeout
//! (`--call-timeout`).
//!
//! Off, for drivers advertising none of these: no CSI call at all, and every
//! volume is told "no health information" each cycle (which neither raises
//! nor clears a condition).

use std::collections::BTreeMap;

use futures_util::stream::{self, StreamExt as _};
use health_core::conditions::{CsiEntry, CsiListSighting, CsiReport, Observation, Status};
use health_csi::{
    ControllerCapabilities, ControllerClient, ControllerHealthSource, CsiError, HealthEntry,
};

use super::inventory::MonitoredVolume;
use super::metrics::{ControllerMetrics, CycleResult};

/// Reason of the condition raised when the driver answers a Get with
/// NOT_FOUND for a volume a PV still names.
pub const VOLUME_NOT_FOUND: &str = "VolumeNotFound";

#[derive(Clone, Debug)]
pub struct CycleConfig {
    /// `max_entries` of each list page.
    pub page_size: u32,
    /// Pages walked at most per cycle (a driver whose token chain never
    /// ends cannot hold a cycle forever).
    pub max_pages: u32,
    /// Per-volume Gets in flight at once.
    pub get_concurrency: usize,
}

/// How the driver is asked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    List,
    Get,
    /// The driver advertises no controller health capability: not asked.
    Off,
}

/// What one cycle learnt.
#[derive(Debug)]
pub struct Probed {
    /// One per monitored volume, in the order given (`observations[i]` is
    /// what was learnt of `volumes[i]`).
    pub observations: Vec<Observation>,
    pub result: CycleResult,
}

/// Polls one driver's controller service, in the mode its capabilities
/// allow.
pub struct Prober {
    csi: ControllerClient,
    caps: ControllerCapabilities,
    config: CycleConfig,
    mode: Mode,
}

impl Prober {
    /// `caps` are the driver's advertised capabilities (the same the client
    /// decides its calls by).
    pub fn new(csi: ControllerClient, caps: ControllerCapabilities, config: CycleConfig) -> Self {
        let mode = if caps.list_health_rpc().is_some() {
            Mode::List
        } else if caps.get_health_rpc().is_some() {
            Mode::Get
        } else {
            tracing::info!(
                ?caps,
                "the CSI driver advertises no controller volume health capability \
                 (LIST_VOLUME_HEALTH, GET_VOLUME_HEALTH, or VOLUME_CONDITION with \
                 LIST_VOLUMES or GET_VOLUME): no controller-side health calls"
            );
            Mode::Off
        };
        Prober {
            csi,
            caps,
            config,
            mode,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// One cycle over `volumes`.
    pub async fn cycle(
        &mut self,
        volumes: &[MonitoredVolume],
        metrics: &ControllerMetrics,
    ) -> Probed {
        if self.mode == Mode::List {
            if let Some(probed) = self.list_cycle(volumes, metrics).await {
                return probed;
            }
        }
        match self.mode {
            Mode::Off => not_asked(volumes),
            _ => self.get_cycle(volumes, metrics).await,
        }
    }

    /// Leaves List mode for good: Get when the driver offers a health Get,
    /// otherwise Off.
    fn leave_list(&mut self, why: &str) {
        self.mode = if self.caps.get_health_rpc().is_some() {
            tracing::info!("{why}; asking each volume's health from now on");
            Mode::Get
        } else {
            tracing::info!("{why}, and the driver offers no health Get: no controller-side health calls from now on");
            Mode::Off
        };
    }

    /// `None` when it turns out no list carries health (then Get or Off).
    async fn list_cycle(
        &mut self,
        volumes: &[MonitoredVolume],
        metrics: &ControllerMetrics,
    ) -> Option<Probed> {
        let walk = self
            .csi
            .list_volume_health(self.config.page_size, self.config.max_pages)
            .await;
        let list = match walk {
            Ok(list) => list,
            // An advertised list answering UNIMPLEMENTED lands here too: a
            // driver fault, and a failed cycle every time, never a recovery.
            Err(e) => {
                metrics.csi_calls(rpc_of(&e), &code_of(&e), 1);
                tracing::warn!("listing volume health failed: {e}");
                let why = e.to_string();
                let observations = volumes
                    .iter()
                    .map(|_| {
                        let failed = CsiListSighting::CycleFailed(why.clone());
                        Observation::CsiControllerList(failed)
                    })
                    .collect();
                return Some(Probed {
                    observations,
                    result: CycleResult::Failed,
                });
            }
        };
        metrics.csi_calls(source_name(list.source), "OK", u64::from(list.pages));
        if list.source == ControllerHealthSource::ListVolumes
            && list.volumes.values().any(Option::is_none)
        {
            self.leave_list("the driver's ListVolumes carries no volume condition");
            return None;
        }
        let mut observations = Vec::with_capacity(volumes.len());
        for v in volumes {
            let sighting = match list.volumes.get(&*v.handle) {
                Some(Some(entries)) => {
                    CsiListSighting::Listed(entries.iter().map(HealthEntry::to_evidence).collect())
                }
                _ if list.complete => CsiListSighting::Absent,
                _ => CsiListSighting::CycleFailed(format!(
                    "the list stopped after {} pages without reaching its end",
                    list.pages
                )),
            };
            observations.push(Observation::CsiControllerList(sighting));
        }
        let result = if list.complete {
            CycleResult::Complete
        } else {
            CycleResult::Partial
        };
        Some(Probed {
            observations,
            result,
        })
    }

    async fn get_cycle(&self, volumes: &[MonitoredVolume], metrics: &ControllerMetrics) -> Probed {
        // Two PVs may name one handle: the driver is asked once.
        let mut handles: Vec<&str> = volumes.iter().map(|v| &*v.handle).collect();
        handles.sort_unstable();
        handles.dedup();
        let csi = &self.csi;
        let answers: BTreeMap<&str, CsiReport> = stream::iter(handles)
            .map(|handle| async move { (handle, get_one(csi, handle, metrics).await) })
            .buffer_unordered(self.config.get_concurrency.max(1))
            .collect()
            .await;
        let failed = answers
            .values()
            .filter(|r| matches!(r, CsiReport::ProbeFailed(_)))
            .count();
        let result = match failed {
            0 => CycleResult::Complete,
            n if n == answers.len() => CycleResult::Failed,
            _ => CycleResult::Partial,
        };
        let observations = volumes
            .iter()
            .map(|v| {
                let report = answers
                    .get(&*v.handle)
                    .cloned()
                    .unwrap_or_else(|| CsiReport::ProbeFailed("not asked".into()));
                Observation::CsiControllerGet(report)
            })
            .collect();
        Probed {
            observations,
            result,
        }
    }
}

/// Off mode's cycle: every volume learns that nothing is known.
fn not_asked(volumes: &[MonitoredVolume]) -> Probed {
    Probed {
        observations: volumes
            .iter()
            .map(|_| Observation::CsiControllerGet(CsiReport::NoHealthInfo))
            .collect(),
        result: CycleResult::Complete,
    }
}

async fn get_one(csi: &ControllerClient, handle: &str, metrics: &ControllerMetrics) -> CsiReport {
    match csi.get_volume_health(handle).await {
        Ok(report) => {
            metrics.csi_calls(source_name(report.source), "OK", 1);
            match report.entries {
                Some(entries) => {
                    CsiReport::Health(entries.iter().map(HealthEntry::to_evidence).collect())
                }
                None => CsiReport::NoHealthInfo,
            }
        }
        Err(e) => {
            metrics.csi_calls(rpc_of(&e), &code_of(&e), 1);
            match e {
                // An answer, not a failed probe: the PV names a volume the
                // driver does not have.
                CsiError::VolumeGone { .. } => CsiReport::Health(vec![CsiEntry {
                    status: Status::Inaccessible,
                    reason: VOLUME_NOT_FOUND.to_string(),
                    message: format!("the CSI driver does not know volume {handle}"),
                }]),
                e => {
                    tracing::debug!(handle, "volume health probe failed: {e}");
                    CsiReport::ProbeFailed(e.to_string())
                }
            }
        }
    }
}

/// Health entries of the driver in the condition machine's words.
pub fn entries(list: &[HealthEntry]) -> Vec<CsiEntry> {
    list.iter().map(HealthEntry::to_evidence).collect()
}

fn source_name(source: ControllerHealthSource) -> &'static str {
    match source {
        ControllerHealthSource::ControllerGetVolumeHealth => "ControllerGetVolumeHealth",
        ControllerHealthSource::ControllerGetVolume => "ControllerGetVolume",
        ControllerHealthSource::ControllerListVolumeHealth => "ControllerListVolumeHealth",
        ControllerHealthSource::ListVolumes => "ListVolumes",
    }
}

fn rpc_of(e: &CsiError) -> &'static str {
    match e {
        CsiError::Timeout { rpc, .. }
        | CsiError::Unsupported { rpc }
        | CsiError::NotAdvertised { rpc, .. }
        | CsiError::VolumeGone { rpc, .. }
        | CsiError::Status { rpc, .. }
        | CsiError::InvalidResponse { rpc, .. } => rpc,
        _ => "connect",
    }
}

fn code_of(e: &CsiError) -> String {
    match e {
        CsiError::Timeout { .. } => "Timeout".into(),
        CsiError::Connect { .. } => "Connect".into(),
        CsiError::Unsupported { .. } => "Unimplemented".into(),
        CsiError::NotAdvertised { .. } => "NotAdvertised".into(),
        CsiError::VolumeGone { .. } => "NotFound".into(),
        // tonic's code names (`Unavailable`, `Internal`...).
        CsiError::Status { code, .. } => format!("{code:?}"),
        CsiError::InvalidResponse { .. } => "InvalidResponse".into(),
        _ => "Error".into(),
    }
}
