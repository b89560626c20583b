//! The storage stack under a device, layer by layer, with the state of each
//! layer that has one: a multipath device's paths, a thin volume's pool, an
//! md array's members, a SCSI disk's device state. The kernel knows these
//! before any I/O fails (a path is failed, a pool is full and queueing
//! writes, an array runs degraded): reading them is how the agent says so
//! within seconds instead of at the first failed request.
//!
//! Sources: sysfs (`slaves/` for the layers, `md/` for arrays,
//! `device/state` for SCSI disks) and one device-mapper call per dm device
//! (`dm_ioctl`: status, which also names each target's type). Reading does
//! no I/O on the devices; call it from a blocking thread all the same (md's
//! attributes take the array's lock).

pub mod dm_ioctl;
pub mod dm_status;
pub mod md;
pub mod nvme_health;

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use health_core::dev::Dev;
use serde::Serialize;

use crate::Topology;
use dm_ioctl::{DmControl, DmTarget, Query};
use dm_status::{parse_multipath, parse_thin_pool, MultipathStatus, ThinPoolStatus};
use md::{read_md, MdState};
use nvme_health::{NvmeHealth, SmartCache};

/// Where the device-mapper control node is on a host (and in the agent's
/// container, which mounts the host's /dev).
pub const DM_CONTROL: &str = "/dev/mapper/control";

/// No real stack is deeper (a filesystem on LVM on md on partitions is 4).
const MAX_DEPTH: usize = 16;

/// One layer of a stack and the layers it is built from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Layer {
    pub dev: Dev,
    /// Kernel name (`dm-0`, `sdb`, `md0`).
    pub name: String,
    #[serde(flatten)]
    pub state: LayerState,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub below: Vec<Layer>,
}

/// What a layer is and the state it reports.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum LayerState {
    /// Nothing to watch at this layer (a partition, a loop device, linear
    /// or crypt device-mapper targets, a disk without a device state).
    Plain,
    Multipath {
        /// I/O is being held back now.
        queueing: bool,
        paths: Vec<PathState>,
    },
    /// A dm-thin volume; its pool is the layer below.
    ThinVolume,
    ThinPool {
        #[serde(flatten)]
        status: PoolState,
    },
    Md(MdState),
    /// A disk with a device state: a SCSI disk's `device/state` (`running`,
    /// `offline`, `transport-offline`, `blocked` while its transport
    /// recovers...) or an NVMe disk's controller `state` (`live`,
    /// `connecting`, `resetting`, `deleting`, `dead`).
    Disk {
        state: String,
        /// An NVMe namespace's controller's SMART / health log, where the
        /// reader reads them ([`StackReader::with_nvme_health`]).
        #[serde(skip_serializing_if = "Option::is_none")]
        health: Option<NvmeHealth>,
    },
    /// The layer's state could not be read; never taken as healthy.
    Unreadable {
        error: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PathState {
    pub dev: Dev,
    pub name: Option<String>,
    pub active: bool,
    /// dm-multipath's count of failures of this path (0 for NVMe).
    pub fail_count: u32,
    /// Why a path is down where more is known than "failed": its NVMe
    /// controller's state, its ANA state, or `removed`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
}

/// A thin pool's status in the shape `volumes --json` prints it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "pool_status", rename_all = "kebab-case")]
pub enum PoolState {
    Working {
        mode: &'static str,
        data_percent: f64,
        metadata_percent: f64,
        error_if_no_space: bool,
        needs_check: bool,
    },
    Failed,
    Error,
}

impl Layer {
    /// Every layer of this stack, this one first (depth-first).
    pub fn walk(&self) -> Vec<&Layer> {
        let mut out = vec![self];
        let mut i = 0;
        while i < out.len() {
            let l = out[i];
            out.extend(l.below.iter());
            i += 1;
        }
        out
    }
}

/// Reads stacks; keeps the device-mapper control node open between rounds.
#[derive(Debug)]
pub struct StackReader {
    sys_root: PathBuf,
    dm_control: PathBuf,
    dm: Option<DmControl>,
    /// Said once per reader, not per round: why dm layers are unreadable.
    dm_warned: bool,
    /// Every path disk seen under each NVMe head, by name.
    nvme_seen: HashMap<Dev, std::collections::BTreeMap<String, Dev>>,
    /// NVMe controllers' health logs, when read at all.
    smart: Option<SmartCache>,
    /// The controllers asked about this round.
    smart_asked: HashSet<String>,
}

impl StackReader {
    pub fn new(sys_root: &Path, dm_control: &Path) -> Self {
        StackReader {
            sys_root: sys_root.to_path_buf(),
            dm_control: dm_control.to_path_buf(),
            dm: None,
            dm_warned: false,
            nvme_seen: HashMap::new(),
            smart: None,
            smart_asked: HashSet::new(),
        }
    }

    /// Also read each NVMe namespace's controller's SMART / health log
    /// (from its character device in `dev_dir`), at most every `interval`
    /// and sooner when the returned trigger is set (an error on a disk).
    pub fn with_nvme_health(
        mut self,
        dev_dir: &Path,
        interval: std::time::Duration,
    ) -> (Self, std::sync::Arc<std::sync::atomic::AtomicBool>) {
        let cache = SmartCache::new(dev_dir, interval);
        let trigger = cache.trigger();
        self.smart = Some(cache);
        (self, trigger)
    }

    /// The stacks under `devs`, each layer read once however many stacks
    /// share it (the pool under many thin volumes).
    pub fn read(&mut self, topo: &Topology, devs: &[Dev]) -> HashMap<Dev, Layer> {
        if let Some(c) = &mut self.smart {
            c.start_round(std::time::Instant::now());
        }
        self.smart_asked.clear();
        let mut states: HashMap<Dev, LayerState> = HashMap::new();
        let out = devs
            .iter()
            .map(|&d| (d, self.layer(topo, d, 0, &mut HashSet::new(), &mut states)))
            .collect();
        if let Some(c) = &mut self.smart {
            c.retain(&self.smart_asked);
        }
        out
    }

    fn layer(
        &mut self,
        topo: &Topology,
        dev: Dev,
        depth: usize,
        seen: &mut HashSet<Dev>,
        states: &mut HashMap<Dev, LayerState>,
    ) -> Layer {
        let info = topo.device(dev);
        let name = info.map_or_else(|| dev.to_string(), |d| d.name.clone());
        let state = match states.get(&dev) {
            Some(s) => s.clone(),
            None => {
                let s = self.state_of(dev, &name, info.is_some());
                states.insert(dev, s.clone());
                s
            }
        };
        let mut below = Vec::new();
        if depth < MAX_DEPTH && seen.insert(dev) {
            let lower: Vec<Dev> = match info {
                Some(d) => match d.whole_disk {
                    Some(disk) => vec![disk],
                    None => d.slaves.clone(),
                },
                None => Vec::new(),
            };
            for l in lower {
                below.push(self.layer(topo, l, depth + 1, seen, states));
            }
            seen.remove(&dev);
        }
        let state = match state {
            LayerState::Plain
                if self.nvme_seen.contains_key(&dev) || is_nvme_head(&self.sys_root, &name) =>
            {
                self.nvme_paths(dev, &name, &below)
            }
            // Known as multipath by its uuid only: every path is up as far
            // as dm-multipath is concerned; their disks' states still tell.
            LayerState::Multipath { queueing, paths } if paths.is_empty() => {
                LayerState::Multipath {
                    queueing,
                    paths: below
                        .iter()
                        .map(|l| PathState {
                            dev: l.dev,
                            name: Some(l.name.clone()),
                            active: true,
                            fail_count: 0,
                            state: None,
                        })
                        .collect(),
                }
            }
            LayerState::Multipath { queueing, paths } => LayerState::Multipath {
                queueing,
                paths: paths
                    .into_iter()
                    .map(|p| PathState {
                        name: topo.device(p.dev).map(|d| d.name.clone()),
                        ..p
                    })
                    .collect(),
            },
            s => s,
        };
        Layer {
            dev,
            name,
            state,
            below,
        }
    }

    fn state_of(&mut self, dev: Dev, name: &str, known: bool) -> LayerState {
        if !known {
            return LayerState::Unreadable {
                error: "not in sysfs".into(),
            };
        }
        let dir = self.sys_root.join("class/block").join(name);
        if dir.join("dm").is_dir() {
            return match self.dm_state(dev) {
                LayerState::Unreadable { error } => without_dm_status(&dir, error),
                s => s,
            };
        }
        if name.starts_with("md") && dir.join("md").is_dir() {
            return match read_md(&dir.join("md")) {
                Ok(s) => LayerState::Md(s),
                Err(error) => LayerState::Unreadable { error },
            };
        }
        match read_attr(&dir.join("device/state")) {
            Ok(state) => LayerState::Disk {
                state,
                health: self.nvme_health(name, &dir),
            },
            Err(_) => LayerState::Plain,
        }
    }

    /// The health log of an NVMe namespace's controller (`nvme0n1`'s
    /// `device` is `nvme0`); `None` for other disks, or when not read.
    fn nvme_health(&mut self, name: &str, dir: &Path) -> Option<NvmeHealth> {
        let cache = self.smart.as_mut()?;
        crate::nvme::head_numbers(name)?;
        let link = fs::read_link(dir.join("device")).ok()?;
        let ctrl = link.file_name()?.to_str()?.to_string();
        if !ctrl.starts_with("nvme") {
            return None;
        }
        self.smart_asked.insert(ctrl.clone());
        cache.health(&ctrl, std::time::Instant::now())
    }

    /// An NVMe head's paths, by name from sysfs (5.10 lists the path disks
    /// without their numbers, so the topology may not have them): up while
    /// the controller is `live` and the ANA state (where the subsystem
    /// reports one) lets I/O through. A path whose controller state cannot
    /// be read is down: it is being removed. A path seen before and gone
    /// now (its controller removed after `ctrl_loss_tmo`) stays listed as
    /// `removed`: the volume still runs on fewer paths than it had.
    fn nvme_paths(&mut self, head: Dev, head_name: &str, below: &[Layer]) -> LayerState {
        let block = self.sys_root.join("class/block");
        let seen = self.nvme_seen.entry(head).or_default();
        let mut paths: Vec<PathState> = crate::nvme::paths_of_head(&self.sys_root, head_name)
            .into_iter()
            .map(|name| {
                // Unknown numbers (5.10) are shown as 0:0.
                let dev = below
                    .iter()
                    .find(|l| l.name == name)
                    .map_or(Dev::new(0, 0), |l| l.dev);
                seen.insert(name.clone(), dev);
                let ctrl = read_attr(&block.join(&name).join("device/state")).ok();
                let ana = read_attr(&block.join(&name).join("ana_state")).ok();
                let ctrl_up = ctrl.as_deref() == Some("live");
                let ana_up = ana
                    .as_deref()
                    .is_none_or(|a| matches!(a, "optimized" | "non-optimized"));
                let state = match (ctrl_up, ana_up) {
                    (false, _) => Some(ctrl.unwrap_or_else(|| "state unreadable".into())),
                    (true, false) => ana.map(|a| format!("ANA {a}")),
                    (true, true) => None,
                };
                PathState {
                    dev,
                    name: Some(name),
                    active: ctrl_up && ana_up,
                    fail_count: 0,
                    state,
                }
            })
            .collect();
        for (name, &dev) in seen.iter() {
            if !paths.iter().any(|p| p.name.as_deref() == Some(name)) {
                paths.push(PathState {
                    dev,
                    name: Some(name.clone()),
                    active: false,
                    fail_count: 0,
                    state: Some("removed".into()),
                });
            }
        }
        paths.sort_by(|a, b| a.name.cmp(&b.name));
        LayerState::Multipath {
            queueing: false,
            paths,
        }
    }

    fn dm_state(&mut self, dev: Dev) -> LayerState {
        let targets = match self.control() {
            Ok(c) => c.targets(dev, Query::Status),
            Err(error) => return LayerState::Unreadable { error },
        };
        match targets {
            Ok(t) => dm_layer(&t),
            Err(e) => {
                // The node may have been replaced (a container restart of
                // the host's /dev): open it again next time.
                self.dm = None;
                LayerState::Unreadable {
                    error: format!("device-mapper status of {dev}: {e}"),
                }
            }
        }
    }

    fn control(&mut self) -> Result<&DmControl, String> {
        if self.dm.is_none() {
            match DmControl::open(&self.dm_control) {
                Ok(c) => self.dm = Some(c),
                Err(e) => {
                    let error = format!("opening {}: {e}", self.dm_control.display());
                    if !self.dm_warned {
                        self.dm_warned = true;
                        tracing::warn!("device-mapper layers are unreadable: {error}");
                    }
                    return Err(error);
                }
            }
        }
        Ok(self.dm.as_ref().expect("opened above"))
    }
}

/// What a dm device is when its status cannot be asked (the ioctl needs
/// CAP_SYS_ADMIN): multipath-tools names its maps `mpath-<wwid>` in the dm
/// uuid, which sysfs shows to anyone, so a multipath device is still known
/// (its paths listed from `slaves/`, judged by their disks' states); LVM's
/// thin pools (`-tpool`, `-pool` suffixes) stay unreadable, saying why;
/// any other dm device (a linear or crypt volume) has no state to read.
fn without_dm_status(dir: &Path, error: String) -> LayerState {
    let uuid = read_attr(&dir.join("dm/uuid")).unwrap_or_default();
    if uuid.starts_with("mpath-") {
        return LayerState::Multipath {
            queueing: false,
            paths: Vec::new(),
        };
    }
    if uuid.starts_with("LVM-") && (uuid.ends_with("-tpool") || uuid.ends_with("-pool")) {
        return LayerState::Unreadable {
            error: format!("{error} (a thin pool's usage needs the device-mapper status call, which needs CAP_SYS_ADMIN)"),
        };
    }
    if uuid.starts_with("LVM-") || uuid.starts_with("CRYPT-") {
        return LayerState::Plain;
    }
    LayerState::Unreadable { error }
}

/// An NVMe multipath head: named `nvme<S>n<N>`, with path disks
/// `nvme<S>c<C>n<N>` in sysfs.
fn is_nvme_head(sys_root: &Path, name: &str) -> bool {
    crate::nvme::head_numbers(name).is_some()
        && !crate::nvme::paths_of_head(sys_root, name).is_empty()
}

/// A dm device's layer from its status lines: the first target decides (a
/// multipath, thin or thin-pool table has one target; linear spans of LVM
/// have several, all plain).
fn dm_layer(targets: &[DmTarget]) -> LayerState {
    let Some(t) = targets.first() else {
        return LayerState::Plain;
    };
    match t.target_type.as_str() {
        "multipath" => match parse_multipath(&t.params) {
            Ok(MultipathStatus { queueing, paths }) => LayerState::Multipath {
                queueing,
                paths: paths
                    .into_iter()
                    .map(|p| PathState {
                        dev: p.dev,
                        name: None,
                        active: p.active,
                        fail_count: p.fail_count,
                        state: None,
                    })
                    .collect(),
            },
            Err(e) => LayerState::Unreadable {
                error: format!("multipath status {:?}: {e}", t.params),
            },
        },
        "thin" => LayerState::ThinVolume,
        "thin-pool" => match parse_thin_pool(&t.params) {
            Ok(s) => LayerState::ThinPool {
                status: pool_state(&s),
            },
            Err(e) => LayerState::Unreadable {
                error: format!("thin-pool status {:?}: {e}", t.params),
            },
        },
        _ => LayerState::Plain,
    }
}

fn pool_state(s: &ThinPoolStatus) -> PoolState {
    match s {
        ThinPoolStatus::Working(u) => PoolState::Working {
            mode: match u.mode {
                dm_status::PoolMode::ReadWrite => "rw",
                dm_status::PoolMode::ReadOnly => "ro",
                dm_status::PoolMode::OutOfDataSpace => "out_of_data_space",
            },
            data_percent: u.data_percent(),
            metadata_percent: u.metadata_percent(),
            error_if_no_space: u.error_if_no_space,
            needs_check: u.needs_check,
        },
        ThinPoolStatus::Failed => PoolState::Failed,
        ThinPoolStatus::Error => PoolState::Error,
    }
}

/// The multipath devices among `devices` (dm devices whose table's first
/// target is `multipath`), for [`Topology::scan`]: errors on their paths are
/// dm-multipath's to retry or pass up, not the volume's. One table query per
/// dm device; where that is refused (no CAP_SYS_ADMIN, no /dev), the dm
/// uuid multipath-tools gives its maps (`mpath-`) decides.
pub(crate) fn multipath_devices(sys_root: &Path, devices: &[crate::BlockDevice]) -> Vec<Dev> {
    let dm: Vec<(Dev, &str)> = devices
        .iter()
        .filter(|d| {
            sys_root
                .join("class/block")
                .join(&d.name)
                .join("dm")
                .is_dir()
        })
        .map(|d| (d.dev, d.name.as_str()))
        .collect();
    if dm.is_empty() {
        return Vec::new();
    }
    let control = DmControl::open(Path::new(DM_CONTROL))
        .map_err(|e| tracing::debug!("no device-mapper tables: opening {DM_CONTROL}: {e}"))
        .ok();
    dm.into_iter()
        .filter(|(d, name)| {
            let by_table = control
                .as_ref()
                .and_then(|c| match c.targets(*d, Query::Table) {
                    Ok(t) => Some(t.first().is_some_and(|t| t.target_type == "multipath")),
                    Err(e) => {
                        tracing::debug!(dev = %d, "device-mapper table unreadable: {e}");
                        None
                    }
                });
            // Without the table (no CAP_SYS_ADMIN): multipath-tools' uuid.
            by_table.unwrap_or_else(|| {
                read_attr(&sys_root.join("class/block").join(name).join("dm/uuid"))
                    .is_ok_and(|u| u.starts_with("mpath-"))
            })
        })
        .map(|(d, _)| d)
        .collect()
}

/// A sysfs attribute, trimmed; at most a page (sysfs prints no more).
pub(crate) fn read_attr(path: &Path) -> Result<String, String> {
    let f = fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut s = String::new();
    f.take(4096)
        .read_to_string(&mut s)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(s.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::BlockDevice;

    fn dev(d: Dev, name: &str, slaves: &[Dev]) -> BlockDevice {
        BlockDevice {
            dev: d,
            name: name.into(),
            whole_disk: None,
            partition: None,
            size_sectors: 1 << 20,
            loop_backing_file: None,
            holders: Vec::new(),
            slaves: slaves.to_vec(),
            read_only: false,
            diskseq: None,
        }
    }

    #[test]
    fn a_stack_is_read_layer_by_layer_from_sysfs() {
        // md0 (raid1, degraded) on sda and sdb; sda's device is offline.
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path();
        let attr = |p: &str, v: &str| {
            let p = sys.join("class/block").join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{v}\n")).unwrap();
        };
        for (k, v) in [
            ("level", "raid1"),
            ("raid_disks", "2"),
            ("degraded", "1"),
            ("array_state", "clean"),
        ] {
            attr(&format!("md0/md/{k}"), v);
        }
        attr("sda/device/state", "offline");
        attr("sdb/device/state", "running");
        let (sda, sdb, md0) = (Dev::new(8, 0), Dev::new(8, 16), Dev::new(9, 0));
        let topo = Topology::from_parts(
            vec![
                dev(sda, "sda", &[]),
                dev(sdb, "sdb", &[]),
                dev(md0, "md0", &[sda, sdb]),
            ],
            vec![],
        );
        let mut r = StackReader::new(sys, &sys.join("no-control"));
        let stacks = r.read(&topo, &[md0, Dev::new(7, 7)]);
        let md = &stacks[&md0];
        let LayerState::Md(s) = &md.state else {
            panic!("{md:?}")
        };
        assert_eq!(s.degraded, 1);
        let below: Vec<(&str, &LayerState)> = md
            .below
            .iter()
            .map(|l| (l.name.as_str(), &l.state))
            .collect();
        assert_eq!(
            below,
            [
                (
                    "sda",
                    &LayerState::Disk {
                        state: "offline".into(),
                        health: None,
                    }
                ),
                (
                    "sdb",
                    &LayerState::Disk {
                        state: "running".into(),
                        health: None,
                    }
                ),
            ]
        );
        assert_eq!(md.walk().len(), 3);
        // A device sysfs does not list is reported, not dropped.
        assert_eq!(
            stacks[&Dev::new(7, 7)].state,
            LayerState::Unreadable {
                error: "not in sysfs".into()
            }
        );
        let json = serde_json::to_value(md).unwrap();
        assert_eq!(json["kind"], "md");
        assert_eq!(json["below"][0]["kind"], "disk");
        assert_eq!(json["below"][0]["state"], "offline");
    }

    #[test]
    fn an_nvme_head_lists_its_paths_and_remembers_removed_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path();
        let attr = |p: &str, v: &str| {
            let p = sys.join("class/block").join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{v}\n")).unwrap();
        };
        attr("nvme0c0n1/device/state", "live");
        attr("nvme0c0n1/ana_state", "optimized");
        attr("nvme0c1n1/device/state", "connecting");
        // Being removed: its controller's state is gone already.
        attr("nvme0c2n1/ana_state", "optimized");
        let (p0, head, p1) = (Dev::new(259, 0), Dev::new(259, 1), Dev::new(259, 2));
        let both = vec![
            dev(p0, "nvme0c0n1", &[]),
            dev(head, "nvme0n1", &[p0, p1]),
            dev(p1, "nvme0c1n1", &[]),
        ];
        let mut r = StackReader::new(sys, &sys.join("no-control"));
        let paths = |r: &mut StackReader, devices: Vec<BlockDevice>| {
            let topo = Topology::from_parts(devices, vec![]);
            let layer = r.read(&topo, &[head]).remove(&head).unwrap();
            let LayerState::Multipath { paths, .. } = layer.state else {
                panic!("{layer:?}")
            };
            paths
                .into_iter()
                .map(|p| (p.name.unwrap(), p.active, p.state))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            paths(&mut r, both),
            [
                ("nvme0c0n1".to_string(), true, None),
                (
                    "nvme0c1n1".to_string(),
                    false,
                    Some("connecting".to_string())
                ),
                (
                    "nvme0c2n1".to_string(),
                    false,
                    Some("state unreadable".to_string())
                ),
            ]
        );
        fs::remove_dir_all(sys.join("class/block/nvme0c2n1")).unwrap();
        // The second controller was removed after ctrl_loss_tmo.
        fs::remove_dir_all(sys.join("class/block/nvme0c1n1")).unwrap();
        let one = vec![dev(p0, "nvme0c0n1", &[]), dev(head, "nvme0n1", &[p0])];
        assert_eq!(
            paths(&mut r, one)[1..],
            [
                ("nvme0c1n1".to_string(), false, Some("removed".to_string())),
                ("nvme0c2n1".to_string(), false, Some("removed".to_string())),
            ]
        );
        // Both: the head is still a multipath device, with no path up.
        fs::remove_dir_all(sys.join("class/block/nvme0c0n1")).unwrap();
        let none = paths(&mut r, vec![dev(head, "nvme0n1", &[])]);
        assert_eq!(none.iter().filter(|p| p.1).count(), 0);
        assert_eq!(none.len(), 3);
    }

    #[test]
    fn without_the_status_call_dm_devices_are_known_by_their_uuid() {
        let tmp = tempfile::tempdir().unwrap();
        let sys = tmp.path();
        let attr = |p: &str, v: &str| {
            let p = sys.join("class/block").join(p);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{v}\n")).unwrap();
        };
        attr("dm-0/dm/uuid", "mpath-3600140512345");
        attr("dm-1/dm/uuid", "LVM-abcdefgh-tpool");
        attr("dm-2/dm/uuid", "LVM-abcdefghijkl");
        attr("dm-3/dm/uuid", "");
        attr("sda/device/state", "running");
        attr("sdb/device/state", "offline");
        let (sda, sdb) = (Dev::new(8, 0), Dev::new(8, 16));
        let dm = |n| Dev::new(253, n);
        let topo = Topology::from_parts(
            vec![
                dev(sda, "sda", &[]),
                dev(sdb, "sdb", &[]),
                dev(dm(0), "dm-0", &[sda, sdb]),
                dev(dm(1), "dm-1", &[]),
                dev(dm(2), "dm-2", &[dm(1)]),
                dev(dm(3), "dm-3", &[]),
            ],
            vec![],
        );
        let mut r = StackReader::new(sys, &sys.join("no-control"));
        let s = r.read(&topo, &[dm(0), dm(2), dm(3)]);
        let LayerState::Multipath { paths, .. } = &s[&dm(0)].state else {
            panic!("{:?}", s[&dm(0)])
        };
        let names: Vec<(&str, bool)> = paths
            .iter()
            .map(|p| (p.name.as_deref().unwrap(), p.active))
            .collect();
        assert_eq!(names, [("sda", true), ("sdb", true)]);
        assert_eq!(s[&dm(2)].state, LayerState::Plain);
        let LayerState::Unreadable { error } = &s[&dm(2)].below[0].state else {
            panic!("{:?}", s[&dm(2)])
        };
        assert!(error.contains("CAP_SYS_ADMIN"), "{error}");
        assert!(matches!(s[&dm(3)].state, LayerState::Unreadable { .. }));
        assert_eq!(multipath_devices(sys, topo.devices()), [dm(0)]);
    }

    #[test]
    fn dm_layers_follow_their_first_target() {
        let t = |ty: &str, params: &str| DmTarget {
            start: 0,
            length: 8,
            target_type: ty.into(),
            params: params.into(),
        };
        assert_eq!(dm_layer(&[]), LayerState::Plain);
        assert_eq!(dm_layer(&[t("linear", "8:1 0")]), LayerState::Plain);
        assert_eq!(dm_layer(&[t("thin", "0 -")]), LayerState::ThinVolume);
        let LayerState::Multipath { paths, .. } =
            dm_layer(&[t("multipath", "2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:16 F 2")])
        else {
            panic!()
        };
        assert_eq!(paths.iter().filter(|p| p.active).count(), 1);
        let LayerState::ThinPool { status } = dm_layer(&[t(
            "thin-pool",
            "1 1/4 3/4 - out_of_data_space discard_passdown queue_if_no_space -",
        )]) else {
            panic!()
        };
        assert_eq!(
            status,
            PoolState::Working {
                mode: "out_of_data_space",
                data_percent: 75.0,
                metadata_percent: 25.0,
                error_if_no_space: false,
                needs_check: false
            }
        );
        assert!(matches!(
            dm_layer(&[t("multipath", "garbage")]),
            LayerState::Unreadable { .. }
        ));
    }
}
