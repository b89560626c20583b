//! The node agent's Kubernetes API traffic families
//! ([`health_kube::metrics::ApiMetrics`]), and how the Event writer, the
//! `VolumeHealth` writer and the HTTP endpoint of `health_kube` reach this
//! crate's [`Metrics`].

use health_kube::events::StatusFollower;
use health_kube::http::{Exposition, Health};
use health_kube::observer::Observer;
use health_kube::status::{Claim, SourceEntry};

use super::Metrics;

impl Metrics {
    /// See [`health_kube::metrics::ApiMetrics::api_request`].
    pub fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
        self.api.api_request(verb, resource, code);
    }

    /// See [`health_kube::metrics::ApiMetrics::event_written`].
    pub fn event_written(&self, type_: &str, reason: &str) {
        self.api.event_written(type_, reason);
    }

    /// See [`health_kube::metrics::ApiMetrics::event_write_deferred`].
    pub fn event_write_deferred(&self) {
        self.api.event_write_deferred();
    }

    /// Where the `VolumeHealth` writes' results go: cluster mode points it
    /// at its Event recorder, whose recoveries on claims wait for them.
    pub fn status_follower(&self) -> &StatusFollower {
        &self.status
    }
}

impl Observer for Metrics {
    fn api_request(&self, verb: &str, resource: &str, code: Option<u16>) {
        Metrics::api_request(self, verb, resource, code)
    }
    fn event_written(&self, type_: &str, reason: &str) {
        Metrics::event_written(self, type_, reason)
    }
    fn event_write_deferred(&self) {
        Metrics::event_write_deferred(self)
    }
    fn volume_health_written(&self, claim: &Claim, entries: Option<&[SourceEntry]>) {
        self.status.written(claim, entries);
    }
}

impl Exposition for Metrics {
    fn try_encode(&self) -> Result<String, std::fmt::Error> {
        Metrics::try_encode(self)
    }

    /// Taken at the scrape, so the series says exactly what the probes
    /// would answer at that moment, with no state kept in step elsewhere.
    fn observe_health(&self, health: &Health) {
        self.set_health(health.liveness().is_ok(), health.readiness().is_ok());
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
