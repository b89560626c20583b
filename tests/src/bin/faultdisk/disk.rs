//! The served disk's shared state (rules, counters, injection log, request trace) and
//! the decision whether a request fails; every FUSE and control thread goes through it.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use health_tests::protocol::{
    mono_ns, ErrnoCount, Injection, Op, OpCounters, Rule, ServerInfo, Stats, TracedRequest,
    DEFAULT_LOG_CAPACITY,
};

use crate::delay::{Delayer, Job};

pub(super) struct ActiveRule {
    pub(super) id: u64,
    pub(super) rule: Rule,
    pub(super) used: u64,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) rules: Vec<ActiveRule>,
    pub(super) next_rule_id: u64,
    pub(super) counts: BTreeMap<(Op, i32), u64>,
    pub(super) total: u64,
    pub(super) requests: OpCounters,
    pub(super) bytes: OpCounters,
    pub(super) max_len: OpCounters,
    pub(super) log: VecDeque<Injection>,
    pub(super) log_dropped: u64,
    next_seq: u64,
    pub(super) trace: VecDeque<TracedRequest>,
    trace_seq: u64,
}

pub(super) struct Disk {
    pub(super) backing: File,
    state: Mutex<State>,
    pub(super) delay_us: AtomicU64,
    pub(super) trace_on: AtomicBool,
    pub(super) kernel_abi: OnceLock<String>,
    pub(super) info: OnceLock<ServerInfo>,
    pub(super) delayer: Delayer,
    pub(super) uid: u32,
    pub(super) gid: u32,
}

impl Disk {
    pub(super) fn new(backing: File) -> Disk {
        Disk {
            backing,
            state: Mutex::new(State {
                next_rule_id: 1,
                ..State::default()
            }),
            delay_us: AtomicU64::new(0),
            trace_on: AtomicBool::new(false),
            kernel_abi: OnceLock::new(),
            info: OnceLock::new(),
            delayer: Delayer::default(),
            uid: nix::unistd::getuid().as_raw(),
            gid: nix::unistd::getgid().as_raw(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock would only leave counters half-updated; keep
        // serving (and counting) rather than failing every later request.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a request as received.
    pub(super) fn count(&self, op: Op, len: u64) {
        let mut st = self.lock();
        if let Some(c) = st.requests.get_mut(op) {
            *c += 1;
        }
        if let Some(c) = st.bytes.get_mut(op) {
            *c += len;
        }
        if let Some(c) = st.max_len.get_mut(op) {
            *c = (*c).max(len);
        }
    }

    /// Decides whether the request fails, after any delay. A failure is fully recorded
    /// (counters, log, trace) before this returns, so a client asking for stats once its
    /// syscall returned always sees it.
    pub(super) fn decide(
        &self,
        op: Op,
        offset: u64,
        len: u64,
        mode: i32,
        received_ns: u64,
    ) -> Option<i32> {
        let mut st = self.lock();
        let hit = st.rules.iter_mut().find(|r| {
            r.rule.op.matches(op)
                && r.rule.limit.is_none_or(|l| r.used < l)
                && match r.rule.range {
                    None => true,
                    // Flushes have no range: only range-less rules apply to them.
                    Some(range) => op != Op::Flush && range.overlaps(offset, len),
                }
        })?;
        hit.used += 1;
        let errno = hit.rule.errno;
        let rule_id = hit.id;
        *st.counts.entry((op, errno)).or_insert(0) += 1;
        st.total += 1;
        let seq = st.next_seq;
        st.next_seq += 1;
        if st.log.len() >= DEFAULT_LOG_CAPACITY {
            st.log.pop_front();
            st.log_dropped += 1;
        }
        let now = mono_ns();
        st.log.push_back(Injection {
            seq,
            op,
            offset,
            len,
            errno,
            rule_id,
            mode,
            mono_ns: now,
        });
        if self.trace_on.load(Ordering::Relaxed) {
            push_trace(&mut st, op, offset, len, errno, received_ns, now);
        }
        Some(errno)
    }

    /// Runs `job` now, or after the configured delay on the delay thread (so a delay
    /// never blocks a thread reading /dev/fuse, and any number of delayed requests can
    /// be pending at once).
    pub(super) fn after_delay(&self, job: Job) {
        let delay = self.delay_us.load(Ordering::Relaxed);
        if delay == 0 {
            job();
        } else {
            self.delayer
                .schedule(Instant::now() + Duration::from_micros(delay), job);
        }
    }

    /// Records a served (not injected) request in the trace, if tracing.
    pub(super) fn finish(&self, op: Op, offset: u64, len: u64, errno: i32, received_ns: u64) {
        if self.trace_on.load(Ordering::Relaxed) {
            let now = mono_ns();
            let mut st = self.lock();
            push_trace(&mut st, op, offset, len, errno, received_ns, now);
        }
    }

    pub(super) fn stats(&self) -> Stats {
        let st = self.lock();
        Stats {
            total_injected: st.total,
            injected: st
                .counts
                .iter()
                .map(|(&(op, errno), &count)| ErrnoCount { op, errno, count })
                .collect(),
            requests: st.requests.clone(),
            bytes: st.bytes.clone(),
            max_len: st.max_len.clone(),
            log_len: st.log.len() as u64,
            log_dropped: st.log_dropped,
        }
    }
}

pub(super) fn push_trace(
    st: &mut State,
    op: Op,
    offset: u64,
    len: u64,
    errno: i32,
    received_ns: u64,
    answered_ns: u64,
) {
    if st.trace.len() >= DEFAULT_LOG_CAPACITY {
        st.trace.pop_front();
    }
    let seq = st.trace_seq;
    st.trace_seq += 1;
    st.trace.push_back(TracedRequest {
        seq,
        op,
        offset,
        len,
        errno,
        received_ns,
        answered_ns,
    });
}
