//! NodeClient against the test driver over real unix sockets.

use std::path::Path;
use std::time::{Duration, Instant};

use health_csi::testing::{DriverMode, Rpc, TestDriver, TestDriverHandle};
use health_csi::{
    AccessType, CsiError, HealthEntry, HealthSource, HealthStatus, NodeClient, NodeVolumeReport,
    StorageHealthEntry, StorageHealthStatus, Usage, UsageNumbers,
};

const TIMEOUT: Duration = Duration::from_secs(10);
const PUBLISH: &str = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv1/mount";
const STAGING: &str = "/var/lib/kubelet/plugins/kubernetes.io/csi/d/abc/globalmount";

fn usage() -> Usage {
    Usage {
        bytes: Some(UsageNumbers {
            available: 600,
            total: 1000,
            used: 400,
        }),
        inodes: Some(UsageNumbers {
            available: 90,
            total: 100,
            used: 10,
        }),
    }
}

async fn driver(dir: &Path, mode: DriverMode) -> TestDriverHandle {
    let driver = TestDriver::start(dir, mode)
        .await
        .expect("start test driver");
    driver.set_volume_usage("vol-1", usage());
    driver
}

async fn client(driver: &TestDriverHandle) -> NodeClient {
    NodeClient::connect(driver.socket_path(), TIMEOUT)
        .await
        .expect("connect")
}

async fn health(client: &NodeClient, volume_id: &str) -> Result<NodeVolumeReport, CsiError> {
    client
        .volume_health(volume_id, Path::new(PUBLISH), Some(Path::new(STAGING)))
        .await
}

#[tokio::test]
async fn modern_driver_reports_1_13_health() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::Modern).await;
    let client = client(&driver).await;
    let entries = vec![
        HealthEntry::new(
            HealthStatus::DataLoss,
            "FsCorruption",
            "xfs: metadata corrupt",
        ),
        HealthEntry::new(HealthStatus::Inaccessible, "IoError", "EIO on sdb"),
    ];
    driver.set_volume_health("vol-1", entries.clone());

    let report = health(&client, "vol-1").await.expect("health");
    assert_eq!(
        report,
        NodeVolumeReport {
            source: HealthSource::NodeGetVolumeHealth,
            entries: Some(entries),
            usage: None,
        }
    );

    driver.set_volume_health("vol-1", vec![]);
    let report = health(&client, "vol-1").await.expect("health");
    assert_eq!(report.entries, Some(vec![]));
    assert_eq!(report.is_healthy(), Some(true));

    // Capabilities asked once, on the first health call, then cached.
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 2);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeStats), 0);
    let seen = driver.last_node_request().expect("request seen");
    assert_eq!(seen.rpc, Rpc::NodeGetVolumeHealth);
    assert_eq!(seen.volume_id, "vol-1");
    assert_eq!(seen.path, PUBLISH);
    assert_eq!(seen.staging_path, STAGING);
}

#[tokio::test]
async fn legacy_driver_is_asked_its_volume_stats_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::LegacyOnly).await;
    let client = client(&driver).await;

    let report = health(&client, "vol-1").await.expect("health");
    assert_eq!(
        report,
        NodeVolumeReport {
            source: HealthSource::NodeGetVolumeStats,
            entries: Some(vec![]),
            usage: Some(usage()),
        }
    );
    for _ in 0..3 {
        health(&client, "vol-1").await.expect("health");
    }
    // Clones share the cached capabilities.
    let clone = client.clone();
    health(&clone, "vol-1").await.expect("health");
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeStats), 5);
    // Not advertised, so never tried.
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 0);

    let seen = driver.last_node_request().expect("request seen");
    assert_eq!(seen.rpc, Rpc::NodeGetVolumeStats);
    assert_eq!(seen.path, PUBLISH);
    assert_eq!(seen.staging_path, STAGING);
}

#[tokio::test]
async fn legacy_abnormal_condition_is_degraded_volume_condition_abnormal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::LegacyOnly).await;
    let client = client(&driver).await;
    driver.set_volume_health(
        "vol-1",
        vec![HealthEntry::new(
            HealthStatus::Inaccessible,
            "Whatever",
            "backend LUN offline",
        )],
    );

    let report = health(&client, "vol-1").await.expect("health");
    assert_eq!(report.source, HealthSource::NodeGetVolumeStats);
    assert_eq!(
        report.entries,
        Some(vec![HealthEntry {
            status: HealthStatus::Degraded,
            reason: "VolumeConditionAbnormal".to_string(),
            message: "backend LUN offline".to_string(),
        }])
    );
    assert_eq!(report.usage, Some(usage()));
}

#[tokio::test]
async fn legacy_without_condition_is_not_asked_about_health() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::LegacyNoCondition).await;
    let client = client(&driver).await;
    driver.set_volume_health(
        "vol-1",
        vec![HealthEntry::new(HealthStatus::Degraded, "X", "invisible")],
    );

    let caps = client.capabilities().await.expect("capabilities");
    assert!(caps.get_volume_stats);
    assert!(!caps.volume_condition && !caps.get_volume_health);
    assert_eq!(caps.volume_health_rpc(), None);

    let err = health(&client, "vol-1").await.expect_err("not asked");
    assert!(
        matches!(
            err,
            CsiError::NotAdvertised {
                rpc: "NodeGetVolumeHealth",
                needs: "GET_VOLUME_HEALTH, or VOLUME_CONDITION with GET_VOLUME_STATS",
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "CSI driver does not advertise GET_VOLUME_HEALTH, or VOLUME_CONDITION with \
         GET_VOLUME_STATS: NodeGetVolumeHealth not called"
    );
    assert_eq!(driver.calls(Rpc::NodeGetVolumeStats), 0);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 0);

    // Asked for its stats directly, it has usage and no health information.
    let report = client
        .volume_stats("vol-1", Path::new(PUBLISH), Some(Path::new(STAGING)))
        .await
        .expect("stats");
    assert_eq!(
        report,
        NodeVolumeReport {
            source: HealthSource::NodeGetVolumeStats,
            entries: None,
            usage: Some(usage()),
        }
    );
    assert!(!report.has_health_info());
    assert_eq!(report.is_healthy(), None);
}

#[tokio::test]
async fn unimplemented_driver_is_never_asked_about_volumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::Unimplemented).await;
    let client = client(&driver).await;

    // Without capabilities there is no knowing what to ask: each call asks
    // for them again and fails with their UNIMPLEMENTED.
    for _ in 0..2 {
        let err = health(&client, "vol-1").await.expect_err("must fail");
        assert!(
            matches!(
                err,
                CsiError::Unsupported {
                    rpc: "NodeGetCapabilities"
                }
            ),
            "{err:?}"
        );
    }
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 2);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 0);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeStats), 0);

    let err = client.plugin_info().await.expect_err("must fail");
    assert!(
        matches!(
            err,
            CsiError::Unsupported {
                rpc: "GetPluginInfo"
            }
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn hung_driver_times_out_within_bound() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::Hang).await;
    let timeout = Duration::from_millis(500);
    let client = NodeClient::connect(driver.socket_path(), timeout)
        .await
        .expect("connect");

    let started = Instant::now();
    let err = health(&client, "vol-1").await.expect_err("must time out");
    assert!(
        matches!(
            err,
            CsiError::Timeout {
                rpc: "NodeGetVolumeHealth",
                after
            } if after == timeout
        ),
        "{err:?}"
    );
    // Generous: only proves the bound holds, not how fast it is.
    assert!(started.elapsed() < Duration::from_secs(30));
    // A timeout is no reason to try the legacy RPC.
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 1);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeStats), 0);
    // Identity still answers on the same connection.
    assert_eq!(
        client.plugin_info().await.expect("plugin info").name,
        driver.name()
    );
}

#[tokio::test]
async fn unknown_volume_is_volume_gone() {
    let dir = tempfile::tempdir().expect("tempdir");
    for mode in [DriverMode::Modern, DriverMode::LegacyOnly] {
        let sub = dir.path().join(format!("{mode:?}"));
        std::fs::create_dir(&sub).expect("mkdir");
        let driver = driver(&sub, mode).await;
        let client = client(&driver).await;
        let err = health(&client, "nope").await.expect_err("must fail");
        assert!(
            matches!(&err, CsiError::VolumeGone { volume_id, .. } if volume_id == "nope"),
            "{mode:?}: {err:?}"
        );
    }
}

#[tokio::test]
async fn missing_socket_is_connect_error_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("missing").join("csi.sock");
    let err = NodeClient::connect(&socket, TIMEOUT)
        .await
        .expect_err("must fail");
    match &err {
        CsiError::Connect { socket: s, .. } => assert_eq!(s, &socket),
        other => panic!("expected Connect, got {other:?}"),
    }
    assert!(
        err.to_string().contains(&socket.display().to_string()),
        "{err}"
    );

    // A path that exists but is not a socket is refused the same way.
    let file = dir.path().join("file");
    std::fs::write(&file, b"").expect("write");
    let err = NodeClient::connect(&file, TIMEOUT)
        .await
        .expect_err("must fail");
    assert!(
        matches!(&err, CsiError::Connect { socket, .. } if socket == &file),
        "{err:?}"
    );
}

#[tokio::test]
async fn driver_gone_after_connect_is_connect_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::Modern).await;
    let socket = driver.socket_path().to_path_buf();
    let client = client(&driver).await;
    driver.shutdown().await;

    // Its capabilities were never read, and asking for them fails.
    let err = health(&client, "vol-1").await.expect_err("must fail");
    assert!(
        matches!(&err, CsiError::Connect { socket: s, .. } if s == &socket),
        "{err:?}"
    );

    // The driver comes back on the same path: the same client recovers.
    let driver = self::driver(dir.path(), DriverMode::Modern).await;
    let report = health(&client, "vol-1")
        .await
        .expect("health after restart");
    assert_eq!(report.entries, Some(vec![]));
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 1);
}

#[tokio::test]
async fn identity_and_info() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = TestDriver::start_named(dir.path(), "ebs.csi.example.com", DriverMode::Modern)
        .await
        .expect("start");
    let client = client(&driver).await;
    let info = client.plugin_info().await.expect("info");
    assert_eq!(info.name, "ebs.csi.example.com");
    assert_eq!(info.vendor_version, "0.0.0-test");
    assert_eq!(client.probe().await.expect("probe"), Some(true));
    assert_eq!(
        client.node_info().await.expect("node info").node_id,
        "test-node"
    );
    let caps = client.capabilities().await.expect("caps");
    assert_eq!(
        caps,
        health_csi::NodeCapabilities {
            stage_unstage_volume: true,
            get_volume_stats: true,
            get_volume_health: true,
            get_storage_health: true,
            ..Default::default()
        }
    );
    assert_eq!(client.cached_capabilities(), Some(caps));
    assert_eq!(client.storage_health().await.expect("storage"), vec![]);
}

#[tokio::test]
async fn storage_health_round_trips_what_the_driver_was_given() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::Modern).await;
    let client = client(&driver).await;
    assert_eq!(client.storage_health().await.expect("storage"), vec![]);

    let backends = vec![
        StorageHealthEntry::new(
            StorageHealthStatus::StorageUnreachable,
            "ArrayOffline",
            "array a1: all paths down",
        ),
        StorageHealthEntry::new(
            StorageHealthStatus::StorageDegraded,
            "",
            "pool p2 rebuilding",
        )
        .for_access_type(AccessType::Block),
        StorageHealthEntry::new(StorageHealthStatus::Unknown, "Odd", "newer type")
            .for_access_type(AccessType::Mount),
    ];
    driver.set_storage_health(backends.clone());
    assert_eq!(client.storage_health().await.expect("storage"), backends);
    driver.set_storage_health(vec![]);
    assert_eq!(client.storage_health().await.expect("storage"), vec![]);
    assert_eq!(driver.calls(Rpc::NodeGetStorageHealth), 3);
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    // The volume RPCs were not involved.
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 0);
}

#[tokio::test]
async fn storage_health_is_not_asked_without_its_capability() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::LegacyOnly).await;
    let client = client(&driver).await;
    for _ in 0..3 {
        let err = client.storage_health().await.expect_err("not advertised");
        assert!(
            matches!(
                err,
                CsiError::NotAdvertised {
                    rpc: "NodeGetStorageHealth",
                    needs: "GET_STORAGE_HEALTH",
                }
            ),
            "{err:?}"
        );
    }
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    assert_eq!(driver.calls(Rpc::NodeGetStorageHealth), 0);
}

#[tokio::test]
async fn storage_health_timeout_is_asked_again() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = driver(dir.path(), DriverMode::Hang).await;
    let client = NodeClient::connect(driver.socket_path(), Duration::from_millis(300))
        .await
        .expect("connect");
    let err = client.storage_health().await.expect_err("hangs");
    assert!(
        matches!(
            err,
            CsiError::Timeout {
                rpc: "NodeGetStorageHealth",
                ..
            }
        ),
        "{err:?}"
    );
    // Asked again next time.
    driver.set_mode(DriverMode::Modern);
    assert_eq!(client.storage_health().await.expect("storage"), vec![]);
    assert_eq!(driver.calls(Rpc::NodeGetStorageHealth), 2);
}
