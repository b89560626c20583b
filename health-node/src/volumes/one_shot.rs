//! `health-agent volumes`: a one-shot view of every pod volume on this node
//! and its conditions.
//!
//! Discovery, device resolution, the built-in checks and the CSI probes run
//! once; checks and CSI run concurrently, each call bounded by the timeout,
//! so a hung path or driver costs at most about three timeouts (CSI: name
//! and capabilities, then one health call) and delays nothing else.
//!
//! Kernel evidence comes from the counters the agent keeps pinned
//! ([`health_kernel::pinned`]): per volume, the errors of each kind with
//! their first and last time, fed through the same condition code `watch`
//! and `run` use, so the three agree. ext4's own error record
//! ([`super::ext4_error_evidence`]) adds what happened before any agent ran.
//!
//! The JSON is an array with one object per pod volume, sorted by pod uid and
//! volume name; docs/reference/json-schema.md documents each field.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use health_core::conditions::{
    errno_name, rfc3339, CheckResult, Condition, ConditionConfig, KernelErrors, Status,
};
use health_core::dev::Dev;
use health_csi::DriverOverride;
use health_kernel::clock::Clock;
use health_kernel::collector::KernelError;
pub use health_kernel::pinned::KernelEvidence;
use health_topology::stack::{Layer, LayerState, PoolState};
use health_topology::{HostPaths, MountEntry, Topology, TopologyError};
use serde::Serialize;

use super::{
    run_checks, CsiOutcome, CsiProber, CsiResult, Ext4Errors, StorageOutcome, StorageResult,
    VolumeIndex, VolumeMonitor,
};
use crate::volumes::checks::stack::{judge_volumes, read_stacks, stack_reader, volume_devices};
use crate::volumes::checks::{CheckConfig, CheckReport, Checker};
use crate::volumes::kubelet::{self, VolumeKind, VolumeMode};

#[derive(Clone, Debug)]
pub struct ViewOptions {
    pub host: HostPaths,
    pub kubelet_root: PathBuf,
    /// Timeout and thresholds of the checks; the timeout also bounds each
    /// CSI call.
    pub check: CheckConfig,
    pub csi_overrides: Vec<DriverOverride>,
    /// Where the agent pins its kernel state (its counters are read there).
    pub pin_root: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    // The cause is the source (printed after this by anyhow's `{:#}`), not
    // part of the message: both would print it twice.
    #[error("reading the device topology")]
    Topology(#[from] TopologyError),
    #[error("a discovery thread failed")]
    Join(#[from] tokio::task::JoinError),
}

/// One condition as `volumes` prints it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ConditionView {
    pub status: Status,
    pub reason: String,
    pub message: String,
    /// RFC 3339: when this (status, reason) became true.
    pub since: String,
    /// RFC 3339: when evidence last confirmed it.
    pub last_probe: String,
    /// Who said so: `check/read-only`, `csi-node`, `ext4-superblock`, ...
    pub source: String,
}

/// Whose conditions a [`VolumeView`] holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConditionsFrom {
    /// The agent running on this node: what its Events say.
    Agent,
    /// This command alone (no agent answered).
    Command,
}

/// A probe that could not tell: not a condition, and not health either.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProbeFailure {
    pub source: String,
    pub error: String,
}

/// Kernel errors of one kind on one device of a volume, as counted by the
/// agent's programs since they were loaded.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct KernelErrorView {
    /// The condition reason this kind raises (`BlockIOErrors`, ...).
    pub reason: String,
    pub status: Status,
    pub count: u64,
    /// RFC 3339: the first and the last of these errors.
    pub first: String,
    pub last: String,
    pub device: Option<Dev>,
    pub device_name: Option<String>,
    pub op: Option<String>,
    /// Positive errno, null where the source has none.
    pub errno: Option<i32>,
}

/// One pod volume.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct VolumeView {
    pub pod_uid: String,
    /// Null for inline ephemeral volumes.
    pub pv: Option<String>,
    /// The directory name kubelet uses under the pod (the PV name, or the
    /// pod's volume name for inline ephemeral volumes).
    pub name: String,
    pub driver: Option<String>,
    pub volume_handle: Option<String>,
    pub volume_mode: VolumeMode,
    pub kind: VolumeKind,
    /// The pod's mount point (filesystem) or device path (block).
    pub path: PathBuf,
    pub staging_path: Option<PathBuf>,
    /// MAJ:MIN of the filesystem (filesystem mode) or the device node (block).
    pub device: Option<Dev>,
    /// Kernel name of `device`, when it is a block device.
    pub disk: Option<String>,
    /// Where the volume is mounted (the pod's path), null when it is not
    /// mounted or a block volume.
    pub mount: Option<PathBuf>,
    pub fs_type: Option<String>,
    /// The worst condition's status, null when there is none.
    pub worst: Option<Status>,
    /// Worst first.
    pub conditions: Vec<ConditionView>,
    /// Whose conditions these are: the agent running on this node, or this
    /// command's own judgement when none answered
    /// ([`crate::conditions_socket::volumes_command`]).
    pub conditions_from: ConditionsFrom,
    pub probe_failures: Vec<ProbeFailure>,
    /// The CSI node plugin's answer; null for volumes without a CSI driver.
    pub csi: Option<CsiOutcome>,
    /// The volume's driver's NodeGetStorageHealth answer, complete (the
    /// `csi-storage` conditions hold the entries that concern this volume);
    /// null when no driver of that name answers on this node, and for local
    /// PVs.
    pub csi_storage: Option<StorageOutcome>,
    /// What the agent's kernel counters hold for this volume (empty when
    /// nothing is pinned; the command says so).
    pub kernel_errors: Vec<KernelErrorView>,
    /// The layers under each device of the volume, top first, with their
    /// state (paths, pool usage, array members, disk state).
    pub stack: Vec<Layer>,
}

/// Discovers, resolves, checks and probes every pod volume once, and reads
/// the kernel evidence the agent holds.
pub async fn collect(opts: &ViewOptions) -> Result<(Vec<VolumeView>, KernelEvidence), ViewError> {
    let host = opts.host.clone();
    let root = opts.kubelet_root.clone();
    // Blocking file I/O, none of it on the volumes themselves.
    let pin_root = opts.pin_root.clone();
    let (topo, index) = tokio::task::spawn_blocking(move || {
        // Disks sysfs lists without a number (5.10's hidden NVMe path
        // disks) are placed by the numbers the agent's failed requests
        // carried.
        let names = health_kernel::pinned::disk_names(&pin_root)
            .into_iter()
            .map(|(dev, name)| (Dev::from_kernel(dev), name));
        let learned = health_topology::nvme::unnumbered_disks(&host.sys_root, names);
        let topo = Topology::scan_with_numbers(&host, &learned)?;
        let volumes = kubelet::discover(&root);
        let index = VolumeIndex::build(&topo, volumes);
        Ok::<_, ViewError>((topo, index))
    })
    .await??;

    let stack_volumes = volume_devices(&topo, index.volumes());
    let stacks = {
        let topo = Topology::from_parts(topo.devices().to_vec(), Vec::new());
        let check = CheckConfig {
            sys_root: opts.host.sys_root.clone(),
            ..opts.check.clone()
        };
        let reader = Mutex::new(stack_reader(&check).0);
        let volumes = stack_volumes.clone();
        tokio::task::spawn_blocking(move || read_stacks(&reader, &topo, &volumes))
    };
    let checker = Checker::new(opts.check.clone());
    let mounts: Arc<[MountEntry]> = topo.shared_mounts();
    let checks = run_checks(&checker, index.volumes(), mounts);
    let csi = async {
        let prober = CsiProber::connect(
            Some(&opts.kubelet_root),
            &opts.csi_overrides,
            opts.check.timeout,
        )
        .await;
        tokio::join!(prober.probe(index.volumes()), prober.probe_storage())
    };
    let (mut checks, (csi, storage), stacks) = tokio::join!(checks, csi, stacks);
    let stacks = stacks?;
    checks.extend(judge_volumes(
        &stacks,
        &stack_volumes,
        opts.check.thin_pool_low_percent,
    ));
    if checker.stuck_probes() > 0 {
        tracing::warn!(
            stuck = checker.stuck_probes(),
            "some volume probes are still blocked in the kernel"
        );
    }

    let now = SystemTime::now();
    let mut failures: Vec<(super::VolumeKey, ProbeFailure)> = Vec::new();
    for (key, report) in &checks {
        failures.extend(check_failures(report).map(|f| (key.clone(), f)));
    }
    for o in &csi {
        if let CsiResult::ProbeFailed { error } = &o.result {
            let failure = ProbeFailure {
                source: "csi-node".into(),
                error: error.clone(),
            };
            failures.push((o.key.clone(), failure));
        }
    }
    let storage_of = |v: &super::IndexedVolume| {
        storage
            .iter()
            .find(|o| super::storage::is_csi_volume_of(v, &o.driver))
    };
    for v in index.volumes() {
        if let Some(StorageResult::ProbeFailed { error }) = storage_of(v).map(|o| &o.result) {
            let failure = ProbeFailure {
                source: "csi-storage".into(),
                error: error.clone(),
            };
            failures.push((v.key.clone(), failure));
        }
    }
    let csi_storage: Vec<Option<StorageOutcome>> = index
        .volumes()
        .iter()
        .map(|v| storage_of(v).cloned())
        .collect();
    let mut monitor = VolumeMonitor::new(index, ConditionConfig::default());
    monitor.apply_checks(now, checks);
    monitor.apply_csi(now, &csi);
    monitor.apply_storage(now, &storage);
    let evidence = health_kernel::pinned::read(&opts.pin_root);
    if let KernelEvidence::Pinned(counts) = &evidence {
        let clock = Clock::new();
        let wall = |ns: u64| if ns == 0 { now } else { clock.wall_time(ns) };
        // Errors of an earlier holder of a volume's device number are not
        // the volume's (see `Topology::incarnation`).
        for c in counts
            .iter()
            .filter(|c| !topo.is_earlier(Dev::from_kernel(c.key.dev), c.key.diskseq))
        {
            let e = KernelError {
                key: c.key,
                count: c.count,
                sample: None,
            };
            monitor.record_span(&e, wall(c.first_ns), wall(c.last_ns));
        }
    }
    let kernel: Vec<Vec<KernelErrors>> = monitor
        .index()
        .volumes()
        .iter()
        .map(|v| monitor.pending_errors(&v.key))
        .collect();
    monitor.flush_kernel(now);
    // A condition whose last error is older than the quiet window has
    // cleared, as it would have in `watch`.
    monitor.tick(now);

    let index = Arc::clone(monitor.index());
    let mut views = Vec::with_capacity(index.len());
    for ((v, kernel), csi_storage) in index.volumes().iter().zip(kernel).zip(csi_storage) {
        let mount = match v.volume.volume_mode {
            VolumeMode::Filesystem => topo
                .mounts()
                .iter()
                .rev()
                .find(|m| m.mount_point == v.volume.path),
            VolumeMode::Block => None,
        };
        let disk = v
            .device
            .and_then(|d| topo.device(d))
            .map(|b| b.name.clone());
        let mut conditions: Vec<ConditionView> = monitor
            .health(&v.key)
            .map(|h| h.conditions().iter().map(condition_view).collect())
            .unwrap_or_default();
        if let (Some(m), Some(name)) = (mount, &disk) {
            if let Some(e) = ext4_errors(&opts.host.sys_root, m, name) {
                merge(&mut conditions, ext4_condition(&e, now));
            }
        }
        views.push(VolumeView {
            pod_uid: v.volume.pod_uid.clone(),
            pv: v.volume.pv.clone(),
            name: v.volume.pod_volume_dir_name.clone(),
            driver: v.volume.driver.clone(),
            volume_handle: v.volume.volume_handle.clone(),
            volume_mode: v.volume.volume_mode,
            kind: v.volume.kind,
            path: v.volume.path.clone(),
            staging_path: v.volume.staging_path.clone(),
            device: v.device,
            disk,
            mount: mount.map(|m| m.mount_point.clone()),
            fs_type: mount.map(|m| m.fs_type.clone()),
            worst: conditions.first().map(|c| c.status),
            conditions,
            conditions_from: ConditionsFrom::Command,
            probe_failures: failures
                .iter()
                .filter(|(k, _)| *k == v.key)
                .map(|(_, f)| f.clone())
                .collect(),
            csi: csi.iter().find(|o| o.key == v.key).cloned(),
            csi_storage,
            kernel_errors: kernel.iter().map(kernel_error_view).collect(),
            stack: stack_volumes
                .iter()
                .find(|(k, _)| *k == v.key)
                .map(|(_, devs)| devs.iter().filter_map(|d| stacks.get(d).cloned()).collect())
                .unwrap_or_default(),
        });
    }
    Ok((views, evidence))
}

fn kernel_error_view(k: &KernelErrors) -> KernelErrorView {
    KernelErrorView {
        reason: k.kind.reason().into(),
        status: k.kind.status(),
        count: k.count,
        first: rfc3339(k.first),
        last: rfc3339(k.last),
        device: k.device,
        device_name: k.device_name.clone(),
        op: k.op.clone(),
        errno: k.errno,
    }
}

fn check_failures(report: &CheckReport) -> impl Iterator<Item = ProbeFailure> + '_ {
    report.results.iter().filter_map(|(kind, r)| match r {
        CheckResult::ProbeFailed(e) => Some(ProbeFailure {
            source: format!("check/{kind}"),
            error: e.clone(),
        }),
        _ => None,
    })
}

fn condition_view(c: &Condition) -> ConditionView {
    ConditionView {
        status: c.status,
        reason: c.reason.clone(),
        message: c.message.clone(),
        since: rfc3339(c.since),
        last_probe: rfc3339(c.last_probe),
        source: c.source.to_string(),
    }
}

/// ext2/3/4 mounts are served by the ext4 driver and have its record.
fn ext4_errors(sys_root: &Path, mount: &MountEntry, disk: &str) -> Option<Ext4Errors> {
    if !matches!(mount.fs_type.as_str(), "ext4" | "ext3" | "ext2") {
        return None;
    }
    match super::ext4_error_evidence(sys_root, disk) {
        Ok(e) => e,
        Err(e) => {
            tracing::debug!(disk, "no ext4 error record: {e}");
            None
        }
    }
}

fn ext4_condition(e: &Ext4Errors, now: SystemTime) -> ConditionView {
    ConditionView {
        status: Ext4Errors::STATUS,
        reason: Ext4Errors::REASON.into(),
        message: e.message(),
        since: rfc3339(e.first.unwrap_or(now)),
        last_probe: rfc3339(now),
        source: "ext4-superblock".into(),
    }
}

/// Adds `c` unless a condition with its (status, reason) is there; keeps
/// the list worst first.
fn merge(conditions: &mut Vec<ConditionView>, c: ConditionView) {
    if conditions
        .iter()
        .any(|have| have.status == c.status && have.reason == c.reason)
    {
        return;
    }
    conditions.push(c);
    conditions.sort_by(|a, b| (a.status, &a.reason).cmp(&(b.status, &b.reason)));
}

/// The human view: one block per volume.
pub fn human(views: &[VolumeView]) -> String {
    if views.is_empty() {
        return "no pod volumes found\n".into();
    }
    let mut out = String::new();
    for v in views {
        let pv = v.pv.as_deref().unwrap_or("(inline)");
        let driver = v.driver.as_deref().unwrap_or("local");
        let device = v.device.map_or_else(|| "-".to_string(), |d| d.to_string());
        let disk = v
            .disk
            .as_deref()
            .map(|d| format!(" {d}"))
            .unwrap_or_default();
        let place = match (&v.mount, v.volume_mode) {
            (Some(m), _) => format!(" on {}", m.display()),
            (None, VolumeMode::Block) => format!(" at {}", v.path.display()),
            (None, VolumeMode::Filesystem) => " (not mounted)".to_string(),
        };
        let mode = match v.volume_mode {
            VolumeMode::Filesystem => "Filesystem",
            VolumeMode::Block => "Block",
        };
        let state = v
            .worst
            .map_or_else(|| "Healthy".to_string(), |s| s.to_string());
        out.push_str(&format!(
            "pod {} pv {pv} ({driver}, {mode}) {device}{disk}{place}: {state}\n",
            v.pod_uid
        ));
        for c in &v.conditions {
            out.push_str(&format!(
                "  {} {} since {} [{}]: {}\n",
                c.status, c.reason, c.since, c.source, c.message
            ));
        }
        for k in &v.kernel_errors {
            let op = k.op.as_deref().map(|o| format!(" {o}")).unwrap_or_default();
            let errno = k
                .errno
                .map(|e| format!(" {}", errno_name(e)))
                .unwrap_or_default();
            let on = k
                .device_name
                .clone()
                .or_else(|| k.device.map(|d| d.to_string()))
                .unwrap_or_else(|| "-".into());
            out.push_str(&format!(
                "  kernel: {}{op}{errno} errors on {on} ({}), first {} last {}\n",
                k.count, k.reason, k.first, k.last
            ));
        }
        for f in &v.probe_failures {
            out.push_str(&format!("  probe failed [{}]: {}\n", f.source, f.error));
        }
        for layer in &v.stack {
            stack_lines(layer, 1, &mut out);
        }
    }
    out
}

/// Each layer of a stack on a line, indented by depth, with what its state
/// says (nothing more for partitions, loop devices and linear dm).
fn stack_lines(layer: &Layer, depth: usize, out: &mut String) {
    let what = match &layer.state {
        LayerState::Plain => String::new(),
        LayerState::Multipath { queueing, paths } => {
            let up = paths.iter().filter(|p| p.active).count();
            let mut s = format!(" multipath, {up} of {} paths up", paths.len());
            if *queueing {
                s.push_str(", queueing I/O");
            }
            s
        }
        LayerState::ThinVolume => " thin volume".into(),
        LayerState::ThinPool { status } => match status {
            PoolState::Working {
                mode,
                data_percent,
                metadata_percent,
                ..
            } => format!(
                " thin pool {mode}, data {data_percent:.1}%, metadata {metadata_percent:.1}%"
            ),
            PoolState::Failed => " thin pool failed".into(),
            PoolState::Error => " thin pool status unreadable".into(),
        },
        LayerState::Md(md) => format!(
            " {} {}, {} of {} members{}",
            md.level,
            md.array_state,
            md.raid_disks.saturating_sub(md.degraded),
            md.raid_disks,
            md.sync_action
                .as_ref()
                .map(|a| format!(", {a}"))
                .unwrap_or_default()
        ),
        LayerState::Disk { state, health } => {
            let mut s = format!(" {state}");
            if let Some(h) = health {
                match (&h.log, &h.error) {
                    (Some(log), _) => s.push_str(&format!(
                        ", {} health: critical warning {:#04x}, spare {}% (threshold {}%), {}% used, {} media errors",
                        h.controller,
                        log.critical_warning,
                        log.available_spare,
                        log.available_spare_threshold,
                        log.percentage_used,
                        log.media_errors
                    )),
                    (None, Some(e)) => s.push_str(&format!(", health log unreadable: {e}")),
                    (None, None) => {}
                }
            }
            s
        }
        LayerState::Unreadable { error } => format!(" unreadable: {error}"),
    };
    out.push_str(&format!(
        "  {}stack: {} ({}){what}\n",
        "  ".repeat(depth - 1),
        layer.name,
        layer.dev
    ));
    for below in &layer.below {
        stack_lines(below, depth + 1, out);
    }
}
