//! Ring-buffer records (`kernel::collector`): each record decoded as the
//! collector does, accounted, and turned into the event the agent prints
//! (`report::event`), as text and as JSON.
//!
//! Input: records, each a little-endian u16 length and that many bytes (the
//! last one cut short when the data ends), so afl can make short, oversized
//! and garbage records of any kind, op, errno and text.
//!
//! Properties: no panic; only records of exactly one sample's size are
//! used; per (key, CPU), the counts emitted for sampled errors add up to
//! the highest sequence number seen (nothing counted twice or lost).

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use health_common::ErrorSample;
use health_core::dev::Dev;
use health_kernel::clock::Clock;
use health_kernel::collector::{account_sample, decode, Slot};
use health_topology::{parse_mountinfo, BlockDevice, Partition, Topology};

use crate::report::event::ErrorEvent;

pub fn run(data: &[u8]) {
    let topo = topology();
    let clock = Clock::with_offset(0);
    let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut accounted = HashMap::new();
    let mut late = 0;
    let mut emitted: HashMap<Slot, u64> = HashMap::new();
    let mut highest: HashMap<Slot, u64> = HashMap::new();
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]]));
        let end = (2 + len).min(rest.len());
        let record = &rest[2..end];
        rest = &rest[end..];
        let Some(sample) = decode(record) else {
            assert_ne!(record.len(), std::mem::size_of::<ErrorSample>());
            continue;
        };
        let slot = (sample.key, sample.cpu);
        if sample.seq > 0 {
            let h = highest.entry(slot).or_insert(0);
            *h = (*h).max(sample.seq);
        }
        let Some(e) = account_sample(&mut accounted, &mut late, sample) else {
            continue;
        };
        if sample.seq > 0 {
            *emitted.entry(slot).or_insert(0) += e.count;
        }
        let event = ErrorEvent::resolve(&e, &topo, &clock, now);
        let _ = event.human_line();
        serde_json::to_string(&event).expect("an event serializes");
    }
    assert_eq!(emitted, highest);
}

/// A disk with one partition and a mount on it, so that records of that
/// device resolve to names and mounts.
fn topology() -> Topology {
    let disk = BlockDevice {
        dev: Dev::new(8, 0),
        name: "sda".into(),
        whole_disk: None,
        partition: None,
        size_sectors: 1 << 21,
        loop_backing_file: None,
        holders: vec![],
        slaves: vec![],
        read_only: false,
        diskseq: None,
    };
    let part = BlockDevice {
        dev: Dev::new(8, 1),
        name: "sda1".into(),
        whole_disk: Some(disk.dev),
        partition: Some(Partition {
            number: 1,
            start: 2048,
            sectors: 1 << 20,
        }),
        ..disk.clone()
    };
    let mounts = parse_mountinfo("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n").unwrap_or_default();
    Topology::from_parts(vec![disk, part], mounts)
}
