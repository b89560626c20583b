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
//! Needs root (fails without it) and the API server's binaries
//! (`HEALTH_K8S_ASSETS`; a missing server fails under `CI=true`).

use std::time::Duration;

use anyhow::Result;
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

#[test]
fn a_restart_mid_episode_continues_the_same_events_on_a_real_api_server() -> Result<()> {
    require_env(&[])?;
    let _kernel = shared_kernel();
    let Some(server) = Options::new().service_account(AGENT_NS, AGENT_SA).require() else {
        return Ok(());
    };
    let cluster = Cluster::prepare(server, API_ACCESS)?;
    let [web_0, web_1] = cluster.workload()?;
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
