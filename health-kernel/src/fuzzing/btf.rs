//! BTF blobs (`kernel::probes::btf`): the raw parser, every lookup the
//! agent makes on the kernel's BTF, and the sparse image built from it.
//!
//! Properties: no panic, no hang (lookups are bounded by the blob's size);
//! whatever parses answers every query; a sparse image built from a parsed
//! blob parses again and keeps the type ids of the names it was asked for.

use crate::probes::btf::{request_layout, KernelBtf, KIND_FUNC, KIND_TYPEDEF};

pub fn run(data: &[u8]) {
    let Ok(btf) = KernelBtf::parse(data.to_vec()) else {
        return;
    };
    let _ = request_layout(&btf);
    let _ = btf.member_offset("request", "__sector");
    let _ = btf.enum_value("__REQ_FUA");
    let _ = btf.tracepoint_arg_type("block_rq_complete", 1);
    let _ = btf.has_tracepoint("block_rq_error");
    let names = [
        (KIND_TYPEDEF, "btf_trace_block_rq_complete"),
        (KIND_FUNC, "blk_mq_end_request"),
    ];
    if let Some(image) = btf.sparse_image(&names) {
        let sparse = KernelBtf::parse(image).expect("a sparse image parses");
        for (kind, name) in names {
            assert_eq!(sparse.find(kind, name), btf.find(kind, name), "{name}");
        }
    }
}
