//! What the controller scenarios share: the test driver and its cycle
//! counts, waiting for Events, stopping replicas, and [`Episode`], one
//! volume's abnormal episode from first Warning to recovery.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{ensure, Context, Result};
use health_csi::testing::{
    DriverMode, Rpc, TestDriver, TestDriverHandle, DEFAULT_TEST_DRIVER_NAME,
};
use health_csi::{HealthEntry, HealthStatus};
use health_tests::controller::{wait_for, ControllerEnv, ControllerProcess, EventView};

pub const DRIVER: &str = DEFAULT_TEST_DRIVER_NAME;
pub const PVC: &str = "PersistentVolumeClaim";
/// The Lease duration every replica is given (`Replica::new`).
pub const LEASE_DURATION: Duration = Duration::from_secs(3);
/// Generous for a busy 2-core machine: a cycle is due every second.
pub const SOON: Duration = Duration::from_secs(20);

pub fn lease() -> String {
    health_controller::default_lease_name(DRIVER)
}

pub fn degraded(message: &str) -> Vec<HealthEntry> {
    vec![HealthEntry::new(
        HealthStatus::Degraded,
        "ReplicaLost",
        message,
    )]
}

/// The test driver on a socket of its own.
pub async fn driver(mode: DriverMode) -> Result<(tempfile::TempDir, TestDriverHandle)> {
    let dir = tempfile::tempdir()?;
    let driver = TestDriver::start(dir.path(), mode)
        .await
        .context("starting the test CSI driver")?;
    Ok((dir, driver))
}

/// Waits until the driver has answered `n` more `rpc` calls than now: the
/// leader's cycles, counted where they happen rather than guessed from time.
pub async fn cycles(driver: &TestDriverHandle, rpc: Rpc, n: u64) -> Result<u64> {
    let target = driver.calls(rpc) + n;
    wait_for(
        &format!("{n} more {rpc:?} calls"),
        SOON + Duration::from_secs(3 * n),
        || async { Ok((driver.calls(rpc) >= target).then_some(driver.calls(rpc))) },
    )
    .await
}

/// Returns right after the driver saw a new `rpc` call: the next cycle is
/// then a whole interval (1 s) away, so what the test changes now is what
/// that next cycle sees.
pub async fn just_after_a_cycle(driver: &TestDriverHandle, rpc: Rpc) -> Result<u64> {
    let before = driver.calls(rpc);
    let deadline = Instant::now() + SOON;
    loop {
        let now = driver.calls(rpc);
        if now > before {
            return Ok(now);
        }
        ensure!(Instant::now() < deadline, "no {rpc:?} call within {SOON:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The Events about one object once `ready` holds for them.
pub async fn events_when(
    env: &ControllerEnv,
    kind: &str,
    name: &str,
    what: &str,
    ready: impl Fn(&[EventView]) -> bool,
) -> Result<Vec<EventView>> {
    wait_for(what, SOON, || async {
        let events = env.events_about(kind, name).await?;
        Ok(ready(&events).then_some(events))
    })
    .await
}

pub fn of_type<'a>(events: &'a [EventView], type_: &str) -> Vec<&'a EventView> {
    events.iter().filter(|e| e.type_ == type_).collect()
}

/// SIGTERM; the controller exits 0. Returns its log.
pub fn stop(ctl: ControllerProcess) -> Result<String> {
    let identity = ctl.identity().to_string();
    let exited = ctl.terminate()?;
    ensure!(
        exited.status.success(),
        "controller {identity} exited with {} after SIGTERM",
        exited.status
    );
    // The 1.26 server refuses pvc.status.healthStatus with a 500: an
    // expected answer, said once at info level, never an ERROR line.
    let alarms: Vec<&str> = exited
        .log
        .lines()
        .filter(|l| {
            l.contains("ERROR") && (l.contains("healthStatus") || l.contains("failed with status"))
        })
        .collect();
    ensure!(
        alarms.is_empty(),
        "controller {identity} logged {alarms:#?}"
    );
    Ok(exited.log)
}

/// After the last replica stopped: nobody holds the Lease.
pub async fn ensure_released(env: &ControllerEnv) -> Result<()> {
    let holder = env.lease_holder(&lease()).await?;
    ensure!(holder.is_none(), "the Lease is still held by {holder:?}");
    Ok(())
}

/// One volume's whole episode, with `leader` writing: exactly one Warning
/// on its PVC, left alone while the volume stays abnormal, patched in place
/// when the driver's message changes, and one Normal `<reason>Cleared` on
/// recovery. `cycle_rpc` is the call one cycle makes (`per_cycle` times).
pub struct Episode<'a> {
    pub driver: &'a TestDriverHandle,
    pub pvc: &'a str,
    pub pv: &'a str,
    pub handle: &'a str,
    pub reason: &'a str,
    pub cycle_rpc: Rpc,
    pub per_cycle: u64,
    pub leader: &'a str,
}

impl Episode<'_> {
    fn message(&self, text: &str) -> String {
        format!("PV {}: Degraded {}: {text}", self.pv, self.reason)
    }

    pub async fn run(&self, env: &ControllerEnv) -> Result<()> {
        let first = "replica 2 of 3 lost";
        self.driver.set_volume_health(self.handle, degraded(first));
        let seen = events_when(env, PVC, self.pvc, "a Warning on the PVC", |e| {
            !e.is_empty()
        })
        .await?;
        ensure!(seen.len() == 1, "one Event expected: {seen:#?}");
        let warning = &seen[0];
        ensure!(
            warning.type_ == "Warning"
                && warning.reason == self.reason
                && warning.count == 1
                && warning.message == self.message(first),
            "the Warning: {warning:#?}"
        );
        warning.check_origin(&[self.leader])?;
        ensure!(
            warning.uid == env.claim_uid(self.pvc).await?,
            "not about the PVC's uid: {warning:#?}"
        );
        // The claim's VolumeHealth: the driver's entry, the union, the label.
        let vh = wait_for("the VolumeHealth entry", SOON, || async {
            Ok(env
                .volume_health(self.pvc)
                .await?
                .filter(|o| o["status"]["health"] == "Degraded"))
        })
        .await?;
        let sources = &vh["status"]["sources"];
        ensure!(
            sources.as_array().map(Vec::len) == Some(1)
                && sources[0]["name"] == "CSIDriver"
                && sources[0]["driver"] == DRIVER
                && sources[0]["conditions"][0]["reason"] == self.reason
                && sources[0]["conditions"][0]["origin"] == "csi-controller"
                && vh["status"]["reason"] == self.reason,
            "the VolumeHealth: {vh:#}"
        );
        ensure!(
            vh["metadata"]["ownerReferences"][0]["uid"] == env.claim_uid(self.pvc).await?.as_str(),
            "not owned by the PVC: {vh:#}"
        );
        // The label is a write of its own on the PVC, after the object's.
        wait_for("the label Degraded", SOON, || async {
            Ok((env.health_label(self.pvc).await?.as_deref() == Some("Degraded")).then_some(()))
        })
        .await?;

        // Abnormal for three more cycles: not one write (same object, same
        // resourceVersion).
        cycles(self.driver, self.cycle_rpc, 3 * self.per_cycle).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let still = env.events_about(PVC, self.pvc).await?;
        ensure!(still == seen, "written while nothing changed: {still:#?}");

        // The driver words it differently: that same object is patched.
        let second = "replicas 2 and 3 of 3 lost";
        self.driver.set_volume_health(self.handle, degraded(second));
        let patched = events_when(env, PVC, self.pvc, "the Warning patched", |e| {
            e.iter().any(|e| e.message == self.message(second))
        })
        .await?;
        ensure!(patched.len() == 1, "a second object: {patched:#?}");
        let p = &patched[0];
        ensure!(
            p.name == warning.name && p.type_ == "Warning" && p.count == 2,
            "the patched Warning: {p:#?}"
        );

        // Recovered: one Normal.
        self.driver.set_volume_health(self.handle, Vec::new());
        let cleared = format!("{}Cleared", self.reason);
        let done = events_when(env, PVC, self.pvc, "a Normal on recovery", |e| {
            !of_type(e, "Normal").is_empty()
        })
        .await?;
        let normal = of_type(&done, "Normal")[0].clone();
        let vh = wait_for("the VolumeHealth recovered", SOON, || async {
            Ok(env
                .volume_health(self.pvc)
                .await?
                .filter(|o| o["status"]["health"] == "Healthy"))
        })
        .await?;
        ensure!(
            vh["status"]["conditions"][0]["status"] == "False"
                && vh["status"]["conditions"][0]["reason"] == cleared.as_str()
                && vh["status"]["sources"][0]["conditions"]
                    .as_array()
                    .is_none_or(Vec::is_empty),
            "the VolumeHealth after recovery: {vh:#}"
        );
        let label = wait_for("the label removed", SOON, || async {
            Ok(env.health_label(self.pvc).await?.is_none().then_some(()))
        })
        .await;
        label?;
        ensure!(
            normal.reason == cleared
                && normal.count == 1
                && normal.message
                    == format!(
                        "PV {}: Degraded {} cleared; it was: {second}",
                        self.pv, self.reason
                    ),
            "the Normal: {normal:#?}"
        );
        normal.check_origin(&[self.leader])?;
        // And nothing after it.
        cycles(self.driver, self.cycle_rpc, 2 * self.per_cycle).await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let last = env.events_about(PVC, self.pvc).await?;
        ensure!(last.len() == 2, "after the recovery: {last:#?}");
        ensure!(
            last.contains(&normal) && last.iter().any(|e| e.name == warning.name),
            "written after the recovery: {last:#?}"
        );
        Ok(())
    }
}

pub async fn sleep_until(t: SystemTime) {
    if let Ok(left) = t.duration_since(SystemTime::now()) {
        tokio::time::sleep(left).await;
    }
}
