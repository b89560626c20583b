//! `HighLatency`: a volume whose reads or writes stay slow. Every window
//! (`--latency-window`) the agent takes the completions of the volume's own
//! device (as for stalls, the top of its stack) from the kernel's latency
//! buckets (`health_kernel::latency`), per operation, and the bucket their
//! 99th percentile falls in.
//!
//! The limit is the tighter of two: an absolute one, the volume's
//! StorageClass's where one is set (`--storage-class-latency-limit`, cluster
//! mode: the class is the PV's) and otherwise its device class's
//! (rotational, SSD/NVMe, network block: [`LatencyLimits`]); and, once the
//! volume has a baseline, a multiple of it (`--latency-relative`, never
//! below [`RELATIVE_FLOOR`]). The baseline is a moving average of the
//! volume's own p99 over windows that were not slow.
//!
//! No flapping: raised after [`RAISE_WINDOWS`] windows in a row at or above
//! the limit, cleared after [`CLEAR_WINDOWS`] in a row under
//! [`CLEAR_BELOW`] of it; a window with fewer than [`MIN_REQUESTS`]
//! completions says nothing either way (an idle volume is not a fast one).
//! While raised, the message stays what it first said.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use health_common::{latency_bucket_floor_us, op, LATENCY_BUCKETS};
use health_core::conditions::{CheckFinding, CheckKind, CheckResult};
use health_core::dev::Dev;
use health_kernel::latency::DeviceLatency;
use health_topology::Topology;

use super::checks::CheckReport;
use super::io::window_of;
use super::{IndexedVolume, VolumeKey};

/// Windows in a row at or above the limit before the condition is raised.
pub const RAISE_WINDOWS: u32 = 3;
/// Windows in a row under [`CLEAR_BELOW`] of the limit before it clears.
pub const CLEAR_WINDOWS: u32 = 3;
/// A window's p99 must fall under this share of the limit to count
/// towards clearing: one at 90 % of it neither raises nor clears.
pub const CLEAR_BELOW: f64 = 0.8;
/// Completions a window needs for a verdict: the 99th percentile of fewer
/// is the slowest one or two requests.
pub const MIN_REQUESTS: u64 = 20;
/// Windows of the volume's own before its baseline counts.
pub const BASELINE_WINDOWS: u32 = 6;
/// The relative limit is never below this: a healthy busy device's p99
/// moves by more than 10x between 1 ms and tens of milliseconds with its
/// queue depth alone.
pub const RELATIVE_FLOOR: Duration = Duration::from_millis(50);
/// Weight of a new window in the baseline's moving average.
const BASELINE_WEIGHT: f64 = 0.2;

/// The kind of storage a volume's device ends in, for its absolute limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeviceClass {
    Rotational,
    Ssd,
    Network,
}

impl DeviceClass {
    pub fn name(self) -> &'static str {
        match self {
            DeviceClass::Rotational => "rotational",
            DeviceClass::Ssd => "ssd",
            DeviceClass::Network => "network",
        }
    }
}

/// The absolute p99 limit of each class (`--latency-limit CLASS=MS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LatencyLimits {
    pub rotational: Duration,
    pub ssd: Duration,
    pub network: Duration,
}

impl Default for LatencyLimits {
    /// A disk's seek and queue under load reach a few hundred ms at p99
    /// while healthy; an SSD's or NVMe drive's stays under tens; a network
    /// block device (iSCSI, NVMe-oF, NBD, RBD) adds its round trips and
    /// the target's own queue.
    fn default() -> Self {
        LatencyLimits {
            rotational: Duration::from_millis(500),
            ssd: Duration::from_millis(100),
            network: Duration::from_millis(200),
        }
    }
}

impl LatencyLimits {
    pub fn of(&self, class: DeviceClass) -> Duration {
        match class {
            DeviceClass::Rotational => self.rotational,
            DeviceClass::Ssd => self.ssd,
            DeviceClass::Network => self.network,
        }
    }

    /// Sets one class's limit from `CLASS=MS` (`ssd=50`).
    pub fn set(&mut self, spec: &str) -> Result<(), String> {
        let (class, limit) = named_limit(spec, "CLASS=MS, e.g. ssd=50")?;
        match class {
            "rotational" => self.rotational = limit,
            "ssd" => self.ssd = limit,
            "network" => self.network = limit,
            other => {
                return Err(format!(
                    "{spec:?}: unknown class {other:?} (rotational, ssd or network)"
                ))
            }
        }
        Ok(())
    }
}

/// `NAME=MS` (`MS` may end in `ms`): the name and the limit.
pub fn named_limit<'a>(spec: &'a str, expected: &str) -> Result<(&'a str, Duration), String> {
    let (name, ms) = spec
        .split_once('=')
        .filter(|(name, _)| !name.is_empty())
        .ok_or_else(|| format!("{spec:?}: expected {expected}"))?;
    let ms: u64 = ms
        .trim_end_matches("ms")
        .parse()
        .ok()
        .filter(|&ms| ms > 0)
        .ok_or_else(|| format!("{spec:?}: the limit is a whole number of milliseconds above 0"))?;
    Ok((name, Duration::from_millis(ms)))
}

/// `--latency-window` and the limits.
#[derive(Clone, Debug, PartialEq)]
pub struct LatencyConfig {
    pub window: Duration,
    pub limits: LatencyLimits,
    /// The relative limit, as a multiple of the baseline; 0: none.
    pub relative: f64,
    /// Absolute limits by StorageClass name, before the device class's
    /// (`--storage-class-latency-limit NAME=MS`).
    pub storage_classes: BTreeMap<String, Duration>,
}

/// The StorageClass of a pod volume's PV, where cluster mode has read it.
pub trait StorageClasses {
    fn storage_class(&self, volume: &VolumeKey) -> Option<&str>;
}

/// What one operation of one volume has shown so far.
#[derive(Debug, Default)]
struct OpState {
    above: u32,
    below: u32,
    baseline_us: Option<f64>,
    baseline_windows: u32,
    /// What was said when it was raised, and the limit it is held to.
    raised: Option<(CheckFinding, Duration)>,
}

#[derive(Debug, Default)]
pub struct LatencyJudge {
    /// Per volume: reads, writes.
    ops: HashMap<VolumeKey, [OpState; 2]>,
}

const OPS: [(u8, &str); 2] = [(op::READ, "read"), (op::WRITE, "write")];

impl LatencyJudge {
    /// One report per volume with a device, from one window's completions.
    /// `class_of` says what storage a device is; `storage_class` names a
    /// volume's StorageClass where it is known.
    pub fn judge(
        &mut self,
        volumes: &[IndexedVolume],
        topo: &Topology,
        window: &[DeviceLatency],
        cfg: &LatencyConfig,
        class_of: &mut dyn FnMut(Dev) -> DeviceClass,
        storage_class: &mut dyn FnMut(&IndexedVolume) -> Option<String>,
    ) -> Vec<(VolumeKey, CheckReport)> {
        let mut out = Vec::new();
        let mut live = HashSet::new();
        for v in volumes {
            let Some(device) = v.device else { continue };
            live.insert(v.key.clone());
            let devices = topo.filesystem_backing_devices(device);
            let states = self.ops.entry(v.key.clone()).or_default();
            let mut findings = Vec::new();
            for (i, (code, word)) in OPS.into_iter().enumerate() {
                let (buckets, _) = window_of(&devices, window, code);
                let state = &mut states[i];
                if let Some(p99) = p99(&buckets) {
                    let absolute = absolute(v, device, cfg, class_of, storage_class);
                    let (limit, rule) = limit(state, cfg, absolute);
                    step(state, p99, limit, || CheckFinding::HighLatency {
                        device: name(topo, device),
                        op: word,
                        p99,
                        window: cfg.window,
                        limit,
                        rule,
                    });
                }
                if let Some((f, _)) = &state.raised {
                    findings.push(f.clone());
                }
            }
            let result = match findings.is_empty() {
                true => CheckResult::Pass,
                false => CheckResult::Found(findings),
            };
            out.push((
                v.key.clone(),
                CheckReport {
                    results: vec![(CheckKind::Latency, result)],
                },
            ));
        }
        self.ops.retain(|k, _| live.contains(k));
        out
    }
}

/// The floor of the bucket the 99th percentile falls in; `None` below
/// [`MIN_REQUESTS`].
pub fn p99(buckets: &[u64; LATENCY_BUCKETS]) -> Option<Duration> {
    let n: u64 = buckets.iter().sum();
    if n < MIN_REQUESTS {
        return None;
    }
    let rank = (n * 99).div_ceil(100);
    let mut seen = 0;
    for (b, count) in buckets.iter().enumerate() {
        seen += count;
        if seen >= rank {
            return Some(Duration::from_micros(latency_bucket_floor_us(b)));
        }
    }
    None
}

/// A volume's absolute limit and the words for it: its StorageClass's
/// where one is set, else its device class's.
fn absolute(
    v: &IndexedVolume,
    device: Dev,
    cfg: &LatencyConfig,
    class_of: &mut dyn FnMut(Dev) -> DeviceClass,
    storage_class: &mut dyn FnMut(&IndexedVolume) -> Option<String>,
) -> (Duration, String) {
    // Asked only when some class has a limit: a lookup per volume and window.
    let by_storage_class = match cfg.storage_classes.is_empty() {
        true => None,
        false => storage_class(v).and_then(|name| Some((*cfg.storage_classes.get(&name)?, name))),
    };
    match by_storage_class {
        Some((limit, name)) => (limit, format!("the limit for StorageClass {name}")),
        None => {
            let class = class_of(device);
            (
                cfg.limits.of(class),
                format!("the limit for {}", class.name()),
            )
        }
    }
}

/// The limit a window is held to, and the words for it.
fn limit(state: &OpState, cfg: &LatencyConfig, absolute: (Duration, String)) -> (Duration, String) {
    // While raised the finding is kept, not rebuilt: only the limit counts.
    if let Some((_, limit)) = &state.raised {
        return (*limit, String::new());
    }
    let relative = state
        .baseline_us
        .filter(|_| cfg.relative > 0.0 && state.baseline_windows >= BASELINE_WINDOWS)
        .map(|base| {
            let limit = Duration::from_micros((base * cfg.relative) as u64).max(RELATIVE_FLOOR);
            let base = Duration::from_micros(base as u64);
            (
                limit,
                format!(
                    "{}x its baseline of {}",
                    cfg.relative,
                    health_core::conditions::human_duration(base)
                ),
            )
        });
    match relative {
        Some(r) if r.0 < absolute.0 => r,
        _ => absolute,
    }
}

/// One window's verdict on one operation.
fn step(
    state: &mut OpState,
    p99: Duration,
    limit: Duration,
    finding: impl FnOnce() -> CheckFinding,
) {
    if p99 >= limit {
        state.above += 1;
        state.below = 0;
    } else if p99.as_secs_f64() < limit.as_secs_f64() * CLEAR_BELOW {
        state.below += 1;
        state.above = 0;
    } else {
        state.above = 0;
        state.below = 0;
    }
    match &state.raised {
        None if state.above >= RAISE_WINDOWS => state.raised = Some((finding(), limit)),
        None if p99 < limit => {
            let us = p99.as_micros() as f64;
            state.baseline_us = Some(match state.baseline_us {
                Some(b) => b + BASELINE_WEIGHT * (us - b),
                None => us,
            });
            state.baseline_windows += 1;
        }
        Some(_) if state.below >= CLEAR_WINDOWS => state.raised = None,
        _ => {}
    }
}

fn name(topo: &Topology, d: Dev) -> String {
    topo.device(d)
        .map_or_else(|| d.to_string(), |b| b.name.clone())
}

/// The class of the storage under `dev`: network if any device at the
/// bottom of its stack is reached over a network (an iSCSI session,
/// NVMe over fabrics, NBD, RBD), rotational if any is a spinning disk,
/// SSD otherwise. Read from sysfs under `sys_root`.
pub fn classify(topo: &Topology, dev: Dev, sys_root: &Path) -> DeviceClass {
    let mut leaves = Vec::new();
    let mut seen = HashSet::from([dev]);
    let mut stack = vec![dev];
    while let Some(d) = stack.pop() {
        let Some(b) = topo.device(d) else { continue };
        if b.slaves.is_empty() {
            leaves.push(b.whole_disk.and_then(|w| topo.device(w)).unwrap_or(b));
        }
        stack.extend(b.slaves.iter().copied().filter(|s| seen.insert(*s)));
    }
    let block = sys_root.join("class/block");
    let networked = |name: &str| {
        if ["nbd", "rbd"].iter().any(|p| name.starts_with(p)) {
            return true;
        }
        let Ok(path) = std::fs::canonicalize(block.join(name)) else {
            return false;
        };
        let path = path.to_string_lossy().into_owned();
        if path.contains("/session") || path.contains("/nvme-fabrics/") {
            return true;
        }
        // An NVMe multipath head: its controllers' transports.
        if path.contains("/nvme-subsystem/") {
            let subsys = Path::new(&path).parent().map(Path::to_path_buf);
            let transports = subsys
                .and_then(|s| std::fs::read_dir(s).ok())
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path().join("transport")).ok());
            return transports.into_iter().any(|t| t.trim() != "pcie");
        }
        false
    };
    let rotational = |name: &str| {
        std::fs::read_to_string(block.join(name).join("queue/rotational"))
            .is_ok_and(|v| v.trim() == "1")
    };
    if leaves.iter().any(|b| networked(&b.name)) {
        DeviceClass::Network
    } else if leaves.iter().any(|b| rotational(&b.name)) {
        DeviceClass::Rotational
    } else {
        DeviceClass::Ssd
    }
}

#[cfg(test)]
mod tests {
    use health_common::latency_bucket;

    use super::*;
    use crate::volumes::testing::{block_volume, device, verdict};

    const SDB: Dev = Dev::new(8, 16);

    fn world() -> (Topology, Vec<IndexedVolume>) {
        let topo = Topology::from_parts(vec![device(SDB, "sdb", vec![])], vec![]);
        (topo, vec![block_volume(SDB, "sdb")])
    }

    /// `n` writes of `ms` each in one window.
    fn writes(n: u64, ms: u64) -> Vec<DeviceLatency> {
        let mut buckets = [0; LATENCY_BUCKETS];
        buckets[latency_bucket(ms * 1000)] = n;
        vec![DeviceLatency {
            dev: SDB,
            op: op::WRITE,
            buckets,
            sum_ns: n * ms * 1_000_000,
        }]
    }

    fn cfg(relative: f64) -> LatencyConfig {
        LatencyConfig {
            window: Duration::from_secs(10),
            limits: LatencyLimits::default(),
            relative,
            storage_classes: BTreeMap::new(),
        }
    }

    fn verdicts(
        judge: &mut LatencyJudge,
        windows: &[Vec<DeviceLatency>],
        cfg: &LatencyConfig,
    ) -> Vec<String> {
        verdicts_in(judge, windows, cfg, None)
    }

    /// [`verdicts`] for a volume of StorageClass `sc`.
    fn verdicts_in(
        judge: &mut LatencyJudge,
        windows: &[Vec<DeviceLatency>],
        cfg: &LatencyConfig,
        sc: Option<&str>,
    ) -> Vec<String> {
        let (topo, vols) = world();
        windows
            .iter()
            .map(|w| {
                let r = judge.judge(&vols, &topo, w, cfg, &mut |_| DeviceClass::Ssd, &mut |v| {
                    assert_eq!(v.volume.pv.as_deref(), Some("pv-a"));
                    sc.map(str::to_string)
                });
                verdict(&r[0].1, CheckKind::Latency)
            })
            .collect()
    }

    /// A StorageClass's limit replaces the device class's for its volumes
    /// (tighter or looser); a volume of another class keeps its device's.
    #[test]
    fn a_storage_class_limit_comes_before_the_device_class() {
        let mut cfg = cfg(0.0);
        cfg.storage_classes = BTreeMap::from([
            ("fast-nvme".to_string(), Duration::from_millis(20)),
            ("archive".to_string(), Duration::from_millis(2000)),
        ]);
        let w: Vec<_> = (0..3).map(|_| writes(100, 30)).collect();
        let got = verdicts_in(&mut LatencyJudge::default(), &w, &cfg, Some("fast-nvme"));
        assert_eq!(
            got,
            [
                "pass",
                "pass",
                "sdb: write latency p99 at least 24ms over 10s windows, above 20ms (the limit for StorageClass fast-nvme)"
            ]
        );
        let w: Vec<_> = (0..3).map(|_| writes(100, 300)).collect();
        let got = verdicts_in(&mut LatencyJudge::default(), &w, &cfg, Some("archive"));
        assert_eq!(got, ["pass"; 3]);
        let got = verdicts_in(&mut LatencyJudge::default(), &w, &cfg, Some("standard"));
        assert_eq!(
            got[2],
            "sdb: write latency p99 at least 262ms over 10s windows, above 100ms (the limit for ssd)"
        );
    }

    /// Raised on the third slow window (an idle one between says nothing
    /// either way), kept with the same words while slow or in between (98
    /// ms against 100), cleared on the third fast one.
    #[test]
    fn raised_after_three_slow_windows_and_cleared_after_three_fast_ones() {
        let mut judge = LatencyJudge::default();
        let slow = "sdb: write latency p99 at least 262ms over 10s windows, above 100ms (the limit for ssd)";
        let w = [
            writes(100, 300),
            writes(100, 300),
            writes(5, 1),
            writes(100, 300),
            writes(100, 300),
            writes(100, 300),
            writes(100, 900),
            writes(100, 100),
            writes(100, 1),
            writes(100, 1),
            writes(3, 300),
            writes(100, 1),
        ];
        assert_eq!(
            verdicts(&mut judge, &w, &cfg(0.0)),
            ["pass", "pass", "pass", slow, slow, slow, slow, slow, slow, slow, slow, "pass"]
        );
    }

    /// A volume that settled at 2 ms is held to 50 ms (10x is 20 ms, the
    /// floor is 50) before its class's 100 ms; 65 ms is slow for it.
    #[test]
    fn a_baseline_tightens_the_limit() {
        let mut judge = LatencyJudge::default();
        let mut w: Vec<_> = (0..6).map(|_| writes(100, 3)).collect();
        w.extend((0..3).map(|_| writes(100, 70)));
        let got = verdicts(&mut judge, &w, &cfg(10.0));
        assert_eq!(got[..8], ["pass"; 8]);
        assert_eq!(
            got[8],
            "sdb: write latency p99 at least 65ms over 10s windows, above 50ms (10x its baseline of 2ms)"
        );
        // Without the relative rule the class limit holds.
        let mut judge = LatencyJudge::default();
        assert_eq!(verdicts(&mut judge, &w, &cfg(0.0)), ["pass"; 9]);
    }

    #[test]
    fn the_99th_percentile_is_a_bucket_floor() {
        let mut b = [0u64; LATENCY_BUCKETS];
        b[latency_bucket(1_000)] = 98;
        b[latency_bucket(300_000)] = 2;
        assert_eq!(p99(&b), Some(Duration::from_micros(262_144)));
        b[latency_bucket(1_000)] = 99;
        b[latency_bucket(300_000)] = 1;
        assert_eq!(p99(&b), Some(Duration::from_micros(768)));
        assert_eq!(p99(&[0; LATENCY_BUCKETS]), None);
    }

    #[test]
    fn limits_from_the_command_line() {
        let mut l = LatencyLimits::default();
        l.set("ssd=20").unwrap();
        l.set("network=300ms").unwrap();
        assert_eq!(
            (l.ssd, l.network, l.rotational),
            (
                Duration::from_millis(20),
                Duration::from_millis(300),
                Duration::from_millis(500)
            )
        );
        assert_eq!(
            l.set("tape=5"),
            Err("\"tape=5\": unknown class \"tape\" (rotational, ssd or network)".into())
        );
        assert_eq!(
            l.set("ssd=0"),
            Err("\"ssd=0\": the limit is a whole number of milliseconds above 0".into())
        );
        assert_eq!(
            l.set("ssd"),
            Err("\"ssd\": expected CLASS=MS, e.g. ssd=50".into())
        );
        assert_eq!(
            named_limit("fast-nvme=20ms", "NAME=MS"),
            Ok(("fast-nvme", Duration::from_millis(20)))
        );
        assert_eq!(
            named_limit("=20", "NAME=MS"),
            Err("\"=20\": expected NAME=MS".into())
        );
    }
}
