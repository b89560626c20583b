//! The Prometheus Operator kinds the chart renders (monitoring.coreos.com/v1),
//! with exactly the fields the chart uses: an unknown or misspelt field
//! fails to parse (`deny_unknown_fields`), and `deploy_common::typed` checks that
//! nothing was dropped on the way.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Object<Spec> {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: Spec,
}

pub type ServiceMonitor = Object<ServiceMonitorSpec>;
pub type PodMonitor = Object<PodMonitorSpec>;
pub type PrometheusRule = Object<RuleSpec>;

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    pub selector: LabelSelector,
    pub endpoints: Vec<Endpoint>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodMonitorSpec {
    pub selector: LabelSelector,
    pub pod_metrics_endpoints: Vec<Endpoint>,
}

/// A ServiceMonitor endpoint or a PodMonitor podMetricsEndpoint (the same
/// fields here).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Endpoint {
    pub port: String,
    pub path: String,
    pub interval: String,
    pub scrape_timeout: String,
    pub honor_labels: bool,
    pub relabelings: Vec<Relabeling>,
}

#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Relabeling {
    pub source_labels: Vec<String>,
    pub target_label: String,
    pub action: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub groups: Vec<RuleGroup>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RuleGroup {
    pub name: String,
    pub rules: Vec<Rule>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub alert: String,
    pub expr: String,
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}
