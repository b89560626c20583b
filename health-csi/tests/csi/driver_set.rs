//! Socket discovery and DriverSet probing over real unix sockets.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use health_csi::testing::{DriverMode, Rpc, TestDriver, TestDriverHandle};
use health_csi::{
    discover_node_sockets, CsiError, DriverOverride, DriverSet, HealthEntry, HealthSource,
    HealthStatus, ProbeRequest, StorageHealthEntry, StorageHealthStatus,
};

fn request(driver: &str, volume_id: &str) -> ProbeRequest {
    ProbeRequest {
        driver: driver.to_string(),
        volume_id: volume_id.to_string(),
        publish_path: PathBuf::from(format!("/pods/x/volumes/{volume_id}/mount")),
        staging_path: None,
    }
}

async fn start(plugins: &Path, name: &str, mode: DriverMode) -> TestDriverHandle {
    let dir = plugins.join(name);
    fs::create_dir_all(&dir).expect("mkdir");
    TestDriver::start_named(&dir, name, mode)
        .await
        .expect("start driver")
}

#[tokio::test]
async fn discovery_finds_plugin_sockets_only() {
    let root = tempfile::tempdir().expect("tempdir");
    let plugins = root.path().join("plugins");
    fs::create_dir_all(&plugins).expect("mkdir");
    let a = start(&plugins, "b.csi.example", DriverMode::Modern).await;
    let b = start(&plugins, "a.csi.example", DriverMode::LegacyOnly).await;

    // Registrar sockets, deep per-volume dirs and plain files are not CSI
    // endpoints.
    let registry = root.path().join("plugins_registry");
    fs::create_dir_all(&registry).expect("mkdir");
    let _reg = std::os::unix::net::UnixListener::bind(registry.join("a-reg.sock")).expect("bind");
    let nested_registry = plugins.join("plugins_registry");
    fs::create_dir_all(&nested_registry).expect("mkdir");
    let _nested =
        std::os::unix::net::UnixListener::bind(nested_registry.join("x-reg.sock")).expect("bind");
    let deep = plugins.join("kubernetes.io").join("csi").join("pv");
    fs::create_dir_all(&deep).expect("mkdir");
    let _deep = std::os::unix::net::UnixListener::bind(deep.join("deep.sock")).expect("bind");
    fs::write(plugins.join("a.csi.example").join("notes.txt"), b"x").expect("write");
    let _top = std::os::unix::net::UnixListener::bind(plugins.join("top.sock")).expect("bind");

    let found = discover_node_sockets(root.path());
    assert_eq!(
        found,
        vec![
            b.socket_path().to_path_buf(),
            a.socket_path().to_path_buf(),
            plugins.join("top.sock"),
        ]
    );

    // A kubelet root without plugins/ is not an error, just nothing.
    let empty = tempfile::tempdir().expect("tempdir");
    assert!(discover_node_sockets(empty.path()).is_empty());
}

#[tokio::test]
async fn hung_driver_does_not_hold_back_healthy_one() {
    let root = tempfile::tempdir().expect("tempdir");
    let plugins = root.path().join("plugins");
    let good = start(&plugins, "good.csi", DriverMode::Modern).await;
    let hung = start(&plugins, "hung.csi", DriverMode::Hang).await;
    let legacy = start(&plugins, "legacy.csi", DriverMode::LegacyOnly).await;
    let degraded = HealthEntry::new(HealthStatus::Degraded, "SlowIo", "latency 5s");
    good.set_volume_health("g1", vec![degraded.clone()]);
    good.set_volume_health("g2", vec![]);
    legacy.set_volume_health("l1", vec![]);

    let timeout = Duration::from_secs(1);
    let set = DriverSet::build(&discover_node_sockets(root.path()), &[], timeout).await;
    assert!(set.failures().is_empty(), "{:?}", set.failures());
    let names: Vec<&str> = set.drivers().map(|(name, _)| name).collect();
    assert_eq!(names, vec!["good.csi", "hung.csi", "legacy.csi"]);
    // Capabilities were read once per driver while building.
    for driver in [&good, &hung, &legacy] {
        assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    }

    let requests = vec![
        request("hung.csi", "h1"),
        request("good.csi", "g1"),
        request("nobody.csi", "n1"),
        request("legacy.csi", "l1"),
        request("good.csi", "g2"),
    ];
    let started = Instant::now();
    let results = set.probe_all(requests.clone()).await;
    let elapsed = started.elapsed();
    // Generous bound: one timeout plus slack, far below the sum of waits a
    // serial prober would need if it waited on the hung driver first.
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");

    assert_eq!(results.len(), 5);
    for ((got, _), want) in results.iter().zip(&requests) {
        assert_eq!(got, want);
    }
    assert!(
        matches!(
            &results[0].1,
            Err(CsiError::Timeout { rpc: "NodeGetVolumeHealth", after }) if *after == timeout
        ),
        "{:?}",
        results[0].1
    );
    let g1 = results[1].1.as_ref().expect("good driver answered");
    assert_eq!(g1.source, HealthSource::NodeGetVolumeHealth);
    assert_eq!(g1.entries, Some(vec![degraded]));
    assert!(
        matches!(&results[2].1, Err(CsiError::UnknownDriver { driver }) if driver == "nobody.csi"),
        "{:?}",
        results[2].1
    );
    let l1 = results[3].1.as_ref().expect("legacy driver answered");
    assert_eq!(l1.source, HealthSource::NodeGetVolumeStats);
    assert_eq!(l1.entries, Some(vec![]));
    let g2 = results[4].1.as_ref().expect("good driver answered");
    assert_eq!(g2.entries, Some(vec![]));

    // A second round: capabilities are read again (once per driver per
    // round), and the legacy driver is asked its stats only.
    let results = set
        .probe_all(vec![
            request("legacy.csi", "l1"),
            request("legacy.csi", "l1"),
        ])
        .await;
    assert!(results.iter().all(|(_, r)| r.is_ok()), "{results:?}");
    assert_eq!(legacy.calls(Rpc::NodeGetVolumeHealth), 0);
    assert_eq!(legacy.calls(Rpc::NodeGetVolumeStats), 3);
    assert_eq!(legacy.calls(Rpc::NodeGetCapabilities), 3);
    assert_eq!(good.calls(Rpc::NodeGetCapabilities), 2);
    assert_eq!(good.calls(Rpc::NodeGetVolumeHealth), 2);
    assert_eq!(good.calls(Rpc::NodeGetVolumeStats), 0);
}

/// A driver upgraded in place (same socket, same set) is asked the way its
/// new capabilities say from the next round on.
#[tokio::test]
async fn capabilities_are_read_again_every_round() {
    let root = tempfile::tempdir().expect("tempdir");
    let plugins = root.path().join("plugins");
    let driver = start(&plugins, "up.csi", DriverMode::LegacyOnly).await;
    driver.set_volume_health("v1", vec![]);
    let set = DriverSet::build(
        &[driver.socket_path().to_path_buf()],
        &[],
        Duration::from_secs(5),
    )
    .await;

    let results = set.probe_all(vec![request("up.csi", "v1")]).await;
    let report = results[0].1.as_ref().expect("legacy answer");
    assert_eq!(report.source, HealthSource::NodeGetVolumeStats);

    driver.set_mode(DriverMode::Modern);
    let results = set.probe_all(vec![request("up.csi", "v1")]).await;
    let report = results[0].1.as_ref().expect("1.13 answer");
    assert_eq!(report.source, HealthSource::NodeGetVolumeHealth);
    assert_eq!(report.entries, Some(vec![]));

    // Downgraded to a driver without any health capability: not asked.
    driver.set_mode(DriverMode::LegacyNoCondition);
    let results = set.probe_all(vec![request("up.csi", "v1")]).await;
    assert!(
        matches!(results[0].1, Err(CsiError::NotAdvertised { .. })),
        "{:?}",
        results[0].1
    );
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 4);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeStats), 1);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 1);

    // Capabilities that cannot be read again (an answer, not a transport
    // failure): the last ones read decide.
    driver.set_mode(DriverMode::Modern);
    driver.set_unimplemented(Rpc::NodeGetCapabilities);
    let results = set.probe_all(vec![request("up.csi", "v1")]).await;
    assert!(
        matches!(results[0].1, Err(CsiError::NotAdvertised { .. })),
        "{:?}",
        results[0].1
    );
    assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 5);
    assert_eq!(driver.calls(Rpc::NodeGetVolumeHealth), 1);
}

#[tokio::test]
async fn hung_driver_skips_rest_of_its_batch() {
    let root = tempfile::tempdir().expect("tempdir");
    let plugins = root.path().join("plugins");
    let hung = start(&plugins, "hung.csi", DriverMode::Hang).await;
    let timeout = Duration::from_millis(500);
    let set = DriverSet::build(&[hung.socket_path().to_path_buf()], &[], timeout)
        .await
        .with_max_in_flight_per_driver(1);

    let requests = (0..5)
        .map(|i| request("hung.csi", &format!("v{i}")))
        .collect();
    let results = set.probe_all(requests).await;
    assert!(
        matches!(results[0].1, Err(CsiError::Timeout { .. })),
        "{results:?}"
    );
    for (_, result) in &results[1..] {
        assert!(
            matches!(result, Err(CsiError::Skipped { driver }) if driver == "hung.csi"),
            "{result:?}"
        );
    }
    assert_eq!(hung.calls(Rpc::NodeGetVolumeHealth), 1);
}

#[tokio::test]
async fn overrides_and_failures() {
    let root = tempfile::tempdir().expect("tempdir");
    let plugins = root.path().join("plugins");
    let elsewhere = root.path().join("elsewhere");
    // Named "real.name" on the wire, registered by override as "pinned".
    let pinned = start(&elsewhere, "real.name", DriverMode::Modern).await;
    pinned.set_volume_health("p1", vec![]);
    // Discovered, but unusable: it cannot tell its name.
    let nameless = start(&plugins, "nameless", DriverMode::Unimplemented).await;
    let missing = root.path().join("gone").join("csi.sock");

    let spec = format!("pinned={}", pinned.socket_path().display());
    let pinned_override: DriverOverride = spec.parse().expect("parse override");
    assert_eq!(pinned_override.driver, "pinned");
    assert!("no-equals-sign".parse::<DriverOverride>().is_err());
    assert!("=x".parse::<DriverOverride>().is_err());

    let missing_override = DriverOverride {
        driver: "missing".to_string(),
        socket: missing.clone(),
    };
    let set = DriverSet::build(
        &discover_node_sockets(root.path()),
        &[pinned_override, missing_override],
        Duration::from_secs(5),
    )
    .await;

    let drivers: Vec<(&str, &Path)> = set.drivers().collect();
    assert_eq!(drivers, vec![("pinned", pinned.socket_path())]);
    assert_eq!(pinned.calls(Rpc::GetPluginInfo), 0);
    let failed: Vec<&Path> = set.failures().iter().map(|(s, _)| s.as_path()).collect();
    assert_eq!(failed, vec![missing.as_path(), nameless.socket_path()]);
    assert!(matches!(set.failures()[0].1, CsiError::Connect { .. }));
    assert!(matches!(
        set.failures()[1].1,
        CsiError::Unsupported {
            rpc: "GetPluginInfo"
        }
    ));

    let results = set.probe_all(vec![request("pinned", "p1")]).await;
    assert_eq!(
        results[0].1.as_ref().expect("pinned answered").entries,
        Some(vec![])
    );
}

#[tokio::test]
async fn storage_health_is_asked_once_per_driver_and_bounded_by_the_timeout() {
    let root = tempfile::tempdir().expect("tempdir");
    let plugins = root.path().join("plugins");
    let modern = start(&plugins, "m.csi.example", DriverMode::Modern).await;
    let legacy = start(&plugins, "l.csi.example", DriverMode::LegacyOnly).await;
    let hang = start(&plugins, "h.csi.example", DriverMode::Hang).await;
    let down = vec![StorageHealthEntry::new(
        StorageHealthStatus::StorageUnreachable,
        "ArrayOffline",
        "a1 down",
    )];
    modern.set_storage_health(down.clone());
    let sockets: Vec<PathBuf> = [&modern, &legacy, &hang]
        .iter()
        .map(|d| d.socket_path().to_path_buf())
        .collect();
    let timeout = Duration::from_millis(500);
    let set = DriverSet::build(&sockets, &[], timeout).await;

    for round in 1..=2 {
        let started = Instant::now();
        let probes = set.storage_health_all().await;
        assert!(started.elapsed() < timeout * 3, "{:?}", started.elapsed());
        let names: Vec<&str> = probes.iter().map(|p| p.driver.as_str()).collect();
        assert_eq!(names, ["h.csi.example", "l.csi.example", "m.csi.example"]);
        assert!(
            matches!(probes[0].result, Err(CsiError::Timeout { .. })),
            "{:?}",
            probes[0]
        );
        assert!(
            matches!(
                probes[1].result,
                Err(CsiError::NotAdvertised {
                    rpc: "NodeGetStorageHealth",
                    ..
                })
            ),
            "{:?}",
            probes[1]
        );
        assert_eq!(probes[2].result.as_ref().ok(), Some(&down));
        assert_eq!(modern.calls(Rpc::NodeGetStorageHealth), round);
        assert_eq!(hang.calls(Rpc::NodeGetStorageHealth), round);
    }
    // The legacy driver does not advertise GET_STORAGE_HEALTH; the cached
    // capabilities of the build decided, without asking again.
    assert_eq!(legacy.calls(Rpc::NodeGetStorageHealth), 0);
    for driver in [&modern, &legacy, &hang] {
        assert_eq!(driver.calls(Rpc::NodeGetCapabilities), 1);
    }
}
