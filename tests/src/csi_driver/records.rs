//! What the driver keeps under `--state-dir`, as JSON files written
//! atomically (a new file renamed over the old), so that a restarted
//! driver knows its volumes and what it staged:
//!
//! ```text
//! volumes/<id>.json     a volume CreateVolume made (VolumeRecord)
//! data/<id>.img         the file of a volume made without a `file` parameter
//! staged/<digest>.json  a volume staged on this node (StagedRecord), by a
//!                       digest of its id (ids come from anyone: static PVs)
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::backing::Backing;
use super::error::{DriverError, DriverResult};
use super::requests::Access;

/// A volume of CreateVolume.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub id: String,
    pub name: String,
    pub backing: Backing,
    /// Whether the driver made `backing.file` (it removes it with the
    /// volume); a stretch of someone else's file is left alone.
    pub own_file: bool,
}

/// The identity of a loop device's backing file as the kernel keeps it
/// (device and inode), so a device can be told to be still bound to *that*
/// file after the file was renamed, removed or replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileIdentity {
    pub major: u32,
    pub minor: u32,
    pub inode: u64,
}

impl From<crate::sys::FileId> for FileIdentity {
    fn from(id: crate::sys::FileId) -> Self {
        FileIdentity {
            major: id.major,
            minor: id.minor,
            inode: id.ino,
        }
    }
}

impl From<FileIdentity> for crate::sys::FileId {
    fn from(id: FileIdentity) -> Self {
        crate::sys::FileId {
            major: id.major,
            minor: id.minor,
            ino: id.inode,
        }
    }
}

/// A place the volume is published at.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Target {
    pub path: PathBuf,
    pub readonly: bool,
}

/// A volume staged on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedRecord {
    pub volume_id: String,
    pub staging_path: PathBuf,
    pub access: Access,
    pub backing: Backing,
    /// The loop device's kernel name (`loop3`).
    pub device: String,
    /// The backing file the device was bound to when staged.
    pub file: FileIdentity,
    /// Whether this driver attached the device (and so detaches it); one
    /// found attached already stays.
    pub attached: bool,
    pub targets: Vec<Target>,
}

/// The records under one state directory.
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
}

const VOLUMES: &str = "volumes";
const STAGED: &str = "staged";
const DATA: &str = "data";

impl Store {
    /// Opens `dir`, making it and its subdirectories when missing.
    pub fn open(dir: &Path) -> DriverResult<Store> {
        for sub in [VOLUMES, STAGED, DATA] {
            let path = dir.join(sub);
            std::fs::create_dir_all(&path)
                .map_err(DriverError::io(format!("creating {}", path.display())))?;
        }
        Ok(Store {
            dir: dir.to_path_buf(),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where a volume made without a `file` parameter keeps its data.
    pub fn data_file(&self, id: &str) -> PathBuf {
        self.dir.join(DATA).join(format!("{id}.img"))
    }

    fn volume_path(&self, id: &str) -> PathBuf {
        self.dir.join(VOLUMES).join(format!("{id}.json"))
    }

    fn staged_path(&self, volume_id: &str) -> PathBuf {
        let digest = Sha256::digest(volume_id.as_bytes());
        let hex: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
        self.dir.join(STAGED).join(format!("{hex}.json"))
    }

    pub fn volume(&self, id: &str) -> DriverResult<Option<VolumeRecord>> {
        // Only ids of the driver's own form name a file: any other id
        // (`../x`) is simply unknown.
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
            return Ok(None);
        }
        read(&self.volume_path(id))
    }

    /// Every volume, by id.
    pub fn volumes(&self) -> DriverResult<Vec<VolumeRecord>> {
        let mut out: Vec<VolumeRecord> = read_all(&self.dir.join(VOLUMES))?;
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    pub fn put_volume(&self, record: &VolumeRecord) -> DriverResult<()> {
        write(&self.volume_path(&record.id), record)
    }

    pub fn remove_volume(&self, id: &str) -> DriverResult<()> {
        remove(&self.volume_path(id))
    }

    pub fn staged(&self, volume_id: &str) -> DriverResult<Option<StagedRecord>> {
        let record: Option<StagedRecord> = read(&self.staged_path(volume_id))?;
        // A digest's file holding another id would be a collision: unknown.
        Ok(record.filter(|r| r.volume_id == volume_id))
    }

    pub fn all_staged(&self) -> DriverResult<Vec<StagedRecord>> {
        read_all(&self.dir.join(STAGED))
    }

    pub fn put_staged(&self, record: &StagedRecord) -> DriverResult<()> {
        write(&self.staged_path(&record.volume_id), record)
    }

    pub fn remove_staged(&self, volume_id: &str) -> DriverResult<()> {
        remove(&self.staged_path(volume_id))
    }
}

fn read<T: DeserializeOwned>(path: &Path) -> DriverResult<Option<T>> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(DriverError::io(format!("reading {}", path.display()))(e)),
    };
    serde_json::from_slice(&text)
        .map(Some)
        .map_err(|e| DriverError::Record(format!("{} is not a record: {e}", path.display())))
}

fn read_all<T: DeserializeOwned>(dir: &Path) -> DriverResult<Vec<T>> {
    let listing = |e| DriverError::io(format!("listing {}", dir.display()))(e);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(listing)? {
        let path = entry.map_err(listing)?.path();
        // Half-written files of `write` end in `.tmp`: not records yet.
        if path.extension().is_some_and(|e| e == "json") {
            if let Some(record) = read(&path)? {
                out.push(record);
            }
        }
    }
    Ok(out)
}

/// Writes `record` to `path` so that a reader sees the old record or the
/// new one, never a part: a temporary file, synced, renamed over it.
fn write<T: Serialize>(path: &Path, record: &T) -> DriverResult<()> {
    let text = serde_json::to_vec_pretty(record)
        .map_err(|e| DriverError::Record(format!("encoding {}: {e}", path.display())))?;
    let tmp = path.with_extension("json.tmp");
    let mut file = std::fs::File::create(&tmp)
        .map_err(DriverError::io(format!("creating {}", tmp.display())))?;
    file.write_all(&text)
        .and_then(|()| file.sync_all())
        .map_err(DriverError::io(format!("writing {}", tmp.display())))?;
    std::fs::rename(&tmp, path).map_err(DriverError::io(format!(
        "renaming {} to {}",
        tmp.display(),
        path.display()
    )))
}

fn remove(path: &Path) -> DriverResult<()> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(DriverError::io(format!("removing {}", path.display()))(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn backing() -> Backing {
        Backing {
            file: "/disk.img".into(),
            offset: 4096,
            size: 8192,
            mkfs_options: vec!["-O".into(), "^has_journal".into()],
            fs_options: "errors=continue".into(),
        }
    }

    #[test]
    fn a_volume_record_is_this_json() {
        let record = VolumeRecord {
            id: "loop-0123456789abcdef".into(),
            name: "pvc-1".into(),
            backing: backing(),
            own_file: false,
        };
        assert_eq!(
            serde_json::to_value(&record).unwrap(),
            serde_json::json!({
                "id": "loop-0123456789abcdef",
                "name": "pvc-1",
                "backing": {
                    "file": "/disk.img",
                    "offset": 4096,
                    "size": 8192,
                    "mkfs_options": ["-O", "^has_journal"],
                    "fs_options": "errors=continue",
                },
                "own_file": false,
            })
        );
    }

    #[test]
    fn records_survive_a_new_store_on_the_same_dir_and_go_when_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let b = VolumeRecord {
            id: "loop-b".into(),
            name: "b".into(),
            backing: backing(),
            own_file: true,
        };
        let a = VolumeRecord {
            id: "loop-a".into(),
            name: "a".into(),
            ..b.clone()
        };
        store.put_volume(&b).unwrap();
        store.put_volume(&a).unwrap();
        let staged = StagedRecord {
            volume_id: "any/id with spaces".into(),
            staging_path: "/stage".into(),
            access: Access::Block,
            backing: backing(),
            device: "loop7".into(),
            file: FileIdentity {
                major: 0,
                minor: 44,
                inode: 12,
            },
            attached: true,
            targets: vec![Target {
                path: "/pods/p/dev".into(),
                readonly: true,
            }],
        };
        store.put_staged(&staged).unwrap();

        let again = Store::open(dir.path()).unwrap();
        assert_eq!(again.volumes().unwrap(), vec![a.clone(), b.clone()]);
        assert_eq!(again.volume("loop-b").unwrap(), Some(b));
        assert_eq!(again.volume("../volumes/loop-b").unwrap(), None);
        assert_eq!(
            again.staged("any/id with spaces").unwrap(),
            Some(staged.clone())
        );
        assert_eq!(again.all_staged().unwrap(), vec![staged]);
        assert_eq!(again.staged("other").unwrap(), None);
        assert_eq!(
            again.data_file("loop-a"),
            dir.path().join("data/loop-a.img")
        );

        again.remove_volume("loop-b").unwrap();
        again.remove_volume("loop-b").unwrap();
        again.remove_staged("any/id with spaces").unwrap();
        assert_eq!(again.volumes().unwrap(), vec![a]);
        assert_eq!(again.all_staged().unwrap(), vec![]);
        // Nothing but the records is left behind (no temporary files).
        let names: Vec<String> = std::fs::read_dir(dir.path().join("volumes"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["loop-a.json".to_string()]);
    }

    #[test]
    fn a_damaged_record_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let path = dir.path().join("volumes/loop-x.json");
        std::fs::write(&path, b"{").unwrap();
        let e = store.volume("loop-x").unwrap_err();
        assert_eq!(e.code(), tonic::Code::Internal);
        assert!(
            e.to_string().starts_with(&format!(
                "the driver's records: {} is not a record: ",
                path.display()
            )),
            "{e}"
        );
    }
}
