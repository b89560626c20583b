//! Storage backend health through the monitor: one driver answer reaches
//! every volume of that driver and no other, clears at once, survives failed
//! probes, never touches a volume's own CSI conditions, and is inherited by
//! volumes that appear later.

use std::path::PathBuf;
use std::time::Duration;

use health_core::conditions::{Change, ConditionConfig, Source, Status};
use health_csi::testing::{DriverMode, Rpc, TestDriver};
use health_csi::{AccessType, StorageHealthEntry, StorageHealthStatus};
use health_node::volumes::kubelet::{KubeletVolume, VolumeKind, VolumeMode};
use health_node::volumes::{
    next_wake, CsiOutcome, CsiProber, CsiResult, LiveVolumes, LiveVolumesConfig, StorageOutcome,
    StorageResult, VolumeChanges, VolumeIndex, VolumeKey, VolumeMonitor, Wake,
};
use health_topology::Topology;

const A: &str = "a.csi.test";
const B: &str = "b.csi.test";

use health_core::testing::t;

fn volume(pod: &str, driver: Option<&str>, mode: VolumeMode, kind: VolumeKind) -> KubeletVolume {
    let pv = format!("pv-{pod}");
    KubeletVolume {
        pod_uid: pod.into(),
        pv: Some(pv.clone()),
        pod_volume_dir_name: pv.clone(),
        driver: driver.map(str::to_string),
        volume_handle: driver.map(|_| format!("handle-{pod}")),
        volume_mode: mode,
        kind,
        path: PathBuf::from(format!("/var/lib/kubelet/pods/{pod}/volumes/x/{pv}")),
        staging_path: None,
        node_name: None,
    }
}

/// Driver A: filesystem volumes a1 and a2, block volume a3. Driver B: b1.
/// And a local PV.
fn volumes() -> Vec<KubeletVolume> {
    use VolumeKind::{Csi, CsiEphemeral, LocalVolume};
    use VolumeMode::{Block, Filesystem};
    vec![
        volume("a1", Some(A), Filesystem, Csi),
        volume("a2", Some(A), Filesystem, CsiEphemeral),
        volume("a3", Some(A), Block, Csi),
        volume("b1", Some(B), Filesystem, Csi),
        volume("l1", None, Filesystem, LocalVolume),
    ]
}

fn index_of(vols: Vec<KubeletVolume>) -> VolumeIndex {
    VolumeIndex::from_resolved(
        &Topology::default(),
        vols.into_iter().map(|v| (v, None)).collect(),
    )
}

fn key(pod: &str, mode: VolumeMode) -> VolumeKey {
    VolumeKey {
        pod_uid: pod.into(),
        name: format!("pv-{pod}"),
        mode,
    }
}

fn fs(pod: &str) -> VolumeKey {
    key(pod, VolumeMode::Filesystem)
}

fn outcome(driver: &str, result: StorageResult) -> StorageOutcome {
    StorageOutcome {
        driver: driver.into(),
        socket: None,
        result,
    }
}

fn health(driver: &str, entries: Vec<StorageHealthEntry>) -> StorageOutcome {
    outcome(driver, StorageResult::Health { entries })
}

fn unreachable() -> StorageHealthEntry {
    StorageHealthEntry::new(
        StorageHealthStatus::StorageUnreachable,
        "",
        "array a1: all paths down",
    )
}

const UNREACHABLE_MESSAGE: &str =
    "CSI driver a.csi.test reports its storage unreachable: array a1: all paths down";

/// (pod, +/-, status, reason, source) per change, in order.
fn summary(changes: &[VolumeChanges]) -> Vec<(String, char, Status, String, Source)> {
    changes
        .iter()
        .flat_map(|vc| {
            vc.changes.iter().map(move |c| {
                let (sign, c) = match c {
                    Change::Raised(c) => ('+', c),
                    Change::Updated { condition, .. } => ('~', condition),
                    Change::Cleared(c) => ('-', c),
                };
                (
                    vc.key.pod_uid.clone(),
                    sign,
                    c.status,
                    c.reason.clone(),
                    c.source,
                )
            })
        })
        .collect()
}

fn row(
    pod: &str,
    sign: char,
    status: Status,
    reason: &str,
) -> (String, char, Status, String, Source) {
    (pod.into(), sign, status, reason.into(), Source::CsiStorage)
}

#[test]
fn a_backend_condition_reaches_every_volume_of_its_driver_and_clears_at_once() {
    let mut m = VolumeMonitor::new(index_of(volumes()), ConditionConfig::default());
    let changes = m.apply_storage(t(0), &[health(A, vec![unreachable()]), health(B, vec![])]);
    let inaccessible = Status::Inaccessible;
    assert_eq!(
        summary(&changes),
        [
            row("a1", '+', inaccessible, "StorageUnreachable"),
            row("a2", '+', inaccessible, "StorageUnreachable"),
            row("a3", '+', inaccessible, "StorageUnreachable"),
        ]
    );
    let c = &m.health(&fs("a1")).unwrap().conditions()[0];
    assert_eq!(c.message, UNREACHABLE_MESSAGE);
    assert_eq!((c.since, c.last_probe), (t(0), t(0)));
    assert_eq!(m.health(&fs("b1")).unwrap().worst(), None);
    assert_eq!(m.health(&fs("l1")).unwrap().worst(), None);

    // The same answer again: nothing to write.
    assert!(m
        .apply_storage(t(60), &[health(A, vec![unreachable()])])
        .is_empty());

    // Failed probes and UNIMPLEMENTED keep everything; only failures count.
    let failed = outcome(
        A,
        StorageResult::ProbeFailed {
            error: "CSI NodeGetStorageHealth timed out after 5s".into(),
        },
    );
    assert!(m.apply_storage(t(120), &[failed]).is_empty());
    assert!(m
        .apply_storage(t(180), &[outcome(A, StorageResult::Unsupported)])
        .is_empty());
    for pod in ["a1", "a2"] {
        let h = m.health(&fs(pod)).unwrap();
        assert_eq!(h.worst(), Some(inaccessible), "{pod}");
        assert_eq!(h.probe_failures(Source::CsiStorage), 1, "{pod}");
        assert_eq!(h.probe_failures(Source::CsiNode), 0, "{pod}");
    }
    let a3 = m.health(&key("a3", VolumeMode::Block)).unwrap();
    assert_eq!(a3.probe_failures(Source::CsiStorage), 1);
    let b1 = m.health(&fs("b1")).unwrap();
    assert_eq!(b1.probe_failures(Source::CsiStorage), 0);

    // An empty answer clears every volume of the driver in one go.
    let changes = m.apply_storage(t(240), &[health(A, vec![])]);
    assert_eq!(
        summary(&changes),
        [
            row("a1", '-', inaccessible, "StorageUnreachable"),
            row("a2", '-', inaccessible, "StorageUnreachable"),
            row("a3", '-', inaccessible, "StorageUnreachable"),
        ]
    );
    for v in m.index().volumes().to_vec() {
        assert_eq!(m.health(&v.key).unwrap().worst(), None, "{:?}", v.key);
    }
}

#[test]
fn storage_and_volume_reports_never_clear_each_other() {
    let mut m = VolumeMonitor::new(index_of(volumes()), ConditionConfig::default());
    let own = CsiOutcome {
        key: fs("a1"),
        driver: A.into(),
        socket: None,
        result: CsiResult::Health {
            rpc: health_csi::HealthSource::NodeGetVolumeHealth,
            entries: vec![health_csi::HealthEntry::new(
                health_csi::HealthStatus::DataLoss,
                "ChecksumMismatch",
                "3 blocks",
            )],
            usage: None,
        },
        elapsed: Duration::ZERO,
    };
    m.apply_csi(t(0), std::slice::from_ref(&own));
    m.apply_storage(t(0), &[health(A, vec![unreachable()])]);
    // Backend healthy again: the volume's own condition stays.
    let changes = m.apply_storage(t(10), &[health(A, vec![])]);
    assert_eq!(
        summary(&changes)[0],
        row("a1", '-', Status::Inaccessible, "StorageUnreachable")
    );
    let view: Vec<(Status, String, Source)> = m
        .health(&fs("a1"))
        .unwrap()
        .conditions()
        .into_iter()
        .map(|c| (c.status, c.reason, c.source))
        .collect();
    assert_eq!(
        view,
        [(Status::DataLoss, "ChecksumMismatch".into(), Source::CsiNode)]
    );

    // And the volume healthy again leaves the backend's condition alone.
    m.apply_storage(t(20), &[health(A, vec![unreachable()])]);
    let healthy = CsiOutcome {
        result: CsiResult::Health {
            rpc: health_csi::HealthSource::NodeGetVolumeHealth,
            entries: vec![],
            usage: None,
        },
        ..own
    };
    let changes = m.apply_csi(t(30), &[healthy]);
    assert_eq!(
        summary(&changes),
        [(
            "a1".to_string(),
            '-',
            Status::DataLoss,
            "ChecksumMismatch".to_string(),
            Source::CsiNode
        )]
    );
    let c = &m.health(&fs("a1")).unwrap().conditions()[0];
    assert_eq!(
        (c.status, c.reason.as_str(), c.source),
        (
            Status::Inaccessible,
            "StorageUnreachable",
            Source::CsiStorage
        )
    );
}

#[test]
fn an_access_type_restricts_the_condition_to_volumes_of_that_mode() {
    let mut m = VolumeMonitor::new(index_of(volumes()), ConditionConfig::default());
    let block_only = StorageHealthEntry::new(
        StorageHealthStatus::StorageDegraded,
        "PoolRebuilding",
        "pool p2",
    )
    .for_access_type(AccessType::Block);
    let newer = StorageHealthEntry::new(StorageHealthStatus::Unknown, "", "?")
        .for_access_type(AccessType::Mount);
    let changes = m.apply_storage(t(0), &[health(A, vec![block_only, newer])]);
    assert_eq!(
        summary(&changes),
        [
            row("a1", '+', Status::Degraded, "StorageDegraded"),
            row("a2", '+', Status::Degraded, "StorageDegraded"),
            row("a3", '+', Status::Degraded, "PoolRebuilding"),
        ]
    );
    assert_eq!(
        m.health(&key("a3", VolumeMode::Block))
            .unwrap()
            .conditions()[0]
            .message,
        "CSI driver a.csi.test reports its storage degraded (block volumes): pool p2"
    );
    assert_eq!(
        m.health(&fs("a1")).unwrap().conditions()[0].message,
        "CSI driver a.csi.test reports its storage in an adverse state of a type unknown to \
         this agent (filesystem volumes): ?"
    );
}

#[test]
fn a_volume_that_appears_later_inherits_its_drivers_storage_condition() {
    let mut m = VolumeMonitor::new(index_of(volumes()), ConditionConfig::default());
    m.apply_storage(t(0), &[health(A, vec![unreachable()]), health(B, vec![])]);
    // A failed probe later does not replace the last answer.
    let failed = outcome(
        A,
        StorageResult::ProbeFailed {
            error: "transport".into(),
        },
    );
    m.apply_storage(t(30), &[failed]);
    assert!(m.take_inherited().is_empty());

    let mut vols = volumes();
    vols.push(volume(
        "a4",
        Some(A),
        VolumeMode::Filesystem,
        VolumeKind::Csi,
    ));
    vols.push(volume(
        "b2",
        Some(B),
        VolumeMode::Filesystem,
        VolumeKind::Csi,
    ));
    let gone = m.replace_index(index_of(vols.clone()));
    assert!(gone.is_empty());
    let inherited = m.take_inherited();
    assert_eq!(
        summary(&inherited),
        [row("a4", '+', Status::Inaccessible, "StorageUnreachable")]
    );
    match &inherited[0].changes[0] {
        Change::Raised(c) => {
            assert_eq!(c.message, UNREACHABLE_MESSAGE);
            // As of the driver's answer, not of the volume's arrival.
            assert_eq!((c.since, c.last_probe), (t(0), t(0)));
        }
        other => panic!("{other:?}"),
    }
    // Taken once; a rebuild with the same volumes inherits nothing new.
    assert!(m.take_inherited().is_empty());
    m.replace_index(index_of(vols.clone()));
    assert!(m.take_inherited().is_empty());

    // Once the driver's storage is healthy again, newcomers start healthy,
    // and the one that inherited clears with the rest.
    let changes = m.apply_storage(t(60), &[health(A, vec![])]);
    let pods: Vec<String> = summary(&changes).into_iter().map(|r| r.0).collect();
    assert_eq!(pods, ["a1", "a2", "a3", "a4"]);
    vols.push(volume(
        "a5",
        Some(A),
        VolumeMode::Filesystem,
        VolumeKind::Csi,
    ));
    m.replace_index(index_of(vols));
    assert!(m.take_inherited().is_empty());
    assert_eq!(m.health(&fs("a5")).unwrap().worst(), None);
}

/// Real drivers on unix sockets: one NodeGetStorageHealth per driver per
/// probe, whatever the number of volumes; a driver without
/// GET_STORAGE_HEALTH never asked.
#[test]
fn the_prober_asks_each_driver_once_per_cycle() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    rt.block_on(async {
        let mut drivers = Vec::new();
        for (name, mode) in [(A, DriverMode::Modern), (B, DriverMode::LegacyOnly)] {
            let dir = root.join("plugins").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            drivers.push(TestDriver::start_named(&dir, name, mode).await.unwrap());
        }
        drivers[0].set_storage_health(vec![unreachable()]);
        let prober = CsiProber::connect(Some(root), &[], Duration::from_secs(5)).await;
        let mut m = VolumeMonitor::new(index_of(volumes()), ConditionConfig::default());
        for cycle in 1..=3u64 {
            let storage = prober.probe_storage().await;
            assert_eq!(
                storage,
                [
                    StorageOutcome {
                        driver: A.into(),
                        socket: Some(root.join("plugins").join(A).join("csi.sock")),
                        result: StorageResult::Health {
                            entries: vec![unreachable()]
                        },
                    },
                    StorageOutcome {
                        driver: B.into(),
                        socket: Some(root.join("plugins").join(B).join("csi.sock")),
                        result: StorageResult::Unsupported,
                    },
                ]
            );
            let changes = m.apply_storage(t(cycle), &storage);
            assert_eq!(changes.len(), if cycle == 1 { 3 } else { 0 });
            assert_eq!(drivers[0].calls(Rpc::NodeGetStorageHealth), cycle);
            assert_eq!(drivers[1].calls(Rpc::NodeGetStorageHealth), 0);
        }
        // The storage calls are not volume calls.
        assert_eq!(drivers[0].calls(Rpc::NodeGetVolumeHealth), 0);
    });
}

fn pod_volume(root: &std::path::Path, pod: &str, driver: &str) {
    let pv = format!("pv-{pod}");
    let dir = root
        .join("pods")
        .join(pod)
        .join("volumes/kubernetes.io~csi")
        .join(&pv);
    std::fs::create_dir_all(dir.join("mount")).unwrap();
    let data = format!(
        r#"{{"driverName":"{driver}","specVolID":"{pv}","volumeHandle":"handle-{pod}","volumeLifecycleMode":"Persistent"}}"#
    );
    std::fs::write(dir.join("vol_data.json"), data).unwrap();
}

fn storage_changes(changes: &[VolumeChanges]) -> Vec<(String, char, Status, String, Source)> {
    summary(changes)
        .into_iter()
        .filter(|c| c.4 == Source::CsiStorage)
        .collect()
}

/// The `watch`/`run` path: a CSI round of [`LiveVolumes`] makes one storage
/// call per driver and hands its outcome out for metrics; a volume kubelet
/// sets up later gets the condition on rediscovery.
#[test]
fn live_volumes_probe_storage_each_round_and_newcomers_inherit() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
    rt.block_on(async {
        let dir = root.join("plugins").join(A);
        std::fs::create_dir_all(&dir).unwrap();
        let driver = TestDriver::start_named(&dir, A, DriverMode::Modern)
            .await
            .unwrap();
        driver.set_storage_health(vec![unreachable()]);
        for pod in ["a1", "a2"] {
            pod_volume(&root, pod, A);
            driver.set_volume_health(&format!("handle-{pod}"), vec![]);
        }
        pod_volume(&root, "b1", B);
        let cfg = LiveVolumesConfig {
            kubelet_root: root.clone(),
            check: health_node::volumes::checks::CheckConfig::default(),
            check_interval: Duration::from_secs(3600),
            csi_interval: Duration::from_secs(3600),
            stack_interval: Duration::from_secs(3600),
            csi_overrides: vec![],
            conditions: ConditionConfig::default(),
        };
        let topo = Topology::default();
        let mut live = Some(LiveVolumes::new(cfg, &topo));
        let handled = loop {
            let wake = tokio::time::timeout(Duration::from_secs(20), next_wake(&mut live))
                .await
                .expect("a round within 20 s");
            let is_round = matches!(wake, Wake::Csi(_));
            let handled = live.as_mut().unwrap().handle(wake, &topo);
            if is_round {
                break handled;
            }
        };
        let inaccessible = Status::Inaccessible;
        assert_eq!(
            storage_changes(&handled.changes),
            [
                row("a1", '+', inaccessible, "StorageUnreachable"),
                row("a2", '+', inaccessible, "StorageUnreachable"),
            ]
        );
        assert_eq!(
            handled.storage,
            [StorageOutcome {
                driver: A.into(),
                socket: Some(dir.join("csi.sock")),
                result: StorageResult::Health {
                    entries: vec![unreachable()]
                },
            }]
        );
        assert_eq!(driver.calls(Rpc::NodeGetStorageHealth), 1);
        assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 2);

        // kubelet sets up a third volume of the driver.
        pod_volume(&root, "a3", A);
        let live = live.as_mut().unwrap();
        assert!(live.take_inherited().is_empty());
        live.rediscover(&topo);
        assert_eq!(
            storage_changes(&live.take_inherited()),
            [row("a3", '+', inaccessible, "StorageUnreachable")]
        );
        // Inheriting is not a probe.
        assert_eq!(driver.calls(Rpc::NodeGetStorageHealth), 1);
    });
}
