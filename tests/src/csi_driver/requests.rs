//! The checks of requests that need no state: the size a capacity range
//! asks for, the capabilities this driver serves, the names of volumes and
//! the pages of ListVolumes.

use health_csi::proto;
use health_csi::proto::volume_capability::access_mode::Mode;
use health_csi::proto::volume_capability::AccessType;
use sha2::{Digest, Sha256};

use super::backing::SECTOR;
use super::error::{DriverError, DriverResult};

/// The size of a volume whose request names none (hostpath's default too).
pub const DEFAULT_BYTES: u64 = 1 << 30;

/// How a volume is consumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Access {
    /// A raw block device.
    Block,
    /// ext4, mounted.
    Mount,
}

/// The size to give a volume asked for with `range`: `required_bytes`
/// rounded up to whole sectors, or the default when it is 0, within
/// `limit_bytes` when that is set.
pub fn volume_size(range: Option<&proto::CapacityRange>) -> DriverResult<u64> {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    let (Ok(required), Ok(limit)) = (u64::try_from(required), u64::try_from(limit)) else {
        return Err(DriverError::InvalidArgument(format!(
            "capacity_range [{required}, {limit}] has a negative bound"
        )));
    };
    if limit > 0 && limit < required {
        return Err(DriverError::InvalidArgument(format!(
            "capacity_range: limit_bytes {limit} is below required_bytes {required}"
        )));
    }
    let size = match required {
        0 if limit > 0 => DEFAULT_BYTES.min(limit / SECTOR * SECTOR),
        0 => DEFAULT_BYTES,
        n => n.div_ceil(SECTOR) * SECTOR,
    };
    if size == 0 || (limit > 0 && size > limit) {
        return Err(DriverError::OutOfRange(format!(
            "no whole number of {SECTOR}-byte sectors fits capacity_range [{required}, {limit}]"
        )));
    }
    Ok(size)
}

/// Whether a volume of `size` bytes answers `range`.
pub fn size_fits(size: u64, range: Option<&proto::CapacityRange>) -> bool {
    let (required, limit) = range.map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
    let size = i64::try_from(size).unwrap_or(i64::MAX);
    size >= required && (limit == 0 || size <= limit)
}

/// Why this driver cannot serve `capability`, if it cannot: it serves one
/// node's volumes (single-node access modes), as ext4 or raw blocks.
pub fn unsupported(capability: &proto::VolumeCapability) -> Option<String> {
    let mode = capability.access_mode.as_ref().map(|m| m.mode);
    match mode.map(Mode::try_from) {
        None | Some(Ok(Mode::Unknown)) => return Some("no access_mode".to_string()),
        Some(Ok(Mode::SingleNodeWriter | Mode::SingleNodeReaderOnly)) => {}
        Some(Ok(other)) => {
            return Some(format!(
                "access mode {} is not served: a loop device is one node's",
                other.as_str_name()
            ))
        }
        Some(Err(_)) => return Some(format!("access mode {} is unknown", mode.unwrap_or(0))),
    }
    match &capability.access_type {
        None => Some("no access_type (block or mount)".to_string()),
        Some(AccessType::Block(_)) => None,
        Some(AccessType::Mount(m)) if m.fs_type.is_empty() || m.fs_type == "ext4" => None,
        Some(AccessType::Mount(m)) => Some(format!(
            "filesystem {:?} is not served: volumes get ext4",
            m.fs_type
        )),
    }
}

/// The access a request's one capability asks for; INVALID_ARGUMENT for
/// none or one this driver does not serve.
pub fn access_of(capability: Option<&proto::VolumeCapability>) -> DriverResult<Access> {
    let capability = capability
        .ok_or_else(|| DriverError::InvalidArgument("volume_capability is missing".into()))?;
    if let Some(why) = unsupported(capability) {
        return Err(DriverError::InvalidArgument(format!(
            "volume_capability: {why}"
        )));
    }
    Ok(match capability.access_type {
        Some(AccessType::Block(_)) => Access::Block,
        _ => Access::Mount,
    })
}

/// The mount flags a mount capability carries (none for block).
pub fn mount_flags(capability: Option<&proto::VolumeCapability>) -> Vec<String> {
    match capability.and_then(|c| c.access_type.as_ref()) {
        Some(AccessType::Mount(m)) => m.mount_flags.clone(),
        _ => Vec::new(),
    }
}

/// CreateVolume's capabilities: at least one, each served.
pub fn check_capabilities(capabilities: &[proto::VolumeCapability]) -> DriverResult<()> {
    if capabilities.is_empty() {
        return Err(DriverError::InvalidArgument(
            "volume_capabilities is empty".into(),
        ));
    }
    for (i, c) in capabilities.iter().enumerate() {
        if let Some(why) = unsupported(c) {
            return Err(DriverError::InvalidArgument(format!(
                "volume_capabilities[{i}]: {why}"
            )));
        }
    }
    Ok(())
}

/// A field the spec requires: INVALID_ARGUMENT when empty.
pub fn required<'a>(field: &str, value: &'a str) -> DriverResult<&'a str> {
    if value.is_empty() {
        Err(DriverError::InvalidArgument(format!("{field} is missing")))
    } else {
        Ok(value)
    }
}

/// The id of the volume named `name`: the same for the same name, so that
/// a repeated CreateVolume (after a restart too) finds its volume.
pub fn volume_id(name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    format!("{ID_PREFIX}{hex}")
}

const ID_PREFIX: &str = "loop-";

/// Whether `text` has the form of an id of [`volume_id`] (a page token is
/// one).
fn is_volume_id(text: &str) -> bool {
    text.strip_prefix(ID_PREFIX).is_some_and(|hex| {
        hex.len() == 16
            && hex
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// One page of `ids` (sorted): at most `max_entries` (0: all) from the
/// first id at or after `token` (empty: the start), and the token of the
/// next page (empty: none). A token is the id the next page starts at, so
/// a volume deleted between pages moves no other one; a token that is no
/// id is ABORTED, as the spec says.
pub fn page<'a>(
    ids: &'a [String],
    max_entries: i32,
    token: &str,
) -> DriverResult<(&'a [String], String)> {
    let Ok(max) = usize::try_from(max_entries) else {
        return Err(DriverError::InvalidArgument(format!(
            "max_entries {max_entries} is negative"
        )));
    };
    let start = match token {
        "" => 0,
        t if is_volume_id(t) => ids.partition_point(|id| id.as_str() < t),
        t => {
            return Err(DriverError::Aborted(format!(
                "starting_token {t:?} is not a token of this driver"
            )))
        }
    };
    let rest = &ids[start..];
    if max == 0 || rest.len() <= max {
        return Ok((rest, String::new()));
    }
    Ok((&rest[..max], rest[max].clone()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use health_csi::proto::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn range(required: i64, limit: i64) -> proto::CapacityRange {
        proto::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }
    }

    #[test]
    fn sizes_round_up_to_sectors_within_the_limit() {
        assert_eq!(volume_size(None).unwrap(), 1 << 30);
        assert_eq!(volume_size(Some(&range(0, 0))).unwrap(), 1 << 30);
        assert_eq!(volume_size(Some(&range(1000, 0))).unwrap(), 1024);
        assert_eq!(
            volume_size(Some(&range(64 << 20, 64 << 20))).unwrap(),
            64 << 20
        );
        assert_eq!(volume_size(Some(&range(0, 1 << 20))).unwrap(), 1 << 20);
        assert_eq!(volume_size(Some(&range(0, 5000))).unwrap(), 4608);
        let e = volume_size(Some(&range(1000, 1000))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        assert_eq!(
            e.to_string(),
            "no whole number of 512-byte sectors fits capacity_range [1000, 1000]"
        );
        let e = volume_size(Some(&range(2048, 1024))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "capacity_range: limit_bytes 1024 is below required_bytes 2048"
        );
        assert_eq!(
            volume_size(Some(&range(-1, 0))).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        assert!(size_fits(1024, Some(&range(1000, 0))));
        assert!(!size_fits(1024, Some(&range(2048, 0))));
        assert!(!size_fits(4096, Some(&range(0, 2048))));
        assert!(size_fits(4096, None));
    }

    fn capability(mode: Mode, access: AccessType) -> proto::VolumeCapability {
        proto::VolumeCapability {
            access_type: Some(access),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    fn mount(fs_type: &str) -> AccessType {
        AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            mount_flags: vec!["noatime".into()],
        })
    }

    #[test]
    fn single_node_ext4_or_block_capabilities_are_served() {
        let block = AccessType::Block(BlockVolume {});
        assert_eq!(
            access_of(Some(&capability(Mode::SingleNodeWriter, block.clone()))).unwrap(),
            Access::Block
        );
        let ro = capability(Mode::SingleNodeReaderOnly, mount("ext4"));
        assert_eq!(access_of(Some(&ro)).unwrap(), Access::Mount);
        assert_eq!(mount_flags(Some(&ro)), vec!["noatime".to_string()]);
        assert_eq!(
            unsupported(&capability(Mode::MultiNodeMultiWriter, block)),
            Some(
                "access mode MULTI_NODE_MULTI_WRITER is not served: a loop device is one node's"
                    .into()
            )
        );
        assert_eq!(
            unsupported(&capability(Mode::SingleNodeWriter, mount("xfs"))),
            Some("filesystem \"xfs\" is not served: volumes get ext4".into())
        );
        let no_mode = proto::VolumeCapability {
            access_type: Some(mount("")),
            access_mode: None,
        };
        assert_eq!(unsupported(&no_mode), Some("no access_mode".into()));
        let e = access_of(None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.to_string(), "volume_capability is missing");
        assert_eq!(
            check_capabilities(&[]).unwrap_err().to_string(),
            "volume_capabilities is empty"
        );
        assert_eq!(
            check_capabilities(&[ro, no_mode]).unwrap_err().to_string(),
            "volume_capabilities[1]: no access_mode"
        );
    }

    #[test]
    fn ids_are_the_names_digest() {
        assert_eq!(volume_id("pvc-data"), volume_id("pvc-data"));
        assert_ne!(volume_id("pvc-data"), volume_id("pvc-date"));
        let id = volume_id("");
        // sha256("") begins e3b0c44298fc1c14.
        assert_eq!(id, "loop-e3b0c44298fc1c14");
        assert!(is_volume_id(&id));
        assert!(!is_volume_id("loop-E3B0C44298FC1C14"));
        assert!(!is_volume_id("invalid-token"));
    }

    #[test]
    fn pages_start_at_their_token_and_survive_deletions() {
        let ids: Vec<String> = [
            "loop-0000000000000001",
            "loop-0000000000000002",
            "loop-0000000000000003",
        ]
        .map(String::from)
        .to_vec();
        let (first, next) = page(&ids, 2, "").unwrap();
        assert_eq!(first, &ids[..2]);
        assert_eq!(next, "loop-0000000000000003");
        let (second, last) = page(&ids, 2, &next).unwrap();
        assert_eq!(second, &ids[2..]);
        assert_eq!(last, "");
        // The token's own volume was deleted: the page starts after it.
        let fewer = vec![ids[0].clone(), ids[1].clone()];
        let (after, end) = page(&fewer, 2, &next).unwrap();
        assert!(after.is_empty());
        assert_eq!(end, "");
        assert_eq!(page(&ids, 0, "").unwrap(), (&ids[..], String::new()));
        let e = page(&ids, 0, "invalid-token").unwrap_err();
        assert_eq!(e.code(), tonic::Code::Aborted);
        assert_eq!(
            e.to_string(),
            "starting_token \"invalid-token\" is not a token of this driver"
        );
        assert_eq!(
            page(&ids, -1, "").unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
