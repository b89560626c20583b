//! The `lab` crate's binary, which xtask builds and runs: the benchmarks,
//! the demo and the kind run drive the built agent end to end through the
//! test harness (kube, aya, FUSE), which xtask itself does not compile.

use std::process::Command;

use crate::util::run_foreground;
use crate::util::target_dir;

/// The lab ended with this exit status (130 after Ctrl-C); xtask exits
/// with it too.
#[derive(Debug, thiserror::Error)]
#[error("the lab exited with status {0}")]
pub struct Exited(pub u8);

/// Builds the lab (release) and runs `health-lab COMMAND ARGS`.
pub fn run(command: &str, args: &[String]) -> anyhow::Result<()> {
    // The lab, the fault disk server and the CSI driver it starts come from
    // the one workspace build (`cargo xtask test` leaves it done).
    crate::build::workspace(&[])?;
    let bin = target_dir().join("release/health-lab");
    let mut lab = Command::new(&bin);
    // The Kubernetes of the local cluster and of the benchmarks' real API
    // server, built first if needed.
    crate::components::for_lab(command, args)?.apply(&mut lab);
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
