//! Real threads, real affinity: a pipe stands in for the ring buffer (both
//! are readable while something is unread, and notify their waiters when
//! something arrives).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use super::*;

fn cpus_of_this_thread() -> Vec<usize> {
    let set = sched_getaffinity(Pid::from_raw(0)).unwrap();
    (0..CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap())
        .collect()
}

fn bell_threads() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.unwrap().path().join("comm")).ok())
        .map(|c| c.trim_end().to_string())
        .filter(|c| c.starts_with("health-bell-"))
        .collect();
    names.sort();
    names
}

fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// One test, because the doorbells steer the thread that started them and
/// count wake-ups of their own: the steps depend on each other.
#[test]
fn doorbells_steer_the_event_thread_once_per_arrival_and_give_it_back() {
    let full = cpus_of_this_thread();
    let (rx, tx) = nix::unistd::pipe().unwrap();
    let bells = Doorbells::start(rx.as_fd(), EventPriority::Normal).unwrap();
    let expected: Vec<String> = {
        let mut v: Vec<String> = full.iter().map(|c| format!("health-bell-{c}")).collect();
        v.sort();
        v
    };
    // A thread names itself once it runs.
    wait_for("the doorbell threads", || bell_threads() == expected);
    assert_eq!(bells.flags.rings.load(Ordering::Relaxed), 0);

    // Something arrives: every doorbell wakes once, the first to run
    // narrows this thread to its own CPU, the others leave it.
    nix::unistd::write(&tx, b"x").unwrap();
    wait_for("every doorbell to ring", || {
        bells.flags.rings.load(Ordering::Relaxed) == full.len() as u64
    });
    wait_for("the event thread to be narrowed", || {
        bells.flags.narrowed.load(Ordering::Acquire)
    });
    let narrowed = cpus_of_this_thread();
    assert_eq!(narrowed.len(), 1, "narrowed to {narrowed:?}");
    assert!(full.contains(&narrowed[0]));
    // Still unread, and edge-triggered: no doorbell rings again for it.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(bells.flags.rings.load(Ordering::Relaxed), full.len() as u64);

    // The event thread's turn: its CPU set is back, and the next arrival
    // may be steered again.
    bells.settle();
    assert_eq!(cpus_of_this_thread(), full);
    assert!(!bells.flags.claimed.load(Ordering::Acquire));
    assert!(!bells.flags.narrowed.load(Ordering::Acquire));

    // Read, then a second arrival: rung and steered again.
    let mut buf = [0u8; 8];
    assert_eq!(nix::unistd::read(&rx, &mut buf).unwrap(), 1);
    nix::unistd::write(&tx, b"y").unwrap();
    wait_for("the second ring", || {
        bells.flags.rings.load(Ordering::Relaxed) == 2 * full.len() as u64
    });
    wait_for("the event thread to be narrowed again", || {
        bells.flags.narrowed.load(Ordering::Acquire)
    });
    assert_eq!(cpus_of_this_thread().len(), 1);

    // Stopping joins every doorbell and gives the CPU set back.
    drop(bells);
    assert_eq!(bell_threads(), Vec::<String>::new());
    assert_eq!(cpus_of_this_thread(), full);
}

#[test]
fn a_doorbell_sees_unread_data_only_while_it_is_there() {
    let (rx, tx) = nix::unistd::pipe().unwrap();
    let bell = Bell {
        cpu: 0,
        samples: rx.as_fd().try_clone_to_owned().unwrap(),
        event_thread: nix::unistd::gettid(),
        full: sched_getaffinity(Pid::from_raw(0)).unwrap(),
        flags: Arc::new(Flags::default()),
        stop: Arc::new(EventFd::new().unwrap()),
        priority: EventPriority::Normal,
    };
    assert!(!bell.unread().unwrap());
    nix::unistd::write(&tx, b"x").unwrap();
    assert!(bell.unread().unwrap());
    let mut buf = [0u8; 8];
    nix::unistd::read(&rx, &mut buf).unwrap();
    assert!(!bell.unread().unwrap());
}

/// The event thread settled between a doorbell's claim and its narrowing:
/// the doorbell gives the set back itself; while the claim stands, it does
/// not.
#[test]
fn a_narrowing_after_the_settle_is_undone_by_the_doorbell() {
    let full = cpus_of_this_thread();
    let bell = Bell {
        cpu: full[0],
        samples: nix::unistd::pipe().unwrap().0,
        event_thread: nix::unistd::gettid(),
        full: sched_getaffinity(Pid::from_raw(0)).unwrap(),
        flags: Arc::new(Flags::default()),
        stop: Arc::new(EventFd::new().unwrap()),
        priority: EventPriority::Normal,
    };
    let mut one = CpuSet::new();
    one.set(full[0]).unwrap();

    // The claim stands: the narrowing stays, for `settle` to undo.
    bell.flags.claimed.store(true, Ordering::Release);
    sched_setaffinity(Pid::from_raw(0), &one).unwrap();
    bell.narrowed().unwrap();
    assert_eq!(cpus_of_this_thread(), vec![full[0]]);
    assert!(bell.flags.narrowed.load(Ordering::Acquire));

    // Settled meanwhile (claim cleared, nothing narrowed yet to undo).
    bell.flags.claimed.store(false, Ordering::Release);
    bell.flags.narrowed.store(false, Ordering::Release);
    sched_setaffinity(Pid::from_raw(0), &one).unwrap();
    bell.narrowed().unwrap();
    assert_eq!(cpus_of_this_thread(), full);
    assert!(!bell.flags.narrowed.load(Ordering::Acquire));
}
