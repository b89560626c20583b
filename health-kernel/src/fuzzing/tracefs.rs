//! tracefs `format` files (`kernel::tracefs`), then the layout check of
//! every kernel program (`kernel::probes::layout`) against what parsed.
//!
//! Properties: no panic; a refusal names the file and the line; every
//! offset a program would be given lies inside a record (the layout check
//! refuses fields that end beyond one).

use std::path::Path;

use crate::probes::layout::check_against_every_program;
use crate::tracefs::{parse_format_bytes, TracefsError};

pub fn run(data: &[u8]) {
    let path = Path::new("events/fuzz/fuzz/format");
    let format = match parse_format_bytes(path, data) {
        Ok(f) => f,
        Err(e) => {
            let TracefsError::Malformed { line, .. } = &e else {
                panic!("unexpected error from text: {e}");
            };
            assert!(*line >= 1);
            assert!(e
                .to_string()
                .starts_with("events/fuzz/fuzz/format: malformed line "));
            return;
        }
    };
    for field in &format.fields {
        assert!(
            !field.name.is_empty() && field.decl.ends_with(field.name.as_str())
                || field.decl.contains('[')
        );
        let _ = field.is_data_loc();
    }
    for offsets in check_against_every_program(&format).into_iter().flatten() {
        assert!(offsets.iter().all(|&o| o < 64 * 1024), "{offsets:?}");
    }
}
