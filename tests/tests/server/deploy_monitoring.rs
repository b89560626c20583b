//! The chart's monitoring objects (values `monitoring.*`): a Grafana
//! dashboard ConfigMap, a PrometheusRule, a ServiceMonitor for the agents
//! and a PodMonitor for the controller sidecar.
//!
//! Each is rendered with `helm template` (HELM_BIN, the xtask tools cache or
//! PATH) and parsed strictly: the ConfigMap into k8s-openapi's type, the
//! Prometheus Operator kinds into the structs of `monitoring::operator`.
//! Every PromQL expression, the dashboard's and the alerts', is parsed with
//! promql-parser and must select only series the code exports, with labels
//! those series have (`monitoring::exported` reads them from the code's own
//! registries); legends and alert texts may only name labels their query's
//! result carries. promtool (PROMTOOL_BIN, the tools cache or PATH; `cargo
//! xtask tools` installs it) checks the rendered rules and runs unit tests
//! on them. Every alert links its runbook (`runbook_url`, a page of
//! docs/runbooks/ per alert, and no page without its alert), and every
//! dashboard panel links the runbooks of the alerts on the series it shows.

use std::collections::{BTreeMap, BTreeSet};

use crate::deploy_common;
use crate::monitoring;

use deploy_common::{
    chart_dir, deploy_dir, read, repo_root, run_tool, tool, try_run_tool, typed, yaml_documents,
};
use k8s_openapi::api::core::v1::{ConfigMap, Container, Service};
use monitoring::dashboard::{label_values, promql_of, Dashboard, DataSource, Panel};
use monitoring::exported::exported;
use monitoring::operator::{PodMonitor, PrometheusRule, Relabeling, Rule, ServiceMonitor};
use monitoring::promql::{template_labels, Checker};
use serde_json::Value;

const DASHBOARD_FILE: &str = "dashboards/volume-health.json";
const DASHBOARD_KEY: &str = "volume-health.json";
/// `monitoring.runbookBaseURL`'s default: the project's docs/runbooks/.
const RUNBOOKS: &str = "https://github.com/volume-health/volume-health/blob/main/docs/runbooks";
const ALL_ON: [&str; 3] = [
    "monitoring.dashboard.enabled=true",
    "monitoring.rules.enabled=true",
    "monitoring.serviceMonitor.enabled=true",
];

/// The rules without the chart's ServiceMonitor: the user says the agents
/// are scraped otherwise (else the chart refuses, see
/// `rules_without_a_scrape_are_refused`).
const RULES_ALONE: &str = "monitoring.rules.enabled=true,monitoring.rules.scrapedOtherwise=true";

/// The alerts issue 12 asks for by name, and the others the chart has.
const VOLUME_ALERTS: [&str; 6] = [
    "VolumeInaccessible",
    "VolumeDataLoss",
    "VolumeIOStalled",
    "VolumeHighLatency",
    "VolumeDegraded",
    "VolumeKernelErrors",
];
const AGENT_ALERTS: [&str; 9] = [
    "VolumeHealthAgentNotReady",
    "VolumeHealthAgentDown",
    "VolumeHealthAgentLoopStalled",
    "VolumeHealthKernelProgramMisses",
    "VolumeHealthKernelUncountedErrors",
    "VolumeHealthCounterMapFull",
    "VolumeHealthRingBufferLostSamples",
    "VolumeHealthMetricSeriesDropped",
    "VolumeHealthApiErrors",
];
const CONTROLLER_ALERTS: [&str; 3] = [
    "VolumeHealthControllerDown",
    "VolumeHealthControllerCyclesFailing",
    "VolumeHealthControllerApiErrors",
];

fn helm_args(values: &[&str]) -> Vec<String> {
    let chart = chart_dir();
    // In deploy/'s namespace, as the agent's objects the monitors select.
    let mut args: Vec<String> = [
        "template",
        "volume-health",
        chart.to_str().unwrap(),
        "--namespace",
        "volume-health",
    ]
    .map(String::from)
    .into();
    for v in values {
        args.extend(["--set".to_string(), v.to_string()]);
    }
    args
}

/// The monitoring objects of `helm template` with `values` (by kind).
fn render(values: &[&str]) -> Vec<Value> {
    let home = tempfile::tempdir().unwrap();
    let args = helm_args(values);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let text = run_tool(&tool("HELM_BIN", "helm"), &args, home.path());
    yaml_documents(&text, "helm template")
        .into_iter()
        .filter(|d| {
            let kind = d["kind"].as_str().unwrap_or_default();
            [
                "ConfigMap",
                "ServiceMonitor",
                "PodMonitor",
                "PrometheusRule",
            ]
            .contains(&kind)
        })
        .collect()
}

/// (kind, namespace, name) of each object.
fn keys(objects: &[Value]) -> Vec<(String, String, String)> {
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    objects
        .iter()
        .map(|o| {
            (
                s(&o["kind"]),
                s(&o["metadata"]["namespace"]),
                s(&o["metadata"]["name"]),
            )
        })
        .collect()
}

fn key(kind: &str, namespace: &str, name: &str) -> (String, String, String) {
    (kind.into(), namespace.into(), name.into())
}

fn one<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "expected one {kind} in {:?}", keys(objects));
    found[0]
}

fn rules(values: &[&str]) -> PrometheusRule {
    typed(one(&render(values), "PrometheusRule"), "helm template")
}

fn dashboard_file() -> String {
    read(&chart_dir().join(DASHBOARD_FILE))
}

fn dashboard() -> Dashboard {
    serde_json::from_str(&dashboard_file()).expect("the dashboard is valid for its types")
}

#[test]
fn each_switch_renders_exactly_its_objects() {
    assert_eq!(keys(&render(&[])), []);
    assert_eq!(
        keys(&render(&[ALL_ON[0]])),
        [key("ConfigMap", "volume-health", "volume-health-dashboard")]
    );
    assert_eq!(
        keys(&render(&[RULES_ALONE])),
        [key("PrometheusRule", "volume-health", "volume-health")]
    );
    assert_eq!(
        keys(&render(&[ALL_ON[2]])),
        [key(
            "ServiceMonitor",
            "volume-health",
            "volume-health-agent"
        )]
    );
    let mut all = keys(&render(
        &[&ALL_ON[..], &["controller.enabled=true"]].concat(),
    ));
    all.sort();
    assert_eq!(
        all,
        [
            key("ConfigMap", "volume-health", "volume-health-dashboard"),
            key("PodMonitor", "kube-system", "volume-health-controller"),
            key("PrometheusRule", "volume-health", "volume-health"),
            key("ServiceMonitor", "volume-health", "volume-health-agent"),
        ]
    );
}

/// Alerts on series nobody scrapes never fire, VolumeHealthAgentDown
/// included: the rules come with the ServiceMonitor or with the user's word
/// that Prometheus scrapes the agents by other means.
#[test]
fn rules_without_a_scrape_are_refused() {
    let home = tempfile::tempdir().unwrap();
    let args = helm_args(&["monitoring.rules.enabled=true"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = try_run_tool(&tool("HELM_BIN", "helm"), &args, home.path()).unwrap_err();
    assert!(
        err.contains(
            "monitoring.rules.enabled needs monitoring.serviceMonitor.enabled, or \
             monitoring.rules.scrapedOtherwise=true where Prometheus scrapes the agents \
             by other means: the alerts would see no series and none would fire, \
             VolumeHealthAgentDown included"
        ),
        "{err}"
    );
    assert_eq!(
        keys(&render(&["monitoring.rules.enabled=true", ALL_ON[2]])),
        [
            key("PrometheusRule", "volume-health", "volume-health"),
            key("ServiceMonitor", "volume-health", "volume-health-agent"),
        ]
    );
}

#[test]
fn a_service_monitor_without_the_service_is_refused() {
    let home = tempfile::tempdir().unwrap();
    let args = helm_args(&[ALL_ON[2], "metrics.service=false"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let err = try_run_tool(&tool("HELM_BIN", "helm"), &args, home.path()).unwrap_err();
    assert!(
        err.contains("monitoring.serviceMonitor.enabled needs metrics.service"),
        "{err}"
    );
}

#[test]
fn the_dashboard_config_map_holds_the_chart_file_with_the_sidecar_label() {
    let cm: ConfigMap = typed(one(&render(&[ALL_ON[0]]), "ConfigMap"), "helm template");
    let labels = cm.metadata.labels.clone().unwrap();
    assert_eq!(
        labels.get("grafana_dashboard").map(String::as_str),
        Some("1")
    );
    let data = cm.data.unwrap();
    assert_eq!(data.keys().collect::<Vec<_>>(), [DASHBOARD_KEY]);
    assert_eq!(data[DASHBOARD_KEY], dashboard_file().trim());

    let moved = render(&[
        ALL_ON[0],
        "monitoring.dashboard.namespace=grafana",
        "monitoring.dashboard.labels.grafana_dashboard=null",
        "monitoring.dashboard.labels.dashboards=storage",
        "monitoring.dashboard.annotations.grafana_folder=Storage",
    ]);
    let cm: ConfigMap = typed(one(&moved, "ConfigMap"), "helm template");
    assert_eq!(cm.metadata.namespace.as_deref(), Some("grafana"));
    let labels: Vec<(String, String)> = cm.metadata.labels.unwrap().into_iter().collect();
    assert_eq!(
        labels,
        [
            ("app.kubernetes.io/component".into(), "monitoring".into()),
            ("app.kubernetes.io/name".into(), "volume-health".into()),
            ("dashboards".into(), "storage".into()),
        ]
    );
    let annotations = cm.metadata.annotations.unwrap();
    assert_eq!(
        annotations.get("grafana_folder").map(String::as_str),
        Some("Storage")
    );

    // The panels' runbook links follow monitoring.runbookBaseURL.
    let elsewhere = render(&[
        ALL_ON[0],
        "monitoring.runbookBaseURL=https://wiki.example.com/runbooks",
    ]);
    let cm: ConfigMap = typed(one(&elsewhere, "ConfigMap"), "helm template");
    let text = &cm.data.unwrap()[DASHBOARD_KEY];
    let file = dashboard_file();
    let links = file.matches(&format!("{RUNBOOKS}/")).count();
    assert_eq!(links, 26, "runbook links in {DASHBOARD_FILE}");
    assert_eq!(
        text,
        &file.trim().replace(
            &format!("{RUNBOOKS}/"),
            "https://wiki.example.com/runbooks/"
        )
    );
    assert_eq!(
        text.matches("https://wiki.example.com/runbooks/").count(),
        links
    );
}

/// The relabeling that gives every target its pod's node as `node`.
fn node_relabeling() -> Relabeling {
    Relabeling {
        source_labels: vec!["__meta_kubernetes_pod_node_name".into()],
        target_label: "node".into(),
        action: "replace".into(),
    }
}

#[test]
fn the_monitors_scrape_the_agent_service_and_the_controller_sidecar_port() {
    let objects = render(&[
        ALL_ON[2],
        "controller.enabled=true",
        "monitoring.serviceMonitor.labels.release=kps",
        "monitoring.serviceMonitor.controller.selector.matchLabels.app=csi-hostpathplugin",
    ]);
    let service: Service = typed(
        &yaml_documents(&read(&deploy_dir().join("service.yaml")), "service.yaml")[0],
        "service.yaml",
    );
    let sm: ServiceMonitor = typed(one(&objects, "ServiceMonitor"), "helm template");
    assert_eq!(sm.metadata.labels.as_ref().unwrap()["release"], "kps");
    // It selects the Service by the Service's own labels, at its port.
    let service_labels = service.metadata.labels.clone().unwrap();
    for (k, v) in sm.spec.selector.match_labels.clone().unwrap() {
        assert_eq!(service_labels.get(&k), Some(&v), "selector {k}={v}");
    }
    let port = &service.spec.unwrap().ports.unwrap()[0];
    let [endpoint] = sm.spec.endpoints.as_slice() else {
        panic!("one endpoint: {:?}", sm.spec.endpoints)
    };
    assert_eq!(Some(&endpoint.port), port.name.as_ref());
    assert_eq!(
        (
            endpoint.path.as_str(),
            endpoint.interval.as_str(),
            endpoint.scrape_timeout.as_str()
        ),
        ("/metrics", "30s", "10s")
    );
    // The volume series' namespace and pod are the workload's.
    assert!(endpoint.honor_labels);
    assert_eq!(endpoint.relabelings, [node_relabeling()]);

    let pm: PodMonitor = typed(one(&objects, "PodMonitor"), "helm template");
    assert_eq!(pm.metadata.namespace.as_deref(), Some("kube-system"));
    assert_eq!(pm.metadata.labels.as_ref().unwrap()["release"], "kps");
    assert_eq!(
        pm.spec.selector.match_labels.clone().unwrap(),
        BTreeMap::from([("app".to_string(), "csi-hostpathplugin".to_string())])
    );
    let patch = yaml_documents(
        &read(&deploy_dir().join("controller/sidecar.yaml")),
        "sidecar.yaml",
    );
    let sidecar: Container = typed(
        &patch[0]["spec"]["template"]["spec"]["containers"][0],
        "sidecar.yaml",
    );
    let [endpoint] = pm.spec.pod_metrics_endpoints.as_slice() else {
        panic!("one endpoint: {:?}", pm.spec.pod_metrics_endpoints)
    };
    assert_eq!(
        Some(&endpoint.port),
        sidecar.ports.unwrap()[0].name.as_ref()
    );
    assert!(endpoint.honor_labels);
    assert_eq!(endpoint.relabelings, [node_relabeling()]);
}

/// Every panel, rows' nested panels included.
fn all_panels(panels: &[Panel]) -> Vec<&Panel> {
    panels
        .iter()
        .flat_map(|p| {
            std::iter::once(p).chain(p.panels.iter().flat_map(|nested| all_panels(nested)))
        })
        .collect()
}

#[test]
fn every_dashboard_query_selects_exported_series_and_their_labels() {
    let d = dashboard();
    assert_eq!(
        (d.uid.as_str(), d.title.as_str()),
        ("volume-health", "Volume health")
    );
    let variables: Vec<&str> = d.templating.list.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(variables, ["datasource", "job", "node", "namespace", "pvc"]);
    let exported = exported();
    let mut c = Checker::new(&exported);
    let ours = DataSource {
        kind: "prometheus".into(),
        uid: "${datasource}".into(),
    };
    for v in &d.templating.list {
        if v.kind == "datasource" {
            assert_eq!(v.query, "prometheus");
            continue;
        }
        assert_eq!(v.datasource.as_ref(), Some(&ours), "variable {}", v.name);
        let query = v.query["query"].as_str().unwrap_or_default();
        assert_eq!(Some(query), v.definition.as_deref(), "variable {}", v.name);
        let origin = format!("variable {}", v.name);
        // Queries match variables with =~: "All" must match every value,
        // the empty one too (a device no volume uses has no claim).
        assert!(v.include_all && v.multi, "{origin}");
        assert_eq!(v.all_value.as_deref(), Some(".*"), "{origin}");
        let Some((selector, label)) = label_values(query) else {
            panic!("{origin}: not label_values(...): {query}")
        };
        let promql = promql_of(selector, &variables).unwrap_or_else(|e| panic!("{origin}: {e}"));
        let result = c.check(&promql, &origin);
        c.uses(&[label.to_string()], &result, &origin);
    }
    let mut ids = BTreeSet::new();
    let mut titles = vec![];
    let mut queries = 0;
    for p in all_panels(&d.panels) {
        assert!(ids.insert(p.id), "panel id {} twice", p.id);
        titles.push(p.title.as_str());
        if p.kind == "row" {
            assert!(p.targets.is_empty(), "row {}", p.title);
            continue;
        }
        assert_eq!(p.datasource.as_ref(), Some(&ours), "panel {}", p.title);
        assert!(!p.targets.is_empty(), "panel {} has no query", p.title);
        assert!(
            p.description.as_ref().is_some_and(|d| !d.is_empty()),
            "panel {} says nothing about itself",
            p.title
        );
        // Tables and stats show the present (one instant query), graphs a range.
        let instant = matches!(p.kind.as_str(), "table" | "stat");
        for t in &p.targets {
            assert_eq!(t.instant, instant.then_some(true), "panel {}", p.title);
            assert_eq!(t.range, instant.then_some(false), "panel {}", p.title);
            let format = (p.kind == "table").then_some("table");
            assert_eq!(t.format.as_deref(), format, "panel {}", p.title);
        }
        for t in &p.targets {
            let origin = format!("panel {:?} query {}", p.title, t.ref_id);
            assert_eq!(t.datasource, ours, "{origin}");
            let promql = promql_of(&t.expr, &variables).unwrap_or_else(|e| panic!("{origin}: {e}"));
            let result = c.check(&promql, &origin);
            c.uses(&template_labels(&t.legend_format), &result, &origin);
            queries += 1;
        }
    }
    c.assert_clean();
    assert_eq!(queries, 32);
    for want in [
        "Kernel errors per PVC",
        "Active conditions",
        "Agents",
        "Agents not ready or stalled",
        "Kernel-side losses",
        "API request errors",
        "Events written and deferred",
        "CSI node health probes by result",
        "Controller cycles by result",
        "Volumes monitored and abnormal",
    ] {
        assert!(titles.contains(&want), "no panel {want:?} in {titles:?}");
    }
    // What the issue names is shown.
    for series in [
        "volume_health_kernel_errors_total",
        "volume_health_volume_condition",
        "volume_health_ready",
        "volume_health_live",
        "volume_health_samples_suppressed_total",
        "volume_health_ringbuf_lost_samples_total",
        "volume_health_kernel_program_misses_total",
        "volume_health_kernel_uncounted_errors_total",
        "volume_health_counter_map_full_total",
        "volume_health_api_requests_total",
        "volume_health_event_writes_deferred_total",
        "volume_health_csi_probes_total",
        "volume_health_controller_cycles_total",
        "volume_health_controller_volumes_abnormal",
    ] {
        assert!(
            c.selected.contains(series),
            "the dashboard shows no {series}"
        );
    }
}

#[test]
fn every_alert_selects_exported_series_and_names_only_its_labels() {
    let r = rules(&[RULES_ALONE, "controller.enabled=true"]);
    assert_eq!(r.metadata.namespace.as_deref(), Some("volume-health"));
    let groups: Vec<(&str, Vec<&str>)> = r
        .spec
        .groups
        .iter()
        .map(|g| {
            (
                g.name.as_str(),
                g.rules.iter().map(|r| r.alert.as_str()).collect(),
            )
        })
        .collect();
    assert_eq!(
        groups,
        [
            ("volume-health.volumes", VOLUME_ALERTS.to_vec()),
            ("volume-health.agent", AGENT_ALERTS.to_vec()),
            ("volume-health.controller", CONTROLLER_ALERTS.to_vec()),
        ]
    );
    let exported = exported();
    let mut c = Checker::new(&exported);
    for rule in r.spec.groups.iter().flat_map(|g| &g.rules) {
        let origin = format!("alert {}", rule.alert);
        let result = c.check(&rule.expr, &origin);
        assert_eq!(
            rule.annotations.keys().collect::<Vec<_>>(),
            ["description", "runbook_url", "summary"],
            "{origin}"
        );
        assert_eq!(
            rule.annotations["runbook_url"],
            format!("{RUNBOOKS}/{}.md", rule.alert),
            "{origin}"
        );
        for (name, text) in rule.annotations.iter().filter(|(k, _)| *k != "runbook_url") {
            c.uses(&template_labels(text), &result, &format!("{origin} {name}"));
        }
        let severity = rule.labels.get("severity").map(String::as_str);
        assert!(
            matches!(severity, Some("critical" | "warning")),
            "{origin}: severity {severity:?}"
        );
    }
    c.assert_clean();
    // Without the controller, no controller group.
    let r = rules(&[RULES_ALONE]);
    let names: Vec<&str> = r.spec.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(names, ["volume-health.volumes", "volume-health.agent"]);
}

#[test]
fn rule_values_set_thresholds_durations_and_labels() {
    let r = rules(&[
        RULES_ALONE,
        "controller.enabled=true",
        "monitoring.rules.labels.release=kps",
        "monitoring.rules.additionalLabels.team=storage",
        "monitoring.rules.kernelErrors.window=10m",
        "monitoring.rules.kernelErrors.threshold=25",
        "monitoring.rules.kernelErrors.for=3m",
        "monitoring.rules.volumeInaccessible.severity=page",
        "monitoring.rules.volumeHighLatency.for=15m",
        "monitoring.rules.volumeDegraded.for=1h",
        "monitoring.rules.agentJob=vh-agents",
        "monitoring.runbookBaseURL=https://wiki.example.com/storage/runbooks/",
    ]);
    assert_eq!(r.metadata.labels.as_ref().unwrap()["release"], "kps");
    let rule = |name: &str| {
        r.spec
            .groups
            .iter()
            .flat_map(|g| &g.rules)
            .find(|r| r.alert == name)
            .unwrap_or_else(|| panic!("no alert {name}"))
            .clone()
    };
    let errors = rule("VolumeKernelErrors");
    assert_eq!(
        errors.expr,
        "sum by (namespace, persistentvolumeclaim) ((volume_health_kernel_errors_total{persistentvolumeclaim!=\"\"} \
         unless volume_health_kernel_errors_total{persistentvolumeclaim!=\"\"} offset 10m) \
         or increase(volume_health_kernel_errors_total{persistentvolumeclaim!=\"\"}[10m])) > 25"
    );
    assert_eq!(errors.for_.as_deref(), Some("3m"));
    assert!(errors.annotations["description"].ends_with(" within 10m."));
    assert_eq!(rule("VolumeInaccessible").labels["severity"], "page");
    assert_eq!(rule("VolumeHighLatency").for_.as_deref(), Some("15m"));
    let degraded = rule("VolumeDegraded");
    assert_eq!(degraded.for_.as_deref(), Some("1h"));
    assert!(degraded.annotations["description"].contains(" has been Degraded for 1h: "));
    assert_eq!(rule("VolumeIOStalled").for_.as_deref(), Some("0m"));
    assert_eq!(
        rule("VolumeHealthAgentDown").expr,
        "up{job=\"vh-agents\"} == 0"
    );
    // The controller's job defaults to the PodMonitor's (namespace/name).
    assert_eq!(
        rule("VolumeHealthControllerDown").expr,
        "up{job=\"kube-system/volume-health-controller\"} == 0"
    );
    for rule in r.spec.groups.iter().flat_map(|g| &g.rules) {
        assert_eq!(rule.labels["team"], "storage", "{}", rule.alert);
        // One slash between the base and the page, however the base ends.
        assert_eq!(
            rule.annotations["runbook_url"],
            format!(
                "https://wiki.example.com/storage/runbooks/{}.md",
                rule.alert
            )
        );
    }
}

/// The rendered groups as a Prometheus rule file, in `dir`.
fn rule_file(dir: &std::path::Path, values: &[&str]) -> std::path::PathBuf {
    let path = dir.join("rules.yaml");
    let groups = serde_json::to_value(&rules(values).spec).unwrap();
    std::fs::write(&path, serde_yaml::to_string(&groups).unwrap()).unwrap();
    path
}

#[test]
fn promtool_accepts_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    let file = rule_file(dir.path(), &[RULES_ALONE, "controller.enabled=true"]);
    let out = run_tool(
        &tool("PROMTOOL_BIN", "promtool"),
        &["check", "rules", file.to_str().unwrap()],
        dir.path(),
    );
    assert!(out.contains("SUCCESS: 18 rules found"), "{out}");
}

#[test]
fn promtool_fires_the_volume_alerts_for_their_series() {
    let dir = tempfile::tempdir().unwrap();
    rule_file(dir.path(), &[RULES_ALONE]);
    let tests = dir.path().join("tests.yaml");
    std::fs::write(&tests, include_str!("monitoring/rules_test.yaml")).unwrap();
    let out = run_tool(
        &tool("PROMTOOL_BIN", "promtool"),
        &["test", "rules", tests.to_str().unwrap()],
        dir.path(),
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

/// The chart's alerts with the controller's, in the chart's order.
fn all_alerts() -> Vec<Rule> {
    let r = rules(&[RULES_ALONE, "controller.enabled=true"]);
    r.spec.groups.into_iter().flat_map(|g| g.rules).collect()
}

#[test]
fn every_alert_has_its_runbook_page_and_every_page_an_alert() {
    let alerts: BTreeSet<String> = all_alerts().into_iter().map(|r| r.alert).collect();
    assert_eq!(alerts.len(), 18);
    let dir = repo_root().join("docs/runbooks");
    let mut pages = BTreeSet::new();
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let name = entry.unwrap().file_name().into_string().unwrap();
        if name == "README.md" {
            continue;
        }
        let alert = name
            .strip_suffix(".md")
            .unwrap_or_else(|| panic!("docs/runbooks/{name} is not a page"));
        // Each page is titled by its alert, as the alert's link promises.
        let text = read(&dir.join(&name));
        assert_eq!(
            text.lines().next(),
            Some(format!("# {alert}").as_str()),
            "{name}"
        );
        for section in ["## Meaning", "## Confirm", "## Act", "## Clears"] {
            assert!(text.lines().any(|l| l == section), "{name}: no {section:?}");
        }
        pages.insert(alert.to_string());
    }
    assert_eq!(pages, alerts, "docs/runbooks/ against the chart's alerts");
    // The README counts them.
    let without_controller: usize = rules(&[RULES_ALONE])
        .spec
        .groups
        .iter()
        .map(|g| g.rules.len())
        .sum();
    let count = format!(
        "alerts ({without_controller}, {} with the controller)",
        alerts.len()
    );
    assert!(
        read(&repo_root().join("README.md")).contains(&count),
        "the README does not say {count:?}"
    );
    // The index names every page.
    let index = read(&dir.join("README.md"));
    for alert in &alerts {
        assert!(
            index.contains(&format!("]({alert}.md)")),
            "docs/runbooks/README.md lacks {alert}"
        );
    }
}

/// The series an expression selects.
fn selected(
    exported: &monitoring::exported::Exported,
    exprs: &[&str],
    origin: &str,
) -> BTreeSet<String> {
    let mut c = Checker::new(exported);
    for e in exprs {
        c.check(e, origin);
    }
    c.assert_clean();
    c.selected
}

#[test]
fn every_panel_links_the_runbooks_of_the_alerts_on_its_series() {
    let exported = exported();
    let alerts = all_alerts();
    let agent_job = "volume-health-metrics";
    // An alert's series; `up` is the agents' only where the alert names
    // their job: the dashboard's $job lists the agents' jobs only.
    let alert_series: Vec<(String, BTreeSet<String>)> = alerts
        .iter()
        .map(|a| {
            let mut s = selected(&exported, &[&a.expr], &a.alert);
            if !a.expr.contains(&format!("job=\"{agent_job}\"")) {
                s.remove("up");
            }
            (a.alert.clone(), s)
        })
        .collect();
    let variables = ["datasource", "job", "node", "namespace", "pvc"];
    let d = dashboard();
    let mut linked = BTreeSet::new();
    for p in all_panels(&d.panels) {
        let exprs: Vec<String> = p
            .targets
            .iter()
            .map(|t| promql_of(&t.expr, &variables).unwrap())
            .collect();
        let exprs: Vec<&str> = exprs.iter().map(String::as_str).collect();
        let shown = selected(&exported, &exprs, &p.title);
        let want: Vec<String> = alert_series
            .iter()
            .filter(|(_, s)| !s.is_disjoint(&shown))
            .map(|(a, _)| a.clone())
            .collect();
        let got: Vec<String> = p
            .links
            .iter()
            .map(|l| {
                assert!(l.target_blank, "panel {}: {}", p.title, l.url);
                let alert = l
                    .url
                    .strip_prefix(&format!("{RUNBOOKS}/"))
                    .and_then(|rest| rest.strip_suffix(".md"))
                    .unwrap_or_else(|| panic!("panel {}: {} is no runbook", p.title, l.url));
                assert_eq!(l.title, format!("Runbook: {alert}"), "panel {}", p.title);
                alert.to_string()
            })
            .collect();
        assert_eq!(got, want, "runbook links of panel {:?}", p.title);
        linked.extend(got);
    }
    // The controller's scrape target has no panel; every other alert has one.
    let unlinked: Vec<&str> = alerts
        .iter()
        .map(|a| a.alert.as_str())
        .filter(|a| !linked.contains(*a))
        .collect();
    assert_eq!(unlinked, ["VolumeHealthControllerDown"]);
    // The dashboard's own link: the runbooks' index.
    assert_eq!(
        d.links,
        serde_json::json!([{
            "title": "Runbooks",
            "type": "link",
            "url": format!("{RUNBOOKS}/README.md"),
            "targetBlank": true,
            "icon": "doc"
        }])
    );
}
