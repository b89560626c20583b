//! `cargo xtask cluster status`: each daemon (running, pid), the API
//! server's /readyz, the node (Ready, schedulable) and the storage part's
//! own components. Non-zero exit when anything is not up.

use anyhow::bail;

use super::{api, daemon, storage, State, DAEMONS};

/// (component, ok, detail) for everything, in start order.
fn components(state: &State) -> Vec<(String, bool, String)> {
    let mut rows: Vec<(String, bool, String)> = DAEMONS
        .iter()
        .map(|name| match daemon::running(state, name) {
            Some(pid) => (name.to_string(), true, format!("running, pid {pid}")),
            None => (name.to_string(), false, "not running".into()),
        })
        .collect();
    let apiserver_up = daemon::running(state, "kube-apiserver").is_some();
    let (ok, detail) = if apiserver_up {
        match api::apiserver_ready(state) {
            Ok(()) => (true, "ok".to_string()),
            Err(e) => (false, e),
        }
    } else {
        (false, "kube-apiserver not running".into())
    };
    rows.push(("apiserver /readyz".into(), ok, detail));
    let (ok, detail) = if ok {
        match api::node_ready(state) {
            Ok(()) => (true, "Ready, schedulable".to_string()),
            Err(e) => (false, e),
        }
    } else {
        (false, "API server not ready".into())
    };
    rows.push((format!("node {}", state.node_name()), ok, detail));
    rows.extend(storage::status(state));
    rows
}

/// Everything up: `up` has nothing to do.
pub(super) fn healthy(state: &State) -> bool {
    state.read_description().ok().flatten().is_some()
        && components(state).iter().all(|(_, ok, _)| *ok)
}

pub(super) fn report(state: &State) -> anyhow::Result<()> {
    // The daemons run as root: another user cannot read their
    // executables in /proc, and every one would show as down.
    super::preflight::require_root()?;
    println!("cluster state directory: {}", state.dir.display());
    let rows = components(state);
    let width = rows
        .iter()
        .map(|(name, _, _)| name.len())
        .max()
        .unwrap_or(0);
    for (name, ok, detail) in &rows {
        let mark = if *ok { "up  " } else { "DOWN" };
        println!("  {mark} {name:width$}  {detail}");
    }
    let down: Vec<&str> = rows
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(name, _, _)| name.as_str())
        .collect();
    if !down.is_empty() {
        bail!("not up: {}", down.join(", "));
    }
    Ok(())
}
