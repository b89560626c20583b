//! Event messages: how a series names the pod volume or the pods it is
//! about, and the cut at [`MAX_MESSAGE_BYTES`].

use super::{ObjectKind, ObjectRef, Targets, MAX_MESSAGE_BYTES};

impl Targets {
    /// `PVC shop/data (PV pv-1, volume "data")`, or for volumes without a
    /// claim `volume "scratch"`.
    pub(super) fn volume_phrase(&self) -> String {
        match (&self.pvc, &self.pv) {
            (Some(pvc), Some(pv)) => format!(
                "PVC {}/{} (PV {pv}, volume \"{}\")",
                pvc.namespace, pvc.name, self.pod_volume
            ),
            (Some(pvc), None) => format!(
                "PVC {}/{} (volume \"{}\")",
                pvc.namespace, pvc.name, self.pod_volume
            ),
            (None, Some(pv)) => format!("PV {pv} (volume \"{}\")", self.pod_volume),
            (None, None) => format!("volume \"{}\"", self.pod_volume),
        }
    }
}

/// `pod shop/web-0`, `pods shop/web-0, shop/web-1`.
pub(super) fn pods_phrase(targets: &[&Targets]) -> String {
    let mut names: Vec<String> = targets
        .iter()
        .map(|t| format!("{}/{}", t.pod.namespace, t.pod.name))
        .collect();
    names.sort();
    names.dedup();
    let pv = targets
        .iter()
        .find_map(|t| t.pv.as_deref())
        .map(|pv| format!(" (PV {pv})"))
        .unwrap_or_default();
    if names.len() == 1 {
        format!("pod {}{pv}", names[0])
    } else {
        format!("pods {}{pv}", names.join(", "))
    }
}

/// What a recovery message names on each kind of object.
pub(super) fn subject(object: &ObjectRef, targets: &Targets) -> String {
    match object.kind {
        ObjectKind::Pod => targets.volume_phrase(),
        ObjectKind::PersistentVolumeClaim => pods_phrase(&[targets]),
    }
}

/// The condition part of a series message (after the subject and status).
pub(super) fn strip_subject(message: &str) -> &str {
    message.splitn(3, ": ").nth(2).unwrap_or(message)
}

pub(super) fn clip(s: String) -> String {
    health_core::conditions::clip_to(s, MAX_MESSAGE_BYTES)
}
