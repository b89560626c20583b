//! health-kernel's readers of the real tracefs: a tracepoint's format, and
//! the tracer witness (`health_kernel::tracer_count`): an instance of its own,
//! and one kept with the pinned state. They need root (tracefs, a BPF map)
//! and fail (not skip) without it.

use std::fs;
use std::path::Path;
use std::sync::Mutex;

use anyhow::Result;
use health_kernel::probes::tiny_array_map;
use health_kernel::tracefs::Tracefs;
use health_kernel::tracer_count::{map_is_gone, remove_pinned, Lifetime, TracerCount};
use health_tests::sys::require_root;

// The tracefs names the witness module documents: `instances/volume-health-<pid>`,
// `instances/volume-health-pins-<STATS map id>`, with `block:block_rq_error` enabled.
const EVENT: &str = "events/block/block_rq_error/enable";
const PREFIX: &str = "volume-health-";
const PINS: &str = "pins-";

/// Both witness tests make this process's own instance
/// (`volume-health-<pid>`): one at a time.
static OWN_INSTANCE: Mutex<()> = Mutex::new(());

/// A tracepoint's format, as the layout of the programs' fields reads it.
#[test]
fn reads_this_kernels_block_rq_complete() -> Result<()> {
    require_root()?;
    let tracefs = Tracefs::locate(Path::new("/sys")).expect("tracefs on the test machine");
    let format = tracefs
        .event_format("block", "block_rq_complete")
        .unwrap()
        .expect("block_rq_complete exists on every supported kernel");
    assert_eq!(format.field("dev").unwrap().size, 4);
    assert_eq!(format.field("sector").unwrap().size, 8);
    assert!(tracefs
        .event_format("block", "no_such_event")
        .unwrap()
        .is_none());
    Ok(())
}

/// The real tracefs: the instance is made with the event on and a small
/// buffer, counts, is removed on drop, and a gone agent's is cleaned up.
#[test]
fn an_instance_of_its_own_on_the_real_tracefs() -> Result<()> {
    require_root()?;
    let _own = OWN_INSTANCE.lock().unwrap_or_else(|e| e.into_inner());
    let root = tracefs_root();
    // A process id above the kernel's limit is never alive.
    let stale = root.join("instances").join(format!("{PREFIX}4194305"));
    fs::create_dir(&stale).expect("making a stale instance");
    let w = TracerCount::start(&root, 0, Lifetime::Process).expect("starting the witness");
    assert!(w.made());
    assert!(!stale.exists(), "the gone agent's instance is still there");
    assert_eq!(
        w.dir(),
        root.join(format!("instances/{PREFIX}{}", std::process::id()))
    );
    assert_eq!(fs::read_to_string(w.dir().join(EVENT)).unwrap().trim(), "1");
    let kb: u64 = fs::read_to_string(w.dir().join("buffer_size_kb"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(kb <= 8, "buffer of {kb} KiB per CPU");
    // Other tests may fail requests meanwhile: only that it reads.
    w.traced().expect("reading the counts");
    let dir = w.dir().to_path_buf();
    drop(w);
    assert!(!dir.exists(), "{} left behind", dir.display());
    Ok(())
}

/// A BPF map of its own, for a map id that is alive while it is held.
fn live_map() -> (std::os::fd::OwnedFd, u32) {
    use std::os::fd::AsRawFd;
    let fd = tiny_array_map().expect("BPF_MAP_CREATE");
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap();
    let id = info
        .lines()
        .find_map(|l| l.strip_prefix("map_id:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("a map_id in the map's fdinfo");
    (fd, id)
}

/// The real tracefs.
fn tracefs_root() -> std::path::PathBuf {
    Tracefs::locate(Path::new("/sys"))
        .expect("tracefs")
        .root()
        .to_path_buf()
}

/// Kept with pinned state: not removed on drop, adopted with the base it
/// was given, removed as stale once its map is gone, and by
/// `remove_pinned`.
#[test]
fn an_instance_kept_with_the_pinned_state_on_the_real_tracefs() -> Result<()> {
    require_root()?;
    let _own = OWN_INSTANCE.lock().unwrap_or_else(|e| e.into_inner());
    let root = tracefs_root();
    let (map, map_id) = live_map();
    // Ids above INT_MAX - 1 are never given out: a map that is gone.
    let stale = root.join(format!("instances/{PREFIX}{PINS}2147483646"));
    fs::create_dir(&stale).expect("making a stale instance");

    let made = TracerCount::start(&root, 40, Lifetime::Pins { map_id, base: 0 }).unwrap();
    assert!(!stale.exists(), "the instance of gone pins is still there");
    assert!(made.made());
    let dir = made.dir().to_path_buf();
    assert_eq!(dir, root.join(format!("instances/{PREFIX}{PINS}{map_id}")));
    drop(made);
    assert!(dir.exists(), "a pinned instance went with its process");

    // The next process: the same instance, counting from its base.
    let mut adopted = TracerCount::start(&root, 90, Lifetime::Pins { map_id, base: 40 }).unwrap();
    assert!(!adopted.made());
    assert_eq!(adopted.dir(), dir);
    assert_eq!(fs::read_to_string(dir.join(EVENT)).unwrap().trim(), "1");
    // 55 traced since it was made, 50 counted since (90 - 40), and later
    // one more of each.
    assert_eq!(adopted.observe(55, 90), 5);
    assert_eq!(adopted.observe(56, 91), 0);
    assert_eq!(
        (adopted.figures().traced, adopted.figures().uncounted),
        (56, 5)
    );
    drop(adopted);

    // Its map gone, the next start (of anyone) removes it.
    drop(map);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !map_is_gone(map_id) {
        assert!(
            std::time::Instant::now() < deadline,
            "map {map_id} still there"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let other = TracerCount::start(&root, 0, Lifetime::Process).unwrap();
    assert!(!dir.exists(), "the instance of a gone map is still there");
    drop(other);

    // `uninstall`'s removal.
    let (_map, map_id) = live_map();
    let kept = TracerCount::start(&root, 0, Lifetime::Pins { map_id, base: 0 }).unwrap();
    let dir = kept.dir().to_path_buf();
    drop(kept);
    assert!(remove_pinned(&root, map_id).unwrap());
    assert!(!dir.exists());
    assert!(!remove_pinned(&root, map_id).unwrap());
    Ok(())
}
