//! A client of the fault disk that dies without cleaning up, for the
//! self-test `orphaned_server_cleans_up_after_its_client_dies`: it starts a
//! disk, mounts ext4 on it, prints what it made and aborts, as a killed
//! test process would.

use std::io::Write;

use anyhow::Result;
use health_tests::{fs, FaultDisk};

fn main() {
    if let Err(e) = run() {
        println!("ORPHAN-ERROR {e:#}");
        std::process::exit(1);
    }
}

fn run() -> Result<()> {
    let disk = FaultDisk::start(64 << 20)?;
    let lo = disk.attach_loop(false)?;
    fs::mkfs_ext4(lo.path())?;
    // Inside the work dir, which the orphaned server deletes after unmounting.
    let target = disk.work_dir().join("fs");
    std::fs::create_dir(&target)?;
    let mnt = fs::Mount::at(lo.path(), &target, "ext4", "")?;
    std::fs::write(mnt.path().join("f"), b"x")?;
    println!(
        "ORPHAN {} {} {} {} {} {}",
        disk.server_pid(),
        lo.name(),
        lo.maj_min(),
        disk.image_path().display(),
        disk.mount_dir().display(),
        disk.work_dir().display(),
    );
    std::io::stdout().flush()?;
    // Die without running any destructor.
    std::process::abort();
}
