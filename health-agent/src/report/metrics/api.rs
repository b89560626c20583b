//! The agent's own Kubernetes API traffic: requests by verb, resource and
//! status, Events written, and Event writes the per-object budget held back.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::Metrics;

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

/// The API traffic families, the same for the node agent and the
/// controller (each registers them under its own prefix).
#[derive(Clone, Debug, Default)]
pub struct ApiMetrics {
    api_requests: Family<ApiLabels, Counter>,
    events_written: Family<EventLabels, Counter>,
    event_writes_deferred: Counter,
}

impl ApiMetrics {
    /// Families are handles: the registry's clones and ours share state.
    pub fn register(&self, r: &mut Registry) {
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
}

impl Metrics {
    /// See [`ApiMetrics::api_request`].
    pub fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
        self.api.api_request(verb, resource, code);
    }

    /// See [`ApiMetrics::event_written`].
    pub fn event_written(&self, type_: &str, reason: &str) {
        self.api.event_written(type_, reason);
    }

    /// See [`ApiMetrics::event_write_deferred`].
    pub fn event_write_deferred(&self) {
        self.api.event_write_deferred();
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
