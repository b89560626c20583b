//! The NFS client's per-mount counters (`mountstats::parse_nfs_stats`):
//! the input is a `/proc/<pid>/mountstats` file.
//!
//! Properties: no panic; at most one mount per `device ` line, each of
//! type nfs or nfs4; retransmissions never exceed transmissions; and
//! parsing is line by line: the text cut after any mount's block parses to
//! the mounts before the cut.

use crate::mountstats::parse_nfs_stats;

pub fn run(data: &[u8]) {
    let mounts = parse_nfs_stats(data);
    let devices = data
        .split(|b| *b == b'\n')
        .filter(|l| l.starts_with(b"device "))
        .count();
    assert!(
        mounts.len() <= devices,
        "{} mounts of {devices} device lines",
        mounts.len()
    );
    for m in &mounts {
        assert!(m.fs_type == "nfs" || m.fs_type == "nfs4", "{:?}", m.fs_type);
        assert!(m.calls.retransmissions() <= m.calls.transmissions);
    }
    // Cut just before the last device line: every mount but the last one
    // it began (if it was one) is kept, unchanged.
    let Some(last) = data
        .split(|b| *b == b'\n')
        .scan(0usize, |at, line| {
            let start = *at;
            *at += line.len() + 1;
            Some((start, line))
        })
        .filter(|(_, l)| l.starts_with(b"device "))
        .map(|(start, _)| start)
        .last()
    else {
        return;
    };
    let before = parse_nfs_stats(&data[..last]);
    assert!(before.len() <= mounts.len());
    assert_eq!(before[..], mounts[..before.len()]);
}
