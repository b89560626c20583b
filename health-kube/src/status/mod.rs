//! `VolumeHealth` objects: the queryable health of each PVC that has or had
//! a condition (`kubectl get volumehealth -A`), and the PVC label
//! `volume-health.io/health` that follows its worst condition.
//!
//! Each writer owns entries of `status.sources`: a node's agent
//! `Node/<node>` (the kernel, its checks) and `CSIDriver/<node>` (the CSI
//! node service there); controller mode `CSIDriver` (the CSI controller
//! service) and `Controller` (node down). `status.conditions` and the
//! summary columns are the union, recomputed by whoever writes ([`aggregate`]).
//! Where an error travels: a condition change in the agent loop →
//! `health_node::cluster::report::ClusterReporter` → [`entries_for_node`] → [`WritePlan::set`] →
//! [`run`] → [`StatusApi::put`] (server-side apply) → the PVC label.

pub mod aggregate;
pub mod api;
pub mod types;
pub mod write_plan;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::SystemTime;

pub use api::{Put, StatusApi, StatusError};
use health_core::conditions::{Condition, Source};
use kube::api::ListParams;
use kube::Api;
use tokio::time::Instant;
pub use types::{Claim, EntryCondition, EntryKind, SourceEntry, VolumeHealth, HEALTH_LABEL};
pub use write_plan::{Done, Next, SharedWritePlan, WritePlan};

use crate::backoff::REQUEST_TIMEOUT;
use crate::paged_list::{list_pages, PageError};

/// Objects listed per page at start.
const LIST_PAGE: u32 = 500;
/// How long the node agent lets a new or cleared condition settle before
/// its `VolumeHealth` write ([`WritePlan::with_settle`]; docs/benchmarks.md, "Kernel error to Kubernetes Event").
pub const SETTLE: std::time::Duration = std::time::Duration::from_millis(20);
/// Pods named in an entry; `podCount` has them all.
const MAX_PODS: usize = 16;
/// Field managers are at most 128 bytes.
const MAX_MANAGER: usize = 128;

/// The field manager of a node's agent: its own, so that the server keeps
/// each node's entries apart.
pub fn node_manager(node: &str) -> String {
    bounded_manager(&format!("volume-health-agent/{node}"))
}

pub const CONTROLLER_MANAGER: &str = "volume-health-controller";

fn bounded_manager(name: &str) -> String {
    if name.len() <= MAX_MANAGER {
        return name.to_string();
    }
    // A node name may be 253 bytes: keep a prefix and a digest of the rest.
    let hex = crate::node_label::short_digest(name);
    let mut cut = MAX_MANAGER - hex.len() - 1;
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    format!("{}-{hex}", &name[..cut])
}

/// The entry names a node's agent writes.
pub fn node_entry_names(node: &str) -> Vec<String> {
    vec![
        EntryKind::CsiDriver.entry_name(Some(node)),
        EntryKind::Node.entry_name(Some(node)),
    ]
}

/// One pod volume of this node on a claim, as the agent sees it now.
pub struct Member<'a> {
    pub pod: String,
    pub driver: Option<&'a str>,
    pub conditions: Vec<Condition>,
}

/// A node's entries for one claim from its pod volumes there: `Node/<node>`
/// for the kernel and the agent's checks, `CSIDriver/<node>` for what the
/// CSI driver reported; only those asserting something (the board keeps a
/// former one, emptied). One condition per `(status, reason)` across pods:
/// the same device error reaches every pod, so counts are not added up.
pub fn entries_for_node(node: &str, members: &[Member<'_>], now: SystemTime) -> Vec<SourceEntry> {
    let pods: BTreeSet<&str> = members.iter().map(|m| m.pod.as_str()).collect();
    let driver = members.iter().find_map(|m| m.driver).map(String::from);
    let mut by_kind: BTreeMap<
        EntryKind,
        BTreeMap<(health_core::conditions::Status, String), EntryCondition>,
    > = BTreeMap::new();
    for c in members.iter().flat_map(|m| &m.conditions) {
        let kind = match c.source {
            Source::Kernel | Source::Check(_) => EntryKind::Node,
            Source::CsiNode | Source::CsiStorage | Source::CsiController => EntryKind::CsiDriver,
            Source::NodeReady => EntryKind::Controller,
        };
        if kind == EntryKind::Controller {
            continue;
        }
        let new = EntryCondition::from_condition(c);
        let slot = by_kind
            .entry(kind)
            .or_default()
            .entry((c.status, c.reason.clone()));
        match slot {
            std::collections::btree_map::Entry::Vacant(v) => {
                v.insert(new);
            }
            std::collections::btree_map::Entry::Occupied(mut o) => {
                let old = o.get_mut();
                if new.last_seen > old.last_seen {
                    old.message = new.message;
                    old.last_seen = new.last_seen;
                    old.origin = new.origin;
                }
                old.since = old.since.clone().min(new.since);
                old.count = old.count.max(new.count);
            }
        }
    }
    by_kind
        .into_iter()
        .map(|(kind, conditions)| SourceEntry {
            name: kind.entry_name(Some(node)),
            kind,
            node: Some(node.to_string()),
            driver: if kind == EntryKind::CsiDriver {
                driver.clone()
            } else {
                None
            },
            pods: pods.iter().take(MAX_PODS).map(|p| p.to_string()).collect(),
            pod_count: Some(pods.len() as u32),
            update_time: types::time(now),
            conditions: conditions.into_values().collect(),
        })
        .collect()
}

/// Every `VolumeHealth` in the cluster, in pages: read once at start so
/// that a restarted controller continues (and can remove) its entries.
pub async fn list_all(client: &kube::Client) -> Result<Vec<VolumeHealth>, PageError> {
    list_selected(client, None).await
}

/// The `VolumeHealth` objects `selector` selects: a node's own, from the
/// API server's watch cache (`resourceVersion=0`: what the agent wrote
/// before it restarted is there; etcd is not read) in one answer (the
/// cache ignores `limit`); with `None`, all of them, in pages.
pub async fn list_selected(
    client: &kube::Client,
    selector: Option<&str>,
) -> Result<Vec<VolumeHealth>, PageError> {
    let api: Api<VolumeHealth> = Api::all(client.clone());
    let params = match selector {
        Some(selector) => ListParams::default().labels(selector).match_any(),
        None => ListParams::default().limit(LIST_PAGE),
    };
    let mut out = Vec::new();
    list_pages(&api, params, REQUEST_TIMEOUT, |page| out.extend(page)).await?;
    Ok(out)
}

/// The writer task: takes over this writer's entries (a node's agent
/// lists only the objects its label marks), then writes what the board
/// decides, one claim at a time. Runs until dropped.
pub async fn run(api: StatusApi, board: Arc<SharedWritePlan>, client: kube::Client) {
    let started = SystemTime::now();
    let listed = list_selected(&client, api.node_selector()).await;
    adopt_listed(&board, api.owned(), &listed, started);
    write_loop(api, board).await
}

/// Takes over this writer's entries (`owned`) from what [`list_all`] gave.
pub fn adopt_listed(
    board: &SharedWritePlan,
    owned: &[String],
    listed: &Result<Vec<VolumeHealth>, PageError>,
    started: SystemTime,
) {
    match listed {
        Ok(objects) => {
            let adopted = board.lock().adopt(objects, owned, started);
            tracing::info!(
                listed = objects.len(),
                adopted,
                "took over this writer's VolumeHealth entries"
            );
        }
        Err(e) => tracing::error!(
            "could not list VolumeHealth objects ({e}); is the CRD installed (deploy/volumehealth-crd.yaml)? \
             entries written before this process started are not continued"
        ),
    }
}

/// Writes what the board decides, one claim at a time. Runs until dropped.
pub async fn write_loop(api: StatusApi, board: Arc<SharedWritePlan>) {
    loop {
        let next = board.lock().next(Instant::now(), SystemTime::now());
        match next {
            Next::Write(claim, entries) => {
                let done = match api.put(&claim, &entries, SystemTime::now()).await {
                    Ok(put) => {
                        tracing::debug!(claim = %format!("{}/{}", claim.namespace, claim.name), ?put, "VolumeHealth");
                        api.report(&claim, Some(&entries));
                        Done::Written
                    }
                    Err(e) if e.retryable() => {
                        tracing::warn!("VolumeHealth write failed, will retry: {e}");
                        Done::Failed
                    }
                    Err(e) => {
                        tracing::error!(
                            "VolumeHealth write refused (check the RBAC and the CRD): {e}"
                        );
                        api.report(&claim, None);
                        Done::Refused
                    }
                };
                board.lock().finish(&claim, entries, done, Instant::now());
            }
            Next::Idle(at) => {
                let sleep = async {
                    match at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = board.notified() => {}
                    _ = sleep => {}
                }
            }
        }
    }
}
