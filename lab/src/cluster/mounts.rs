//! Mounts the cluster leaves behind (the kubelet's volume, tmpfs and bind
//! mounts under its root; containerd's overlay, shm and netns mounts under
//! the state directory), found in /proc/self/mountinfo and unmounted
//! deepest first.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use health_topology::MountEntry;
use nix::mount::{umount2, MntFlags};

/// The mount points at or under `root`, in the order to unmount them: the
/// deepest first, and of those at one depth the latest mounted first (a
/// mount stacked on another at the same point is listed after it).
pub(super) fn unmount_order(mounts: &[MountEntry], root: &Path) -> Vec<PathBuf> {
    let mut under: Vec<(usize, usize, &Path)> = mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| m.mount_point.starts_with(root))
        .map(|(i, m)| {
            (
                m.mount_point.components().count(),
                i,
                m.mount_point.as_path(),
            )
        })
        .collect();
    under.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.cmp(&a.1)));
    under.into_iter().map(|(_, _, p)| p.to_path_buf()).collect()
}

/// This process's mounts, read by the agent's own mountinfo parser.
pub(super) fn current_mounts() -> anyhow::Result<Vec<MountEntry>> {
    let text =
        std::fs::read_to_string("/proc/self/mountinfo").context("reading /proc/self/mountinfo")?;
    health_topology::parse_mountinfo(&text).context("parsing /proc/self/mountinfo")
}

/// The mount points at or under `root` now.
pub(super) fn mounted_under(root: &Path) -> anyhow::Result<Vec<PathBuf>> {
    Ok(unmount_order(&current_mounts()?, root))
}

/// Unmounts everything at or under `root`, deepest first; a busy mount is
/// detached (lazily unmounted). Returns how many were unmounted.
pub(super) fn unmount_all_under(root: &Path) -> anyhow::Result<usize> {
    let mut count = 0;
    // Each pass unmounts what is listed; stacked mounts and mounts that
    // propagated back in take another pass.
    for _ in 0..10 {
        let points = mounted_under(root)?;
        if points.is_empty() {
            return Ok(count);
        }
        for point in points {
            match umount2(&point, MntFlags::empty()) {
                Ok(()) => count += 1,
                Err(nix::errno::Errno::EINVAL) | Err(nix::errno::Errno::ENOENT) => {}
                Err(_) => {
                    if umount2(&point, MntFlags::MNT_DETACH).is_ok() {
                        count += 1;
                    }
                }
            }
        }
    }
    let left = mounted_under(root)?;
    if left.is_empty() {
        return Ok(count);
    }
    bail!(
        "mounts under {} remain after ten passes: {}",
        root.display(),
        left.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_topology::parse_mountinfo;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 0:26 / /sys/fs/cgroup/memory rw,nosuid shared:9 - cgroup cgroup rw,memory
100 22 254:0 /var/lib/kubelet /var/lib/kubelet rw,relatime shared:40 - ext4 /dev/vda rw
101 100 0:50 / /var/lib/kubelet/pods/uid/volumes/kubernetes.io~projected/kube-api-access-x rw shared:41 - tmpfs tmpfs rw,size=100k
102 100 7:0 / /var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount rw shared:42 - ext4 /dev/loop0 rw
103 102 7:0 / /var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount rw shared:43 - ext4 /dev/loop0 rw
104 22 0:51 / /var/lib/kubelet-other rw shared:44 - tmpfs tmpfs rw
105 100 0:52 / /var/lib/kubelet/pods/with\\040space rw shared:45 - tmpfs tmpfs rw
";

    #[test]
    fn mountinfo_fields_are_read_with_escapes() {
        let mounts = parse_mountinfo(MOUNTINFO).unwrap();
        assert_eq!(mounts.len(), 8);
        assert_eq!(mounts[1].fs_type, "cgroup");
        assert_eq!(mounts[1].super_options, "rw,memory");
        assert_eq!(
            mounts[7].mount_point,
            PathBuf::from("/var/lib/kubelet/pods/with space")
        );
    }

    #[test]
    fn mounts_are_unmounted_deepest_and_latest_first() {
        let mounts = parse_mountinfo(MOUNTINFO).unwrap();
        let order = unmount_order(&mounts, Path::new("/var/lib/kubelet"));
        let order: Vec<String> = order.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            order,
            [
                // depth 9: the stacked mount (103) before the one below it (102)
                "/var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount",
                "/var/lib/kubelet/plugins/kubernetes.io/csi/x/globalmount",
                "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~projected/kube-api-access-x",
                "/var/lib/kubelet/pods/with space",
                "/var/lib/kubelet",
            ]
        );
    }
}
