//! kubelet's `vol_data.json`: the driver, volume handle and PV name it
//! recorded for a CSI volume.

use std::fs;
use std::io::Read;
use std::path::Path;

use serde::Deserialize;

use super::dir::Tree;
use super::{unexpected, Skip};

pub(super) const VOL_DATA: &str = "vol_data.json";
/// kubelet writes a handful of short strings; anything bigger is not ours.
pub(crate) const VOL_DATA_MAX_BYTES: u64 = 64 * 1024;

/// The keys kubelet writes into `vol_data.json`.
#[derive(Debug, Deserialize)]
pub(crate) struct VolData {
    #[serde(rename = "driverName")]
    pub(crate) driver_name: Option<String>,
    #[serde(rename = "volumeHandle")]
    pub(crate) volume_handle: Option<String>,
    #[serde(rename = "specVolID")]
    pub(crate) spec_vol_id: Option<String>,
    #[serde(rename = "nodeName")]
    pub(crate) node_name: Option<String>,
    #[serde(rename = "volumeLifecycleMode")]
    pub(crate) lifecycle_mode: Option<String>,
}

pub(super) fn required(data: &VolData, path: &Path) -> Result<(String, String), Skip> {
    match (&data.driver_name, &data.volume_handle) {
        (Some(d), Some(h)) if !d.is_empty() && !h.is_empty() => Ok((d.clone(), h.clone())),
        _ => Err(unexpected(path, "driverName or volumeHandle missing")),
    }
}

/// Reads `vol_data.json` at `path` (below the kubelet root): opened once,
/// without following a link and without waiting on a FIFO; the open file
/// must be a regular file of at most [`VOL_DATA_MAX_BYTES`], and no more
/// than that is read whatever it claims.
pub(super) fn read_vol_data(tree: &Tree, path: &Path) -> Result<VolData, Skip> {
    let io_err = |error| Skip::Io {
        path: path.to_path_buf(),
        error,
    };
    let file = tree.open_file(path)?;
    let meta = file.metadata().map_err(io_err)?;
    if !meta.file_type().is_file() {
        return Err(unexpected(
            path,
            format!("not a regular file ({})", kind_of(&meta)),
        ));
    }
    if meta.len() > VOL_DATA_MAX_BYTES {
        return Err(unexpected(
            path,
            format!(
                "{} bytes, more than kubelet ever writes ({VOL_DATA_MAX_BYTES}): not read",
                meta.len()
            ),
        ));
    }
    let mut bytes = Vec::new();
    file.take(VOL_DATA_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(io_err)?;
    if bytes.len() as u64 > VOL_DATA_MAX_BYTES {
        return Err(unexpected(
            path,
            "grew past the size bound while read: not used",
        ));
    }
    parse_vol_data(&bytes).map_err(|error| Skip::Json {
        path: path.to_path_buf(),
        error,
    })
}

/// Parses the bytes of a `vol_data.json` (invalid UTF-8 is a JSON error).
pub(crate) fn parse_vol_data(bytes: &[u8]) -> Result<VolData, serde_json::Error> {
    serde_json::from_slice(bytes)
}

fn kind_of(meta: &fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_char_device() {
        "a character device"
    } else {
        "not a file"
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use proptest::prelude::*;

    use super::*;

    fn tree() -> (tempfile::TempDir, Tree) {
        let tmp = tempfile::tempdir().unwrap();
        let tree = Tree::open(tmp.path()).unwrap();
        (tmp, tree)
    }

    fn refusal(tree: &Tree, path: &Path) -> String {
        read_vol_data(tree, path).unwrap_err().to_string()
    }

    #[test]
    fn hostile_files_are_refused_on_the_open_file() {
        let (tmp, tree) = tree();
        let dir = tmp.path();
        let good = dir.join("good.json");
        fs::write(&good, r#"{"driverName":"d","volumeHandle":"h"}"#).unwrap();
        let data = read_vol_data(&tree, &good).unwrap();
        assert_eq!(data.driver_name.as_deref(), Some("d"));

        // A link to a host file is not followed (its content never read).
        let link = dir.join("link.json");
        symlink("/etc/shadow", &link).unwrap();
        assert_eq!(
            refusal(&tree, &link),
            format!("{}: a symbolic link (not followed)", link.display())
        );
        // A link in a directory component neither.
        symlink("/etc", dir.join("etc")).unwrap();
        let via = dir.join("etc/shadow");
        assert_eq!(
            refusal(&tree, &via),
            format!(
                "{}: not a directory (or a link to one: not followed)",
                dir.join("etc").display()
            )
        );
        // A FIFO: the open does not wait for a writer, the file is refused.
        let fifo = dir.join("fifo.json");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(
            refusal(&tree, &fifo),
            format!("{}: not a regular file (a FIFO)", fifo.display())
        );
        // A 1 TB sparse file is refused by its size, not read.
        let huge = dir.join("huge.json");
        fs::File::create(&huge).unwrap().set_len(1 << 40).unwrap();
        assert_eq!(
            refusal(&tree, &huge),
            format!(
                "{}: 1099511627776 bytes, more than kubelet ever writes (65536): not read",
                huge.display()
            )
        );
        // A unix socket cannot be opened at all.
        let sock = dir.join("sock.json");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert_eq!(
            refusal(&tree, &sock),
            format!(
                "{}: a socket or a device without a driver (not opened)",
                sock.display()
            )
        );
        // Paths outside the tree or climbing out of it are refused unopened.
        assert_eq!(
            refusal(&tree, Path::new("/etc/shadow")),
            "/etc/shadow: outside the kubelet root"
        );
        let climb = dir.join("../x");
        assert_eq!(
            refusal(&tree, &climb),
            format!(
                "{}: not a plain path below the kubelet root",
                climb.display()
            )
        );
    }

    proptest! {
        /// Any bytes: a value or an error, never a panic.
        #[test]
        fn parsing_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = parse_vol_data(&bytes);
        }

        /// A document cut short anywhere (a torn write) is an error, never
        /// a volume with half its fields.
        #[test]
        fn a_torn_document_is_an_error(cut in 0usize..80) {
            let doc = br#"{"driverName":"disk.csi.example.com","volumeHandle":"vol-1"}"#;
            let cut = cut.min(doc.len() - 1);
            prop_assert!(parse_vol_data(&doc[..cut]).is_err());
        }

        /// Whatever strings kubelet (or anyone) wrote, they come back
        /// exactly, and `required` accepts exactly the non-empty pairs.
        #[test]
        fn fields_round_trip(
            driver in proptest::option::of(".{0,40}"),
            handle in proptest::option::of(".{0,40}"),
            pv in proptest::option::of("[a-z0-9.-]{0,40}"),
            mode in proptest::option::of(prop_oneof![Just("Persistent".to_string()), Just("Ephemeral".to_string()), ".{0,12}"]),
        ) {
            let json = serde_json::json!({
                "driverName": driver,
                "volumeHandle": handle,
                "specVolID": pv,
                "volumeLifecycleMode": mode,
                "attachmentID": "csi-x",
            });
            let d = parse_vol_data(json.to_string().as_bytes()).unwrap();
            prop_assert_eq!(&d.driver_name, &driver);
            prop_assert_eq!(&d.volume_handle, &handle);
            prop_assert_eq!(&d.spec_vol_id, &pv);
            prop_assert_eq!(&d.lifecycle_mode, &mode);
            let ok = matches!((&driver, &handle), (Some(a), Some(b)) if !a.is_empty() && !b.is_empty());
            prop_assert_eq!(required(&d, Path::new("/v")).is_ok(), ok);
        }
    }
}
