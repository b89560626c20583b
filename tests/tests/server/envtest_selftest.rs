//! The real API server harness (`health_tests::envtest`) against itself: it starts,
//! its identities authenticate as who they claim, the authorizers decide as on a
//! real cluster, and nothing is left running after drop.
//!
//! No root and no BPF; needs `HEALTH_K8S_ASSETS` (see the harness's docs).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use health_tests::envtest::{runtime, skip_missing, EnvtestError, Options};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

/// Pids of processes whose command line mentions `dir` (the server's data dir is
/// in every flag list): what would be left behind.
fn processes_using(dir: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        if String::from_utf8_lossy(&cmdline).contains(dir) {
            found.push(pid);
        }
    }
    found
}

#[test]
fn admin_lists_namespaces_and_a_node_may_not_read_secrets() -> Result<()> {
    let Some(server) = Options::new().service_account("team", "reader").require() else {
        return Ok(());
    };
    eprintln!(
        "envtest: kube-apiserver ready in {:.2} s at {}",
        server.startup_time().as_secs_f64(),
        server.url()
    );
    let dir: PathBuf = server.dir().to_path_buf();
    let dir_text = dir.to_string_lossy().into_owned();
    ensure!(
        processes_using(&dir_text).len() == 2,
        "etcd and kube-apiserver should be running: {:?}",
        processes_using(&dir_text)
    );
    let rt = runtime()?;

    rt.block_on(async {
        let admin = server.client(server.admin()).await?;
        // The server's bootstrap controller creates `default` shortly after
        // /readyz answers ok (seen missing once in CI): wait for it, bounded.
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        let names = loop {
            let names: Vec<String> = Api::<Namespace>::all(admin.clone())
                .list(&ListParams::default())
                .await
                .context("admin lists namespaces")?
                .items
                .into_iter()
                .filter_map(|n| n.metadata.name)
                .collect();
            let missing: Vec<&str> = ["default", "kube-system"]
                .into_iter()
                .filter(|w| !names.iter().any(|n| n == w))
                .collect();
            if missing.is_empty() {
                break names;
            }
            ensure!(
                tokio::time::Instant::now() < deadline,
                "namespaces {names:?} lack {missing:?} 10 s after the server was ready"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        };

        let node = server.node("node-1").context("node-1 has a token")?;
        let as_node = server.client(node).await?;
        match Api::<Secret>::all(as_node.clone()).list(&ListParams::default()).await {
            Err(kube::Error::Api(s)) if s.code == 403 && s.reason == "Forbidden" => {
                ensure!(
                    s.message.contains("User \"system:node:node-1\" cannot list resource \"secrets\""),
                    "403 for someone else? {}",
                    s.message
                );
            }
            other => bail!("node-1 listing secrets: {other:?}"),
        }

        // A ServiceAccount token is that user in that ServiceAccount's groups: a
        // binding to the group `system:serviceaccounts:team` lets it list.
        let sa = server
            .service_account("team", "reader")
            .context("the ServiceAccount has a token")?;
        let as_sa = Api::<Namespace>::all(server.client(sa).await?);
        match as_sa.list(&ListParams::default()).await {
            Err(kube::Error::Api(s)) if s.code == 403 => ensure!(
                s.message.starts_with(
                    "namespaces is forbidden: User \"system:serviceaccount:team:reader\" cannot list"
                ),
                "{}",
                s.message
            ),
            other => bail!("ServiceAccount listing namespaces before any binding: {other:?}"),
        }
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": "team-views"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view-namespaces"},
            "subjects": [{"kind": "Group", "name": "system:serviceaccounts:team"}],
        }))?;
        let role: ClusterRole = serde_json::from_value(json!({
            "metadata": {"name": "view-namespaces"},
            "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list"]}],
        }))?;
        Api::<ClusterRole>::all(admin.clone())
            .create(&PostParams::default(), &role)
            .await?;
        Api::<ClusterRoleBinding>::all(admin)
            .create(&PostParams::default(), &binding)
            .await?;
        // RBAC reads bindings from an informer: allowed within moments, not at once.
        let mut listed = None;
        for _ in 0..50 {
            if let Ok(list) = as_sa.list(&ListParams::default()).await {
                listed = Some(list.items.len());
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        ensure!(
            listed == Some(names.len()),
            "ServiceAccount listed {listed:?} namespaces after the group binding, admin {}",
            names.len()
        );
        anyhow::Ok(())
    })?;

    drop(server);
    let left = processes_using(&dir_text);
    ensure!(left.is_empty(), "processes left after drop: {left:?}");
    ensure!(!dir.exists(), "{} not removed", dir.display());
    Ok(())
}

#[test]
fn a_bad_flag_fails_with_the_apiserver_log_not_a_skip() -> Result<()> {
    match Options::new().apiserver_arg("--no-such-flag").start() {
        Ok(_) => bail!("kube-apiserver started with an unknown flag"),
        Err(EnvtestError::MissingAssets(why)) => skip_missing(&why),
        Err(EnvtestError::Failed(e)) => {
            let text = format!("{e:#}");
            ensure!(
                text.contains("kube-apiserver exited")
                    && text.contains("unknown flag: --no-such-flag"),
                "error does not say why: {text}"
            );
        }
    }
    Ok(())
}

#[test]
fn missing_assets_are_named_and_not_a_failure_to_start() {
    let empty = tempfile::tempdir().unwrap();
    match Options::new().assets(empty.path()).start() {
        Err(EnvtestError::MissingAssets(why)) => assert_eq!(
            why,
            format!(
                "{} holds no kube-apiserver (set HEALTH_K8S_ASSETS to a directory that does).",
                empty.path().display()
            )
        ),
        Err(other) => panic!("start with an empty assets dir: {other:?}"),
        Ok(_) => panic!("started without binaries"),
    }
}
