//! Directory names of the kubelet tree (pod UIDs, escaped plugin names such
//! as `kubernetes.io~csi`, PV names, staging hash dirs): the input is one
//! name as a directory entry would hold it (any bytes but NUL and `/`).
//! A name that passes must be a single, printable path component.

use crate::volumes::kubelet::names::{check_name, is_staging_hash};

pub fn run(data: &[u8]) {
    let passed = check_name(data).is_ok();
    let hash = is_staging_hash(data);
    if passed || hash {
        let Ok(text) = std::str::from_utf8(data) else {
            panic!("a non-UTF-8 name passed: {data:?}");
        };
        let path = std::path::Path::new("/kubelet").join(text);
        assert_eq!(path.parent(), Some(std::path::Path::new("/kubelet")));
        assert!(text.bytes().all(|b| b.is_ascii_graphic() && b != b'/'));
    }
    // Every staging hash is a name kubelet makes.
    assert!(!hash || passed);
}
