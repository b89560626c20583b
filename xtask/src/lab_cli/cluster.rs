//! `cargo xtask cluster`: the local cluster's commands (lab/src/cluster/
//! runs them, except `test`, which is xtask's own: cluster_test.rs).

use std::path::PathBuf;

use clap::Subcommand;

#[derive(clap::Args)]
pub struct ClusterArgs {
    /// The state directory [default: $HEALTH_CLUSTER_DIR, else target/cluster of the workspace].
    #[arg(long, value_name = "DIR", global = true)]
    pub state_dir: Option<PathBuf>,
    #[command(subcommand)]
    pub command: ClusterCommand,
}

#[derive(Subcommand)]
pub enum ClusterCommand {
    /// Bring the cluster up (root; idempotent: a healthy cluster is left as it is).
    Up(UpArgs),
    /// Stop everything and undo what the cluster changed on the host (idempotent).
    Down,
    /// Each component's state; exits non-zero when any is down.
    Status,
    /// Inject or clear errors on the cluster's fault disk.
    Fault(FaultArgs),
    /// The end-to-end suite (tests/tests/kubelet_e2e.rs) on the cluster, with an image of
    /// this tree; a cluster brought up for it is taken down after it.
    Test {
        /// Only tests whose name contains these (passed to the test binary).
        filter: Vec<String>,
    },
}

#[derive(clap::Args)]
pub struct UpArgs {
    /// Import this agent image archive (from `cargo xtask image`) instead of
    /// building the agent and its image; on a running cluster, import it
    /// over the one there.
    #[arg(long, value_name = "FILE")]
    pub agent_archive: Option<PathBuf>,
}

#[derive(clap::Args)]
pub struct FaultArgs {
    #[command(subcommand)]
    pub command: FaultCommand,
}

#[derive(clap::Subcommand)]
pub enum FaultCommand {
    /// Make requests to part of the fault disk fail (the whole disk when no target is given).
    Add(AddArgs),
    /// Remove every rule: the disk answers normally again.
    Clear,
    /// Failures injected and requests served since the disk started.
    Stats {
        /// The server's counters as JSON (health_tests::protocol::Stats).
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct AddArgs {
    /// Which requests fail.
    #[arg(long, value_enum, default_value_t = OpArg::Write)]
    pub op: OpArg,
    /// The error they fail with: a name (EIO, ENOSPC, ETIMEDOUT, ENODATA...) or a number.
    #[arg(long, default_value = "EIO", value_parser = errno_arg)]
    pub errno: i32,
    /// A file or directory on the fault disk (through any mount of it), or a block volume's device.
    #[arg(long, conflicts_with = "volume")]
    pub path: Option<PathBuf>,
    /// A PV on the fault disk (vh-fs-1, vh-block-1...): its whole data.
    #[arg(long)]
    pub volume: Option<String>,
    /// Start of the failing bytes within the target (4096, 64K, 1M).
    #[arg(long, value_parser = bytes_arg)]
    pub offset: Option<u64>,
    /// Length of the failing bytes within the target.
    #[arg(long, value_parser = bytes_arg)]
    pub len: Option<u64>,
    /// Each rule (one per extent) fails at most this many requests.
    #[arg(long)]
    pub limit: Option<u64>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum OpArg {
    Read,
    Write,
    /// Discards and write-zeroes (FUSE fallocate).
    Discard,
    /// Cache flushes (they carry no range: only without a target).
    Flush,
    Any,
}

impl OpArg {
    pub fn requests(self) -> &'static str {
        match self {
            OpArg::Read => "reads",
            OpArg::Write => "writes",
            OpArg::Discard => "discards",
            OpArg::Flush => "flushes",
            OpArg::Any => "all requests",
        }
    }
}

/// The highest errno the fault disk answers (what FUSE can answer;
/// `health_tests::protocol::MAX_ERRNO`, checked below).
pub const MAX_ERRNO: i32 = 511;

#[derive(Debug, thiserror::Error)]
pub enum ArgError {
    #[error("{0:?} is not a byte count (e.g. 4096, 64K, 1M)")]
    Bytes(String),
    #[error("unknown unit {unit:?} in {text:?} (K, M or G)")]
    Unit { unit: String, text: String },
    #[error("{0:?} is too large")]
    TooLarge(String),
    #[error("errno {0} is outside 1..={MAX_ERRNO}")]
    ErrnoRange(i32),
    #[error("{0:?} is not an errno name or number (e.g. EIO, ENOSPC, 5)")]
    Errno(String),
}

fn errno_arg(text: &str) -> Result<i32, String> {
    parse_errno(text).map_err(|e| e.to_string())
}

fn bytes_arg(text: &str) -> Result<u64, String> {
    parse_bytes(text).map_err(|e| e.to_string())
}

/// A byte count: digits with an optional binary suffix K, M or G ("64K",
/// "1M"; "KiB"/"MiB"/"GiB" too).
pub fn parse_bytes(text: &str) -> Result<u64, ArgError> {
    let t = text.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, suffix) = t.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| ArgError::Bytes(text.to_string()))?;
    let shift = match suffix.trim() {
        "" | "B" => 0,
        "K" | "KiB" => 10,
        "M" | "MiB" => 20,
        "G" | "GiB" => 30,
        other => {
            return Err(ArgError::Unit {
                unit: other.to_string(),
                text: text.to_string(),
            })
        }
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| ArgError::TooLarge(text.to_string()))
}

/// An errno by name ("EIO", "enospc") or number (1..=511, what FUSE can answer).
pub fn parse_errno(text: &str) -> Result<i32, ArgError> {
    let t = text.trim();
    if let Ok(n) = t.parse::<i32>() {
        if (1..=MAX_ERRNO).contains(&n) {
            return Ok(n);
        }
        return Err(ArgError::ErrnoRange(n));
    }
    let upper = t.to_ascii_uppercase();
    (1..=MAX_ERRNO)
        .find(|n| errno_name(*n) == upper)
        .ok_or_else(|| ArgError::Errno(text.to_string()))
}

/// "EIO" for 5; the number itself when Linux has no name for it.
pub fn errno_name(n: i32) -> String {
    match nix::errno::Errno::from_raw(n) {
        nix::errno::Errno::UnknownErrno => n.to_string(),
        e => format!("{e:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_counts_take_binary_suffixes() {
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert_eq!(parse_bytes("64K").unwrap(), 64 << 10);
        assert_eq!(parse_bytes("1M").unwrap(), 1 << 20);
        assert_eq!(parse_bytes("2GiB").unwrap(), 2 << 30);
        assert_eq!(
            parse_bytes("1T").unwrap_err().to_string(),
            "unknown unit \"T\" in \"1T\" (K, M or G)"
        );
        assert!(parse_bytes("M").is_err());
        assert!(parse_bytes("99999999999999G").is_err());
    }

    #[test]
    fn errnos_by_name_or_number() {
        assert_eq!(parse_errno("EIO").unwrap(), libc::EIO);
        assert_eq!(parse_errno("enospc").unwrap(), libc::ENOSPC);
        assert_eq!(parse_errno("61").unwrap(), libc::ENODATA);
        assert!(parse_errno("512").is_err());
        assert_eq!(
            parse_errno("0").unwrap_err().to_string(),
            "errno 0 is outside 1..=511"
        );
        assert!(parse_errno("EWHATEVER").is_err());
        assert_eq!(errno_name(libc::ETIMEDOUT), "ETIMEDOUT");
        assert_eq!(errno_name(500), "500");
    }

    #[test]
    fn the_highest_errno_is_the_fault_disks() {
        assert_eq!(MAX_ERRNO, health_tests::protocol::MAX_ERRNO);
    }
}
