//! An NVMe controller's SMART / health log page (`stack::nvme_health`), as
//! the drive returns it through the admin passthrough: the input is the
//! page.
//!
//! Properties: no panic; a page is read exactly when it holds the fields
//! read (176 bytes), each field from its offset; the warning's words name
//! at most every bit once.

use crate::stack::nvme_health::{parse, warning_words};

pub fn run(data: &[u8]) {
    match parse(data) {
        Ok(log) => {
            assert!(data.len() >= 176, "read from {} bytes", data.len());
            assert_eq!(log.critical_warning, data[0]);
            assert_eq!(log.available_spare, data[3]);
            assert_eq!(log.percentage_used, data[5]);
            assert!(warning_words(log.critical_warning).len() <= 7);
        }
        Err(_) => assert!(data.len() < 176, "refused a page of {} bytes", data.len()),
    }
}
