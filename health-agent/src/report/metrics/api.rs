//! The agent's own Kubernetes API traffic: requests by verb, resource and
//! status, Events written, and Event writes the per-object budget held back.

use prometheus_client::encoding::EncodeLabelSet;

use super::Metrics;

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct ApiLabels {
    verb: String,
    resource: String,
    code: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
pub(super) struct EventLabels {
    r#type: String,
    reason: String,
}

impl Metrics {
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
}

#[cfg(test)]
mod tests {
    use super::super::tests::samples;
    use super::*;

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
}
