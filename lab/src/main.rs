//! `health-lab`: the built agent driven end to end on this machine, run by
//! `cargo xtask bench`, `cargo xtask demo` and `cargo xtask cluster`.
//!
//! [`bench`] measures it against real kernel errors and writes
//! docs/benchmarks.md; [`demo`] shows it catching errors on a fault disk.
//! Both use the test harness (`health-tests`: fault disks, filesystems, the
//! API servers) and xtask's library (building the agent, its image).
//! [`cluster`] runs a single-node Kubernetes on this host to install it
//! into.

mod bench;
mod cluster;
mod demo;

use std::process::ExitCode;

use clap::Parser;
use xtask::lab_cli::LabCommand;

/// The commands are xtask's definitions (xtask::lab_cli), so that
/// `cargo xtask <command> --help` answers without building this crate.
#[derive(Parser)]
#[command(
    name = "health-lab",
    about = "volume-health end to end on this machine"
)]
struct Cli {
    #[command(subcommand)]
    command: LabCommand,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        LabCommand::Bench(args) => bench::run_bench(&args),
        LabCommand::Demo => demo::run(),
        LabCommand::Cluster(args) => cluster::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Ctrl-C: everything was cleaned up on the way out; exit as a shell
        // reports a SIGINT.
        Err(e) if e.is::<bench::interrupt::Interrupted>() || bench::interrupt::interrupted() => {
            if !e.is::<bench::interrupt::Interrupted>() {
                eprintln!("health-lab: stopped by a signal: {e:#}");
            }
            eprintln!("health-lab: interrupted");
            ExitCode::from(130)
        }
        Err(e) => {
            eprintln!("health-lab: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
