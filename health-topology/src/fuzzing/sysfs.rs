//! sysfs block-device attributes (`topology::sysfs`): a small tree laid out
//! like the kernel's (a disk, its partition, a loop device, an md array
//! stacked on the partition) is written with the attribute values taken
//! from the input, then scanned as the agent scans `/sys`.
//!
//! Input: attribute values separated by NUL bytes, in this order: disk
//! `dev`, `size`, `ro`; partition `dev`, `size`, `partition`, `start`;
//! `loop/backing_file`; md `md/level`; disk `diskseq`. A value the input
//! does not reach is a missing file.
//!
//! Properties: no panic and no failed scan (bad values are skipped or
//! defaulted); a partition is attached to the disk it sits in; no more
//! values counted as bad than were written, plus the devices left without
//! a `dev` (which cannot be placed); a partition has its disk's sequence
//! number, whatever `diskseq` held.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::sysfs::{is_bio_based_stack, redundant_arrays, scan_block_devices};

pub fn run(data: &[u8]) {
    let root = scratch_dir();
    let _ = fs::remove_dir_all(&root);
    let mut values = data.split(|&b| b == 0);
    let mut written = 0;
    let mut attr = |dir: &Path, name: &str| {
        if let Some(v) = values.next() {
            let path = dir.join(name);
            fs::create_dir_all(path.parent().expect("an attribute has a directory"))
                .expect("creating the fake sysfs");
            fs::write(path, v).expect("writing the fake sysfs");
            written += 1;
        }
    };
    let sda = device(&root, &root.join("devices/virtual/block/sda"), "sda");
    attr(&sda, "dev");
    attr(&sda, "size");
    attr(&sda, "ro");
    let sda1 = device(&root, &sda.join("sda1"), "sda1");
    attr(&sda1, "dev");
    attr(&sda1, "size");
    attr(&sda1, "partition");
    attr(&sda1, "start");
    let loop0 = device(&root, &root.join("devices/virtual/block/loop0"), "loop0");
    fs::write(loop0.join("dev"), "7:0\n").expect("writing the fake sysfs");
    attr(&loop0, "loop/backing_file");
    let md0 = device(&root, &root.join("devices/virtual/block/md0"), "md0");
    fs::write(md0.join("dev"), "9:0\n").expect("writing the fake sysfs");
    fs::create_dir_all(md0.join("md")).expect("creating the fake sysfs");
    attr(&md0, "md/level");
    attr(&sda, "diskseq");
    symlink(&sda1, md0.join("slaves/sda1")).expect("linking the fake sysfs");
    symlink(&md0, sda1.join("holders/md0")).expect("linking the fake sysfs");

    let scan =
        scan_block_devices(&root, &std::collections::HashMap::new()).expect("class/block exists");
    // sda and sda1 get their `dev` from the input: without one each is a
    // bad value of its own (a disk that cannot be placed).
    let undeviced = ["sda", "sda1"]
        .iter()
        .filter(|n| !root.join("class/block").join(n).join("dev").exists())
        .count();
    assert!(
        scan.bad_values <= written + undeviced,
        "{} > {written} + {undeviced}",
        scan.bad_values
    );
    let disk = scan.devices.iter().find(|d| d.name == "sda");
    if let Some(part) = scan.devices.iter().find(|d| d.name == "sda1") {
        if part.partition.is_some() {
            assert_eq!(part.whole_disk, disk.map(|d| d.dev));
            assert_eq!(part.diskseq, disk.and_then(|d| d.diskseq));
        }
    }
    let _ = redundant_arrays(&root, &scan.devices);
    let _ = is_bio_based_stack(&root, "md0");
    let _ = fs::remove_dir_all(&root);
}

/// A device directory at `dir`, linked from `class/block/<name>`, with
/// empty `holders/` and `slaves/`.
fn device(root: &Path, dir: &Path, name: &str) -> PathBuf {
    fs::create_dir_all(dir.join("holders")).expect("creating the fake sysfs");
    fs::create_dir_all(dir.join("slaves")).expect("creating the fake sysfs");
    let class = root.join("class/block");
    fs::create_dir_all(&class).expect("creating the fake sysfs");
    symlink(dir, class.join(name)).expect("linking the fake sysfs");
    dir.to_path_buf()
}

/// One directory per process and thread (the seed-corpus tests run
/// targets on several threads), in memory when /dev/shm is there.
fn scratch_dir() -> PathBuf {
    let base = Path::new("/dev/shm");
    let base = if base.is_dir() {
        base.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let thread = format!("{:?}", std::thread::current().id());
    let thread: String = thread.chars().filter(char::is_ascii_digit).collect();
    base.join(format!(
        "volume-health-fuzz-sysfs-{}-{thread}",
        std::process::id()
    ))
}
