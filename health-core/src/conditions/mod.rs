//! Per-volume health conditions: the one state machine between evidence and
//! reporting. Holds the words of a condition, the evidence sources feed in,
//! the machine ([`VolumeHealth`]) and message formatting; uses only
//! [`crate::dev`].
//!
//! Vocabulary and rules follow the 2026 revision of KEP-1432: a condition is
//! `(status, reason, message, since)`, keyed by `(status, reason)`. Evidence
//! comes from independent [`Source`]s (the kernel, each built-in check, the
//! CSI node and controller services). Each source owns its own conditions and
//! only that source's evidence can clear them; the volume's view is the union
//! of all sources, worst first — so a CSI "healthy" never hides a kernel error.
//!
//! The machine never reads the clock: every call takes `now`, so tests are
//! deterministic and the caller decides what time means.

pub mod driver_words;
mod episode;
mod evidence;
mod format;
mod health;
mod vocabulary;

#[cfg(test)]
pub(crate) mod testing;

pub use evidence::{
    CheckFinding, CheckResult, CsiEntry, CsiListSighting, CsiReport, KernelErrorKind, KernelErrors,
    Observation, ReadOnlyEvidence, ServerSilence,
};
pub use format::{clip_to, errno_name, human_bytes, human_duration, rfc3339};
pub use health::{ConditionConfig, VolumeHealth};
pub use vocabulary::{Change, CheckKind, Condition, Source, Status};
