//! The programs that follow each bio while it waits (`WAITING`): attached
//! to `block_bio_queue`, `block_bio_complete` and `block_rq_complete` as
//! raw tracepoints
//! (pinned with the rest), and the never-attached `bio_still_waiting`,
//! which userspace runs to ask the kernel whether a bio it finds old in the
//! map is still in flight.

use aya::maps::Array;
use aya::programs::{RawTracePoint, RawTracePointRunOptions, TestRun};
use aya::Ebpf;

use super::errors::error_chain;
use super::pins::PinSet;
use super::Attached;

const QUEUE: (&str, &str) = ("block_bio_queue_wait", "block_bio_queue");
/// The same for kernels whose `block_bio_queue` passes `(q, bio)`.
const QUEUE_Q: (&str, &str) = ("block_bio_queue_wait_q", "block_bio_queue");
const COMPLETE: (&str, &str) = ("block_bio_complete_wait", "block_bio_complete");
const RQ_COMPLETE: (&str, &str) = ("block_rq_complete_wait", "block_rq_complete");
const STILL_WAITING: &str = "bio_still_waiting";
const WAITER: &str = "WAITER";

/// Attaches the two programs (adopting pinned ones) and loads the check;
/// `queue_arg` is where `block_bio_queue` passes the bio.
pub(super) fn attach(ebpf: &mut Ebpf, pins: Option<&PinSet>, queue_arg: u32) -> Result<(), String> {
    let queue = if queue_arg == 0 { QUEUE } else { QUEUE_Q };
    // The completions first: a bio queued before them would otherwise stay
    // in the map with no program to remove it.
    for (program, tracepoint) in [COMPLETE, RQ_COMPLETE, queue] {
        attach_raw(ebpf, pins, program, tracepoint)?;
    }
    raw(ebpf, STILL_WAITING)?
        .load()
        .map_err(|e| format!("{STILL_WAITING}: {}", error_chain(&e)))
}

fn raw<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut RawTracePoint, String> {
    ebpf.program_mut(program)
        .ok_or_else(|| format!("{program} is not in the kernel object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| format!("{program}: {e}"))
}

fn attach_raw(
    ebpf: &mut Ebpf,
    pins: Option<&PinSet>,
    program: &str,
    tracepoint: &str,
) -> Result<(), String> {
    if pins.is_some_and(|p| p.has_link(program)) {
        return Ok(());
    }
    let prog = raw(ebpf, program)?;
    prog.load()
        .map_err(|e| format!("loading {program}: {}", error_chain(&e)))?;
    let link = prog
        .attach(tracepoint)
        .map_err(|e| format!("attaching {program} to {tracepoint}: {}", error_chain(&e)))?;
    if let Some(pins) = pins {
        let link = prog
            .take_link(link)
            .map_err(|e| format!("{program}: {}", error_chain(&e)))?;
        pins.keep_link(program, link)
            .and_then(|()| pins.pin_program(ebpf, program))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// What the kernel says of a bio found in `WAITING`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BioState {
    /// Its completion is still to be traced: it waits, charged to the
    /// cgroup with this id (`None`: the kernel records none for it).
    Waiting { cgroup: Option<u64> },
    /// Its completion was traced and no program saw it (the program was
    /// kept from nesting in itself): the entry is stale.
    Completed,
    /// Its flags could not be read (freed memory): taken as completed.
    Unreadable,
}

impl Attached {
    /// Asks the kernel whether the bio at `addr` still waits, by running
    /// `bio_still_waiting` on it (`BPF_PROG_TEST_RUN`).
    pub fn bio_state(&self, addr: u64) -> Result<BioState, String> {
        if let Err(why) = &self.waiting {
            return Err(why.clone());
        }
        let prog: &RawTracePoint = self
            .ebpf
            .program(STILL_WAITING)
            .ok_or_else(|| format!("{STILL_WAITING} is not in the kernel object"))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| e.to_string())?;
        let mut opts = RawTracePointRunOptions::new();
        opts.args[0] = addr;
        let run = prog
            .test_run(opts)
            .map_err(|e| format!("running {STILL_WAITING}: {}", error_chain(&e)))?;
        Ok(match run.return_value {
            1 => BioState::Waiting {
                cgroup: self.last_waiter()?,
            },
            0 => BioState::Completed,
            _ => BioState::Unreadable,
        })
    }

    /// The cgroup id `bio_still_waiting` left in `WAITER` on its last run.
    fn last_waiter(&self) -> Result<Option<u64>, String> {
        let map = self
            .ebpf
            .map(WAITER)
            .ok_or_else(|| format!("{WAITER} is not in the kernel object"))?;
        let waiter = Array::<_, u64>::try_from(map).map_err(|e| format!("{WAITER}: {e}"))?;
        let id = waiter
            .get(&0, 0)
            .map_err(|e| format!("reading {WAITER}: {e}"))?;
        Ok((id != 0).then_some(id))
    }
}
