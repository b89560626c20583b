//! An application whose reads fail, for the errors a file operation
//! returns (`--returned-errors`, tests/guest/returned_errors.rs): moves
//! itself into a cgroup, holds a file open and reads 4 KiB at each offset
//! it is sent on stdin (`OFFSET`), or with `rw` writes 4 KiB there
//! (`w OFFSET`), answering 0 or the errno. Its own binary rather than a
//! script: python3 takes 20-40 s to start in an emulated guest.
//!
//! Usage: file-reader CGROUP_PROCS FILE [rw]

use std::io::{BufRead, Write};
use std::os::unix::fs::FileExt;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (procs, path, write) = match args.as_slice() {
        [_, procs, path] => (procs, path, false),
        [_, procs, path, rw] if rw == "rw" => (procs, path, true),
        _ => {
            eprintln!("usage: file-reader CGROUP_PROCS FILE [rw]");
            std::process::exit(2);
        }
    };
    if let Err(e) = std::fs::write(procs, std::process::id().to_string()) {
        eprintln!("file-reader: joining {procs}: {e}");
        std::process::exit(1);
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("file-reader: opening {path}: {e}");
            std::process::exit(1);
        }
    };
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "open");
    let _ = out.flush();
    let mut buf = vec![0u8; 4096];
    for line in std::io::stdin().lock().lines() {
        let Ok(line) = line else {
            eprintln!("file-reader: reading stdin failed");
            std::process::exit(2);
        };
        let line = line.trim();
        let (store, offset) = match line.strip_prefix("w ") {
            Some(offset) => (true, offset),
            None => (false, line),
        };
        let Ok(offset) = offset.parse::<u64>() else {
            eprintln!("file-reader: expected OFFSET or w OFFSET, got {line:?}");
            std::process::exit(2);
        };
        // One pread64 or pwrite64: one vfs_read or vfs_write.
        let done = match store {
            true => file.write_at(&buf, offset),
            false => file.read_at(&mut buf, offset),
        };
        let answer = match done {
            Ok(_) => 0,
            Err(e) => e.raw_os_error().unwrap_or(-1),
        };
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
}
