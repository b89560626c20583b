//! A component's own Kubernetes API traffic: requests by verb, resource and
//! status, Events written, and Event writes the per-object budget held back.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

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

#[cfg(test)]
mod tests {
    use prometheus_client::encoding::text::encode;

    use super::*;

    #[test]
    fn requests_events_and_deferred_writes_are_counted_by_label() {
        let m = ApiMetrics::default();
        let mut registry = Registry::with_prefix("volume_health");
        m.register(&mut registry);
        m.api_request("patch", "events", Some(200));
        m.api_request("patch", "events", Some(200));
        m.api_request("create", "events", None);
        m.event_written("Warning", "BlockIOErrors");
        m.event_write_deferred();
        m.event_write_deferred();
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        // Label sets come out in hash order: compared sorted.
        let mut samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        samples.sort_unstable();
        assert_eq!(
            samples,
            [
                r#"volume_health_api_requests_total{verb="create",resource="events",code="error"} 1"#,
                r#"volume_health_api_requests_total{verb="patch",resource="events",code="200"} 2"#,
                "volume_health_event_writes_deferred_total 2",
                r#"volume_health_events_written_total{type="Warning",reason="BlockIOErrors"} 1"#,
            ]
        );
    }
}
