//! Error events as the agent reports them: the JSON Lines schema of
//! `watch --json` and the human-readable line.
//!
//! Every key is always present (null when unknown) so consumers can rely on
//! the shape; docs/reference/json-schema.md documents each field.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::SystemTime;

use health_common::{source, ErrorSample};
use health_core::conditions::errno_name;
use health_core::dev::Dev;
use health_kernel::clock::Clock;
use health_kernel::collector::KernelError;
use health_kernel::names::{op_name, source_name, Kind};
use health_topology::Topology;
use serde::Serialize;

use crate::volumes::kubelet::{KubeletVolume, VolumeMode};

/// One line of `watch --json`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ErrorEvent {
    /// RFC 3339 UTC: when the kernel saw the (last) error; for summaries,
    /// when the agent accounted for them.
    pub time: String,
    pub kind: Kind,
    /// The tracepoint that reported it.
    pub source: &'static str,
    /// The device the error belongs to, after partition resolution.
    pub device: Dev,
    /// Kernel name of `device` (`loop3`, `sda2`), null if it is gone.
    pub disk: Option<String>,
    /// The whole disk when `device` is a partition.
    pub parent_disk: Option<String>,
    pub op: Option<&'static str>,
    pub errno: Option<u32>,
    pub errno_name: Option<String>,
    /// First sector of the failed request on the whole disk (512-byte units).
    pub sector: Option<u64>,
    pub sectors: Option<u32>,
    /// How many kernel errors this line stands for.
    pub count: u64,
    /// False for summaries of errors whose samples were rate-limited away.
    pub sampled: bool,
    /// The mount point of the affected filesystem (the first, by mount id).
    pub mount: Option<PathBuf>,
    /// Every mount of the affected filesystem (bind mounts included).
    pub mounts: Vec<PathBuf>,
    pub fs_type: Option<String>,
    /// The file behind a loop device.
    pub backing_file: Option<PathBuf>,
    pub inode: Option<u64>,
    /// Source-specific text: rwbs, ext4 function and line, xfs flags.
    pub detail: Option<String>,
    /// The task the tracepoint ran in (for block completions often an
    /// interrupt or worker, not the process that issued the I/O).
    pub task: Option<String>,
    /// CLOCK_MONOTONIC nanoseconds at the tracepoint, for correlation.
    pub mono_ns: Option<u64>,
    /// The pod volume this line is about, when `device` backs one (see
    /// `crate::volumes`); all five are null otherwise. A device that backs
    /// several pod volumes (a PV shared by two pods, volumes stacked on one
    /// disk) yields one line per pod volume, each with the full `count`: sum
    /// counts per (`pod_uid`, `pv`), never across pod volumes.
    pub pod_uid: Option<String>,
    /// The PV name; null for inline ephemeral volumes too.
    pub pv: Option<String>,
    /// The CSI driver; null for local PVs.
    pub driver: Option<String>,
    pub volume_handle: Option<String>,
    /// `Filesystem` or `Block`.
    pub volume_mode: Option<VolumeMode>,
}

fn text(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let s = String::from_utf8_lossy(&bytes[..end]).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// Source-specific detail from a sample.
fn detail(s: &ErrorSample) -> Option<String> {
    let t = text(&s.detail);
    match s.key.source {
        source::BLOCK_RQ_ERROR | source::BLOCK_RQ_COMPLETE | source::BLOCK_BIO_ERROR => {
            t.map(|rwbs| format!("rwbs {rwbs}"))
        }
        source::EXT4_ERROR => t.map(|f| format!("{f}:{}", s.flags)),
        source::EXT4_SHUTDOWN => Some(format!("shutdown flags {:#x}", s.flags)),
        source::XFS_SHUTDOWN => Some(format!(
            "{} at {}:{}",
            xfs_shutdown_flags(s.flags),
            t.unwrap_or_else(|| "?".into()),
            s.ino
        )),
        source::XFS_CORRUPTION => Some(format!(
            "{} marked corrupt (sick mask {:#x})",
            t.unwrap_or_default(),
            s.flags
        )),
        source::WRITEBACK_ERROR => Some(match t.as_deref() {
            Some("fentry") => format!("errseq before {:#x}", s.flags),
            Some("errseq") => format!(
                "errseq before {:#x}; errno from the file's earlier error",
                s.flags
            ),
            Some("last-write") => format!(
                "errseq before {:#x}; errno of the device's last failed write",
                s.flags
            ),
            _ => format!("errseq before {:#x}; errno unknown", s.flags),
        }),
        _ => t,
    }
}

/// The SHUTDOWN_* flags of fs/xfs/xfs_mount.h.
fn xfs_shutdown_flags(flags: u32) -> String {
    let names = [
        (1 << 0, "metadata_io"),
        (1 << 1, "log_io"),
        (1 << 2, "force_umount"),
        (1 << 3, "corruption"),
        (1 << 5, "device_removed"),
    ];
    let set: Vec<&str> = names
        .iter()
        .filter(|(b, _)| flags & b != 0)
        .map(|(_, n)| *n)
        .collect();
    if set.is_empty() {
        format!("flags {flags:#x}")
    } else {
        set.join("|")
    }
}

impl ErrorEvent {
    /// Names the device and its mounts and formats what the kernel said.
    pub fn resolve(e: &KernelError, topo: &Topology, clock: &Clock, now: SystemTime) -> ErrorEvent {
        let device = Dev::from_kernel(e.key.dev);
        let bdev = topo.device(device);
        let parent_disk = bdev
            .and_then(|b| b.whole_disk)
            .and_then(|d| topo.device(d))
            .map(|d| d.name.clone());
        let mounts = topo.affected_mounts(device);
        let s = e.sample.as_ref();
        let errno = (e.key.errno != 0).then_some(e.key.errno);
        ErrorEvent {
            time: rfc3339(s.map_or(now, |s| clock.wall_time(s.mono_ns))),
            kind: Kind::of_source(e.key.source),
            source: source_name(e.key.source),
            device,
            disk: bdev.map(|b| b.name.clone()),
            parent_disk,
            op: op_name(e.key.op),
            errno,
            errno_name: errno.map(|e| errno_name(e as i32)),
            sector: s.and_then(|s| (s.sector != u64::MAX).then_some(s.sector)),
            sectors: s.and_then(|s| (s.sector != u64::MAX).then_some(s.nr_sectors)),
            count: e.count,
            sampled: s.is_some(),
            mount: mounts.first().map(|m| m.mount_point.clone()),
            fs_type: mounts.first().map(|m| m.fs_type.clone()),
            mounts: mounts.iter().map(|m| m.mount_point.clone()).collect(),
            backing_file: bdev.and_then(|b| b.loop_backing_file.clone()),
            inode: s.and_then(|s| match s.key.source {
                source::WRITEBACK_ERROR | source::XFS_CORRUPTION if s.ino != 0 => Some(s.ino),
                _ => None,
            }),
            detail: s.and_then(detail),
            task: s.and_then(|s| text(&s.comm).map(|c| format!("{c}[{}]", s.pid))),
            mono_ns: s.map(|s| s.mono_ns),
            pod_uid: None,
            pv: None,
            driver: None,
            volume_handle: None,
            volume_mode: None,
        }
    }

    /// Makes this line about `volume` (or about no volume).
    pub fn set_volume(&mut self, volume: Option<&KubeletVolume>) {
        self.pod_uid = volume.map(|v| v.pod_uid.clone());
        self.pv = volume.and_then(|v| v.pv.clone());
        self.driver = volume.and_then(|v| v.driver.clone());
        self.volume_handle = volume.and_then(|v| v.volume_handle.clone());
        self.volume_mode = volume.map(|v| v.volume_mode);
    }

    /// One line for people: time, what, where, how many.
    pub fn human_line(&self) -> String {
        let mut line = format!("{} {:<15} {}", self.time, self.kind.as_str(), self.device);
        if let Some(d) = &self.disk {
            let _ = write!(line, " {d}");
        }
        if let Some(op) = self.op {
            let _ = write!(line, " {op}");
        }
        if let Some(name) = &self.errno_name {
            let _ = write!(line, " {name}");
        }
        if let (Some(sector), Some(n)) = (self.sector, self.sectors) {
            let _ = write!(line, " sector {sector}+{n}");
        }
        if let Some(m) = &self.mount {
            let _ = write!(line, " on {}", m.display());
            if let Some(fs) = &self.fs_type {
                let _ = write!(line, " ({fs})");
            }
        }
        if let Some(d) = &self.detail {
            let _ = write!(line, " [{d}]");
        }
        if let Some(pod) = &self.pod_uid {
            let _ = write!(line, " pod {pod}");
            if let Some(pv) = &self.pv {
                let _ = write!(line, " pv {pv}");
            }
        }
        if self.count > 1 || !self.sampled {
            let what = if self.sampled {
                "with suppressed repeats"
            } else {
                "rate-limited, not sampled"
            };
            let _ = write!(line, " x{} ({what})", self.count);
        }
        line
    }
}

/// RFC 3339 in UTC, to the nanosecond (the JSON schema's `time`).
fn rfc3339(t: SystemTime) -> String {
    let t: time::OffsetDateTime = t.into();
    t.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

#[cfg(test)]
mod tests {
    use health_common::{op, CounterKey};
    use health_topology::{BlockDevice, MountEntry, Partition};

    use super::*;

    fn topo() -> Topology {
        let disk = BlockDevice {
            dev: Dev::new(7, 3),
            name: "loop3".into(),
            whole_disk: None,
            partition: None,
            size_sectors: 8192,
            loop_backing_file: Some("/tmp/fd/disk.img".into()),
            holders: vec![],
            slaves: vec![],
            read_only: false,
            diskseq: None,
        };
        let part = BlockDevice {
            dev: Dev::new(259, 1),
            name: "loop3p1".into(),
            whole_disk: Some(Dev::new(7, 3)),
            partition: Some(Partition {
                number: 1,
                start: 2048,
                sectors: 4096,
            }),
            size_sectors: 4096,
            loop_backing_file: None,
            holders: vec![],
            slaves: vec![],
            read_only: false,
            diskseq: None,
        };
        let mount = MountEntry {
            mount_id: 100,
            parent_id: 1,
            dev: Dev::new(259, 1),
            root: "/".into(),
            mount_point: "/mnt/data".into(),
            mount_options: "rw,relatime".into(),
            fs_type: "ext4".into(),
            source: "/dev/loop3p1".into(),
            super_options: "rw,errors=remount-ro".into(),
        };
        Topology::from_parts(vec![disk, part], vec![mount])
    }

    fn sample(key: CounterKey) -> ErrorSample {
        let mut detail = [0u8; 32];
        detail[..2].copy_from_slice(b"WS");
        let mut comm = [0u8; 16];
        comm[..7].copy_from_slice(b"kworker");
        ErrorSample {
            key,
            cpu: 0,
            seq: 3,
            mono_ns: 5_000_000_000,
            sector: 2056,
            ino: 0,
            cgroup: 0,
            raw_dev: Dev::new(7, 3).to_kernel(),
            nr_sectors: 8,
            flags: 0,
            pid: 42,
            comm,
            detail,
            _pad: 0,
        }
    }

    #[test]
    fn json_schema_of_a_block_error_on_a_partition() {
        let key = CounterKey::new(
            Dev::new(259, 1).to_kernel(),
            source::BLOCK_RQ_ERROR,
            op::WRITE,
            5,
        );
        let e = KernelError {
            key,
            count: 3,
            sample: Some(sample(key)),
        };
        let clock = Clock::with_offset(1_700_000_000_000_000_000);
        let ev = ErrorEvent::resolve(&e, &topo(), &clock, SystemTime::UNIX_EPOCH);
        let json = serde_json::to_value(&ev).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "time": "2023-11-14T22:13:25Z",
                "kind": "block_io_error",
                "source": "block_rq_error",
                "device": "259:1",
                "disk": "loop3p1",
                "parent_disk": "loop3",
                "op": "write",
                "errno": 5,
                "errno_name": "EIO",
                "sector": 2056,
                "sectors": 8,
                "count": 3,
                "sampled": true,
                "mount": "/mnt/data",
                "mounts": ["/mnt/data"],
                "fs_type": "ext4",
                "backing_file": null,
                "inode": null,
                "detail": "rwbs WS",
                "task": "kworker[42]",
                "mono_ns": 5_000_000_000u64,
                "pod_uid": null,
                "pv": null,
                "driver": null,
                "volume_handle": null,
                "volume_mode": null
            })
        );
        assert_eq!(
            ev.human_line(),
            "2023-11-14T22:13:25Z block_io_error  259:1 loop3p1 write EIO sector 2056+8 on /mnt/data (ext4) [rwbs WS] x3 (with suppressed repeats)"
        );

        // The same error as it reaches a pod volume on that partition.
        let vol = crate::volumes::kubelet::KubeletVolume {
            pod_uid: "11111111-aaaa-4aaa-8aaa-000000000001".into(),
            pv: Some("pvc-0a0a".into()),
            pod_volume_dir_name: "pvc-0a0a".into(),
            driver: Some("disk.csi.example.com".into()),
            volume_handle: Some("vol-a".into()),
            volume_mode: VolumeMode::Filesystem,
            kind: crate::volumes::kubelet::VolumeKind::Csi,
            path: "/mnt/data".into(),
            staging_path: None,
            node_name: None,
        };
        let mut ev = ev;
        ev.set_volume(Some(&vol));
        let json = serde_json::to_value(&ev).unwrap();
        assert_eq!(json["pod_uid"], "11111111-aaaa-4aaa-8aaa-000000000001");
        assert_eq!(json["pv"], "pvc-0a0a");
        assert_eq!(json["driver"], "disk.csi.example.com");
        assert_eq!(json["volume_handle"], "vol-a");
        assert_eq!(json["volume_mode"], "Filesystem");
        assert_eq!(json["count"], 3);
        assert!(
            ev.human_line()
                .contains("[rwbs WS] pod 11111111-aaaa-4aaa-8aaa-000000000001 pv pvc-0a0a x3"),
            "{}",
            ev.human_line()
        );
        ev.set_volume(None);
        assert!(serde_json::to_value(&ev).unwrap()["volume_mode"].is_null());
    }

    #[test]
    fn summaries_have_no_sample_fields() {
        let key = CounterKey::new(
            Dev::new(7, 3).to_kernel(),
            source::WRITEBACK_ERROR,
            op::WRITE,
            28,
        );
        let e = KernelError {
            key,
            count: 12,
            sample: None,
        };
        let ev = ErrorEvent::resolve(&e, &topo(), &Clock::new(), SystemTime::UNIX_EPOCH);
        assert_eq!(ev.kind, Kind::WritebackError);
        assert_eq!(ev.errno_name.as_deref(), Some("ENOSPC"));
        assert_eq!(
            (ev.sector, ev.sectors, ev.mono_ns, ev.sampled),
            (None, None, None, false)
        );
        assert_eq!(ev.time, "1970-01-01T00:00:00Z");
        assert_eq!(
            ev.backing_file.as_deref(),
            Some(std::path::Path::new("/tmp/fd/disk.img"))
        );
        assert_eq!(ev.count, 12);
    }

    #[test]
    fn errno_names() {
        assert_eq!(errno_name(5), "EIO");
        assert_eq!(errno_name(110), "ETIMEDOUT");
        assert_eq!(errno_name(4000), "errno 4000");
        assert_eq!(xfs_shutdown_flags(1), "metadata_io");
        assert_eq!(xfs_shutdown_flags(0x6), "log_io|force_umount");
    }
}
