//! Doorbells: one small thread per CPU, each bound to its CPU, that moves
//! the event thread to a CPU free to run it the moment samples arrive.
//!
//! Why: the kernel wakes the event thread from the CPU that failed the
//! request, and places it on that CPU or on the one it last ran on. The
//! failing CPU is then still in the softirq that completed the request,
//! printing the kernel's `I/O error` line (about a millisecond on a serial
//! console), and a softirq cannot be preempted: a real-time thread is
//! always queued behind it, and on a small machine the fair scheduler does
//! not look for an idle CPU either (BENCHMARKS.md section 5). A doorbell is
//! woken by the same samples; the one on a CPU that is free runs at once
//! and moves the queued event thread there (`sched_setaffinity`), which the
//! kernel does immediately for a thread that waits for its CPU. The event
//! thread takes its whole CPU set back when its turn starts ([`Doorbells::settle`]).
//!
//! A doorbell does nothing but this: it wakes once per wake-up of the
//! event thread by the ring buffer (the kernel notifies only a reader that
//! has caught up, so at most once per batch, not per error), runs at the
//! event thread's priority, and only acts while samples are unread.
//!
//! Written here because no crate offers it: it is a few system calls
//! (`epoll`, `poll`, `sched_setaffinity`) from `nix`.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::unistd::Pid;

use super::priority::{EventPriority, EventThread};

/// Doorbells are started only where the CPUs the agent may use are at most
/// this many. On larger machines the fair scheduler looks for an idle CPU
/// itself, and a thread per CPU would cost more than it saves.
pub const MAX_CPUS: usize = 8;

/// The running doorbells; stopped and joined on drop.
pub struct Doorbells {
    flags: Arc<Flags>,
    /// The event thread's own CPU set, restored by [`Doorbells::settle`].
    full: CpuSet,
    stop: Arc<EventFd>,
    threads: Vec<JoinHandle<()>>,
}

/// Why there are no doorbells.
#[derive(Debug, thiserror::Error)]
pub enum DoorbellError {
    #[error("reading the event thread's CPU set: {0}")]
    Affinity(nix::Error),
    #[error("{0} CPUs (doorbells are for machines of at most {MAX_CPUS})")]
    TooMany(usize),
    #[error("setting up a doorbell: {0}")]
    Setup(io::Error),
}

impl Doorbells {
    /// Starts one doorbell on each CPU the calling thread (the event
    /// thread) may run on, watching `samples` (the ring buffer's
    /// descriptor). Call from the event thread.
    pub fn start(samples: BorrowedFd<'_>, priority: EventPriority) -> Result<Self, DoorbellError> {
        let full = sched_getaffinity(Pid::from_raw(0)).map_err(DoorbellError::Affinity)?;
        let cpus: Vec<usize> = (0..CpuSet::count())
            .filter(|&c| full.is_set(c).unwrap_or(false))
            .collect();
        if cpus.len() > MAX_CPUS {
            return Err(DoorbellError::TooMany(cpus.len()));
        }
        let event_thread = nix::unistd::gettid();
        let flags = Arc::new(Flags::default());
        let stop = Arc::new(
            EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC)
                .map_err(|e| DoorbellError::Setup(e.into()))?,
        );
        let mut bells = Doorbells {
            flags: Arc::clone(&flags),
            full,
            stop: Arc::clone(&stop),
            threads: Vec::new(),
        };
        for cpu in cpus {
            let bell = Bell {
                cpu,
                samples: samples.try_clone_to_owned().map_err(DoorbellError::Setup)?,
                event_thread,
                full,
                flags: Arc::clone(&flags),
                stop: Arc::clone(&stop),
                priority,
            };
            let thread = std::thread::Builder::new()
                .name(format!("health-bell-{cpu}"))
                .stack_size(STACK)
                .spawn(move || bell.run())
                .map_err(DoorbellError::Setup)?;
            // Pushed at once: a later failure drops what started.
            bells.threads.push(thread);
        }
        Ok(bells)
    }

    /// The event thread has read the ring buffer: the next samples may be
    /// steered again, and the thread takes back the CPU set a doorbell
    /// narrowed, so that nothing but a wake-up by samples is steered.
    ///
    /// Also called on the reconcile tick. A doorbell still running for
    /// samples that this turn has already read can find more of them unread
    /// and claim after this call: its claim would keep the next arrival from
    /// being steered, and its narrowing would pin the event thread to one
    /// CPU, both until the next settle. The tick bounds that to a second.
    pub fn settle(&self) {
        self.flags.claimed.store(false, Ordering::Release);
        if self.flags.narrowed.swap(false, Ordering::AcqRel) {
            if let Err(e) = sched_setaffinity(Pid::from_raw(0), &self.full) {
                tracing::warn!("restoring the event thread's CPU set: {e}");
            }
        }
    }
}

impl Drop for Doorbells {
    fn drop(&mut self) {
        if let Err(e) = self.stop.write(1) {
            tracing::warn!("stopping the doorbells: {e}");
            return;
        }
        for t in self.threads.drain(..) {
            if t.join().is_err() {
                tracing::warn!("a doorbell thread panicked");
            }
        }
        self.settle();
    }
}

/// What the doorbells and the event thread share.
#[derive(Default)]
struct Flags {
    /// A doorbell has steered the event thread for the samples now unread:
    /// the first doorbell to run does it, the others (woken by the same
    /// samples, running later) leave the thread where it is.
    claimed: AtomicBool,
    /// The event thread's CPU set is narrowed to one CPU.
    narrowed: AtomicBool,
    /// Wake-ups of all doorbells, for the tests.
    rings: AtomicU64,
}

/// A doorbell's stack: it calls a handful of system calls.
const STACK: usize = 64 * 1024;

/// One doorbell's state, moved into its thread.
struct Bell {
    cpu: usize,
    samples: OwnedFd,
    event_thread: Pid,
    /// The event thread's own CPU set.
    full: CpuSet,
    flags: Arc<Flags>,
    stop: Arc<EventFd>,
    priority: EventPriority,
}

const SAMPLES: u64 = 0;
const STOP: u64 = 1;

impl Bell {
    fn run(self) {
        if let Err(e) = self.ring() {
            tracing::warn!(cpu = self.cpu, "doorbell stopped: {e}");
        }
    }

    fn ring(&self) -> io::Result<()> {
        let mut only = CpuSet::new();
        only.set(self.cpu)?;
        sched_setaffinity(Pid::from_raw(0), &only)?;
        // The event thread's priority, so that a doorbell is not the one
        // left waiting behind busy tasks; a refusal was already reported
        // for the event thread itself.
        let _ = EventThread::raise(self.priority);
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC)?;
        // Edge-triggered: one wake-up per notification of the ring buffer,
        // not one per poll while the event thread has not read yet.
        epoll.add(
            &self.samples,
            EpollEvent::new(EpollFlags::EPOLLIN | EpollFlags::EPOLLET, SAMPLES),
        )?;
        epoll.add(
            self.stop.as_fd(),
            EpollEvent::new(EpollFlags::EPOLLIN, STOP),
        )?;
        let mut events = [EpollEvent::empty(); 2];
        loop {
            let n = epoll.wait(&mut events, EpollTimeout::NONE)?;
            if events[..n].iter().any(|e| e.data() == STOP) {
                return Ok(());
            }
            self.flags.rings.fetch_add(1, Ordering::Relaxed);
            if self.unread()? && !self.flags.claimed.swap(true, Ordering::AcqRel) {
                let mut here = CpuSet::new();
                here.set(self.cpu)?;
                // ESRCH: the event thread ended; the drop stops us next.
                match sched_setaffinity(self.event_thread, &here) {
                    Ok(()) => self.narrowed()?,
                    Err(nix::Error::ESRCH) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }

    /// Records the narrowing for [`Doorbells::settle`]. The event thread may
    /// have read the samples and settled between this doorbell's claim and
    /// its narrowing (the claim is cleared then): nothing would give the
    /// thread its CPU set back before the next tick, so the doorbell does.
    fn narrowed(&self) -> io::Result<()> {
        self.flags.narrowed.store(true, Ordering::Release);
        if !self.flags.claimed.load(Ordering::Acquire)
            && self.flags.narrowed.swap(false, Ordering::AcqRel)
        {
            match sched_setaffinity(self.event_thread, &self.full) {
                Ok(()) | Err(nix::Error::ESRCH) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }

    /// Samples are still in the ring buffer: the event thread has not run
    /// since they came (a doorbell running late, after the event thread's
    /// turn, must not pull it to a CPU for nothing).
    fn unread(&self) -> io::Result<bool> {
        let mut fds = [PollFd::new(self.samples.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO)?;
        Ok(fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN)))
    }
}

#[cfg(test)]
mod tests;
