//! Prometheus metrics: what the kernel reported per claim and device, which
//! volume conditions are active, and how the agent itself is doing.
//!
//! One [`Metrics`] owns the registry and every family; it is shared as
//! `Arc<Metrics>` and every method takes `&self` (the families synchronize
//! internally), so the event path, the CSI prober, the API client and the
//! HTTP server can all hold it. Names follow the Prometheus conventions:
//! the `volume_health_` prefix, `_total` on counters (added by the encoder),
//! base units (`_seconds`), snake_case labels.
//!
//! Two families carry labels taken from the cluster (claim names, condition
//! reasons that CSI drivers choose freely): those are capped at
//! [`MAX_SERIES`] label sets each, see [`Metrics::with_max_series`].

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use health_csi::HealthSource;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

use crate::dev::Dev;
use crate::kernel::collector::{KernelError, KernelStats};
use crate::kernel::names::{errno_name, op_name, source_name};
use crate::volumes::conditions::Condition;
use crate::volumes::{CsiOutcome, CsiResult};

/// Default cap on label sets per capped family (kernel errors, volume
/// conditions). Each series costs memory here and in every Prometheus that
/// scrapes the agent, and these labels come from outside the agent: claim
/// names churn with workloads, condition reasons are whatever a CSI driver
/// sends. Ten thousand is far above a node's real needs (a few hundred
/// volumes, a handful of devices and reasons each) and still small enough
/// that a runaway cannot hurt the node or the monitoring system.
pub const MAX_SERIES: usize = 10_000;

/// Upper bounds of the CSI latency histogram: a local driver answers in a
/// millisecond or so, a remote one in tens to hundreds; the top buckets
/// separate slow answers from the call timeout.
const CSI_DURATION_BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Labels of `volume_health_kernel_errors_total`. Errors on a device that
/// reaches no volume have empty `namespace`, `persistentvolumeclaim` and
/// `persistentvolume`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorLabels {
    pub namespace: String,
    pub persistentvolumeclaim: String,
    pub persistentvolume: String,
    /// Kernel name of the device (`loop3`, `sda2`) when known, else
    /// `MAJ:MIN`.
    pub device: String,
    /// The tracepoint ([`source_name`]).
    pub source: String,
    /// [`op_name`], or empty when the source carries no operation.
    pub op: String,
    /// [`errno_name`] (`EIO`), or empty when the source carries no errno.
    pub errno: String,
}

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
struct ConditionLabels {
    namespace: String,
    pod: String,
    persistentvolumeclaim: String,
    persistentvolume: String,
    status: String,
    reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ApiLabels {
    verb: String,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EventLabels {
    r#type: String,
    reason: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CsiLabels {
    driver: String,
    rpc: String,
    result: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DriverLabels {
    driver: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DroppedLabels {
    /// The full name of the family that refused a new label set.
    metric: String,
}

/// The claim part of [`ErrorLabels`]: what [`Metrics::remove_kernel_errors`]
/// removes by.
type ClaimKey = (String, String, String);

/// Which kernel-error series exist, per claim: for exact removal and an
/// exact cap.
#[derive(Default)]
struct KernelSeries {
    by_claim: HashMap<ClaimKey, HashSet<ErrorLabels>>,
    count: usize,
}

/// Which condition series each volume holds. Two volumes can hold the same
/// series (two inline volumes of one pod with the same condition), so each
/// series counts its holders and goes only with the last one.
#[derive(Default)]
struct ConditionSeries {
    by_volume: HashMap<VolumeRef, HashSet<ConditionLabels>>,
    holders: HashMap<ConditionLabels, usize>,
}

/// Every metric the agent exports. See the module documentation.
pub struct Metrics {
    registry: Registry,
    max_series: usize,

    kernel_errors: Family<ErrorLabels, Counter>,
    kernel_series: Mutex<KernelSeries>,
    conditions: Family<ConditionLabels, Gauge>,
    condition_series: Mutex<ConditionSeries>,
    series_dropped: Family<DroppedLabels, Counter>,

    samples_suppressed: Counter,
    ringbuf_lost_samples: Counter,
    counter_map_full: Counter,
    writeback_repeats_merged: Counter,
    kernel_program_misses: Counter,
    /// The last cumulative stats seen, for deltas.
    last_stats: Mutex<Option<KernelStats>>,

    api_requests: Family<ApiLabels, Counter>,
    events_written: Family<EventLabels, Counter>,
    event_writes_deferred: Counter,
    csi_probes: Family<CsiLabels, Counter>,
    csi_probe_duration: Family<DriverLabels, Histogram, fn() -> Histogram>,
    volumes: Gauge,
}

const KERNEL_ERRORS_NAME: &str = "volume_health_kernel_errors_total";
const VOLUME_CONDITION_NAME: &str = "volume_health_volume_condition";

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("max_series", &self.max_series)
            .finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// All families registered, capped at [`MAX_SERIES`].
    pub fn new() -> Self {
        Self::with_max_series(MAX_SERIES)
    }

    /// Like [`Metrics::new`] with another cap on the label sets of
    /// `volume_health_kernel_errors_total` and
    /// `volume_health_volume_condition` (each). Beyond it new label sets
    /// are not created and `volume_health_metric_series_dropped_total`
    /// counts every update that was refused one; existing series keep
    /// counting.
    pub fn with_max_series(max_series: usize) -> Self {
        let m = Metrics {
            registry: Registry::default(),
            max_series,
            kernel_errors: Family::default(),
            kernel_series: Mutex::default(),
            conditions: Family::default(),
            condition_series: Mutex::default(),
            series_dropped: Family::default(),
            samples_suppressed: Counter::default(),
            ringbuf_lost_samples: Counter::default(),
            counter_map_full: Counter::default(),
            writeback_repeats_merged: Counter::default(),
            kernel_program_misses: Counter::default(),
            last_stats: Mutex::default(),
            api_requests: Family::default(),
            events_written: Family::default(),
            event_writes_deferred: Counter::default(),
            csi_probes: Family::default(),
            csi_probe_duration: Family::new_with_constructor(csi_histogram),
            volumes: Gauge::default(),
        };
        // Families are handles: the registry's clones and ours share state.
        let registry = m.build_registry();
        Metrics { registry, ..m }
    }

    fn build_registry(&self) -> Registry {
        let mut r = Registry::with_prefix("volume_health");
        r.register(
            "kernel_errors",
            "Storage errors the kernel reported, per claim, device, tracepoint, operation and errno",
            self.kernel_errors.clone(),
        );
        r.register(
            "volume_condition",
            "1 for each active condition (KEP-1432 status and reason) of a pod volume",
            self.conditions.clone(),
        );
        r.register(
            "metric_series_dropped",
            "Updates refused because their family already had the maximum number of label sets",
            self.series_dropped.clone(),
        );
        r.register(
            "samples_suppressed",
            "Kernel errors counted without a sample (rate limit), summarized later",
            self.samples_suppressed.clone(),
        );
        r.register(
            "ringbuf_lost_samples",
            "Error samples the kernel dropped because the ring buffer was full (still counted)",
            self.ringbuf_lost_samples.clone(),
        );
        r.register(
            "counter_map_full",
            "Kernel errors that found the per-device counter map full and were not counted",
            self.counter_map_full.clone(),
        );
        r.register(
            "writeback_repeats_merged",
            "Repeated reports of a writeback error already recorded, merged into it",
            self.writeback_repeats_merged.clone(),
        );
        r.register(
            "kernel_program_misses",
            "Runs of the agent's kernel programs the kernel skipped because another BPF program was running on that CPU: errors not in any count",
            self.kernel_program_misses.clone(),
        );
        r.register(
            "api_requests",
            "Kubernetes API requests by verb, resource and HTTP status (\"error\": no response)",
            self.api_requests.clone(),
        );
        r.register(
            "events_written",
            "Kubernetes Events written (created or aggregated) by type and reason",
            self.events_written.clone(),
        );
        r.register(
            "event_writes_deferred",
            "Event writes held back by the per-object budget",
            self.event_writes_deferred.clone(),
        );
        r.register(
            "csi_probes",
            "CSI node health probes by driver, RPC and result",
            self.csi_probes.clone(),
        );
        r.register_with_unit(
            "csi_probe_duration",
            "Latency of CSI node health RPCs, per driver",
            Unit::Seconds,
            self.csi_probe_duration.clone(),
        );
        r.register(
            "volumes",
            "Pod volumes on this node the agent watches",
            self.volumes.clone(),
        );
        let build_info: Family<VersionLabels, Gauge> = Family::default();
        build_info
            .get_or_create(&VersionLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
            })
            .set(1);
        r.register("build_info", "The agent's version; always 1", build_info);
        r
    }

    /// Adds `count` errors to one series. Unlike pod-volume events, metrics
    /// count per claim: an error reaching two pods' volumes of one PVC is one
    /// error, so callers call this once per distinct
    /// (`namespace`, `persistentvolumeclaim`, `persistentvolume`) the error
    /// reaches (and once with those empty when it reaches no volume).
    pub fn kernel_errors(&self, labels: &ErrorLabels, count: u64) {
        if count == 0 {
            return;
        }
        // The common case: the series exists, no lock of ours.
        if let Some(counter) = self.kernel_errors.get(labels) {
            counter.inc_by(count);
            return;
        }
        let mut series = lock(&self.kernel_series);
        let key = claim_key(labels);
        let known = series
            .by_claim
            .get(&key)
            .is_some_and(|set| set.contains(labels));
        if !known {
            if series.count >= self.max_series {
                self.dropped(KERNEL_ERRORS_NAME);
                return;
            }
            series
                .by_claim
                .entry(key)
                .or_default()
                .insert(labels.clone());
            series.count += 1;
        }
        // Created under our lock, so a concurrent removal cannot interleave.
        self.kernel_errors.get_or_create(labels).inc_by(count);
    }

    /// [`Metrics::kernel_errors`] for one collector record: `device_name` is
    /// the kernel's name for `e`'s device when the topology knows it,
    /// `volume` the claim it reached (None: no volume). The same
    /// once-per-claim rule applies.
    pub fn record_kernel_error(
        &self,
        e: &KernelError,
        device_name: Option<&str>,
        volume: Option<&VolumeRef>,
    ) {
        let labels = ErrorLabels {
            namespace: volume.map(|v| v.namespace.clone()).unwrap_or_default(),
            persistentvolumeclaim: volume.and_then(|v| v.pvc.clone()).unwrap_or_default(),
            persistentvolume: volume.and_then(|v| v.pv.clone()).unwrap_or_default(),
            device: device_name
                .map(str::to_string)
                .unwrap_or_else(|| Dev::from_kernel(e.key.dev).to_string()),
            source: source_name(e.key.source).to_string(),
            op: op_name(e.key.op).unwrap_or("").to_string(),
            errno: if e.key.errno == 0 {
                String::new()
            } else {
                errno_name(e.key.errno)
            },
        };
        self.kernel_errors(&labels, e.count);
    }

    /// Removes the kernel-error series of `volume`'s claim (namespace, PVC,
    /// PV; pod and volume name are ignored), so that claims which left the
    /// node do not hold series forever and eventually exhaust the cap. Call
    /// it only once no pod volume on this node uses the claim: a series
    /// removed and re-created restarts at zero, which Prometheus reads as a
    /// counter reset.
    pub fn remove_kernel_errors(&self, volume: &VolumeRef) {
        let key = (
            volume.namespace.clone(),
            volume.pvc.clone().unwrap_or_default(),
            volume.pv.clone().unwrap_or_default(),
        );
        let mut series = lock(&self.kernel_series);
        if let Some(set) = series.by_claim.remove(&key) {
            series.count = series.count.saturating_sub(set.len());
            for labels in &set {
                self.kernel_errors.remove(labels);
            }
        }
    }

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

    /// Removes every condition series of a volume that went away.
    pub fn remove_volume(&self, volume: &VolumeRef) {
        self.set_volume_conditions(volume, &[]);
    }

    /// Feeds the kernel's cumulative counters ([`crate::kernel::collector::Collector::kernel_stats`]);
    /// call it as often as convenient, each call adds what grew since the
    /// last. A value below the last one means the kernel maps were
    /// recreated (counting restarted at zero): the new value is all new, and
    /// the exported counters never go backwards.
    pub fn kernel_stats(&self, s: &KernelStats) {
        let mut last = lock(&self.last_stats);
        let prev = last.unwrap_or_default();
        for (counter, before, now) in [
            (
                &self.samples_suppressed,
                prev.samples_suppressed,
                s.samples_suppressed,
            ),
            (
                &self.ringbuf_lost_samples,
                prev.ringbuf_full,
                s.ringbuf_full,
            ),
            (
                &self.counter_map_full,
                prev.counter_map_full,
                s.counter_map_full,
            ),
            (
                &self.writeback_repeats_merged,
                prev.writeback_repeats,
                s.writeback_repeats,
            ),
            (
                &self.kernel_program_misses,
                prev.program_misses,
                s.program_misses,
            ),
        ] {
            let grown = if now >= before { now - before } else { now };
            if grown > 0 {
                counter.inc_by(grown);
            }
        }
        *last = Some(*s);
    }

    /// One Kubernetes API request: `code` is the HTTP status, None when no
    /// response came (connection refused, timeout).
    pub fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
        self.api_requests
            .get_or_create(&ApiLabels {
                verb: verb.to_string(),
                resource: resource.to_string(),
                code: code.map_or_else(|| "error".to_string(), |c| c.to_string()),
            })
            .inc();
    }

    /// One Event written (`Normal`/`Warning`, its reason).
    pub fn event_written(&self, type_: &str, reason: &str) {
        self.events_written
            .get_or_create(&EventLabels {
                r#type: type_.to_string(),
                reason: reason.to_string(),
            })
            .inc();
    }

    /// One Event write held back by the per-object budget.
    pub fn event_write_deferred(&self) {
        self.event_writes_deferred.inc();
    }

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

    /// How many pod volumes the agent watches now.
    pub fn set_volumes(&self, n: usize) {
        self.volumes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The OpenMetrics text exposition of every family, `# EOF` included.
    pub fn try_encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// [`Metrics::try_encode`]; encoding into a `String` with these label
    /// types cannot fail, but if it ever did the result is an empty, still
    /// valid exposition rather than a truncated one.
    pub fn encode(&self) -> String {
        self.try_encode().unwrap_or_else(|e| {
            tracing::error!(error = %e, "encoding metrics failed");
            "# EOF\n".to_string()
        })
    }

    fn dropped(&self, metric: &str) {
        self.series_dropped
            .get_or_create(&DroppedLabels {
                metric: metric.to_string(),
            })
            .inc();
    }
}

fn csi_histogram() -> Histogram {
    Histogram::new(CSI_DURATION_BUCKETS)
}

fn rpc_name(rpc: HealthSource) -> &'static str {
    match rpc {
        HealthSource::NodeGetVolumeHealth => "NodeGetVolumeHealth",
        HealthSource::NodeGetVolumeStats => "NodeGetVolumeStats",
    }
}

fn claim_key(l: &ErrorLabels) -> ClaimKey {
    (
        l.namespace.clone(),
        l.persistentvolumeclaim.clone(),
        l.persistentvolume.clone(),
    )
}

/// The data behind these locks stays consistent at every step, so a panic
/// elsewhere while one was held is no reason to stop exporting metrics.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use health_common::{op, source, CounterKey};
    use health_csi::HealthEntry;
    use health_csi::HealthStatus;

    use super::*;
    use crate::volumes::conditions::{Source, Status};
    use crate::volumes::kubelet::VolumeMode;
    use crate::volumes::VolumeKey;

    fn lines(m: &Metrics) -> Vec<String> {
        m.encode().lines().map(str::to_string).collect()
    }

    /// The sample lines of one family (no `#` lines), sorted.
    fn samples(m: &Metrics, name: &str) -> Vec<String> {
        let mut v: Vec<String> = lines(m)
            .into_iter()
            .filter(|l| {
                !l.starts_with('#')
                    && l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
            })
            .collect();
        v.sort();
        v
    }

    fn vol(pod: &str, volume: &str, pvc: Option<&str>, pv: Option<&str>) -> VolumeRef {
        VolumeRef {
            namespace: "ns1".into(),
            pod: pod.into(),
            volume: volume.into(),
            pvc: pvc.map(Into::into),
            pv: pv.map(Into::into),
        }
    }

    fn cond(status: Status, reason: &str) -> Condition {
        Condition {
            source: Source::Kernel,
            status,
            reason: reason.into(),
            message: "m".into(),
            since: SystemTime::UNIX_EPOCH,
            last_probe: SystemTime::UNIX_EPOCH,
            occurrences: None,
        }
    }

    fn err(dev: Dev, src: u8, o: u8, errno: u32, count: u64) -> KernelError {
        KernelError {
            key: CounterKey::new(dev.to_kernel(), src, o, errno),
            count,
            sample: None,
        }
    }

    #[test]
    fn kernel_errors_count_per_claim_and_device() {
        let m = Metrics::new();
        let v = vol("web-0", "pv-1", Some("data"), Some("pv-1"));
        let e = err(Dev::new(7, 3), source::BLOCK_RQ_ERROR, op::WRITE, 5, 30);
        m.record_kernel_error(&e, Some("loop3"), Some(&v));
        m.record_kernel_error(
            &KernelError {
                count: 7,
                ..e.clone()
            },
            Some("loop3"),
            Some(&v),
        );
        // Unnamed device, no volume, no op, no errno.
        m.record_kernel_error(
            &err(Dev::new(8, 16), source::EXT4_ERROR, 255, 0, 2),
            None,
            None,
        );
        // A zero count creates nothing.
        m.record_kernel_error(
            &err(Dev::new(9, 9), source::EXT4_ERROR, 255, 0, 0),
            None,
            None,
        );
        assert_eq!(
            samples(&m, "volume_health_kernel_errors_total"),
            [
                r#"volume_health_kernel_errors_total{namespace="",persistentvolumeclaim="",persistentvolume="",device="8:16",source="ext4_error",op="",errno=""} 2"#,
                r#"volume_health_kernel_errors_total{namespace="ns1",persistentvolumeclaim="data",persistentvolume="pv-1",device="loop3",source="block_rq_error",op="write",errno="EIO"} 37"#,
            ]
        );
        let all = lines(&m);
        assert!(all.contains(&"# TYPE volume_health_kernel_errors counter".to_string()));
        assert_eq!(all.last().map(String::as_str), Some("# EOF"));
    }

    #[test]
    fn kernel_errors_of_a_claim_are_removed_exactly() {
        let m = Metrics::new();
        let a = vol("a-0", "pv-a", Some("a"), Some("pv-a"));
        let b = vol("b-0", "pv-b", Some("b"), Some("pv-b"));
        let e = err(Dev::new(7, 1), source::BLOCK_RQ_ERROR, op::READ, 5, 1);
        m.record_kernel_error(&e, Some("loop1"), Some(&a));
        m.record_kernel_error(
            &err(Dev::new(7, 1), source::BLOCK_RQ_ERROR, op::WRITE, 5, 1),
            Some("loop1"),
            Some(&a),
        );
        m.record_kernel_error(&e, Some("loop2"), Some(&b));
        // Another pod of the same claim names the same series.
        m.remove_kernel_errors(&vol("a-1", "pv-a", Some("a"), Some("pv-a")));
        assert_eq!(
            samples(&m, "volume_health_kernel_errors_total"),
            [
                r#"volume_health_kernel_errors_total{namespace="ns1",persistentvolumeclaim="b",persistentvolume="pv-b",device="loop2",source="block_rq_error",op="read",errno="EIO"} 1"#
            ]
        );
        // Re-created from zero.
        m.record_kernel_error(&e, Some("loop1"), Some(&a));
        assert!(samples(&m, "volume_health_kernel_errors_total").contains(
            &r#"volume_health_kernel_errors_total{namespace="ns1",persistentvolumeclaim="a",persistentvolume="pv-a",device="loop1",source="block_rq_error",op="read",errno="EIO"} 1"#.to_string()
        ));
    }

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

    #[test]
    fn kernel_stats_add_deltas_and_never_go_backwards() {
        let m = Metrics::new();
        let stats = |suppressed, ring, full, wb| KernelStats {
            samples_suppressed: suppressed,
            ringbuf_full: ring,
            counter_map_full: full,
            writeback_repeats: wb,
            late_samples: 99,
            program_misses: wb + 1,
        };
        let values = |m: &Metrics| {
            [
                "volume_health_samples_suppressed_total",
                "volume_health_ringbuf_lost_samples_total",
                "volume_health_counter_map_full_total",
                "volume_health_writeback_repeats_merged_total",
                "volume_health_kernel_program_misses_total",
            ]
            .map(|n| samples(m, n))
        };
        m.kernel_stats(&stats(10, 3, 0, 1));
        m.kernel_stats(&stats(10, 5, 0, 4));
        assert_eq!(
            values(&m),
            [
                ["volume_health_samples_suppressed_total 10"],
                ["volume_health_ringbuf_lost_samples_total 5"],
                ["volume_health_counter_map_full_total 0"],
                ["volume_health_writeback_repeats_merged_total 4"],
                ["volume_health_kernel_program_misses_total 5"],
            ]
        );
        // The maps were recreated: counting restarted, nothing is taken back.
        m.kernel_stats(&stats(2, 0, 1, 3));
        assert_eq!(
            values(&m),
            [
                ["volume_health_samples_suppressed_total 12"],
                ["volume_health_ringbuf_lost_samples_total 5"],
                ["volume_health_counter_map_full_total 1"],
                ["volume_health_writeback_repeats_merged_total 7"],
                ["volume_health_kernel_program_misses_total 9"],
            ]
        );
        // Deltas continue from the restarted values.
        m.kernel_stats(&stats(3, 0, 1, 3));
        assert_eq!(
            values(&m),
            [
                ["volume_health_samples_suppressed_total 13"],
                ["volume_health_ringbuf_lost_samples_total 5"],
                ["volume_health_counter_map_full_total 1"],
                ["volume_health_writeback_repeats_merged_total 7"],
                ["volume_health_kernel_program_misses_total 9"],
            ]
        );
    }

    #[test]
    fn series_beyond_the_cap_are_dropped_and_counted() {
        let m = Metrics::with_max_series(2);
        let e = |d: u32| err(Dev::new(7, d), source::BLOCK_RQ_ERROR, op::READ, 5, 1);
        m.record_kernel_error(&e(1), None, None);
        m.record_kernel_error(&e(2), None, None);
        m.record_kernel_error(&e(3), None, None);
        m.record_kernel_error(&e(4), None, None);
        // Existing series keep counting at the cap.
        m.record_kernel_error(&e(1), None, None);
        let errors = samples(&m, "volume_health_kernel_errors_total");
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[0].contains(r#"device="7:1""#) && errors[0].ends_with(" 2"));
        assert!(errors[1].contains(r#"device="7:2""#) && errors[1].ends_with(" 1"));

        let v = |pod: &str| vol(pod, "pv", Some("c"), Some("pv"));
        let two = [cond(Status::Degraded, "A"), cond(Status::Degraded, "B")];
        m.set_volume_conditions(&v("p1"), &two);
        m.set_volume_conditions(&v("p2"), &two);
        assert_eq!(samples(&m, "volume_health_volume_condition").len(), 2);
        assert_eq!(
            samples(&m, "volume_health_metric_series_dropped_total"),
            [
                r#"volume_health_metric_series_dropped_total{metric="volume_health_kernel_errors_total"} 2"#,
                r#"volume_health_metric_series_dropped_total{metric="volume_health_volume_condition"} 2"#,
            ]
        );
        // Room again: p2's conditions, refused before, are created on its
        // next update, and removing it removes exactly them.
        m.remove_volume(&v("p1"));
        m.set_volume_conditions(&v("p2"), &two);
        let conds = samples(&m, "volume_health_volume_condition");
        assert_eq!(conds.len(), 2);
        assert!(conds.iter().all(|l| l.contains(r#"pod="p2""#)), "{conds:?}");
        m.remove_volume(&v("p2"));
        assert_eq!(
            samples(&m, "volume_health_volume_condition"),
            Vec::<String>::new()
        );
    }

    #[test]
    fn removing_kernel_errors_frees_room_under_the_cap() {
        let m = Metrics::with_max_series(1);
        let v = vol("p", "pv-a", Some("a"), Some("pv-a"));
        let e = err(Dev::new(7, 1), source::BLOCK_RQ_ERROR, op::READ, 5, 1);
        m.record_kernel_error(&e, Some("loop1"), Some(&v));
        m.record_kernel_error(&e, Some("loop1"), None);
        assert_eq!(samples(&m, "volume_health_kernel_errors_total").len(), 1);
        m.remove_kernel_errors(&v);
        m.record_kernel_error(&e, Some("loop1"), None);
        assert_eq!(
            samples(&m, "volume_health_kernel_errors_total"),
            [
                r#"volume_health_kernel_errors_total{namespace="",persistentvolumeclaim="",persistentvolume="",device="loop1",source="block_rq_error",op="read",errno="EIO"} 1"#
            ]
        );
    }

    #[test]
    fn agent_counters_and_gauges() {
        let m = Metrics::new();
        m.api_request("patch", "events", Some(200));
        m.api_request("patch", "events", Some(200));
        m.api_request("create", "events", None);
        m.event_written("Warning", "BlockIOErrors");
        m.event_write_deferred();
        m.event_write_deferred();
        m.set_volumes(42);
        assert_eq!(
            samples(&m, "volume_health_api_requests_total"),
            [
                r#"volume_health_api_requests_total{verb="create",resource="events",code="error"} 1"#,
                r#"volume_health_api_requests_total{verb="patch",resource="events",code="200"} 2"#,
            ]
        );
        assert_eq!(
            samples(&m, "volume_health_events_written_total"),
            [r#"volume_health_events_written_total{type="Warning",reason="BlockIOErrors"} 1"#]
        );
        assert_eq!(
            samples(&m, "volume_health_event_writes_deferred_total"),
            ["volume_health_event_writes_deferred_total 2"]
        );
        assert_eq!(
            samples(&m, "volume_health_volumes"),
            ["volume_health_volumes 42"]
        );
        assert_eq!(
            samples(&m, "volume_health_build_info"),
            [format!(
                r#"volume_health_build_info{{version="{}"}} 1"#,
                env!("CARGO_PKG_VERSION")
            )]
        );
    }

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
        assert_eq!(
            samples(&m, "volume_health_csi_probes_total"),
            [
                r#"volume_health_csi_probes_total{driver="d.csi",rpc="",result="failed"} 1"#,
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
    fn metrics_are_shareable() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Metrics>();
    }
}
