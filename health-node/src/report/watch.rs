//! `health-agent watch`: the standalone view. Prints every kernel storage
//! error on this host as it happens, with exact counts, the per-device
//! totals and the volume condition changes.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::time::SystemTime;

use anyhow::Context as _;
use health_common::CounterKey;
use health_core::conditions::errno_name;
use health_core::conditions::Change;
use health_core::dev::Dev;
use health_kernel::clock::Clock;
use health_kernel::collector::{KernelError, KernelStats};
use health_kernel::names::{op_name, source_name, Kind};
use health_topology::Topology;

use super::event::ErrorEvent;
use super::Reporter;
use crate::volumes::{Handled, LiveVolumes, VolumeChanges, VolumeIndex, VolumeKey};

impl Reporter for View {
    type Wake = ();

    fn errors(
        &mut self,
        batch: &[KernelError],
        topo: &Topology,
        clock: &Clock,
        volumes: Option<&VolumeIndex>,
    ) -> anyhow::Result<()> {
        self.print(batch, topo, clock, volumes)
    }

    fn changes(&mut self, handled: &Handled, _gone: &[VolumeKey], volumes: &LiveVolumes) {
        print_stacks(&handled.stacks, volumes.index(), self.json);
        print_changes(&handled.changes, volumes.index(), self.json);
    }

    fn totals(
        &mut self,
        totals: &BTreeMap<CounterKey, u64>,
        topo: &Topology,
    ) -> anyhow::Result<()> {
        if self.json {
            return Ok(());
        }
        self.print_totals(totals, topo)
    }

    fn finish(
        &mut self,
        totals: &BTreeMap<CounterKey, u64>,
        topo: &Topology,
        stats: &KernelStats,
    ) -> anyhow::Result<()> {
        self.print_final(totals, topo, stats)
    }
}

/// Printing, filtering and the running per-device tallies.
pub struct View {
    json: bool,
    devices: HashSet<Dev>,
    stdout: std::io::Stdout,
}

impl View {
    /// `json`: JSON Lines on stdout; `devices`: only these (all when empty).
    pub fn new(json: bool, devices: &[Dev]) -> Self {
        Self {
            json,
            devices: devices.iter().copied().collect(),
            stdout: std::io::stdout(),
        }
    }

    fn wanted(&self, dev: Dev) -> bool {
        self.devices.is_empty() || self.devices.contains(&dev)
    }

    /// One line per event, or with `volumes`, one per pod volume the
    /// event's device reaches (events reaching none keep null volume fields).
    fn print(
        &mut self,
        batch: &[KernelError],
        topo: &Topology,
        clock: &Clock,
        volumes: Option<&VolumeIndex>,
    ) -> anyhow::Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let now = SystemTime::now();
        let mut out = self.stdout.lock();
        for e in batch {
            if !self.wanted(Dev::from_kernel(e.key.dev)) {
                continue;
            }
            let mut ev = ErrorEvent::resolve(e, topo, clock, now);
            let dev = ev.device;
            let mut reached = volumes
                .into_iter()
                .flat_map(|v| v.volumes_for(dev))
                .peekable();
            if reached.peek().is_none() {
                self.write(&mut out, &ev)?;
            }
            for v in reached {
                ev.set_volume(Some(&v.volume));
                self.write(&mut out, &ev)?;
            }
        }
        out.flush().context("flushing events to stdout")?;
        Ok(())
    }

    fn write(&self, out: &mut impl Write, ev: &ErrorEvent) -> anyhow::Result<()> {
        if self.json {
            serde_json::to_writer(&mut *out, ev).context("writing an event")?;
            out.write_all(b"\n").context("writing an event")?;
        } else {
            writeln!(out, "{}", ev.human_line()).context("writing an event")?;
        }
        Ok(())
    }

    fn totals_lines(&self, totals: &BTreeMap<CounterKey, u64>, topo: &Topology) -> Vec<String> {
        // An earlier holder of a number is a device of its own, shown by
        // number and sequence number (see `Topology::incarnation`).
        let mut per_dev: BTreeMap<(Dev, Option<u64>), Vec<String>> = BTreeMap::new();
        for (key, n) in totals {
            let dev = Dev::from_kernel(key.dev);
            let earlier = topo.is_earlier(dev, key.diskseq).then_some(key.diskseq);
            if !self.wanted(dev) {
                continue;
            }
            let mut what = Kind::of_source(key.source).as_str().to_string();
            if let Some(op) = op_name(key.op) {
                what.push(' ');
                what.push_str(op);
            }
            if key.errno != 0 {
                what.push(' ');
                what.push_str(&errno_name(key.errno as i32));
            }
            what.push_str(&format!(" ({}) {n}", source_name(key.source)));
            per_dev.entry((dev, earlier)).or_default().push(what);
        }
        per_dev
            .into_iter()
            .map(|((dev, earlier), items)| {
                if let Some(seq) = earlier {
                    return format!(
                        "  {dev} (a device gone, disk sequence {seq}): {}",
                        items.join(", ")
                    );
                }
                let name = topo
                    .device(dev)
                    .map_or_else(|| "?".to_string(), |d| d.name.clone());
                let mount = topo
                    .affected_mounts(dev)
                    .first()
                    .map(|m| format!(" on {}", m.mount_point.display()))
                    .unwrap_or_default();
                format!("  {dev} {name}{mount}: {}", items.join(", "))
            })
            .collect()
    }

    fn print_totals(
        &mut self,
        totals: &BTreeMap<CounterKey, u64>,
        topo: &Topology,
    ) -> anyhow::Result<()> {
        let lines = self.totals_lines(totals, topo);
        if lines.is_empty() {
            return Ok(());
        }
        let mut out = self.stdout.lock();
        writeln!(out, "totals since start:")?;
        for l in lines {
            writeln!(out, "{l}")?;
        }
        out.flush()?;
        Ok(())
    }

    fn print_final(
        &mut self,
        totals: &BTreeMap<CounterKey, u64>,
        topo: &Topology,
        stats: &KernelStats,
    ) -> anyhow::Result<()> {
        let lines = self.totals_lines(totals, topo);
        let mut text = String::new();
        if lines.is_empty() {
            text.push_str("no storage errors seen\n");
        } else {
            text.push_str("totals:\n");
            for l in lines {
                text.push_str(&l);
                text.push('\n');
            }
        }
        text.push_str(&format!(
            "kernel side: {} samples rate-limited, {} lost to a full ring buffer, {} errors not countable (counter map full), {} repeated writeback reports merged, {} program runs skipped by the kernel, {} failed bios passed up from a device below (counted there), {} bios not followed for stalls (waiting map full), {} latencies not counted (latency map full); {}\n",
            stats.samples_suppressed, stats.ringbuf_full, stats.counter_map_full, stats.writeback_repeats, stats.program_misses, stats.bio_propagated, stats.waiting_full, stats.latency_full, witness_text(stats)
        ));
        // JSON mode keeps stdout a pure event stream.
        if self.json {
            eprint!("{text}");
        } else {
            print!("{text}");
        }
        Ok(())
    }
}

/// Prints condition changes, one line each: on stdout, or in JSON mode on
/// stderr (stdout stays a pure event stream).
pub fn print_changes(changes: &[VolumeChanges], index: &VolumeIndex, json: bool) {
    let mut text = String::new();
    for vc in changes {
        let pv = pv_of(index, &vc.key);
        for c in &vc.changes {
            let line = match c {
                Change::Raised(c) => {
                    format!(
                        "raised {} {} [{}]: {}",
                        c.status, c.reason, c.source, c.message
                    )
                }
                Change::Updated { condition: c, .. } => {
                    format!(
                        "updated {} {} [{}]: {}",
                        c.status, c.reason, c.source, c.message
                    )
                }
                Change::Cleared(c) => {
                    format!("cleared {} {} [{}]", c.status, c.reason, c.source)
                }
            };
            text.push_str(&format!("volume pod {} pv {pv}: {line}\n", vc.key.pod_uid));
        }
    }
    print_volume_lines(&text, json, "volume condition changes");
}

/// Prints the stack under each volume whose stack changed (and each one's
/// first), one line each, where condition changes go: an operator sees
/// the layers behind a condition as they change.
pub fn print_stacks(stacks: &[(VolumeKey, String)], index: &VolumeIndex, json: bool) {
    let mut text = String::new();
    for (key, summary) in stacks {
        let pv = pv_of(index, key);
        text.push_str(&format!(
            "volume pod {} pv {pv}: stack {summary}\n",
            key.pod_uid
        ));
    }
    print_volume_lines(&text, json, "volume stacks");
}

fn pv_of(index: &VolumeIndex, key: &VolumeKey) -> String {
    index
        .get(key)
        .and_then(|v| v.volume.pv.clone())
        .unwrap_or_else(|| key.name.clone())
}

fn print_volume_lines(text: &str, json: bool, what: &str) {
    if text.is_empty() {
        return;
    }
    let written = if json {
        std::io::stderr().lock().write_all(text.as_bytes())
    } else {
        let mut out = std::io::stdout().lock();
        out.write_all(text.as_bytes()).and_then(|()| out.flush())
    };
    if let Err(e) = written {
        tracing::warn!("printing {what}: {e}");
    }
}

/// The tracer witness's figures for the `kernel side:` line.
fn witness_text(stats: &KernelStats) -> String {
    match stats.traced {
        Some(traced) => format!(
            "the kernel's tracer saw {traced} failed requests at block_rq_error, {} of them counted by no program (the kernel ran none for them)",
            stats.uncounted
        ),
        None => "no tracer witness".to_string(),
    }
}
