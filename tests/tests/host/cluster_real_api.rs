//! Cluster mode against the real kube-apiserver (`health_tests::envtest`):
//! the real agent binary on the real kernel, authenticated as the
//! ServiceAccount that deploy/ binds to its RBAC, never as admin.
//!
//! The fake API server (cluster.rs) asserts the exact requests the agent
//! makes; this one decides what a cluster would: whether the server accepts
//! the agent's Events and their patches, its field selectors, the PVC label
//! patch and the VolumeHealth applies, and whether deploy/'s RBAC allows each
//! of those calls. The scenario is a rolling update or crash as the
//! DaemonSet runs it: errors on a PVC shared by two pods, the agent killed
//! (SIGKILL) mid-episode, errors while no agent runs (counted by the pinned
//! programs), the agent restarted on the same bpffs, more errors, then the
//! recovery, read back as admin. The server assigns the UIDs, so an Event
//! that keeps its UID across the restart is the same object, patched. The
//! same restart without pinned state, with the exact requests, is
//! `cluster.rs`'s `a_restart_mid_episode_continues_the_same_events`.
//!
//! The PVC's story is watched all along ([`timeline`], shared with
//! controller_restart.rs): the object and its label say Degraded from the
//! first write to the recovery without a gap across the restart, keep the
//! episode's start, and once the recovery Event on the PVC exists neither
//! says Degraded any more (issue 28, item 5).
//!
//! Needs root (fails without it) and the API server's binaries
//! (`HEALTH_K8S_ASSETS`; a missing server fails under `CI=true`).

// controller_restart.rs reads all of it; this test only the history.
#[allow(dead_code)]
#[path = "../controller/timeline.rs"]
mod timeline;

use std::time::Duration;

use anyhow::{ensure, Result};
use health_node::cluster::API_ACCESS;
use health_tests::agent::Agent;
use health_tests::bpffs::Bpffs;
use health_tests::envtest::Options;
use health_tests::kubelet::{free_port, wait_ready, CsiVolume};
use health_tests::real_cluster::{
    agent_args, check_requests, identities, Cluster, AGENT_NS, AGENT_SA, APP_NS, DRIVER, PV,
};
use health_tests::{require_env, shared_kernel};
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use serde_json::{json, Value};
use timeline::{Snapshot, Timeline};

#[test]
fn a_restart_mid_episode_continues_the_same_events_on_a_real_api_server() -> Result<()> {
    require_env(&[])?;
    let _kernel = shared_kernel();
    let Some(server) = Options::new().service_account(AGENT_NS, AGENT_SA).require() else {
        return Ok(());
    };
    let cluster = Cluster::prepare(server, API_ACCESS)?;
    let [web_0, web_1] = cluster.workload()?;
    let timeline = cluster.block_on(Timeline::start(cluster.admin.clone(), "data"))?;
    let root = tempfile::Builder::new().prefix("kubelet-").tempdir()?;
    let volume = CsiVolume::publish(root.path(), PV, DRIVER, "node-1", &[&web_0, &web_1])?;
    let dev = volume.device_name();
    let metrics = free_port()?;
    let bpffs = Bpffs::mount()?;
    // A quiet window that outlasts the restart: the episode is still open
    // when the new process starts.
    let args = agent_args(&cluster, root.path(), metrics, &bpffs, "12")?;
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    let agent = Agent::start_cluster(&args)?;
    wait_ready(metrics)?;
    volume.fail_writes(5)?;
    let before = cluster.wait_counts("BlockIOErrors", 5, Duration::from_secs(15))?;
    for e in &before {
        assert_eq!(
            (&e["type"], &e["source"]["host"], &e["reportingInstance"]),
            (&json!("Warning"), &json!("node-1"), &json!("node-1")),
            "{e:#}"
        );
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.contains(&format!(
                "Degraded BlockIOErrors: 5 block I/O errors (write, EIO) on {dev} "
            )),
            "{m}"
        );
    }
    // The server's UIDs of the pods, as the agent found them through
    // kubelet's directories.
    assert_eq!(before[0]["involvedObject"]["uid"], web_0.as_str());
    assert_eq!(before[1]["involvedObject"]["uid"], web_1.as_str());
    let ids = identities(&before);
    let degraded = |vh: &Value, count: u64| {
        let c = &vh["status"]["sources"][0]["conditions"][0];
        vh["status"]["health"] == "Degraded"
            && vh["status"]["sources"].as_array().map(Vec::len) == Some(1)
            && vh["status"]["sources"][0]["name"] == "Node/node-1"
            && c["reason"] == "BlockIOErrors"
            && c["count"] == count
    };
    cluster.wait_volume_health("Degraded x5", |vh| degraded(vh, 5))?;
    cluster.wait_labels(&["app=shop", "volume-health.io/health=Degraded"])?;
    let first = check_requests(metrics)?;

    // SIGKILL: no final flush, no clean detach; the pinned programs go on
    // counting while no agent runs.
    drop(agent);
    volume.fail_writes(2)?;
    let agent = Agent::start_cluster(&args)?;
    wait_ready(metrics)?;
    volume.fail_writes(3)?;
    // The same three objects (same UIDs: patched, not created again), and
    // the count is the episode's: the 5 reported before, then the 2 of the
    // gap and the 3 after, which the new process reports (it starts from
    // what the earlier one reported, kept pinned), each once.
    let after = cluster.wait_counts("BlockIOErrors", 10, Duration::from_secs(20))?;
    assert_eq!(identities(&after), ids);
    for e in &after {
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.contains(&format!(
                ": Degraded BlockIOErrors: 5 block I/O errors (write, EIO) on {dev} "
            )) && m.ends_with(" (and 5 reported before the agent restarted)"),
            "{m}"
        );
    }
    cluster.wait_volume_health("Degraded x10", |vh| degraded(vh, 10))?;

    // The episode ends in the new process: one recovery on each object,
    // the union Healthy, the label gone and the PVC's own label kept.
    let cleared = cluster.wait_counts("BlockIOErrorsCleared", 1, Duration::from_secs(30))?;
    for e in &cleared {
        assert_eq!(e["type"], "Normal", "{e:#}");
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.contains("Degraded BlockIOErrors cleared; it was: 5 block I/O errors")
                && m.ends_with(" (and 5 reported before the agent restarted)"),
            "{m}"
        );
    }
    let vh = cluster.wait_volume_health("Healthy", |vh| vh["status"]["health"] == "Healthy")?;
    assert_eq!(
        vh["status"]["sources"][0]["conditions"],
        json!([]),
        "{vh:#}"
    );
    cluster.wait_labels(&["app=shop"])?;
    // The three watches are separate streams, each in the server's order:
    // once each has brought its last change, the history is whole.
    cluster.block_on(timeline.wait(
        "the recovery Event, a Healthy object and no label",
        Duration::from_secs(10),
        |s| {
            s.events.iter().any(|e| e.reason == "BlockIOErrorsCleared")
                && s.health() == "Healthy"
                && s.label.is_none()
        },
    ))?;
    one_story(&timeline.history()?)?;
    let second = check_requests(metrics)?;
    eprintln!("the first process's requests: {first:#?}\nthe second's: {second:#?}");

    // Nothing else: six Events in all, none on the other node's pod.
    let all = cluster.events()?;
    assert_eq!(all.len(), 6, "{:#}", Value::Array(all.clone()));
    assert_eq!(
        identities(&cluster.wait_counts("BlockIOErrors", 10, Duration::ZERO)?),
        ids
    );
    let pods = Api::<Pod>::namespaced(cluster.admin.clone(), APP_NS);
    let far = cluster.block_on(pods.get("far-away"))?;
    assert!(all
        .iter()
        .all(|e| e["involvedObject"]["uid"] != json!(far.metadata.uid)));
    agent.stop_cleanly()?;
    Ok(())
}

/// The PVC's history, in the server's order, tells one story: from the
/// first state in which the object and the label both say Degraded, each
/// says Degraded, then not, exactly once (no flap across the restart), the
/// object keeping the episode's start (`status.since`); the recovery Event
/// comes into it only after both stopped saying Degraded, and the last
/// state is the Warning with the episode's count, its recovery, a Healthy
/// object and no label.
fn one_story(history: &[Snapshot]) -> Result<()> {
    let dump = || format!("{history:#?}");
    let cleared = |s: &Snapshot| s.events.iter().any(|e| e.reason == "BlockIOErrorsCleared");
    let Some(start) = history
        .iter()
        .position(|s| s.health() == "Degraded" && s.label.as_deref() == Some("Degraded"))
    else {
        anyhow::bail!(
            "the object and the label never both said Degraded: {}",
            dump()
        );
    };
    ensure!(
        !history[..start].iter().any(cleared),
        "a recovery Event before the episode: {}",
        dump()
    );
    let episode = &history[start..];
    let told = episode
        .iter()
        .position(cleared)
        .ok_or_else(|| anyhow::anyhow!("no recovery Event on the PVC: {}", dump()))?;
    // Released by the write, not by the agent's 10 s limit on waiting for
    // a failing status writer (which would let it go out regardless).
    let settled = episode[..told]
        .iter()
        .position(|s| s.health() == "Healthy" && s.label.is_none())
        .ok_or_else(|| anyhow::anyhow!("the recovery came first: {}", dump()))?;
    let waited = episode[told].at.duration_since(episode[settled].at);
    ensure!(
        waited < Duration::from_secs(5),
        "the recovery Event came {waited:?} after the object and the label: {}",
        dump()
    );
    for s in &episode[told..] {
        ensure!(
            s.health() == "Healthy" && s.label.is_none(),
            "the recovery Event on the PVC exists while the object or the label still says otherwise (rv {}): {s:#?}",
            s.rv
        );
    }
    let mut healths: Vec<&str> = episode.iter().map(Snapshot::health).collect();
    healths.dedup();
    ensure!(
        healths == ["Degraded", "Healthy"],
        "the object's health went {healths:?}: {}",
        dump()
    );
    let mut labels: Vec<Option<&str>> = episode.iter().map(|s| s.label.as_deref()).collect();
    labels.dedup();
    ensure!(
        labels == [Some("Degraded"), None],
        "the label went {labels:?}: {}",
        dump()
    );
    let mut since: Vec<&Value> = episode
        .iter()
        .filter(|s| s.health() == "Degraded")
        .map(|s| s.status("since"))
        .collect();
    since.dedup();
    ensure!(
        since.len() == 1 && since[0].is_string(),
        "the object's status.since moved during the episode: {since:?}"
    );
    let last = episode.last().map(|s| {
        // Sorted: the history keeps the Events in the order of their names.
        let mut events: Vec<(&str, &str, i32)> = s
            .events
            .iter()
            .map(|e| (e.type_.as_str(), e.reason.as_str(), e.count))
            .collect();
        events.sort();
        (events, s.health(), s.label.clone())
    });
    ensure!(
        last == Some((
            vec![
                ("Normal", "BlockIOErrorsCleared", 1),
                ("Warning", "BlockIOErrors", 10)
            ],
            "Healthy",
            None
        )),
        "the PVC's story ends as {last:?}"
    );
    Ok(())
}
