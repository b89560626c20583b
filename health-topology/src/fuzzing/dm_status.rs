//! Device-mapper answers (`stack::dm_ioctl`, `stack::dm_status`): the input
//! is read as a whole `DM_TABLE_STATUS` answer (header, target specs,
//! parameter strings) and each target's parameters are parsed as the agent
//! parses a `multipath` or `thin-pool` status; the input is also parsed
//! as one status line of each kind.
//!
//! Properties: no panic; every target found lies inside the answer; a
//! multipath status that parses names no more paths than it has words; a
//! thin pool's percentages are finite.

use crate::stack::dm_ioctl::parse_targets;
use crate::stack::dm_status::{parse_multipath, parse_thin_pool, ThinPoolStatus};

pub fn run(data: &[u8]) {
    if let Ok(targets) = parse_targets(data) {
        for t in &targets {
            assert!(
                t.params.len() <= data.len(),
                "params longer than the answer"
            );
            line(&t.params);
        }
    }
    line(&String::from_utf8_lossy(data));
}

fn line(params: &str) {
    if let Ok(s) = parse_multipath(params) {
        let words = params.split_ascii_whitespace().count();
        assert!(
            s.paths.len() * 3 <= words,
            "{} paths from {words} words",
            s.paths.len()
        );
    }
    if let Ok(ThinPoolStatus::Working(u)) = parse_thin_pool(params) {
        assert!(u.data_percent().is_finite() && u.metadata_percent().is_finite());
    }
}
