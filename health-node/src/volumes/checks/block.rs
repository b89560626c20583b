//! The block volume probe: does the device node still lead to a device the
//! kernel has, with a size? Runs on a blocking thread.

use std::fs;
use std::io;
use std::path::Path;

use health_core::conditions::errno_name;
use health_core::dev::Dev;
use nix::errno::Errno;

use super::probe::ProbeError;

/// What the block probe learned about a block volume's device.
pub(super) enum BlockState {
    Present,
    Missing(String),
    ZeroSize(Dev),
}

/// stat the block volume's path (following the pod's symlink to the node),
/// then ask sysfs whether the kernel still has that device and its size.
/// Runs on a blocking thread.
pub(super) fn probe_block(path: &Path, sys_root: &Path) -> Result<BlockState, ProbeError> {
    let st = match nix::sys::stat::stat(path) {
        Ok(st) => st,
        Err(errno @ (Errno::ENOENT | Errno::ENOTDIR)) => {
            return Ok(BlockState::Missing(format!(
                "the device node is gone ({})",
                errno_name(errno as i32)
            )))
        }
        Err(errno) => {
            return Err(ProbeError::Sys {
                op: "stat",
                path: path.to_path_buf(),
                errno,
            })
        }
    };
    if st.st_mode & libc::S_IFMT != libc::S_IFBLK {
        return Ok(BlockState::Missing("not a block device node".into()));
    }
    if st.st_rdev == 0 {
        return Ok(BlockState::Missing("device number 0:0".into()));
    }
    let dev = Dev::from_stat(st.st_rdev);
    let dir = sys_root.join("dev/block").join(dev.to_string());
    match fs::metadata(&dir) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(BlockState::Missing(format!(
                "the kernel has no block device {dev} (no {})",
                dir.display()
            )))
        }
        Err(error) => return Err(ProbeError::Read { path: dir, error }),
    }
    let size_path = dir.join("size");
    let text = fs::read_to_string(&size_path).map_err(|error| ProbeError::Read {
        path: size_path.clone(),
        error,
    })?;
    match text.trim().parse::<u64>() {
        Ok(0) => Ok(BlockState::ZeroSize(dev)),
        Ok(_) => Ok(BlockState::Present),
        Err(_) => Err(ProbeError::Parse {
            path: size_path,
            content: text,
        }),
    }
}
