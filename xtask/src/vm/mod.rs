//! `cargo xtask vm`: run a command, or the real-kernel tests, on another
//! kernel.
//!
//! The agent depends on what each kernel offers (tracepoints that come and
//! go, field layouts, fentry support), and the host runs one kernel only.
//! This boots Debian's 5.10, 6.1 or 6.12 under QEMU with the host's root
//! filesystem shared, so the very binaries built here run inside:
//!
//! ```text
//! cargo xtask vm --kernel 6.1                      # the kernel test binaries
//! cargo xtask vm --kernel 5.10 --tests volumes     # another selection
//! cargo xtask vm --kernel 6.12 -- target/release/health-agent watch --duration 5
//! cargo xtask vm --kernel host -- ...              # the same, on this kernel, no VM
//! cargo xtask vm --kernel 5.10,6.1,6.12 --tests kernel_errors,iscsi
//! cargo xtask vm --kernel 5.10,6.1,6.12 --tests nfs,smb@6.12   # smb on 6.12 only
//! cargo xtask vm --kernel 6.1,6.12 --tests smb@6.1+6.12
//! ```
//!
//! A suite given as `name@K` (or `name@K+K...`) runs only in the guests of
//! those kernels: one that needs what only some kernels have (ksmbd, absent
//! from 5.10) is then not run where it cannot pass, with no skip inside the
//! test. A kernel left with no suite boots no guest.
//!
//! Several kernels are prepared and built for once, then booted side by
//! side, at most `--jobs` at a time (2): a guest under TCG keeps about one
//! host core busy (6.12 with kernel_errors: 2 min 45 s of wall time, 2 min
//! 45 s of CPU, on 2 cores), so two guests finish in little more time than
//! one. Their lines then start with `[5.10]`, `[6.1]`, `[6.12]`. A slot that
//! frees while a kernel still has suites no guest has started boots
//! a second guest of it (`[6.12#2]`), and the two share what is left
//! (`queue`).
//!
//! Everything fetched (kernel packages, their images, the virtme-ng venv)
//! is cached beside the eBPF toolchain, so only the first run downloads.

mod apt;
pub mod arm64_guests;
mod binaries;
mod devices;
mod failures;
mod file_servers;
mod guest;
mod kernels;
mod queue;
mod relay;
mod script;
mod tools;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use guest::{Machine, Outcome};
use kernels::Series;
use script::{Env, Step};
use serde_json::Value;

use crate::util::{cargo, is_root, say, workspace_root};

/// The suite run when `--tests` is not given: `kernel_errors` drives the
/// real kernel through the agent and counts exactly, for every kernel
/// source (block, ext4, xfs, writeback, partitions, errnos, floods, flush).
/// `--tests` names others: the suites of the host's real-kernel tests (the
/// modules of tests/tests/host/), the guest-only suites (the modules of
/// tests/tests/guest/), or whole integration test binaries.
const DEFAULT_TESTS: &str = "kernel_errors";

#[derive(clap::Args)]
pub struct VmArgs {
    /// Kernels to run on: Debian series booted under QEMU (5.10, 6.1, 6.12; comma-separated for several), or `host` (no VM).
    #[arg(long, value_parser = parse_kernel, value_delimiter = ',', required = true)]
    kernel: Vec<Target>,
    /// Guests running at the same time when several kernels are given.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    jobs: u32,
    /// Suites to run when no COMMAND is given, comma-separated: the host's
    /// real-kernel suites (kernel_errors, volumes, stalls...), guest-only
    /// suites (device_faults, storage_stacks, nvme_multipath, iscsi,
    /// qemu_devices, returned_errors, nfs...) or whole test binaries (host). `name@K` or `name@K+K...` (K: 5.10, 6.1,
    /// 6.12, each also in --kernel) runs a suite only on those kernels, e.g.
    /// `nfs,smb@6.12`; with `--kernel host` such a suite is not run.
    #[arg(long, value_delimiter = ',', value_parser = parse_suite, default_value = DEFAULT_TESTS)]
    tests: Vec<Suite>,
    /// Only tests whose name contains this.
    #[arg(long)]
    filter: Option<String>,
    /// Bound on the run, boot and command (not the host-side build), e.g. 90s, 20m, 1h.
    #[arg(long, value_parser = parse_duration, default_value = "20m")]
    timeout: Duration,
    /// Guest memory (QEMU -m syntax).
    #[arg(long, default_value = "2G")]
    memory: String,
    /// Guest vCPUs.
    #[arg(long, default_value_t = 2)]
    cpus: u32,
    /// Look up the newest Debian package of the series again instead of the cached choice.
    #[arg(long)]
    refresh: bool,
    /// The command to run as root in the guest (default: the test binaries).
    #[arg(last = true)]
    command: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Host,
    Debian(Series),
}

fn parse_kernel(s: &str) -> Result<Target, String> {
    use clap::ValueEnum;
    if s == "host" {
        return Ok(Target::Host);
    }
    Series::from_str(s, false)
        .map(Target::Debian)
        .map_err(|_| format!("unknown kernel {s:?}: expected 5.10, 6.1, 6.12 or host"))
}

/// One entry of `--tests`: a suite, and the kernels it runs on.
#[derive(Clone, Debug, PartialEq)]
struct Suite {
    name: String,
    /// `None`: every kernel given.
    only: Option<Vec<Series>>,
}

impl Suite {
    fn runs_on(&self, series: Series) -> bool {
        runs_on(self.only.as_deref(), series)
    }
}

fn runs_on(only: Option<&[Series]>, series: Series) -> bool {
    only.is_none_or(|only| only.contains(&series))
}

/// The series' names joined by `sep`: `5.10+6.12` as `--tests` writes a
/// suite's kernels, `5.10,6.12` as `--kernel` does.
fn series_names(series: &[Series], sep: &str) -> String {
    series
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(sep)
}

/// `name`, `name@K` or `name@K+K...`, K as `--kernel` names a Debian series.
fn parse_suite(s: &str) -> Result<Suite, String> {
    use clap::ValueEnum;
    let (name, kernels) = match s.split_once('@') {
        Some((name, kernels)) => (name, Some(kernels)),
        None => (s, None),
    };
    if name.is_empty() {
        return Err(format!(
            "no suite name in {s:?}: expected e.g. nfs or smb@6.12"
        ));
    }
    let Some(kernels) = kernels else {
        return Ok(Suite {
            name: name.to_string(),
            only: None,
        });
    };
    let mut only = Vec::new();
    for kernel in kernels.split('+') {
        if kernel.is_empty() {
            return Err(format!(
                "no kernel after @ or + in {s:?}: expected e.g. {name}@6.12 or {name}@6.1+6.12"
            ));
        }
        let series = Series::from_str(kernel, false).map_err(|_| {
            format!("unknown kernel {kernel:?} in {s:?}: expected 5.10, 6.1 or 6.12 after @")
        })?;
        // Named twice, it still runs once per guest.
        if !only.contains(&series) {
            only.push(series);
        }
    }
    Ok(Suite {
        name: name.to_string(),
        only: Some(only),
    })
}

/// Every kernel a suite is restricted to must be booted: otherwise it
/// would run on fewer kernels than it says, or on none, silently. The
/// host's kernel is no Debian series; `run` says what it leaves out.
fn check_suites(kernels: &[Target], suites: &[Suite]) -> anyhow::Result<()> {
    let booted: Vec<Series> = kernels
        .iter()
        .filter_map(|k| match k {
            Target::Debian(series) => Some(*series),
            Target::Host => None,
        })
        .collect();
    if booted.is_empty() {
        return Ok(());
    }
    for suite in suites {
        let Some(only) = &suite.only else { continue };
        if let Some(missing) = only.iter().find(|s| !booted.contains(s)) {
            bail!(
                "--tests {}@{} names kernel {}, which --kernel {} does not boot: add it to --kernel or drop it after @",
                suite.name,
                series_names(only, "+"),
                missing.name(),
                series_names(&booted, ",")
            );
        }
    }
    Ok(())
}

/// `90s`, `20m`, `1h`, or plain seconds.
fn parse_duration(s: &str) -> Result<Duration, String> {
    let (number, unit) = match s.strip_suffix(['s', 'm', 'h']) {
        Some(n) => (n, &s[n.len()..]),
        None => (s, "s"),
    };
    let n: u64 = number
        .parse()
        .map_err(|_| format!("bad duration {s:?}: expected e.g. 90s, 20m, 1h"))?;
    let secs = match unit {
        "m" => n * 60,
        "h" => n * 3600,
        _ => n,
    };
    Ok(Duration::from_secs(secs))
}

pub fn run(args: &VmArgs) -> anyhow::Result<()> {
    let host = args.kernel.iter().any(|k| matches!(k, Target::Host));
    if host && args.kernel.len() > 1 {
        bail!("--kernel host runs on this machine alone: give it without other kernels");
    }
    // Checked before any build: the kernel tests and the module install
    // below need root; only a plain command on the host does not.
    let plain_host_command = host && !args.command.is_empty();
    if !is_root() && !plain_host_command {
        bail!(
            "cargo xtask vm must run as root: it installs kernel modules under /lib/modules \
             and runs the guest command as root; the kernel tests need root on the host too"
        );
    }
    // A COMMAND runs on every kernel; the suites are what runs without one.
    let suites = match args.command.is_empty() {
        true => suites_to_run(args, host)?,
        false => Vec::new(),
    };
    // Only the host's kernel leaves suites out (`check_suites`).
    if args.command.is_empty() && suites.is_empty() {
        say("no suite of --tests runs on this machine's kernel: nothing to run");
        return Ok(());
    }
    if args.kernel.iter().any(|k| matches!(k, Target::Debian(_))) {
        guest::check_visible(&[
            ("the checkout", &workspace_root()),
            ("the target directory", &crate::util::target_dir()),
            ("the tools cache", &crate::bootstrap::cache_dir()),
        ])?;
    }
    // virtiofsd, which shares the host's root with the guests, compiles
    // (once) beside everything below; joined before the first boot.
    let virtiofsd = args
        .kernel
        .iter()
        .any(|k| matches!(k, Target::Debian(_)))
        .then(|| {
            let cache = crate::bootstrap::cache_dir().join("vm");
            std::thread::spawn(move || tools::virtiofsd(&cache))
        });
    // The kernels and tools first: a failed download should not wait for a
    // build. Each is prepared here, one after the other, before any guest
    // boots (apt, the venv and /lib/modules are not for concurrent hands).
    let mut prepared = Vec::new();
    let mut file_servers = None;
    for target in &args.kernel {
        let Target::Debian(series) = *target else {
            continue;
        };
        // Nothing to download or boot for a kernel every suite leaves out.
        if args.command.is_empty() && !suites.iter().any(|s| s.runs_on(series)) {
            say(format!(
                "{}: every suite of --tests is for other kernels; not booted",
                series.name()
            ));
            continue;
        }
        let cache = crate::bootstrap::cache_dir().join("vm");
        let tools = tools::ensure(&cache)?;
        if file_servers.is_none() {
            file_servers =
                Some(file_servers::ensure(&cache).context("preparing the file servers' programs")?);
        }
        let kernel = kernels::ensure(&cache, series, crate::cross::host()?, args.refresh)
            .with_context(|| format!("preparing Debian's {} kernel", series.name()))?;
        prepared.push((series, tools, kernel));
    }
    let (mut steps, mut env) = if args.command.is_empty() {
        default_tests(args, &suites)?
    } else {
        let cwd = std::env::current_dir().context("reading the current directory")?;
        let step = Step {
            label: args.command.join(" "),
            cwd,
            argv: args.command.clone(),
            only: None,
        };
        (vec![step], Vec::new())
    };
    env.extend(passed_env());
    if let Some(root) = &file_servers {
        env.push((file_servers::ENV.to_string(), root.display().to_string()));
    }
    if host {
        say("--kernel host: running on this machine's kernel, no VM");
        let outcome = run_on_host(&steps, &env, args.timeout)?;
        return report(&[("host".to_string(), Ok(outcome))]);
    }
    // The suites' programs (the agent, the test binaries) from a disk of
    // their own, not the shared root; a COMMAND runs as given.
    let binaries = match args.command.is_empty() {
        true => {
            let disk = binaries::BinariesDisk::make(&suite_programs(&steps, &env))?;
            disk.rewrite(&mut steps, &mut env);
            Some(disk)
        }
        false => None,
    };
    let binaries_image = binaries.as_ref().map(|d| d.image.as_path());
    if let Some(build) = virtiofsd {
        build
            .join()
            .map_err(|_| anyhow::anyhow!("the virtiofsd build's thread panicked"))??;
    }
    // Each kernel runs the steps of its suites; one the filter left
    // without any boots no guest.
    let mut guests = Vec::new();
    for (series, tools, kernel) in prepared {
        let steps = steps_on(&steps, series);
        if steps.is_empty() {
            say(format!(
                "{}: no test of its suites matches the filter; not booted",
                series.name()
            ));
            continue;
        }
        guests.push((series.name(), tools, kernel, steps));
    }
    let queues = guests
        .iter()
        .map(|(_, _, _, steps)| queue::Queue::new(steps.len()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let step_counts: Vec<usize> = guests.iter().map(|(_, _, _, steps)| steps.len()).collect();
    let jobs = guest_jobs(&step_counts);
    let side_by_side = jobs.len() > 1;
    let outcomes = run_guests(&jobs, args.jobs as usize, |&(k, nth)| {
        let (name, tools, kernel, steps) = &guests[k];
        let queue = &queues[k];
        // A second guest only for steps the first has not started.
        if nth > 1 && queue.not_taken().is_empty() {
            return None;
        }
        let label = match nth {
            1 => name.to_string(),
            n => format!("{name}#{n}"),
        };
        let machine = Machine {
            memory: args.memory.clone(),
            cpus: args.cpus,
            timeout: args.timeout,
            label: side_by_side.then(|| label.clone()),
        };
        let run = || {
            guest::run_in_guest(
                tools,
                kernel,
                &machine,
                (queue, steps),
                (&env, binaries_image),
            )
        };
        let outcome = match run() {
            Err(e) if e.downcast_ref::<guest::GuestStalled>().is_some() => {
                say(format!("{label}: {e:#}"));
                say(format!("{label}: the guest stalled (QEMU's TCG, not a test): running its unfinished steps again in a fresh guest, once"));
                queue
                    .release_unfinished(&machine.queue_name(kernel))
                    .and_then(|_| run())
            }
            Err(e) if e.downcast_ref::<guest::BootCrashed>().is_some() => {
                say(format!("{label}: {e:#}"));
                say(format!("{label}: no step had started (QEMU's TCG, not a test): booting a fresh guest, once"));
                run()
            }
            result => result,
        };
        Some((label, outcome))
    });
    let outcomes: Vec<(String, anyhow::Result<Outcome>)> = outcomes.into_iter().flatten().collect();
    let mut failed = outcomes.iter().any(|(_, o)| o.is_err());
    // Every step must have run somewhere: a guest that failed says why.
    for ((name, _, _, steps), queue) in guests.iter().zip(&queues) {
        for (i, step) in steps.iter().enumerate() {
            if !matches!(queue.result(i), queue::StepResult::Exited(_)) {
                say(format!("{name}: {} did not run to its end", step.label));
                failed = true;
            }
        }
    }
    if failed {
        for queue in queues {
            say(format!(
                "the guests' files are kept in {}",
                queue.keep().display()
            ));
        }
        if outcomes.iter().all(|(_, o)| o.is_ok()) {
            bail!("a step did not run to its end in any guest");
        }
    }
    report(&outcomes)
}

/// The suites of `--tests` to run, after checking their kernels: on the
/// host's kernel, which is no Debian series, those restricted to some
/// kernels are left out, and said so.
fn suites_to_run(args: &VmArgs, host: bool) -> anyhow::Result<Vec<Suite>> {
    check_suites(&args.kernel, &args.tests)?;
    let mut suites = Vec::new();
    for suite in &args.tests {
        match &suite.only {
            Some(only) if host => say(format!(
                "{}: runs only on Debian's {} (--tests {}@{}); not run on this machine's kernel",
                suite.name,
                series_names(only, ", "),
                suite.name,
                series_names(only, "+")
            )),
            _ => suites.push(suite.clone()),
        }
    }
    Ok(suites)
}

/// The steps a guest of `series` runs, in order.
fn steps_on(steps: &[Step], series: Series) -> Vec<Step> {
    steps
        .iter()
        .filter(|step| runs_on(step.only.as_deref(), series))
        .cloned()
        .collect()
}

/// The guests to boot, as (kernel index, 1 or 2), from each kernel's
/// number of steps: the guest of each kernel with steps, then a second
/// guest of each kernel with several, booted when a slot frees if that
/// kernel still has steps no guest has started ([`queue`]).
fn guest_jobs(steps: &[usize]) -> Vec<(usize, u32)> {
    let with = |least: usize| {
        steps
            .iter()
            .enumerate()
            .filter(move |(_, n)| **n >= least)
            .map(|(k, _)| k)
    };
    let mut jobs: Vec<(usize, u32)> = with(1).map(|k| (k, 1)).collect();
    jobs.extend(with(2).map(|k| (k, 2)));
    jobs
}

/// Runs `work` on every item, at most `jobs` at a time, and returns the
/// results in the items' order. std's scoped threads and a shared index:
/// three guests need no thread-pool crate.
fn run_guests<T: Sync, R: Send>(items: &[T], jobs: usize, work: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(item) = items.get(i) else { break };
                let result = work(item);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every item was taken by a worker")
        })
        .collect()
}

/// Says how each guest went; fails with the first failure, or exits with
/// a command's own exit code, as if it had run here.
fn report(outcomes: &[(String, anyhow::Result<Outcome>)]) -> anyhow::Result<()> {
    let mut exit_code = 0;
    let mut failures = Vec::new();
    for (name, outcome) in outcomes {
        let prefix = if outcomes.len() > 1 {
            format!("{name}: ")
        } else {
            String::new()
        };
        match outcome {
            Ok(o) => {
                let scratch = o.scratch_bytes.map_or(String::new(), |b| {
                    format!(", scratch disk {} MiB of the host's", b >> 20)
                });
                say(format!(
                    "{prefix}boot {:.1} s, command {:.1} s, exit code {}{scratch}",
                    o.boot.as_secs_f64(),
                    o.command.as_secs_f64(),
                    o.exit_code
                ));
                for failure in &o.failures {
                    say(format!("{prefix}failed: {failure}"));
                }
                if o.exit_code != 0 && exit_code == 0 {
                    exit_code = o.exit_code;
                }
            }
            Err(e) => failures.push(format!("{prefix}{e:#}")),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    if exit_code != 0 {
        std::process::exit(exit_code.clamp(1, 255));
    }
    Ok(())
}

/// Runs the same steps directly on this machine (`--kernel host`), under
/// the same timeout.
fn run_on_host(steps: &[Step], env: &Env, timeout: Duration) -> anyhow::Result<Outcome> {
    let start = Instant::now();
    let mut exit_code = 0;
    for step in steps {
        if steps.len() > 1 {
            say(format!("running {}", step.label));
        }
        let t0 = Instant::now();
        let mut child = Command::new(&step.argv[0])
            .args(&step.argv[1..])
            .current_dir(&step.cwd)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .spawn()
            .with_context(|| format!("starting {}", step.argv[0]))?;
        let status = loop {
            if let Some(status) = child.try_wait().context("waiting for the command")? {
                break status;
            }
            if start.elapsed() > timeout {
                guest::kill_tree(child.id());
                let _ = child.wait();
                bail!("timed out after {} s (--timeout)", timeout.as_secs());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        // A signal is reported as a shell would: 128 + its number.
        let rc = status.code().unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            128 + status.signal().unwrap_or(0)
        });
        if steps.len() > 1 {
            say(format!(
                "{} exited with {rc} after {:.1} s",
                step.label,
                t0.elapsed().as_secs_f64()
            ));
        }
        if rc != 0 {
            exit_code = rc;
        }
    }
    Ok(Outcome {
        exit_code,
        boot: Duration::ZERO,
        command: start.elapsed(),
        scratch_bytes: None,
        // Its output went straight to this terminal, failures included.
        failures: Vec::new(),
    })
}

/// The variables that name the programs the tests start, and the
/// workspace's release binaries they name: the agent, and the fault disk
/// server (which the tests otherwise look for beside their own binary).
const PROGRAM_VARS: &[(&str, &str)] = &[
    ("HEALTH_AGENT_BIN", "health-agent"),
    ("FAULTDISK_BIN", "faultdisk"),
];

/// The programs the suites run: each step's, and those of
/// [`PROGRAM_VARS`].
fn suite_programs(steps: &[Step], env: &Env) -> Vec<PathBuf> {
    let named = env
        .iter()
        .filter(|(key, _)| PROGRAM_VARS.iter().any(|(k, _)| k == key))
        .map(|(_, value)| value.as_str());
    steps
        .iter()
        .filter_map(|step| step.argv.first().map(String::as_str))
        .chain(named)
        .map(PathBuf::from)
        .collect()
}

/// What the guest inherits from here: PATH (with the sbin directories the
/// tests' tools live in) and Rust's diagnostics settings.
fn passed_env() -> Env {
    let mut path = std::env::var("PATH").unwrap_or_default();
    for dir in ["/usr/local/sbin", "/usr/sbin", "/sbin"] {
        if !path.split(':').any(|p| p == dir) {
            path.push(':');
            path.push_str(dir);
        }
    }
    let mut env = vec![("PATH".to_string(), path)];
    for key in [
        "RUST_BACKTRACE",
        "RUST_LOG",
        "RUST_TEST_THREADS",
        "RUST_TEST_NOCAPTURE",
    ] {
        if let Ok(value) = std::env::var(key) {
            env.push((key.to_string(), value));
        }
    }
    env
}

/// Builds the agent with its kernel object and the test binaries, as
/// `cargo xtask test` does, and returns the selected suites as steps.
fn default_tests(args: &VmArgs, suites: &[Suite]) -> anyhow::Result<(Vec<Step>, Env)> {
    // No separate `cargo build` of the agent: the test build below links
    // it (for health-agent's own tests) with the feature set `cargo xtask
    // test` uses, so after that command nothing is compiled again.
    // The tools the suites drive run in the guest from the shared root.
    crate::bootstrap::ensure_test_packages()?;
    // The agent embeds health-ebpf/object/ (rebuilt first when the kernel
    // sources changed).
    crate::ebpf::ensure()?;
    let release = crate::util::target_dir().join("release");
    let env: Env = PROGRAM_VARS
        .iter()
        .map(|(key, name)| (key.to_string(), release.join(name).display().to_string()))
        .collect();
    let binaries = test_binaries(&env)?;
    // A suite that is no binary is a module of the host's or the guest's
    // binary, each listed once. The guest's has `test = false` (drivers
    // the host lacks), which `cargo test` leaves out: built by name.
    let is_binary = |suite: &Suite| binaries.iter().any(|t| t.name == suite.name);
    let mut modules: Vec<(TestBinary, Vec<String>)> = Vec::new();
    if !suites.iter().all(is_binary) {
        for name in SUITE_BINARIES {
            let binary = match binaries.iter().find(|t| t.name == name) {
                Some(t) => t.clone(),
                None => named_test_binaries(&env, &[name])?
                    .into_iter()
                    .find(|t| t.name == name)
                    .with_context(|| format!("cargo test --no-run did not report {name}"))?,
            };
            let tests = list_tests(&binary)?;
            modules.push((binary, tests));
        }
    }
    let mut steps = Vec::new();
    for suite in suites {
        let name = &suite.name;
        if let Some(test) = binaries.iter().find(|t| &t.name == name) {
            let mut argv = vec![test.exe.display().to_string()];
            argv.extend(args.filter.clone());
            steps.push(step(suite, test, argv));
            continue;
        }
        let found = modules.iter().find_map(|(binary, all)| {
            suite_tests(all, name, args.filter.as_deref()).map(|names| (binary, names))
        });
        let Some((binary, names)) = found else {
            let known: Vec<&str> = binaries.iter().map(|t| t.name.as_str()).collect();
            let suites: Vec<&str> = modules
                .iter()
                .flat_map(|(_, all)| suite_names(all))
                .collect();
            bail!(
                "no suite or test binary named {name:?}; the suites: {}; the binaries: {}",
                suites.join(", "),
                known.join(", ")
            );
        };
        if names.is_empty() {
            say(format!("{name}: no test matches the filter; not run"));
            continue;
        }
        let mut argv = vec![binary.exe.display().to_string(), "--exact".to_string()];
        argv.extend(names);
        steps.push(step(suite, binary, argv));
    }
    Ok((steps, env))
}

/// The binaries whose modules are suites: the host's real-kernel tests
/// (tests/tests/host/: kernel_errors, volumes, ...) and those only a guest
/// runs (tests/tests/guest/: device_faults, storage_stacks, ...).
const SUITE_BINARIES: [&str; 2] = ["host", "guest"];

fn step(suite: &Suite, test: &TestBinary, argv: Vec<String>) -> Step {
    Step {
        label: suite.name.clone(),
        // cargo runs an integration test in its package's directory.
        cwd: test.dir.clone(),
        argv,
        only: suite.only.clone(),
    }
}

/// Every test of a binary (`module::test`), from its own `--list`.
fn list_tests(test: &TestBinary) -> anyhow::Result<Vec<String>> {
    let out = Command::new(&test.exe)
        .args(["--list", "--format", "terse"])
        .current_dir(&test.dir)
        .output()
        .with_context(|| format!("listing the tests of {}", test.exe.display()))?;
    if !out.status.success() {
        bail!("{} --list failed ({})", test.exe.display(), out.status);
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_string)
        .collect())
}

/// The tests of suite (module) `suite` among `all` whose names contain
/// `filter`; `None` when the binary has no such module.
fn suite_tests(all: &[String], suite: &str, filter: Option<&str>) -> Option<Vec<String>> {
    let prefix = format!("{suite}::");
    let of_suite: Vec<&String> = all.iter().filter(|n| n.starts_with(&prefix)).collect();
    if of_suite.is_empty() {
        return None;
    }
    Some(
        of_suite
            .into_iter()
            .filter(|n| filter.is_none_or(|f| n.contains(f)))
            .cloned()
            .collect(),
    )
}

/// The modules tests are in, each once, in order.
fn suite_names(all: &[String]) -> Vec<&str> {
    let mut names: Vec<&str> = all
        .iter()
        .filter_map(|n| n.split_once("::"))
        .map(|(m, _)| m)
        .collect();
    names.dedup();
    names
}

/// An integration test binary and its package's directory.
#[derive(Clone, Debug, PartialEq)]
struct TestBinary {
    name: String,
    exe: PathBuf,
    dir: PathBuf,
}

/// Every integration test binary, from `cargo test --no-run` with the
/// environment of `cargo xtask test`, so the two share one build.
fn test_binaries(env: &Env) -> anyhow::Result<Vec<TestBinary>> {
    say("building the test binaries (release profile)");
    let binaries = cargo_test_no_run(env, &[])?;
    if binaries.is_empty() {
        bail!("cargo test --no-run reported no integration test binaries");
    }
    Ok(binaries)
}

/// The integration test binaries `names`, built explicitly (`cargo test
/// --test NAME --no-run`), which also builds targets marked `test = false`.
fn named_test_binaries(env: &Env, names: &[&str]) -> anyhow::Result<Vec<TestBinary>> {
    say(format!(
        "building the test binaries {} (release profile)",
        names.join(", ")
    ));
    let args: Vec<&str> = names.iter().flat_map(|n| ["--test", n]).collect();
    cargo_test_no_run(env, &args)
}

fn cargo_test_no_run(env: &Env, args: &[&str]) -> anyhow::Result<Vec<TestBinary>> {
    let out = cargo()
        .current_dir(workspace_root())
        .args(["test", "--release", "--workspace", "--no-run"])
        .args(args)
        // Diagnostics rendered on stderr as usual; artifacts as JSON on stdout.
        .arg("--message-format=json-render-diagnostics")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stderr(Stdio::inherit())
        .output()
        .context("starting cargo test --no-run")?;
    if !out.status.success() {
        bail!(
            "building the test binaries failed ({}): cargo test --no-run {}",
            out.status,
            args.join(" ")
        );
    }
    Ok(parse_test_artifacts(&String::from_utf8_lossy(&out.stdout)))
}

fn parse_test_artifacts(json_lines: &str) -> Vec<TestBinary> {
    json_lines
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|v| v["reason"] == "compiler-artifact")
        .filter(|v| {
            v["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"))
        })
        .filter_map(|v| {
            Some(TestBinary {
                name: v["target"]["name"].as_str()?.to_string(),
                exe: PathBuf::from(v["executable"].as_str()?),
                dir: Path::new(v["manifest_path"].as_str()?)
                    .parent()?
                    .to_path_buf(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_suite_is_its_modules_tests_that_match_the_filter() {
        let all: Vec<String> = [
            "device_faults::a_vanished_disk",
            "storage_stacks::md_member_failed",
            "storage_stacks::multipath_all_paths_offline",
            "storage_stacks_extra::md_other",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            suite_tests(&all, "storage_stacks", None),
            Some(vec![
                "storage_stacks::md_member_failed".to_string(),
                "storage_stacks::multipath_all_paths_offline".to_string()
            ])
        );
        assert_eq!(
            suite_tests(&all, "storage_stacks", Some("md_")),
            Some(vec!["storage_stacks::md_member_failed".to_string()])
        );
        assert_eq!(
            suite_tests(&all, "storage_stacks", Some("nvme")),
            Some(vec![])
        );
        assert_eq!(suite_tests(&all, "storage", None), None);
        assert_eq!(
            suite_names(&all),
            ["device_faults", "storage_stacks", "storage_stacks_extra"]
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn guests_run_at_most_jobs_at_a_time_and_answer_in_order() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let results = run_guests(&[1, 2, 3, 4, 5], 2, |n| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            running.fetch_sub(1, Ordering::SeqCst);
            n * 10
        });
        assert_eq!(results, vec![10, 20, 30, 40, 50]);
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    /// Each kernel's guest first, then the second guests, which take only
    /// steps not yet started; one step needs no second guest, and a kernel
    /// without steps no guest at all.
    #[test]
    fn second_guests_come_after_every_kernels_first() {
        assert_eq!(
            guest_jobs(&[9, 9, 9]),
            [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]
        );
        assert_eq!(guest_jobs(&[1, 1]), [(0, 1), (1, 1)]);
        assert_eq!(
            guest_jobs(&[3, 0, 1, 2]),
            [(0, 1), (2, 1), (3, 1), (0, 2), (3, 2)]
        );
        assert_eq!(guest_jobs(&[0]), []);
    }

    fn suite(name: &str, only: Option<&[Series]>) -> Suite {
        Suite {
            name: name.to_string(),
            only: only.map(<[Series]>::to_vec),
        }
    }

    #[test]
    fn a_suite_names_the_kernels_it_runs_on_after_an_at() {
        use Series::{V6_1, V6_12};
        assert_eq!(parse_suite("nfs"), Ok(suite("nfs", None)));
        assert_eq!(parse_suite("smb@6.12"), Ok(suite("smb", Some(&[V6_12]))));
        assert_eq!(
            parse_suite("smb@6.12+6.1"),
            Ok(suite("smb", Some(&[V6_12, V6_1])))
        );
        assert_eq!(parse_suite("smb@6.1+6.1"), Ok(suite("smb", Some(&[V6_1]))));
    }

    #[test]
    fn a_bad_suite_is_refused_with_what_was_expected() {
        assert_eq!(
            parse_suite("smb@4.19"),
            Err(
                r#"unknown kernel "4.19" in "smb@4.19": expected 5.10, 6.1 or 6.12 after @"#
                    .to_string()
            )
        );
        assert_eq!(
            parse_suite("smb@host"),
            Err(
                r#"unknown kernel "host" in "smb@host": expected 5.10, 6.1 or 6.12 after @"#
                    .to_string()
            )
        );
        let no_kernel = |s: &str| {
            format!(r#"no kernel after @ or + in "{s}": expected e.g. smb@6.12 or smb@6.1+6.12"#)
        };
        assert_eq!(parse_suite("smb@"), Err(no_kernel("smb@")));
        assert_eq!(parse_suite("smb@6.1+"), Err(no_kernel("smb@6.1+")));
        assert_eq!(parse_suite("smb@+6.1"), Err(no_kernel("smb@+6.1")));
        assert_eq!(
            parse_suite("@6.12"),
            Err(r#"no suite name in "@6.12": expected e.g. nfs or smb@6.12"#.to_string())
        );
        assert_eq!(
            parse_suite(""),
            Err(r#"no suite name in "": expected e.g. nfs or smb@6.12"#.to_string())
        );
    }

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        vm: VmArgs,
    }

    #[test]
    fn the_tests_flag_takes_suites_with_and_without_kernels() {
        use clap::Parser;
        use Series::{V6_1, V6_12};
        let args = Cli::try_parse_from([
            "vm",
            "--kernel",
            "6.1,6.12",
            "--tests",
            "nfs,smb@6.1+6.12,iscsi@6.12",
        ])
        .unwrap()
        .vm;
        assert_eq!(
            args.tests,
            [
                suite("nfs", None),
                suite("smb", Some(&[V6_1, V6_12])),
                suite("iscsi", Some(&[V6_12]))
            ]
        );
        let args = Cli::try_parse_from(["vm", "--kernel", "6.1"]).unwrap().vm;
        assert_eq!(args.tests, [suite("kernel_errors", None)]);
        let refused = Cli::try_parse_from(["vm", "--kernel", "6.1", "--tests", "nfs,smb@"])
            .err()
            .map(|e| e.kind());
        assert_eq!(refused, Some(clap::error::ErrorKind::ValueValidation));
    }

    #[test]
    fn a_suite_for_a_kernel_not_booted_is_refused() {
        use Series::{V5_10, V6_1, V6_12};
        let debian = [Target::Debian(V5_10), Target::Debian(V6_12)];
        let suites = [suite("nfs", None), suite("smb", Some(&[V6_12]))];
        assert!(check_suites(&debian, &suites).is_ok());
        let suites = [suite("nfs", None), suite("smb", Some(&[V6_12, V6_1]))];
        assert_eq!(
            check_suites(&debian, &suites).map_err(|e| e.to_string()),
            Err("--tests smb@6.12+6.1 names kernel 6.1, which --kernel 5.10,6.12 does not boot: add it to --kernel or drop it after @".to_string())
        );
        // On the host's kernel it is left out instead (`suites_to_run`).
        assert!(check_suites(&[Target::Host], &suites).is_ok());
    }

    #[test]
    fn each_kernel_gets_the_steps_of_its_suites_in_order() {
        use Series::{V5_10, V6_1, V6_12};
        let step = |label: &str, only: Option<&[Series]>| Step {
            label: label.to_string(),
            cwd: PathBuf::from("/w/tests"),
            argv: vec![format!("/w/{label}")],
            only: only.map(<[Series]>::to_vec),
        };
        let steps = [
            step("kernel_errors", None),
            step("smb", Some(&[V6_12])),
            step("nfs", None),
            step("iscsi", Some(&[V6_1, V6_12])),
        ];
        let labels = |series| {
            steps_on(&steps, series)
                .into_iter()
                .map(|s| s.label)
                .collect::<Vec<_>>()
        };
        assert_eq!(labels(V5_10), ["kernel_errors", "nfs"]);
        assert_eq!(labels(V6_1), ["kernel_errors", "nfs", "iscsi"]);
        assert_eq!(labels(V6_12), ["kernel_errors", "smb", "nfs", "iscsi"]);
        // The steps themselves, unchanged.
        assert_eq!(steps_on(&steps, V6_12), steps);
        assert_eq!(
            steps_on(&[step("smb", Some(&[V6_12]))], V5_10),
            Vec::<Step>::new()
        );
    }

    #[test]
    fn kernels() {
        assert!(matches!(parse_kernel("host"), Ok(Target::Host)));
        assert!(matches!(
            parse_kernel("6.1"),
            Ok(Target::Debian(Series::V6_1))
        ));
        assert!(parse_kernel("4.19").is_err());
    }

    #[test]
    fn integration_tests_from_cargo_json() {
        let json = r#"{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"name":"kernel_errors"},"executable":"/w/target/release/deps/kernel_errors-1"}
{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["lib"],"name":"health_tests"},"executable":"/w/target/release/deps/health_tests-2"}
{"reason":"compiler-artifact","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["bin"],"name":"faultdisk"},"executable":"/w/target/release/faultdisk"}
{"reason":"build-finished","success":true}"#;
        let found = parse_test_artifacts(json);
        assert_eq!(
            found,
            vec![TestBinary {
                name: "kernel_errors".to_string(),
                exe: PathBuf::from("/w/target/release/deps/kernel_errors-1"),
                dir: PathBuf::from("/w/tests"),
            }]
        );
    }
}
