//! The event thread's scheduling priority as the kernel applies it
//! (`health_node::agent::priority`): SCHED_FIFO and nice raised on that
//! thread only, reset for the threads it creates and for bulk work, and the
//! fallback without CAP_SYS_NICE. Each test raises a fresh thread and reads
//! the scheduler's view of it back from /proc: the test harness's threads
//! stay as they are.
//!
//! The raising tests need root (CAP_SYS_NICE) and fail without it; the
//! others run as any user, here beside them for the helpers they share.

use std::io;

use anyhow::Result;
use health_node::agent::priority::{
    has_cap_sys_nice, Applied, EventPriority, EventThread, NICE, RT_PRIORITY,
};
use health_tests::sys::require_root;

/// Bit of `CAP_SYS_NICE` in the capability sets (linux/capability.h).
const CAP_SYS_NICE: u32 = 23;

/// `policy` and `prio` of one thread as the scheduler reports them in
/// /proc/self/task/<tid>/sched (prio: 120 + nice for SCHED_OTHER, 99 - the
/// real-time priority for SCHED_FIFO).
fn sched_of(tid: i32) -> (u32, i32) {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/sched")).unwrap();
    let field = |name: &str| -> i64 {
        text.lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no {name} in the sched file:\n{text}"))
    };
    (field("policy") as u32, field("prio") as i32)
}

fn tid() -> i32 {
    nix::unistd::gettid().as_raw()
}

/// Runs `f` on a new thread (whose priority the test may change freely).
fn on_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(f).join().unwrap()
}

const OTHER: u32 = libc::SCHED_OTHER as u32;
const FIFO: u32 = libc::SCHED_FIFO as u32;

#[test]
fn rt_is_applied_to_the_event_thread_only_and_lowered_for_bulk_work() -> Result<()> {
    require_root()?;
    let harness = tid();
    let before = sched_of(harness);
    let seen = on_thread(move || {
        let (thread, outcome) = EventThread::raise(EventPriority::Rt);
        let me = tid();
        let raised = sched_of(me);
        // SAFETY: plain query of the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        let child = std::thread::spawn(|| sched_of(tid())).join().unwrap();
        let during_bulk = {
            let _bulk = thread.bulk();
            sched_of(me)
        };
        let after_bulk = sched_of(me);
        (
            outcome.applied,
            outcome.fallback,
            raised,
            policy,
            child,
            during_bulk,
            after_bulk,
            thread.applied(),
        )
    });
    let (applied, fallback, raised, policy, child, during, after, still) = seen;
    assert_eq!(applied, Applied::Fifo(RT_PRIORITY));
    assert_eq!(fallback, None);
    assert_eq!(raised, (FIFO, 99 - RT_PRIORITY));
    assert_eq!(policy, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK);
    // Threads the event thread creates (tokio's blocking pool) start normal.
    assert_eq!(child, (OTHER, 120));
    assert_eq!(during, (OTHER, 120));
    assert_eq!(after, (FIFO, 99 - RT_PRIORITY));
    assert_eq!(still, Applied::Fifo(RT_PRIORITY));
    assert_eq!(sched_of(harness), before);
    assert_eq!(applied.to_string(), "SCHED_FIFO priority 5");
    Ok(())
}

#[test]
fn nice_is_applied_when_asked_and_reset_for_children_and_bulk_work() -> Result<()> {
    require_root()?;
    let (applied, fallback, raised, child, during, after) = on_thread(|| {
        let (thread, outcome) = EventThread::raise(EventPriority::Nice);
        let me = tid();
        let raised = sched_of(me);
        let child = std::thread::spawn(|| sched_of(tid())).join().unwrap();
        let during = {
            let _bulk = thread.bulk();
            sched_of(me)
        };
        (
            outcome.applied,
            outcome.fallback,
            raised,
            child,
            during,
            sched_of(me),
        )
    });
    assert_eq!(applied, Applied::Nice(NICE));
    assert_eq!(fallback, None);
    assert_eq!(raised, (OTHER, 120 + NICE));
    assert_eq!(child, (OTHER, 120));
    assert_eq!(during, (OTHER, 120));
    assert_eq!(after, (OTHER, 120 + NICE));
    Ok(())
}

/// Removes CAP_SYS_NICE from the calling thread's effective set. The capset
/// syscall changes one thread only (glibc does not broadcast it), so the
/// rest of the test process keeps its capabilities; there is no capability
/// crate in the workspace for two syscalls.
fn drop_cap_sys_nice() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut header = Header {
        version: VERSION_3,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: version 3 takes two Data records; both pointers are valid.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    assert_eq!(rc, 0, "capget: {}", io::Error::last_os_error());
    data[0].effective &= !(1 << CAP_SYS_NICE);
    // SAFETY: as above.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &header, data.as_ptr()) };
    assert_eq!(rc, 0, "capset: {}", io::Error::last_os_error());
}

#[test]
fn without_cap_sys_nice_it_falls_back_to_normal_and_says_what_is_missing() -> Result<()> {
    require_root()?;
    let (had, has, applied, fallback, sched) = on_thread(|| {
        let had = has_cap_sys_nice().unwrap();
        drop_cap_sys_nice();
        let has = has_cap_sys_nice().unwrap();
        let (_thread, outcome) = EventThread::raise(EventPriority::Rt);
        (had, has, outcome.applied, outcome.fallback, sched_of(tid()))
    });
    assert!(had, "the tests run as root, with CAP_SYS_NICE");
    assert!(!has);
    assert_eq!(applied, Applied::Normal);
    assert_eq!(
        fallback.as_deref(),
        Some(
            "the event path runs at SCHED_OTHER nice 0 (normal), not the priority asked: \
             SCHED_FIFO priority 5: Operation not permitted (os error 1); \
             nice -10: Permission denied (os error 13) refused \
             (CAP_SYS_NICE is missing: add SYS_NICE to the container's capabilities)"
        )
    );
    assert_eq!(sched, (OTHER, 120));
    // The harness thread still has it: the drop was this thread's own.
    assert!(has_cap_sys_nice().unwrap());
    Ok(())
}

#[test]
fn normal_changes_nothing() {
    let (applied, fallback, sched) = on_thread(|| {
        let (_thread, outcome) = EventThread::raise(EventPriority::Normal);
        (outcome.applied, outcome.fallback, sched_of(tid()))
    });
    assert_eq!(applied, Applied::Normal);
    assert_eq!(fallback, None);
    assert_eq!(sched, (OTHER, 120));
}

#[test]
fn nice_without_cap_sys_nice_falls_back_with_one_reason() {
    let (applied, fallback) = on_thread(|| {
        drop_cap_sys_nice();
        let (_thread, outcome) = EventThread::raise(EventPriority::Nice);
        (outcome.applied, outcome.fallback)
    });
    assert_eq!(applied, Applied::Normal);
    assert_eq!(
        fallback.as_deref(),
        Some(
            "the event path runs at SCHED_OTHER nice 0 (normal), not the priority asked: \
             nice -10: Permission denied (os error 13) refused \
             (CAP_SYS_NICE is missing: add SYS_NICE to the container's capabilities)"
        )
    );
}
