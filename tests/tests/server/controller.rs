//! `health-controller` end to end (issue 11): the real binary, as the
//! ServiceAccount that deploy/controller/rbac binds, against a real CSI
//! controller service (health-csi's test driver over a unix socket) and a real
//! kube-apiserver (`health_tests::envtest`), each test on its own server.
//!
//! Every scenario asserts the exact Event objects on the PVCs and Pods (how
//! many per object and reason, their type, count, message and reporting
//! component and instance), and ends by stopping the controllers with SIGTERM
//! and checking that the Lease was given up. A failure prints the
//! controllers' logs.
//!
//! Needs `HEALTH_K8S_ASSETS` (see the harness) and the debug or release
//! binary in `HEALTH_AGENT_BIN`; no root, no BPF.

// Not tests/support.rs: Cargo would build that as a test of its own.
#[path = "../controller/support.rs"]
mod support;

use std::time::{Duration, Instant, SystemTime};

use anyhow::{ensure, Result};
use health_csi::testing::{DriverMode, Rpc};
use health_tests::controller::{
    key, rfc3339, tally, wait_for, whole_seconds_now, ControllerEnv, Replica,
};
use health_tests::envtest::Options;
use support::{
    cycles, degraded, driver, ensure_released, events_when, just_after_a_cycle, lease, of_type,
    sleep_until, stop, Episode, DRIVER, LEASE_DURATION, PVC, SOON,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_warning_per_abnormal_pvc_patched_in_place_and_one_normal_on_recovery() {
    let Some(env) = ControllerEnv::start().await else {
        return;
    };
    // This 1.37 server runs without the CSIVolumeHealth gate: it accepts
    // pvc.status.healthStatus and drops it (apiserver_status.rs covers the
    // gate on).
    let result = modern_episode(
        &env,
        "drops pvc.status.healthStatus (feature gate CSIVolumeHealth off)",
    )
    .await;
    env.check(result);
}

/// The same on the oldest API server the README claims (1.26), which has
/// no `pvc.status.healthStatus` at all: the PV store, the claim index and
/// the condition machines of unhealthy PVs only, against that server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_oldest_api_server_one_warning_per_abnormal_pvc_and_one_normal_on_recovery() {
    let Some(env) = ControllerEnv::start_with(Options::new().oldest()).await else {
        return;
    };
    let result = modern_episode(
        &env,
        "this API server has no pvc.status.healthStatus (it came with Kubernetes 1.37)",
    )
    .await;
    env.check(result);
}

/// One episode on one of two PVs; `field_said` is how the controller tells,
/// once, that the server keeps no `pvc.status.healthStatus`.
async fn modern_episode(env: &ControllerEnv, field_said: &str) -> Result<()> {
    let (_dir, driver) = driver(DriverMode::Modern).await?;
    env.claim("data-1", "pv-1", DRIVER, "h-1").await?;
    env.claim("data-2", "pv-2", DRIVER, "h-2").await?;
    driver.set_volume_health("h-1", Vec::new());
    driver.set_volume_health("h-2", Vec::new());
    let ctl = env.controller(Replica::new("ctl-a", driver.socket_path()))?;
    env.wait_holder(&lease(), "ctl-a", SOON).await?;
    cycles(&driver, Rpc::ControllerListVolumeHealth, 2).await?;
    let quiet = env.events().await?;
    ensure!(quiet.is_empty(), "Events while all is healthy: {quiet:#?}");

    Episode {
        driver: &driver,
        pvc: "data-1",
        pv: "pv-1",
        handle: "h-1",
        reason: "ReplicaLost",
        cycle_rpc: Rpc::ControllerListVolumeHealth,
        per_cycle: 1,
        leader: "ctl-a",
    }
    .run(env)
    .await?;

    let all = tally(&env.events().await?);
    let want = [
        (key(PVC, "data-1", "Normal", "ReplicaLostCleared"), 1),
        (key(PVC, "data-1", "Warning", "ReplicaLost"), 1),
    ];
    ensure!(all == want.into(), "Events in the namespace: {all:#?}");
    // Health came from one list per cycle, never per volume.
    ensure!(
        driver.calls(Rpc::ControllerGetVolumeHealth) == 0,
        "Get calls: {}",
        driver.calls(Rpc::ControllerGetVolumeHealth)
    );
    let log = stop(ctl)?;
    // Learnt from the first write, said once.
    let said = log
        .lines()
        .filter(|l| l.contains(" INFO ") && l.contains(field_said))
        .count();
    ensure!(said == 1, "the dropped field said {said} times:\n{log}");
    ensure_released(env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_missing_from_the_list_clears_after_two_cycles_and_a_hung_driver_never() {
    let Some(env) = ControllerEnv::start().await else {
        return;
    };
    let result = two_cycle_clearing(&env).await;
    env.check(result);
}

async fn two_cycle_clearing(env: &ControllerEnv) -> Result<()> {
    const LIST: Rpc = Rpc::ControllerListVolumeHealth;
    let (_dir, driver) = driver(DriverMode::Modern).await?;
    env.claim("data-1", "pv-1", DRIVER, "h-1").await?;
    driver.set_volume_health("h-1", degraded("replica 2 of 3 lost"));
    let ctl = env.controller(Replica::new("ctl-a", driver.socket_path()))?;
    env.wait_holder(&lease(), "ctl-a", SOON).await?;
    events_when(env, PVC, "data-1", "the first Warning", |e| e.len() == 1).await?;

    // The list stops naming the volume (a page of another volume only).
    let set_at = just_after_a_cycle(&driver, LIST).await?;
    driver.set_list_pages(vec![vec!["h-9".to_string()]]);
    // One complete cycle without it: not a recovery yet.
    cycles(&driver, LIST, 1).await?;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let after_one = env.events_about(PVC, "data-1").await?;
    ensure!(
        driver.calls(LIST) == set_at + 1,
        "a second cycle ran before the check ({} calls): cannot tell one cycle from two",
        driver.calls(LIST) - set_at
    );
    ensure!(
        of_type(&after_one, "Normal").is_empty(),
        "cleared after one cycle: {after_one:#?}"
    );
    // The second complete cycle clears it.
    let done = events_when(env, PVC, "data-1", "the Normal", |e| {
        !of_type(e, "Normal").is_empty()
    })
    .await?;
    ensure!(
        driver.calls(LIST) >= set_at + 2,
        "cleared after {} cycles",
        driver.calls(LIST) - set_at
    );
    let normal = of_type(&done, "Normal")[0].clone();
    ensure!(
        normal.reason == "ReplicaLostCleared" && normal.count == 1,
        "{normal:#?}"
    );

    // A second episode; then the driver hangs while the volume is healthy
    // again: failed cycles are no evidence, so no recovery however long.
    driver.set_list_pages(vec![vec!["h-9".to_string(), "h-1".to_string()]]);
    driver.set_volume_health("h-1", degraded("replica 3 of 3 lost"));
    events_when(env, PVC, "data-1", "a second Warning", |e| {
        of_type(e, "Warning").len() == 2
    })
    .await?;
    driver.set_mode(DriverMode::Hang);
    driver.set_volume_health("h-1", Vec::new());
    let before = env.events_about(PVC, "data-1").await?;
    cycles(&driver, LIST, 4).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let hung = env.events_about(PVC, "data-1").await?;
    ensure!(hung == before, "written while the driver hung: {hung:#?}");
    let log = env.logs();
    ensure!(
        log.contains("listing volume health failed"),
        "the failed cycles were not logged"
    );

    // It answers again: the recovery is told (the Normal series goes on).
    driver.set_mode(DriverMode::Modern);
    let back = events_when(env, PVC, "data-1", "the second recovery", |e| {
        e.iter().any(|e| e.type_ == "Normal" && e.count == 2)
    })
    .await?;
    let all = tally(&back);
    let want = [
        (key(PVC, "data-1", "Normal", "ReplicaLostCleared"), 1),
        (key(PVC, "data-1", "Warning", "ReplicaLost"), 2),
    ];
    ensure!(all == want.into(), "{back:#?}");
    for e in &back {
        e.check_origin(&["ctl-a"])?;
    }
    stop(ctl)?;
    ensure_released(env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_down_past_the_grace_makes_its_pods_volumes_inaccessible_until_ready() {
    let Some(env) = ControllerEnv::start().await else {
        return;
    };
    let result = node_down(&env).await;
    env.check(result);
}

async fn node_down(env: &ControllerEnv) -> Result<()> {
    let (_dir, driver) = driver(DriverMode::Modern).await?;
    env.node("node-1").await?;
    env.claim("data-1", "pv-1", DRIVER, "h-1").await?;
    env.claim("other-1", "pv-o", "other.csi.example", "h-o")
        .await?;
    driver.set_volume_health("h-1", Vec::new());
    env.pod("web-0", "node-1", &["data-1"]).await?;
    env.pod("app-0", "node-1", &["other-1"]).await?;
    let ctl = env.controller(Replica::new("ctl-a", driver.socket_path()))?;
    env.wait_holder(&lease(), "ctl-a", SOON).await?;
    cycles(&driver, Rpc::ControllerListVolumeHealth, 2).await?;

    let since = whole_seconds_now();
    env.set_ready("node-1", false, since).await?;
    // One second in, half the grace: nothing yet.
    sleep_until(since + Duration::from_secs(1)).await;
    let early = env.events().await?;
    ensure!(early.is_empty(), "Events before the grace: {early:#?}");

    let down = wait_for("the NodeNotReady Warnings", SOON, || async {
        let events = env.events().await?;
        Ok((events.len() >= 2).then_some(events))
    })
    .await?;
    let seen_at = SystemTime::now();
    ensure!(
        seen_at >= since + Duration::from_secs(2),
        "reported {:?} after the node went down, before the 2 s grace",
        seen_at.duration_since(since).unwrap_or_default()
    );
    let condition = format!(
        "node node-1 NotReady since {} (KubeletNotReady)",
        rfc3339(since)
    );
    for (kind, object) in [("Pod", "web-0"), (PVC, "data-1")] {
        let on = env.events_about(kind, object).await?;
        ensure!(on.len() == 1, "{kind} {object}: {on:#?}");
        let w = &on[0];
        ensure!(
            w.type_ == "Warning"
                && w.reason == "NodeNotReady"
                && w.count == 1
                && w.message == format!("node node-1: Inaccessible NodeNotReady: {condition}"),
            "{kind} {object}: {w:#?}"
        );
        w.check_origin(&["ctl-a"])?;
    }
    // The claim's VolumeHealth: the controller's entry, Inaccessible, and the
    // label. The label is written after the object's status (it follows the
    // union), so both are awaited together.
    let vh = wait_for("the Controller entry and the label", SOON, || async {
        let vh = env
            .volume_health("data-1")
            .await?
            .filter(|o| o["status"]["health"] == "Inaccessible");
        let label = env.health_label("data-1").await?;
        Ok(vh.filter(|_| label.as_deref() == Some("Inaccessible")))
    })
    .await?;
    ensure!(
        vh["status"]["sources"].as_array().map(Vec::len) == Some(1)
            && vh["status"]["sources"][0]["name"] == "Controller"
            && vh["status"]["sources"][0]["conditions"][0]["reason"] == "NodeNotReady"
            && vh["status"]["sources"][0]["conditions"][0]["origin"] == "node-ready"
            && vh["status"]["sources"][0]["conditions"][0]["message"] == condition.as_str(),
        "{vh:#}"
    );
    ensure!(
        env.volume_health("other-1").await?.is_none(),
        "another driver's claim"
    );
    // Still down for two more node checks: nothing more is written.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let still = env.events().await?;
    ensure!(
        still == down,
        "written while the node stayed down: {still:#?}"
    );

    env.set_ready("node-1", true, whole_seconds_now()).await?;
    let back = wait_for("the NodeNotReadyCleared Normals", SOON, || async {
        let events = env.events().await?;
        Ok((of_type(&events, "Normal").len() >= 2).then_some(events))
    })
    .await?;
    for e in of_type(&back, "Normal") {
        let cleared =
            format!("node node-1: Inaccessible NodeNotReady cleared; it was: {condition}");
        ensure!(e.count == 1 && e.message == cleared, "{e:#?}");
        e.check_origin(&["ctl-a"])?;
    }
    let all = tally(&back);
    let want = [
        (key("Pod", "web-0", "Normal", "NodeNotReadyCleared"), 1),
        (key("Pod", "web-0", "Warning", "NodeNotReady"), 1),
        (key(PVC, "data-1", "Normal", "NodeNotReadyCleared"), 1),
        (key(PVC, "data-1", "Warning", "NodeNotReady"), 1),
    ];
    // Nothing on app-0 or other-1: their volume is another driver's.
    ensure!(all == want.into(), "{back:#?}");
    wait_for(
        "the VolumeHealth back to Healthy, the label gone",
        SOON,
        || async {
            let vh = env.volume_health("data-1").await?;
            let healthy = vh
                .as_ref()
                .is_some_and(|o| o["status"]["health"] == "Healthy");
            Ok((healthy && env.health_label("data-1").await?.is_none()).then_some(()))
        },
    )
    .await?;
    stop(ctl)?;
    ensure_released(env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_takes_over_from_a_killed_leader_and_continues_its_events() {
    let Some(env) = ControllerEnv::start().await else {
        return;
    };
    let result = takeover(&env).await;
    env.check(result);
}

async fn takeover(env: &ControllerEnv) -> Result<()> {
    const LIST: Rpc = Rpc::ControllerListVolumeHealth;
    let (_dir, driver) = driver(DriverMode::Modern).await?;
    env.claim("data-1", "pv-1", DRIVER, "h-1").await?;
    driver.set_volume_health("h-1", Vec::new());
    let a = env.controller(Replica::new("ctl-a", driver.socket_path()))?;
    let b = env.controller(Replica::new("ctl-b", driver.socket_path()))?;
    let holder = wait_for("a replica to hold the Lease", SOON, || async {
        env.lease_holder(&lease()).await
    })
    .await?;
    let (leader, standby) = if holder == "ctl-a" { (a, b) } else { (b, a) };
    ensure!(leader.identity() == holder, "held by {holder}");
    let (leader_id, standby_id) = (
        leader.identity().to_string(),
        standby.identity().to_string(),
    );
    cycles(&driver, LIST, 2).await?;

    driver.set_volume_health("h-1", degraded("replica 2 of 3 lost"));
    let first = events_when(env, PVC, "data-1", "the Warning", |e| !e.is_empty()).await?;
    ensure!(first.len() == 1, "{first:#?}");
    let warning = first[0].clone();
    warning.check_origin(&[&leader_id])?;
    ensure!(warning.count == 1, "{warning:#?}");
    // The standby writes nothing while standing by.
    cycles(&driver, LIST, 2).await?;
    let all = env.events().await?;
    ensure!(all == first, "Events besides the leader's one: {all:#?}");
    ensure!(
        !standby.log().contains("acquired the lease"),
        "the standby led meanwhile"
    );

    let killed = Instant::now();
    leader.kill()?;
    env.wait_holder(&lease(), &standby_id, SOON).await?;
    let took = killed.elapsed();
    eprintln!(
        "takeover: {standby_id} holds the Lease {:.2} s after {leader_id} was killed (Lease duration {} s)",
        took.as_secs_f64(),
        LEASE_DURATION.as_secs()
    );
    ensure!(
        took <= 2 * LEASE_DURATION,
        "takeover took {took:?}, over twice the Lease duration"
    );
    // The new leader's first cycles continue the open Warning: no write.
    cycles(&driver, LIST, 2).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let continued = env.events().await?;
    ensure!(continued == first, "the takeover wrote: {continued:#?}");

    // The message changes: the new leader patches that same object.
    let second = "replicas 2 and 3 of 3 lost";
    driver.set_volume_health("h-1", degraded(second));
    let patched = events_when(env, PVC, "data-1", "the Warning patched", |e| {
        e.iter().any(|e| e.message.ends_with(second))
    })
    .await?;
    ensure!(patched.len() == 1, "a second object: {patched:#?}");
    let p = &patched[0];
    ensure!(
        p.name == warning.name
            && p.count == 2
            && p.message == format!("PV pv-1: Degraded ReplicaLost: {second}"),
        "{p:#?}"
    );
    p.check_origin(&[&leader_id, &standby_id])?;

    driver.set_volume_health("h-1", Vec::new());
    let done = events_when(env, PVC, "data-1", "the Normal", |e| {
        !of_type(e, "Normal").is_empty()
    })
    .await?;
    cycles(&driver, LIST, 2).await?;
    let all = env.events().await?;
    let want = [
        (key(PVC, "data-1", "Normal", "ReplicaLostCleared"), 1),
        (key(PVC, "data-1", "Warning", "ReplicaLost"), 1),
    ];
    ensure!(tally(&all) == want.into(), "{all:#?}");
    let normal = of_type(&done, "Normal")[0];
    ensure!(normal.count == 1, "{normal:#?}");
    normal.check_origin(&[&standby_id])?;
    stop(standby)?;
    ensure_released(env).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_legacy_driver_is_walked_in_pages_and_reported_like_a_modern_one() {
    let Some(env) = ControllerEnv::start().await else {
        return;
    };
    let result = legacy(&env).await;
    env.check(result);
}

async fn legacy(env: &ControllerEnv) -> Result<()> {
    let (_dir, driver) = driver(DriverMode::LegacyOnly).await?;
    for n in 1..=5 {
        let (pvc, pv, handle) = (format!("data-{n}"), format!("pv-{n}"), format!("h-{n}"));
        env.claim(&pvc, &pv, DRIVER, &handle).await?;
        driver.set_volume_health(&handle, Vec::new());
    }
    let replica = Replica::new("ctl-a", driver.socket_path()).list_page_size(2);
    let ctl = env.controller(replica)?;
    env.wait_holder(&lease(), "ctl-a", SOON).await?;
    // Five volumes in pages of two: three ListVolumes calls a cycle.
    cycles(&driver, Rpc::ListVolumes, 6).await?;
    let quiet = env.events().await?;
    ensure!(quiet.is_empty(), "Events while all is healthy: {quiet:#?}");

    Episode {
        driver: &driver,
        pvc: "data-3",
        pv: "pv-3",
        handle: "h-3",
        reason: health_csi::LEGACY_ABNORMAL_REASON,
        cycle_rpc: Rpc::ListVolumes,
        per_cycle: 3,
        leader: "ctl-a",
    }
    .run(env)
    .await?;

    let all = tally(&env.events().await?);
    let want = [
        (
            key(PVC, "data-3", "Normal", "VolumeConditionAbnormalCleared"),
            1,
        ),
        (key(PVC, "data-3", "Warning", "VolumeConditionAbnormal"), 1),
    ];
    ensure!(all == want.into(), "Events in the namespace: {all:#?}");
    stop(ctl)?;
    let sizes = driver.list_max_entries();
    ensure!(
        !sizes.is_empty() && sizes.iter().all(|n| *n == 2),
        "max_entries of the list calls: {sizes:?}"
    );
    ensure!(
        sizes.len() as u64 == driver.calls(Rpc::ListVolumes),
        "{} list calls recorded, {} ListVolumes calls",
        sizes.len(),
        driver.calls(Rpc::ListVolumes)
    );
    ensure!(
        driver.calls(Rpc::ControllerGetVolume) == 0,
        "per-volume Gets: {}",
        driver.calls(Rpc::ControllerGetVolume)
    );
    ensure_released(env).await
}
