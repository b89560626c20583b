//! Event latency: from a failed request to the Event request reaching the
//! API server.
//!
//! The real agent in cluster mode (`health-agent run`) talks to the fake
//! API server of `health_tests::apiserver`, which stamps every request with
//! CLOCK_MONOTONIC when its head arrives; the fault disk stamps the failed
//! request with the same clock. One pod uses one PVC on the failing disk.
//!
//! Each round fails one O_DIRECT write and waits for the Warning Events on
//! the pod and on the PVC (a new episode, so a create each), then for the
//! recovery Events (one aggregated Normal Event per object) once the (shortened) quiet window passes, so that the
//! next round is again a first error. What is measured is what an operator
//! waits for: the first report of a failure. Later errors of an episode are
//! folded into the same Event by design, at most once per
//! `--event-update-interval`.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use health_tests::apiserver::FakeApiServer;
use health_tests::{fs, FaultDisk, LoopDevice, Mount, Op, Rule};
use serde_json::json;
use tempfile::TempDir;

use super::agent::AgentProc;
use super::dio::DirectIo;
use super::stats::Summary;
use super::{interrupt, Tools};

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;
/// No API request for this long ends a round.
const QUIET_NS: u64 = 100_000_000;
const POD_UID: &str = "5e5e5e5e-0000-4000-8000-00000000005e";
const PV: &str = "pv-bench";

pub struct Config {
    pub rounds: u32,
    /// Print each round's API requests (`--event-trace`).
    pub trace: bool,
    /// The agent counts failed requests at `block_rq_complete`, before the
    /// kernel prints them (`--early-block-errors`).
    pub early_block_errors: bool,
}

pub struct EventsResult {
    pub rounds: u32,
    /// Milliseconds, per round, to when the kernel of the server's host
    /// received the request (its socket's receive time).
    pub to_pod: Summary,
    pub to_pvc: Summary,
    /// The same, to when the (debug-built) server's handler saw it.
    pub to_pod_handler: Summary,
    pub to_pvc_handler: Summary,
    pub requests: usize,
    /// The agent's resident set at the end and its peak, kB (cluster mode:
    /// kube client, two reflectors, the recorder, the metrics server).
    pub rss_kb: u64,
    pub hwm_kb: u64,
    /// The kernel consoles and the console log level: the kernel prints a
    /// failed request's `I/O error` line to them (rate-limited) before the
    /// `block_rq_error` tracepoint runs, which a slow (serial) console
    /// puts into these figures.
    pub console: String,
}

/// One pod on node-1 using PVC bench/data, whose ext4 lives on a fault disk,
/// and the agent in cluster mode against the fake API server: the setup of
/// this part and of [`super::status`]. Fields drop in reverse order of setup.
pub(super) struct OnePod {
    pub(super) agent: AgentProc,
    pub(super) api: FakeApiServer,
    _mount: Mount,
    pub(super) lo: LoopDevice,
    pub(super) disk: FaultDisk,
    _root: TempDir,
}

impl OnePod {
    /// Starts it all; `args` go to `health-agent run` after the fixed ones.
    /// Returns once the agent's first pod and PV lists are in.
    pub(super) fn start(tools: &Tools, args: &[&str]) -> Result<OnePod> {
        let root = tempfile::Builder::new()
            .prefix("kubelet-bench-")
            .tempdir()?;
        let disk = interrupt::spawn_shielded(|| FaultDisk::start_with(&tools.faultdisk, 64 * MIB))?;
        let lo = disk.attach_loop(false)?;
        fs::mkfs_ext4(lo.path())?;
        let dir = root
            .path()
            .join("pods")
            .join(POD_UID)
            .join("volumes/kubernetes.io~csi")
            .join(PV);
        std::fs::create_dir_all(dir.join("mount"))?;
        std::fs::write(
            dir.join("vol_data.json"),
            json!({"driverName": "bench.csi", "volumeHandle": "h", "specVolID": PV,
                   "nodeName": "node-1", "volumeLifecycleMode": "Persistent"})
            .to_string(),
        )?;
        let mount = Mount::at(lo.path(), dir.join("mount"), "ext4", "")?;

        // Two workers: the stamp of an Event arriving on a second connection
        // must not wait for the (debug-built) server to finish the first.
        let api = FakeApiServer::start_multi_thread(2)?;
        api.put(
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": PV},
            "spec": {"claimRef": {"namespace": "bench", "name": "data", "uid": "pvc-uid"},
                     "csi": {"driver": "bench.csi", "volumeHandle": "h"}}}),
        );
        // The PVC itself, for the agent's `volume-health.io/health` label.
        api.put(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": "data", "namespace": "bench", "uid": "pvc-uid"},
            "spec": {"volumeName": PV}}));
        api.put(json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "app-0", "namespace": "bench", "uid": POD_UID},
            "spec": {"nodeName": "node-1", "containers": [{"name": "c", "image": "x"}],
                     "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}}));
        let kubeconfig = api.write_kubeconfig(root.path())?;
        let metrics = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
        let mut all: Vec<String> = vec![
            "--node-name".into(),
            "node-1".into(),
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--kubelet-root".into(),
            root.path().display().to_string(),
            "--state-dir".into(),
            root.path()
                .join("volume-health-state")
                .display()
                .to_string(),
            "--metrics-addr".into(),
            metrics.to_string(),
        ];
        all.extend(args.iter().map(|s| s.to_string()));
        let agent = AgentProc::start_mode(&tools.agent, "run", &all, None)?;
        // The first pod and PV lists must be in before a pod can be named (the
        // agent also lists its earlier Events at start: not one of those).
        api.wait_for(Duration::from_secs(20), |api| {
            let lists = api
                .requests()
                .iter()
                .filter(|r| r.method == "GET" && !r.is_watch() && r.status == 200)
                .filter(|r| r.path == "/api/v1/pods" || r.path == "/api/v1/persistentvolumes")
                .count();
            (lists >= 2).then_some(())
        })?;
        std::thread::sleep(Duration::from_millis(500));
        Ok(OnePod {
            agent,
            api,
            _mount: mount,
            lo,
            disk,
            _root: root,
        })
    }
}

pub fn run(tools: &Tools, cfg: &Config) -> Result<EventsResult> {
    let early: &[&str] = if cfg.early_block_errors {
        &["--early-block-errors"]
    } else {
        &[]
    };
    let fx = OnePod::start(
        tools,
        &[
            early,
            &[
                "--kernel-quiet-window",
                "1",
                "--check-interval",
                "0.2",
                // Each round writes two Events per object; the default cap (6 a
                // minute) would make later rounds wait for it, which is not latency.
                "--event-writes-per-minute",
                "1000",
                // Repeated recoveries aggregate into one Event, patched at most this
                // often; shorter keeps the rounds short.
                "--event-update-interval",
                "0.5",
            ],
        ]
        .concat(),
    )?;
    fx.agent.expect_early_counting(cfg.early_block_errors)?;
    let (api, disk, lo) = (&fx.api, &fx.disk, &fx.lo);
    let io = DirectIo::open(lo.path(), BLOCK as usize)?;
    let (mut to_pod, mut to_pvc) = (Vec::new(), Vec::new());
    let (mut to_pod_handler, mut to_pvc_handler) = (Vec::new(), Vec::new());
    for round in 0..cfg.rounds {
        interrupt::check()?;
        let offset = 40 * MIB + u64::from(round) * BLOCK;
        let seen = api.request_count();
        let since = disk.injections()?.last().map_or(0, |i| i.seq + 1);
        let rule = disk.add_rule(Rule::new(Op::Write, libc::EIO).range(offset, BLOCK))?;
        match io.write_at(offset) {
            Err(e) if e.raw_os_error() == Some(libc::EIO) => {}
            other => bail!("round {round}: expected EIO, got {other:?}"),
        }
        let creates = |api: &FakeApiServer, reason: &str| -> Vec<(String, Option<u64>, u64)> {
            api.requests_since(seen)
                .into_iter()
                .filter(|r| r.method == "POST" && r.status == 201)
                .filter_map(|r| {
                    let b = r.body.as_ref()?;
                    (b["reason"] == reason).then(|| {
                        (
                            b["involvedObject"]["kind"]
                                .as_str()
                                .unwrap_or("")
                                .to_string(),
                            r.rx_mono_ns,
                            r.at_mono_ns,
                        )
                    })
                })
                .collect()
        };
        let warnings = api
            .wait_for(Duration::from_secs(10), |api| {
                let c = creates(api, "BlockIOErrors");
                (c.len() == 2).then_some(c)
            })
            .with_context(|| format!("round {round}: the Warning events"))?;
        // The fault disk's bookkeeping only now: its control connection
        // would otherwise compete for the CPUs with the path measured.
        disk.remove_rule(rule)?;
        let injected = disk.injections_since(since)?;
        let [inj] = injected.as_slice() else {
            bail!("round {round}: {} injections for one write", injected.len());
        };
        if cfg.trace {
            for r in &api.requests_since(seen) {
                let rx = r.rx_mono_ns.unwrap_or(0);
                eprintln!(
                    "events: round {round} received {:+.3} ms, handled {:+.3} ms {} {} {}",
                    (rx as f64 - inj.mono_ns as f64) / 1e6,
                    (r.at_mono_ns as f64 - inj.mono_ns as f64) / 1e6,
                    r.method,
                    r.path,
                    r.status
                );
            }
        }
        for (kind, rx, at) in warnings {
            let rx = rx.with_context(|| {
                format!("round {round}: the {kind} Event carries no kernel receive time")
            })?;
            let ms = |t: u64| (t as f64 - inj.mono_ns as f64) / 1e6;
            let (received, handled) = match kind.as_str() {
                "Pod" => (&mut to_pod, &mut to_pod_handler),
                _ => (&mut to_pvc, &mut to_pvc_handler),
            };
            received.push(ms(rx));
            handled.push(ms(at));
        }
        // Recoveries aggregate into one Normal Event per object: its count
        // is the number of rounds so far.
        let recovered = u64::from(round) + 1;
        api.wait_for(Duration::from_secs(10), |api| {
            let done = api
                .events()
                .iter()
                .filter(|e| {
                    e["reason"] == "BlockIOErrorsCleared" && e["count"].as_u64() == Some(recovered)
                })
                .count();
            (done == 2).then_some(())
        })
        .with_context(|| format!("round {round}: the recovery events"))?;
        // And the writes that follow the recovery (the VolumeHealth status,
        // the PVC's label): the next round's error must meet a quiet agent,
        // not race the tail of this round.
        api.wait_for(Duration::from_secs(10), |api| {
            let last = api.requests_since(seen).last().map_or(0, |r| r.at_mono_ns);
            (super::agent::mono_ns().saturating_sub(last) >= QUIET_NS).then_some(())
        })
        .with_context(|| format!("round {round}: the API traffic to settle"))?;
    }
    let requests = api.request_count();
    let rss_kb = fx.agent.status_kb("VmRSS")?;
    let hwm_kb = fx.agent.status_kb("VmHWM")?;
    fx.agent.stop_ok()?;
    Ok(EventsResult {
        rounds: cfg.rounds,
        to_pod: Summary::of(&to_pod).context("no pod events measured")?,
        to_pvc: Summary::of(&to_pvc).context("no PVC events measured")?,
        to_pod_handler: Summary::of(&to_pod_handler).context("no pod events measured")?,
        to_pvc_handler: Summary::of(&to_pvc_handler).context("no PVC events measured")?,
        requests,
        rss_kb,
        hwm_kb,
        console: console(),
    })
}

/// `ttyS0 at console_loglevel 4`, from /proc (what it could read).
fn console() -> String {
    let names: Vec<String> = std::fs::read_to_string("/proc/consoles")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect();
    let level = std::fs::read_to_string("/proc/sys/kernel/printk")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".to_string());
    let names = if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    };
    format!("{names} at console_loglevel {level}")
}

impl EventsResult {
    pub fn markdown(&self) -> String {
        let row = |name: &str, s: &Summary| {
            format!(
                "| {name} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
                s.n, s.min, s.p50, s.p90, s.p99, s.max
            )
        };
        let mut out = format!(
            "{} rounds: one failed O_DIRECT write on a PVC's disk, then the Warning Events on its pod and its PVC \
             (each a create, new episode), then the recovery Events and 100 ms without any API request before the next round. \
             Times from the fault disk failing the request to the Event request arriving at the API server: \
             the kernel's receive time of the request on the server's socket (`SO_TIMESTAMPNS`), and, for comparison, when the \
             server's (debug-built, 2-thread) handler saw it, which adds the server's own scheduling and parsing \
             (all CLOCK_MONOTONIC); the per-object write cap raised to 1000/min so rounds never wait on it; {} API requests in all.\n\n",
            self.rounds, self.requests
        );
        out.push_str("| interval (ms) | n | min | p50 | p90 | p99 | max |\n|---|---:|---:|---:|---:|---:|---:|\n");
        out.push_str(&row("failed request → Event on the pod", &self.to_pod));
        out.push_str(&row("failed request → Event on the PVC", &self.to_pvc));
        out.push_str(&row(
            "… on the pod, as the server's handler saw it",
            &self.to_pod_handler,
        ));
        out.push_str(&row(
            "… on the PVC, as the server's handler saw it",
            &self.to_pvc_handler,
        ));
        out.push_str(&format!(
            "\nAgent memory in cluster mode at the end: RSS {:.1} MB, peak {:.1} MB. \
             Kernel console: {} (errors, level 3, are printed there when the level is above 3).\n",
            self.rss_kb as f64 / 1000.0,
            self.hwm_kb as f64 / 1000.0,
            self.console
        ));
        out
    }

    pub fn headline(&self) -> String {
        format!(
            "events: failed request -> pod Event p50 {:.1} ms, p99 {:.1} ms; -> PVC Event p50 {:.1} ms, p99 {:.1} ms ({} rounds)",
            self.to_pod.p50, self.to_pod.p99, self.to_pvc.p50, self.to_pvc.p99, self.rounds
        )
    }
}
