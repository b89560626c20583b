//! The programs that follow each bio while it waits (`WAITING`): attached
//! to `block_bio_queue`, `block_bio_complete` and `block_rq_complete`
//! (pinned with the rest), and the never-attached `bio_still_waiting`,
//! which userspace runs to ask the kernel whether a bio it finds old in the
//! map is still in flight.
//!
//! The three come as two sets: BTF raw tracepoints (`tp_btf`), which read
//! the bio with plain loads, and plain raw tracepoints, which read it with
//! a helper call per field, for kernels whose verifier refuses the first.

use std::fmt;

use aya::maps::Array;
use aya::programs::{BtfTracePoint, RawTracePoint, RawTracePointRunOptions, TestRun};
use aya::{Btf, Ebpf};

use super::errors::error_chain;
use super::pins::PinSet;
use super::Attached;

/// One set of programs: (program, tracepoint), the completions first (a
/// bio queued before them would stay in the map with no program to remove
/// it), then `block_bio_queue` as it passes `(bio)` (kernels since 5.11)
/// and as it passes `(q, bio)`.
struct ProgramSet {
    completions: [(&'static str, &'static str); 2],
    queue: (&'static str, &'static str),
    queue_q: (&'static str, &'static str),
}

const BTF_SET: ProgramSet = ProgramSet {
    completions: [
        ("block_bio_complete_wait_btf", "block_bio_complete"),
        ("block_rq_complete_wait_btf", "block_rq_complete"),
    ],
    queue: ("block_bio_queue_wait_btf", "block_bio_queue"),
    queue_q: ("block_bio_queue_wait_btf_q", "block_bio_queue"),
};

const RAW_SET: ProgramSet = ProgramSet {
    completions: [
        ("block_bio_complete_wait", "block_bio_complete"),
        ("block_rq_complete_wait", "block_rq_complete"),
    ],
    queue: ("block_bio_queue_wait", "block_bio_queue"),
    queue_q: ("block_bio_queue_wait_q", "block_bio_queue"),
};

impl ProgramSet {
    /// The three this kernel needs, in attach order.
    fn programs(&self, queue_arg: u32) -> [(&'static str, &'static str); 3] {
        let queue = if queue_arg == 0 {
            self.queue
        } else {
            self.queue_q
        };
        [self.completions[0], self.completions[1], queue]
    }
}

const STILL_WAITING: &str = "bio_still_waiting";
const WAITER: &str = "WAITER";

/// Which set follows the bios.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BioPrograms {
    /// BTF raw tracepoints: a field is a load.
    Btf,
    /// Raw tracepoints with a helper call per field, and why not the
    /// first.
    Raw { why: String },
}

impl fmt::Display for BioPrograms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BioPrograms::Btf => f.write_str("BTF raw tracepoints (tp_btf), fields read by loads"),
            BioPrograms::Raw { why } => write!(
                f,
                "raw tracepoints, fields read by helper calls (the tp_btf programs: {why})"
            ),
        }
    }
}

/// Attaches one set of programs (adopting pinned ones) and loads the
/// check; `queue_arg` is where `block_bio_queue` passes the bio. The
/// `tp_btf` set where this kernel takes it, else the raw one; a set found
/// pinned is kept, since both at once would follow each bio twice. `btf`:
/// what the `tp_btf` loads look their targets up in, or why they are not
/// tried.
pub(super) fn attach(
    ebpf: &mut Ebpf,
    pins: Option<&PinSet>,
    btf: Result<&Btf, String>,
    queue_arg: u32,
) -> Result<BioPrograms, String> {
    let raw_pinned = pins.is_some_and(|p| {
        RAW_SET
            .programs(queue_arg)
            .iter()
            .any(|(program, _)| p.has_link(program))
    });
    let chosen = if raw_pinned {
        attach_raw_set(ebpf, pins, queue_arg)?;
        BioPrograms::Raw {
            why: "not tried: an earlier start attached the raw ones".into(),
        }
    } else {
        match attach_btf_set(ebpf, pins, btf, queue_arg) {
            Ok(()) => BioPrograms::Btf,
            Err(why) => {
                attach_raw_set(ebpf, pins, queue_arg)?;
                BioPrograms::Raw { why }
            }
        }
    };
    raw(ebpf, STILL_WAITING)?
        .load()
        .map_err(|e| format!("{STILL_WAITING}: {}", error_chain(&e)))?;
    Ok(chosen)
}

/// Loads all three `tp_btf` programs before attaching any, so that a
/// refusal leaves nothing attached (what was loaded stays loaded, unused,
/// until the agent exits).
fn attach_btf_set(
    ebpf: &mut Ebpf,
    pins: Option<&PinSet>,
    btf: Result<&Btf, String>,
    queue_arg: u32,
) -> Result<(), String> {
    let btf = btf?;
    let programs = BTF_SET.programs(queue_arg);
    let fresh: Vec<_> = programs
        .iter()
        .filter(|(program, _)| !pins.is_some_and(|p| p.has_link(program)))
        .collect();
    for (program, tracepoint) in &fresh {
        btf_program(ebpf, program)?
            .load(tracepoint, btf)
            .map_err(|e| format!("loading {program}: {}", error_chain(&e)))?;
    }
    for (program, tracepoint) in fresh {
        let prog = btf_program(ebpf, program)?;
        let link = prog
            .attach()
            .map_err(|e| format!("attaching {program} to {tracepoint}: {}", error_chain(&e)))?;
        if let Some(pins) = pins {
            let link = prog
                .take_link(link)
                .map_err(|e| format!("{program}: {}", error_chain(&e)))?;
            pins.keep_attached(ebpf, program, link)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

fn attach_raw_set(ebpf: &mut Ebpf, pins: Option<&PinSet>, queue_arg: u32) -> Result<(), String> {
    for (program, tracepoint) in RAW_SET.programs(queue_arg) {
        attach_raw(ebpf, pins, program, tracepoint)?;
    }
    Ok(())
}

fn btf_program<'a>(ebpf: &'a mut Ebpf, program: &str) -> Result<&'a mut BtfTracePoint, String> {
    ebpf.program_mut(program)
        .ok_or_else(|| format!("{program} is not in the kernel object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| format!("{program}: {e}"))
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
        pins.keep_attached(ebpf, program, link)
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
