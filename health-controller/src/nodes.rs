//! Node-down: a node NotReady (Ready=False) or unreachable (Ready=Unknown,
//! or the `node.kubernetes.io/unreachable` taint) for longer than
//! `--node-grace` makes its pods' volumes of this driver `Inaccessible`
//! (`NodeNotReady`) on each such PVC and pod; Ready again gives the Normal
//! `NodeNotReadyCleared`.
//!
//! The down time comes from the node itself (the Ready condition's
//! lastTransitionTime, the taint's timeAdded), so a replica that takes over
//! leadership knows how long a node has been down. The node's pods are
//! listed once, when the grace has passed (`fieldSelector=spec.nodeName`,
//! paged): there is no pod watch. A failed list is retried on the next
//! evaluation, and reports nothing meanwhile.
//!
//! A node deleted while down ends its Warnings silently, without a
//! recovery Event: its pods are gone or rescheduled, and nothing about
//! their volumes recovered.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime};

use health_core::conditions::{rfc3339, Change, Condition, Source, Status};
use health_kube::events::{ObjectKind, ObjectRef, Recorder};
use health_kube::paged_list::{list_pages, PageError};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt as _};

use super::inventory::{MonitoredVolume, NodeState, Readiness};

pub const NODE_NOT_READY: &str = "NodeNotReady";
/// Pods listed per page.
const POD_PAGE: u32 = 500;

/// A pod on a down node and its claims of this driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Affected {
    pub pod: ObjectRef,
    pub pvcs: Vec<ObjectRef>,
}

#[derive(Debug)]
struct Down {
    readiness: Readiness,
    since: SystemTime,
    reason: Option<String>,
    /// Set once its pods were listed and the condition raised.
    reported: Option<Vec<Affected>>,
}

impl Down {
    fn condition(&self, node: &str, now: SystemTime) -> Condition {
        let state = match self.readiness {
            Readiness::Unreachable => "unreachable",
            _ => "NotReady",
        };
        let reason = self
            .reason
            .as_deref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        Condition {
            source: Source::NodeReady,
            status: Status::Inaccessible,
            reason: NODE_NOT_READY.to_string(),
            message: format!("node {node} {state} since {}{reason}", rfc3339(self.since)),
            since: self.since,
            last_probe: now,
            occurrences: None,
        }
    }
}

/// The down nodes, and what was reported about each.
#[derive(Debug)]
pub struct NodeWatch {
    grace: Duration,
    down: BTreeMap<String, Down>,
    /// Moves whenever the claims' conditions may have ([`Self::changes`]).
    changes: u64,
}

fn contributor(node: &str) -> String {
    format!("node/{node}")
}

fn subject(node: &str) -> String {
    format!("node {node}")
}

impl NodeWatch {
    pub fn new(grace: Duration) -> Self {
        NodeWatch {
            grace,
            down: BTreeMap::new(),
            changes: 0,
        }
    }

    /// Takes the nodes as they are now; records recoveries (and ends the
    /// Warnings of deleted nodes), and returns the nodes down past the
    /// grace whose pods must be listed ([`NodeWatch::report`]).
    pub fn update(
        &mut self,
        nodes: &[NodeState],
        recorder: &mut Recorder,
        now: SystemTime,
    ) -> Vec<String> {
        let by_name: HashMap<&str, &NodeState> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let tracked: Vec<String> = self.down.keys().cloned().collect();
        for name in tracked {
            match by_name.get(name.as_str()) {
                None => {
                    tracing::info!(node = %name, "node deleted while down; its Warnings end without a recovery");
                    self.down.remove(&name);
                    self.changes += 1;
                    recorder.forget_contributor(&contributor(&name));
                }
                Some(n) if n.readiness == Readiness::Ready => {
                    if let Some(down) = self.down.remove(&name) {
                        self.changes += 1;
                        recovered(&name, &down, recorder, now);
                    }
                }
                Some(_) => {}
            }
        }
        self.end_adopted(&by_name, recorder, now);
        let mut due = Vec::new();
        for n in nodes.iter().filter(|n| n.readiness != Readiness::Ready) {
            let down = self.down.entry(n.name.clone()).or_insert_with(|| Down {
                readiness: n.readiness,
                since: n.since.unwrap_or(now),
                reason: n.reason.clone(),
                reported: None,
            });
            if down.reported.is_none()
                && now.duration_since(down.since).unwrap_or_default() >= self.grace
            {
                due.push(n.name.clone());
            }
        }
        due
    }

    /// The claims of pods on nodes down past the grace, with the condition
    /// each is in.
    pub fn claim_conditions(&self, now: SystemTime) -> Vec<(ObjectRef, Condition)> {
        let mut out = Vec::new();
        for (node, down) in &self.down {
            for a in down.reported.iter().flatten() {
                for pvc in &a.pvcs {
                    out.push((pvc.clone(), down.condition(node, now)));
                }
            }
        }
        out
    }

    /// Raises the condition on every pod of `node` listed by
    /// [`affected_pods`] and on its claims.
    pub fn report(
        &mut self,
        node: &str,
        affected: Vec<Affected>,
        recorder: &mut Recorder,
        now: SystemTime,
    ) {
        let Some(down) = self.down.get_mut(node) else {
            return;
        };
        let raised = Change::Raised(down.condition(node, now));
        observe_all(node, &affected, &raised, recorder, now);
        tracing::warn!(
            node,
            pods = affected.len(),
            "node down past the grace period"
        );
        down.reported = Some(affected);
        self.changes += 1;
    }

    /// A count that moves when a node is reported down, recovers or goes:
    /// [`Self::claim_conditions`] can have changed only then (the node
    /// check runs every second; the status sync need not).
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// Ends the `NodeNotReady` Warnings a previous leader left open: with a
    /// recovery when their node is Ready, silently when it is gone. Those
    /// of nodes still down are claimed by [`NodeWatch::report`].
    fn end_adopted(
        &self,
        nodes: &HashMap<&str, &NodeState>,
        recorder: &mut Recorder,
        now: SystemTime,
    ) {
        for u in recorder.unclaimed() {
            if u.reason != NODE_NOT_READY {
                continue;
            }
            let Some(node) = u.subject.strip_prefix("node ") else {
                continue;
            };
            match nodes.get(node) {
                Some(n) if n.readiness == Readiness::Ready => {
                    recorder.clear_unclaimed(&u.object, u.status, &u.reason, now);
                }
                Some(_) => {}
                None => {
                    let gone = u.object.clone();
                    recorder.drop_unclaimed(|o| *o != gone);
                }
            }
        }
    }
}

fn recovered(node: &str, down: &Down, recorder: &mut Recorder, now: SystemTime) {
    let Some(affected) = &down.reported else {
        return;
    };
    let cleared = Change::Cleared(down.condition(node, now));
    observe_all(node, affected, &cleared, recorder, now);
    tracing::info!(node, "node Ready again");
}

/// Records `change` on each affected pod and on its claims.
fn observe_all(
    node: &str,
    affected: &[Affected],
    change: &Change,
    recorder: &mut Recorder,
    now: SystemTime,
) {
    for a in affected {
        let objects: Vec<ObjectRef> = std::iter::once(a.pod.clone())
            .chain(a.pvcs.iter().cloned())
            .collect();
        recorder.observe_on(
            &contributor(node),
            &subject(node),
            &objects,
            std::slice::from_ref(change),
            now,
        );
    }
}

/// Why a node's pods could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListPodsError {
    // The cause in the message only, not also a `source()` (see StatusError).
    #[error("listing the pods of node {node}: {error}")]
    Api { node: String, error: kube::Error },
    #[error("listing the pods of node {node} timed out after {after:?}")]
    Timeout { node: String, after: Duration },
}

/// The pods on `node` that use claims bound to `volumes`, with those
/// claims; one paged list selected by the server on `spec.nodeName`.
pub async fn affected_pods(
    client: &Client,
    node: &str,
    volumes: &[MonitoredVolume],
    timeout: Duration,
) -> Result<Vec<Affected>, ListPodsError> {
    let claims: HashMap<(&str, &str), &ObjectRef> = volumes
        .iter()
        .filter_map(|v| v.claim.as_deref())
        .map(|c| ((c.namespace.as_str(), c.name.as_str()), c))
        .collect();
    let api: Api<Pod> = Api::all(client.clone());
    let params = ListParams::default()
        .fields(&format!("spec.nodeName={node}"))
        .limit(POD_PAGE);
    let mut out = Vec::new();
    list_pages(&api, params, timeout, |page| {
        out.extend(page.iter().filter_map(|p| affected(p, &claims)))
    })
    .await
    .map_err(|e| match e {
        PageError::Timeout(after) => ListPodsError::Timeout {
            node: node.to_string(),
            after,
        },
        PageError::Api(error) => ListPodsError::Api {
            node: node.to_string(),
            error,
        },
    })?;
    Ok(out)
}

/// A pod and its claims among `claims`; `None` if it uses none, or has
/// finished (its volumes are not in use).
fn affected(pod: &Pod, claims: &HashMap<(&str, &str), &ObjectRef>) -> Option<Affected> {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Succeeded" | "Failed")) {
        return None;
    }
    let ns = pod.namespace().unwrap_or_default();
    let name = pod.name_any();
    let volumes = pod.spec.as_ref()?.volumes.as_ref()?;
    let mut pvcs: Vec<ObjectRef> = volumes
        .iter()
        .filter_map(|v| {
            let claim = match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => c.claim_name.clone(),
                // A generic ephemeral volume's claim is `<pod>-<volume>`.
                (None, Some(_)) => format!("{name}-{}", v.name),
                (None, None) => return None,
            };
            claims
                .get(&(ns.as_str(), claim.as_str()))
                .map(|c| (*c).clone())
        })
        .collect();
    pvcs.sort();
    pvcs.dedup();
    if pvcs.is_empty() {
        return None;
    }
    Some(Affected {
        pod: ObjectRef {
            kind: ObjectKind::Pod,
            namespace: ns,
            name,
            uid: pod.metadata.uid.clone().unwrap_or_default(),
        },
        pvcs,
    })
}
