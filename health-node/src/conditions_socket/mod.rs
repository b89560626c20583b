//! The agent's conditions per CSI volume, served on a local unix socket for
//! `health-agent csi-proxy` (`health_csi::proxy`), which merges them into
//! the driver's NodeGetVolumeHealth answers and so into the kubelet's
//! `pod.status.volumeHealth`.
//!
//! Why a socket and not the pinned maps: the conditions are the agent's
//! judgement (kernel errors through the quiet window, the built-in checks,
//! the stack), which lives in the running agent, not in the kernel's
//! counters; and a socket lets the proxy fail open in one place (no answer
//! in time: the driver's words alone).
//!
//! The agent loop hands every condition change to its reporter; [`Publishing`]
//! wraps the reporter and, on each change, rebuilds a [`Answers`]: per (driver,
//! volume handle), the union of the conditions of the pod volumes using it
//! that the agent itself found (kernel, checks). What the CSI driver said
//! (`csi-node`, `csi-storage`) is left out: the proxy has the driver's own
//! answer, and echoing it would count it twice. [`server`] answers from the
//! board; [`client`] is the proxy's side.
//!
//! The board also keeps, per driver, what the stack check found under its
//! volumes (paths down, a pool full, an array degraded, an NVMe critical
//! warning): the node's state of that driver's storage, which the proxy
//! answers the kubelet's NodeGetStorageHealth with (and so
//! `CSINode.status.storageHealth`).
//!
//! And it keeps every pod volume's conditions, all sources, for
//! `health-agent volumes` ([`pod_volumes`]): what the Events say, which a
//! fresh process cannot always judge alone.
//!
//! The protocol is HTTP/1.1 with JSON, so that `curl --unix-socket` can ask
//! it too: `POST /v1/volume-conditions` with [`Question`], and `POST
//! /v1/storage-conditions` with [`StorageQuestion`], each answered with
//! [`Answer`]; `POST /v1/pod-volume-conditions` with
//! [`PodVolumesQuestion`], answered with [`PodVolumesAnswer`].

mod client;
pub mod pod_volumes;
mod server;
pub mod volumes_command;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use health_common::CounterKey;
use health_core::conditions::{CheckKind, Condition, Source, Status};
use health_kernel::clock::Clock;
use health_kernel::collector::{KernelError, KernelStats};
use health_topology::{InputErrors, Topology};
use serde::{Deserialize, Serialize};

pub use client::{AgentSocket, AskError};
pub use pod_volumes::{PodVolumesAnswer, PodVolumesQuestion, POD_VOLUMES_PATH};
pub use server::{bind_fresh, serve, ServeError, Served};

use crate::report::Reporter;
use crate::volumes::{Handled, LiveVolumes, VolumeIndex, VolumeKey};

/// Where the proxy asks about one volume.
pub const PATH: &str = "/v1/volume-conditions";
/// Where the proxy asks about a driver's storage on this node.
pub const STORAGE_PATH: &str = "/v1/storage-conditions";

/// Where the agent serves it and the proxy asks, unless told otherwise: a
/// host directory both pods mount (deploy/components/csi-proxy).
pub const DEFAULT_SOCKET: &str = "/run/volume-health/conditions.sock";

/// What the proxy asks: one volume of one driver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Question {
    /// The driver's name; `None`: any driver's volume with this handle.
    pub driver: Option<String>,
    /// The CSI volume id (the PV's `spec.csi.volumeHandle`).
    pub volume_handle: String,
}

/// What the proxy asks for NodeGetStorageHealth: one driver's storage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageQuestion {
    /// The driver's name; `None`: every driver's storage on this node.
    pub driver: Option<String>,
}

/// The agent's conditions of that volume (or that storage), worst first;
/// empty when it knows nothing adverse (or does not know the volume).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub conditions: Vec<AnsweredCondition>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AnsweredCondition {
    pub status: Status,
    pub reason: String,
    pub message: String,
    /// Who in the agent says so: `kernel`, `check/read-only`, ...
    pub source: String,
}

/// (driver, volume handle) → the agent's conditions of that volume.
type ByVolume = BTreeMap<(String, String), Vec<AnsweredCondition>>;
/// driver → what the stack check found under its volumes on this node.
type ByDriver = BTreeMap<String, Vec<AnsweredCondition>>;

/// The agent's current conditions per (driver, volume handle), and per
/// driver its storage's. Cheap to clone; clones share one state.
#[derive(Clone, Debug, Default)]
pub struct Answers {
    volumes: Arc<RwLock<ByVolume>>,
    storage: Arc<RwLock<ByDriver>>,
    pod_volumes: Arc<RwLock<pod_volumes::ByPodVolume>>,
}

impl Answers {
    /// The conditions for `question`: of that driver's volume, or of every
    /// driver's volume with that handle when the driver is not named.
    pub fn answer(&self, question: &Question) -> Answer {
        let volumes = self.volumes.read().unwrap_or_else(|p| p.into_inner());
        let found = volumes
            .iter()
            .filter(|((driver, handle), _)| {
                *handle == question.volume_handle
                    && question.driver.as_ref().is_none_or(|d| d == driver)
            })
            .flat_map(|(_, conditions)| conditions.iter().cloned());
        Answer {
            conditions: union(found),
        }
    }

    /// The stack findings under `question`'s driver's volumes (every
    /// driver's when it is not named): one entry per distinct finding,
    /// worst first.
    pub fn answer_storage(&self, question: &StorageQuestion) -> Answer {
        let storage = self.storage.read().unwrap_or_else(|p| p.into_inner());
        let found = storage
            .iter()
            .filter(|(driver, _)| question.driver.as_ref().is_none_or(|d| d == *driver))
            .flat_map(|(_, conditions)| conditions.iter().cloned());
        Answer {
            conditions: distinct(found),
        }
    }

    /// Every pod volume's conditions the agent holds.
    pub fn answer_pod_volumes(&self) -> PodVolumesAnswer {
        let board = self.pod_volumes.read().unwrap_or_else(|p| p.into_inner());
        pod_volumes::answer(&board)
    }

    /// Rebuilds the pod-volume part of the board (what `volumes` asks).
    pub fn publish_pod_volumes(&self, volumes: &LiveVolumes) {
        self.set_pod_volumes(volumes.index().volumes().iter().map(|v| {
            let conditions = volumes
                .health(&v.key)
                .map(|h| h.conditions())
                .unwrap_or_default();
            (&v.key, conditions)
        }));
    }

    /// Replaces the pod-volume part of the board: (volume, its conditions)
    /// each, every source kept.
    pub fn set_pod_volumes<'a>(
        &self,
        volumes: impl IntoIterator<Item = (&'a crate::volumes::VolumeKey, Vec<Condition>)>,
    ) {
        let board = pod_volumes::by_pod_volume(volumes);
        *self.pod_volumes.write().unwrap_or_else(|p| p.into_inner()) = board;
    }

    /// Rebuilds the board from the volumes' current conditions.
    pub fn publish(&self, volumes: &LiveVolumes) {
        self.publish_pod_volumes(volumes);
        self.set(volumes.index().volumes().iter().map(|v| {
            let conditions = volumes
                .health(&v.key)
                .map(|h| h.conditions())
                .unwrap_or_default();
            (
                v.volume.driver.as_deref(),
                v.volume.volume_handle.as_deref(),
                conditions,
            )
        }));
    }

    /// Replaces the board with these pod volumes': (driver, volume handle,
    /// conditions) each; volumes without a driver or handle (not CSI) are
    /// left out, and so are conditions the agent did not find itself.
    pub fn set<'a>(
        &self,
        volumes: impl IntoIterator<Item = (Option<&'a str>, Option<&'a str>, Vec<Condition>)>,
    ) {
        let mut by_volume = ByVolume::new();
        let mut by_driver = ByDriver::new();
        for (driver, handle, conditions) in volumes {
            let (Some(driver), Some(handle)) = (driver, handle) else {
                continue;
            };
            let own: Vec<Condition> = conditions.into_iter().filter(is_agents_own).collect();
            by_driver.entry(driver.to_string()).or_default().extend(
                own.iter()
                    .filter(|c| is_stack_state(c))
                    .cloned()
                    .map(answered),
            );
            let found = own.into_iter().map(answered);
            by_volume
                .entry((driver.to_string(), handle.to_string()))
                .or_default()
                .extend(found);
        }
        by_volume.retain(|_, conditions| !conditions.is_empty());
        for conditions in by_volume.values_mut() {
            *conditions = union(std::mem::take(conditions));
        }
        by_driver.retain(|_, conditions| !conditions.is_empty());
        for conditions in by_driver.values_mut() {
            *conditions = distinct(std::mem::take(conditions));
        }
        *self.volumes.write().unwrap_or_else(|p| p.into_inner()) = by_volume;
        *self.storage.write().unwrap_or_else(|p| p.into_inner()) = by_driver;
    }
}

/// Conditions the agent found itself (kernel, checks), not what a CSI
/// driver or the controller said.
fn is_agents_own(c: &Condition) -> bool {
    matches!(c.source, Source::Kernel | Source::Check(_))
}

fn answered(c: Condition) -> AnsweredCondition {
    AnsweredCondition {
        status: c.status,
        source: c.source.to_string(),
        reason: c.reason,
        message: c.message,
    }
}

/// What the stack check finds: the node's state of a driver's storage.
fn is_stack_state(c: &Condition) -> bool {
    c.source == Source::Check(CheckKind::Stack)
}

/// One condition per finding (status, reason and message): two volumes on
/// one multipath map say it once, two maps each say theirs; worst first.
fn distinct(conditions: impl IntoIterator<Item = AnsweredCondition>) -> Vec<AnsweredCondition> {
    let mut out: Vec<AnsweredCondition> = conditions.into_iter().collect();
    out.sort_by(|a, b| (a.status, &a.reason, &a.message).cmp(&(b.status, &b.reason, &b.message)));
    out.dedup_by(|a, b| (a.status, &a.reason, &a.message) == (b.status, &b.reason, &b.message));
    out
}

/// One condition per (status, reason), the first one met; worst first.
fn union(conditions: impl IntoIterator<Item = AnsweredCondition>) -> Vec<AnsweredCondition> {
    let mut out: Vec<AnsweredCondition> = Vec::new();
    for c in conditions {
        if !out
            .iter()
            .any(|o| o.status == c.status && o.reason == c.reason)
        {
            out.push(c);
        }
    }
    out.sort_by(|a, b| (a.status, &a.reason).cmp(&(b.status, &b.reason)));
    out
}

/// A reporter that also keeps a [`Answers`] current: every call goes to the
/// inner reporter, and each batch of changes rebuilds the board.
pub struct Publishing<R> {
    inner: R,
    board: Option<Answers>,
}

impl<R> Publishing<R> {
    /// `answers`: `None` publishes nothing (no socket asked for).
    pub fn new(inner: R, board: Option<Answers>) -> Self {
        Publishing { inner, board }
    }
}

impl<R: Reporter> Reporter for Publishing<R> {
    type Wake = R::Wake;

    fn ready(&mut self, active: usize, volumes: Option<&LiveVolumes>) {
        self.inner.ready(active, volumes);
    }

    fn errors(
        &mut self,
        batch: &[KernelError],
        topo: &Topology,
        clock: &Clock,
        volumes: Option<&VolumeIndex>,
    ) -> anyhow::Result<()> {
        self.inner.errors(batch, topo, clock, volumes)
    }

    fn changes(&mut self, handled: &Handled, gone: &[VolumeKey], volumes: &LiveVolumes) {
        self.inner.changes(handled, gone, volumes);
        // The CSI part rebuilt only when a CSI volume's conditions changed
        // (or a volume went): an error flood on a local PV, or a CSI round
        // that changed nothing, costs it nothing. The pod-volume part
        // follows every change (one entry per volume with a condition).
        let csi_changed = || {
            handled.changes.iter().any(|c| {
                volumes
                    .index()
                    .get(&c.key)
                    .is_some_and(|v| v.volume.driver.is_some() && v.volume.volume_handle.is_some())
            })
        };
        if let Some(board) = &self.board {
            if !gone.is_empty() || csi_changed() {
                board.publish(volumes);
            } else if !handled.changes.is_empty() {
                board.publish_pod_volumes(volumes);
            }
        }
    }

    fn kernel_stats(&mut self, stats: &KernelStats) {
        self.inner.kernel_stats(stats);
    }

    fn storage_classes(&self) -> Option<&dyn crate::volumes::latency::StorageClasses> {
        self.inner.storage_classes()
    }

    fn pod_names(&self) -> Option<&dyn crate::volumes::waiters::PodNames> {
        self.inner.pod_names()
    }

    fn input_errors(&mut self, errors: &InputErrors) {
        self.inner.input_errors(errors);
    }

    fn totals(
        &mut self,
        totals: &BTreeMap<CounterKey, u64>,
        topo: &Topology,
    ) -> anyhow::Result<()> {
        self.inner.totals(totals, topo)
    }

    async fn wake(&mut self) -> Self::Wake {
        self.inner.wake().await
    }

    fn handle(&mut self, wake: Self::Wake, volumes: Option<&LiveVolumes>) {
        self.inner.handle(wake, volumes);
    }

    fn finish(
        &mut self,
        totals: &BTreeMap<CounterKey, u64>,
        topo: &Topology,
        stats: &KernelStats,
    ) -> anyhow::Result<()> {
        self.inner.finish(totals, topo, stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(status: Status, reason: &str, source: &str) -> AnsweredCondition {
        AnsweredCondition {
            status,
            reason: reason.into(),
            message: format!("{reason} from {source}"),
            source: source.into(),
        }
    }

    fn board(entries: Vec<((&str, &str), Vec<AnsweredCondition>)>) -> Answers {
        let b = Answers::default();
        *b.volumes.write().unwrap() = entries
            .into_iter()
            .map(|((d, h), c)| ((d.to_string(), h.to_string()), c))
            .collect();
        b
    }

    fn ask(driver: Option<&str>, handle: &str) -> Question {
        Question {
            driver: driver.map(str::to_string),
            volume_handle: handle.into(),
        }
    }

    #[test]
    fn answers_by_driver_and_handle_or_by_handle_alone() {
        let b = board(vec![
            (
                ("a.csi", "vol-1"),
                vec![c(Status::Degraded, "CapacityLow", "check/capacity")],
            ),
            (
                ("b.csi", "vol-1"),
                vec![c(Status::DataLoss, "BlockIOErrors", "kernel")],
            ),
            (
                ("a.csi", "vol-2"),
                vec![c(Status::Inaccessible, "MountGone", "check/mount")],
            ),
        ]);
        assert_eq!(
            b.answer(&ask(Some("a.csi"), "vol-1")).conditions,
            [c(Status::Degraded, "CapacityLow", "check/capacity")]
        );
        assert_eq!(
            b.answer(&ask(None, "vol-1")).conditions,
            [
                c(Status::DataLoss, "BlockIOErrors", "kernel"),
                c(Status::Degraded, "CapacityLow", "check/capacity"),
            ]
        );
        assert_eq!(b.answer(&ask(Some("c.csi"), "vol-1")), Answer::default());
        assert_eq!(b.answer(&ask(Some("a.csi"), "vol-3")), Answer::default());
    }

    #[test]
    fn the_union_keeps_the_first_of_each_status_and_reason_worst_first() {
        let got = union([
            c(Status::Degraded, "B", "kernel"),
            c(Status::DataLoss, "A", "kernel"),
            c(Status::Degraded, "B", "check/stack"),
            c(Status::Degraded, "A", "check/stack"),
        ]);
        assert_eq!(
            got,
            [
                c(Status::DataLoss, "A", "kernel"),
                c(Status::Degraded, "A", "check/stack"),
                c(Status::Degraded, "B", "kernel"),
            ]
        );
    }

    fn condition(source: Source, status: Status, reason: &str) -> Condition {
        let t = std::time::UNIX_EPOCH;
        Condition {
            source,
            status,
            reason: reason.into(),
            message: format!("{reason} said"),
            since: t,
            last_probe: t,
            occurrences: None,
        }
    }

    #[test]
    fn the_board_holds_the_agents_own_conditions_per_csi_volume() {
        let b = Answers::default();
        let pod_a = vec![
            condition(Source::Kernel, Status::DataLoss, "BlockIOErrors"),
            condition(Source::CsiNode, Status::Degraded, "DriverSaid"),
            condition(Source::CsiStorage, Status::Inaccessible, "BackendGone"),
        ];
        // The same PV in a second pod: its check adds, its kernel
        // condition is the same one.
        let pod_b = vec![
            condition(Source::Kernel, Status::DataLoss, "BlockIOErrors"),
            condition(
                Source::Check(CheckKind::ReadOnly),
                Status::Inaccessible,
                "ReadOnlyRemount",
            ),
        ];
        let only_csi = vec![condition(Source::CsiNode, Status::Degraded, "DriverSaid")];
        let local = vec![condition(Source::Kernel, Status::DataLoss, "BlockIOErrors")];
        b.set([
            (Some("d.csi"), Some("vol-1"), pod_a),
            (Some("d.csi"), Some("vol-1"), pod_b),
            (Some("d.csi"), Some("vol-2"), only_csi),
            (None, None, local),
        ]);
        let held = b.volumes.read().unwrap().clone();
        let own = |source: &str, status, reason: &str| AnsweredCondition {
            status,
            reason: reason.into(),
            message: format!("{reason} said"),
            source: source.into(),
        };
        assert_eq!(
            held,
            BTreeMap::from([(
                ("d.csi".to_string(), "vol-1".to_string()),
                vec![
                    own("check/read-only", Status::Inaccessible, "ReadOnlyRemount"),
                    own("kernel", Status::DataLoss, "BlockIOErrors"),
                ]
            )])
        );
        // A later round replaces the board whole.
        b.set([(Some("d.csi"), Some("vol-1"), Vec::new())]);
        assert!(b.volumes.read().unwrap().is_empty());
    }

    #[test]
    fn the_board_keeps_each_drivers_stack_findings_once() {
        let stack = |status, reason: &str, message: &str| Condition {
            message: message.into(),
            ..condition(Source::Check(CheckKind::Stack), status, reason)
        };
        let b = Answers::default();
        // Two volumes on one multipath map, a third on another, and a
        // driver whose volumes' stacks are fine.
        b.set([
            (
                Some("d.csi"),
                Some("vol-1"),
                vec![
                    stack(Status::Degraded, "PathsDown", "dm-3: 1 of 2 paths down"),
                    condition(Source::Kernel, Status::DataLoss, "BlockIOErrors"),
                ],
            ),
            (
                Some("d.csi"),
                Some("vol-2"),
                vec![stack(
                    Status::Degraded,
                    "PathsDown",
                    "dm-3: 1 of 2 paths down",
                )],
            ),
            (
                Some("d.csi"),
                Some("vol-3"),
                vec![stack(
                    Status::Inaccessible,
                    "AllPathsDown",
                    "dm-5: no path up",
                )],
            ),
            (
                Some("e.csi"),
                Some("vol-9"),
                vec![condition(Source::Kernel, Status::DataLoss, "BlockIOErrors")],
            ),
        ]);
        let own = |status, reason: &str, message: &str| AnsweredCondition {
            status,
            reason: reason.into(),
            message: message.into(),
            source: "check/stack".into(),
        };
        let d = b.answer_storage(&StorageQuestion {
            driver: Some("d.csi".into()),
        });
        assert_eq!(
            d.conditions,
            [
                own(Status::Inaccessible, "AllPathsDown", "dm-5: no path up"),
                own(Status::Degraded, "PathsDown", "dm-3: 1 of 2 paths down"),
            ]
        );
        let e = b.answer_storage(&StorageQuestion {
            driver: Some("e.csi".into()),
        });
        assert_eq!(e, Answer::default());
        let all = b.answer_storage(&StorageQuestion { driver: None });
        assert_eq!(all, d);
        // Repaired: the next round says nothing.
        b.set([(Some("d.csi"), Some("vol-3"), Vec::new())]);
        assert_eq!(
            b.answer_storage(&StorageQuestion { driver: None }),
            Answer::default()
        );
    }

    #[test]
    fn the_wire_shape_is_camel_case_json() {
        let q: Question =
            serde_json::from_str(r#"{"driver":null,"volumeHandle":"vol-1"}"#).unwrap();
        assert_eq!(q, ask(None, "vol-1"));
        let a = Answer {
            conditions: vec![c(Status::DataLoss, "BlockIOErrors", "kernel")],
        };
        assert_eq!(
            serde_json::to_string(&a).unwrap(),
            r#"{"conditions":[{"status":"DataLoss","reason":"BlockIOErrors","message":"BlockIOErrors from kernel","source":"kernel"}]}"#
        );
    }
}
