//! The parts of a guest's shell script that its writers share: the steps
//! it runs, their environment, and sh quoting (the guest writes the script,
//! the binaries disk rewrites its steps, the queue names its files).

use std::path::PathBuf;

use super::kernels::Series;

/// Environment variables for the command, in order.
pub type Env = Vec<(String, String)>;

/// One command of the guest script, run in `cwd`.
#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub label: String,
    pub cwd: PathBuf,
    pub argv: Vec<String>,
    /// The kernels whose guests run it (`--tests name@K+K`); `None`: every
    /// kernel's.
    pub only: Option<Vec<Series>>,
}

/// Single-quotes `s` for sh.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
