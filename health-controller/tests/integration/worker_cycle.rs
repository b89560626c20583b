//! The leader's worker ([`health_controller::Worker`]) against a real CSI
//! controller service (the in-process test driver over a unix socket) and
//! kube's mock API service, asserting the exact Event requests: one
//! Warning per abnormal volume, silence while it lasts, a patch on change,
//! a Normal after two healthy cycles, and a takeover that continues the
//! earlier leader's Event.

use crate::common;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{pvc, start_api, volume};
use health_controller::cycle::{CycleConfig, Prober};
use health_controller::inventory::{MonitoredVolume, NodeState};
use health_controller::metrics::ControllerMetrics;
use health_controller::{recorder_config, ClusterState, Worker};
use health_csi::testing::{ControllerCapability, DriverMode, Rpc, TestDriver, TestDriverHandle};
use health_csi::{ControllerClient, HealthEntry, HealthStatus};
use health_kube::testing::{ApiRequest, MockApi};
use http::Method;
use serde_json::{json, Value};

/// The cluster as the test sets it; `script` answers successive
/// `volumes()` calls first (to change the PVs in the middle of a cycle).
#[derive(Default)]
struct Cluster {
    volumes: Mutex<Vec<MonitoredVolume>>,
    script: Mutex<VecDeque<Vec<MonitoredVolume>>>,
    nodes: Mutex<Vec<NodeState>>,
}

impl ClusterState for Cluster {
    /// Sorted by PV name, as the inventory keeps them.
    fn volumes(&self) -> Arc<Vec<MonitoredVolume>> {
        let mut v = match self.script.lock().unwrap().pop_front() {
            Some(v) => v,
            None => self.volumes.lock().unwrap().clone(),
        };
        v.sort();
        Arc::new(v)
    }
    fn nodes(&self) -> Vec<NodeState> {
        self.nodes.lock().unwrap().clone()
    }
}

fn degraded(message: &str) -> Vec<HealthEntry> {
    vec![HealthEntry::new(
        HealthStatus::Degraded,
        "ReplicaLost",
        message,
    )]
}

struct Setup {
    _dir: tempfile::TempDir,
    driver: TestDriverHandle,
    api: MockApi,
    cluster: Cluster,
    worker: Worker,
}

async fn setup(
    mode: DriverMode,
    tweak: impl FnOnce(&TestDriverHandle),
    events: Vec<Value>,
    page_size: u32,
) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let driver = TestDriver::start(dir.path(), mode).await.unwrap();
    tweak(&driver);
    let csi = ControllerClient::connect(driver.socket_path(), Duration::from_millis(500))
        .await
        .unwrap();
    let caps = csi.capabilities().await.unwrap();
    let prober = Prober::new(
        csi,
        caps,
        CycleConfig {
            page_size,
            max_pages: 100,
            get_concurrency: 2,
        },
    );
    let (client, api) = start_api(events, Vec::new());
    let cluster = Cluster::default();
    *cluster.volumes.lock().unwrap() = vec![volume(1), volume(2), volume(3)];
    let worker = Worker::start(
        client,
        recorder_config("ctl-0", 100, Duration::ZERO),
        prober,
        Duration::from_secs(60),
        Duration::from_secs(1),
        Arc::new(ControllerMetrics::new()),
        &cluster,
    )
    .await;
    // The read-back of earlier leaders' Events.
    let listed = api.take();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(
        listed[0].uri,
        "/api/v1/events?&fieldSelector=reportingComponent%3Dvolume-health-controller&limit=500"
    );
    Setup {
        _dir: dir,
        driver,
        api,
        cluster,
        worker,
    }
}

impl Setup {
    /// One cycle, then every request it caused.
    async fn cycle(&mut self) -> Vec<ApiRequest> {
        self.worker.csi_cycle(&self.cluster).await;
        self.settle().await
    }

    async fn settle(&mut self) -> Vec<ApiRequest> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.worker.shared().lock().has_pending() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "events still unwritten"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A write finishing after the recorder is settled would be a bug;
        // give it a moment to show.
        tokio::time::sleep(Duration::from_millis(50)).await;
        self.api.take()
    }
}

fn summary(seen: &[ApiRequest]) -> Vec<(String, String, String, String)> {
    seen.iter()
        .map(|s| {
            let object = s.body["involvedObject"]["name"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let reason = s.body["reason"].as_str().unwrap_or("").to_string();
            let type_ = s.body["type"].as_str().unwrap_or("").to_string();
            (s.method.to_string(), object, type_, reason)
        })
        .collect()
}

#[tokio::test]
async fn abnormal_once_silent_while_it_lasts_patched_on_change_cleared_after_two_cycles() {
    let mut s = setup(DriverMode::Modern, |_| {}, Vec::new(), 500).await;
    s.driver.set_volume_health("h-1", Vec::new());
    s.driver
        .set_volume_health("h-2", degraded("replica 2 of 3 lost"));
    s.driver.set_volume_health("h-3", Vec::new());

    let seen = s.cycle().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, Method::POST);
    assert_eq!(seen[0].uri, "/api/v1/namespaces/shop/events?");
    let body = &seen[0].body;
    let name = body["metadata"]["name"].as_str().unwrap().to_string();
    assert!(name.starts_with("data-2."), "{name}");
    let first = body["firstTimestamp"].clone();
    assert_eq!(
        body,
        &json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": "shop"},
            "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                               "namespace": "shop", "name": "data-2", "uid": "uid-data-2"},
            "reason": "ReplicaLost",
            "message": "PV pv-2: Degraded ReplicaLost: replica 2 of 3 lost",
            "type": "Warning",
            "count": 1,
            "firstTimestamp": first,
            "lastTimestamp": body["lastTimestamp"],
            "source": {"component": "volume-health-controller", "host": "ctl-0"},
            "reportingComponent": "volume-health-controller",
            "reportingInstance": "ctl-0"
        })
    );

    // Abnormal for five more cycles: not one request.
    for _ in 0..5 {
        assert_eq!(summary(&s.cycle().await), []);
    }
    // One ListVolumeHealth call per cycle, nothing per volume.
    assert_eq!(s.driver.calls(Rpc::ControllerListVolumeHealth), 6);
    assert_eq!(s.driver.calls(Rpc::ControllerGetVolumeHealth), 0);

    // The message changes: one PATCH of that Event.
    s.driver
        .set_volume_health("h-2", degraded("replica 2 and 3 of 3 lost"));
    let seen = s.cycle().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, Method::PATCH);
    assert_eq!(
        seen[0].uri,
        format!("/api/v1/namespaces/shop/events/{name}?")
    );
    assert_eq!(seen[0].body["count"], 2);
    assert_eq!(
        seen[0].body["message"],
        "PV pv-2: Degraded ReplicaLost: replica 2 and 3 of 3 lost"
    );

    // Healthy: the list omits it. One complete cycle is not enough...
    s.driver.set_volume_health("h-2", Vec::new());
    assert_eq!(summary(&s.cycle().await), []);
    // ...the second clears it: a Normal on the PVC.
    let seen = s.cycle().await;
    assert_eq!(
        summary(&seen),
        [(
            "POST".into(),
            "data-2".into(),
            "Normal".into(),
            "ReplicaLostCleared".into()
        )]
    );
    assert_eq!(
        seen[0].body["message"],
        "PV pv-2: Degraded ReplicaLost cleared; it was: replica 2 and 3 of 3 lost"
    );
    assert_eq!(summary(&s.cycle().await), []);
}

#[tokio::test]
async fn a_failed_cycle_clears_nothing() {
    let mut s = setup(DriverMode::Modern, |_| {}, Vec::new(), 500).await;
    s.driver.set_volume_health("h-1", degraded("slow"));
    assert_eq!(summary(&s.cycle().await).len(), 1);
    // The driver stops answering: cycles fail (after the call timeout).
    s.driver.set_mode(DriverMode::Hang);
    s.driver.set_volume_health("h-1", Vec::new());
    for _ in 0..3 {
        assert_eq!(summary(&s.cycle().await), []);
    }
    // Back, and healthy: two complete cycles clear it.
    s.driver.set_mode(DriverMode::Modern);
    assert_eq!(summary(&s.cycle().await), []);
    assert_eq!(
        summary(&s.cycle().await),
        [(
            "POST".into(),
            "data-1".into(),
            "Normal".into(),
            "ReplicaLostCleared".into()
        )]
    );
}

#[tokio::test]
async fn without_a_health_list_each_volume_is_asked_once_per_cycle() {
    let mut s = setup(
        DriverMode::Modern,
        |d| {
            d.set_unimplemented(Rpc::ControllerListVolumeHealth);
            d.set_unimplemented(Rpc::ListVolumes);
        },
        Vec::new(),
        500,
    )
    .await;
    // Two PVs naming one volume: asked once.
    s.cluster.volumes.lock().unwrap().push(MonitoredVolume {
        pv: "pv-1-again".into(),
        handle: "h-1".into(),
        claim: Some(pvc("data-1-again").into()),
    });
    for n in 1..=3 {
        s.driver.set_volume_health(&format!("h-{n}"), Vec::new());
    }
    s.driver.set_volume_health("h-3", degraded("gone bad"));
    let seen = s.cycle().await;
    assert_eq!(
        summary(&seen),
        [(
            "POST".into(),
            "data-3".into(),
            "Warning".into(),
            "ReplicaLost".into()
        )]
    );
    assert_eq!(s.driver.calls(Rpc::ControllerGetVolumeHealth), 3);
    s.cycle().await;
    assert_eq!(s.driver.calls(Rpc::ControllerGetVolumeHealth), 6);
    // The driver advertises no list, so none was ever called.
    assert_eq!(s.driver.calls(Rpc::ControllerListVolumeHealth), 0);
    assert_eq!(s.driver.calls(Rpc::ListVolumes), 0);
    // A Get's empty answer clears at once.
    s.driver.set_volume_health("h-3", Vec::new());
    assert_eq!(
        summary(&s.cycle().await),
        [(
            "POST".into(),
            "data-3".into(),
            "Normal".into(),
            "ReplicaLostCleared".into()
        )]
    );
}

#[tokio::test]
async fn legacy_list_volumes_is_paged_with_max_entries() {
    let mut s = setup(DriverMode::LegacyOnly, |_| {}, Vec::new(), 2).await;
    *s.cluster.volumes.lock().unwrap() = (1..=5).map(volume).collect();
    for n in 1..=5 {
        s.driver.set_volume_health(&format!("h-{n}"), Vec::new());
    }
    s.driver.set_volume_health("h-5", degraded("abnormal"));
    let seen = s.cycle().await;
    assert_eq!(
        summary(&seen),
        [(
            "POST".into(),
            "data-5".into(),
            "Warning".into(),
            "VolumeConditionAbnormal".into()
        )]
    );
    // 5 volumes in pages of 2: three ListVolumes calls, and no
    // ControllerListVolumeHealth, which the driver does not advertise.
    assert_eq!(s.driver.calls(Rpc::ControllerListVolumeHealth), 0);
    assert_eq!(s.driver.calls(Rpc::ListVolumes), 3);
    assert_eq!(s.driver.list_max_entries(), [2, 2, 2]);
    assert_eq!(s.driver.calls(Rpc::ControllerGetVolume), 0);
}

/// A driver advertising no controller health capability is not asked, and
/// nothing is raised or cleared for its volumes.
#[tokio::test]
async fn a_driver_advertising_no_health_is_never_asked() {
    let mut s = setup(
        DriverMode::Modern,
        |d| d.set_controller_capabilities(vec![ControllerCapability::ListVolumes]),
        Vec::new(),
        500,
    )
    .await;
    s.driver.set_volume_health("h-1", degraded("invisible"));
    for _ in 0..2 {
        assert_eq!(summary(&s.cycle().await), []);
    }
    for rpc in [
        Rpc::ControllerListVolumeHealth,
        Rpc::ControllerGetVolumeHealth,
        Rpc::ListVolumes,
        Rpc::ControllerGetVolume,
    ] {
        assert_eq!(s.driver.calls(rpc), 0, "{rpc:?}");
    }
}

/// A list the driver advertises but answers UNIMPLEMENTED fails every
/// cycle: no switch to another RPC, and no recovery of what it raised.
#[tokio::test]
async fn an_advertised_list_answering_unimplemented_never_recovers() {
    let mut s = setup(DriverMode::Modern, |_| {}, Vec::new(), 500).await;
    s.driver.set_volume_health("h-1", degraded("slow"));
    assert_eq!(summary(&s.cycle().await).len(), 1);
    s.driver
        .set_controller_capabilities(s.driver.controller_capabilities());
    s.driver.set_unimplemented(Rpc::ControllerListVolumeHealth);
    s.driver.set_volume_health("h-1", Vec::new());
    for _ in 0..3 {
        assert_eq!(summary(&s.cycle().await), []);
    }
    assert_eq!(s.driver.calls(Rpc::ControllerListVolumeHealth), 4);
    assert_eq!(s.driver.calls(Rpc::ControllerGetVolumeHealth), 0);
    assert_eq!(s.driver.calls(Rpc::ListVolumes), 0);
}

#[tokio::test]
async fn a_pv_deleted_mid_cycle_is_dropped_without_events() {
    let mut s = setup(DriverMode::Modern, |_| {}, Vec::new(), 500).await;
    s.driver.set_volume_health("h-1", degraded("bad"));
    s.driver.set_volume_health("h-2", degraded("bad too"));
    // pv-2 is there when the cycle starts and gone when it ends.
    s.cluster
        .script
        .lock()
        .unwrap()
        .extend([vec![volume(1), volume(2)], vec![volume(1)]]);
    *s.cluster.volumes.lock().unwrap() = vec![volume(1)];
    assert_eq!(
        summary(&s.cycle().await),
        [(
            "POST".into(),
            "data-1".into(),
            "Warning".into(),
            "ReplicaLost".into()
        )]
    );
    assert_eq!(summary(&s.cycle().await), []);

    // pv-1 abnormal and reported, then deleted: no recovery.
    s.cluster.volumes.lock().unwrap().clear();
    assert_eq!(summary(&s.cycle().await), []);
}

#[tokio::test]
async fn a_pv_bound_available_bound_stays_monitored() {
    let mut s = setup(DriverMode::Modern, |_| {}, Vec::new(), 500).await;
    *s.cluster.volumes.lock().unwrap() = vec![volume(1)];
    s.driver.set_volume_health("h-1", degraded("bad"));
    assert_eq!(summary(&s.cycle().await).len(), 1);
    // Released and made Available: no claim.
    s.cluster.volumes.lock().unwrap()[0].claim = None;
    assert_eq!(summary(&s.cycle().await), []);
    // Bound again to the same claim: nothing new to say...
    s.cluster.volumes.lock().unwrap()[0].claim = Some(pvc("data-1").into());
    assert_eq!(summary(&s.cycle().await), []);
    // ...and it is still watched: its recovery is reported.
    s.driver.set_volume_health("h-1", Vec::new());
    s.cycle().await;
    assert_eq!(
        summary(&s.cycle().await),
        [(
            "POST".into(),
            "data-1".into(),
            "Normal".into(),
            "ReplicaLostCleared".into()
        )]
    );
    // Bound to another claim while abnormal: the new claim hears it.
    s.driver.set_volume_health("h-1", degraded("bad again"));
    assert_eq!(summary(&s.cycle().await).len(), 1);
    s.cluster.volumes.lock().unwrap()[0].claim = Some(pvc("other").into());
    assert_eq!(
        summary(&s.cycle().await),
        [(
            "POST".into(),
            "other".into(),
            "Warning".into(),
            "ReplicaLost".into()
        )]
    );
}

fn stamp(secs: u64) -> String {
    k8s_openapi::jiff::Timestamp::from_second(1_800_000_000 + secs as i64)
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn a_takeover_continues_the_previous_leaders_event() {
    let open = json!({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "data-1.abc", "namespace": "shop"},
        "involvedObject": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                           "namespace": "shop", "name": "data-1", "uid": "uid-data-1"},
        "reason": "ReplicaLost",
        "message": "PV pv-1: Degraded ReplicaLost: bad",
        "type": "Warning", "count": 3,
        "firstTimestamp": stamp(0), "lastTimestamp": stamp(60),
        "source": {"component": "volume-health-controller", "host": "ctl-old"},
        "reportingComponent": "volume-health-controller",
        "reportingInstance": "ctl-old"
    });
    let mut s = setup(
        DriverMode::Modern,
        |d| d.set_volume_health("h-1", degraded("bad")),
        vec![open],
        500,
    )
    .await;
    // Still abnormal, same words: the new leader writes nothing.
    assert_eq!(summary(&s.cycle().await), []);
    assert_eq!(summary(&s.cycle().await), []);
    // It changes: the same Event is patched. (Its count is the larger of
    // the earlier leader's and the changes this one saw, as the recorder
    // continues any adopted Event of a condition raised before its last
    // report: here 3, not 4.)
    s.driver.set_volume_health("h-1", degraded("worse"));
    let seen = s.cycle().await;
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, Method::PATCH);
    assert_eq!(seen[0].uri, "/api/v1/namespaces/shop/events/data-1.abc?");
    assert_eq!(seen[0].body["count"], 3);
    assert_eq!(
        seen[0].body["message"],
        "PV pv-1: Degraded ReplicaLost: worse"
    );
}
