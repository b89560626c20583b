//! ControllerClient against the test driver over real unix sockets.

use std::collections::BTreeMap;
use std::time::Duration;

use health_csi::testing::{DriverMode, ListedVolume, Rpc, TestDriver, TestDriverHandle};
use health_csi::{
    ControllerClient, ControllerHealthSource, ControllerVolumeReport, CsiError, HealthEntry,
    HealthStatus,
};

const TIMEOUT: Duration = Duration::from_secs(10);

fn pages(spec: &[&[&str]]) -> Vec<Vec<String>> {
    spec.iter()
        .map(|page| page.iter().map(|id| id.to_string()).collect())
        .collect()
}

async fn setup(dir: &std::path::Path, mode: DriverMode) -> (TestDriverHandle, ControllerClient) {
    let driver = TestDriver::start(dir, mode).await.expect("start");
    let client = ControllerClient::connect(driver.socket_path(), TIMEOUT)
        .await
        .expect("connect");
    (driver, client)
}

#[tokio::test]
async fn modern_list_pages_with_duplicates_merge() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, client) = setup(dir.path(), DriverMode::Modern).await;
    let lost = HealthEntry::new(
        HealthStatus::DataLoss,
        "ReplicaLost",
        "2 of 3 replicas gone",
    );
    let slow = HealthEntry::new(HealthStatus::Degraded, "Slow", "p99 3s");
    driver.set_volume_health("a", vec![lost.clone()]);
    driver.set_volume_health("b", vec![slow.clone()]);
    driver.set_volume_health("c", vec![]);
    // "a" on pages 1 and 3 (inconsistent paging), "c" healthy but listed.
    driver.set_list_pages(pages(&[&["a", "b"], &["c"], &["a"]]));

    let list = client.list_volume_health(2, 10).await.expect("list");
    assert_eq!(
        list.source,
        ControllerHealthSource::ControllerListVolumeHealth
    );
    assert!(list.complete);
    assert_eq!(list.pages, 3);
    let want: BTreeMap<String, Option<Vec<HealthEntry>>> = [
        ("a".to_string(), Some(vec![lost])),
        ("b".to_string(), Some(vec![slow])),
        ("c".to_string(), Some(vec![])),
    ]
    .into_iter()
    .collect();
    assert_eq!(list.volumes, want);
    assert_eq!(driver.calls(Rpc::ControllerGetCapabilities), 1);
    assert_eq!(driver.calls(Rpc::ControllerListVolumeHealth), 3);
    assert_eq!(driver.calls(Rpc::ListVolumes), 0);
}

#[tokio::test]
async fn duplicate_with_different_conditions_is_united() {
    let dir = tempfile::tempdir().expect("tempdir");
    for mode in [DriverMode::Modern, DriverMode::LegacyOnly] {
        let sub = dir.path().join(format!("{mode:?}"));
        std::fs::create_dir(&sub).expect("mkdir");
        let (driver, client) = setup(&sub, mode).await;
        let slow = |message: &str| HealthEntry::new(HealthStatus::Degraded, "Slow", message);
        let offline = HealthEntry::new(HealthStatus::Inaccessible, "Offline", "gone");
        // The volume's conditions changed between the two pages of one walk;
        // "b" was abnormal on page 1 and listed healthy on page 2.
        driver.set_list_page_entries(vec![
            vec![
                ListedVolume {
                    volume_id: "a".into(),
                    health: Some(vec![slow("first")]),
                },
                ListedVolume {
                    volume_id: "b".into(),
                    health: Some(vec![offline.clone()]),
                },
            ],
            vec![
                ListedVolume {
                    volume_id: "a".into(),
                    health: Some(vec![slow("updated"), offline.clone()]),
                },
                ListedVolume {
                    volume_id: "b".into(),
                    health: Some(vec![]),
                },
            ],
        ]);

        let list = client.list_volume_health(0, 10).await.expect("list");
        assert!(list.complete);
        assert_eq!(list.pages, 2);
        let want: BTreeMap<String, Option<Vec<HealthEntry>>> = if mode == DriverMode::Modern {
            [
                (
                    "a".to_string(),
                    Some(vec![slow("updated"), offline.clone()]),
                ),
                ("b".to_string(), Some(vec![offline.clone()])),
            ]
            .into_iter()
            .collect()
        } else {
            let legacy = |message: &str| {
                HealthEntry::new(HealthStatus::Degraded, "VolumeConditionAbnormal", message)
            };
            [
                ("a".to_string(), Some(vec![legacy("updated; gone")])),
                ("b".to_string(), Some(vec![legacy("gone")])),
            ]
            .into_iter()
            .collect()
        };
        assert_eq!(list.volumes, want, "{mode:?}");
    }
}

#[tokio::test]
async fn page_limit_marks_incomplete() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, client) = setup(dir.path(), DriverMode::Modern).await;
    driver.set_volume_health("a", vec![]);
    driver.set_list_pages(pages(&[&["a"], &["a"], &["a"], &["a"]]));

    let list = client.list_volume_health(0, 2).await.expect("list");
    assert!(!list.complete);
    assert_eq!(list.pages, 2);
    assert_eq!(driver.calls(Rpc::ControllerListVolumeHealth), 2);
}

/// Without explicit pages the driver pages its volumes itself: 1,001
/// volumes in pages of 100 are 11 pages, each unhealthy volume listed once
/// (each token names the page's last volume, `testing::AFTER`).
#[tokio::test]
async fn the_drivers_own_pages_list_each_unhealthy_volume_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, client) = setup(dir.path(), DriverMode::Modern).await;
    let slow = HealthEntry::new(HealthStatus::Degraded, "Slow", "p99 3s");
    let ids: Vec<String> = (0..1001).map(|i| format!("vol-{i:06}")).collect();
    for (i, id) in ids.iter().enumerate() {
        let health = if i % 100 == 7 {
            vec![slow.clone()]
        } else {
            vec![]
        };
        driver.set_volume_health(id, health);
    }

    let list = client.list_volume_health(100, 20).await.expect("list");
    assert!(list.complete);
    assert_eq!(list.pages, 11);
    assert_eq!(driver.calls(Rpc::ControllerListVolumeHealth), 11);
    assert_eq!(driver.list_max_entries(), vec![100; 11]);
    // The list names the unhealthy volumes only (one on each page here).
    let listed: Vec<&str> = list.volumes.keys().map(String::as_str).collect();
    let want: Vec<&str> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 100 == 7)
        .map(|(_, id)| id.as_str())
        .collect();
    assert_eq!(listed, want);
    assert!(list
        .volumes
        .values()
        .all(|h| h.as_deref() == Some(&[slow.clone()][..])));

    // Exactly 100: the page is full and nothing follows, so no token.
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, client) = setup(dir.path(), DriverMode::Modern).await;
    for id in &ids[..100] {
        driver.set_volume_health(id, vec![slow.clone()]);
    }
    let list = client.list_volume_health(100, 20).await.expect("list");
    assert_eq!(
        (list.complete, list.pages, list.volumes.len()),
        (true, 1, 100)
    );
}

#[tokio::test]
async fn legacy_list_is_list_volumes_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, client) = setup(dir.path(), DriverMode::LegacyOnly).await;
    driver.set_volume_health(
        "a",
        vec![HealthEntry::new(
            HealthStatus::DataLoss,
            "X",
            "disk on fire",
        )],
    );
    driver.set_volume_health("b", vec![]);
    driver.set_list_pages(pages(&[&["a"], &["b", "a"]]));

    for round in 1..=2u64 {
        let list = client.list_volume_health(1, 10).await.expect("list");
        assert_eq!(list.source, ControllerHealthSource::ListVolumes);
        assert!(list.complete);
        assert_eq!(list.pages, 2);
        let want: BTreeMap<String, Option<Vec<HealthEntry>>> = [
            (
                "a".to_string(),
                Some(vec![HealthEntry::new(
                    HealthStatus::Degraded,
                    "VolumeConditionAbnormal",
                    "disk on fire",
                )]),
            ),
            ("b".to_string(), Some(vec![])),
        ]
        .into_iter()
        .collect();
        assert_eq!(list.volumes, want);
        assert_eq!(driver.calls(Rpc::ControllerListVolumeHealth), 0);
        assert_eq!(driver.calls(Rpc::ListVolumes), 2 * round);
    }
    assert_eq!(driver.calls(Rpc::ControllerGetCapabilities), 1);
}

#[tokio::test]
async fn legacy_without_condition_is_not_asked_about_health() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, client) = setup(dir.path(), DriverMode::LegacyNoCondition).await;
    driver.set_volume_health("a", vec![]);
    let caps = client.capabilities().await.expect("caps");
    assert!(caps.list_volumes && caps.get_volume && !caps.volume_condition);

    let err = client.list_volume_health(0, 10).await.expect_err("no list");
    assert!(
        matches!(
            err,
            CsiError::NotAdvertised {
                rpc: "ControllerListVolumeHealth",
                needs: "LIST_VOLUME_HEALTH, or VOLUME_CONDITION with LIST_VOLUMES",
            }
        ),
        "{err:?}"
    );
    let err = client.get_volume_health("a").await.expect_err("no get");
    assert!(
        matches!(
            err,
            CsiError::NotAdvertised {
                rpc: "ControllerGetVolumeHealth",
                needs: "GET_VOLUME_HEALTH, or VOLUME_CONDITION with GET_VOLUME",
            }
        ),
        "{err:?}"
    );
    for rpc in [
        Rpc::ListVolumes,
        Rpc::ControllerGetVolume,
        Rpc::ControllerListVolumeHealth,
        Rpc::ControllerGetVolumeHealth,
    ] {
        assert_eq!(driver.calls(rpc), 0, "{rpc:?}");
    }
}

#[tokio::test]
async fn get_volume_health_modern_and_not_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, client) = setup(dir.path(), DriverMode::Modern).await;
    let entry = HealthEntry::new(HealthStatus::Inaccessible, "PathDown", "all paths down");
    driver.set_volume_health("a", vec![entry.clone()]);

    assert_eq!(
        client.get_volume_health("a").await.expect("get"),
        ControllerVolumeReport {
            source: ControllerHealthSource::ControllerGetVolumeHealth,
            entries: Some(vec![entry]),
        }
    );
    let err = client.get_volume_health("gone").await.expect_err("gone");
    assert!(
        matches!(&err, CsiError::VolumeGone { rpc: "ControllerGetVolumeHealth", volume_id } if volume_id == "gone"),
        "{err:?}"
    );
    assert_eq!(driver.calls(Rpc::ControllerGetVolume), 0);
}

#[tokio::test]
async fn legacy_get_is_controller_get_volume_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (driver, client) = setup(dir.path(), DriverMode::LegacyOnly).await;
    driver.set_volume_health(
        "a",
        vec![HealthEntry::new(HealthStatus::Degraded, "X", "resync")],
    );

    let report = client.get_volume_health("a").await.expect("get");
    assert_eq!(
        report,
        ControllerVolumeReport {
            source: ControllerHealthSource::ControllerGetVolume,
            entries: Some(vec![HealthEntry::new(
                HealthStatus::Degraded,
                "VolumeConditionAbnormal",
                "resync"
            )]),
        }
    );
    let err = client.get_volume_health("gone").await.expect_err("gone");
    assert!(
        matches!(&err, CsiError::VolumeGone { rpc: "ControllerGetVolume", volume_id } if volume_id == "gone"),
        "{err:?}"
    );
    assert_eq!(driver.calls(Rpc::ControllerGetVolumeHealth), 0);
    assert_eq!(driver.calls(Rpc::ControllerGetVolume), 2);
}

#[tokio::test]
async fn hung_controller_times_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = TestDriver::start(dir.path(), DriverMode::Hang)
        .await
        .expect("start");
    let timeout = Duration::from_millis(500);
    let client = ControllerClient::connect(driver.socket_path(), timeout)
        .await
        .expect("connect");
    let err = client.list_volume_health(0, 10).await.expect_err("hang");
    assert!(
        matches!(
            err,
            CsiError::Timeout {
                rpc: "ControllerListVolumeHealth",
                ..
            }
        ),
        "{err:?}"
    );
    let err = client.get_volume_health("a").await.expect_err("hang");
    assert!(
        matches!(
            err,
            CsiError::Timeout {
                rpc: "ControllerGetVolumeHealth",
                ..
            }
        ),
        "{err:?}"
    );
    // A timeout is no reason to try the legacy RPCs.
    assert_eq!(driver.calls(Rpc::ListVolumes), 0);
    assert_eq!(driver.calls(Rpc::ControllerGetVolume), 0);
}
