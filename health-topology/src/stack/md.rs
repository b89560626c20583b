//! An md array's state from its sysfs directory (`<sys>/class/block/mdN/md/`,
//! the kernel's `Documentation/admin-guide/md.rst`): how many members it
//! should have and lacks, whether it runs at all, and what resync or
//! recovery it is doing.

use std::path::Path;

use serde::Serialize;

use super::read_attr;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MdState {
    /// `raid1`, `raid5`, `linear`...
    pub level: String,
    /// `raid_disks`: members the array is made of.
    pub raid_disks: u32,
    /// `degraded`: members it lacks (only redundant levels have the file).
    pub degraded: u32,
    /// `array_state`: `clean`, `active`, `inactive`, `broken`...
    pub array_state: String,
    /// `sync_action` when it is not `idle`: `resync`, `recover`, `check`,
    /// `repair`, `reshape`, `frozen`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_action: Option<String>,
    /// `sync_completed` as (done, total) sectors while a sync runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sync_completed: Option<(u64, u64)>,
}

impl MdState {
    /// The array serves no I/O: stopped (`inactive`, `clear`) or, since
    /// Linux 5.4, a raid0/linear array that lost a member (`broken`).
    pub fn failed(&self) -> bool {
        matches!(self.array_state.as_str(), "inactive" | "clear" | "broken")
    }

    /// Percent of the running sync done, when one runs.
    pub fn sync_percent(&self) -> Option<u32> {
        let (done, total) = self.sync_completed?;
        (total > 0).then(|| (done.min(total) * 100 / total) as u32)
    }
}

/// Reads `md_dir` (`.../mdN/md`). `level` and `array_state` are required;
/// the rest default as an array without them behaves (no `degraded` file:
/// a level without redundancy, which never runs degraded).
pub fn read_md(md_dir: &Path) -> Result<MdState, String> {
    let level = read_attr(&md_dir.join("level"))?;
    let array_state = read_attr(&md_dir.join("array_state"))?;
    let number = |name: &str| -> Result<u32, String> {
        match read_attr(&md_dir.join(name)) {
            Ok(v) => v
                .parse()
                .map_err(|_| format!("{name} {v:?} is not a number")),
            Err(_) => Ok(0),
        }
    };
    let raid_disks = number("raid_disks")?;
    let degraded = number("degraded")?;
    let sync_action = read_attr(&md_dir.join("sync_action"))
        .ok()
        .filter(|a| a != "idle")
        .filter(|a| a != "recover" || rebuilds_a_member(md_dir));
    let sync_completed = sync_action.as_ref().and_then(|_| {
        read_attr(&md_dir.join("sync_completed"))
            .ok()
            .and_then(|s| parse_sync_completed(&s))
    });
    Ok(MdState {
        level,
        raid_disks,
        degraded,
        array_state,
        sync_action,
        sync_completed,
    })
}

/// Whether a member is being rebuilt: one in a slot of the array
/// (`dev-*/slot` a number) that is neither `in_sync` nor `faulty`
/// (`dev-*/state`). md also reads `recover` while it only looks for a spare
/// to rebuild onto: `md_check_recovery` sets "running" before it knows
/// whether anything will run (so that `sync_action` never reads `idle` in
/// between), with `sync_completed` at `0 / <size>`, and that look can take
/// a while (removing the failed member waits for an RCU grace period). A
/// degraded array with no spare is not recovering, whatever that instant
/// reads: measured on 5.10, right after `mdadm --fail`.
fn rebuilds_a_member(md_dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(md_dir) else {
        return false;
    };
    entries.flatten().any(|e| {
        if !e.file_name().to_string_lossy().starts_with("dev-") {
            return false;
        }
        let dir = e.path();
        let in_slot = read_attr(&dir.join("slot")).is_ok_and(|s| s.parse::<u32>().is_ok());
        let state = read_attr(&dir.join("state")).unwrap_or_default();
        let settled = state
            .split(',')
            .any(|w| w == "in_sync" || w == "faulty" || w == "journal");
        in_slot && !settled
    })
}

/// `sync_completed` is `<done> / <total>` while a sync runs, `none` or
/// `delayed` otherwise.
fn parse_sync_completed(s: &str) -> Option<(u64, u64)> {
    let (a, b) = s.split_once('/')?;
    Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn write(dir: &Path, attrs: &[(&str, &str)]) {
        std::fs::create_dir_all(dir).unwrap();
        for (k, v) in attrs {
            std::fs::write(dir.join(k), format!("{v}\n")).unwrap();
        }
    }

    /// A raid1 of loop1 (in sync) and loop2 (`second`: its state), one
    /// member short, md reading `recover` at `completed`.
    fn degraded_raid1(dir: &Path, completed: &str, second: &str) -> PathBuf {
        let md = dir.join("md");
        write(
            &md,
            &[
                ("level", "raid1"),
                ("raid_disks", "2"),
                ("degraded", "1"),
                ("array_state", "clean"),
                ("sync_action", "recover"),
                ("sync_completed", completed),
            ],
        );
        write(
            &md.join("dev-loop1"),
            &[("slot", "0"), ("state", "in_sync")],
        );
        write(&md.join("dev-loop2"), &[("slot", "1"), ("state", second)]);
        md
    }

    #[test]
    fn a_degraded_raid1_recovering_reads_as_such() {
        let tmp = tempfile::tempdir().unwrap();
        let md = degraded_raid1(tmp.path(), "4096 / 131072", "spare");
        let s = read_md(&md).unwrap();
        assert_eq!(
            (s.level.as_str(), s.raid_disks, s.degraded),
            ("raid1", 2, 1)
        );
        assert_eq!(s.sync_action.as_deref(), Some("recover"));
        assert_eq!(s.sync_percent(), Some(3));
        assert!(!s.failed());
    }

    /// md reads `recover` for a moment after a member fails, while it
    /// looks for a spare it does not have: not a recovery.
    #[test]
    fn a_degraded_raid1_without_a_spare_is_not_recovering() {
        let tmp = tempfile::tempdir().unwrap();
        let md = degraded_raid1(tmp.path(), "0 / 131072", "faulty");
        let s = read_md(&md).unwrap();
        assert_eq!((s.sync_action.clone(), s.sync_percent()), (None, None));
        // Removed, then added back: a spare outside any slot until md
        // takes it in.
        std::fs::write(md.join("dev-loop2/slot"), "none\n").unwrap();
        std::fs::write(md.join("dev-loop2/state"), "spare\n").unwrap();
        assert_eq!(read_md(&md).unwrap().sync_action, None);
        std::fs::write(md.join("dev-loop2/slot"), "1\n").unwrap();
        let s = read_md(&md).unwrap();
        assert_eq!(
            (s.sync_action.as_deref(), s.sync_percent()),
            (Some("recover"), Some(0))
        );
        // A resync of a whole array has no member to rebuild.
        std::fs::write(md.join("dev-loop2/state"), "in_sync\n").unwrap();
        std::fs::write(md.join("sync_action"), "resync\n").unwrap();
        assert_eq!(read_md(&md).unwrap().sync_action.as_deref(), Some("resync"));
    }

    #[test]
    fn a_whole_idle_array_and_a_broken_one() {
        let tmp = tempfile::tempdir().unwrap();
        let md = tmp.path().join("md");
        write(
            &md,
            &[
                ("level", "raid0"),
                ("raid_disks", "2"),
                ("array_state", "broken"),
                ("sync_action", "idle"),
                ("sync_completed", "none"),
            ],
        );
        let s = read_md(&md).unwrap();
        assert_eq!(
            (s.degraded, s.sync_action.clone(), s.sync_percent()),
            (0, None, None)
        );
        assert!(s.failed());
        std::fs::write(md.join("degraded"), "lots\n").unwrap();
        assert!(read_md(&md).unwrap_err().contains("degraded"));
        std::fs::remove_file(md.join("level")).unwrap();
        assert!(read_md(&md).is_err());
    }
}
