//! What is wrong with a volume, as the driver can see it: the node's view
//! of a staged volume (its device, its file, its mounts) and the
//! controller's view of a volume (its file). Each problem's text is the
//! legacy `volume_condition` message and a CSI 1.13 health entry's.

use std::fmt;
use std::path::{Path, PathBuf};

use health_csi::proto;
use health_csi::proto::VolumeHealthErrorType as HealthStatus;

use super::backing::Backing;
use super::error::DriverResult;
use super::loops::{self, DeviceState};
use super::mounts;
use super::records::{StagedRecord, VolumeRecord};
use super::requests::Access;
use crate::sys::FileId;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// The file under the volume is gone (removed, or renamed away).
    FileGone { file: PathBuf },
    /// The loop device no longer shows the volume's stretch.
    DeviceLost {
        device: String,
        file: PathBuf,
        offset: u64,
    },
    /// Nothing is mounted where the volume should be.
    NotMounted { path: PathBuf },
    /// Something else is mounted there.
    OtherMounted { path: PathBuf, source: String },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::FileGone { file } => {
                write!(f, "the volume's backing file {} is gone", file.display())
            }
            Problem::DeviceLost {
                device,
                file,
                offset,
            } => write!(
                f,
                "/dev/{device} is no longer attached to {} at offset {offset}",
                file.display()
            ),
            Problem::NotMounted { path } => write!(f, "{} is not mounted", path.display()),
            Problem::OtherMounted { path, source } => write!(
                f,
                "{} has {source} mounted, not the volume's device",
                path.display()
            ),
        }
    }
}

impl Problem {
    /// CSI 1.13's kind and CamelCase reason of the problem.
    fn health(&self) -> (HealthStatus, &'static str) {
        match self {
            Problem::FileGone { .. } => (HealthStatus::DataLoss, "BackingFileGone"),
            Problem::DeviceLost { .. } => (HealthStatus::Inaccessible, "LoopDeviceLost"),
            Problem::NotMounted { .. } => (HealthStatus::Inaccessible, "NotMounted"),
            Problem::OtherMounted { .. } => (HealthStatus::Inaccessible, "OtherMounted"),
        }
    }
}

/// Whether `backing`'s file is still the file at its path: `None` when it
/// is, the problem when it is not.
fn file_problem(backing: &Backing, expected: Option<FileId>) -> Option<Problem> {
    let gone = || {
        Some(Problem::FileGone {
            file: backing.file.clone(),
        })
    };
    match (FileId::of(&backing.file), expected) {
        (Err(_), _) => gone(),
        (Ok(now), Some(then)) if now != then => gone(),
        (Ok(_), _) => None,
    }
}

/// The controller's view: the volume is abnormal while its file is gone.
pub fn of_volume(record: &VolumeRecord) -> Vec<Problem> {
    file_problem(&record.backing, None).into_iter().collect()
}

/// The node's view of `staged` at `path` (its staging path or one of its
/// targets): the device first (nothing below it matters when it is lost),
/// then the file, then what is mounted at `path`.
pub fn of_staged(staged: &StagedRecord, path: &Path) -> DriverResult<Vec<Problem>> {
    let mut out = Vec::new();
    if loops::state(&staged.device, staged.file, &staged.backing)? == DeviceState::Lost {
        out.push(Problem::DeviceLost {
            device: staged.device.clone(),
            file: staged.backing.file.clone(),
            offset: staged.backing.offset,
        });
        return Ok(out);
    }
    out.extend(file_problem(&staged.backing, Some(staged.file.into())));
    let is_target = path != staged.staging_path;
    // A block volume's staging path holds nothing: the device is the volume.
    if staged.access == Access::Block && !is_target {
        return Ok(out);
    }
    let ours = |m: &crate::sys::MountInfo| -> DriverResult<bool> {
        Ok(match staged.access {
            Access::Block => mounts::is_device_bind(m, &staged.device),
            Access::Mount => m.maj_min == loops::maj_min(&staged.device)?,
        })
    };
    match mounts::mounted_at(path)? {
        None => out.push(Problem::NotMounted {
            path: path.to_path_buf(),
        }),
        Some(m) if !ours(&m)? => out.push(Problem::OtherMounted {
            path: path.to_path_buf(),
            source: m.source,
        }),
        Some(_) => {}
    }
    Ok(out)
}

/// The legacy condition: abnormal with every problem's text, or normal.
pub fn legacy(problems: &[Problem]) -> proto::VolumeCondition {
    proto::VolumeCondition {
        abnormal: !problems.is_empty(),
        message: match problems {
            [] => "healthy".to_string(),
            more => more
                .iter()
                .map(Problem::to_string)
                .collect::<Vec<_>>()
                .join("; "),
        },
    }
}

/// CSI 1.13 health: one entry per problem (none: healthy).
pub fn health(volume_id: &str, problems: &[Problem]) -> proto::VolumeHealth {
    proto::VolumeHealth {
        volume_id: volume_id.to_string(),
        health_statuses: problems
            .iter()
            .map(|p| {
                let (status, reason) = p.health();
                proto::volume_health::VolumeHealthEntry {
                    status: status as i32,
                    reason: reason.to_string(),
                    message: p.to_string(),
                }
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problems_read_as_the_condition_says_them() {
        let gone = Problem::FileGone {
            file: "/state/data/loop-1.img".into(),
        };
        let unmounted = Problem::NotMounted {
            path: "/pods/p/mount".into(),
        };
        assert_eq!(
            legacy(&[gone.clone(), unmounted.clone()]),
            proto::VolumeCondition {
                abnormal: true,
                message: "the volume's backing file /state/data/loop-1.img is gone; /pods/p/mount is not mounted".into(),
            }
        );
        assert_eq!(
            legacy(&[]),
            proto::VolumeCondition {
                abnormal: false,
                message: "healthy".into()
            }
        );
        let lost = Problem::DeviceLost {
            device: "loop3".into(),
            file: "/disk.img".into(),
            offset: 4096,
        };
        assert_eq!(
            lost.to_string(),
            "/dev/loop3 is no longer attached to /disk.img at offset 4096"
        );
        let other = Problem::OtherMounted {
            path: "/stage".into(),
            source: "tmpfs".into(),
        };
        assert_eq!(
            other.to_string(),
            "/stage has tmpfs mounted, not the volume's device"
        );
        let entries = health("v", &[gone, lost]).health_statuses;
        let got: Vec<(i32, &str)> = entries
            .iter()
            .map(|e| (e.status, e.reason.as_str()))
            .collect();
        assert_eq!(
            got,
            vec![
                (HealthStatus::DataLoss as i32, "BackingFileGone"),
                (HealthStatus::Inaccessible as i32, "LoopDeviceLost"),
            ]
        );
    }

    #[test]
    fn a_volume_is_abnormal_at_the_controller_while_its_file_is_away() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("v.img");
        std::fs::write(&file, vec![0u8; 4096]).unwrap();
        let record = VolumeRecord {
            id: "loop-1".into(),
            name: "v".into(),
            backing: Backing {
                file: file.clone(),
                offset: 0,
                size: 4096,
                mkfs_options: vec![],
                fs_options: String::new(),
            },
            own_file: true,
        };
        assert_eq!(of_volume(&record), vec![]);
        let away = dir.path().join("v.away");
        std::fs::rename(&file, &away).unwrap();
        assert_eq!(
            of_volume(&record),
            vec![Problem::FileGone { file: file.clone() }]
        );
        std::fs::rename(&away, &file).unwrap();
        assert_eq!(of_volume(&record), vec![]);
    }
}
