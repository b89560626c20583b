//! Delayed requests: one thread that runs each deferred job at its deadline, so a delay
//! never blocks a thread reading /dev/fuse.

use std::collections::BinaryHeap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// Work deferred by a delay: serve one request and answer it.
pub(super) type Job = Box<dyn FnOnce() + Send>;

struct Delayed {
    due: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Self) -> bool {
        (self.due, self.seq) == (other.due, other.seq)
    }
}
impl Eq for Delayed {}
impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Delayed {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        // Reversed: BinaryHeap is a max-heap and the earliest deadline must come first;
        // seq keeps requests with equal deadlines in arrival order.
        (other.due, other.seq).cmp(&(self.due, self.seq))
    }
}

#[derive(Default)]
struct DelayQueue {
    heap: BinaryHeap<Delayed>,
    next_seq: u64,
}

/// One thread running jobs at their deadlines; it sleeps on a condvar until the earliest
/// deadline or a new job, never polling.
#[derive(Default, Clone)]
pub(super) struct Delayer {
    inner: Arc<(Mutex<DelayQueue>, Condvar)>,
}

impl Delayer {
    fn queue(&self) -> MutexGuard<'_, DelayQueue> {
        // Jobs run outside the lock, so poisoning cannot leave the heap half-updated.
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn schedule(&self, due: Instant, job: Job) {
        let mut q = self.queue();
        let seq = q.next_seq;
        q.next_seq += 1;
        q.heap.push(Delayed { due, seq, job });
        self.inner.1.notify_one();
    }

    pub(super) fn spawn(&self) -> std::io::Result<()> {
        let me = self.clone();
        std::thread::Builder::new()
            .name("delay".into())
            .spawn(move || me.run())
            .map(|_| ())
    }

    fn run(&self) {
        let mut q = self.queue();
        loop {
            let now = Instant::now();
            match q.heap.peek().map(|d| d.due) {
                Some(due) if due <= now => {
                    if let Some(d) = q.heap.pop() {
                        drop(q);
                        (d.job)();
                        q = self.queue();
                    }
                }
                Some(due) => {
                    q = match self.inner.1.wait_timeout(q, due - now) {
                        Ok((g, _)) => g,
                        Err(p) => p.into_inner().0,
                    };
                }
                None => {
                    q = match self.inner.1.wait(q) {
                        Ok(g) => g,
                        Err(p) => p.into_inner(),
                    };
                }
            }
        }
    }
}
