//! The criterion micro-benchmarks of the per-event userspace path
//! (health-node/benches/event_path.rs) and of the volume view at 1,000 pod
//! volumes (health-node/benches/volumes.rs), run through cargo, with their
//! estimates read back from criterion's JSON files.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;
use xtask::util::{cargo, workspace_root};

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
    (
        "volumes/lookup_lv",
        "1,000 volumes: pod volumes reached by an error on an LV shared by 2 pods",
    ),
    (
        "volumes/lookup_disk",
        "1,000 volumes: pod volumes reached by an error on a whole disk",
    ),
    (
        "volumes/lookup_miss",
        "1,000 volumes: a device backing no volume",
    ),
    (
        "volumes/monitor_record",
        "1,000 volumes: `VolumeMonitor::record` of 1,000 errors, one per volume (per error: divide by 1,000)",
    ),
    (
        "volumes/monitor_flush_all",
        "1,000 volumes: errors on every volume into the condition machines (at most once a second)",
    ),
    (
        "volumes/watch_line_lv",
        "1,000 volumes: resolve + JSON lines for an error on a shared LV (2 lines)",
    ),
    (
        "volumes/watch_line_disk",
        "1,000 volumes: resolve + JSON lines for an error on a whole disk (16 lines)",
    ),
    ("volumes/index_build", "1,000 volumes: `VolumeIndex::build`"),
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
    /// The memory line benches/volumes.rs prints (index and monitor size).
    pub volumes_memory: Option<String>,
    pub warm_up: Duration,
    pub measurement: Duration,
}

pub fn run_all(warm_up: Duration, measurement: Duration) -> Result<MicroResult> {
    let home = xtask::util::target_dir().join("criterion-xtask");
    let mut cmd = cargo();
    cmd.current_dir(workspace_root())
        .args(["bench", "--package", "health-node"])
        .args(["--bench", "event_path", "--bench", "volumes", "--"])
        .arg("--warm-up-time")
        .arg(format!("{}", warm_up.as_secs_f64()))
        .arg("--measurement-time")
        .arg(format!("{}", measurement.as_secs_f64()))
        .arg("--noplot")
        .env("CRITERION_HOME", &home)
        // Progress stays visible; stdout is kept for the memory line.
        .stderr(std::process::Stdio::inherit());
    let out = cmd.output().context("running the criterion benchmarks")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    if !out.status.success() {
        anyhow::bail!("the criterion benchmarks failed with {}", out.status);
    }
    let volumes_memory = stdout
        .lines()
        .find_map(|l| l.strip_prefix("volumes/memory: "))
        .map(str::to_string);
    let estimates = BENCHES
        .iter()
        .map(|&(id, what)| read_estimate(&home, id, what))
        .collect::<Result<Vec<_>>>()?;
    Ok(MicroResult {
        estimates,
        volumes_memory,
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
             (64 disks with 4 partitions each) and 1325 mounts (4 per partition, 300 unrelated) for `event/*` and \
             `topology/*`; for `volumes/*` a node with 1,000 pod volumes (64 disks, 256 partitions, 1,024 LVs, \
             ~2,400 mounts; some PVs shared by two pods).\n\n",
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
        if let Some(m) = &self.volumes_memory {
            out.push_str(&format!("\nMemory at 1,000 volumes: {m}.\n"));
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
