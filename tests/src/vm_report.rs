//! What the VM suites (device_faults, storage_stacks, nvme_multipath, iscsi,
//! qemu_devices) read from an agent's run: its events summed per (pod,
//! disk, source, op, errno) and its condition lines.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

use crate::agent::AgentRun;

/// (pod_uid or "-", disk, source, op, errno name).
pub type Key = (String, String, String, String, String);
/// Sum of `count` per [`Key`].
pub type Tally = BTreeMap<Key, u64>;

pub fn key(pod: &str, disk: &str, source: &str, op: &str, errno: &str) -> Key {
    let own = |s: &str| s.to_string();
    (own(pod), own(disk), own(source), own(op), own(errno))
}

/// [`tally`] of the events that reached a pod's volume (those of devices
/// or filesystems no pod uses left out).
pub fn tally_on_volumes(run: &AgentRun) -> Tally {
    tally(run.events.iter().filter(|e| e["pod_uid"].is_string()))
}

pub fn tally<'a>(events: impl IntoIterator<Item = &'a Value>) -> Tally {
    let mut out = Tally::new();
    for e in events {
        let field = |name: &str| e[name].as_str().unwrap_or("-").to_string();
        let k = (
            field("pod_uid"),
            field("disk"),
            field("source"),
            field("op"),
            field("errno_name"),
        );
        *out.entry(k).or_default() += e["count"].as_u64().unwrap_or(0);
    }
    out
}

/// The source that reports failed requests on this kernel: `block_rq_error`
/// where the tracepoint exists, else the agent's `block_rq_complete`
/// fallback (5.10).
pub fn request_source() -> &'static str {
    let traced = |root: &str| Path::new(root).join("events/block/block_rq_error").exists();
    if traced("/sys/kernel/tracing") || traced("/sys/kernel/debug/tracing") {
        "block_rq_error"
    } else {
        "block_rq_complete"
    }
}

/// The running kernel's release, to label what a suite prints.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|e| format!("<kernel release unreadable: {e}>"))
}

/// Every event and the agent's stderr, for a failed assertion.
pub fn show(run: &AgentRun) -> String {
    let lines: Vec<String> = run.events.iter().map(Value::to_string).collect();
    format!("events:\n{}\nstderr:\n{}", lines.join("\n"), run.stderr)
}

/// The message of the last line that raised or updated `status_reason`
/// (`Degraded ApplicationIOErrors`) from `source` (`kernel`,
/// `check/reachability`) for the pod's volume.
pub fn last_message(
    run: &AgentRun,
    pod: &str,
    pv: &str,
    status_reason: &str,
    source: &str,
) -> Option<String> {
    let head = format!("volume pod {pod} pv {pv}: ");
    run.stderr
        .lines()
        .filter_map(|l| l.strip_prefix(&head))
        .filter_map(|l| {
            ["raised", "updated"]
                .iter()
                .find_map(|verb| l.strip_prefix(&format!("{verb} {status_reason} [{source}]: ")))
        })
        .next_back()
        .map(str::to_string)
}

/// The start of the line the agent prints when a condition is raised.
pub fn raised(pod: &str, pv: &str, status_reason: &str, source: &str) -> String {
    format!("volume pod {pod} pv {pv}: raised {status_reason} [{source}]")
}

/// The line the agent prints when a condition clears.
pub fn cleared(pod: &str, pv: &str, status_reason: &str, source: &str) -> String {
    format!("volume pod {pod} pv {pv}: cleared {status_reason} [{source}]")
}

pub fn assert_logged(run: &AgentRun, line: &str) {
    assert!(
        run.stderr.contains(line),
        "{line:?} not in the agent's stderr:\n{}",
        run.stderr
    );
}

/// The pod's raised and cleared lines, in order.
pub fn condition_lines<'a>(run: &'a AgentRun, pod: &str) -> Vec<&'a str> {
    let prefix = format!("volume pod {pod} ");
    run.stderr
        .lines()
        .filter(|l| l.contains(&prefix) && (l.contains(": raised ") || l.contains(": cleared ")))
        .collect()
}

/// The agent's "failed bios passed up from a device below" figure.
pub fn passed_up(run: &AgentRun) -> u64 {
    let line = run
        .stderr
        .lines()
        .find(|l| l.starts_with("kernel side:"))
        .unwrap_or_else(|| panic!("no `kernel side:` line in:\n{}", run.stderr));
    let before = line
        .split(" failed bios passed up")
        .next()
        .expect("split yields one part");
    before
        .rsplit(|c: char| !c.is_ascii_digit())
        .find(|s| !s.is_empty())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no passed-up figure in {line:?}"))
}

/// The message of the first line starting with `prefix` (a raised or
/// updated line from [`raised`] or its `updated` twin).
pub fn message_of(run: &AgentRun, prefix: &str) -> Option<String> {
    run.stderr
        .lines()
        .find_map(|l| l.strip_prefix(prefix)?.strip_prefix(": "))
        .map(str::to_string)
}

/// The pod's lines of `status_reason` from `source`: `raised`, `updated`
/// or `cleared`, in order.
pub fn transitions(run: &AgentRun, pod: &str, status_reason: &str, source: &str) -> Vec<String> {
    let head = format!("volume pod {pod} pv ");
    run.stderr
        .lines()
        .filter(|l| l.starts_with(&head))
        .filter_map(|l| {
            ["raised", "updated", "cleared"]
                .into_iter()
                .find(|verb| l.contains(&format!(": {verb} {status_reason} [{source}]")))
                .map(str::to_string)
        })
        .collect()
}

/// raised and cleared only: an `updated` line (a new message for the same
/// condition) is no flap.
pub fn raised_and_cleared(
    run: &AgentRun,
    pod: &str,
    status_reason: &str,
    source: &str,
) -> Vec<String> {
    let mut t = transitions(run, pod, status_reason, source);
    t.retain(|v| v != "updated");
    t
}

/// Every condition line and stack line of the pod, for the report.
pub fn volume_lines(run: &AgentRun, pod: &str) -> String {
    let head = format!("volume pod {pod} pv ");
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.starts_with(&head))
        .collect();
    lines.join("\n")
}

/// An `IOStalled` message of one read waiting on `device`, whoever issued
/// it, with `--stall-after` `stall_after` (`2s`); what the stack says may
/// follow (`; the stack: ...`).
pub fn assert_one_read_stalled(message: &str, device: &str, stall_after: &str) {
    let own = message.split("; the stack: ").next().unwrap_or_default();
    assert!(
        own.starts_with(&format!(
            "{device}: I/O stalled, 1 waiting (1 read); the oldest, a read"
        )) && own.ends_with(&format!("(--stall-after {stall_after})")),
        "{message}"
    );
}

/// The `HighLatency` message of `line` (a raised line): writes on `device`
/// over 2 s windows above a `limit_ms` limit, the limit that of the class
/// of `disk` (the disk below, by its `queue/rotational`), and the p99 named
/// by its bucket: the bucket of `slowest_held` (what every write was held
/// at the least) or one above it, where an emulated guest adds its own
/// delay to the slowest writes of a window. No bucket below it can be
/// right: every write took that long.
pub fn assert_slow_writes(
    run: &AgentRun,
    line: &str,
    (device, disk, pod): (&str, &str, &str),
    limit_ms: u64,
    slowest_held: std::time::Duration,
) -> anyhow::Result<()> {
    use health_common::{latency_bucket, latency_bucket_floor_us, LATENCY_BUCKETS};
    let rotational = crate::sys::read_sysfs(format!("/sys/block/{disk}/queue/rotational"))?;
    let class = match rotational.trim() {
        "1" => "rotational",
        _ => "ssd",
    };
    let message = message_of(run, line).unwrap_or_default();
    let least = latency_bucket(slowest_held.as_micros() as u64);
    let p99 = (least..LATENCY_BUCKETS)
        .map(|b| format!("{}ms", latency_bucket_floor_us(b) / 1000))
        .find(|p| message.contains(&format!(" at least {p} ")))
        .unwrap_or_else(|| "none".to_string());
    assert_eq!(
        message,
        format!(
            "{device}: write latency p99 at least {p99} over 2s windows, above {limit_ms}ms (the limit for {class})"
        ),
        "{}",
        volume_lines(run, pod)
    );
    Ok(())
}
