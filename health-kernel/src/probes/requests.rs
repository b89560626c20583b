//! The block request programs as BTF raw tracepoints (`tp_btf`): whether
//! this kernel allows them, what they need to read a `struct request`, and
//! the type ids their loads need.
//!
//! Why they exist: a tracefs tracepoint runs its BPF program only if no
//! other kprobe or tracepoint program, and no map syscall, is running on
//! the CPU at that moment; otherwise the kernel skips it without counting a
//! miss. In an error flood that happens whenever a block completion
//! interrupts the agent while it reads its own counters (measured: 1-4
//! errors in 600 000, see docs/benchmarks.md, "Error flood"). A `tp_btf` program is only kept
//! from nesting inside itself, and the kernel counts that as a miss.

use std::path::Path;

use aya::Btf;
use health_common::{bio, file, rq};

use super::btf::{bio_layout, counts_early, file_layout, request_layout, KernelBtf, KIND_FUNC};
use super::{blk_status, release};

/// Everything the `tp_btf` programs need, or why they cannot be used.
pub(super) struct BtfRequests {
    pub layout: [u32; rq::COUNT],
    pub statuses: [u8; rq::STATUS_COUNT],
    /// Status codes above 13 are not known for this kernel release.
    pub statuses_partial: bool,
    /// Which of the two tracepoints this kernel has as raw tracepoints.
    pub has_error: bool,
    pub has_complete: bool,
}

impl BtfRequests {
    /// Whether `block_rq_complete` can count what `block_rq_error` would
    /// (`--early-block-errors`), or why not.
    pub fn early(&self) -> Result<(), &'static str> {
        if !self.has_error || !self.has_complete {
            return Err("needs both block request tracepoints as BTF raw tracepoints");
        }
        if !counts_early(&self.layout) {
            return Err("this kernel's BTF does not name the request flag bits (__RQF_QUIET)");
        }
        Ok(())
    }
}

/// The kernel's BTF facts for the block programs: the requests', the
/// bios' (`WAITING`), and a small BTF image for loading the `tp_btf` and
/// fentry programs (see [`load_btf`]). The kernel BTF itself is dropped
/// before this returns.
pub(super) fn plan(btf_path: &Path, proc_root: &Path) -> BtfFacts {
    let kernel = match KernelBtf::read(btf_path) {
        Ok(k) => k,
        Err(e) => {
            return BtfFacts {
                requests: Err(e.clone()),
                bios: Err(e.clone()),
                returned: Err(e),
                image: None,
            }
        }
    };
    let bios = bio_layout(&kernel).map_err(|e| e.to_string());
    let returned = file_layout(&kernel)
        .map_err(|e| e.to_string())
        .map(|layout| ReturnedErrors {
            layout,
            functions: RETURNED_FUNCTIONS
                .iter()
                .map(|(function, _)| *function)
                .filter(|function| kernel.find(KIND_FUNC, function).is_some())
                .collect(),
        });
    let image = kernel.sparse_image(&LOAD_NAMES);
    let requests = request_layout(&kernel)
        .map_err(|e| e.to_string())
        .and_then(|layout| {
            let release = release::running_release(proc_root)
                .map_err(|e| format!("reading the kernel release: {e}"))?;
            let (statuses, known) = blk_status::errno_table(&release);
            Ok(BtfRequests {
                layout,
                statuses,
                statuses_partial: !known,
                has_error: kernel.has_tracepoint("block_rq_error"),
                has_complete: kernel.has_tracepoint("block_rq_complete"),
            })
        });
    BtfFacts {
        requests,
        bios,
        returned,
        image,
    }
}

/// What [`plan`] read from the kernel's BTF.
pub(super) struct BtfFacts {
    pub requests: Result<BtfRequests, String>,
    /// The `BIO_LAYOUT` of the `WAITING` programs.
    pub bios: Result<[u32; bio::COUNT], String>,
    pub returned: Result<ReturnedErrors, String>,
    pub image: Option<Vec<u8>>,
}

/// What the returned-error programs need: the `FILE_LAYOUT`, and which of
/// [`RETURNED_FUNCTIONS`] this kernel's BTF names (a function it lacks,
/// or inlined everywhere, has no entry and cannot be traced).
pub(super) struct ReturnedErrors {
    pub layout: [u32; file::COUNT],
    pub functions: Vec<&'static str>,
}

/// The VFS functions whose error returns are counted, and their programs.
pub(super) const RETURNED_FUNCTIONS: [(&str, &str); 5] = [
    ("vfs_read", "vfs_read_exit"),
    ("vfs_write", "vfs_write_exit"),
    ("vfs_readv", "vfs_readv_exit"),
    ("vfs_writev", "vfs_writev_exit"),
    ("vfs_fsync", "vfs_fsync_exit"),
];

/// The names the `tp_btf` and fentry loads look up.
pub(super) const LOAD_NAMES: [(u32, &str); 10] = [
    (super::btf::KIND_TYPEDEF, "btf_trace_block_rq_error"),
    (super::btf::KIND_TYPEDEF, "btf_trace_block_rq_complete"),
    (super::btf::KIND_TYPEDEF, "btf_trace_block_bio_queue"),
    (super::btf::KIND_TYPEDEF, "btf_trace_block_bio_complete"),
    (super::btf::KIND_FUNC, "__filemap_set_wb_err"),
    (KIND_FUNC, RETURNED_FUNCTIONS[0].0),
    (KIND_FUNC, RETURNED_FUNCTIONS[1].0),
    (KIND_FUNC, RETURNED_FUNCTIONS[2].0),
    (KIND_FUNC, RETURNED_FUNCTIONS[3].0),
    (KIND_FUNC, RETURNED_FUNCTIONS[4].0),
];

/// aya looks up a program's attach target by name in an `aya::Btf`, and
/// parsing the whole kernel BTF into one costs ~19 MB at start-up. The
/// loads only need those names at their kernel type ids, so [`plan`] keeps
/// a BTF image with just them in place and placeholders elsewhere.
pub(super) fn load_btf(image: &[u8]) -> Option<Btf> {
    match Btf::parse(image, aya::Endianness::Little) {
        Ok(btf) => Some(btf),
        Err(e) => {
            tracing::warn!("building the BTF for program loads: {e}");
            None
        }
    }
}

/// Whether `--early-block-errors` can be had here; says why not, once.
pub(super) fn early_counting(
    facts: &Result<BtfRequests, String>,
    rq_error: &Result<(&'static str, &'static str), String>,
    rq_complete: &Result<(&'static str, &'static str), String>,
) -> bool {
    if rq_error.is_err() {
        tracing::info!(
            "--early-block-errors: this kernel has no block_rq_error, so failed requests are counted at block_rq_complete anyway"
        );
        return false;
    }
    let why = match (facts, rq_complete) {
        (Err(e), _) => format!("needs the tp_btf block programs ({e})"),
        (_, Err(e)) => e.clone(),
        (Ok(f), Ok(_)) => match f.early() {
            Ok(()) => return true,
            Err(e) => e.to_string(),
        },
    };
    tracing::warn!(
        "--early-block-errors: {why}; failed requests are counted at block_rq_error, after the kernel prints them"
    );
    false
}
