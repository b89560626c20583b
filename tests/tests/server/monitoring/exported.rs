//! The series the code exports, with their labels, taken from the code
//! itself: the agent's and the controller's registries are encoded after one
//! sample of each family was recorded through their public API, and the
//! OpenMetrics text is read back.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use health_controller::metrics::{ControllerMetrics, CycleResult};
use health_core::conditions::{Condition, Source, Status};
use health_csi::HealthSource;
use health_kernel::collector::KernelStats;
use health_kube::observer::Observer;
use health_node::report::metrics::{ErrorLabels, Metrics, VolumeRef};
use health_node::volumes::io::VolumeIo;
use health_node::volumes::kubelet::VolumeMode;
use health_node::volumes::{CsiOutcome, CsiResult, StorageOutcome, StorageResult, VolumeKey};

/// Labels every scraped series gets from its target, besides its own: what
/// Prometheus adds (`job`, `instance`), what the Prometheus Operator adds to
/// ServiceMonitor and PodMonitor targets (`namespace`, `pod`, `service`,
/// `endpoint`, `container`), and the chart's relabeling (`node`). The one
/// list for every check here.
pub const TARGET_LABELS: [&str; 8] = [
    "job",
    "instance",
    "namespace",
    "pod",
    "container",
    "service",
    "endpoint",
    "node",
];

/// Series Prometheus makes for each target itself; they carry only the
/// target's labels.
pub const SCRAPE_SERIES: [&str; 1] = ["up"];

/// Series name -> its own labels (target labels not included).
pub type Exported = BTreeMap<String, BTreeSet<String>>;

/// The agent's and the controller's series; series of scraping itself
/// ([`SCRAPE_SERIES`]) included, with no labels of their own.
pub fn exported() -> Exported {
    let mut all = series(&agent_exposition(), "agent");
    for (name, labels) in series(&controller_exposition(), "controller") {
        let previous = all.insert(name.clone(), labels);
        assert!(
            previous.is_none(),
            "{name} exported by agent and controller"
        );
    }
    for name in SCRAPE_SERIES {
        all.insert(name.to_string(), BTreeSet::new());
    }
    all
}

pub fn agent_exposition() -> String {
    // A cap of one series: the second kernel error's labels are refused,
    // which gives volume_health_metric_series_dropped_total its sample.
    let m = Metrics::with_max_series(1);
    let errors = |device: &str| ErrorLabels {
        namespace: "shop".into(),
        persistentvolumeclaim: "data".into(),
        persistentvolume: "pv-1".into(),
        device: device.into(),
        source: "block_rq_error".into(),
        op: "write".into(),
        errno: "EIO".into(),
    };
    m.kernel_errors(&errors("loop3"), 1);
    m.kernel_errors(&errors("loop4"), 1);
    let volume = VolumeRef {
        namespace: "shop".into(),
        pod: "web-0".into(),
        volume: "pv-1".into(),
        pvc: Some("data".into()),
        pv: Some("pv-1".into()),
    };
    m.set_volume_conditions(
        &volume,
        &[Condition {
            source: Source::Kernel,
            status: Status::Inaccessible,
            reason: "FilesystemShutdown".into(),
            message: "m".into(),
            since: SystemTime::UNIX_EPOCH,
            last_probe: SystemTime::UNIX_EPOCH,
            occurrences: None,
        }],
    );
    m.observe_io(
        &volume,
        &VolumeIo::Waiting {
            reads: 0,
            writes: 1,
            other: 0,
            oldest: Duration::from_secs(3),
        },
    );
    m.observe_io(
        &volume,
        &VolumeIo::Latency {
            op: health_common::op::WRITE,
            buckets: Box::new([1; health_common::LATENCY_BUCKETS]),
            sum_ns: 5_000_000,
        },
    );
    m.kernel_stats(&KernelStats::default());
    m.api_request("patch", "events", Some(200));
    m.event_written("Warning", "BlockIOErrors");
    m.event_write_deferred();
    m.csi_probe(&CsiOutcome {
        key: VolumeKey {
            pod_uid: "uid".into(),
            name: "pv-1".into(),
            mode: VolumeMode::Filesystem,
        },
        driver: "d.csi".into(),
        socket: None,
        result: CsiResult::NoHealthInfo {
            rpc: HealthSource::NodeGetVolumeStats,
            usage: None,
        },
        elapsed: Duration::from_millis(2),
    });
    m.csi_storage_probe(&StorageOutcome {
        driver: "d.csi".into(),
        socket: None,
        result: StorageResult::Unsupported,
    });
    m.set_volumes(1);
    m.set_health(true, true);
    m.try_encode().expect("encoding the agent's metrics")
}

pub fn controller_exposition() -> String {
    let m = ControllerMetrics::new();
    m.cycle(CycleResult::Complete, Duration::from_millis(20));
    m.csi_calls("ControllerListVolumeHealth", "OK", 1);
    m.set_volumes(1, 0);
    m.set_leader(true);
    Observer::api_request(&m, "list", "pods", Some(200));
    m.event_written("Warning", "VolumeConditionAbnormal");
    m.event_write_deferred();
    m.encode()
}

/// The series of an OpenMetrics text. Every family declared by `# TYPE`
/// must have a sample here, or its labels would be unknown: record one
/// above when a family is added.
pub fn series(text: &str, origin: &str) -> Exported {
    let mut families = BTreeMap::new();
    let mut out = Exported::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .unwrap_or_else(|| panic!("{origin}: bad TYPE line {line:?}"));
            families.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (name, labels) = sample(line, origin);
        out.entry(name).or_default().extend(labels);
    }
    assert!(text.ends_with("# EOF\n"), "{origin}: not OpenMetrics");
    for (family, kind) in &families {
        let names: Vec<String> = match kind.as_str() {
            "counter" => vec![format!("{family}_total")],
            "gauge" => vec![family.clone()],
            "histogram" => ["_bucket", "_sum", "_count"]
                .map(|s| format!("{family}{s}"))
                .into(),
            other => panic!("{origin}: {family} is a {other}, which these checks do not know"),
        };
        for name in names {
            assert!(
                out.contains_key(&name),
                "{origin}: no sample of {name}: record one in tests/server/monitoring/exported.rs"
            );
        }
    }
    assert_eq!(
        out.len(),
        families
            .values()
            .map(|k| if k == "histogram" { 3 } else { 1 })
            .sum::<usize>(),
        "{origin}: samples of undeclared families in {out:?}"
    );
    out
}

/// `name{a="x",b="y"} value` -> (name, [a, b]).
fn sample(line: &str, origin: &str) -> (String, Vec<String>) {
    let Some((name, rest)) = line.split_once('{') else {
        let name = line.split(' ').next().unwrap_or_default();
        return (name.to_string(), vec![]);
    };
    let (body, _value) = rest
        .rsplit_once('}')
        .unwrap_or_else(|| panic!("{origin}: unclosed labels in {line:?}"));
    let mut labels = vec![];
    // Values here never hold `",`; the checks above would fail on a name
    // the split mangled.
    for pair in body.split("\",") {
        let (label, _) = pair
            .split_once("=\"")
            .unwrap_or_else(|| panic!("{origin}: bad label in {line:?}"));
        labels.push(label.to_string());
    }
    (name.to_string(), labels)
}

#[test]
fn exported_series_come_with_their_labels() {
    let all = exported();
    let labels = |name: &str| -> Vec<&str> {
        all.get(name)
            .unwrap_or_else(|| panic!("{name} not exported"))
            .iter()
            .map(String::as_str)
            .collect()
    };
    assert_eq!(
        labels("volume_health_kernel_errors_total"),
        [
            "device",
            "errno",
            "namespace",
            "op",
            "persistentvolume",
            "persistentvolumeclaim",
            "source"
        ]
    );
    assert_eq!(
        labels("volume_health_volume_condition"),
        [
            "namespace",
            "persistentvolume",
            "persistentvolumeclaim",
            "pod",
            "reason",
            "status"
        ]
    );
    assert_eq!(
        labels("volume_health_csi_probe_duration_seconds_bucket"),
        ["driver", "le"]
    );
    assert_eq!(labels("volume_health_input_errors_total"), ["source"]);
    assert_eq!(
        labels("volume_health_metric_series_dropped_total"),
        ["metric"]
    );
    assert_eq!(labels("volume_health_ready"), Vec::<&str>::new());
    // Sorted, as the set gives them.
    let volume = ["persistentvolume", "persistentvolumeclaim", "pod", "volume"];
    let with = |first: &[&'static str]| [&["namespace"][..], first, &volume].concat();
    assert_eq!(
        labels("volume_health_volume_io_oldest_wait_seconds"),
        with(&[])
    );
    assert_eq!(labels("volume_health_volume_io_waiting"), with(&["op"]));
    assert_eq!(
        labels("volume_health_volume_io_latency_seconds_count"),
        with(&["op"])
    );
    assert_eq!(
        labels("volume_health_volume_io_latency_seconds_bucket"),
        [&["le"][..], &with(&["op"])].concat()
    );
    assert_eq!(labels("volume_health_controller_cycles_total"), ["result"]);
    assert_eq!(
        labels("volume_health_controller_pvc_health_status"),
        ["state"]
    );
    assert_eq!(
        labels("volume_health_controller_pvc_health_status_yielded_claims"),
        Vec::<&str>::new()
    );
    assert_eq!(labels("up"), Vec::<&str>::new());
    // 24 agent families (two histograms: three series each) and 11
    // controller families (one a histogram), plus up.
    assert_eq!(all.len(), 22 + 6 + 10 + 3 + 1, "{:#?}", all.keys());
}
