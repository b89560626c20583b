//! This driver's bound claims, found by namespace and name in the PV list
//! the cycles share ([`crate::pv_store`]) without copying it: the index
//! holds a hash and a position per PV, 100,000 claims in ~2 MB, where a map
//! of owned claims held 55-65 MB (docs/benchmarks.md, "Scale"). The status
//! writer and the `healthStatus` follower ask it whether a claim is this
//! driver's; it is rebuilt only when the PV list changes.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use health_kube::events::ObjectRef;
use health_kube::status::Claim;

use crate::pv_store::MonitoredVolume;

/// The claims bound to one PV list.
#[derive(Debug, Default)]
pub struct ClaimIndex {
    volumes: Arc<Vec<MonitoredVolume>>,
    hasher: RandomState,
    /// Hash of (namespace, name) -> positions in `volumes`.
    by_claim: HashMap<u64, Vec<u32>>,
}

impl ClaimIndex {
    pub fn new(volumes: Arc<Vec<MonitoredVolume>>) -> ClaimIndex {
        let hasher = RandomState::new();
        let mut by_claim: HashMap<u64, Vec<u32>> = HashMap::with_capacity(volumes.len());
        for (i, v) in volumes.iter().enumerate() {
            let Some(c) = v.claim.as_deref().filter(|c| !c.uid.is_empty()) else {
                continue;
            };
            let i = u32::try_from(i).expect("fewer than 4 billion PVs");
            by_claim
                .entry(hasher.hash_one((&c.namespace, &c.name)))
                .or_default()
                .push(i);
        }
        ClaimIndex {
            volumes,
            hasher,
            by_claim,
        }
    }

    /// Whether it indexes exactly this list.
    pub fn is_of(&self, volumes: &Arc<Vec<MonitoredVolume>>) -> bool {
        Arc::ptr_eq(&self.volumes, volumes)
    }

    /// The PV bound to the claim `namespace/name` (with a uid), if one of
    /// this driver's is.
    pub fn volume(&self, namespace: &str, name: &str) -> Option<&MonitoredVolume> {
        let key = self.hasher.hash_one((namespace, name));
        self.by_claim.get(&key)?.iter().find_map(|&i| {
            let v = &self.volumes[i as usize];
            let c = v.claim.as_deref()?;
            (c.namespace == namespace && c.name == name).then_some(v)
        })
    }

    pub fn contains(&self, namespace: &str, name: &str) -> bool {
        self.volume(namespace, name).is_some()
    }

    /// The claim `namespace/name` as the status writers name it, if one of
    /// this driver's PVs is bound to it.
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Claim> {
        let v = self.volume(namespace, name)?;
        claim_of(v.claim.as_deref()?, Some(v.pv.to_string()))
    }

    /// The claims bound here and not in `before` (bound since).
    pub fn added_since(&self, before: &ClaimIndex) -> Vec<Claim> {
        self.volumes
            .iter()
            .filter_map(|v| {
                let c = v.claim.as_deref()?;
                if before.contains(&c.namespace, &c.name) {
                    return None;
                }
                claim_of(c, Some(v.pv.to_string()))
            })
            .collect()
    }
}

/// A claim reference as the status writers name the claim; `None` without
/// a uid (they write only for a claim they can tell apart from a
/// same-named successor).
pub fn claim_of(o: &ObjectRef, pv: Option<String>) -> Option<Claim> {
    (!o.uid.is_empty()).then(|| Claim {
        namespace: o.namespace.clone(),
        name: o.name.clone(),
        uid: o.uid.clone(),
        pv,
    })
}

#[cfg(test)]
mod tests {
    use health_kube::events::ObjectKind;

    use super::*;

    fn pv(n: u32, claim: Option<(&str, &str)>) -> MonitoredVolume {
        MonitoredVolume {
            pv: format!("pv-{n}").into(),
            handle: format!("h-{n}").into(),
            claim: claim.map(|(name, uid)| {
                Arc::new(ObjectRef {
                    kind: ObjectKind::PersistentVolumeClaim,
                    namespace: "shop".into(),
                    name: name.into(),
                    uid: uid.into(),
                })
            }),
        }
    }

    #[test]
    fn finds_bound_claims_with_a_uid_and_what_was_bound_since() {
        let before = ClaimIndex::new(Arc::new(vec![
            pv(1, Some(("data", "u-1"))),
            pv(2, None),
            pv(3, Some(("no-uid", ""))),
        ]));
        let claim = before.claim("shop", "data").expect("bound");
        assert_eq!(
            (claim.uid.as_str(), claim.pv.as_deref()),
            ("u-1", Some("pv-1"))
        );
        assert!(!before.contains("shop", "no-uid"), "no uid: not a claim");
        assert!(!before.contains("other", "data"));
        assert!(!before.contains("shop", "logs"));
        let list = Arc::new(vec![
            pv(1, Some(("data", "u-1"))),
            pv(2, Some(("logs", "u-2"))),
        ]);
        let after = ClaimIndex::new(Arc::clone(&list));
        assert!(after.is_of(&list) && !before.is_of(&list));
        let added: Vec<String> = after
            .added_since(&before)
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(added, ["logs"]);
        assert!(after.contains("shop", "data") && after.contains("shop", "logs"));
    }
}
