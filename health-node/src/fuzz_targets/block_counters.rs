//! A block device's `inflight` and `stat` as the stall counters read them
//! (`volumes::inflight`): the bytes split at the first NUL into the two
//! files; what parses has a completed count that is the wrapping sum of
//! the fields it names.

use crate::volumes::inflight::parse;

pub fn run(data: &[u8]) {
    let (inflight, stat) = match data.iter().position(|&b| b == 0) {
        Some(at) => (&data[..at], &data[at + 1..]),
        None => (data, &data[..0]),
    };
    let (Ok(inflight), Ok(stat)) = (std::str::from_utf8(inflight), std::str::from_utf8(stat))
    else {
        return;
    };
    let Some(c) = parse(inflight, stat) else {
        return;
    };
    let fields: Vec<u64> = stat
        .split_whitespace()
        .map(|f| f.parse().unwrap())
        .collect();
    let field = |n: usize| fields.get(n - 1).copied().unwrap_or(0);
    let sum = field(1)
        .wrapping_add(field(5))
        .wrapping_add(field(12))
        .wrapping_add(field(16));
    assert_eq!(c.completed, sum, "{inflight:?} {stat:?}");
}
