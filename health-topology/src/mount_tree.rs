//! Paths to mounts: walking a path down the mount tree from the
//! namespace's root mount, so that hidden and stacked mounts resolve the way
//! the kernel resolves them.

use std::collections::{HashMap, HashSet};
use std::path::{Component, Path, PathBuf};

use health_core::dev::Dev;

use super::{MountEntry, Topology};

impl Topology {
    /// The mount at exactly `path` (lexically normalized, symlinks not
    /// followed): the topmost of the mounts stacked there, found by walking
    /// the mount tree from `/` so that mounts hidden under a later mount on
    /// a parent directory lose. If every mount at `path` is hidden, the last
    /// one in mountinfo order.
    pub fn mount_at(&self, path: &Path) -> Option<&MountEntry> {
        let path = normalize(path);
        if let Some(m) = self.resolve(&path) {
            if normalize(&m.mount_point) == path {
                return Some(m);
            }
        }
        self.by_point
            .get(&path)
            .and_then(|v| v.last())
            .map(|&i| &self.mounts[i])
    }

    /// The filesystem dev of the mount that `path` lies on (the mount at or
    /// above it), as mountinfo shows it. Lexical: `path` must be absolute
    /// and in the mount table's namespace; symlinks are not followed.
    pub fn device_of_path(&self, path: &Path) -> Option<Dev> {
        self.resolve(&normalize(path)).map(|m| m.dev)
    }

    /// Walks `path` down the mount tree: start at the root mount, and at each
    /// prefix descend into mounts whose parent is the current mount and
    /// whose mount point is that prefix (repeatedly, for stacked mounts).
    fn resolve(&self, path: &Path) -> Option<&MountEntry> {
        if !path.has_root() {
            return None;
        }
        let mut cur = self.root_mount?;
        let mut prefix = PathBuf::from("/");
        cur = self.descend(cur, &prefix);
        for c in path.components().skip(1) {
            prefix.push(c);
            cur = self.descend(cur, &prefix);
        }
        Some(&self.mounts[cur])
    }

    fn descend(&self, mut cur: usize, point: &Path) -> usize {
        // Bounded so that a malformed table with a parent cycle cannot loop.
        for _ in 0..self.mounts.len() {
            let key = (self.mounts[cur].mount_id, point.to_path_buf());
            match self.children.get(&key).and_then(|v| v.last()) {
                Some(&next) if next != cur => cur = next,
                _ => break,
            }
        }
        cur
    }
}

/// The namespace's root mount: mounted at `/` with a parent that is not in
/// the table (the parent lies outside the namespace or the process's root).
/// The first such in mountinfo order.
pub(super) fn find_root_mount(
    mounts: &[MountEntry],
    by_point: &HashMap<PathBuf, Vec<usize>>,
) -> Option<usize> {
    let ids: HashSet<u32> = mounts.iter().map(|m| m.mount_id).collect();
    let at_root = by_point.get(Path::new("/"))?;
    at_root
        .iter()
        .copied()
        .find(|&i| {
            let m = &mounts[i];
            m.parent_id == m.mount_id || !ids.contains(&m.parent_id)
        })
        .or_else(|| at_root.first().copied())
}

/// Lexical normalization: drops `.`, empty and trailing components, applies
/// `..` textually. Mount points from the kernel are already canonical; this
/// is for caller-supplied paths.
pub(super) fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push(c);
                }
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse_mountinfo;
    use crate::tests::{SDA1, SDA2};

    #[test]
    fn mounts_of_and_lookups_by_path() {
        let mounts = parse_mountinfo(
            "\
1 0 254:0 / / rw - ext4 /dev/vda rw
20 1 8:1 / /data rw - ext4 /dev/sda1 rw
21 1 8:1 /sub /bind rw - ext4 /dev/sda1 rw
22 20 0:50 / /data/cache rw - tmpfs tmpfs rw
23 20 8:2 / /data rw - xfs /dev/sda2 rw
24 1 0:51 / /stack rw - tmpfs a rw
25 24 0:52 / /stack rw - tmpfs b rw
",
        )
        .unwrap();
        let t = Topology::from_parts(vec![], mounts);
        let ids = |v: Vec<&MountEntry>| v.iter().map(|m| m.mount_id).collect::<Vec<_>>();
        assert_eq!(ids(t.mounts_of(SDA1)), [20, 21]);
        assert_eq!(ids(t.mounts_of(Dev::new(7, 7))), Vec::<u32>::new());

        // /data is stacked: 23 (sda2) was mounted over 20 (sda1), which
        // hides 22 at /data/cache.
        assert_eq!(t.mount_at(Path::new("/data")).unwrap().mount_id, 23);
        assert_eq!(t.device_of_path(Path::new("/data/cache/x")), Some(SDA2));
        assert_eq!(t.mount_at(Path::new("/data/cache")).unwrap().mount_id, 22);
        assert_eq!(t.device_of_path(Path::new("/bind/a/b")), Some(SDA1));
        assert_eq!(
            t.device_of_path(Path::new("/bind/../etc")),
            Some(Dev::new(254, 0))
        );
        assert_eq!(t.device_of_path(Path::new("/")), Some(Dev::new(254, 0)));
        assert_eq!(t.device_of_path(Path::new("relative")), None);
        // Stacked on the same point with parent = the lower mount.
        assert_eq!(t.mount_at(Path::new("/stack/")).unwrap().mount_id, 25);
        assert_eq!(
            t.device_of_path(Path::new("/stack/f")),
            Some(Dev::new(0, 52))
        );
        assert!(t.mount_at(Path::new("/nothing")).is_none());
    }
}
