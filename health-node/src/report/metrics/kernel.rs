//! Kernel errors per claim and device (`volume_health_kernel_errors_total`,
//! capped with exact removal per claim), and the kernel side's own counters
//! turned from cumulative values into deltas.

use std::collections::{HashMap, HashSet};

use health_core::conditions::errno_name;
use health_core::dev::Dev;
use health_kernel::collector::{KernelError, KernelStats};
use health_kernel::names::{op_name, source_name};
use prometheus_client::encoding::EncodeLabelSet;

use super::{lock, Metrics, VolumeRef};

const KERNEL_ERRORS_NAME: &str = "volume_health_kernel_errors_total";

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

/// The claim part of [`ErrorLabels`]: what [`Metrics::remove_kernel_errors`]
/// removes by.
type ClaimKey = (String, String, String);

/// Which kernel-error series exist, per claim: for exact removal and an
/// exact cap.
#[derive(Default)]
pub(super) struct KernelSeries {
    by_claim: HashMap<ClaimKey, HashSet<ErrorLabels>>,
    count: usize,
}

impl Metrics {
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
                errno_name(e.key.errno as i32)
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

    /// Feeds the kernel's cumulative counters ([`health_kernel::collector::Collector::kernel_stats`]);
    /// call it as often as convenient, each call adds what grew since the
    /// last. A value below the last one means the kernel maps were
    /// recreated (counting restarted at zero): the new value is all new, and
    /// the exported counters never go backwards.
    pub fn kernel_stats(&self, s: &KernelStats) {
        let mut last = lock(&self.last_stats);
        let prev = last.unwrap_or_default();
        let bad_records = self.input_error_counter("ringbuf");
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
            (&self.kernel_uncounted_errors, prev.uncounted, s.uncounted),
            (
                &self.bio_errors_passed_up,
                prev.bio_propagated,
                s.bio_propagated,
            ),
            (&bad_records, prev.bad_records, s.bad_records),
        ] {
            let grown = if now >= before { now - before } else { now };
            if grown > 0 {
                counter.inc_by(grown);
            }
        }
        *last = Some(*s);
    }
}

fn claim_key(l: &ErrorLabels) -> ClaimKey {
    (
        l.namespace.clone(),
        l.persistentvolumeclaim.clone(),
        l.persistentvolume.clone(),
    )
}

#[cfg(test)]
mod tests {
    use health_common::{op, source};

    use super::super::tests::{err, lines, samples, vol};
    use super::*;

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
    fn kernel_stats_add_deltas_and_never_go_backwards() {
        let m = Metrics::new();
        let stats = |suppressed, ring, full, wb| KernelStats {
            samples_suppressed: suppressed,
            ringbuf_full: ring,
            counter_map_full: full,
            writeback_repeats: wb,
            bio_propagated: 0,
            waiting_full: 0,
            latency_full: 0,
            late_samples: 99,
            program_misses: wb + 1,
            bad_records: 0,
            traced: Some(100),
            uncounted: ring * 2,
        };
        let values = |m: &Metrics| {
            [
                "volume_health_samples_suppressed_total",
                "volume_health_ringbuf_lost_samples_total",
                "volume_health_counter_map_full_total",
                "volume_health_writeback_repeats_merged_total",
                "volume_health_kernel_program_misses_total",
                "volume_health_kernel_uncounted_errors_total",
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
                ["volume_health_kernel_uncounted_errors_total 10"],
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
                ["volume_health_kernel_uncounted_errors_total 10"],
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
                ["volume_health_kernel_uncounted_errors_total 10"],
            ]
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
}
