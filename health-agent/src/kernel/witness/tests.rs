use super::*;

const STATS: &str = "entries: 127\noverrun: 336096\ncommit overrun: 2\nbytes: 4064\n\
oldest event ts: 10301.480733\nnow ts: 10310.002146\ndropped events: 0\nread events: 0\n";

#[test]
fn written_adds_what_is_left_overwritten_and_dropped() {
    assert_eq!(written(STATS), Ok(127 + 336096 + 2));
    // Kernels without the `dropped events` line.
    assert_eq!(
        written("entries: 3\noverrun: 4\ncommit overrun: 0\n"),
        Ok(7)
    );
    // `read events` is not a prefix match of anything counted.
    assert_eq!(
        written("entries: 0\noverrun: 0\ncommit overrun: 0\nread events: 9\n"),
        Ok(0)
    );
}

#[test]
fn written_names_a_missing_figure() {
    assert_eq!(written("entries: 3\ncommit overrun: 0\n"), Err("overrun"));
    assert_eq!(written("entries: x\noverrun: 1\n"), Err("entries"));
    assert_eq!(written(""), Err("entries"));
}

#[test]
fn uncounted_is_what_was_traced_beyond_what_was_counted_since_start() {
    // 40 traced before the instance existed (another process's), 1000
    // counted before this process started.
    let mut u = Uncounted::new(40, 1000);
    assert_eq!(u.observe(40, 1000), 0);
    // 500 failures, the programs ran for 497 of them.
    assert_eq!(u.observe(540, 1497), 3);
    assert_eq!((u.traced, u.uncounted), (500, 3));
    // Read mid-flood: the programs' count was read later and is ahead.
    assert_eq!(u.observe(600, 1610), 0);
    assert_eq!((u.traced, u.uncounted), (560, 3));
    // Quiet again: exact, and one more was lost meanwhile.
    assert_eq!(u.observe(700, 1656), 1);
    assert_eq!((u.traced, u.uncounted), (660, 4));
}

#[test]
fn uncounted_never_goes_down() {
    let mut u = Uncounted::new(0, 0);
    assert_eq!(u.observe(10, 7), 3);
    // The programs counted one the tracer did not (it dropped a record it
    // could not write): the figure stays.
    assert_eq!(u.observe(11, 11), 0);
    assert_eq!(u.uncounted, 3);
}

proptest::proptest! {
    /// The kernel's layout, any figures: their sum, never an overflow.
    #[test]
    fn written_sums_the_kernel_layout(
        f in proptest::array::uniform4(proptest::prelude::any::<u64>()),
        read_events in proptest::prelude::any::<u64>(),
    ) {
        let text = format!(
            "entries: {}\noverrun: {}\ncommit overrun: {}\nbytes: 4064\n\
             oldest event ts: 10301.480733\nnow ts: 10310.002146\n\
             dropped events: {}\nread events: {read_events}\n",
            f[0], f[1], f[2], f[3]
        );
        let want = f.iter().fold(0u64, |a, &b| a.saturating_add(b));
        proptest::prop_assert_eq!(written(&text), Ok(want));
    }

    /// Any text: a sum or the name of a figure it lacks, never a panic.
    #[test]
    fn written_takes_any_text(text in "(?s).{0,400}") {
        if let Err(name) = written(&text) {
            proptest::prop_assert!(["entries", "overrun", "commit overrun"].contains(&name));
        }
    }
}

/// The real tracefs: the instance is made with the event on and a small
/// buffer, counts, is removed on drop, and a gone agent's is cleaned up.
#[test]
fn an_instance_of_its_own_on_the_real_tracefs() {
    let root = tracefs_root();
    // A process id above the kernel's limit is never alive.
    let stale = root.join("instances").join(format!("{PREFIX}4194305"));
    fs::create_dir(&stale).expect("making a stale instance");
    let w = Witness::start(&root, 0, Lifetime::Process).expect("starting the witness");
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
}

/// A BPF map of its own, for a map id that is alive while it is held.
fn live_map() -> (std::os::fd::OwnedFd, u32) {
    use std::os::fd::AsRawFd;
    let fd = crate::kernel::probes::preflight::tiny_array_map().expect("BPF_MAP_CREATE");
    let info = fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).unwrap();
    let id = info
        .lines()
        .find_map(|l| l.strip_prefix("map_id:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("a map_id in the map's fdinfo");
    (fd, id)
}

/// The real tracefs, as root.
fn tracefs_root() -> std::path::PathBuf {
    assert!(
        nix::unistd::geteuid().is_root(),
        "the witness test makes a tracefs instance: run it as root"
    );
    crate::kernel::tracefs::Tracefs::locate(Path::new("/sys"))
        .expect("tracefs")
        .root()
        .to_path_buf()
}

/// Kept with pinned state: not removed on drop, adopted with the base it
/// was given, removed as stale once its map is gone, and by
/// `remove_pinned`.
#[test]
fn an_instance_kept_with_the_pinned_state_on_the_real_tracefs() {
    let root = tracefs_root();
    let (map, map_id) = live_map();
    // Ids above INT_MAX - 1 are never given out: a map that is gone.
    let stale = root.join(format!("instances/{PREFIX}{PINS}2147483646"));
    fs::create_dir(&stale).expect("making a stale instance");

    let made = Witness::start(&root, 40, Lifetime::Pins { map_id, base: 0 }).unwrap();
    assert!(!stale.exists(), "the instance of gone pins is still there");
    assert!(made.made());
    let dir = made.dir().to_path_buf();
    assert_eq!(dir, root.join(format!("instances/{PREFIX}{PINS}{map_id}")));
    drop(made);
    assert!(dir.exists(), "a pinned instance went with its process");

    // The next process: the same instance, counting from its base.
    let mut adopted = Witness::start(&root, 90, Lifetime::Pins { map_id, base: 40 }).unwrap();
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
    let other = Witness::start(&root, 0, Lifetime::Process).unwrap();
    assert!(!dir.exists(), "the instance of a gone map is still there");
    drop(other);

    // `uninstall`'s removal.
    let (_map, map_id) = live_map();
    let kept = Witness::start(&root, 0, Lifetime::Pins { map_id, base: 0 }).unwrap();
    let dir = kept.dir().to_path_buf();
    drop(kept);
    assert!(remove_pinned(&root, map_id).unwrap());
    assert!(!dir.exists());
    assert!(!remove_pinned(&root, map_id).unwrap());
}
