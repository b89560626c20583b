//! Which pod volume something is about.

use serde::Serialize;

/// How a pod uses a volume: mounted (`spec.containers[].volumeMounts`,
/// kubelet's `volumes/` tree) or as a raw block device (`volumeDevices`,
/// kubelet's `volumeDevices/` tree).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum VolumeMode {
    Filesystem,
    Block,
}

/// Identity of one pod volume, stable across rediscoveries: the pod, the
/// directory kubelet named the volume by under the pod, and the mode (a pod
/// may use one PV name in both `volumes/` and `volumeDevices/`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct VolumeKey {
    pub pod_uid: String,
    pub name: String,
    pub mode: VolumeMode,
}
