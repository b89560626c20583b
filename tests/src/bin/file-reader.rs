//! An application whose reads fail, for the errors a file operation
//! returns (`--returned-errors`, tests/guest/returned_errors.rs): moves
//! itself into a cgroup, holds a file open and reads 4 KiB at each offset
//! it is sent on stdin, answering 0 or the errno. Its own binary rather
//! than a script: python3 takes 20-40 s to start in an emulated guest.
//!
//! Usage: file-reader CGROUP_PROCS FILE

use std::fs::File;
use std::io::{BufRead, Write};
use std::os::unix::fs::FileExt;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, procs, path] = args.as_slice() else {
        eprintln!("usage: file-reader CGROUP_PROCS FILE");
        std::process::exit(2);
    };
    if let Err(e) = std::fs::write(procs, std::process::id().to_string()) {
        eprintln!("file-reader: joining {procs}: {e}");
        std::process::exit(1);
    }
    let file = match File::open(path) {
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
        let Ok(offset) = line
            .map_err(drop)
            .and_then(|l| l.trim().parse::<u64>().map_err(drop))
        else {
            eprintln!("file-reader: expected an offset");
            std::process::exit(2);
        };
        // One pread64: one vfs_read.
        let answer = match file.read_at(&mut buf, offset) {
            Ok(_) => 0,
            Err(e) => e.raw_os_error().unwrap_or(-1),
        };
        let _ = writeln!(out, "{answer}");
        let _ = out.flush();
    }
}
