//! What the integration tests of the Event recorder and writer share: a
//! fixed clock, one pod volume on the claim `shop/data` with its kernel
//! condition and the recorder's settings. kube's mock API service, with
//! which a test answers each request itself, is `health_kube::testing`.

// Each test crate uses only part of this module.
#![allow(dead_code)]

use health_core::conditions::{Condition, Source, Status};
pub use health_core::testing::t;
use health_core::volume::{VolumeKey, VolumeMode};
use health_kube::events::{
    Next, ObjectKind, ObjectRef, Outcome, Recorder, RecorderConfig, Targets, Write,
};

pub fn key(pod_uid: &str) -> VolumeKey {
    VolumeKey {
        pod_uid: pod_uid.into(),
        name: "pv-1".into(),
        mode: VolumeMode::Filesystem,
    }
}

pub fn pvc() -> ObjectRef {
    ObjectRef {
        kind: ObjectKind::PersistentVolumeClaim,
        namespace: "shop".into(),
        name: "data".into(),
        uid: "pvc-uid".into(),
    }
}

pub fn targets(pod: &str) -> Targets {
    Targets {
        pod: ObjectRef {
            kind: ObjectKind::Pod,
            namespace: "shop".into(),
            name: pod.into(),
            uid: format!("{pod}-uid"),
        },
        pod_volume: "data".into(),
        pvc: Some(pvc()),
        pv: Some("pv-1".into()),
    }
}

pub fn block(count: u64, last: u64) -> Condition {
    Condition {
        source: Source::Kernel,
        status: Status::Degraded,
        reason: "BlockIOErrors".into(),
        message: format!("{count} block I/O errors (write, EIO) on loop3 (7:3)"),
        since: t(0),
        last_probe: t(last),
        occurrences: Some(count),
    }
}

pub fn config() -> RecorderConfig {
    RecorderConfig::new("node-1")
}

/// Takes every write due at `now`, answering each with `outcome`.
pub fn drain(r: &mut Recorder, now: tokio::time::Instant, outcome: Outcome) -> Vec<Write> {
    let mut out = Vec::new();
    while let Next::Write(w) = r.next_write(now) {
        r.finish(&w, outcome.clone(), now);
        out.push(w);
        assert!(out.len() < 1000, "the recorder keeps producing writes");
    }
    out
}
