//! Prometheus metrics: what the kernel reported per claim and device, which
//! volume conditions are active, and how the agent itself is doing. One file
//! per group of families (kernel, volumes, api, csi, input); uses
//! `health_kernel`, [`crate::volumes`] and `health_kube`'s API families,
//! never [`crate::cluster`].
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

use std::sync::{Mutex, MutexGuard};

use health_kernel::collector::KernelStats;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Registry, Unit};

mod api;
mod csi;
mod input;
mod io;
mod kernel;
mod volumes;

use csi::{csi_histogram, CsiLabels, DriverLabels, StorageLabels};
use health_kube::events::StatusFollower;
use health_kube::metrics::ApiMetrics;
use input::InputLabels;
pub use io::LATENCY_BOUNDS_US;
use io::{IoLabels, IoOpLabels, IoSeries, KernelHistogram, SecondsGauge};
pub use kernel::ErrorLabels;
use kernel::KernelSeries;
pub use volumes::VolumeRef;
use volumes::{ConditionLabels, ConditionSeries};

/// Default cap on label sets per capped family (kernel errors, volume
/// conditions). Each series costs memory here and in every Prometheus that
/// scrapes the agent, and these labels come from outside the agent: claim
/// names churn with workloads, condition reasons are whatever a CSI driver
/// sends. Ten thousand is far above a node's real needs (a few hundred
/// volumes, a handful of devices and reasons each) and still small enough
/// that a runaway cannot hurt the node or the monitoring system.
pub const MAX_SERIES: usize = 10_000;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct VersionLabels {
    version: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DroppedLabels {
    /// The full name of the family that refused a new label set.
    metric: String,
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
    kernel_uncounted_errors: Counter,
    bio_errors_passed_up: Counter,
    input_errors: Family<InputLabels, Counter>,
    /// The last cumulative stats seen, for deltas.
    last_stats: Mutex<Option<KernelStats>>,

    api: ApiMetrics,
    csi_probes: Family<CsiLabels, Counter>,
    csi_probe_duration: Family<DriverLabels, Histogram, fn() -> Histogram>,
    csi_storage_probes: Family<StorageLabels, Counter>,
    volumes: Gauge,
    io_waiting: Family<IoOpLabels, Gauge>,
    io_oldest_wait: Family<IoLabels, SecondsGauge>,
    io_latency: Family<IoOpLabels, KernelHistogram>,
    io_series: Mutex<IoSeries>,
    /// `/readyz` and `/healthz` as of the last scrape ([`Metrics::set_health`]).
    ready: Gauge,
    live: Gauge,
    /// Not a metric: the `VolumeHealth` writer reports its writes to this
    /// observer, and the recovery Events on claims wait for them
    /// ([`health_kube::events::StatusFollower`], see `api.rs`).
    status: StatusFollower,
}

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
            kernel_uncounted_errors: Counter::default(),
            bio_errors_passed_up: Counter::default(),
            input_errors: Family::default(),
            last_stats: Mutex::default(),
            api: ApiMetrics::default(),
            csi_probes: Family::default(),
            csi_probe_duration: Family::new_with_constructor(csi_histogram),
            csi_storage_probes: Family::default(),
            volumes: Gauge::default(),
            io_waiting: Family::default(),
            io_oldest_wait: Family::default(),
            io_latency: Family::default(),
            io_series: Mutex::default(),
            ready: Gauge::default(),
            live: Gauge::default(),
            status: StatusFollower::default(),
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
            "kernel_uncounted_errors",
            "Failed block requests the kernel's tracer saw that none of the agent's programs counted (the kernel ran none for them): errors not in any count",
            self.kernel_uncounted_errors.clone(),
        );
        r.register(
            "bio_errors_passed_up",
            "Failed bios of a dm/md device that carried up the failure of a request below, counted there and not again",
            self.bio_errors_passed_up.clone(),
        );
        r.register(
            "input_errors",
            "Malformed outside input skipped under the bad-line policy, per source (mountinfo lines, sysfs values, ring-buffer records)",
            self.input_errors.clone(),
        );
        for source in input::SOURCES {
            self.input_errors
                .get_or_create(&InputLabels::of(source))
                .inc_by(0);
        }
        self.api.register(&mut r);
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
            "csi_storage_probes",
            "CSI NodeGetStorageHealth calls by driver and result",
            self.csi_storage_probes.clone(),
        );
        r.register(
            "volumes",
            "Pod volumes on this node the agent watches",
            self.volumes.clone(),
        );
        r.register(
            "volume_io_waiting",
            "Bios waiting now on a pod volume's device, per operation (read, write, other), as of the last stall poll",
            self.io_waiting.clone(),
        );
        r.register_with_unit(
            "volume_io_oldest_wait",
            "How long the oldest bio still waiting on a pod volume's device has waited (0 when none), as of the last stall poll",
            Unit::Seconds,
            self.io_oldest_wait.clone(),
        );
        r.register_with_unit(
            "volume_io_latency",
            "Completion latency of a pod volume's reads and writes, from submission to completion on its device",
            Unit::Seconds,
            self.io_latency.clone(),
        );
        // Readiness as a series, so that an alert can say which agent is not
        // ready: the kubelet's probe results are not metrics of their own.
        r.register(
            "ready",
            "1 when /readyz succeeds (kernel programs attached, first pod and PV lists in), else 0; as of the scrape",
            self.ready.clone(),
        );
        r.register(
            "live",
            "1 when /healthz succeeds (the main loop turned recently), else 0; as of the scrape",
            self.live.clone(),
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

    /// What `/healthz` (`live`) and `/readyz` (`ready`) would answer now;
    /// the HTTP server calls it before each scrape
    /// ([`health_kube::http::Exposition::observe_health`]).
    pub fn set_health(&self, live: bool, ready: bool) {
        self.live.set(i64::from(live));
        self.ready.set(i64::from(ready));
    }

    fn dropped(&self, metric: &str) {
        self.series_dropped
            .get_or_create(&DroppedLabels {
                metric: metric.to_string(),
            })
            .inc();
    }
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
    use health_core::conditions::{Condition, Source, Status};
    use health_core::dev::Dev;
    use health_kernel::collector::KernelError;

    use super::*;

    pub(super) fn lines(m: &Metrics) -> Vec<String> {
        m.encode().lines().map(str::to_string).collect()
    }

    /// The sample lines of one family (no `#` lines), sorted.
    pub(super) fn samples(m: &Metrics, name: &str) -> Vec<String> {
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

    pub(super) fn vol(pod: &str, volume: &str, pvc: Option<&str>, pv: Option<&str>) -> VolumeRef {
        VolumeRef {
            namespace: "ns1".into(),
            pod: pod.into(),
            volume: volume.into(),
            pvc: pvc.map(Into::into),
            pv: pv.map(Into::into),
        }
    }

    pub(super) fn cond(status: Status, reason: &str) -> Condition {
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

    pub(super) fn err(dev: Dev, src: u8, o: u8, errno: u32, count: u64) -> KernelError {
        KernelError {
            key: CounterKey::new(dev.to_kernel(), src, o, errno),
            count,
            sample: None,
        }
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
    fn metrics_are_shareable() {
        fn shareable<T: Send + Sync>() {}
        shareable::<Metrics>();
    }
}
