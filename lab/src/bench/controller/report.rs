//! The controller benchmark's markdown block and headline.

use std::collections::BTreeMap;

use super::audit;
use super::{
    ControllerResult, Cycles, DEFAULT_INTERVAL, FLOOR_SECS, GET_CONCURRENCY, PAGE_SIZE, REASON,
};
use crate::bench::stats::Summary;

fn mb(kb: u64) -> f64 {
    kb as f64 / 1000.0
}

/// `20 ControllerListVolumeHealth` per cycle, from the window's counts.
fn per_cycle(counts: &BTreeMap<String, f64>, cycles: usize) -> String {
    if counts.is_empty() {
        return "0".to_string();
    }
    counts
        .iter()
        .map(|(k, v)| format!("{} {k}", fmt_count(v / cycles as f64)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Whole numbers without decimals, with thousands separators.
fn fmt_count(v: f64) -> String {
    if v.fract() != 0.0 {
        return format!("{v:.2}");
    }
    let digits = format!("{}", v as u64);
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

impl Cycles {
    fn wall(&self) -> String {
        match Summary::of(&self.durations) {
            Some(s) => format!("{:.3} s ({:.3}–{:.3})", s.mean, s.min, s.max),
            None => "none".into(),
        }
    }

    /// Event writes at the API server in the window, by any client.
    fn event_writes(&self) -> f64 {
        self.apiserver_requests
            .iter()
            .filter(|((verb, resource), _)| {
                resource == "events"
                    && matches!(verb.as_str(), "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY")
            })
            .map(|(_, n)| n)
            .sum()
    }
}

impl ControllerResult {
    pub fn markdown(&self) -> String {
        let (l, g) = (&self.list, &self.get);
        let mut out = format!(
            "{} PVs of one CSI driver (`csi-test-driver`, its own process) on a real kube-apiserver and etcd \
             (started in {:.1} s); the release `health-controller` as an administrator (`system:masters`, a bench shortcut) under its own user name, \
             `--list-page-size {PAGE_SIZE}`. Creating the PVs took **{:.1} s** ({:.0} PVs/s, {} creates in flight).\n\n",
            self.volumes,
            self.apiserver_startup.as_secs_f64(),
            self.pv_create.as_secs_f64(),
            self.volumes as f64 / self.pv_create.as_secs_f64(),
            self.in_flight,
        );
        out.push_str(&format!(
            "| one cycle over {} volumes | ControllerListVolumeHealth, pages of {PAGE_SIZE} | ControllerGetVolumeHealth per volume, {GET_CONCURRENCY} in flight |\n\
             |---|---|---|\n",
            fmt_count(self.volumes as f64)
        ));
        let row = |name: &str, a: String, b: String| format!("| {name} | {a} | {b} |\n");
        out.push_str(&row(
            "`--monitor-interval`",
            format!("{} s", l.interval),
            format!("{} s", g.interval),
        ));
        out.push_str(&row(
            "cycles measured (how they ended)",
            format!("{} ({})", l.durations.len(), per_cycle(&l.results, 1)),
            format!("{} ({})", g.durations.len(), per_cycle(&g.results, 1)),
        ));
        out.push_str(&row(
            "wall time of a cycle, mean (min–max)",
            l.wall(),
            g.wall(),
        ));
        out.push_str(&row(
            "CSI calls per cycle (driver's counts)",
            per_cycle(&l.csi_calls, l.durations.len()),
            per_cycle(&g.csi_calls, g.durations.len()),
        ));
        out.push_str(&row(
            "controller start → first complete cycle (lists every PV first)",
            format!("{:.1} s", l.first_cycle.as_secs_f64()),
            format!("{:.1} s", g.first_cycle.as_secs_f64()),
        ));
        out.push_str(&row(
            "controller RSS / peak (VmHWM)",
            format!("{:.1} MB / {:.1} MB", mb(l.rss_kb), mb(l.hwm_kb)),
            format!("{:.1} MB / {:.1} MB", mb(g.rss_kb), mb(g.hwm_kb)),
        ));
        out.push_str(&row(
            "API requests per cycle, the controller's count",
            per_cycle(&l.controller_requests, l.durations.len()),
            per_cycle(&g.controller_requests, g.durations.len()),
        ));
        out.push_str(&row(
            "the controller's requests meanwhile (audit log)",
            format!(
                "{} in {:.1} s",
                audit::describe(&l.audited),
                l.window.as_secs_f64()
            ),
            format!(
                "{} in {:.1} s",
                audit::describe(&g.audited),
                g.window.as_secs_f64()
            ),
        ));
        out.push_str(&row(
            "Event writes by anyone meanwhile (`apiserver_request_total`)",
            fmt_count(l.event_writes()),
            fmt_count(g.event_writes()),
        ));
        out.push_str(&format!(
            "\nBackend condition → Event on the PVC: {} rounds per interval, each on its own volume; \
             from the driver taking the condition (stdin) to the Warning arriving on the bench's Event watch, \
             and from the volume turning healthy to the Normal `{REASON}Cleared`. \
             The existing controller (external-health-monitor) polls every {FLOOR_SECS:.0} s.\n\n",
            self.fast.warning.n
        ));
        out.push_str(
            "| `--monitor-interval` | condition → Warning p50 | p99 | max | healthy → Normal p50 | p99 | max |\n\
             |---|---:|---:|---:|---:|---:|---:|\n",
        );
        for lat in [&self.slow, &self.fast] {
            let default = if lat.interval == DEFAULT_INTERVAL {
                " (default)"
            } else {
                ""
            };
            out.push_str(&format!(
                "| {} s{default} | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s | {:.2} s |\n",
                lat.interval,
                lat.warning.p50,
                lat.warning.p99,
                lat.warning.max,
                lat.cleared.p50,
                lat.cleared.p99,
                lat.cleared.max
            ));
        }
        out.push_str(&format!(
            "| external-health-monitor, every {FLOOR_SECS:.0} s (its floor) | up to {FLOOR_SECS:.0} s | | | | | |\n"
        ));
        out.push_str(&format!(
            "\nThe controller's requests during the rounds (audit log): {} at {} s, {} at {} s.\n",
            audit::describe(&self.slow.audited),
            self.slow.interval,
            audit::describe(&self.fast.audited),
            self.fast.interval,
        ));
        out
    }

    pub fn headline(&self) -> String {
        format!(
            "controller: {} volumes, cycle {:.3} s listed / {:.2} s per-volume Get; condition -> PVC Event p50 {:.1} s, max {:.1} s at {} s (p50 {:.2} s at {} s); floor {FLOOR_SECS:.0} s",
            self.volumes,
            Summary::of(&self.list.durations).map_or(f64::NAN, |s| s.mean),
            Summary::of(&self.get.durations).map_or(f64::NAN, |s| s.mean),
            self.slow.warning.p50,
            self.slow.warning.max,
            self.slow.interval,
            self.fast.warning.p50,
            self.fast.interval,
        )
    }
}
