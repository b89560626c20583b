//! The advertised capabilities decide which health RPC is called, as the
//! kubelet decides it: exact per-RPC call counts for a driver that
//! advertises the 1.13 capabilities, only VOLUME_CONDITION, nothing, or a
//! capability whose RPC answers UNIMPLEMENTED.

use std::path::Path;
use std::time::Duration;

use health_csi::testing::{
    ControllerCapability as C, DriverMode, NodeCapability as N, Rpc, TestDriver, TestDriverHandle,
};
use health_csi::{
    ControllerClient, ControllerHealthSource, CsiError, HealthEntry, HealthSource, HealthStatus,
    NodeClient, StorageHealthEntry, StorageHealthStatus,
};

const TIMEOUT: Duration = Duration::from_secs(10);
const PUBLISH: &str = "/var/lib/kubelet/pods/p1/volumes/kubernetes.io~csi/pv1/mount";

/// The per-RPC call counts of `driver`, every RPC, in [`Rpc::ALL`] order.
fn counts(driver: &TestDriverHandle) -> Vec<(Rpc, u64)> {
    Rpc::ALL
        .iter()
        .map(|rpc| (*rpc, driver.calls(*rpc)))
        .collect()
}

/// Every RPC with the count given for it in `expected`, 0 for the rest.
fn only(expected: &[(Rpc, u64)]) -> Vec<(Rpc, u64)> {
    Rpc::ALL
        .iter()
        .map(|rpc| {
            let n = expected
                .iter()
                .find(|(r, _)| r == rpc)
                .map_or(0, |(_, n)| *n);
            (*rpc, n)
        })
        .collect()
}

async fn clients(driver: &TestDriverHandle) -> (NodeClient, ControllerClient) {
    let node = NodeClient::connect(driver.socket_path(), TIMEOUT)
        .await
        .expect("connect node");
    let controller = ControllerClient::connect(driver.socket_path(), TIMEOUT)
        .await
        .expect("connect controller");
    (node, controller)
}

/// Asks every health question once on each side: node volume health,
/// storage health, controller list and controller get.
async fn ask_everything(node: &NodeClient, controller: &ControllerClient) -> Asked {
    Asked {
        node: node
            .volume_health("vol-1", Path::new(PUBLISH), None)
            .await
            .map(|r| (r.source, r.entries)),
        storage: node.storage_health().await,
        list: controller
            .list_volume_health(0, 10)
            .await
            .map(|l| (l.source, l.volumes.keys().cloned().collect())),
        get: controller
            .get_volume_health("vol-1")
            .await
            .map(|r| (r.source, r.entries)),
    }
}

type Answer<S> = Result<(S, Option<Vec<HealthEntry>>), CsiError>;

struct Asked {
    node: Answer<HealthSource>,
    storage: Result<Vec<StorageHealthEntry>, CsiError>,
    list: Result<(ControllerHealthSource, Vec<String>), CsiError>,
    get: Answer<ControllerHealthSource>,
}

fn sick() -> Vec<HealthEntry> {
    vec![HealthEntry::new(
        HealthStatus::DataLoss,
        "ChecksumMismatch",
        "3 blocks unreadable",
    )]
}

/// (a) A driver advertising the 1.13 capabilities beside the legacy ones is
/// asked the 1.13 way only.
#[tokio::test]
async fn advertised_1_13_capabilities_are_called_and_legacy_is_not() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .expect("start");
    driver.set_node_capabilities(vec![
        N::GetVolumeStats,
        N::VolumeCondition,
        N::GetVolumeHealth,
        N::GetStorageHealth,
    ]);
    driver.set_controller_capabilities(vec![
        C::ListVolumes,
        C::GetVolume,
        C::VolumeCondition,
        C::GetVolumeHealth,
        C::ListVolumeHealth,
    ]);
    driver.set_volume_health("vol-1", sick());
    let unreachable = vec![StorageHealthEntry::new(
        StorageHealthStatus::StorageUnreachable,
        "FabricDown",
        "no path to the array",
    )];
    driver.set_storage_health(unreachable.clone());
    let (node, controller) = clients(&driver).await;

    let asked = ask_everything(&node, &controller).await;
    assert_eq!(
        asked.node.expect("node"),
        (HealthSource::NodeGetVolumeHealth, Some(sick()))
    );
    assert_eq!(asked.storage.expect("storage"), unreachable);
    assert_eq!(
        asked.list.expect("list"),
        (
            ControllerHealthSource::ControllerListVolumeHealth,
            vec!["vol-1".to_string()]
        )
    );
    assert_eq!(
        asked.get.expect("get"),
        (
            ControllerHealthSource::ControllerGetVolumeHealth,
            Some(sick())
        )
    );
    assert_eq!(
        counts(&driver),
        only(&[
            (Rpc::NodeGetCapabilities, 1),
            (Rpc::NodeGetVolumeHealth, 1),
            (Rpc::NodeGetStorageHealth, 1),
            (Rpc::ControllerGetCapabilities, 1),
            (Rpc::ControllerListVolumeHealth, 1),
            (Rpc::ControllerGetVolumeHealth, 1),
        ])
    );
}

/// (b) Only VOLUME_CONDITION: the legacy RPCs, and never a 1.13 one, even
/// from a driver that would answer them.
#[tokio::test]
async fn only_volume_condition_gets_the_legacy_rpcs() {
    let dir = tempfile::tempdir().expect("tempdir");
    for mode in [DriverMode::LegacyOnly, DriverMode::Modern] {
        let sub = dir.path().join(format!("{mode:?}"));
        std::fs::create_dir(&sub).expect("mkdir");
        let driver = TestDriver::start(&sub, mode).await.expect("start");
        driver.set_node_capabilities(vec![
            N::StageUnstageVolume,
            N::GetVolumeStats,
            N::VolumeCondition,
        ]);
        driver.set_controller_capabilities(vec![C::ListVolumes, C::GetVolume, C::VolumeCondition]);
        driver.set_volume_health("vol-1", sick());
        let (node, controller) = clients(&driver).await;

        let asked = ask_everything(&node, &controller).await;
        let node_answer = asked.node.expect("node");
        assert_eq!(node_answer.0, HealthSource::NodeGetVolumeStats, "{mode:?}");
        assert!(
            matches!(
                asked.storage,
                Err(CsiError::NotAdvertised {
                    rpc: "NodeGetStorageHealth",
                    ..
                })
            ),
            "{mode:?}: {:?}",
            asked.storage
        );
        assert_eq!(
            asked.list.expect("list"),
            (
                ControllerHealthSource::ListVolumes,
                vec!["vol-1".to_string()]
            ),
            "{mode:?}"
        );
        let get = asked.get.expect("get");
        assert_eq!(
            get.0,
            ControllerHealthSource::ControllerGetVolume,
            "{mode:?}"
        );
        if mode == DriverMode::LegacyOnly {
            let legacy = Some(vec![HealthEntry::new(
                HealthStatus::Degraded,
                "VolumeConditionAbnormal",
                "3 blocks unreadable",
            )]);
            assert_eq!(node_answer.1, legacy);
            assert_eq!(get.1, legacy);
        } else {
            // A 1.13 driver has no condition to send: no information.
            assert_eq!(node_answer.1, None);
            assert_eq!(get.1, None);
        }
        assert_eq!(
            counts(&driver),
            only(&[
                (Rpc::NodeGetCapabilities, 1),
                (Rpc::NodeGetVolumeStats, 1),
                (Rpc::ControllerGetCapabilities, 1),
                (Rpc::ListVolumes, 1),
                (Rpc::ControllerGetVolume, 1),
            ]),
            "{mode:?}"
        );
    }
}

/// (c) Nothing health-related advertised: no health call at all, from a
/// driver that would answer every one of them.
#[tokio::test]
async fn nothing_advertised_gets_no_health_rpc() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = TestDriver::start(dir.path(), DriverMode::Modern)
        .await
        .expect("start");
    driver.set_node_capabilities(vec![N::StageUnstageVolume, N::GetVolumeStats]);
    driver.set_controller_capabilities(vec![C::ListVolumes, C::GetVolume]);
    driver.set_volume_health("vol-1", sick());
    let (node, controller) = clients(&driver).await;

    for _ in 0..2 {
        let asked = ask_everything(&node, &controller).await;
        for (what, err) in [
            ("node", asked.node.err()),
            ("storage", asked.storage.err()),
            ("list", asked.list.err()),
            ("get", asked.get.err()),
        ] {
            assert!(
                matches!(err, Some(CsiError::NotAdvertised { .. })),
                "{what}: {err:?}"
            );
        }
    }
    assert_eq!(
        counts(&driver),
        only(&[
            (Rpc::NodeGetCapabilities, 1),
            (Rpc::ControllerGetCapabilities, 1),
        ])
    );
}

/// (d) Advertised, but answering UNIMPLEMENTED: an error every time, the
/// capability still trusted, no fallback to the legacy RPCs the driver
/// also advertises.
#[tokio::test]
async fn advertised_but_unimplemented_is_an_error_every_time() {
    let dir = tempfile::tempdir().expect("tempdir");
    let driver = TestDriver::start(dir.path(), DriverMode::LegacyOnly)
        .await
        .expect("start");
    driver.set_node_capabilities(vec![
        N::GetVolumeStats,
        N::VolumeCondition,
        N::GetVolumeHealth,
        N::GetStorageHealth,
    ]);
    driver.set_controller_capabilities(vec![
        C::ListVolumes,
        C::GetVolume,
        C::VolumeCondition,
        C::GetVolumeHealth,
        C::ListVolumeHealth,
    ]);
    driver.set_volume_health("vol-1", vec![]);
    let (node, controller) = clients(&driver).await;

    for _ in 0..3 {
        let asked = ask_everything(&node, &controller).await;
        for (what, err, rpc) in [
            ("node", asked.node.err(), "NodeGetVolumeHealth"),
            ("storage", asked.storage.err(), "NodeGetStorageHealth"),
            ("list", asked.list.err(), "ControllerListVolumeHealth"),
            ("get", asked.get.err(), "ControllerGetVolumeHealth"),
        ] {
            match err {
                Some(CsiError::Unsupported { rpc: got }) => assert_eq!(got, rpc, "{what}"),
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    assert_eq!(
        counts(&driver),
        only(&[
            (Rpc::NodeGetCapabilities, 1),
            (Rpc::NodeGetVolumeHealth, 3),
            (Rpc::NodeGetStorageHealth, 3),
            (Rpc::ControllerGetCapabilities, 1),
            (Rpc::ControllerListVolumeHealth, 3),
            (Rpc::ControllerGetVolumeHealth, 3),
        ])
    );
}

/// The test driver's defaults: what each generation advertises.
#[tokio::test]
async fn each_mode_advertises_its_generation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let want: [(DriverMode, Vec<N>, Vec<C>); 3] = [
        (
            DriverMode::Modern,
            vec![
                N::StageUnstageVolume,
                N::GetVolumeStats,
                N::GetVolumeHealth,
                N::GetStorageHealth,
            ],
            vec![
                C::ListVolumes,
                C::GetVolume,
                C::GetVolumeHealth,
                C::ListVolumeHealth,
            ],
        ),
        (
            DriverMode::LegacyOnly,
            vec![N::StageUnstageVolume, N::GetVolumeStats, N::VolumeCondition],
            vec![C::ListVolumes, C::GetVolume, C::VolumeCondition],
        ),
        (
            DriverMode::LegacyNoCondition,
            vec![N::StageUnstageVolume, N::GetVolumeStats],
            vec![C::ListVolumes, C::GetVolume],
        ),
    ];
    for (mode, node, controller) in want {
        let sub = dir.path().join(format!("{mode:?}"));
        std::fs::create_dir(&sub).expect("mkdir");
        let driver = TestDriver::start(&sub, mode).await.expect("start");
        assert_eq!(driver.node_capabilities(), node, "{mode:?}");
        assert_eq!(driver.controller_capabilities(), controller, "{mode:?}");
    }
    // An RPC made UNIMPLEMENTED takes its capability with it.
    let sub = dir.path().join("lacking");
    std::fs::create_dir(&sub).expect("mkdir");
    let driver = TestDriver::start(&sub, DriverMode::Modern)
        .await
        .expect("start");
    driver.set_unimplemented(Rpc::NodeGetStorageHealth);
    driver.set_unimplemented(Rpc::ControllerListVolumeHealth);
    assert_eq!(
        driver.node_capabilities(),
        [N::StageUnstageVolume, N::GetVolumeStats, N::GetVolumeHealth]
    );
    assert_eq!(
        driver.controller_capabilities(),
        [C::ListVolumes, C::GetVolume, C::GetVolumeHealth]
    );
}
