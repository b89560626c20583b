//! The stack check: what the layers under a volume's device say before any
//! I/O fails ([`health_topology::stack`] reads them), judged per layer:
//!
//! | layer | finding | status |
//! |---|---|---|
//! | multipath, some paths down (failed, or their disk not running) | `PathsDown` | Degraded |
//! | multipath, no path up | `AllPathsDown` | Inaccessible |
//! | md array lacking members | `ArrayDegraded` | Degraded |
//! | md array stopped or broken | `ArrayFailed` | Inaccessible |
//! | thin pool at or above the threshold (data or metadata) | `ThinPoolLow` | Degraded |
//! | thin pool out of data space (writes queue or fail) | `ThinPoolFull` | Inaccessible |
//! | thin pool read-only / failed | `ThinPoolReadOnly` / `ThinPoolFailed` | Inaccessible |
//! | a disk `offline`, `transport-offline` or `blocked` (not a multipath path) | `DeviceOffline`, `TransportOffline`, `DeviceBlocked` | Inaccessible |
//! | an NVMe namespace's controller sets critical warning bits | `NvmeCriticalWarning` | Inaccessible for read-only media, else Degraded |
//!
//! A layer whose state could not be read makes the whole result a failed
//! probe: it may be the layer that holds a condition, and a failed probe is
//! never a recovery.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use health_core::conditions::{CheckFinding, CheckKind, CheckResult};
use health_core::dev::Dev;
use health_topology::stack::nvme_health::{warning_words, NvmeHealth};
use health_topology::stack::{Layer, LayerState, PoolState, StackReader, DM_CONTROL};
use health_topology::Topology;

use super::CheckReport;
use crate::volumes::{IndexedVolume, VolumeKey};

/// Default of `--thin-pool-low-percent`: LVM's own autoextend default
/// threshold is 70-100 %; past 90 % a busy pool has little time left.
pub const DEFAULT_THIN_POOL_LOW_PERCENT: f64 = 90.0;

/// The stack reader `cfg` asks for: with NVMe health logs unless their
/// interval is zero, and the trigger that reads them at once.
pub fn stack_reader(cfg: &super::CheckConfig) -> (StackReader, Option<Arc<AtomicBool>>) {
    let reader = StackReader::new(&cfg.sys_root, Path::new(DM_CONTROL));
    if cfg.nvme_health_interval.is_zero() {
        return (reader, None);
    }
    let (reader, trigger) = reader.with_nvme_health(Path::new(DEV_DIR), cfg.nvme_health_interval);
    (reader, Some(trigger))
}

/// Where the NVMe controllers' character devices are (the host's /dev, as
/// the agent's container mounts it).
const DEV_DIR: &str = "/dev";

/// Each volume with the block devices it lives on (several for a btrfs
/// filesystem; none for a volume that is not mounted or has no block
/// device, which the stack check skips).
pub fn volume_devices(topo: &Topology, volumes: &[IndexedVolume]) -> Vec<(VolumeKey, Vec<Dev>)> {
    volumes
        .iter()
        .filter_map(|v| {
            let devs = topo.filesystem_backing_devices(v.device?);
            (!devs.is_empty()).then(|| (v.key.clone(), devs))
        })
        .collect()
}

/// One volume's stack check and its stack in one line ([`summary`]).
pub type StackOutcome = (VolumeKey, CheckReport, String);

/// The stack check of every volume in one pass, each layer read once.
/// Blocking (sysfs, device-mapper ioctls): run it on a blocking thread.
pub fn check_stacks(
    reader: &Mutex<StackReader>,
    topo: &Topology,
    volumes: &[(VolumeKey, Vec<Dev>)],
    thin_pool_low_percent: f64,
) -> Vec<StackOutcome> {
    let stacks = read_stacks(reader, topo, volumes);
    judge_volumes(&stacks, volumes, thin_pool_low_percent)
        .into_iter()
        .zip(volumes)
        .map(|((key, report), (_, devs))| {
            let layers: Vec<&Layer> = devs.iter().filter_map(|d| stacks.get(d)).collect();
            (key, report, summary(&layers))
        })
        .collect()
}

/// A volume's stacks on one line, each layer with its state and the layers
/// below in brackets: `dm-0 multipath 1/2 paths up [sda running, sdb
/// failed]`. Percentages are whole, so that a line printed on change is not
/// printed every second while a pool fills.
pub fn summary(stacks: &[&Layer]) -> String {
    stacks
        .iter()
        .map(|l| layer_summary(l))
        .collect::<Vec<_>>()
        .join("; ")
}

fn layer_summary(l: &Layer) -> String {
    let mut s = l.name.clone();
    match &l.state {
        LayerState::Plain => {}
        LayerState::Multipath { queueing, paths } => {
            let up = paths.iter().filter(|p| p.active).count();
            s.push_str(&format!(" multipath {up}/{} paths up", paths.len()));
            if *queueing {
                s.push_str(" queueing");
            }
            let down: Vec<String> = paths
                .iter()
                .filter(|p| !p.active)
                .map(|p| {
                    let name = p.name.clone().unwrap_or_else(|| p.dev.to_string());
                    format!("{name} {}", p.state.as_deref().unwrap_or("failed"))
                })
                .collect();
            if !down.is_empty() {
                s.push_str(&format!(" (down: {})", down.join(", ")));
            }
        }
        LayerState::ThinVolume => s.push_str(" thin"),
        LayerState::ThinPool { status } => match status {
            PoolState::Working {
                mode,
                data_percent,
                metadata_percent,
                ..
            } => s.push_str(&format!(
                " thin-pool {mode} data {}% metadata {}%",
                data_percent.floor(),
                metadata_percent.floor()
            )),
            PoolState::Failed => s.push_str(" thin-pool failed"),
            PoolState::Error => s.push_str(" thin-pool status error"),
        },
        LayerState::Md(md) => s.push_str(&format!(
            " {} {} {}/{} members{}",
            md.level,
            md.array_state,
            md.raid_disks.saturating_sub(md.degraded),
            md.raid_disks,
            md.sync_action
                .as_ref()
                .map(|a| format!(" {a} {}%", md.sync_percent().unwrap_or(0) / 10 * 10))
                .unwrap_or_default()
        )),
        LayerState::Disk { state, health } => {
            s.push_str(&format!(" {state}"));
            if let Some(h) = health {
                match h.log {
                    Some(log) if log.critical_warning != 0 => {
                        s.push_str(&format!(" critical warning {:#04x}", log.critical_warning))
                    }
                    None => s.push_str(" health log unreadable"),
                    Some(_) => {}
                }
            }
        }
        LayerState::Unreadable { error } => s.push_str(&format!(" unreadable ({error})")),
    }
    if !l.below.is_empty() {
        let below: Vec<String> = l.below.iter().map(layer_summary).collect();
        s.push_str(&format!(" [{}]", below.join(", ")));
    }
    s
}

/// The stacks under every device of `volumes`.
pub fn read_stacks(
    reader: &Mutex<StackReader>,
    topo: &Topology,
    volumes: &[(VolumeKey, Vec<Dev>)],
) -> HashMap<Dev, Layer> {
    let mut all: Vec<Dev> = volumes.iter().flat_map(|(_, d)| d).copied().collect();
    all.sort_unstable();
    all.dedup();
    match reader.lock() {
        Ok(mut r) => r.read(topo, &all),
        Err(poisoned) => poisoned.into_inner().read(topo, &all),
    }
}

/// Each volume's stack check from the stacks read.
pub fn judge_volumes(
    stacks: &HashMap<Dev, Layer>,
    volumes: &[(VolumeKey, Vec<Dev>)],
    thin_pool_low_percent: f64,
) -> Vec<(VolumeKey, CheckReport)> {
    volumes
        .iter()
        .map(|(key, devs)| {
            let layers: Vec<&Layer> = devs.iter().filter_map(|d| stacks.get(d)).collect();
            let mut report = CheckReport::default();
            report
                .results
                .push((CheckKind::Stack, judge(&layers, thin_pool_low_percent)));
            (key.clone(), report)
        })
        .collect()
}

/// The findings of the stacks under one volume (several for a btrfs
/// filesystem on several devices).
pub fn judge(stacks: &[&Layer], thin_pool_low_percent: f64) -> CheckResult {
    let mut findings = Vec::new();
    let mut unreadable = Vec::new();
    let mut judged = HashSet::new();
    for top in stacks {
        let paths = multipath_paths(top);
        for layer in top.walk() {
            if !judged.insert(layer.dev) {
                continue;
            }
            judge_layer(
                layer,
                &paths,
                thin_pool_low_percent,
                &mut findings,
                &mut unreadable,
            );
        }
    }
    if let Some(error) = unreadable.into_iter().next() {
        return CheckResult::ProbeFailed(error);
    }
    if findings.is_empty() {
        CheckResult::Pass
    } else {
        CheckResult::Found(findings)
    }
}

/// Devices that are paths of a multipath layer of this stack: their state
/// is the multipath finding's, not one of their own.
fn multipath_paths(top: &Layer) -> HashSet<Dev> {
    top.walk()
        .into_iter()
        .filter_map(|l| match &l.state {
            LayerState::Multipath { paths, .. } => Some(paths.iter().map(|p| p.dev)),
            _ => None,
        })
        .flatten()
        .collect()
}

fn judge_layer(
    layer: &Layer,
    multipath_paths: &HashSet<Dev>,
    thin_pool_low_percent: f64,
    findings: &mut Vec<CheckFinding>,
    unreadable: &mut Vec<String>,
) {
    match &layer.state {
        LayerState::Plain | LayerState::ThinVolume => {}
        LayerState::Unreadable { error } => unreadable.push(format!("{}: {error}", layer.name)),
        LayerState::Multipath { queueing, paths } => {
            let mut down = Vec::new();
            for p in paths {
                let name = p.name.clone().unwrap_or_else(|| p.dev.to_string());
                let disk_state = layer
                    .below
                    .iter()
                    .find(|l| l.dev == p.dev)
                    .and_then(|l| match &l.state {
                        LayerState::Disk { state, .. } if is_down(state) => Some(state.clone()),
                        _ => None,
                    });
                match (p.active, disk_state) {
                    (false, _) => {
                        let why = p.state.as_deref().unwrap_or("failed");
                        down.push(format!("{name} {why}"))
                    }
                    (true, Some(state)) => down.push(format!("{name} {state}")),
                    (true, None) => {}
                }
            }
            let total = paths.len();
            if total > 0 && down.len() == total {
                findings.push(CheckFinding::AllPathsDown {
                    device: layer.name.clone(),
                    total,
                    queueing: *queueing,
                });
            } else if !down.is_empty() {
                findings.push(CheckFinding::PathsDown {
                    device: layer.name.clone(),
                    up: total - down.len(),
                    total,
                    down,
                });
            }
        }
        LayerState::Md(md) => {
            if md.failed() {
                findings.push(CheckFinding::ArrayFailed {
                    array: layer.name.clone(),
                    state: md.array_state.clone(),
                });
            } else if md.degraded > 0 {
                let sync = md.sync_action.as_ref().map(|a| match md.sync_percent() {
                    Some(p) => format!("{a} {}% done", p / 10 * 10),
                    None => a.clone(),
                });
                findings.push(CheckFinding::ArrayDegraded {
                    array: layer.name.clone(),
                    level: md.level.clone(),
                    missing: md.degraded,
                    members: md.raid_disks,
                    sync,
                });
            }
        }
        LayerState::ThinPool { status } => match status {
            PoolState::Failed => findings.push(CheckFinding::ThinPoolFailed {
                pool: layer.name.clone(),
            }),
            PoolState::Error => unreadable.push(format!(
                "{}: the kernel could not read the thin pool's status",
                layer.name
            )),
            PoolState::Working {
                mode,
                data_percent,
                metadata_percent,
                error_if_no_space,
                needs_check,
            } => match *mode {
                "ro" => findings.push(CheckFinding::ThinPoolReadOnly {
                    pool: layer.name.clone(),
                    needs_check: *needs_check,
                }),
                "out_of_data_space" => findings.push(CheckFinding::ThinPoolFull {
                    pool: layer.name.clone(),
                    queueing: !error_if_no_space,
                }),
                _ if *data_percent >= thin_pool_low_percent
                    || *metadata_percent >= thin_pool_low_percent =>
                {
                    findings.push(CheckFinding::ThinPoolLow {
                        pool: layer.name.clone(),
                        data_percent: data_percent.floor() as u32,
                        metadata_percent: metadata_percent.floor() as u32,
                        threshold_percent: thin_pool_low_percent,
                    })
                }
                _ => {}
            },
        },
        LayerState::Disk { state, health } => {
            if is_down(state) && !multipath_paths.contains(&layer.dev) {
                findings.push(CheckFinding::DeviceNotRunning {
                    device: layer.name.clone(),
                    state: state.clone(),
                });
            }
            // An unreadable log is no finding and no failed probe: the
            // cache keeps the last page read, so a warning stays raised.
            if let Some(NvmeHealth {
                controller,
                log: Some(log),
                ..
            }) = health
            {
                if log.critical_warning != 0 {
                    findings.push(CheckFinding::NvmeCriticalWarning {
                        device: layer.name.clone(),
                        controller: controller.clone(),
                        warning: log.critical_warning,
                        words: warning_words(log.critical_warning),
                        available_spare: log.available_spare,
                        spare_threshold: log.available_spare_threshold,
                        percentage_used: log.percentage_used,
                    });
                }
            }
        }
    }
}

/// Device states in which a disk serves no I/O now: SCSI's `offline`,
/// `transport-offline` and `blocked` (held while its transport recovers),
/// NVMe's `connecting` (reconnecting after a lost connection), `deleting`
/// and `dead`. `resetting` is left out: a controller reset is brief and
/// routine.
fn is_down(state: &str) -> bool {
    matches!(
        state,
        "offline" | "transport-offline" | "blocked" | "connecting" | "dead"
    ) || state.starts_with("deleting")
}

#[cfg(test)]
mod tests {
    use health_topology::stack::PathState;

    use super::*;

    fn layer(dev: Dev, name: &str, state: LayerState, below: Vec<Layer>) -> Layer {
        Layer {
            dev,
            name: name.into(),
            state,
            below,
        }
    }

    fn scsi(dev: Dev, name: &str, state: &str) -> Layer {
        let state = LayerState::Disk {
            state: state.into(),
            health: None,
        };
        layer(dev, name, state, vec![])
    }

    fn multipath(active: [bool; 2], sdb_state: &str) -> Layer {
        let (sda, sdb) = (Dev::new(8, 0), Dev::new(8, 16));
        let path = |dev, name: &str, active| PathState {
            dev,
            name: Some(name.into()),
            active,
            fail_count: u32::from(!active),
            state: None,
        };
        layer(
            Dev::new(253, 0),
            "dm-0",
            LayerState::Multipath {
                queueing: false,
                paths: vec![path(sda, "sda", active[0]), path(sdb, "sdb", active[1])],
            },
            vec![scsi(sda, "sda", "running"), scsi(sdb, "sdb", sdb_state)],
        )
    }

    fn found(r: CheckResult) -> Vec<(String, String)> {
        match r {
            CheckResult::Found(f) => f.iter().map(|f| (f.reason().into(), f.message())).collect(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn multipath_paths_down_are_degraded_and_none_up_inaccessible() {
        assert_eq!(
            judge(&[&multipath([true, true], "running")], 90.0),
            CheckResult::Pass
        );
        assert_eq!(
            found(judge(&[&multipath([true, false], "running")], 90.0)),
            [(
                "PathsDown".into(),
                "multipath device dm-0 runs on 1 of 2 paths; down: sdb failed".into()
            )]
        );
        // dm-multipath has not noticed yet (no I/O), the disk says offline:
        // the path is down all the same, and the disk's own state is the
        // multipath finding's, not a DeviceOffline of its own.
        assert_eq!(
            found(judge(&[&multipath([true, true], "offline")], 90.0)),
            [(
                "PathsDown".into(),
                "multipath device dm-0 runs on 1 of 2 paths; down: sdb offline".into()
            )]
        );
        let all = found(judge(&[&multipath([false, false], "running")], 90.0));
        assert_eq!(all[0].0, "AllPathsDown");
        assert_eq!(
            all[0].1,
            "multipath device dm-0 has none of its 2 paths up; I/O fails"
        );
    }

    #[test]
    fn a_stack_reads_on_one_line() {
        assert_eq!(
            summary(&[&multipath([true, false], "offline")]),
            "dm-0 multipath 1/2 paths up (down: sdb failed) [sda running, sdb offline]"
        );
    }

    #[test]
    fn thin_pools_are_judged_by_mode_then_usage() {
        let pool = |mode: &'static str, data: f64, eins: bool| {
            let pool = layer(
                Dev::new(253, 2),
                "dm-2",
                LayerState::ThinPool {
                    status: PoolState::Working {
                        mode,
                        data_percent: data,
                        metadata_percent: 3.0,
                        error_if_no_space: eins,
                        needs_check: false,
                    },
                },
                vec![],
            );
            layer(Dev::new(253, 3), "dm-3", LayerState::ThinVolume, vec![pool])
        };
        assert_eq!(judge(&[&pool("rw", 89.9, false)], 90.0), CheckResult::Pass);
        assert_eq!(
            found(judge(&[&pool("rw", 90.5, false)], 90.0)),
            [(
                "ThinPoolLow".into(),
                "thin pool dm-2 is 90% full (data), 3% (metadata), at or above 90%".into()
            )]
        );
        let full = found(judge(&[&pool("out_of_data_space", 100.0, false)], 90.0));
        assert_eq!(full[0].0, "ThinPoolFull");
        assert!(full[0].1.contains("are queued"), "{}", full[0].1);
        let fails = found(judge(&[&pool("out_of_data_space", 100.0, true)], 90.0));
        assert!(fails[0].1.ends_with("fail with ENOSPC"), "{}", fails[0].1);
        assert_eq!(
            found(judge(&[&pool("ro", 10.0, false)], 90.0))[0].0,
            "ThinPoolReadOnly"
        );
    }

    #[test]
    fn arrays_disks_and_unreadable_layers() {
        let md = |degraded, state: &str, sync: Option<(u64, u64)>| {
            let s = health_topology::stack::md::MdState {
                level: "raid1".into(),
                raid_disks: 2,
                degraded,
                array_state: state.into(),
                sync_action: sync.map(|_| "recover".to_string()),
                sync_completed: sync,
            };
            layer(Dev::new(9, 0), "md0", LayerState::Md(s), vec![])
        };
        assert_eq!(judge(&[&md(0, "clean", None)], 90.0), CheckResult::Pass);
        assert_eq!(
            found(judge(&[&md(1, "clean", Some((47, 100)))], 90.0)),
            [(
                "ArrayDegraded".into(),
                "raid1 array md0 runs without 1 of its 2 members; recover 40% done".into()
            )]
        );
        assert_eq!(
            found(judge(&[&md(0, "inactive", None)], 90.0))[0].0,
            "ArrayFailed"
        );
        let offline = scsi(Dev::new(8, 0), "sda", "transport-offline");
        assert_eq!(
            found(judge(&[&offline], 90.0)),
            [(
                "TransportOffline".into(),
                "disk sda is transport-offline: its I/O fails".into()
            )]
        );
        let blocked = scsi(Dev::new(8, 0), "sda", "blocked");
        assert_eq!(found(judge(&[&blocked], 90.0))[0].0, "DeviceBlocked");
        let broken = layer(
            Dev::new(253, 0),
            "dm-0",
            LayerState::Unreadable {
                error: "opening /dev/mapper/control: EPERM".into(),
            },
            vec![md(1, "clean", None)],
        );
        assert_eq!(
            judge(&[&broken], 90.0),
            CheckResult::ProbeFailed("dm-0: opening /dev/mapper/control: EPERM".into())
        );
    }

    fn nvme(warning: u8) -> Layer {
        use health_topology::stack::nvme_health::{NvmeHealth, SmartLog};
        let health = NvmeHealth {
            controller: "nvme0".into(),
            log: Some(SmartLog {
                critical_warning: warning,
                temperature_kelvin: 300,
                available_spare: 4,
                available_spare_threshold: 10,
                percentage_used: 97,
                media_errors: 12,
            }),
            error: None,
        };
        let state = LayerState::Disk {
            state: "live".into(),
            health: Some(health),
        };
        layer(Dev::new(259, 0), "nvme0n1", state, vec![])
    }

    #[test]
    fn nvme_critical_warnings_are_degraded_and_read_only_media_inaccessible() {
        assert_eq!(judge(&[&nvme(0)], 90.0), CheckResult::Pass);
        assert_eq!(summary(&[&nvme(0)]), "nvme0n1 live");
        let spare = judge(&[&nvme(0x01)], 90.0);
        let CheckResult::Found(f) = &spare else {
            panic!("{spare:?}")
        };
        assert_eq!(f[0].status(), health_core::conditions::Status::Degraded);
        assert_eq!(
            found(spare),
            [(
                "NvmeCriticalWarning".into(),
                "NVMe controller nvme0 of disk nvme0n1 reports a critical warning (0x01): available spare below its threshold; available spare 4% (threshold 10%), 97% of rated life used".into()
            )]
        );
        let ro = judge(&[&nvme(0x0c)], 90.0);
        let CheckResult::Found(f) = &ro else {
            panic!("{ro:?}")
        };
        assert_eq!(f[0].status(), health_core::conditions::Status::Inaccessible);
        assert!(f[0].message().contains("(0x0c): reliability degraded by media or internal errors, media placed in read-only mode;"), "{}", f[0].message());
        assert_eq!(
            summary(&[&nvme(0x0c)]),
            "nvme0n1 live critical warning 0x0c"
        );
    }
}
