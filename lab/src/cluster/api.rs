//! What `up` and `status` ask the API server, as the admin: whether it is
//! ready, and whether the node is usable (Ready, schedulable, untainted,
//! and the `default` ServiceAccount there for pods to run as).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use xtask::util::say;

use super::daemon::log_tail;
use super::{daemon, State};

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting a tokio runtime")
}

async fn client(state: &State) -> anyhow::Result<Client> {
    let path = state.kubeconfig();
    let kubeconfig =
        Kubeconfig::read_from(&path).with_context(|| format!("reading {}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("a kube config from {}", path.display()))?;
    Client::try_from(config).context("building a kube client")
}

/// The body of `/readyz` ("ok"), or why there is none.
async fn readyz(client: &Client) -> Result<String, String> {
    let request = http::Request::get("/readyz")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(3), client.request_text(request)).await {
        Ok(Ok(body)) => Ok(body.trim().to_string()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".into()),
    }
}

pub(super) fn wait_apiserver_ready(state: &State, within: Duration) -> anyhow::Result<()> {
    let rt = runtime()?;
    rt.block_on(async {
        let client = client(state).await?;
        let deadline = Instant::now() + within;
        loop {
            let answer = readyz(&client).await;
            if answer.as_deref() == Ok("ok") {
                return Ok(());
            }
            if daemon::running(state, "kube-apiserver").is_none() {
                bail!(
                    "kube-apiserver exited while starting; {}",
                    log_tail(state, "kube-apiserver")
                );
            }
            if Instant::now() >= deadline {
                bail!(
                    "kube-apiserver not ready after {} s (/readyz: {answer:?}); {}",
                    within.as_secs(),
                    log_tail(state, "kube-apiserver")
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
}

/// `/readyz` for `status`.
pub(super) fn apiserver_ready(state: &State) -> Result<(), String> {
    let rt = runtime().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = client(state).await.map_err(|e| format!("{e:#}"))?;
        match readyz(&client).await? {
            ok if ok == "ok" => Ok(()),
            other => Err(other),
        }
    })
}

/// Why the node cannot take pods yet, or None when it can.
fn node_problem(node: &Node) -> Option<String> {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
    match ready {
        Some(c) if c.status == "True" => {}
        Some(c) => {
            return Some(format!(
                "not Ready ({}: {})",
                c.reason.as_deref().unwrap_or("no reason"),
                c.message.as_deref().unwrap_or("")
            ))
        }
        None => return Some("no Ready condition yet".into()),
    }
    let spec = node.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        return Some("unschedulable (cordoned)".into());
    }
    let taints: Vec<String> = spec
        .and_then(|s| s.taints.as_ref())
        .map(|t| {
            t.iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .map(|t| format!("{}:{}", t.key, t.effect))
                .collect()
        })
        .unwrap_or_default();
    if !taints.is_empty() {
        return Some(format!("tainted {}", taints.join(", ")));
    }
    None
}

/// Node Ready, schedulable and untainted; for `status`.
pub(super) fn node_ready(state: &State) -> Result<(), String> {
    let rt = runtime().map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client = client(state).await.map_err(|e| format!("{e:#}"))?;
        let nodes: Api<Node> = Api::all(client);
        let node = tokio::time::timeout(Duration::from_secs(3), nodes.get(state.node_name()))
            .await
            .map_err(|_| "timed out".to_string())?
            .map_err(|e| e.to_string())?;
        node_problem(&node).map_or(Ok(()), Err)
    })
}

/// Waits until the node takes pods and the `default` ServiceAccount of
/// the `default` namespace exists (the controller-manager makes it).
pub(super) fn wait_node_usable(state: &State) -> anyhow::Result<()> {
    let within = Duration::from_secs(120);
    let started = Instant::now();
    let rt = runtime()?;
    rt.block_on(async {
        let client = client(state).await?;
        let nodes: Api<Node> = Api::all(client.clone());
        let accounts: Api<ServiceAccount> = Api::namespaced(client, "default");
        let deadline = started + within;
        let mut last: String;
        loop {
            match nodes.get_opt(state.node_name()).await {
                Ok(Some(node)) => match node_problem(&node) {
                    None => match accounts.get_opt("default").await {
                        Ok(Some(_)) => break,
                        Ok(None) => last = "no default ServiceAccount yet".into(),
                        Err(e) => last = e.to_string(),
                    },
                    Some(problem) => last = problem,
                },
                Ok(None) => last = "not registered yet".into(),
                Err(e) => last = e.to_string(),
            }
            for name in ["kubelet", "kube-controller-manager"] {
                if daemon::running(state, name).is_none() {
                    bail!("{name} exited; {}", log_tail(state, name));
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {} not usable after {} s: {last}; {}",
                    state.node_name(),
                    within.as_secs(),
                    log_tail(state, "kubelet")
                );
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        say(format!(
            "node {} Ready and schedulable after {:.1} s",
            state.node_name(),
            started.elapsed().as_secs_f64()
        ));
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(json: serde_json::Value) -> Node {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn a_node_is_usable_only_ready_schedulable_and_untainted() {
        let ready = serde_json::json!({"type": "Ready", "status": "True"});
        assert_eq!(
            node_problem(&node(
                serde_json::json!({"status": {"conditions": [ready]}})
            )),
            None
        );
        assert_eq!(
            node_problem(&node(serde_json::json!({
                "status": {"conditions": [{"type": "Ready", "status": "False",
                    "reason": "KubeletNotReady", "message": "cni not ready"}]}}))),
            Some("not Ready (KubeletNotReady: cni not ready)".into())
        );
        assert_eq!(
            node_problem(&node(serde_json::json!({
                "spec": {"taints": [
                    {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                    {"key": "x", "effect": "PreferNoSchedule"}]},
                "status": {"conditions": [ready]}}))),
            Some("tainted node.kubernetes.io/not-ready:NoSchedule".into())
        );
        assert_eq!(
            node_problem(&node(serde_json::json!({
                "spec": {"unschedulable": true}, "status": {"conditions": [ready]}}))),
            Some("unschedulable (cordoned)".into())
        );
        assert_eq!(
            node_problem(&node(serde_json::json!({}))),
            Some("no Ready condition yet".into())
        );
    }
}
