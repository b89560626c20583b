//! What a volume is: a stretch of a file, `(file, offset, size)`, with the
//! options its filesystem is made and mounted with. It travels in the
//! volume's `volume_context`, so the kubelet hands it back at NodeStage
//! (from a static PV's `volumeAttributes` too), and it comes in as
//! CreateVolume's `parameters` for a volume over an existing file.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::error::{DriverError, DriverResult};

/// `volume_context` and `parameters` keys.
pub const FILE: &str = "file";
pub const OFFSET: &str = "offset";
pub const SIZE: &str = "size";
/// Extra arguments of `mkfs.ext4`, split at white space
/// (`-O ^has_journal`).
pub const MKFS_OPTIONS: &str = "mkfsOptions";
/// Mount options of the filesystem at NodeStage (`errors=continue`).
pub const FS_OPTIONS: &str = "fsOptions";

/// Loop devices address 512-byte sectors: offsets and sizes are multiples.
pub const SECTOR: u64 = 512;

/// A stretch of a file that one loop device shows.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Backing {
    /// Absolute.
    pub file: PathBuf,
    pub offset: u64,
    pub size: u64,
    pub mkfs_options: Vec<String>,
    /// Empty for none.
    pub fs_options: String,
}

impl Backing {
    /// Its bytes of the file, `[offset, offset + size)`.
    pub fn end(&self) -> u64 {
        self.offset + self.size
    }

    /// Whether it shares a byte with `other` (over the same file).
    pub fn overlaps(&self, other: &Backing) -> bool {
        self.file == other.file && self.offset < other.end() && other.offset < self.end()
    }

    /// As `volume_context`: every key, options only when set.
    pub fn to_context(&self) -> HashMap<String, String> {
        let mut out = HashMap::from([
            (FILE.to_string(), self.file.display().to_string()),
            (OFFSET.to_string(), self.offset.to_string()),
            (SIZE.to_string(), self.size.to_string()),
        ]);
        if !self.mkfs_options.is_empty() {
            out.insert(MKFS_OPTIONS.to_string(), self.mkfs_options.join(" "));
        }
        if !self.fs_options.is_empty() {
            out.insert(FS_OPTIONS.to_string(), self.fs_options.clone());
        }
        out
    }

    /// From a `volume_context` this driver wrote (or a PV's
    /// `volumeAttributes` written the same way).
    pub fn from_context(context: &HashMap<String, String>) -> DriverResult<Backing> {
        let sorted: BTreeMap<&str, &str> = context
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let get = |key: &str| {
            sorted.get(key).copied().ok_or_else(|| {
                DriverError::InvalidArgument(format!(
                    "volume_context has no {key:?} (it has {:?})",
                    sorted.keys().collect::<Vec<_>>()
                ))
            })
        };
        let backing = Backing {
            file: PathBuf::from(get(FILE)?),
            offset: number(OFFSET, get(OFFSET)?)?,
            size: number(SIZE, get(SIZE)?)?,
            mkfs_options: split_options(sorted.get(MKFS_OPTIONS).copied().unwrap_or("")),
            fs_options: sorted.get(FS_OPTIONS).copied().unwrap_or("").to_string(),
        };
        unknown_keys(
            "volume_context",
            sorted.keys(),
            &[FILE, OFFSET, SIZE, MKFS_OPTIONS, FS_OPTIONS],
        )?;
        backing.checked()
    }

    /// The checks every backing passes: an absolute file, whole sectors, a
    /// size, no overflow.
    pub fn checked(self) -> DriverResult<Backing> {
        if !self.file.is_absolute() {
            return Err(DriverError::InvalidArgument(format!(
                "file {:?} is not an absolute path",
                self.file
            )));
        }
        if self.size == 0
            || !self.size.is_multiple_of(SECTOR)
            || !self.offset.is_multiple_of(SECTOR)
        {
            return Err(DriverError::InvalidArgument(format!(
                "offset {} and size {} must be multiples of {SECTOR} bytes, and the size not 0",
                self.offset, self.size
            )));
        }
        if self.offset.checked_add(self.size).is_none() {
            return Err(DriverError::OutOfRange(format!(
                "offset {} + size {} overflows",
                self.offset, self.size
            )));
        }
        Ok(self)
    }
}

/// What CreateVolume's `parameters` ask for: a stretch of an existing file
/// (`file`, `offset`), or (no `file`) a file of the driver's own; the
/// filesystem options either way.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parameters {
    pub stretch: Option<(PathBuf, u64)>,
    pub mkfs_options: Vec<String>,
    pub fs_options: String,
}

impl Parameters {
    pub fn parse(parameters: &HashMap<String, String>) -> DriverResult<Parameters> {
        let sorted: BTreeMap<&str, &str> = parameters
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        unknown_keys(
            "parameters",
            sorted.keys(),
            &[FILE, OFFSET, MKFS_OPTIONS, FS_OPTIONS],
        )?;
        let stretch = match (sorted.get(FILE), sorted.get(OFFSET)) {
            (Some(file), Some(offset)) => Some((PathBuf::from(file), number(OFFSET, offset)?)),
            (Some(file), None) => Some((PathBuf::from(file), 0)),
            (None, Some(_)) => {
                return Err(DriverError::InvalidArgument(format!(
                    "parameter {OFFSET:?} needs {FILE:?}: it is an offset into that file"
                )))
            }
            (None, None) => None,
        };
        Ok(Parameters {
            stretch,
            mkfs_options: split_options(sorted.get(MKFS_OPTIONS).copied().unwrap_or("")),
            fs_options: sorted.get(FS_OPTIONS).copied().unwrap_or("").to_string(),
        })
    }

    /// The backing of a volume of `size` bytes: the stretch asked for, or
    /// all of `own_file`.
    pub fn backing(&self, own_file: &Path, size: u64) -> DriverResult<Backing> {
        let (file, offset) = match &self.stretch {
            Some((file, offset)) => (file.clone(), *offset),
            None => (own_file.to_path_buf(), 0),
        };
        Backing {
            file,
            offset,
            size,
            mkfs_options: self.mkfs_options.clone(),
            fs_options: self.fs_options.clone(),
        }
        .checked()
    }
}

fn number(key: &str, text: &str) -> DriverResult<u64> {
    text.parse().map_err(|_| {
        DriverError::InvalidArgument(format!("{key} {text:?} is not a number of bytes"))
    })
}

fn split_options(text: &str) -> Vec<String> {
    text.split_whitespace().map(str::to_string).collect()
}

fn unknown_keys<'a>(
    what: &str,
    keys: impl Iterator<Item = &'a &'a str>,
    known: &[&str],
) -> DriverResult<()> {
    let unknown: Vec<&str> = keys.copied().filter(|k| !known.contains(k)).collect();
    if unknown.is_empty() {
        Ok(())
    } else {
        Err(DriverError::InvalidArgument(format!(
            "{what} has unknown keys {unknown:?} (known: {known:?})"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_context_round_trips_and_names_every_key() {
        let backing = Backing {
            file: "/disk.img".into(),
            offset: 192 << 20,
            size: 64 << 20,
            mkfs_options: vec!["-O".into(), "^has_journal".into()],
            fs_options: "errors=continue".into(),
        };
        let context = backing.to_context();
        assert_eq!(
            context,
            map(&[
                ("file", "/disk.img"),
                ("offset", "201326592"),
                ("size", "67108864"),
                ("mkfsOptions", "-O ^has_journal"),
                ("fsOptions", "errors=continue"),
            ])
        );
        assert_eq!(Backing::from_context(&context).unwrap(), backing);
        let plain = map(&[("file", "/v.img"), ("offset", "0"), ("size", "4096")]);
        assert_eq!(Backing::from_context(&plain).unwrap().to_context(), plain);
    }

    #[test]
    fn a_bad_context_is_an_invalid_argument_saying_what_is_wrong() {
        let err = |pairs: &[(&str, &str)]| Backing::from_context(&map(pairs)).unwrap_err();
        let e = err(&[("file", "/v.img"), ("size", "4096")]);
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(
            e.to_string(),
            "volume_context has no \"offset\" (it has [\"file\", \"size\"])"
        );
        assert_eq!(
            err(&[("file", "v.img"), ("offset", "0"), ("size", "4096")]).to_string(),
            "file \"v.img\" is not an absolute path"
        );
        assert_eq!(
            err(&[("file", "/v"), ("offset", "100"), ("size", "4096")]).to_string(),
            "offset 100 and size 4096 must be multiples of 512 bytes, and the size not 0"
        );
        assert_eq!(
            err(&[("file", "/v"), ("offset", "-1"), ("size", "4096")]).to_string(),
            "offset \"-1\" is not a number of bytes"
        );
        assert_eq!(
            err(&[
                ("file", "/v"),
                ("offset", "18446744073709551104"),
                ("size", "1024")
            ])
            .code(),
            tonic::Code::OutOfRange
        );
        assert_eq!(
            err(&[("file", "/v"), ("offset", "0"), ("size", "512"), ("x", "1")]).to_string(),
            "volume_context has unknown keys [\"x\"] (known: [\"file\", \"offset\", \"size\", \"mkfsOptions\", \"fsOptions\"])"
        );
    }

    #[test]
    fn parameters_name_a_stretch_or_leave_the_file_to_the_driver() {
        let own = Path::new("/state/data/loop-1.img");
        let none = Parameters::parse(&HashMap::new()).unwrap();
        assert_eq!(none, Parameters::default());
        assert_eq!(
            none.backing(own, 8192).unwrap(),
            Backing {
                file: own.into(),
                offset: 0,
                size: 8192,
                mkfs_options: vec![],
                fs_options: String::new(),
            }
        );
        let stretch = Parameters::parse(&map(&[
            ("file", "/disk.img"),
            ("offset", "1048576"),
            ("fsOptions", "errors=continue"),
        ]))
        .unwrap();
        assert_eq!(
            stretch.backing(own, 4096).unwrap(),
            Backing {
                file: "/disk.img".into(),
                offset: 1 << 20,
                size: 4096,
                mkfs_options: vec![],
                fs_options: "errors=continue".into(),
            }
        );
        let e = Parameters::parse(&map(&[("offset", "0")])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "parameter \"offset\" needs \"file\": it is an offset into that file"
        );
        let e = Parameters::parse(&map(&[("size", "4096")])).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn stretches_of_one_file_overlap_only_where_they_share_bytes() {
        let at = |file: &str, offset: u64, size: u64| Backing {
            file: file.into(),
            offset,
            size,
            mkfs_options: vec![],
            fs_options: String::new(),
        };
        assert!(at("/d", 0, 1024).overlaps(&at("/d", 512, 1024)));
        assert!(!at("/d", 0, 1024).overlaps(&at("/d", 1024, 1024)));
        assert!(!at("/d", 0, 1024).overlaps(&at("/e", 0, 1024)));
        assert!(at("/d", 512, 512).overlaps(&at("/d", 0, 4096)));
    }
}
