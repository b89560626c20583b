//! Who waits behind a stall: the kernel names the cgroup a stalled bio is
//! charged to by its id (`health_kernel::waiting::DeviceWait`), which is
//! the inode number of the cgroup's directory in the hierarchy of the io
//! controller. Found there, its path names a pod and container where
//! kubelet made it (`/kubepods.slice/kubepods-burstable.slice/
//! kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope` with the
//! systemd cgroup driver, `/kubepods/burstable/pod<uid>/<id>` with
//! cgroupfs), and the pod store turns those into names.
//!
//! The directory walk is bounded and only done when a stall names a cgroup
//! not seen yet, at most once per [`RESCAN_GAP`].

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Names for what a cgroup path says: the pod's `namespace/name` for its
/// uid, and the container's name for its runtime id.
pub trait PodNames {
    fn pod_name(&self, uid: &str, container_id: Option<&str>) -> Option<(String, Option<String>)>;
}

/// At most one walk of the hierarchy per this long: a cgroup that is not
/// there (gone already) is not looked for on every poll.
const RESCAN_GAP: Duration = Duration::from_secs(5);
/// Bounds of a walk: a node has hundreds of cgroups, a few thousand at most.
const MAX_CGROUPS: usize = 65_536;
const MAX_DEPTH: usize = 32;
/// As `crictl ps` shortens container ids.
const SHORT_ID: usize = 13;

/// Cgroup ids to paths, for one hierarchy.
#[derive(Debug)]
pub struct Waiters {
    /// The io controller's hierarchy, or why it was not found.
    root: Result<PathBuf, String>,
    paths: HashMap<u64, String>,
    scanned: Option<Instant>,
}

impl Waiters {
    /// The io controller's hierarchy under `cgroup_root` (the host's
    /// `/sys/fs/cgroup`), as `proc_root`'s `cgroups` places it.
    pub fn new(cgroup_root: &Path, proc_root: &Path) -> Self {
        Waiters {
            root: io_hierarchy(cgroup_root, proc_root),
            paths: HashMap::new(),
            scanned: None,
        }
    }

    /// Where ids are looked up, or why they cannot be.
    pub fn root(&self) -> Result<&Path, &str> {
        self.root.as_deref().map_err(String::as_str)
    }

    /// `pod ns/name (container c)`, `pod <uid>`, or `cgroup <path>` for
    /// the cgroup with this id; `None` for the root cgroup (no one in
    /// particular) and for an id not found.
    pub fn describe(&mut self, id: u64, names: Option<&dyn PodNames>) -> Option<String> {
        let path = self.path(id)?;
        if path == "/" {
            return None;
        }
        let Some(pod) = pod_of(&path) else {
            return Some(format!("cgroup {path}"));
        };
        let named = names.and_then(|n| n.pod_name(&pod.uid, pod.container_id.as_deref()));
        let (pod_name, container) = match named {
            Some((name, container)) => (name, container),
            None => (pod.uid.clone(), None),
        };
        let container = container.or_else(|| {
            pod.container_id
                .map(|id| id.chars().take(SHORT_ID).collect())
        });
        Some(match container {
            Some(c) => format!("pod {pod_name} (container {c})"),
            None => format!("pod {pod_name}"),
        })
    }

    fn path(&mut self, id: u64) -> Option<String> {
        if let Some(p) = self.paths.get(&id) {
            return Some(p.clone());
        }
        let root = self.root.as_ref().ok()?;
        if self.scanned.is_some_and(|t| t.elapsed() < RESCAN_GAP) {
            return None;
        }
        self.scanned = Some(Instant::now());
        self.paths = scan(root);
        self.paths.get(&id).cloned()
    }
}

/// The directory of the hierarchy the io controller is in: cgroup v1's
/// `blkio` mount where `/proc/cgroups` gives it a hierarchy of its own,
/// else cgroup v2 (the root itself, or `unified` in a hybrid layout).
pub fn io_hierarchy(cgroup_root: &Path, proc_root: &Path) -> Result<PathBuf, String> {
    let cgroups = proc_root.join("cgroups");
    let table =
        fs::read_to_string(&cgroups).map_err(|e| format!("reading {}: {e}", cgroups.display()))?;
    let v1 = table.lines().any(|l| {
        let mut f = l.split_whitespace();
        f.next() == Some("blkio") && f.next().is_some_and(|h| h != "0")
    });
    if v1 {
        let entries = fs::read_dir(cgroup_root)
            .map_err(|e| format!("reading {}: {e}", cgroup_root.display()))?;
        return entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| {
                p.is_dir()
                    && p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.split(',').any(|c| c == "blkio"))
            })
            .ok_or_else(|| {
                format!(
                    "blkio is a cgroup v1 controller here and {} has no blkio directory",
                    cgroup_root.display()
                )
            });
    }
    [cgroup_root.to_path_buf(), cgroup_root.join("unified")]
        .into_iter()
        .find(|p| p.join("cgroup.controllers").is_file())
        .ok_or_else(|| format!("no cgroup hierarchy at {}", cgroup_root.display()))
}

/// Every cgroup under `root`, by inode number (the cgroup's id), as a path
/// from the root (`/` itself).
fn scan(root: &Path) -> HashMap<u64, String> {
    let mut out = HashMap::new();
    let mut stack = vec![(root.to_path_buf(), String::new(), 0usize)];
    while let Some((dir, rel, depth)) = stack.pop() {
        let Ok(meta) = fs::symlink_metadata(&dir) else {
            continue;
        };
        let shown = if rel.is_empty() {
            "/".to_string()
        } else {
            rel.clone()
        };
        out.insert(meta.ino(), shown);
        if out.len() >= MAX_CGROUPS || depth >= MAX_DEPTH {
            continue;
        }
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.filter_map(Result::ok) {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let name = e.file_name().to_string_lossy().into_owned();
                stack.push((e.path(), format!("{rel}/{name}"), depth + 1));
            }
        }
    }
    out
}

/// A cgroup kubelet made for a pod, and the container's below it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCgroup {
    pub uid: String,
    pub container_id: Option<String>,
}

/// The pod (and container) of a cgroup path under kubelet's `kubepods`,
/// with either cgroup driver.
pub fn pod_of(path: &str) -> Option<PodCgroup> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let kubepods = segments.iter().position(|s| s.starts_with("kubepods"))?;
    let (at, uid) = segments
        .iter()
        .enumerate()
        .skip(kubepods)
        .find_map(|(i, s)| pod_uid(s).map(|uid| (i, uid)))?;
    let container_id = segments.get(at + 1).and_then(|s| container_id(s));
    Some(PodCgroup { uid, container_id })
}

/// `pod<uid>` (cgroupfs) or `kubepods-<class>-pod<uid_with_underscores>.slice` (systemd).
fn pod_uid(segment: &str) -> Option<String> {
    let raw = match segment.strip_suffix(".slice") {
        Some(slice) => &slice[slice.rfind("-pod")? + 4..],
        None => segment.strip_prefix("pod")?,
    };
    let uid = raw.replace('_', "-");
    let uuid_like = uid.len() == 36
        && uid.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        && uid.matches('-').count() == 4;
    uuid_like.then_some(uid)
}

/// `<id>` (cgroupfs) or `<runtime>-<id>.scope` (systemd: `cri-containerd-`,
/// `crio-`, `docker-`): a 64-digit hex runtime id.
fn container_id(segment: &str) -> Option<String> {
    let raw = match segment.strip_suffix(".scope") {
        Some(scope) => &scope[scope.rfind('-')? + 1..],
        None => segment,
    };
    (raw.len() == 64 && raw.chars().all(|c| c.is_ascii_hexdigit())).then(|| raw.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6f1c2b3a-1234-4bcd-8ef0-0123456789ab";
    const CID: &str = "3f2a1b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f708";

    #[test]
    fn pods_and_containers_from_either_cgroup_driver() {
        let systemd = format!(
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{}.slice/cri-containerd-{CID}.scope",
            UID.replace('-', "_")
        );
        let want = PodCgroup {
            uid: UID.into(),
            container_id: Some(CID.into()),
        };
        assert_eq!(pod_of(&systemd), Some(want.clone()));
        assert_eq!(
            pod_of(&format!("/kubepods/burstable/pod{UID}/{CID}")),
            Some(want)
        );
        // Guaranteed pods sit right under kubepods; the pod's own cgroup
        // (no container) and crio's conmon scope name no container.
        let guaranteed = format!(
            "/kubepods.slice/kubepods-pod{}.slice",
            UID.replace('-', "_")
        );
        let pod_only = PodCgroup {
            uid: UID.into(),
            container_id: None,
        };
        assert_eq!(pod_of(&guaranteed), Some(pod_only.clone()));
        assert_eq!(
            pod_of(&format!("/kubepods/pod{UID}/crio-conmon-x.scope")),
            Some(pod_only)
        );
        // Not kubelet's.
        assert_eq!(pod_of("/system.slice/containerd.service"), None);
        assert_eq!(pod_of(&format!("/user.slice/pod{UID}")), None);
        assert_eq!(pod_of("/kubepods/burstable/podnot-a-uid"), None);
    }

    proptest::proptest! {
        /// Any uid and runtime id kubelet could write come back from
        /// either driver's path; any other path never panics.
        #[test]
        fn kubelet_paths_round_trip(uid in "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
                                    cid in "[0-9a-f]{64}", junk in "\\PC{0,80}") {
            let want = Some(PodCgroup { uid: uid.clone(), container_id: Some(cid.clone()) });
            let systemd = format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{cid}.scope",
                uid.replace('-', "_")
            );
            proptest::prop_assert_eq!(pod_of(&systemd), want.clone());
            proptest::prop_assert_eq!(pod_of(&format!("/kubepods/besteffort/pod{uid}/{cid}")), want);
            let _ = pod_of(&junk);
            let _ = pod_of(&format!("/kubepods/{junk}"));
        }
    }

    struct Names;
    impl PodNames for Names {
        fn pod_name(&self, uid: &str, cid: Option<&str>) -> Option<(String, Option<String>)> {
            (uid == UID).then(|| ("default/db-0".into(), cid.map(|_| "postgres".into())))
        }
    }

    /// Ids are inode numbers of a real directory tree (a temporary one
    /// standing in for cgroupfs); the root cgroup names no one.
    #[test]
    fn ids_are_found_by_inode_and_described() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("unified");
        let container = root.join(format!("kubepods/burstable/pod{UID}/{CID}"));
        let service = root.join("system.slice/backup.service");
        fs::create_dir_all(&container).unwrap();
        fs::create_dir_all(&service).unwrap();
        fs::write(root.join("cgroup.controllers"), "io memory\n").unwrap();
        let proc = dir.path().join("proc");
        fs::create_dir_all(&proc).unwrap();
        fs::write(
            proc.join("cgroups"),
            "#subsys_name\thierarchy\tnum_cgroups\tenabled\nblkio\t0\t1\t1\n",
        )
        .unwrap();
        let ino = |p: &Path| fs::metadata(p).unwrap().ino();

        let mut w = Waiters::new(dir.path(), &proc);
        assert_eq!(w.root(), Ok(root.as_path()));
        assert_eq!(
            w.describe(ino(&container), Some(&Names)).as_deref(),
            Some("pod default/db-0 (container postgres)")
        );
        assert_eq!(
            w.describe(ino(&container), None),
            Some(format!("pod {UID} (container {})", &CID[..13]))
        );
        assert_eq!(
            w.describe(ino(&service), None).as_deref(),
            Some("cgroup /system.slice/backup.service")
        );
        assert_eq!(w.describe(ino(&root), None), None);
        assert_eq!(w.describe(u64::MAX, None), None);
    }

    #[test]
    fn a_v1_blkio_hierarchy_is_used_where_proc_cgroups_says_so() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("blkio")).unwrap();
        fs::create_dir_all(dir.path().join("unified")).unwrap();
        fs::write(dir.path().join("unified/cgroup.controllers"), "").unwrap();
        fs::write(dir.path().join("cgroups"), "blkio\t7\t2\t1\n").unwrap();
        let w = Waiters::new(dir.path(), dir.path());
        assert_eq!(w.root(), Ok(dir.path().join("blkio").as_path()));
        fs::write(dir.path().join("cgroups"), "blkio\t0\t2\t1\n").unwrap();
        let w = Waiters::new(dir.path(), dir.path());
        assert_eq!(w.root(), Ok(dir.path().join("unified").as_path()));
        let w = Waiters::new(&dir.path().join("none"), dir.path());
        assert_eq!(
            w.root(),
            Err(format!(
                "no cgroup hierarchy at {}",
                dir.path().join("none").display()
            )
            .as_str())
        );
    }
}
