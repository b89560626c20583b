//! Which programs to attach: each source checked against the tracepoint
//! formats of this kernel (the field layout they fill in is what the
//! programs are loaded with), and for the block layer, which program counts
//! what given the options.

use health_common::{complete_mode, field};

use super::layout::{plan, ProgramSpec, BLOCK_BIO_COMPLETE, BLOCK_RQ_COMPLETE, BLOCK_RQ_ERROR};
use super::pins::PinSet;
use super::requests::{self, BtfRequests};
use super::{BioErrors, ProbeOptions, SourceState, SourceStatus};
use crate::tracefs::Tracefs;

/// A program whose tracepoint exists and whose fields check out.
pub(super) struct Planned {
    pub(super) program: &'static str,
    pub(super) group: &'static str,
    pub(super) name: &'static str,
    pub(super) note: Option<String>,
}

/// Why `block_rq_complete` is off when no one needs it.
pub(super) const NO_FLUSHES: &str = "flush errors not requested (--flush-errors)";

/// How the block request programs count: `block_rq_complete`'s mode (off,
/// flushes only, or every failure where `block_rq_error` is missing), and
/// whether failed requests are counted there, before the console line.
#[derive(Clone, Copy)]
pub(super) struct BlockCounting {
    pub(super) mode: u32,
    pub(super) early: bool,
}

/// The programs to attach, the sources that will not be, and the field
/// layout every checked tracepoint filled in.
pub(super) struct Plan {
    pub(super) layout: [u32; field::COUNT],
    pub(super) planned: Vec<Planned>,
    pub(super) sources: Vec<SourceStatus>,
}

impl Default for Plan {
    fn default() -> Self {
        Self {
            layout: [0; field::COUNT],
            planned: Vec::new(),
            sources: Vec::new(),
        }
    }
}

impl Plan {
    pub(super) fn check(
        &mut self,
        tracefs: &Tracefs,
        spec: &ProgramSpec,
    ) -> Result<(&'static str, &'static str), String> {
        plan(tracefs, spec, &mut self.layout)
    }

    fn push(
        &mut self,
        program: &'static str,
        (group, name): (&'static str, &'static str),
        note: Option<&str>,
    ) {
        self.planned.push(Planned {
            program,
            group,
            name,
            note: note.map(str::to_string),
        });
    }

    fn not_attached(&mut self, program: &'static str, state: SourceState) {
        self.sources.push(SourceStatus { program, state });
    }

    /// `block_rq_error`, and `block_rq_complete` for what the options and
    /// this kernel leave it.
    pub(super) fn block_requests(
        &mut self,
        tracefs: &Tracefs,
        btf_requests: &Result<BtfRequests, String>,
        opts: &ProbeOptions,
    ) -> BlockCounting {
        let rq_error = self.check(tracefs, &BLOCK_RQ_ERROR);
        let rq_complete = self.check(tracefs, &BLOCK_RQ_COMPLETE);
        let mode = match (&rq_error, opts.flush_errors) {
            (Ok(_), true) => complete_mode::FLUSH_ONLY,
            (Ok(_), false) => complete_mode::OFF,
            (Err(_), _) => complete_mode::ALL_ERRORS,
        };
        let early =
            opts.early_errors && requests::early_counting(btf_requests, &rq_error, &rq_complete);
        // Planned first: block_rq_error is left out only once it is attached.
        if let (Ok(found), true) = (&rq_complete, early) {
            let note = if opts.flush_errors {
                "failed requests and flushes, counted before the kernel prints them"
            } else {
                "failed requests, counted before the kernel prints them"
            };
            self.push(BLOCK_RQ_COMPLETE.program, *found, Some(note));
        }
        match rq_error {
            Ok(found) => self.push(BLOCK_RQ_ERROR.program, found, None),
            Err(reason) => self.not_attached(
                BLOCK_RQ_ERROR.program,
                SourceState::Missing {
                    reason: reason + "; using block_rq_complete",
                },
            ),
        }
        match (rq_complete, mode) {
            (Ok(_), _) if early => {}
            (Ok(found), complete_mode::FLUSH_ONLY) => {
                self.push(BLOCK_RQ_COMPLETE.program, found, Some("flush errors only"))
            }
            (Ok(found), complete_mode::ALL_ERRORS) => self.push(
                BLOCK_RQ_COMPLETE.program,
                found,
                Some("all failed requests: fallback"),
            ),
            (Ok(_), _) => self.not_attached(
                BLOCK_RQ_COMPLETE.program,
                SourceState::Disabled {
                    reason: NO_FLUSHES.into(),
                },
            ),
            (Err(reason), _) => {
                self.not_attached(BLOCK_RQ_COMPLETE.program, SourceState::Missing { reason })
            }
        }
        BlockCounting { mode, early }
    }

    /// `block_bio_complete` (dm/md): planned, or deferred until the first
    /// bio-based device (returned), or off.
    pub(super) fn block_bios(
        &mut self,
        found: Result<(&'static str, &'static str), String>,
        bio_errors: BioErrors,
        pins: Option<&PinSet>,
    ) -> Option<(&'static str, &'static str)> {
        let program = BLOCK_BIO_COMPLETE.program;
        // Attached by the process whose pins this one adopts.
        let adopted = pins.is_some_and(|p| p.has_link(program));
        match (found, bio_errors) {
            (Ok(found), BioErrors::Always) => self.push(program, found, None),
            (Ok(found), BioErrors::Auto) if adopted => self.push(program, found, None),
            (Ok(found), BioErrors::Auto) => {
                self.not_attached(
                    program,
                    SourceState::Disabled {
                        reason: "no bio-based dm/md device yet; attached when one appears".into(),
                    },
                );
                return Some(found);
            }
            (Ok(_), BioErrors::Never) => self.not_attached(
                program,
                SourceState::Disabled {
                    reason: "--bio-errors never".into(),
                },
            ),
            (Err(reason), _) => self.not_attached(program, SourceState::Missing { reason }),
        }
        None
    }

    /// A source that stands alone (the filesystems'): attached when the
    /// kernel has it.
    pub(super) fn standalone(
        &mut self,
        program: &'static str,
        found: Result<(&'static str, &'static str), String>,
    ) {
        match found {
            Ok(found) => self.push(program, found, None),
            Err(reason) => self.not_attached(program, SourceState::Missing { reason }),
        }
    }
}
