//! CSI node health probes: results by driver and RPC, and the latency of
//! the RPCs actually made; storage health probes: results by driver.

use std::time::Duration;

use health_csi::HealthSource;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::histogram::Histogram;

use super::Metrics;
use crate::volumes::{CsiOutcome, CsiResult, StorageOutcome, StorageResult};

/// Upper bounds of the CSI latency histogram: a local driver answers in a
/// millisecond or so, a remote one in tens to hundreds; the top buckets
/// separate slow answers from the call timeout.
const CSI_DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct CsiLabels {
    driver: String,
    rpc: String,
    result: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct StorageLabels {
    driver: String,
    result: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct DriverLabels {
    driver: String,
}

impl Metrics {
    /// One volume's CSI probe: its result, and its latency when an RPC was
    /// made (outcomes with zero `elapsed` made none and would only pile up
    /// in the lowest bucket).
    pub fn csi_probe(&self, outcome: &CsiOutcome) {
        let (rpc, result) = match &outcome.result {
            CsiResult::Health { rpc, entries, .. } => (
                rpc_name(*rpc),
                if entries.is_empty() {
                    "healthy"
                } else {
                    "abnormal"
                },
            ),
            CsiResult::NoHealthInfo { rpc, .. } => (rpc_name(*rpc), "no_health_info"),
            CsiResult::NotAdvertised => ("", "not_advertised"),
            CsiResult::ProbeFailed { .. } => ("", "failed"),
        };
        self.csi_probes
            .get_or_create(&CsiLabels {
                driver: outcome.driver.clone(),
                rpc: rpc.to_string(),
                result: result.to_string(),
            })
            .inc();
        if outcome.elapsed > Duration::ZERO {
            self.csi_probe_duration
                .get_or_create(&DriverLabels {
                    driver: outcome.driver.clone(),
                })
                .observe(outcome.elapsed.as_secs_f64());
        }
    }
}

impl Metrics {
    /// One driver's storage probe of one CSI cycle: `healthy` (empty
    /// answer), `abnormal` (some backend condition), `unsupported` (the
    /// driver lacks NodeGetStorageHealth; counted every cycle though asked
    /// only once) or `failed`.
    pub fn csi_storage_probe(&self, outcome: &StorageOutcome) {
        let result = match &outcome.result {
            StorageResult::Health { entries } if entries.is_empty() => "healthy",
            StorageResult::Health { .. } => "abnormal",
            StorageResult::Unsupported => "unsupported",
            StorageResult::ProbeFailed { .. } => "failed",
        };
        self.csi_storage_probes
            .get_or_create(&StorageLabels {
                driver: outcome.driver.clone(),
                result: result.to_string(),
            })
            .inc();
    }
}

pub(super) fn csi_histogram() -> Histogram {
    Histogram::new(CSI_DURATION_BUCKETS)
}

fn rpc_name(rpc: HealthSource) -> &'static str {
    match rpc {
        HealthSource::NodeGetVolumeHealth => "NodeGetVolumeHealth",
        HealthSource::NodeGetVolumeStats => "NodeGetVolumeStats",
    }
}

#[cfg(test)]
mod tests {
    use health_csi::HealthEntry;
    use health_csi::HealthStatus;

    use super::super::tests::{lines, samples};
    use super::*;
    use crate::volumes::kubelet::VolumeMode;
    use crate::volumes::VolumeKey;

    #[test]
    fn csi_probes_count_results_and_time_real_calls() {
        let m = Metrics::new();
        let outcome = |result, ms| CsiOutcome {
            key: VolumeKey {
                pod_uid: "u".into(),
                name: "pv".into(),
                mode: VolumeMode::Filesystem,
            },
            driver: "d.csi".into(),
            socket: None,
            result,
            elapsed: Duration::from_millis(ms),
        };
        m.csi_probe(&outcome(
            CsiResult::Health {
                rpc: HealthSource::NodeGetVolumeHealth,
                entries: vec![],
                usage: None,
            },
            3,
        ));
        m.csi_probe(&outcome(
            CsiResult::Health {
                rpc: HealthSource::NodeGetVolumeHealth,
                entries: vec![HealthEntry::new(HealthStatus::DataLoss, "X", "y")],
                usage: None,
            },
            20,
        ));
        m.csi_probe(&outcome(
            CsiResult::NoHealthInfo {
                rpc: HealthSource::NodeGetVolumeStats,
                usage: None,
            },
            2_000,
        ));
        // No RPC made: counted, not timed.
        m.csi_probe(&outcome(
            CsiResult::ProbeFailed {
                error: "no CSI driver".into(),
            },
            0,
        ));
        m.csi_probe(&outcome(CsiResult::NotAdvertised, 0));
        assert_eq!(
            samples(&m, "volume_health_csi_probes_total"),
            [
                r#"volume_health_csi_probes_total{driver="d.csi",rpc="",result="failed"} 1"#,
                r#"volume_health_csi_probes_total{driver="d.csi",rpc="",result="not_advertised"} 1"#,
                r#"volume_health_csi_probes_total{driver="d.csi",rpc="NodeGetVolumeHealth",result="abnormal"} 1"#,
                r#"volume_health_csi_probes_total{driver="d.csi",rpc="NodeGetVolumeHealth",result="healthy"} 1"#,
                r#"volume_health_csi_probes_total{driver="d.csi",rpc="NodeGetVolumeStats",result="no_health_info"} 1"#,
            ]
        );
        let all = lines(&m);
        for want in [
            "# TYPE volume_health_csi_probe_duration_seconds histogram",
            "# UNIT volume_health_csi_probe_duration_seconds seconds",
            r#"volume_health_csi_probe_duration_seconds_count{driver="d.csi"} 3"#,
            r#"volume_health_csi_probe_duration_seconds_bucket{le="0.001",driver="d.csi"} 0"#,
            r#"volume_health_csi_probe_duration_seconds_bucket{le="0.005",driver="d.csi"} 1"#,
            r#"volume_health_csi_probe_duration_seconds_bucket{le="0.025",driver="d.csi"} 2"#,
            r#"volume_health_csi_probe_duration_seconds_bucket{le="1.0",driver="d.csi"} 2"#,
            r#"volume_health_csi_probe_duration_seconds_bucket{le="2.5",driver="d.csi"} 3"#,
            r#"volume_health_csi_probe_duration_seconds_bucket{le="+Inf",driver="d.csi"} 3"#,
        ] {
            assert!(
                all.iter().any(|l| l == want),
                "missing {want:?} in {all:#?}"
            );
        }
    }

    #[test]
    fn storage_probes_count_one_result_per_driver_and_cycle() {
        use health_csi::{StorageHealthEntry, StorageHealthStatus};
        let m = Metrics::new();
        let outcome = |driver: &str, result| StorageOutcome {
            driver: driver.into(),
            socket: None,
            result,
        };
        let down = vec![StorageHealthEntry::new(
            StorageHealthStatus::StorageUnreachable,
            "ArrayOffline",
            "a1",
        )];
        for _ in 0..2 {
            m.csi_storage_probe(&outcome(
                "a.csi",
                StorageResult::Health {
                    entries: down.clone(),
                },
            ));
            m.csi_storage_probe(&outcome("b.csi", StorageResult::Unsupported));
        }
        m.csi_storage_probe(&outcome("a.csi", StorageResult::Health { entries: vec![] }));
        m.csi_storage_probe(&outcome(
            "c.csi",
            StorageResult::ProbeFailed {
                error: "timed out".into(),
            },
        ));
        assert_eq!(
            samples(&m, "volume_health_csi_storage_probes_total"),
            [
                r#"volume_health_csi_storage_probes_total{driver="a.csi",result="abnormal"} 2"#,
                r#"volume_health_csi_storage_probes_total{driver="a.csi",result="healthy"} 1"#,
                r#"volume_health_csi_storage_probes_total{driver="b.csi",result="unsupported"} 2"#,
                r#"volume_health_csi_storage_probes_total{driver="c.csi",result="failed"} 1"#,
            ]
        );
    }
}
