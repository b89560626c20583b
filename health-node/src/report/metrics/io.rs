//! Pod volumes' I/O from the kernel side: the bios waiting on each volume
//! now and how long the oldest has (`--stall-after`), and a histogram of
//! each volume's read and write completion latency (`--latency-window`).
//! A volume's series exist while it is watched with the feature on; capped,
//! like the condition series, at the agent's series cap (per family).

use std::collections::HashSet;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use health_common::{latency_bucket, op, LATENCY_BUCKETS};
use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::{MetricType, TypedMetric};

use super::{lock, Metrics, VolumeRef};
use crate::volumes::io::VolumeIo;

pub(super) const WAITING_NAME: &str = "volume_health_volume_io_waiting";

/// Upper bounds of the latency histogram's buckets, in microseconds: every
/// fourth bound of the kernel's buckets (two per power of two), 64 µs to
/// 4.2 s, so each bound is exact and a kernel bucket never straddles one.
/// Ten buckets per volume and op rather than the kernel's 48: the series
/// cost every Prometheus that scrapes the agent.
pub const LATENCY_BOUNDS_US: [u64; 9] = [
    64, 256, 1_024, 4_096, 16_384, 65_536, 262_144, 1_048_576, 4_194_304,
];

/// Labels of a volume's series; `volume` is the pod's name for it
/// (`spec.volumes[].name`: two inline volumes of a pod have neither claim
/// nor PV).
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct IoLabels {
    namespace: String,
    pod: String,
    volume: String,
    persistentvolumeclaim: String,
    persistentvolume: String,
}

/// [`IoLabels`] and an operation.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct IoOpLabels {
    #[prometheus(flatten)]
    volume: IoLabels,
    op: &'static str,
}

impl IoLabels {
    fn of(v: &VolumeRef) -> Self {
        IoLabels {
            namespace: v.namespace.clone(),
            pod: v.pod.clone(),
            volume: v.volume.clone(),
            persistentvolumeclaim: v.pvc.clone().unwrap_or_default(),
            persistentvolume: v.pv.clone().unwrap_or_default(),
        }
    }

    fn op(&self, op: &'static str) -> IoOpLabels {
        IoOpLabels {
            volume: self.clone(),
            op,
        }
    }
}

pub(super) type SecondsGauge = Gauge<f64, AtomicU64>;

/// The volumes holding I/O series, for the cap and for removal.
#[derive(Default)]
pub(super) struct IoSeries {
    volumes: HashSet<VolumeRef>,
}

/// A histogram filled a window at a time with counts the kernel already
/// bucketed, and their exact sum. prometheus-client's `Histogram` takes one
/// observation at a time: the kernel side keeps counts, not latencies.
#[derive(Clone, Debug, Default)]
pub(super) struct KernelHistogram(Arc<Mutex<Counts>>);

#[derive(Debug, Default)]
struct Counts {
    /// Per bound of [`LATENCY_BOUNDS_US`], then `+Inf`; not cumulative.
    buckets: [u64; LATENCY_BOUNDS_US.len() + 1],
    sum_ns: u64,
}

impl KernelHistogram {
    fn add(&self, kernel: &[u64; LATENCY_BUCKETS], sum_ns: u64) {
        let mut c = lock(&self.0);
        for (b, &n) in kernel.iter().enumerate() {
            c.buckets[bound_of(b)] += n;
        }
        c.sum_ns = c.sum_ns.saturating_add(sum_ns);
    }
}

/// The histogram bucket of kernel bucket `b`: the first bound its whole
/// range lies below.
fn bound_of(b: usize) -> usize {
    LATENCY_BOUNDS_US
        .iter()
        .position(|&us| b < latency_bucket(us))
        .unwrap_or(LATENCY_BOUNDS_US.len())
}

impl TypedMetric for KernelHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for KernelHistogram {
    fn encode(&self, mut encoder: MetricEncoder<'_>) -> Result<(), std::fmt::Error> {
        let (buckets, sum_ns) = {
            let c = lock(&self.0);
            (c.buckets, c.sum_ns)
        };
        let bounds = LATENCY_BOUNDS_US
            .iter()
            .map(|&us| us as f64 / 1e6)
            .chain([f64::INFINITY]);
        let buckets: Vec<(f64, u64)> = bounds.zip(buckets).collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        encoder.encode_histogram::<NoLabelSet>(sum_ns as f64 / 1e9, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

fn op_name(op: u8) -> &'static str {
    match op {
        op::READ => "read",
        op::WRITE => "write",
        _ => "other",
    }
}

impl Metrics {
    /// What one stall poll or latency window saw on `volume`: the waiting
    /// gauges set, or the window's completions added to its histogram.
    pub fn observe_io(&self, volume: &VolumeRef, io: &VolumeIo) {
        {
            let mut series = lock(&self.io_series);
            if !series.volumes.contains(volume) {
                // Up to three label sets per volume in the waiting family.
                if series.volumes.len() * 3 >= self.max_series {
                    self.dropped(WAITING_NAME);
                    return;
                }
                series.volumes.insert(volume.clone());
            }
        }
        let labels = IoLabels::of(volume);
        match io {
            VolumeIo::Waiting {
                reads,
                writes,
                other,
                oldest,
            } => {
                for (op, n) in [("read", reads), ("write", writes), ("other", other)] {
                    self.io_waiting
                        .get_or_create(&labels.op(op))
                        .set(i64::from(*n));
                }
                self.io_oldest_wait
                    .get_or_create(&labels)
                    .set(oldest.as_secs_f64());
            }
            VolumeIo::Latency {
                op,
                buckets,
                sum_ns,
            } => self
                .io_latency
                .get_or_create(&labels.op(op_name(*op)))
                .add(buckets, *sum_ns),
        }
    }

    /// Removes the I/O series of a volume that went away.
    pub(super) fn remove_io(&self, volume: &VolumeRef) {
        if !lock(&self.io_series).volumes.remove(volume) {
            return;
        }
        let labels = IoLabels::of(volume);
        self.io_oldest_wait.remove(&labels);
        for op in ["read", "write", "other"] {
            self.io_waiting.remove(&labels.op(op));
            self.io_latency.remove(&labels.op(op));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::tests::{samples, vol};
    use super::*;

    #[test]
    fn each_kernel_bucket_falls_under_the_first_bound_above_its_range() {
        // 63 µs is below 64 (bucket 11), 64 µs is not (bucket 12).
        assert_eq!(bound_of(latency_bucket(63)), 0);
        assert_eq!(bound_of(latency_bucket(64)), 1);
        assert_eq!(bound_of(latency_bucket(4_194_303)), 8);
        assert_eq!(bound_of(latency_bucket(4_194_304)), 9);
        assert_eq!(bound_of(LATENCY_BUCKETS - 1), 9);
    }

    #[test]
    fn waiting_and_latency_series_follow_the_volume_and_go_with_it() {
        let m = Metrics::new();
        let v = vol("web-0", "pv-1", Some("data"), Some("pv-1"));
        let labels = r#"namespace="ns1",pod="web-0",volume="pv-1",persistentvolumeclaim="data",persistentvolume="pv-1""#;
        m.observe_io(
            &v,
            &VolumeIo::Waiting {
                reads: 0,
                writes: 3,
                other: 1,
                oldest: Duration::from_millis(12_500),
            },
        );
        let mut kernel = [0; LATENCY_BUCKETS];
        kernel[latency_bucket(40)] = 5; // under 64 µs
        kernel[latency_bucket(70_000)] = 2; // 65.5 ms to 262 ms
        let window = VolumeIo::Latency {
            op: op::WRITE,
            buckets: Box::new(kernel),
            sum_ns: 140_200_000,
        };
        // Two windows: the second adds to the first.
        m.observe_io(&v, &window);
        m.observe_io(&v, &window);
        assert_eq!(
            samples(&m, "volume_health_volume_io_waiting"),
            [
                format!(r#"volume_health_volume_io_waiting{{{labels},op="other"}} 1"#),
                format!(r#"volume_health_volume_io_waiting{{{labels},op="read"}} 0"#),
                format!(r#"volume_health_volume_io_waiting{{{labels},op="write"}} 3"#),
            ]
        );
        assert_eq!(
            samples(&m, "volume_health_volume_io_oldest_wait_seconds"),
            [format!(
                r#"volume_health_volume_io_oldest_wait_seconds{{{labels}}} 12.5"#
            )]
        );
        let latency = samples(&m, "volume_health_volume_io_latency_seconds_bucket");
        let le = |bound: &str, n: u64| {
            format!(
                r#"volume_health_volume_io_latency_seconds_bucket{{le="{bound}",{labels},op="write"}} {n}"#
            )
        };
        for want in [
            le("0.000064", 10),
            le("0.065536", 10),
            le("0.262144", 14),
            le("+Inf", 14),
        ] {
            assert!(latency.contains(&want), "{want} not in {latency:#?}");
        }
        assert_eq!(latency.len(), 10);
        assert_eq!(
            samples(&m, "volume_health_volume_io_latency_seconds_sum"),
            [format!(
                r#"volume_health_volume_io_latency_seconds_sum{{{labels},op="write"}} 0.2804"#
            )]
        );
        assert_eq!(
            samples(&m, "volume_health_volume_io_latency_seconds_count"),
            [format!(
                r#"volume_health_volume_io_latency_seconds_count{{{labels},op="write"}} 14"#
            )]
        );

        m.remove_volume(&v);
        for family in [
            "volume_health_volume_io_waiting",
            "volume_health_volume_io_oldest_wait_seconds",
            "volume_health_volume_io_latency_seconds_count",
        ] {
            assert_eq!(samples(&m, family), Vec::<String>::new(), "{family}");
        }
    }

    #[test]
    fn volumes_beyond_the_cap_get_no_io_series_and_are_counted() {
        let m = Metrics::with_max_series(6);
        let idle = VolumeIo::Waiting {
            reads: 0,
            writes: 0,
            other: 0,
            oldest: Duration::ZERO,
        };
        for pod in ["p1", "p2", "p3"] {
            m.observe_io(&vol(pod, "pv", Some("c"), Some("pv")), &idle);
        }
        assert_eq!(samples(&m, "volume_health_volume_io_waiting").len(), 6);
        assert_eq!(
            samples(&m, "volume_health_metric_series_dropped_total"),
            [
                r#"volume_health_metric_series_dropped_total{metric="volume_health_volume_io_waiting"} 1"#
            ]
        );
    }
}
