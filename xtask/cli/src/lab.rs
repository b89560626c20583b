//! The `lab` crate's binary, which xtask builds and runs: the benchmarks,
//! the demo and the local cluster drive the built agent end to end through the
//! test harness (kube, aya, FUSE), which xtask itself does not compile.

use std::process::Command;

use xtask::lab_cli::bench::Kubernetes;
use xtask::lab_cli::{cluster, LabCommand};
use xtask::util::{run_foreground, target_dir};

/// The lab ended with this exit status (130 after Ctrl-C); xtask exits
/// with it too.
#[derive(Debug, thiserror::Error)]
#[error("the lab exited with status {0}")]
pub struct Exited(pub u8);

/// Builds the lab (release) and runs `health-lab COMMAND ARGS`.
pub fn run(command: &str, args: &[String]) -> anyhow::Result<()> {
    run_on(command, args, Kubernetes::default())
}

/// [`run`], with the API server of `version` where the command starts one.
fn run_on(command: &str, args: &[String], version: Kubernetes) -> anyhow::Result<()> {
    // The lab, the fault disk server and the CSI driver it starts come from
    // the one workspace build (`cargo xtask test` leaves it done).
    xtask::build::workspace(&[])?;
    let bin = target_dir().join("release/health-lab");
    let mut lab = Command::new(&bin);
    // The Kubernetes of the local cluster and of the benchmarks' real API
    // server, built first if needed.
    xtask::components::for_lab(command, args, version)?.apply(&mut lab);
    // After Ctrl-C the lab cleans up its disks and mounts and exits 130.
    let status = run_foreground(lab.arg(command).args(args))?;
    match status.code() {
        Some(0) => Ok(()),
        Some(code) => Err(Exited(code as u8).into()),
        None => {
            use std::os::unix::process::ExitStatusExt as _;
            Err(Exited(128 + status.signal().unwrap_or(0) as u8).into())
        }
    }
}

/// Runs a command xtask has parsed: `cluster test` here, the rest in the
/// lab, given `args`, the words after the command's name as the user wrote
/// them (the lab parses them with the same definitions).
pub fn run_command(command: &LabCommand, args: &[String]) -> anyhow::Result<()> {
    if let LabCommand::Cluster(cluster) = command {
        if let cluster::ClusterCommand::Test { filter } = &cluster.command {
            if cluster.state_dir.is_some() {
                anyhow::bail!(
                    "`cluster test` uses the default state directory; --state-dir is for up, down, status and fault"
                );
            }
            return crate::cluster_test::run(filter);
        }
    }
    let version = match command {
        LabCommand::Bench(bench) => bench.kubernetes,
        _ => Kubernetes::default(),
    };
    run_on(command.name(), args, version)
}

/// The words after the subcommand of this process's command line
/// (`cargo xtask cluster up --x` gives `up --x`): xtask's top level takes no
/// options, so the subcommand is the first word.
pub fn words_after_subcommand() -> Vec<String> {
    std::env::args().skip(2).collect()
}
