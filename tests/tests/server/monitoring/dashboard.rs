//! The Grafana dashboard model, as far as the chart's dashboard uses it:
//! unknown fields fail (`deny_unknown_fields`), so every query the JSON
//! holds is one these types reach. Layout and display settings stay JSON.
//! Fields that no check reads are still declared, so that the strict parse
//! accepts exactly this model: hence the allowance below.
#![allow(dead_code)]

use serde::Deserialize;
use serde_json::Value;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Dashboard {
    pub title: String,
    pub uid: String,
    pub description: String,
    pub tags: Vec<String>,
    pub editable: bool,
    pub graph_tooltip: u8,
    pub schema_version: u32,
    pub version: u32,
    pub refresh: String,
    pub time: Value,
    pub timezone: String,
    pub annotations: Value,
    pub links: Value,
    pub templating: Templating,
    pub panels: Vec<Panel>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Templating {
    pub list: Vec<Variable>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Variable {
    pub name: String,
    pub label: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub datasource: Option<DataSource>,
    #[serde(default)]
    pub definition: Option<String>,
    /// `prometheus` for the data source variable, `{query, refId}` for a
    /// query variable.
    pub query: Value,
    #[serde(default)]
    pub include_all: bool,
    #[serde(default)]
    pub multi: bool,
    #[serde(default)]
    pub all_value: Option<String>,
    pub current: Value,
    pub refresh: u8,
    #[serde(default)]
    pub sort: u8,
    pub hide: u8,
    pub regex: String,
}

#[derive(Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataSource {
    #[serde(rename = "type")]
    pub kind: String,
    pub uid: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Panel {
    #[serde(rename = "type")]
    pub kind: String,
    pub id: u32,
    pub title: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub datasource: Option<DataSource>,
    pub grid_pos: Value,
    #[serde(default)]
    pub field_config: Option<Value>,
    #[serde(default)]
    pub options: Option<Value>,
    #[serde(default)]
    pub transformations: Option<Value>,
    #[serde(default)]
    pub targets: Vec<Target>,
    /// Links shown on the panel: the runbooks of the alerts on what it shows.
    #[serde(default)]
    pub links: Vec<Link>,
    /// Rows only.
    #[serde(default)]
    pub collapsed: Option<bool>,
    #[serde(default)]
    pub panels: Option<Vec<Panel>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Link {
    pub title: String,
    pub url: String,
    pub target_blank: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Target {
    pub ref_id: String,
    pub datasource: DataSource,
    pub expr: String,
    pub legend_format: String,
    #[serde(default)]
    pub instant: Option<bool>,
    #[serde(default)]
    pub range: Option<bool>,
    #[serde(default)]
    pub format: Option<String>,
}

/// Grafana's own interval variables, as a duration PromQL accepts.
const GRAFANA_INTERVALS: [&str; 3] = ["$__rate_interval", "$__interval", "$__range"];

/// `expr` with Grafana's interval variables replaced by a duration; every
/// other `$name` must be one of `variables` (they stand inside label
/// matchers' strings, where they are valid PromQL as they are).
pub fn promql_of(expr: &str, variables: &[&str]) -> Result<String, String> {
    let mut text = expr.to_string();
    for v in GRAFANA_INTERVALS {
        text = text.replace(v, "5m");
    }
    let mut rest = text.as_str();
    while let Some(at) = rest.find('$') {
        let name: String = rest[at + 1..]
            .trim_start_matches('{')
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !variables.contains(&name.as_str()) {
            return Err(format!("${name} is not a variable of the dashboard"));
        }
        rest = &rest[at + 1..];
    }
    Ok(text)
}

/// `label_values(selector, label)`, a query variable's query.
pub fn label_values(query: &str) -> Option<(&str, &str)> {
    let inner = query.strip_prefix("label_values(")?.strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((selector.trim(), label.trim()))
}
