//! Pod volumes: the active conditions of each (`volume_health_volume_condition`,
//! capped, a series shared by two volumes held until both drop it) and how
//! many volumes the agent watches.

use std::collections::{HashMap, HashSet};

use health_core::conditions::Condition;
use prometheus_client::encoding::EncodeLabelSet;

use super::{lock, Metrics};

const VOLUME_CONDITION_NAME: &str = "volume_health_volume_condition";

/// A pod volume as the metrics name it; built by the cluster code from the
/// pod and the PV's claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VolumeRef {
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's own name for the volume (kubelet's directory name under the
    /// pod: the PV name, or an inline volume's name). Not a label: it only
    /// keeps two volumes of one pod apart, since inline ephemeral volumes
    /// have neither a claim nor a PV.
    pub volume: String,
    pub pvc: Option<String>,
    pub pv: Option<String>,
}

/// Labels of `volume_health_volume_condition`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ConditionLabels {
    namespace: String,
    pod: String,
    persistentvolumeclaim: String,
    persistentvolume: String,
    status: String,
    reason: String,
}

/// Which condition series each volume holds. Two volumes can hold the same
/// series (two inline volumes of one pod with the same condition), so each
/// series counts its holders and goes only with the last one.
#[derive(Default)]
pub(super) struct ConditionSeries {
    by_volume: HashMap<VolumeRef, HashSet<ConditionLabels>>,
    holders: HashMap<ConditionLabels, usize>,
}

impl Metrics {
    /// Makes `conditions` exactly the active conditions of `volume`: series
    /// for new ones are created (within the cap), series for conditions no
    /// longer present removed. Only `status` and `reason` matter; several
    /// sources raising the same pair are one series.
    pub fn set_volume_conditions(&self, volume: &VolumeRef, conditions: &[Condition]) {
        let wanted: HashSet<ConditionLabels> = conditions
            .iter()
            .map(|c| ConditionLabels {
                namespace: volume.namespace.clone(),
                pod: volume.pod.clone(),
                persistentvolumeclaim: volume.pvc.clone().unwrap_or_default(),
                persistentvolume: volume.pv.clone().unwrap_or_default(),
                status: c.status.to_string(),
                reason: c.reason.clone(),
            })
            .collect();

        let mut guard = lock(&self.condition_series);
        let series = &mut *guard;
        let held = series.by_volume.remove(volume).unwrap_or_default();
        for labels in held.difference(&wanted) {
            if let Some(n) = series.holders.get_mut(labels) {
                *n -= 1;
                if *n == 0 {
                    series.holders.remove(labels);
                    self.conditions.remove(labels);
                }
            }
        }
        let mut now_held = HashSet::with_capacity(wanted.len());
        for labels in wanted {
            if held.contains(&labels) {
                now_held.insert(labels);
                continue;
            }
            if let Some(n) = series.holders.get_mut(&labels) {
                *n += 1;
            } else if series.holders.len() >= self.max_series {
                // Not remembered as held: the next call tries again.
                self.dropped(VOLUME_CONDITION_NAME);
                continue;
            } else {
                series.holders.insert(labels.clone(), 1);
                self.conditions.get_or_create(&labels).set(1);
            }
            now_held.insert(labels);
        }
        if !now_held.is_empty() {
            series.by_volume.insert(volume.clone(), now_held);
        }
    }

    /// Removes every condition and I/O series of a volume that went away.
    pub fn remove_volume(&self, volume: &VolumeRef) {
        self.set_volume_conditions(volume, &[]);
        self.remove_io(volume);
    }

    /// How many pod volumes the agent watches now.
    pub fn set_volumes(&self, n: usize) {
        self.volumes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

#[cfg(test)]
mod tests {
    use health_core::conditions::{Source, Status};

    use super::super::tests::{cond, samples, vol};
    use super::*;

    #[test]
    fn conditions_are_set_replaced_and_removed_exactly() {
        let m = Metrics::new();
        let v = vol("web-0", "pv-1", Some("data"), Some("pv-1"));
        let line = |status: &str, reason: &str| {
            format!(
                r#"volume_health_volume_condition{{namespace="ns1",pod="web-0",persistentvolumeclaim="data",persistentvolume="pv-1",status="{status}",reason="{reason}"}} 1"#
            )
        };
        m.set_volume_conditions(
            &v,
            &[
                cond(Status::Inaccessible, "FilesystemShutdown"),
                cond(Status::Degraded, "BlockIOErrors"),
                // Same pair from another source: one series.
                Condition {
                    source: Source::CsiNode,
                    ..cond(Status::Degraded, "BlockIOErrors")
                },
            ],
        );
        assert_eq!(
            samples(&m, "volume_health_volume_condition"),
            [
                line("Degraded", "BlockIOErrors"),
                line("Inaccessible", "FilesystemShutdown")
            ]
        );
        m.set_volume_conditions(
            &v,
            &[
                cond(Status::Degraded, "BlockIOErrors"),
                cond(Status::DataLoss, "ChecksumMismatch"),
            ],
        );
        assert_eq!(
            samples(&m, "volume_health_volume_condition"),
            [
                line("DataLoss", "ChecksumMismatch"),
                line("Degraded", "BlockIOErrors")
            ]
        );
        m.remove_volume(&v);
        assert_eq!(
            samples(&m, "volume_health_volume_condition"),
            Vec::<String>::new()
        );
        // Removing again, or an unknown volume, is harmless.
        m.remove_volume(&v);
        m.set_volume_conditions(&vol("x", "y", None, None), &[]);
        assert_eq!(
            samples(&m, "volume_health_volume_condition"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn a_series_shared_by_two_volumes_stays_until_both_drop_it() {
        let m = Metrics::new();
        // Two inline volumes of one pod: identical labels.
        let a = vol("p", "scratch-a", None, None);
        let b = vol("p", "scratch-b", None, None);
        let c = [cond(Status::Inaccessible, "MountGone")];
        m.set_volume_conditions(&a, &c);
        m.set_volume_conditions(&b, &c);
        let want = [
            r#"volume_health_volume_condition{namespace="ns1",pod="p",persistentvolumeclaim="",persistentvolume="",status="Inaccessible",reason="MountGone"} 1"#,
        ];
        assert_eq!(samples(&m, "volume_health_volume_condition"), want);
        m.remove_volume(&a);
        assert_eq!(samples(&m, "volume_health_volume_condition"), want);
        m.set_volume_conditions(&b, &[]);
        assert_eq!(
            samples(&m, "volume_health_volume_condition"),
            Vec::<String>::new()
        );
    }
}
