//! A kernel condition's episode: the run of errors of one kind it reports,
//! from the first error until the quiet window passes, and its message.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::SystemTime;

use super::evidence::KernelErrorKind;
use super::format::{errno_name, human_duration, rfc3339};
use crate::dev::Dev;

/// A run of kernel errors of one kind that has not yet been quiet for the
/// window; it is what a kernel condition reports.
#[derive(Clone, Debug)]
pub(super) struct Episode {
    pub(super) count: u64,
    pub(super) first: SystemTime,
    pub(super) last: SystemTime,
    pub(super) devices: BTreeSet<Dev>,
    /// Kernel names of `devices`, where known.
    pub(super) names: BTreeMap<Dev, String>,
    pub(super) mounts: BTreeSet<PathBuf>,
    pub(super) ops: BTreeSet<String>,
    pub(super) errnos: BTreeSet<i32>,
    /// Whom returned errors were told to, at most [`MAX_WHOS`] of them.
    pub(super) whos: BTreeSet<String>,
    /// Names beyond those kept, so that the message says how many.
    pub(super) more_whos: bool,
}

/// An episode names at most this many pods or cgroups: enough to see who
/// is hurt, bounded whatever a flood names.
pub(super) const MAX_WHOS: usize = 4;

impl Episode {
    pub(super) fn message(&self, kind: KernelErrorKind) -> String {
        let mut m = self.what(kind);
        if !self.devices.is_empty() {
            let devs: Vec<String> = self
                .devices
                .iter()
                .map(|d| match self.names.get(d) {
                    Some(name) => format!("{name} ({d})"),
                    None => d.to_string(),
                })
                .collect();
            m.push_str(&format!(" on {}", devs.join(", ")));
        }
        if !self.mounts.is_empty() {
            let mounts: Vec<String> = self
                .mounts
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            m.push_str(&format!(" at {}", mounts.join(", ")));
        }
        if self.first == self.last || self.count == 1 {
            m.push_str(&format!(" at {}", rfc3339(self.last)));
        } else {
            let window = self.last.duration_since(self.first).unwrap_or_default();
            m.push_str(&format!(
                " in {} ({} to {})",
                human_duration(window),
                rfc3339(self.first),
                rfc3339(self.last)
            ));
        }
        m
    }

    /// How many of what (`3 block I/O errors (write, EIO)`), and for
    /// returned errors whom they were returned to: the part of the message
    /// another condition's message carries when it says these too.
    pub(super) fn what(&self, kind: KernelErrorKind) -> String {
        let mut m = format!("{} {}", self.count, kind.noun(self.count));
        let detail: Vec<String> = self
            .ops
            .iter()
            .cloned()
            .chain(self.errnos.iter().map(|e| errno_name(*e)))
            .collect();
        if !detail.is_empty() {
            m.push_str(&format!(" ({})", detail.join(", ")));
        }
        if kind.returned() {
            let whos: Vec<&str> = self.whos.iter().map(String::as_str).collect();
            match (whos.is_empty(), self.more_whos) {
                (true, _) => m.push_str(" returned to applications"),
                (false, false) => m.push_str(&format!(" returned to {}", whos.join(", "))),
                (false, true) => {
                    m.push_str(&format!(" returned to {} and others", whos.join(", ")))
                }
            }
        }
        m
    }
}
