//! NVMe native multipath in the topology. With `nvme_core.multipath=Y`
//! (Debian's and most distributions' default) a namespace reachable through
//! several controllers is one head disk, `nvme<S>n<N>` (bio-based, the one
//! with a /dev node), over one hidden path disk per controller,
//! `nvme<S>c<C>n<N>` (the kernel's naming in `drivers/nvme/host/multipath.c`).
//!
//! The path disks are what fails: a failed command is traced at
//! `block_rq_error` with the path disk's device number. sysfs lists them in
//! `class/block` but, being hidden, without a `dev` file, and neither
//! `holders/` nor `slaves/` links them to their head. So the topology takes
//! their numbers from `/proc/diskstats` (which lists every disk, hidden ones
//! included) and links each path under its head by name: an error on a path
//! reaches the head's volume. That counts it once: the head does not fail
//! the request again (a path error is retried on another path without a
//! failed request; any other error completes the application's bio from
//! the path disk).

use std::collections::HashMap;
use std::fs;
use std::path::Path;

use health_core::dev::Dev;

use crate::BlockDevice;

/// `(subsystem, controller, namespace)` of a path disk's name
/// `nvme<S>c<C>n<N>`.
pub fn path_disk(name: &str) -> Option<(u32, u32, u32)> {
    let rest = name.strip_prefix("nvme")?;
    let (s, rest) = rest.split_once('c')?;
    let (c, n) = rest.split_once('n')?;
    Some((number(s)?, number(c)?, number(n)?))
}

/// The head disk's name of a path disk's `(subsystem, namespace)`.
pub fn head_disk(subsystem: u32, namespace: u32) -> String {
    format!("nvme{subsystem}n{namespace}")
}

fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// Device numbers by name from `<proc>/diskstats`; empty (with a debug
/// log) when it cannot be read: only hidden disks need it.
pub(crate) fn diskstats_numbers(proc_root: &Path) -> HashMap<String, Dev> {
    let path = proc_root.join("diskstats");
    match fs::read_to_string(&path) {
        Ok(text) => parse_diskstats(&text),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "no device numbers for hidden disks");
            HashMap::new()
        }
    }
}

/// `major minor name ...` per line; lines that do not fit are skipped, and
/// so are `0 0` entries: 5.10 lists hidden path disks without their number
/// (the tracepoints still carry it), and 0:0 is no device.
pub(crate) fn parse_diskstats(text: &str) -> HashMap<String, Dev> {
    text.lines()
        .filter_map(|line| {
            let mut f = line.split_ascii_whitespace();
            let major = f.next()?.parse().ok()?;
            let minor = f.next()?.parse().ok()?;
            let name = f.next()?;
            let dev = Dev::new(major, minor);
            (dev != Dev::new(0, 0)).then(|| (name.to_string(), dev))
        })
        .collect()
}

/// The path disks of the head `nvme<S>n<N>` that sysfs lists, by name,
/// whether or not their numbers are known (5.10: not).
pub fn paths_of_head(sys_root: &Path, head: &str) -> Vec<String> {
    let Some((s, n)) = head_numbers(head) else {
        return Vec::new();
    };
    let Ok(rd) = fs::read_dir(sys_root.join("class/block")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = rd
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| path_disk(name).is_some_and(|(ps, _, pn)| ps == s && pn == n))
        .collect();
    names.sort();
    names
}

/// `(subsystem, namespace)` of a head disk's name `nvme<S>n<N>`.
pub fn head_numbers(name: &str) -> Option<(u32, u32)> {
    let (s, n) = name.strip_prefix("nvme")?.split_once('n')?;
    Some((number(s)?, number(n)?))
}

/// Links every path disk under its head (`holders`/`slaves`, as dm and md
/// link their layers), where both are present.
pub(crate) fn link_paths(devices: &mut [BlockDevice]) {
    let by_name: HashMap<String, Dev> = devices.iter().map(|d| (d.name.clone(), d.dev)).collect();
    let mut links: Vec<(Dev, Dev)> = Vec::new();
    for d in devices.iter() {
        if let Some((s, _, n)) = path_disk(&d.name) {
            if let Some(&head) = by_name.get(&head_disk(s, n)) {
                links.push((d.dev, head));
            }
        }
    }
    for d in devices.iter_mut() {
        for &(path, head) in &links {
            if d.dev == path && !d.holders.contains(&head) {
                d.holders.push(head);
                d.holders.sort();
            }
            if d.dev == head && !d.slaves.contains(&path) {
                d.slaves.push(path);
                d.slaves.sort();
            }
        }
    }
}

/// Of the `(number, name)` pairs the agent's kernel side recorded for
/// failed requests, those whose name sysfs lists without a number: the
/// hidden path disks of NVMe multipath on 5.10, whose numbers appear
/// nowhere else. For [`crate::Topology::scan_with_numbers`].
pub fn unnumbered_disks(
    sys_root: &Path,
    seen: impl IntoIterator<Item = (Dev, String)>,
) -> HashMap<String, Dev> {
    seen.into_iter()
        .filter(|(_, name)| {
            // A kernel disk name is one path component.
            !name.is_empty() && !name.contains('/') && name != "." && name != ".."
        })
        .filter(|(_, name)| {
            let dir = sys_root.join("class/block").join(name);
            dir.is_dir() && !dir.join("dev").exists()
        })
        .map(|(dev, name)| (name, dev))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_and_head_names() {
        assert_eq!(path_disk("nvme0c1n2"), Some((0, 1, 2)));
        assert_eq!(path_disk("nvme12c3n1"), Some((12, 3, 1)));
        for not in [
            "nvme0n1",
            "nvme0n1p1",
            "nvme0c1n",
            "nvmec1n1",
            "nvme0c1n1p2",
            "sda",
        ] {
            assert_eq!(path_disk(not), None, "{not}");
        }
        assert_eq!(head_disk(0, 2), "nvme0n2");
    }

    #[test]
    fn only_names_sysfs_lists_without_a_number_are_learned() {
        let sys = tempfile::tempdir().unwrap();
        let block = sys.path().join("class/block");
        for (name, dev) in [("nvme0c0n1", None), ("nvme0n1", Some("259:1"))] {
            std::fs::create_dir_all(block.join(name)).unwrap();
            if let Some(d) = dev {
                std::fs::write(block.join(name).join("dev"), d).unwrap();
            }
        }
        let seen = [
            (Dev::new(259, 2), "nvme0c0n1".to_string()),
            // Has its own number: not overridden.
            (Dev::new(259, 9), "nvme0n1".to_string()),
            // Not listed, or not a name.
            (Dev::new(259, 3), "nvme0c1n1".to_string()),
            (Dev::new(259, 4), "../x".to_string()),
            (Dev::new(259, 5), String::new()),
        ];
        assert_eq!(
            unnumbered_disks(sys.path(), seen),
            HashMap::from([("nvme0c0n1".to_string(), Dev::new(259, 2))])
        );
    }

    #[test]
    fn diskstats_gives_hidden_disks_their_numbers() {
        let text = "\
 259       0 nvme0c0n1 12 0 96 4 0 0 0 0 0 8 4 0 0 0 0 0 0
 259       1 nvme0n1 12 0 96 4 0 0 0 0 0 8 4 0 0 0 0 0 0
   7       0 loop0 0 0 0 0 0 0 0 0 0 0 0
garbage
";
        let n = parse_diskstats(text);
        assert_eq!(n["nvme0c0n1"], Dev::new(259, 0));
        assert_eq!(n["loop0"], Dev::new(7, 0));
        assert_eq!(n.len(), 3);
        // 5.10 lists hidden disks as 0:0: no number, not a device 0:0.
        let old = parse_diskstats("   0       0 nvme0c0n1 6 0 48\n 259       1 nvme0n1 0 0 0\n");
        assert_eq!(old.len(), 1);
        assert_eq!(old["nvme0n1"], Dev::new(259, 1));
        assert_eq!(head_numbers("nvme3n2"), Some((3, 2)));
        assert_eq!(head_numbers("nvme3c1n2"), None);
    }

    #[test]
    fn paths_are_linked_under_their_head() {
        let disk = |dev: Dev, name: &str| BlockDevice {
            dev,
            name: name.into(),
            whole_disk: None,
            partition: None,
            size_sectors: 8,
            loop_backing_file: None,
            holders: vec![],
            slaves: vec![],
            read_only: false,
            diskseq: None,
        };
        let (p0, p1, head, other) = (
            Dev::new(259, 0),
            Dev::new(259, 2),
            Dev::new(259, 1),
            Dev::new(259, 3),
        );
        let mut devs = vec![
            disk(p0, "nvme0c0n1"),
            disk(head, "nvme0n1"),
            disk(p1, "nvme0c1n1"),
            disk(other, "nvme1c0n1"),
        ];
        link_paths(&mut devs);
        assert_eq!(devs[0].holders, [head]);
        assert_eq!(devs[1].slaves, [p0, p1]);
        assert_eq!(devs[2].holders, [head]);
        // A path whose head is not there stays alone.
        assert!(devs[3].holders.is_empty());
        link_paths(&mut devs);
        assert_eq!(devs[1].slaves, [p0, p1], "linking twice changes nothing");
    }
}
