//! Filesystems and mounts of the node service: ext4 made when a device has
//! no filesystem, mounted at the staging path, bind mounts to the targets,
//! and the usage statvfs reports. The harness's helpers do the work
//! (`crate::fs::mkfs`, `crate::sys` for mountinfo and unmounting).

use std::path::Path;
use std::process::Command;

use nix::mount::MsFlags;

use super::error::{DriverError, DriverResult};
use crate::{cmd, fs, sys};

/// The filesystem on `device`, as blkid probes it (`None`: none at all).
pub fn filesystem_of(device: &Path) -> DriverResult<Option<String>> {
    let blkid = cmd::find_tool("blkid").map_err(DriverError::host("probing for a filesystem"))?;
    let out = Command::new(&blkid)
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(device)
        .env("LC_ALL", "C")
        .output()
        .map_err(DriverError::io(format!("running {}", blkid.display())))?;
    match out.status.code() {
        Some(0) => Ok(Some(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        )),
        // blkid(8): exit status 2, nothing was found.
        Some(2) => Ok(None),
        _ => Err(DriverError::Host {
            what: format!("blkid -p {}", device.display()),
            detail: format!(
                "{}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        }),
    }
}

/// ext4 on `device`, unless it holds one already; another filesystem is
/// left alone (FAILED_PRECONDITION: making ext4 would destroy it).
pub fn ensure_ext4(device: &Path, mkfs_options: &[String]) -> DriverResult<()> {
    match filesystem_of(device)?.as_deref() {
        Some("ext4") => Ok(()),
        Some(other) => Err(DriverError::FailedPrecondition(format!(
            "{} holds a {other} filesystem, not ext4: it is left as it is",
            device.display()
        ))),
        None => {
            let mut args: Vec<&str> = vec!["-q", "-F"];
            args.extend(mkfs_options.iter().map(String::as_str));
            fs::mkfs("mkfs.ext4", device, &args).map_err(DriverError::host(format!(
                "making ext4 on {} (mkfs.ext4 {})",
                device.display(),
                args.join(" ")
            )))
        }
    }
}

/// `mount -t ext4 -o options device target` (options joined with commas,
/// none when empty).
pub fn mount_ext4(device: &Path, target: &Path, options: &[String]) -> DriverResult<()> {
    let options = options
        .iter()
        .filter(|o| !o.is_empty())
        .cloned()
        .collect::<Vec<_>>()
        .join(",");
    let os = std::ffi::OsStr::new;
    let mut args: Vec<&std::ffi::OsStr> = vec![os("-t"), os("ext4")];
    if !options.is_empty() {
        args.extend([os("-o"), os(&options)]);
    }
    args.extend([device.as_os_str(), target.as_os_str()]);
    cmd::run("mount", &args)
        .map(|_| ())
        .map_err(DriverError::host(format!(
            "mounting {} on {}",
            device.display(),
            target.display()
        )))
}

/// Bind-mounts `source` on `target` (a directory on a directory, a device
/// node on a file), read-only when asked: a bind mount takes MS_RDONLY
/// only in a remount of its own.
pub fn bind(source: &Path, target: &Path, readonly: bool) -> DriverResult<()> {
    let what = || format!("bind-mounting {} on {}", source.display(), target.display());
    nix::mount::mount(
        Some(source),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(DriverError::sys(what()))?;
    if !readonly {
        return Ok(());
    }
    let remounted = nix::mount::mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    );
    if let Err(e) = remounted {
        // Not left writable under a read-only request.
        let undone = unmount(target);
        return Err(DriverError::Host {
            what: format!("making the bind mount on {} read-only", target.display()),
            detail: match undone {
                Ok(()) => e.to_string(),
                Err(u) => format!("{e}; unmounting it again failed: {u}"),
            },
        });
    }
    Ok(())
}

/// Unmounts `target` (not being mounted is no error); a busy mount is an
/// error, never a lazy detach: a volume staged elsewhere must not linger.
pub fn unmount(target: &Path) -> DriverResult<()> {
    sys::unmount(target, false).map_err(DriverError::host(format!(
        "unmounting {}",
        target.display()
    )))
}

/// The mount whose mount point is exactly `path`, if any.
pub fn mounted_at(path: &Path) -> DriverResult<Option<sys::MountInfo>> {
    sys::mount_at(path).map_err(DriverError::host("reading /proc/self/mountinfo"))
}

/// Whether `info` is the bind mount of device node `/dev/<name>` (a bind
/// mount of a file shows the file's path in its filesystem as the root).
pub fn is_device_bind(info: &sys::MountInfo, name: &str) -> bool {
    info.root == Path::new("/").join(name)
}

/// Bytes and inodes of the filesystem at `path`: (available, total, used).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    pub bytes: (i64, i64, i64),
    pub inodes: (i64, i64, i64),
}

pub fn usage(path: &Path) -> DriverResult<Usage> {
    let s = nix::sys::statvfs::statvfs(path)
        .map_err(DriverError::sys(format!("statvfs {}", path.display())))?;
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let frsize = s.fragment_size();
    Ok(Usage {
        bytes: (
            n(s.blocks_available() * frsize),
            n(s.blocks() * frsize),
            n((s.blocks() - s.blocks_free()) * frsize),
        ),
        inodes: (
            n(s.files_available()),
            n(s.files()),
            n(s.files() - s.files_free()),
        ),
    })
}
