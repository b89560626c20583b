//! The criterion micro-benchmark of the per-event userspace path
//! (health-agent/benches/event_path.rs), run through cargo, with its
//! estimates read back from criterion's JSON files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use crate::build;
use crate::util::{cargo, run, workspace_root};

/// Benchmark ids in the order they are reported, with what they time.
const BENCHES: &[(&str, &str)] = &[
    (
        "event/resolve",
        "`ErrorEvent::resolve` of a sampled block error on a partition",
    ),
    (
        "event/resolve_json",
        "resolve + JSON line (what `watch --json` does per sample)",
    ),
    ("event/resolve_human", "resolve + human line"),
    (
        "event/summary_json",
        "resolve + JSON of a summary (no sample)",
    ),
    (
        "topology/from_parts",
        "`Topology::from_parts` (each rescan), inputs cloned outside the timing",
    ),
];

pub struct Estimate {
    pub id: &'static str,
    pub what: &'static str,
    pub mean_ns: f64,
    pub lower_ns: f64,
    pub upper_ns: f64,
    pub median_ns: f64,
}

pub struct MicroResult {
    pub estimates: Vec<Estimate>,
    pub warm_up: Duration,
    pub measurement: Duration,
}

pub fn run_all(
    ebpf_object: &Path,
    warm_up: Duration,
    measurement: Duration,
) -> Result<MicroResult> {
    let home = build::target_dir().join("criterion-xtask");
    run(cargo()
        .current_dir(workspace_root())
        .args([
            "bench",
            "--package",
            "health-agent",
            "--bench",
            "event_path",
            "--",
        ])
        .arg("--warm-up-time")
        .arg(format!("{}", warm_up.as_secs_f64()))
        .arg("--measurement-time")
        .arg(format!("{}", measurement.as_secs_f64()))
        .arg("--noplot")
        .env("CRITERION_HOME", &home)
        // The same kernel object as the release build, so cargo does not
        // rebuild health-agent's build script output for the benchmark.
        .env("HEALTH_EBPF_OBJECT", ebpf_object))
    .context("running the criterion benchmark")?;
    let estimates = BENCHES
        .iter()
        .map(|&(id, what)| read_estimate(&home, id, what))
        .collect::<Result<Vec<_>>>()?;
    Ok(MicroResult {
        estimates,
        warm_up,
        measurement,
    })
}

fn read_estimate(home: &Path, id: &'static str, what: &'static str) -> Result<Estimate> {
    let path: PathBuf = home.join(id).join("new/estimates.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading criterion's {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let num = |ptr: &str| -> Result<f64> {
        v.pointer(ptr)
            .and_then(Value::as_f64)
            .with_context(|| format!("{}: no {ptr}", path.display()))
    };
    Ok(Estimate {
        id,
        what,
        mean_ns: num("/mean/point_estimate")?,
        lower_ns: num("/mean/confidence_interval/lower_bound")?,
        upper_ns: num("/mean/confidence_interval/upper_bound")?,
        median_ns: num("/median/point_estimate")?,
    })
}

impl MicroResult {
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "criterion, {} s warm-up and {} s measurement per benchmark; synthetic topology of 320 block devices \
             (64 disks with 4 partitions each) and 1325 mounts (4 per partition, 300 unrelated).\n\n",
            self.warm_up.as_secs_f64(),
            self.measurement.as_secs_f64()
        );
        out.push_str("| benchmark | what | mean | 95 % CI of the mean | median |\n|---|---|---:|---:|---:|\n");
        for e in &self.estimates {
            out.push_str(&format!(
                "| `{}` | {} | {} | {} – {} | {} |\n",
                e.id,
                e.what,
                ns(e.mean_ns),
                ns(e.lower_ns),
                ns(e.upper_ns),
                ns(e.median_ns)
            ));
        }
        out
    }

    pub fn headline(&self) -> String {
        let parts: Vec<String> = self
            .estimates
            .iter()
            .map(|e| format!("{} {}", e.id, ns(e.mean_ns)))
            .collect();
        format!("micro: {}", parts.join(", "))
    }
}

/// 850 ns, 12.3 µs, 4.56 ms.
fn ns(v: f64) -> String {
    if v < 1_000.0 {
        format!("{v:.0} ns")
    } else if v < 1_000_000.0 {
        format!("{:.2} µs", v / 1_000.0)
    } else {
        format!("{:.2} ms", v / 1_000_000.0)
    }
}
