//! The controller's part of each claim's `VolumeHealth` (see
//! [`health_kube::status`]): the entry `CSIDriver` (what the driver's
//! controller service asserts about the claim's PV) and the entry
//! `Controller` (the claim's pods are on a node down past the grace). Only
//! the leader writes; a new leader lists the objects and continues them.
//!
//! Where the API server has `pvc.status.healthStatus` (Kubernetes 1.37,
//! alpha behind `CSIVolumeHealth`), the union of each of this driver's
//! claims' objects is also written there ([`upstream`]).

pub mod upstream;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use health_core::conditions::Condition;
use health_kube::events::ObjectRef;
use health_kube::observer::Observer;
use health_kube::paged_list::PageError;
use health_kube::status::{
    self, Claim, EntryKind, SharedWritePlan, SourceEntry, StatusApi, WritePlan, CONTROLLER_MANAGER,
};
use kube::Client;
use upstream::follow::Follower;

use super::claim_index::{claim_of, ClaimIndex};
use super::inventory::MonitoredVolume;

/// The entries the controller writes.
pub fn entry_names() -> Vec<String> {
    vec![
        EntryKind::Controller.entry_name(None),
        EntryKind::CsiDriver.entry_name(None),
    ]
}

/// The leader's status writing: the board and its writer task (aborted
/// when the leadership ends), and the upstream field's follower.
pub struct StatusWriter {
    board: Arc<SharedWritePlan>,
    task: tokio::task::JoinHandle<()>,
    driver: String,
    upstream: Follower,
    listed: Option<Result<Vec<status::VolumeHealth>, PageError>>,
    /// This driver's bound claims, rebuilt when the PV list changes.
    claims: Arc<ClaimIndex>,
}

impl Drop for StatusWriter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StatusWriter {
    /// Lists the `VolumeHealth` objects once (the leader's takeover: its
    /// own entries are adopted here, the rest is kept for
    /// [`StatusWriter::take_listed`]), then starts the writer task.
    pub async fn start(
        client: Client,
        driver: &str,
        update_interval: std::time::Duration,
        metrics: Arc<crate::metrics::ControllerMetrics>,
    ) -> Self {
        let observer: Arc<dyn Observer> = metrics.clone();
        // Controller conditions end on evidence, never by time after a takeover.
        let mut board = WritePlan::new(update_interval, std::time::Duration::ZERO);
        board.set_ready();
        let board = SharedWritePlan::new(board);
        let api = StatusApi::new(
            client.clone(),
            CONTROLLER_MANAGER.to_string(),
            entry_names(),
            Some(Arc::clone(&observer)),
        );
        let started = std::time::SystemTime::now();
        let listed = status::list_all(&client).await;
        status::adopt_listed(&board, api.owned(), &listed, started);
        let task = tokio::spawn(status::write_loop(api, Arc::clone(&board)));
        StatusWriter {
            board,
            task,
            driver: driver.to_string(),
            upstream: Follower::start(client, Some(metrics)),
            listed: Some(listed),
            claims: Arc::default(),
        }
    }

    /// The objects listed at start, once (the worker seeds its PV states
    /// from them: one list per takeover, not one per user).
    pub fn take_listed(&mut self) -> Option<Result<Vec<status::VolumeHealth>, PageError>> {
        self.listed.take()
    }

    /// Hands the board the controller's entries for every claim that has
    /// (or had) one, from the PVs' conditions and the down nodes', and
    /// tells the `healthStatus` follower which claims are this driver's.
    pub async fn sync(
        &mut self,
        pvs: Vec<(ObjectRef, String, Vec<Condition>)>,
        down: Vec<(ObjectRef, Condition)>,
        volumes: &Arc<Vec<MonitoredVolume>>,
        now: SystemTime,
    ) {
        if !self.claims.is_of(volumes) {
            self.claims = Arc::new(ClaimIndex::new(Arc::clone(volumes)));
        }
        let claims = &self.claims;
        let mut by_claim: BTreeMap<Claim, (Vec<Condition>, Vec<Condition>)> = BTreeMap::new();
        for (claim, pv, conditions) in pvs {
            if let Some(c) = claim_of(&claim, Some(pv)) {
                by_claim.entry(c).or_default().0.extend(conditions);
            }
        }
        for (claim, condition) in down {
            let pv = claims
                .volume(&claim.namespace, &claim.name)
                .filter(|v| v.claim.as_deref() == Some(&claim))
                .map(|v| v.pv.to_string());
            if let Some(c) = claim_of(&claim, pv) {
                by_claim.entry(c).or_default().1.push(condition);
            }
        }
        {
            let mut board = self.board.lock();
            let is_bound = |c: &Claim| claims.contains(&c.namespace, &c.name);
            // Claims the board had entries for and that are still bound
            // keep them (emptied); the others are released.
            for claim in board.claims() {
                if !by_claim.contains_key(&claim) && is_bound(&claim) {
                    board.set(&claim, Vec::new());
                }
            }
            for (claim, (driver, controller)) in &by_claim {
                let entries = vec![
                    entry(EntryKind::Controller, None, controller, now),
                    entry(EntryKind::CsiDriver, Some(&self.driver), driver, now),
                ]
                .into_iter()
                .filter(|e| !e.conditions.is_empty())
                .collect();
                board.set(claim, entries);
            }
            let keep: Vec<Claim> = board
                .claims()
                .into_iter()
                .filter(|c| is_bound(c) || by_claim.contains_key(c))
                .collect();
            board.release_others(&keep);
        }
        self.board.wake();
        self.upstream.set_claims(&self.claims);
    }
}

fn entry(
    kind: EntryKind,
    driver: Option<&str>,
    conditions: &[Condition],
    now: SystemTime,
) -> SourceEntry {
    let mut out: Vec<status::EntryCondition> = conditions
        .iter()
        .map(status::EntryCondition::from_condition)
        .collect();
    out.sort_by(|a, b| (a.status, &a.reason).cmp(&(b.status, &b.reason)));
    out.dedup_by(|a, b| a.status == b.status && a.reason == b.reason);
    SourceEntry {
        name: kind.entry_name(None),
        kind,
        node: None,
        driver: driver.map(String::from),
        pods: Vec::new(),
        pod_count: None,
        update_time: status::types::time(now),
        conditions: out,
    }
}
