//! Pod volumes through `health_node::volumes`: which volumes a kernel error
//! reaches (the index, stacked devices, btrfs members, md arrays), the
//! conditions the monitor derives from kernel errors and CSI answers, and
//! the CSI prober against in-process drivers of each generation.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use health_common::{op, source, CounterKey};
use health_core::conditions::{Change, ConditionConfig, Source, Status};
use health_core::dev::Dev;
use health_csi::testing::{DriverMode, NodeCapability, Rpc, TestDriver};
use health_csi::{HealthEntry, HealthStatus};
use health_kernel::collector::KernelError;
use health_node::volumes::kubelet::{self, KubeletVolume, VolumeKind, VolumeMode};
use health_node::volumes::{
    CsiOutcome, CsiProber, CsiResult, VolumeChanges, VolumeIndex, VolumeKey, VolumeMonitor,
};
use health_topology::{parse_mountinfo, BlockDevice, BtrfsFilesystem, Partition, Topology};

const SDA: Dev = Dev::new(8, 0);
const SDA1: Dev = Dev::new(8, 1);
const SDA2: Dev = Dev::new(8, 2);
const DM0: Dev = Dev::new(253, 0);
const LOOP0: Dev = Dev::new(7, 0);
const LOOP1: Dev = Dev::new(7, 1);
const BTRFS: Dev = Dev::new(0, 40);
const TMPFS: Dev = Dev::new(0, 55);

fn disk(dev: Dev, name: &str) -> BlockDevice {
    BlockDevice {
        dev,
        name: name.into(),
        whole_disk: None,
        partition: None,
        size_sectors: 1 << 20,
        loop_backing_file: None,
        holders: vec![],
        slaves: vec![],
        read_only: false,
        diskseq: None,
    }
}

fn part(dev: Dev, name: &str, number: u32, start: u64) -> BlockDevice {
    BlockDevice {
        whole_disk: Some(SDA),
        partition: Some(Partition {
            number,
            start,
            sectors: 1 << 18,
        }),
        ..disk(dev, name)
    }
}

fn pod_path(pod: &str, pv: &str) -> String {
    format!("/var/lib/kubelet/pods/{pod}/volumes/kubernetes.io~csi/{pv}/mount")
}

fn volume(pod: &str, pv: &str, mode: VolumeMode) -> KubeletVolume {
    let path = match mode {
        VolumeMode::Filesystem => pod_path(pod, pv),
        VolumeMode::Block => {
            format!("/var/lib/kubelet/pods/{pod}/volumeDevices/kubernetes.io~csi/{pv}")
        }
    };
    KubeletVolume {
        pod_uid: pod.into(),
        pv: Some(pv.into()),
        pod_volume_dir_name: pv.into(),
        driver: Some("disk.csi.example.com".into()),
        volume_handle: Some(format!("handle-{pv}")),
        volume_mode: mode,
        kind: VolumeKind::Csi,
        path: PathBuf::from(path),
        staging_path: None,
        node_name: None,
    }
}

/// sda1 -> dm-0 mounted for pods a and b (one PV), sda2 for pod c, a btrfs
/// on loop0 for pod d, a block volume on loop1 for pod e, a tmpfs for pod g
/// and a volume of pod f that is not mounted.
fn fixture() -> (Topology, Vec<KubeletVolume>) {
    let mut p1 = part(SDA1, "sda1", 1, 2048);
    p1.holders = vec![DM0];
    let mut dm = disk(DM0, "dm-0");
    dm.slaves = vec![SDA1];
    let mounts = parse_mountinfo(&format!(
        "1 0 254:0 / / rw - ext4 /dev/vda rw\n\
         20 1 253:0 / /staging/pv-shared rw - ext4 /dev/dm-0 rw\n\
         21 1 253:0 / {} rw - ext4 /dev/dm-0 rw\n\
         22 1 253:0 / {} rw - ext4 /dev/dm-0 rw\n\
         23 1 8:2 / {} rw - xfs /dev/sda2 rw\n\
         24 1 0:40 /sub {} rw - btrfs /dev/loop0 rw,subvol=/sub\n\
         25 1 0:55 / {} rw - tmpfs tmpfs rw\n",
        pod_path("a", "pv-shared"),
        pod_path("b", "pv-shared"),
        pod_path("c", "pv-xfs"),
        pod_path("d", "pv-btrfs"),
        pod_path("g", "pv-tmp"),
    ))
    .unwrap();
    let topo = Topology::from_parts(
        vec![
            disk(SDA, "sda"),
            p1,
            part(SDA2, "sda2", 2, 4096 + (1 << 18)),
            dm,
            disk(LOOP0, "loop0"),
            disk(LOOP1, "loop1"),
        ],
        mounts,
    )
    .with_btrfs(vec![BtrfsFilesystem {
        fsid: Some("f".into()),
        fs_dev: BTRFS,
        devices: vec![LOOP0],
        subvolume_devs: vec![],
    }]);
    let vols = vec![
        volume("a", "pv-shared", VolumeMode::Filesystem),
        volume("b", "pv-shared", VolumeMode::Filesystem),
        volume("c", "pv-xfs", VolumeMode::Filesystem),
        volume("d", "pv-btrfs", VolumeMode::Filesystem),
        volume("e", "pv-blk", VolumeMode::Block),
        volume("f", "pv-gone", VolumeMode::Filesystem),
        volume("g", "pv-tmp", VolumeMode::Filesystem),
    ];
    (topo, vols)
}

fn index() -> VolumeIndex {
    let (topo, vols) = fixture();
    // Block devices are given: resolving them would stat device nodes.
    let resolved = vols
        .into_iter()
        .map(|v| {
            let dev = match v.volume_mode {
                VolumeMode::Block => Some(LOOP1),
                VolumeMode::Filesystem => kubelet::resolve_device(&v, topo.mounts()),
            };
            (v, dev)
        })
        .collect();
    VolumeIndex::from_resolved(&topo, resolved)
}

fn pods(index: &VolumeIndex, dev: Dev) -> Vec<String> {
    index
        .volumes_for(dev)
        .map(|v| v.key.pod_uid.clone())
        .collect()
}

#[test]
fn errors_reach_every_volume_stacked_on_their_device() {
    let idx = index();
    assert_eq!(idx.len(), 7);
    let dev_of = |pod: &str| {
        idx.volumes()
            .iter()
            .find(|v| v.key.pod_uid == pod)
            .unwrap()
            .device
    };
    assert_eq!(dev_of("a"), Some(DM0));
    assert_eq!(dev_of("d"), Some(BTRFS));
    assert_eq!(dev_of("f"), None);
    // A whole-disk error (a flush) reaches everything on both partitions.
    assert_eq!(pods(&idx, SDA), ["a", "b", "c"]);
    // The shared PV: both pods, through the partition and the dm device.
    assert_eq!(pods(&idx, SDA1), ["a", "b"]);
    assert_eq!(pods(&idx, DM0), ["a", "b"]);
    assert_eq!(pods(&idx, SDA2), ["c"]);
    // btrfs: a member device's block error and the filesystem's own dev.
    assert_eq!(pods(&idx, LOOP0), ["d"]);
    assert_eq!(pods(&idx, BTRFS), ["d"]);
    assert_eq!(pods(&idx, LOOP1), ["e"]);
    // Anonymous devs without a block device (tmpfs, NFS) name themselves.
    assert_eq!(pods(&idx, TMPFS), ["g"]);
    assert!(pods(&idx, Dev::new(254, 0)).is_empty());
    assert!(idx.indices_for(Dev::new(9, 9)).is_empty());
    assert_eq!(idx.device_count(), 8);
    let key = VolumeKey {
        pod_uid: "e".into(),
        name: "pv-blk".into(),
        mode: VolumeMode::Block,
    };
    assert_eq!(idx.get(&key).unwrap().device, Some(LOOP1));
}

fn block_error(dev: Dev, count: u64) -> KernelError {
    KernelError {
        key: CounterKey::new(
            dev.to_kernel(),
            source::BLOCK_RQ_ERROR,
            op::WRITE,
            libc::EIO as u32,
        ),
        count,
        sample: None,
    }
}

fn raised(changes: &[VolumeChanges]) -> Vec<(String, Status, String)> {
    changes
        .iter()
        .flat_map(|vc| {
            vc.changes.iter().filter_map(move |c| match c {
                Change::Raised(c) => Some((vc.key.pod_uid.clone(), c.status, c.reason.clone())),
                _ => None,
            })
        })
        .collect()
}

#[test]
fn monitor_aggregates_kernel_errors_per_volume() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut m = VolumeMonitor::new(index(), ConditionConfig::default());
    assert!(!m.has_pending());
    m.record(&block_error(SDA1, 3), t0);
    m.record(&block_error(SDA1, 2), t0 + Duration::from_secs(1));
    m.record(&block_error(Dev::new(9, 9), 100), t0);
    let fs = KernelError {
        key: CounterKey::new(
            BTRFS.to_kernel(),
            source::WRITEBACK_ERROR,
            op::WRITE,
            libc::EIO as u32,
        ),
        count: 1,
        sample: None,
    };
    m.record(&fs, t0);
    assert!(m.has_pending());
    let changes = m.flush_kernel(t0 + Duration::from_secs(2));
    assert!(!m.has_pending());
    assert_eq!(
        raised(&changes),
        [
            ("a".into(), Status::Degraded, "BlockIOErrors".into()),
            ("b".into(), Status::Degraded, "BlockIOErrors".into()),
            ("d".into(), Status::DataLoss, "WritebackErrors".into()),
        ]
    );
    let a = VolumeKey {
        pod_uid: "a".into(),
        name: "pv-shared".into(),
        mode: VolumeMode::Filesystem,
    };
    let msg = &m.health(&a).unwrap().conditions()[0].message;
    assert!(
        msg.starts_with(
            "5 block I/O errors (write, EIO) on sda1 (8:1) at /var/lib/kubelet/pods/a/"
        ),
        "{msg}"
    );

    // Nothing new: a flush changes nothing.
    assert!(m.flush_kernel(t0 + Duration::from_secs(3)).is_empty());
    // More errors update the message, keep `since`.
    m.record(&block_error(DM0, 1), t0 + Duration::from_secs(4));
    let changes = m.flush_kernel(t0 + Duration::from_secs(5));
    assert_eq!(changes.len(), 2);
    assert!(
        matches!(&changes[0].changes[0], Change::Updated { condition, .. } if condition.since == t0)
    );

    // The quiet window clears.
    let later = t0 + ConditionConfig::default().kernel_quiet_window + Duration::from_secs(10);
    let cleared: usize = m.tick(later).iter().map(|vc| vc.changes.len()).sum();
    assert_eq!(cleared, 3);
    assert!(m.health(&a).unwrap().conditions().is_empty());
}

#[test]
fn rebuilt_index_keeps_health_and_pending_errors() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut m = VolumeMonitor::new(index(), ConditionConfig::default());
    m.record(&block_error(SDA2, 1), t0);
    m.flush_kernel(t0);
    m.record(&block_error(SDA1, 1), t0);

    // Pod b went away; pod h came.
    let (topo, mut vols) = fixture();
    vols.retain(|v| v.pod_uid != "b" && v.volume_mode == VolumeMode::Filesystem);
    vols.push(volume("h", "pv-new", VolumeMode::Filesystem));
    let gone = m.replace_index(VolumeIndex::build(&topo, vols));
    let gone: Vec<&str> = gone.iter().map(|k| k.pod_uid.as_str()).collect();
    assert_eq!(gone, ["b", "e"]);
    let c = VolumeKey {
        pod_uid: "c".into(),
        name: "pv-xfs".into(),
        mode: VolumeMode::Filesystem,
    };
    assert_eq!(m.health(&c).unwrap().worst(), Some(Status::Degraded));
    // The error recorded before the rebuild still reaches pod a, only a.
    assert!(m.has_pending());
    let pods: Vec<String> = raised(&m.flush_kernel(t0))
        .into_iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(pods, ["a"]);
}

#[test]
fn csi_answers_become_conditions_and_failures_never_recover() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut m = VolumeMonitor::new(index(), ConditionConfig::default());
    let c = VolumeKey {
        pod_uid: "c".into(),
        name: "pv-xfs".into(),
        mode: VolumeMode::Filesystem,
    };
    let outcome = |result| CsiOutcome {
        key: c.clone(),
        driver: "d".into(),
        socket: None,
        result,
        elapsed: Duration::ZERO,
    };
    let sick = outcome(CsiResult::Health {
        rpc: health_csi::HealthSource::NodeGetVolumeHealth,
        entries: vec![
            HealthEntry::new(HealthStatus::Inaccessible, "BackendGone", "array offline"),
            HealthEntry::new(HealthStatus::Unknown, "Odd", "new kind"),
        ],
        usage: None,
    });
    let changes = m.apply_csi(t0, std::slice::from_ref(&sick));
    assert_eq!(
        raised(&changes),
        [
            ("c".into(), Status::Inaccessible, "BackendGone".into()),
            ("c".into(), Status::Degraded, "Odd".into())
        ]
    );
    let failed = outcome(CsiResult::ProbeFailed {
        error: "CSI NodeGetVolumeHealth timed out after 5s".into(),
    });
    assert!(m.apply_csi(t0, std::slice::from_ref(&failed)).is_empty());
    let h = m.health(&c).unwrap();
    assert_eq!(h.worst(), Some(Status::Inaccessible));
    assert_eq!(h.probe_failures(Source::CsiNode), 1);
    let healthy = outcome(CsiResult::Health {
        rpc: health_csi::HealthSource::NodeGetVolumeStats,
        entries: vec![],
        usage: None,
    });
    let cleared: usize = m
        .apply_csi(t0, &[healthy])
        .iter()
        .map(|vc| vc.changes.len())
        .sum();
    assert_eq!(cleared, 2);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Volumes of four drivers, one per generation/failure, probed together: the
/// hung one costs one timeout and holds up no one else.
#[test]
fn csi_prober_speaks_each_generation_and_bounds_the_hung() {
    let rt = runtime();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let timeout = Duration::from_millis(700);
    rt.block_on(async {
        let mut drivers = Vec::new();
        for (name, mode) in [
            ("modern.csi.test", DriverMode::Modern),
            ("legacy.csi.test", DriverMode::LegacyOnly),
            ("hang.csi.test", DriverMode::Hang),
            ("unimpl.csi.test", DriverMode::Unimplemented),
        ] {
            let dir = root.join("plugins").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            drivers.push(TestDriver::start_named(&dir, name, mode).await.unwrap());
        }
        let sick = vec![HealthEntry::new(
            HealthStatus::DataLoss,
            "ChecksumMismatch",
            "blocks lost",
        )];
        drivers[0].set_volume_health("handle-modern", sick.clone());
        drivers[1].set_volume_health("handle-legacy", sick);

        let mut vols = Vec::new();
        for (pod, driver) in [
            ("p1", "modern"),
            ("p2", "legacy"),
            ("p3", "hang"),
            ("p4", "unimpl"),
            ("p5", "absent"),
        ] {
            let mut v = volume(pod, &format!("pv-{driver}"), VolumeMode::Filesystem);
            v.driver = Some(format!("{driver}.csi.test"));
            v.volume_handle = Some(format!("handle-{driver}"));
            vols.push(v);
        }
        let mut local = volume("p6", "local-pv", VolumeMode::Filesystem);
        local.kind = VolumeKind::LocalVolume;
        local.driver = None;
        vols.push(local);
        let idx = VolumeIndex::from_resolved(
            &Topology::default(),
            vols.into_iter().map(|v| (v, None)).collect(),
        );

        let started = Instant::now();
        let prober = CsiProber::connect(Some(root), &[], timeout).await;
        let names: Vec<String> = prober.drivers().into_iter().map(|d| d.0).collect();
        // The UNIMPLEMENTED driver cannot even say its name.
        assert_eq!(
            names,
            ["hang.csi.test", "legacy.csi.test", "modern.csi.test"]
        );
        let outcomes = prober.probe(idx.volumes()).await;
        let took = started.elapsed();
        assert!(took < timeout * 3, "{took:?}");
        let by_pod = |pod: &str| outcomes.iter().find(|o| o.key.pod_uid == pod).unwrap();
        assert_eq!(outcomes.len(), 5, "the local PV has no driver to ask");

        match &by_pod("p1").result {
            CsiResult::Health { rpc, entries, .. } => {
                assert_eq!(*rpc, health_csi::HealthSource::NodeGetVolumeHealth);
                assert_eq!(entries[0].reason, "ChecksumMismatch");
            }
            other => panic!("{other:?}"),
        }
        match &by_pod("p2").result {
            CsiResult::Health { rpc, entries, .. } => {
                assert_eq!(*rpc, health_csi::HealthSource::NodeGetVolumeStats);
                assert_eq!(entries[0].reason, "VolumeConditionAbnormal");
                assert_eq!(entries[0].status, HealthStatus::Degraded);
            }
            other => panic!("{other:?}"),
        }
        for (pod, wanted) in [
            ("p3", "timed out"),
            ("p4", "unusable CSI sockets"),
            ("p5", "no CSI driver named \"absent.csi.test\""),
        ] {
            match &by_pod(pod).result {
                CsiResult::ProbeFailed { error } => {
                    assert!(error.contains(wanted), "{pod}: {error}")
                }
                other => panic!("{pod}: {other:?}"),
            }
        }
        assert_eq!(
            by_pod("p3").socket,
            Some(root.join("plugins/hang.csi.test/csi.sock"))
        );
        // Latency: a real round trip for the answered, the whole timeout for
        // the hung, nothing for a volume whose driver was never asked.
        let p1 = by_pod("p1").elapsed;
        assert!(p1 > Duration::ZERO && p1 < timeout, "{p1:?}");
        let p3 = by_pod("p3").elapsed;
        assert!(p3 >= timeout, "{p3:?}");
        assert_eq!(by_pod("p5").elapsed, Duration::ZERO);

        // Named by an override, the UNIMPLEMENTED driver is asked, and its
        // UNIMPLEMENTED is a failed probe, not health.
        let ov = health_csi::DriverOverride {
            driver: "unimpl.csi.test".into(),
            socket: root.join("plugins/unimpl.csi.test/csi.sock"),
        };
        let prober = CsiProber::connect(None, &[ov], timeout).await;
        let outcomes = prober.probe(idx.volumes()).await;
        match &outcomes
            .iter()
            .find(|o| o.key.pod_uid == "p4")
            .unwrap()
            .result
        {
            CsiResult::ProbeFailed { error } => {
                assert!(error.contains("does not support"), "{error}")
            }
            other => panic!("{other:?}"),
        }
        for d in drivers {
            d.shutdown().await;
        }
    });
}

/// What the prober asks follows what each driver advertises, every round;
/// a driver that advertises NodeGetVolumeHealth and then answers it
/// UNIMPLEMENTED fails the probe, and the condition it raised stays.
#[test]
fn csi_prober_asks_what_drivers_advertise_and_a_broken_one_never_recovers() {
    let rt = runtime();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    rt.block_on(async {
        let start = |name: &'static str| async move {
            let dir = root.join("plugins").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            TestDriver::start_named(&dir, name, DriverMode::Modern)
                .await
                .unwrap()
        };
        let quiet = start("quiet.csi.test").await;
        quiet.set_node_capabilities(vec![NodeCapability::GetVolumeStats]);
        let broken = start("broken.csi.test").await;
        let sick = vec![HealthEntry::new(
            HealthStatus::DataLoss,
            "ChecksumMismatch",
            "blocks lost",
        )];
        broken.set_volume_health("handle-broken", sick);
        quiet.set_volume_health("handle-quiet", vec![]);

        let mut vols = Vec::new();
        for (pod, driver) in [("p1", "quiet"), ("p2", "broken")] {
            let mut v = volume(pod, &format!("pv-{driver}"), VolumeMode::Filesystem);
            v.driver = Some(format!("{driver}.csi.test"));
            v.volume_handle = Some(format!("handle-{driver}"));
            vols.push(v);
        }
        let idx = VolumeIndex::from_resolved(
            &Topology::default(),
            vols.into_iter().map(|v| (v, None)).collect(),
        );
        let key = |pod: &str| {
            idx.volumes()
                .iter()
                .find(|v| v.key.pod_uid == pod)
                .unwrap()
                .key
                .clone()
        };
        let mut m = VolumeMonitor::new(idx.clone(), ConditionConfig::default());
        let prober = CsiProber::connect(Some(root), &[], Duration::from_secs(5)).await;
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);

        let outcomes = prober.probe(idx.volumes()).await;
        let result = |pod: &str| {
            outcomes
                .iter()
                .find(|o| o.key.pod_uid == pod)
                .unwrap()
                .result
                .clone()
        };
        assert_eq!(result("p1"), CsiResult::NotAdvertised);
        assert_eq!(
            serde_json::to_value(result("p1")).unwrap(),
            serde_json::json!({"result": "not_advertised"})
        );
        assert_eq!(
            raised(&m.apply_csi(t0, &outcomes)),
            [("p2".into(), Status::DataLoss, "ChecksumMismatch".into())]
        );

        // The driver breaks: still advertising the RPC, answering it
        // UNIMPLEMENTED.
        broken.set_unimplemented(Rpc::NodeGetVolumeHealth);
        broken.set_node_capabilities(vec![
            NodeCapability::GetVolumeStats,
            NodeCapability::GetVolumeHealth,
        ]);
        for round in 1..=2u64 {
            let outcomes = prober.probe(idx.volumes()).await;
            let failed = outcomes.iter().find(|o| o.key.pod_uid == "p2").unwrap();
            assert_eq!(
                failed.result,
                CsiResult::ProbeFailed {
                    error: "CSI driver does not support NodeGetVolumeHealth".into()
                }
            );
            assert!(m.apply_csi(t0, &outcomes).is_empty(), "round {round}");
            let h = m.health(&key("p2")).unwrap();
            assert_eq!(h.worst(), Some(Status::DataLoss));
            assert_eq!(h.probe_failures(Source::CsiNode), round);
            assert_eq!(m.health(&key("p1")).unwrap().worst(), None);
        }

        // Capabilities once at connect, then once per round.
        for d in [&quiet, &broken] {
            assert_eq!(d.calls(Rpc::NodeGetCapabilities), 4);
            assert_eq!(d.calls(Rpc::NodeGetVolumeStats), 0);
        }
        assert_eq!(quiet.calls(Rpc::NodeGetVolumeHealth), 0);
        assert_eq!(broken.calls(Rpc::NodeGetVolumeHealth), 3);
        quiet.shutdown().await;
        broken.shutdown().await;
    });
}

#[test]
fn member_errors_of_a_redundant_array_degrade_the_volume_above_it() {
    const SDB1: Dev = Dev::new(8, 17);
    const MD0: Dev = Dev::new(9, 0);
    const MD1: Dev = Dev::new(9, 1);
    let member = |dev, name, array| BlockDevice {
        holders: vec![array],
        ..disk(dev, name)
    };
    let array = |dev, name, slaves| BlockDevice {
        slaves,
        ..disk(dev, name)
    };
    // md0: raid1 over sda1 + sdb1; md1: raid0 over sda2 (no redundancy).
    let topo = Topology::from_parts(
        vec![
            member(SDA1, "sda1", MD0),
            member(SDB1, "sdb1", MD0),
            member(SDA2, "sda2", MD1),
            array(MD0, "md0", vec![SDA1, SDB1]),
            array(MD1, "md1", vec![SDA2]),
        ],
        vec![],
    )
    .with_redundant_arrays(vec![MD0]);
    let resolved = vec![
        (volume("mirrored", "pv-md0", VolumeMode::Block), Some(MD0)),
        (volume("striped", "pv-md1", VolumeMode::Block), Some(MD1)),
    ];
    let idx = VolumeIndex::from_resolved(&topo, resolved);
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let medium = |dev: Dev, src| KernelError {
        key: CounterKey::new(dev.to_kernel(), src, op::READ, libc::ENODATA as u32),
        count: 3,
        sample: None,
    };

    let mut m = VolumeMonitor::new(idx.clone(), ConditionConfig::default());
    m.record(&medium(SDB1, source::BLOCK_RQ_ERROR), t0);
    m.record(&medium(SDA2, source::BLOCK_RQ_ERROR), t0);
    assert_eq!(
        raised(&m.flush_kernel(t0)),
        [
            (
                "mirrored".into(),
                Status::Degraded,
                "ArrayMemberErrors".into()
            ),
            ("striped".into(), Status::DataLoss, "MediumErrors".into()),
        ]
    );

    // The array itself failing a bio is the array's own error.
    let mut m = VolumeMonitor::new(idx, ConditionConfig::default());
    m.record(&medium(MD0, source::BLOCK_BIO_ERROR), t0);
    assert_eq!(
        raised(&m.flush_kernel(t0)),
        [("mirrored".into(), Status::DataLoss, "MediumErrors".into())]
    );
}

#[test]
fn unsupported_operations_raise_nothing() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut m = VolumeMonitor::new(index(), ConditionConfig::default());
    let discard = KernelError {
        key: CounterKey::new(
            SDA1.to_kernel(),
            source::BLOCK_RQ_ERROR,
            op::DISCARD,
            libc::EOPNOTSUPP as u32,
        ),
        count: 36,
        sample: None,
    };
    m.record(&discard, t0);
    assert!(!m.has_pending());
    assert!(m.flush_kernel(t0).is_empty());
}
