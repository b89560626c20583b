//! What can go wrong between starting and attaching, with the exit code
//! each class of failure gives the process.

use std::path::{Path, PathBuf};

use super::preflight::check_privileges;
use crate::tracefs::TracefsError;

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("{0}")]
    NotPermitted(String),
    #[error("BPF is unavailable: {0}")]
    BpfUnavailable(String),
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
    /// Process exit codes, documented in the README.
    pub fn exit_code(&self) -> i32 {
        match self {
            ProbeError::NotPermitted(_) => 3,
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

pub(super) fn classify_load_error(e: aya::EbpfError, proc_root: &Path) -> ProbeError {
    let text = error_chain(&e);
    if text.contains("Operation not permitted") {
        if let Err(not_permitted) = check_privileges(proc_root) {
            return not_permitted;
        }
        return ProbeError::BpfUnavailable(format!(
            "the kernel refused to load programs despite the needed capabilities (lockdown or a security policy?): {text}"
        ));
    }
    ProbeError::Load(Box::new(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_are_distinct_per_failure_class() {
        let codes = [
            ProbeError::NotPermitted(String::new()).exit_code(),
            ProbeError::BpfUnavailable(String::new()).exit_code(),
            ProbeError::BtfMissing(PathBuf::new()).exit_code(),
            ProbeError::Tracefs(TracefsError::Missing {
                tried: String::new(),
            })
            .exit_code(),
        ];
        assert_eq!(codes, [3, 4, 5, 6]);
    }
}
