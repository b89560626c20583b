//! What can go wrong between starting and attaching, with the exit code
//! each class of failure gives the process.

use std::path::PathBuf;

use super::memlock::MemlockShortfall;
use crate::tracefs::TracefsError;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    NotPermitted(String),
    #[error("BPF is unavailable: {0}")]
    BpfUnavailable(String),
    /// bpf() answered EPERM on a kernel that charges BPF memory to
    /// RLIMIT_MEMLOCK, with the limit not raised (no CAP_SYS_RESOURCE).
    #[error("{shortfall}")]
    MemlockLimit {
        shortfall: MemlockShortfall,
        #[source]
        refused: BpfRefusal,
    },
    #[error(
        "kernel BTF is missing ({0} does not exist): the kernel was built without \
         CONFIG_DEBUG_INFO_BTF, and volume-health supports only kernels with BTF"
    )]
    BtfMissing(PathBuf),
    #[error(transparent)]
    Tracefs(#[from] TracefsError),
    #[error(
        "this health-agent was built without its kernel programs; build it with `cargo xtask build`"
    )]
    NoObject,
    #[error("tracepoint {tracepoint}: {problem}")]
    Layout { tracepoint: String, problem: String },
    #[error("loading the kernel programs")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("kernel program {program}: {detail}")]
    Program {
        program: &'static str,
        detail: String,
    },
    #[error("kernel map {0} is missing from the object")]
    MissingMap(&'static str),
    #[error("kernel map {name}")]
    Map {
        name: &'static str,
        source: Box<aya::maps::MapError>,
    },
    #[error("none of the error tracepoints could be attached:\n{0}")]
    NothingAttached(String),
    #[error("pinned kernel state")]
    Pins(#[from] super::pins::PinError),
}

impl ProbeError {
    /// Process exit codes, documented in docs/reference/cli.md ("Exit codes").
    pub fn exit_code(&self) -> i32 {
        match self {
            ProbeError::NotPermitted(_) | ProbeError::MemlockLimit { .. } => 3,
            ProbeError::BpfUnavailable(_) => 4,
            ProbeError::BtfMissing(_) => 5,
            ProbeError::Tracefs(TracefsError::Missing { .. }) => 6,
            _ => 1,
        }
    }
}

pub(super) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        out.push_str(": ");
        out.push_str(&s.to_string());
        cur = s.source();
    }
    out
}

/// What BPF refused when the memlock limit was the reason.
#[derive(Debug, thiserror::Error)]
pub enum BpfRefusal {
    #[error("creating a test map")]
    CheckMap(#[source] std::io::Error),
    #[error("loading the kernel programs")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("no program could be loaded:\n{0}")]
    Programs(String),
}

/// Whether an error or one of its sources is the kernel's EPERM.
pub(super) fn is_eperm(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.raw_os_error() == Some(libc::EPERM))
        {
            return true;
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct_per_failure_class() {
        let codes = [
            ProbeError::NotPermitted(String::new()).exit_code(),
            ProbeError::MemlockLimit {
                shortfall: MemlockShortfall::judge("5.10.0", Some(65536)).unwrap(),
                refused: BpfRefusal::Programs(String::new()),
            }
            .exit_code(),
            ProbeError::BpfUnavailable(String::new()).exit_code(),
            ProbeError::BtfMissing(PathBuf::new()).exit_code(),
            ProbeError::Tracefs(TracefsError::Missing {
                tried: String::new(),
            })
            .exit_code(),
        ];
        assert_eq!(codes, [3, 3, 4, 5, 6]);
    }
}
