//! tracefs ring-buffer `stats` files, as the tracer witness reads them
//! (`kernel::tracer_count::written`).
//!
//! Properties: no panic (the figures are added without overflow); a refusal
//! names one of the figures the witness needs; an accepted file's sum is at
//! least its `entries` figure.

use crate::tracer_count::written;

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    match written(&text) {
        Ok(sum) => {
            let entries = text
                .lines()
                .find_map(|l| l.strip_prefix("entries:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .expect("an accepted file has its entries figure");
            assert!(sum >= entries, "{sum} < {entries}");
        }
        Err(name) => assert!(
            ["entries", "overrun", "commit overrun"].contains(&name),
            "{name}"
        ),
    }
}
