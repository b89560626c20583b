//! One story across a controller restart (issue 28, item 5), tried as a
//! user would: the project's CSI driver (`csi-loop-driver`) as the
//! controller's driver (a volume is abnormal while its file is gone), the real
//! kube-apiserver under the shipped controller RBAC
//! ([`health_tests::controller`]), a cycle every 2 s. A leader is SIGKILLed
//! in the middle of an episode and a new process takes the Lease over.
//!
//! Watched all along ([`timeline`]): once a recovery Event is there, the
//! `VolumeHealth` object and the PVC label no longer say Degraded; across
//! the restart the object never stops saying Degraded and keeps the
//! episode's start (`status.since`, the condition's `lastTransitionTime`,
//! the entry's `since`: the Warning's `firstTimestamp`); the successor
//! continues the Warning and the recovery Event and signs them. The
//! measured delays are printed.
//!
//! Needs `HEALTH_K8S_ASSETS` (see the harness), the controller binary
//! (`HEALTH_CONTROLLER_BIN` or the release build); the driver is cargo's
//! build ([`loop_driver`]); no root.

#[path = "../controller/loop_driver.rs"]
mod loop_driver;
#[path = "../controller/timeline.rs"]
mod timeline;

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use health_tests::controller::{wait_for, ControllerEnv, ControllerProcess, Replica};
use loop_driver::LoopDriver;
use serde_json::Value;
use timeline::{PvcEvent, Snapshot, Timeline};

const PVC: &str = "data";
const PV: &str = "pv-data";
/// `--monitor-interval`, as the user measured with.
const INTERVAL_SECS: u32 = 2;
const REASON: &str = "VolumeConditionAbnormal";
const CLEARED: &str = "VolumeConditionAbnormalCleared";
/// What the driver says of volume `id` while its file is gone.
fn abnormal(driver: &LoopDriver, id: &str) -> String {
    format!(
        "the volume's backing file {} is gone",
        driver.volume_file(id).display()
    )
}
/// Generous for a busy 2-core machine: a cycle is due every 2 s, and a
/// recovery takes two of them.
const SOON: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_leaders_successor_tells_the_same_story_in_events_object_and_label() {
    let Some(env) = ControllerEnv::start().await else {
        return;
    };
    let dir = tempfile::tempdir().expect("a temporary directory");
    let driver = LoopDriver::start(dir.path()).expect("starting csi-loop-driver");
    let result = story(&env, &driver).await;
    if result.is_err() {
        eprintln!("----- csi-loop-driver -----\n{}", driver.log());
    }
    env.check(result);
}

async fn story(env: &ControllerEnv, driver: &LoopDriver) -> Result<()> {
    let id = driver.create_volume("pvc-data", 1 << 20).await?;
    env.claim(PVC, PV, loop_driver::DRIVER, &id).await?;
    let lease = health_controller::default_lease_name(loop_driver::DRIVER);
    let replica = |name: &str| Replica::new(name, driver.socket()).monitor_interval(INTERVAL_SECS);
    let a = env.controller(replica("ctl-a"))?;
    env.wait_holder(&lease, "ctl-a", SOON).await?;
    cycles(driver, 2).await?;
    let timeline = Timeline::start(env.admin.clone(), PVC).await?;
    let quiet = timeline.wait("a first look", SOON, |_| true).await?;
    ensure!(quiet.events.is_empty(), "Events while healthy: {quiet:#?}");

    // A first episode under ctl-a: its recovery Event is the one the
    // successor continues.
    let (first, warned) = open_episode(driver, &id, &timeline, 1).await?;
    let (told, measured) = close_episode(driver, &id, &timeline, 1).await?;
    measured.print("ctl-a, episode 1", warned);
    let normal = told.of_type("Normal")[0].clone();
    ensure!(
        normal.reason == CLEARED && normal.count == 1 && normal.instance == "ctl-a",
        "{normal:#?}"
    );

    // The second episode: the Warning, the object and the label agree on
    // when it began.
    let (warning, warned) = open_episode(driver, &id, &timeline, 2).await?;
    ensure!(warning.name != first.name, "the same Warning: {warning:#?}");
    let open = timeline
        .wait("the second episode on the object", SOON, |s| {
            s.of_type("Warning").len() == 2
                && s.health() == "Degraded"
                && s.label.as_deref() == Some("Degraded")
        })
        .await?;
    let began = warning.first.clone();
    ensure!(
        episode_start(&open)? == [began.as_str(); 3],
        "{:#?}",
        open.object
    );

    // ctl-a is killed; a new process takes the Lease over and runs a few
    // cycles while the volume stays abnormal.
    cycles(driver, 1).await?;
    let a_log = a.kill()?.log;
    let killed = Instant::now();
    let b = env.controller(replica("ctl-b"))?;
    let started = Instant::now();
    env.wait_holder(&lease, "ctl-b", SOON).await?;
    let held = Instant::now();
    let before = driver.calls("ListVolumes");
    cycles(driver, 3).await?;
    let continued = timeline
        .wait("a look after the takeover", SOON, |_| true)
        .await?;
    eprintln!(
        "takeover: ctl-b holds the Lease {:.2} s after ctl-a was killed; {} cycles of ctl-b since",
        (held - killed).as_secs_f64(),
        driver.calls("ListVolumes") - before
    );
    ensure!(continued.events.len() == 3, "{:#?}", continued.events);
    // In every state since the episode began, across the restart: the
    // same Warning (count 1), the object and the label Degraded, and the
    // object's start of the episode the Warning's.
    for s in timeline.history()?.iter().filter(|s| s.rv >= open.rv) {
        ensure!(
            s.of_type("Warning").len() == 2
                && s.of_type("Warning").contains(&&warning)
                && s.recoveries() == 1,
            "the Events changed: {:#?}",
            s.events
        );
        ensure!(
            s.health() == "Degraded" && s.label.as_deref() == Some("Degraded"),
            "not Degraded at resourceVersion {}: {s:#?}",
            s.rv
        );
        ensure!(
            episode_start(s)? == [began.as_str(); 3],
            "the start moved: {:#?}",
            s.object
        );
    }

    // Recovered under ctl-b: it continues ctl-a's recovery Event and signs it.
    let (told, measured) = close_episode(driver, &id, &timeline, 2).await?;
    measured.print(
        "episode 2, raised under ctl-a and recovered under ctl-b",
        warned,
    );
    eprintln!(
        "ctl-b: the recovery Event written {:.1} s after ctl-b started",
        (told.at - started).as_secs_f64()
    );
    let normal2 = told.of_type("Normal")[0].clone();
    ensure!(
        normal2.name == normal.name
            && normal2.reason == CLEARED
            && normal2.instance == "ctl-b"
            && normal2.message
                == format!(
                    "PV {PV}: Degraded {REASON} cleared; it was: {}",
                    abnormal(driver, &id)
                ),
        "the continued recovery Event: {normal2:#?}"
    );
    // When it is there, the object says so.
    let condition = &told.status("conditions")[0];
    ensure!(
        told.health() == "Healthy"
            && told.label.is_none()
            && condition["status"] == "False"
            && condition["reason"] == CLEARED,
        "{told:#?}"
    );
    every_recovery_told_after_the_object_and_label(&timeline.history()?)?;
    no_errors("ctl-a", &a_log)?;
    no_errors("ctl-b", &stop(b)?)
}

/// The volume's file goes: the `n`th Warning, as the driver words it,
/// then the object and the label. Returns the Warning and how long after
/// the change it was seen.
async fn open_episode(
    driver: &LoopDriver,
    id: &str,
    timeline: &Timeline,
    n: usize,
) -> Result<(PvcEvent, Duration)> {
    driver.break_volume(id)?;
    let broke = Instant::now();
    let warned = timeline
        .wait("the Warning", SOON, |s| s.of_type("Warning").len() == n)
        .await?;
    let warning = warned
        .events
        .iter()
        .filter(|e| e.type_ == "Warning")
        .max_by(|a, b| a.first.cmp(&b.first))
        .context("a Warning")?
        .clone();
    ensure!(
        warning.reason == REASON
            && warning.count == 1
            && warning.message == format!("PV {PV}: Degraded {REASON}: {}", abnormal(driver, id)),
        "{warning:#?}"
    );
    timeline
        .wait("the object and the label Degraded", SOON, |s| {
            s.health() == "Degraded" && s.label.as_deref() == Some("Degraded")
        })
        .await?;
    Ok((warning, warned.at.duration_since(broke)))
}

/// The file comes back: the `n`th recovery told. Returns the state
/// that first told it and what was measured.
async fn close_episode(
    driver: &LoopDriver,
    id: &str,
    timeline: &Timeline,
    n: i32,
) -> Result<(Snapshot, Measured)> {
    driver.restore_volume(id)?;
    let restored = Instant::now();
    let told = timeline
        .wait("the recovery Event", SOON, |s| s.recoveries() == n)
        .await?;
    let measured = measure(timeline, &told, restored).await?;
    Ok((told, measured))
}

/// Delays from a change of the volume to what the user sees.
#[derive(Debug)]
struct Measured {
    /// The file back → the recovery Event seen.
    recovered: Duration,
    /// The recovery Event seen → the object and the label first seen
    /// healthy, in seconds (negative: they were first).
    object_after_event: f64,
    label_after_event: f64,
}

impl Measured {
    fn print(&self, what: &str, warned: Duration) {
        eprintln!(
            "{what}: Warning seen {:.2} s after the volume went abnormal; recovery Event seen {:.2} s after it was healthy again; object healthy {:+.3} s and label gone {:+.3} s from that Event",
            warned.as_secs_f64(),
            self.recovered.as_secs_f64(),
            self.object_after_event,
            self.label_after_event
        );
    }
}

/// When the object and the label were first seen healthy after the
/// volume was restored, relative to the recovery Event's arrival (`told`),
/// in seconds: negative when they came first.
async fn measure(timeline: &Timeline, told: &Snapshot, restored: Instant) -> Result<Measured> {
    let k = told.recoveries();
    let healthy = |s: &Snapshot| s.health() == "Healthy";
    let unlabelled = |s: &Snapshot| s.label.is_none();
    timeline
        .wait("the object healthy and the label gone", SOON, |s| {
            s.recoveries() >= k && healthy(s) && unlabelled(s)
        })
        .await?;
    let history = timeline.history()?;
    let first = |ok: &dyn Fn(&Snapshot) -> bool| -> Result<Instant> {
        history
            .iter()
            .find(|s| s.at >= restored && ok(s))
            .map(|s| s.at)
            .context("never seen")
    };
    let from_event = |at: Instant| match at.checked_duration_since(told.at) {
        Some(after) => after.as_secs_f64(),
        None => -(told.at - at).as_secs_f64(),
    };
    Ok(Measured {
        recovered: told.at.duration_since(restored),
        object_after_event: from_event(first(&healthy)?),
        label_after_event: from_event(first(&unlabelled)?),
    })
}

/// The invariant, over every state the server went through: once as many
/// recoveries are told as there were episodes (Warnings), neither the
/// object nor the label says Degraded.
fn every_recovery_told_after_the_object_and_label(history: &[Snapshot]) -> Result<()> {
    for s in history {
        let episodes = s.of_type("Warning").len() as i32;
        if episodes > 0 && s.recoveries() >= episodes {
            ensure!(
                !s.says_degraded(),
                "the recovery Event was written while the object or the label still said Degraded: {s:#?}"
            );
        }
    }
    Ok(())
}

/// Where the object says when the episode began: `status.since`, the
/// Degraded condition's `lastTransitionTime` (it must be True) and the
/// driver entry's condition `since`.
fn episode_start(s: &Snapshot) -> Result<[&str; 3]> {
    let condition = s
        .status("conditions")
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Degraded"))
        .context("no Degraded condition")?;
    ensure!(condition["status"] == "True", "not True: {condition:#}");
    let entry = &s.status("sources")[0];
    ensure!(
        entry["name"] == "CSIDriver" && entry["driver"] == loop_driver::DRIVER,
        "{entry:#}"
    );
    Ok([
        text(s.status("since")),
        text(&condition["lastTransitionTime"]),
        text(&entry["conditions"][0]["since"]),
    ])
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("")
}

/// Waits until the driver has answered `n` more ListVolumes calls: the
/// leader's cycles, counted where they happen.
async fn cycles(driver: &LoopDriver, n: usize) -> Result<()> {
    let target = driver.calls("ListVolumes") + n;
    wait_for(&format!("{n} more ListVolumes calls"), SOON, || async {
        Ok((driver.calls("ListVolumes") >= target).then_some(()))
    })
    .await
}

/// SIGTERM; the controller exits 0 (giving the Lease up). Returns its log.
fn stop(ctl: ControllerProcess) -> Result<String> {
    let identity = ctl.identity().to_string();
    let exited = ctl.terminate()?;
    ensure!(
        exited.status.success(),
        "controller {identity} exited with {}",
        exited.status
    );
    Ok(exited.log)
}

/// A restart is routine: nothing in it is an ERROR (the 1.26 server's
/// refusal of `pvc.status.healthStatus` included: said once, at info).
fn no_errors(identity: &str, log: &str) -> Result<()> {
    let errors: Vec<&str> = log.lines().filter(|l| l.contains(" ERROR ")).collect();
    ensure!(errors.is_empty(), "{identity} logged {errors:#?}");
    Ok(())
}
