//! The domain core of volume-health, shared by the node agent and the
//! controller: what a device number is ([`dev`]), which pod volume a
//! condition belongs to ([`volume`]), which kernel errors are evidence of
//! ill health ([`taxonomy`]), and the per-volume condition machine with its
//! vocabulary ([`conditions`]).
//!
//! Pure: no I/O, no clock (every call takes `now`), no Kubernetes, no aya.
//! It uses only `health-common` (the kernel programs' source numbers);
//! every other crate of the workspace may use it.

pub mod conditions;
pub mod dev;
pub mod taxonomy;
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub mod testing;
pub mod volume;
