//! kubelet's `vol_data.json` as the walk reads it: refused above the size
//! bound, else parsed; a parsed document's names go through the same checks
//! as in discovery.

use crate::volumes::kubelet::names::check_name;
use crate::volumes::kubelet::vol_data::{parse_vol_data, VOL_DATA_MAX_BYTES};

pub fn run(data: &[u8]) {
    if data.len() as u64 > VOL_DATA_MAX_BYTES {
        return;
    }
    let Ok(doc) = parse_vol_data(data) else {
        return;
    };
    for name in [&doc.driver_name, &doc.spec_vol_id].into_iter().flatten() {
        let _ = check_name(name.as_bytes());
    }
}
