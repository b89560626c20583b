//! Honest request metrics (issue 29, item 4): the node agent's
//! `volume_health_api_requests_total` and the controller's
//! `volume_health_controller_api_requests_total` say exactly what the real
//! kube-apiserver's audit log says their user did, by verb, resource and
//! code: every list page, watch, get, apply, patch and create.
//!
//! Each test starts a server (`health_tests::envtest`) whose audit policy
//! logs the component's ServiceAccount only (`health_tests::audit`), runs
//! the real binary under deploy/'s RBAC through its start and one error
//! episode, and compares the two after each, exactly. Open watches are in
//! the log from their `ResponseStarted` entry, which is when the client
//! counts them (at the response head), so nothing needs to stop first.
//!
//! The agent's test needs root (a faulty disk under a kubelet volume, the
//! kernel programs) and both need the API server's binaries
//! (`HEALTH_K8S_ASSETS`; missing ones fail under `CI=true`).

// The controller scenarios' helpers; this test uses a few.
#[allow(dead_code)]
#[path = "../controller/support.rs"]
mod support;

use std::time::Duration;

use anyhow::{ensure, Result};
use health_csi::testing::{DriverMode, Rpc};
use health_node::cluster::API_ACCESS;
use health_tests::agent::Agent;
use health_tests::audit::{describe, metric_requests, AuditLog, Requests};
use health_tests::bpffs::Bpffs;
use health_tests::controller::{wait_for, ControllerEnv, Replica, CONTROLLER_SA, CSI_NS};
use health_tests::envtest::{service_account_user, Options};
use health_tests::kubelet::{free_port, http_get, wait_ready, CsiVolume};
use health_tests::real_cluster::{agent_args, Cluster, AGENT_NS, AGENT_SA, DRIVER, PV};
use health_tests::{require_env, shared_kernel};
use support::{cycles, degraded, driver, events_when, lease, of_type, stop, PVC, SOON};

/// How long the count and the log may take to agree: a request counted
/// is logged within milliseconds; this is for a busy 2-core machine.
const AGREE_WITHIN: Duration = Duration::from_secs(20);

/// A server started with `audit`'s policy and log.
fn audited(audit: &AuditLog, options: Options) -> Options {
    audit
        .apiserver_args()
        .iter()
        .fold(options, |o, arg| o.apiserver_arg(arg))
}

/// The `family` samples `/metrics` on `addr` shows now.
fn scrape(addr: std::net::SocketAddr, family: &str) -> Result<Requests> {
    let (code, text) = http_get(addr, "/metrics")?;
    ensure!(code == 200, "/metrics answered {code}: {text}");
    metric_requests(&text, family)
}

/// `(verb, resource, code)` keys, for what a run must contain.
fn has(requests: &Requests, want: &[(&str, &str, &str)]) -> Result<()> {
    let missing: Vec<_> = want
        .iter()
        .filter(|(v, r, c)| !requests.contains_key(&(v.to_string(), r.to_string(), c.to_string())))
        .collect();
    ensure!(
        missing.is_empty(),
        "no {missing:?} among {}",
        describe(requests)
    );
    Ok(())
}

#[test]
fn the_agents_request_metric_is_its_audit_log_through_a_start_and_an_error_episode() -> Result<()> {
    require_env(&[])?;
    let _kernel = shared_kernel();
    let audit = AuditLog::new(&service_account_user(AGENT_NS, AGENT_SA))?;
    let options = audited(&audit, Options::new().service_account(AGENT_NS, AGENT_SA));
    let Some(server) = options.require() else {
        return Ok(());
    };
    let cluster = Cluster::prepare(server, API_ACCESS)?;
    let [web_0, web_1] = cluster.workload()?;
    let root = tempfile::Builder::new().prefix("kubelet-").tempdir()?;
    let volume = CsiVolume::publish(root.path(), PV, DRIVER, "node-1", &[&web_0, &web_1])?;
    let metrics = free_port()?;
    let bpffs = Bpffs::mount()?;
    // A short quiet window: the episode ends within the test.
    let args = agent_args(&cluster, root.path(), metrics, &bpffs, "3")?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let family = "volume_health_api_requests_total";

    let agent = Agent::start_cluster(&args)?;
    let result = (|| -> Result<(Requests, Requests)> {
        wait_ready(metrics)?;
        let start = audit.agreed(AGREE_WITHIN, || scrape(metrics, family))?;
        // The pod reflector's list and watch; no Event is read back (the
        // agent continues from its copy on the node).
        has(&start, &[("list", "pods", "200"), ("watch", "pods", "200")])?;
        ensure!(
            !start
                .keys()
                .any(|(verb, resource, _)| verb == "list" && resource == "events"),
            "the agent listed Events at start: {}",
            describe(&start)
        );

        volume.fail_writes(5)?;
        cluster.wait_counts("BlockIOErrors", 5, Duration::from_secs(15))?;
        cluster.wait_volume_health("Degraded", |vh| vh["status"]["health"] == "Degraded")?;
        cluster.wait_labels(&["app=shop", "volume-health.io/health=Degraded"])?;
        cluster.wait_counts("BlockIOErrorsCleared", 1, Duration::from_secs(30))?;
        cluster.wait_volume_health("Healthy", |vh| vh["status"]["health"] == "Healthy")?;
        cluster.wait_labels(&["app=shop"])?;
        let episode = audit.agreed(AGREE_WITHIN, || scrape(metrics, family))?;
        // The Warnings and recoveries on both pods and the PVC, the
        // VolumeHealth entry and the PVC's label.
        has(
            &episode,
            &[
                ("create", "events", "201"),
                ("patch", "volumehealths/status", "200"),
                ("patch", "persistentvolumeclaims", "200"),
            ],
        )?;
        Ok((start, episode))
    })();
    let run = agent.stop_cleanly();
    let (start, episode) = match (result, run) {
        (Ok(counts), Ok(_)) => counts,
        (Err(e), run) => {
            let log = run.map(|r| r.stderr).unwrap_or_else(|e| format!("{e:#}"));
            return Err(e.context(format!("the agent's log:\n{log}")));
        }
        (Ok(_), Err(e)) => return Err(e.context("stopping the agent")),
    };
    eprintln!(
        "the agent's requests, as counted and as logged:\nat start: {}\nafter the episode: {}",
        describe(&start),
        describe(&episode)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controllers_request_metric_is_its_audit_log_through_a_start_and_an_error_episode() {
    let audit =
        AuditLog::new(&service_account_user(CSI_NS, CONTROLLER_SA)).expect("the audit policy");
    let Some(env) = ControllerEnv::start_with(audited(&audit, Options::new())).await else {
        return;
    };
    let result = controller_episode(&env, &audit).await;
    env.check(result);
}

async fn controller_episode(env: &ControllerEnv, audit: &AuditLog) -> Result<()> {
    let (_dir, driver) = driver(DriverMode::Modern).await?;
    env.claim("data-1", "pv-1", support::DRIVER, "h-1").await?;
    driver.set_volume_health("h-1", Vec::new());
    let metrics = free_port()?;
    // A long Lease: renewals (every 2/3 of it) are rare enough for the
    // comparison to find the count still; they are counted all the same.
    let replica = Replica::new("ctl-a", driver.socket_path())
        .lease_duration(30)
        .metrics_addr(metrics);
    let ctl = env.controller(replica)?;
    env.wait_holder(&lease(), "ctl-a", SOON).await?;
    cycles(&driver, Rpc::ControllerListVolumeHealth, 2).await?;
    let family = "volume_health_controller_api_requests_total";
    let agree =
        || tokio::task::block_in_place(|| audit.agreed(AGREE_WITHIN, || scrape(metrics, family)));
    let start = agree()?;
    // The Lease taken, the PV and Node reflectors, the takeover's lists.
    has(
        &start,
        &[
            ("list", "persistentvolumes", "200"),
            ("watch", "persistentvolumes", "200"),
            ("list", "nodes", "200"),
            ("watch", "nodes", "200"),
            ("list", "volumehealths", "200"),
            ("list", "events", "200"),
        ],
    )?;

    driver.set_volume_health("h-1", degraded("replica 2 of 3 lost"));
    events_when(env, PVC, "data-1", "the Warning", |e| {
        of_type(e, "Warning").len() == 1
    })
    .await?;
    driver.set_volume_health("h-1", Vec::new());
    events_when(env, PVC, "data-1", "the recovery", |e| {
        of_type(e, "Normal").len() == 1
    })
    .await?;
    wait_for("a Healthy VolumeHealth for data-1", SOON, || async {
        let health = env.volume_health("data-1").await?;
        Ok(health.filter(|h| h["status"]["health"] == "Healthy"))
    })
    .await?;
    let episode = agree()?;
    has(
        &episode,
        &[
            ("create", "events", "201"),
            ("patch", "volumehealths/status", "200"),
        ],
    )?;
    stop(ctl)?;
    eprintln!(
        "the controller's requests, as counted and as logged:\nat start: {}\nafter the episode: {}",
        describe(&start),
        describe(&episode)
    );
    Ok(())
}
