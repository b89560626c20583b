//! The controller's metrics (prometheus-client), served on `/metrics` with
//! the `volume_health_controller_` prefix: cycles by result and their
//! duration, CSI calls by RPC and code, volumes monitored and abnormal,
//! leadership, and the API requests and Event writes it makes.

use std::time::Duration;

use health_kube::events::StatusFollower;
use health_kube::http::Exposition;
use health_kube::metrics::ApiMetrics;
use health_kube::observer::Observer;
use health_kube::status::{Claim, SourceEntry};
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Upper bounds of the cycle duration histogram: a list walk over a few
/// volumes takes milliseconds, tens of thousands of per-volume Gets take
/// seconds to minutes; the top buckets reach past the default interval
/// (15 s), where cycles start running back to back.
const CYCLE_DURATION_BUCKETS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0,
];

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CycleLabels {
    result: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CsiLabels {
    rpc: String,
    code: String,
}

/// How one cycle ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CycleResult {
    /// Every monitored volume got an answer (a complete list, or each Get).
    Complete,
    /// The list stopped early (page limit, repeated token) or some Gets
    /// failed: the volumes without an answer learnt nothing.
    Partial,
    /// No answer at all.
    Failed,
}

impl CycleResult {
    fn as_str(self) -> &'static str {
        match self {
            CycleResult::Complete => "complete",
            CycleResult::Partial => "partial",
            CycleResult::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

/// What the controller does with `pvc.status.healthStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HealthStatusState {
    /// Not tried yet (nothing to say so far).
    Unknown,
    /// The server stores it; the controller writes it.
    Written,
    /// The server has no such field, or drops it (gate off).
    Unsupported,
}

impl HealthStatusState {
    const ALL: [HealthStatusState; 3] = [
        HealthStatusState::Unknown,
        HealthStatusState::Written,
        HealthStatusState::Unsupported,
    ];

    fn as_str(self) -> &'static str {
        match self {
            HealthStatusState::Unknown => "unknown",
            HealthStatusState::Written => "written",
            HealthStatusState::Unsupported => "unsupported",
        }
    }
}

#[derive(Debug)]
pub struct ControllerMetrics {
    registry: Registry,
    cycles: Family<CycleLabels, Counter>,
    cycle_duration: Histogram,
    csi_calls: Family<CsiLabels, Counter>,
    volumes: Gauge,
    abnormal: Gauge,
    leader: Gauge,
    health_status: Family<StateLabels, Gauge>,
    health_status_yielded: Gauge,
    /// The same API traffic families as the node agent's.
    api: ApiMetrics,
    /// Not a metric: the status writer reports its `VolumeHealth` writes
    /// to this observer, and the current leadership's recovery Events wait
    /// for them (see [`StatusFollower`]).
    status: StatusFollower,
}

impl Default for ControllerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ControllerMetrics {
    pub fn new() -> Self {
        let m = ControllerMetrics {
            registry: Registry::default(),
            cycles: Family::default(),
            cycle_duration: Histogram::new(CYCLE_DURATION_BUCKETS),
            csi_calls: Family::default(),
            volumes: Gauge::default(),
            abnormal: Gauge::default(),
            leader: Gauge::default(),
            health_status: Family::default(),
            health_status_yielded: Gauge::default(),
            api: ApiMetrics::default(),
            status: StatusFollower::default(),
        };
        let mut r = Registry::with_prefix("volume_health_controller");
        r.register(
            "cycles",
            "Health cycles over the driver's volumes, by result",
            m.cycles.clone(),
        );
        r.register_with_unit(
            "cycle_duration",
            "Wall time of one health cycle: the CSI calls for every monitored volume and applying their answers",
            prometheus_client::registry::Unit::Seconds,
            m.cycle_duration.clone(),
        );
        r.register(
            "csi_calls",
            "CSI controller calls, by RPC and gRPC code (or timeout, connect)",
            m.csi_calls.clone(),
        );
        r.register(
            "volumes_monitored",
            "PVs of this driver being monitored",
            m.volumes.clone(),
        );
        r.register(
            "volumes_abnormal",
            "Monitored PVs with at least one condition",
            m.abnormal.clone(),
        );
        r.register(
            "leader",
            "1 while this replica holds the lease and does the work",
            m.leader.clone(),
        );
        r.register(
            "pvc_health_status",
            "1 for what the controller does with pvc.status.healthStatus (Kubernetes 1.37+): unknown, written or unsupported by the server",
            m.health_status.clone(),
        );
        r.register(
            "pvc_health_status_yielded_claims",
            "Claims whose pvc.status.healthStatus another field manager owns (external-health-monitor); left to it",
            m.health_status_yielded.clone(),
        );
        m.set_health_status(HealthStatusState::Unknown, 0);
        m.api.register(&mut r);
        ControllerMetrics { registry: r, ..m }
    }

    /// One cycle that ended with `result` after `took`.
    pub fn cycle(&self, result: CycleResult, took: Duration) {
        self.cycles
            .get_or_create(&CycleLabels {
                result: result.as_str().to_string(),
            })
            .inc();
        self.cycle_duration.observe(took.as_secs_f64());
    }

    /// `n` calls of `rpc` that ended with `code` (`OK`, `Unimplemented`,
    /// `Timeout`...).
    pub fn csi_calls(&self, rpc: &str, code: &str, n: u64) {
        self.csi_calls
            .get_or_create(&CsiLabels {
                rpc: rpc.to_string(),
                code: code.to_string(),
            })
            .inc_by(n);
    }

    pub fn set_volumes(&self, monitored: usize, abnormal: usize) {
        self.volumes
            .set(i64::try_from(monitored).unwrap_or(i64::MAX));
        self.abnormal
            .set(i64::try_from(abnormal).unwrap_or(i64::MAX));
    }

    pub fn set_health_status(&self, state: HealthStatusState, yielded: usize) {
        for s in HealthStatusState::ALL {
            self.health_status
                .get_or_create(&StateLabels {
                    state: s.as_str().to_string(),
                })
                .set(i64::from(s == state));
        }
        self.health_status_yielded
            .set(i64::try_from(yielded).unwrap_or(i64::MAX));
    }

    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail for our label values.
        if let Err(e) = encode(&mut out, &self.registry) {
            tracing::error!("encoding controller metrics: {e}");
        }
        out
    }
}

impl Exposition for ControllerMetrics {
    fn try_encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

impl Observer for ControllerMetrics {
    fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
        self.api.api_request(verb, resource, code);
    }

    fn event_written(&self, type_: &str, reason: &str) {
        self.api.event_written(type_, reason);
    }

    fn event_write_deferred(&self) {
        self.api.event_write_deferred();
    }

    fn volume_health_written(&self, claim: &Claim, entries: Option<&[SourceEntry]>) {
        self.status.written(claim, entries);
    }
}

impl ControllerMetrics {
    /// Where the `VolumeHealth` writes' results go.
    pub fn status_follower(&self) -> &StatusFollower {
        &self.status
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The family's samples, sorted (label sets come out in hash order).
    fn samples(m: &ControllerMetrics, family: &str) -> Vec<String> {
        let mut out: Vec<String> = m
            .encode()
            .lines()
            .filter(|l| l.starts_with(family))
            .map(str::to_string)
            .collect();
        out.sort();
        out
    }

    #[test]
    fn families_and_labels() {
        let m = ControllerMetrics::new();
        m.cycle(CycleResult::Complete, Duration::from_millis(20));
        m.cycle(CycleResult::Complete, Duration::from_millis(300));
        m.cycle(CycleResult::Failed, Duration::from_secs(12));
        m.csi_calls("ControllerListVolumeHealth", "OK", 3);
        m.set_volumes(7, 2);
        m.set_leader(true);
        Observer::api_request(&m, "list", "pods", Some(200));
        assert_eq!(
            samples(&m, "volume_health_controller_cycles_total"),
            [
                r#"volume_health_controller_cycles_total{result="complete"} 2"#,
                r#"volume_health_controller_cycles_total{result="failed"} 1"#,
            ]
        );
        // Cumulative buckets: 20 ms in the 25 ms one, 300 ms from the 500 ms
        // one on, 12 s only from the 15 s one on.
        let duration = samples(&m, "volume_health_controller_cycle_duration_seconds");
        for line in [
            "volume_health_controller_cycle_duration_seconds_count 3",
            "volume_health_controller_cycle_duration_seconds_sum 12.32",
            r#"volume_health_controller_cycle_duration_seconds_bucket{le="0.01"} 0"#,
            r#"volume_health_controller_cycle_duration_seconds_bucket{le="0.025"} 1"#,
            r#"volume_health_controller_cycle_duration_seconds_bucket{le="0.25"} 1"#,
            r#"volume_health_controller_cycle_duration_seconds_bucket{le="0.5"} 2"#,
            r#"volume_health_controller_cycle_duration_seconds_bucket{le="10.0"} 2"#,
            r#"volume_health_controller_cycle_duration_seconds_bucket{le="15.0"} 3"#,
            r#"volume_health_controller_cycle_duration_seconds_bucket{le="+Inf"} 3"#,
        ] {
            assert!(
                duration.iter().any(|l| l == line),
                "{line} in {duration:#?}"
            );
        }
        assert_eq!(
            samples(&m, "volume_health_controller_csi_calls_total"),
            [
                r#"volume_health_controller_csi_calls_total{rpc="ControllerListVolumeHealth",code="OK"} 3"#
            ]
        );
        assert_eq!(
            samples(&m, "volume_health_controller_volumes_"),
            [
                "volume_health_controller_volumes_abnormal 2",
                "volume_health_controller_volumes_monitored 7",
            ]
        );
        assert_eq!(
            samples(&m, "volume_health_controller_leader"),
            ["volume_health_controller_leader 1"]
        );
        assert_eq!(
            samples(&m, "volume_health_controller_api_requests_total"),
            [
                r#"volume_health_controller_api_requests_total{verb="list",resource="pods",code="200"} 1"#
            ]
        );
    }
}
