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
mod selection;
mod side_by_side;
mod test_steps;
mod tools;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use guest::{Machine, Outcome};
use kernels::{Kernel, Series};
use script::{Env, Step};
use selection::{parse_kernel, parse_suite, steps_on, suites_to_run, Suite, Target};
use side_by_side::{report, KernelGuests};
use test_steps::{default_tests, suite_programs};
use tools::Tools;

use crate::util::{is_root, say, workspace_root};

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
    let Some((host, suites)) = what_to_run(args)? else {
        return Ok(());
    };
    let boots_guests = args.kernel.iter().any(|k| matches!(k, Target::Debian(_)));
    if boots_guests {
        guest::check_visible(&[
            ("the checkout", &workspace_root()),
            ("the target directory", &crate::util::target_dir()),
            ("the tools cache", &crate::bootstrap::cache_dir()),
        ])?;
    }
    // virtiofsd, which shares the host's root with the guests, compiles
    // (once) beside everything below; joined before the first boot.
    let virtiofsd = boots_guests.then(|| {
        let cache = crate::bootstrap::cache_dir().join("vm");
        std::thread::spawn(move || tools::virtiofsd(&cache))
    });
    let (prepared, file_servers) = prepare_kernels(args, &suites)?;
    let (mut steps, mut env) = steps_and_env(args, &suites, file_servers.as_deref())?;
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
    let guests = kernel_guests(prepared, &steps);
    let machine = Machine {
        memory: args.memory.clone(),
        cpus: args.cpus,
        timeout: args.timeout,
        label: None,
    };
    side_by_side::boot(
        &guests,
        args.jobs as usize,
        &machine,
        (&env, binaries_image),
    )
}

/// Each kernel with the steps of its suites; one the filter left without
/// any boots no guest.
fn kernel_guests(prepared: Vec<Prepared>, steps: &[Step]) -> Vec<KernelGuests> {
    let mut guests = Vec::new();
    for Prepared {
        series,
        tools,
        kernel,
    } in prepared
    {
        let steps = steps_on(steps, series);
        if steps.is_empty() {
            say(format!(
                "{}: no test of its suites matches the filter; not booted",
                series.name()
            ));
            continue;
        }
        guests.push(KernelGuests {
            name: series.name(),
            tools,
            kernel,
            steps,
        });
    }
    guests
}

/// Whether this runs on the host's kernel, and the suites to run (none for
/// a COMMAND); `None` when no suite of `--tests` runs on this kernel.
fn what_to_run(args: &VmArgs) -> anyhow::Result<Option<(bool, Vec<Suite>)>> {
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
        true => suites_to_run(&args.kernel, &args.tests, host)?,
        false => Vec::new(),
    };
    // Only the host's kernel leaves suites out (`check_suites`).
    if args.command.is_empty() && suites.is_empty() {
        say("no suite of --tests runs on this machine's kernel: nothing to run");
        return Ok(None);
    }
    Ok(Some((host, suites)))
}

/// A kernel ready to boot, and QEMU's tools for it.
struct Prepared {
    series: Series,
    tools: Tools,
    kernel: Kernel,
}

/// The kernels and tools first: a failed download should not wait for a
/// build. Each is prepared here, one after the other, before any guest
/// boots (apt, the venv and /lib/modules are not for concurrent hands).
fn prepare_kernels(
    args: &VmArgs,
    suites: &[Suite],
) -> anyhow::Result<(Vec<Prepared>, Option<PathBuf>)> {
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
        prepared.push(Prepared {
            series,
            tools,
            kernel,
        });
    }
    Ok((prepared, file_servers))
}

/// The steps (the suites', or the COMMAND) and what the guests get in
/// their environment.
fn steps_and_env(
    args: &VmArgs,
    suites: &[Suite],
    file_servers: Option<&Path>,
) -> anyhow::Result<(Vec<Step>, Env)> {
    let (steps, mut env) = if args.command.is_empty() {
        default_tests(args.filter.as_deref(), suites)?
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
    if let Some(root) = file_servers {
        env.push((file_servers::ENV.to_string(), root.display().to_string()));
    }
    Ok((steps, env))
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

#[cfg(test)]
mod tests {
    use super::kernels::Series;
    use super::selection::suite;
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("20m"), Ok(Duration::from_secs(1200)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
        assert!(parse_duration("soon").is_err());
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
}
