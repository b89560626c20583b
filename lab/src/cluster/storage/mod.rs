//! The cluster's storage: a disk that fails on command, under the
//! project's own CSI driver that the kubelet itself registered, stages and
//! publishes through `health-agent csi-proxy`, with PVs ready for users'
//! claims.
//!
//! What `up` builds (each step is skipped when already in place):
//!
//! ```text
//! faultdisk server (daemon "faultdisk", --no-stdin)   state/storage/faultdisk/
//!   serves mnt/disk.img (384 MiB) over FUSE, fails chosen requests (`cluster fault`)
//!   |-- loop, direct I/O, image [0, 64 MiB)       vh-fs-1 (ext4 made at its first NodeStage)
//!   |-- ...                                        vh-fs-2..4
//!   |-- loop, direct I/O, image [256, 320 MiB)    vh-block-1
//!   `-- loop, direct I/O, image [320, 384 MiB)    vh-block-2
//! csi-proxy (daemon, `health-agent csi-proxy`)
//!     /var/lib/kubelet/plugins/loop.csi.volume-health.io/volume-health/csi.sock
//! csi-loop-driver (daemon, records in state/storage/driver)
//!     /var/lib/kubelet/plugins/loop.csi.volume-health.io/csi.sock, and the
//!     kubelet's registration in plugins_registry/, announcing the proxy's socket
//! CSIDriver loop.csi.volume-health.io, StorageClass volume-health-faulty (the
//! default, Immediate binding), PVs vh-fs-1..4 (Filesystem) and vh-block-1..2
//! (Block), 64 MiB each, from CSI CreateVolume over their stretch of the image.
//! ```
//!
//! Each volume is its own stretch of the disk under a loop device of its
//! own (as a PV is its own disk in a real cluster), which the driver finds
//! already attached and uses: `cluster fault add --volume vh-fs-1` fails
//! that whole stretch, so that files a pod creates later fail too, and
//! errors in one volume never touch another. The filesystems have no
//! journal and continue on errors: a failed metadata write would otherwise
//! abort the journal and leave the volume read-only for good, and `fault
//! clear` must bring it back.
//!
//! Injecting errors (`cargo xtask cluster fault`, [`fault`]):
//!
//! ```text
//! cluster fault add --volume vh-fs-1 [--op write] [--errno EIO]
//! cluster fault add --volume vh-block-1 --op read --offset 1M --len 64K
//! cluster fault add --path /var/lib/kubelet/pods/<uid>/volumes/kubernetes.io~csi/vh-fs-1/mount/f
//! cluster fault stats [--json]
//! cluster fault clear
//! ```
//!
//! `--path` takes a file or directory on any of the volumes' filesystems
//! (through any mount of it, a pod's included), or a block volume's device;
//! its data extents (FIEMAP, as `filefrag` reads them) become byte ranges of
//! the disk image. `--offset`/`--len` narrow the target in its own bytes (the
//! file's, the volume's device's). Reads are failed only when they reach the
//! disk: a page cache hit never does (read with O_DIRECT, or drop caches).
//!
//! `cluster.json`'s `storage` ([`Description`]) tells tests and scripts all
//! of this: the control socket, the sockets, and each PV's device and
//! stretch.

mod disk;
mod driver;
mod extents;
mod fault;
mod objects;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};
use xtask::util::say;

use super::{daemon, State};
pub(super) use fault::fault;

const MIB: u64 = 1 << 20;
/// The StorageClass of the PVs (the cluster's default class).
pub(super) const STORAGE_CLASS: &str = "volume-health-faulty";

/// How a volume is consumed (a PV's `volumeMode`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) enum Mode {
    Filesystem,
    Block,
}

/// A PV that `up` makes.
struct VolumeSpec {
    pv: &'static str,
    mode: Mode,
    bytes: u64,
}

/// Four filesystem volumes and two block volumes: a test suite can bind a
/// few claims at once (a deleted claim leaves its PV Released until the
/// next `up`).
const VOLUMES: &[VolumeSpec] = &[
    fs("vh-fs-1"),
    fs("vh-fs-2"),
    fs("vh-fs-3"),
    fs("vh-fs-4"),
    block("vh-block-1"),
    block("vh-block-2"),
];

const VOLUME_BYTES: u64 = 64 * MIB;

const fn fs(pv: &'static str) -> VolumeSpec {
    VolumeSpec {
        pv,
        mode: Mode::Filesystem,
        bytes: VOLUME_BYTES,
    }
}

const fn block(pv: &'static str) -> VolumeSpec {
    VolumeSpec {
        pv,
        mode: Mode::Block,
        bytes: VOLUME_BYTES,
    }
}

/// A stretch of the disk image with a loop device of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Region {
    pub offset: u64,
    pub bytes: u64,
}

/// Each volume's stretch of the image, in [`VOLUMES`] order, adjacent from
/// its start; and the image's size.
fn layout() -> (Vec<Region>, u64) {
    let mut next = 0;
    let regions = VOLUMES
        .iter()
        .map(|v| {
            let r = Region {
                offset: next,
                bytes: v.bytes,
            };
            next += v.bytes;
            r
        })
        .collect();
    (regions, next)
}

/// The `storage` part of `cluster.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Description {
    /// The faultdisk server's control socket (JSON lines:
    /// `health_tests::protocol`); `cluster fault` speaks it.
    pub control_socket: PathBuf,
    /// The disk image every volume's loop device reads and writes.
    pub image: PathBuf,
    pub image_bytes: u64,
    pub driver: String,
    /// The driver's own socket (the agent and a controller reach it there).
    pub csi_socket: PathBuf,
    /// `health-agent csi-proxy`'s socket, which the kubelet calls.
    pub proxy_socket: PathBuf,
    /// The driver's registration socket in the kubelet's plugins_registry.
    pub registration_socket: PathBuf,
    /// The driver's records.
    pub driver_state: PathBuf,
    pub storage_class: String,
    pub volumes: Vec<Volume>,
}

/// A PV and what backs it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct Volume {
    pub pv: String,
    pub volume_handle: String,
    pub mode: Mode,
    pub capacity_bytes: u64,
    /// The loop device over its stretch of the image (the driver stages
    /// it; ext4 for a Filesystem volume, mapped into pods for a Block one).
    pub device: PathBuf,
    /// "7:N", as block tracepoints and mountinfo name it.
    pub maj_min: String,
    pub region: Region,
}

impl Description {
    /// The `storage` of `cluster.json`, when `up` wrote it.
    pub(super) fn read(state: &State) -> anyhow::Result<Option<Description>> {
        let Some(whole) = state.read_description()? else {
            return Ok(None);
        };
        match whole.get("storage") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(storage) => serde_json::from_value(storage.clone())
                .context("cluster.json's `storage` is not what `cluster up` writes")
                .map(Some),
        }
    }

    /// Replaces `storage` in `cluster.json`, leaving the rest as it is.
    fn write(&self, state: &State) -> anyhow::Result<()> {
        let mut whole = state
            .read_description()?
            .context("no cluster.json: the cluster's core was not brought up")?;
        whole["storage"] = serde_json::to_value(self)?;
        state.write_description(&whole)
    }

    pub(super) fn volume(&self, pv: &str) -> anyhow::Result<&Volume> {
        self.volumes.iter().find(|v| v.pv == pv).with_context(|| {
            let names: Vec<&str> = self.volumes.iter().map(|v| v.pv.as_str()).collect();
            format!("no volume {pv} on the fault disk (there are {names:?})")
        })
    }
}

/// The storage directory: everything but the sockets under the kubelet's root.
fn dir(state: &State) -> PathBuf {
    state.path("storage")
}

/// Builds what is missing, after the Node is Ready; fills `storage` in
/// `cluster.json`.
pub(super) fn up(state: &State) -> anyhow::Result<()> {
    let disk = match disk::FaultDisk::connect(state)? {
        Some(disk) => disk,
        None => {
            // A disk that is gone took the volumes with it: what is left
            // of them (and the driver's records of them) goes too before a
            // fresh one.
            down(state).context("clearing what a previous fault disk left")?;
            disk::FaultDisk::start(state)?
        }
    };
    let (regions, _) = layout();
    let mut devices = Vec::new();
    for region in &regions {
        devices.push(disk.loop_over(*region)?);
    }
    // The proxy first: the driver's registration sends the kubelet to it.
    driver::ensure_proxy(state)?;
    let driver_state = dir(state).join("driver");
    driver::ensure_plugin(state, &driver_state)?;
    let rt = runtime()?;
    let mut volumes = Vec::new();
    for ((spec, region), (device, maj_min)) in VOLUMES.iter().zip(regions).zip(devices) {
        let created = rt.block_on(driver::create_volume(spec, disk.image(), region))?;
        let volume = Volume {
            pv: spec.pv.to_string(),
            volume_handle: created.id.clone(),
            mode: spec.mode,
            capacity_bytes: spec.bytes,
            device,
            maj_min,
            region,
        };
        volumes.push((volume, created));
    }
    rt.block_on(async {
        let client = objects::client(state).await?;
        objects::apply_csi_driver(&client).await?;
        objects::wait_registered(&client, state.node_name(), Duration::from_secs(60)).await?;
        objects::apply_storage_class(&client).await?;
        for (volume, created) in &volumes {
            objects::apply_pv(&client, state.node_name(), volume, created).await?;
        }
        anyhow::Ok(())
    })?;
    let description = Description {
        control_socket: disk.control_socket().to_path_buf(),
        image: disk.image().to_path_buf(),
        image_bytes: disk.size(),
        driver: driver::DRIVER.to_string(),
        csi_socket: driver::socket(),
        proxy_socket: driver::proxy_socket(),
        registration_socket: driver::registration_socket(),
        driver_state,
        storage_class: STORAGE_CLASS.to_string(),
        volumes: volumes.into_iter().map(|(v, _)| v).collect(),
    };
    description.write(state)?;
    let names: Vec<&str> = description.volumes.iter().map(|v| v.pv.as_str()).collect();
    say(format!(
        "storage: {} registered through csi-proxy; PVs {} in StorageClass {STORAGE_CLASS} on the fault disk {}",
        driver::DRIVER,
        names.join(", "),
        description.image.display()
    ));
    Ok(())
}

/// Stops the driver and the proxy, takes every mount and loop device of
/// the fault disk away, stops its server and removes the files (the
/// driver's records with them). Runs after the kubelet is gone; idempotent.
pub(super) fn down(state: &State) -> anyhow::Result<()> {
    let mut errors = Vec::new();
    for name in [driver::PLUGIN_DAEMON, driver::PROXY_DAEMON] {
        if let Err(e) = daemon::stop(state, name, Duration::from_secs(10)) {
            errors.push(format!("{e:#}"));
        }
    }
    if let Err(e) = driver::remove_sockets() {
        errors.push(format!("{e:#}"));
    }
    if let Err(e) = disk::tear_down(state, &dir(state)) {
        errors.push(format!("{e:#}"));
    }
    if errors.is_empty() {
        if let Some(mut whole) = state.read_description()? {
            if !whole["storage"].is_null() {
                whole["storage"] = serde_json::Value::Null;
                state.write_description(&whole)?;
            }
        }
        Ok(())
    } else {
        bail!("storage teardown: {}", errors.join("; "))
    }
}

/// Each piece: (component, ok, detail).
pub(super) fn status(state: &State) -> Vec<(String, bool, String)> {
    let description = match Description::read(state) {
        Ok(Some(d)) => d,
        Ok(None) => {
            return vec![(
                "storage".into(),
                false,
                "not set up (cluster.json has no storage)".into(),
            )]
        }
        Err(e) => return vec![("storage".into(), false, format!("{e:#}"))],
    };
    let mut out = disk::status(state, &description);
    out.extend(driver::status(state));
    match runtime().and_then(|rt| rt.block_on(objects::status(state, &description))) {
        Ok(rows) => out.extend(rows),
        Err(e) => out.push(("storage objects".into(), false, format!("{e:#}"))),
    }
    out
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("building a tokio runtime")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_volume_gets_its_own_adjacent_region() {
        let (regions, total) = layout();
        let at = |i: u64| Region {
            offset: 64 * i * MIB,
            bytes: 64 * MIB,
        };
        assert_eq!(regions, (0..6).map(at).collect::<Vec<_>>());
        assert_eq!(total, 384 * MIB);
    }

    #[test]
    fn the_description_round_trips_through_json() {
        let d = Description {
            control_socket: "/s/ctl.sock".into(),
            image: "/s/mnt/disk.img".into(),
            image_bytes: 384 * MIB,
            driver: "loop.csi.volume-health.io".into(),
            csi_socket: "/var/lib/kubelet/plugins/loop.csi.volume-health.io/csi.sock".into(),
            proxy_socket: "/p".into(),
            registration_socket: "/r".into(),
            driver_state: "/s/driver".into(),
            storage_class: STORAGE_CLASS.into(),
            volumes: vec![Volume {
                pv: "vh-block-1".into(),
                volume_handle: "id".into(),
                mode: Mode::Block,
                capacity_bytes: 64 * MIB,
                device: "/dev/loop5".into(),
                maj_min: "7:5".into(),
                region: Region {
                    offset: 256 * MIB,
                    bytes: 64 * MIB,
                },
            }],
        };
        let json = serde_json::to_value(&d).unwrap();
        assert_eq!(json["volumes"][0]["mode"], "Block");
        assert_eq!(json["volumes"][0]["region"]["offset"], 256 * MIB);
        let back: Description = serde_json::from_value(json).unwrap();
        assert_eq!(back, d);
        assert_eq!(back.volume("vh-block-1").unwrap().maj_min, "7:5");
        let missing = back.volume("vh-fs-9").unwrap_err().to_string();
        assert_eq!(
            missing,
            "no volume vh-fs-9 on the fault disk (there are [\"vh-block-1\"])"
        );
    }
}
