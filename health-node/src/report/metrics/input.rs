//! `volume_health_input_errors_total{source}`: outside input the agent
//! skipped as malformed under its bad-line policies (docs/security.md,
//! "Input handling"): mountinfo lines, sysfs attribute values, ring-buffer records.
//! A format the agent does not understand then shows as a rate instead of
//! as silently missing mounts or devices.

use health_topology::InputErrors;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;

use super::Metrics;

/// Every `source` value, each series created at start (0 until it counts).
pub(super) const SOURCES: [&str; 3] = ["mountinfo", "sysfs", "ringbuf"];

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct InputLabels {
    source: String,
}

impl InputLabels {
    pub(super) fn of(source: &str) -> Self {
        Self {
            source: source.to_string(),
        }
    }
}

impl Metrics {
    /// What one topology scan skipped (see [`InputErrors`]).
    pub fn input_errors(&self, e: &InputErrors) {
        for (source, n) in [("mountinfo", e.mountinfo_lines), ("sysfs", e.sysfs_values)] {
            if n > 0 {
                self.input_error_counter(source).inc_by(n as u64);
            }
        }
    }

    pub(super) fn input_error_counter(&self, source: &str) -> Counter {
        self.input_errors
            .get_or_create(&InputLabels::of(source))
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use health_kernel::collector::KernelStats;

    use super::super::tests::samples;
    use super::*;

    #[test]
    fn skipped_input_is_counted_per_source() {
        let m = Metrics::new();
        let name = "volume_health_input_errors_total";
        assert_eq!(
            samples(&m, name),
            [
                r#"volume_health_input_errors_total{source="mountinfo"} 0"#,
                r#"volume_health_input_errors_total{source="ringbuf"} 0"#,
                r#"volume_health_input_errors_total{source="sysfs"} 0"#,
            ]
        );
        m.input_errors(&InputErrors {
            mountinfo_lines: 2,
            sysfs_values: 0,
        });
        m.input_errors(&InputErrors {
            mountinfo_lines: 1,
            sysfs_values: 4,
        });
        // Ring-buffer records arrive as a cumulative kernel stat.
        let stats = |bad_records| KernelStats {
            bad_records,
            ..KernelStats::default()
        };
        m.kernel_stats(&stats(3));
        m.kernel_stats(&stats(5));
        assert_eq!(
            samples(&m, name),
            [
                r#"volume_health_input_errors_total{source="mountinfo"} 3"#,
                r#"volume_health_input_errors_total{source="ringbuf"} 5"#,
                r#"volume_health_input_errors_total{source="sysfs"} 4"#,
            ]
        );
    }
}
