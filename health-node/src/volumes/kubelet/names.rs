//! The names kubelet gives the directories the walk reads: pod UIDs, pod
//! volume directory names (a PV name, or a pod volume name for inline
//! volumes), and the names taken from `vol_data.json` that become path
//! components (driver, PV). Anything else is not kubelet's and is skipped:
//! a name with a newline or a control character would otherwise reach the
//! logs and the `watch` lines as it is, and a `/` or `..` would leave the
//! tree.
//!
//! kubelet's names are all short ASCII: UIDs are UUIDs, PV and pod volume
//! names DNS subdomains or labels, CSI driver names DNS-like. Allowed here:
//! ASCII letters, digits, `-`, `.`, `_`, `~` (kubelet escapes `/` in plugin
//! names as `~`), at most 253 bytes, not `.` or `..`.

/// Longest name kubelet makes (a DNS subdomain).
pub const MAX_NAME: usize = 253;

/// Why a directory name is not one kubelet makes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("empty name")]
    Empty,
    #[error("name longer than {MAX_NAME} bytes")]
    TooLong,
    #[error("`.` or `..`")]
    Dots,
    #[error("unexpected byte {0:#04x} in the name")]
    Byte(u8),
}

/// Whether `name` is a name kubelet could have made (see the module docs).
pub fn check_name(name: &[u8]) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME {
        return Err(NameError::TooLong);
    }
    if name == b"." || name == b".." {
        return Err(NameError::Dots);
    }
    match name
        .iter()
        .find(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')))
    {
        Some(b) => Err(NameError::Byte(*b)),
        None => Ok(()),
    }
}

/// Whether `name` (a staging directory of newer kubelets) is a lowercase
/// hex SHA-256, as kubelet names it. (The agent computes the hash it looks
/// for; the fuzz target and tests check names with this.)
#[cfg(any(test, feature = "fuzzing"))]
pub fn is_staging_hash(name: &[u8]) -> bool {
    name.len() == 64 && name.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn kubelets_names_pass_and_others_do_not() {
        for ok in [
            "0a0a0a0a-0000-4000-8000-00000000000a",
            "pvc-3f1c2a9e-8d2b-4c55-9f0e-1a2b3c4d5e6f",
            "kubernetes.io~csi",
            "disk.csi.example.com",
            "local_pv-1",
        ] {
            assert_eq!(check_name(ok.as_bytes()), Ok(()), "{ok}");
        }
        assert_eq!(check_name(b""), Err(NameError::Empty));
        assert_eq!(check_name(b".."), Err(NameError::Dots));
        assert_eq!(check_name(b"a\nb"), Err(NameError::Byte(b'\n')));
        assert_eq!(check_name(b"a/b"), Err(NameError::Byte(b'/')));
        assert_eq!(check_name(&[b'a'; 254]), Err(NameError::TooLong));
        assert_eq!(check_name(b"caf\xc3\xa9"), Err(NameError::Byte(0xc3)));
        assert_eq!(
            NameError::Byte(b'\n').to_string(),
            "unexpected byte 0x0a in the name"
        );
    }

    proptest! {
        /// A name that passes is a single path component of printable
        /// ASCII: it can neither leave the tree nor forge a log line.
        #[test]
        fn a_passing_name_is_a_safe_component(name in proptest::collection::vec(any::<u8>(), 0..300)) {
            if check_name(&name).is_ok() {
                let s = std::str::from_utf8(&name).unwrap();
                prop_assert!(!s.is_empty() && s.len() <= MAX_NAME);
                prop_assert!(s != "." && s != "..");
                prop_assert!(s.bytes().all(|b| b.is_ascii_graphic() && b != b'/'));
                let path = std::path::Path::new("/root").join(s);
                prop_assert_eq!(path.parent(), Some(std::path::Path::new("/root")));
            }
        }

        /// Every name kubelet makes passes: UUIDs, DNS subdomains, escaped
        /// plugin names.
        #[test]
        fn kubelet_made_names_pass(
            uid in "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}",
            pv in "[a-z0-9]([a-z0-9.-]{0,61}[a-z0-9])?",
            vendor in "[a-z0-9]{1,20}(\\.[a-z0-9]{1,20}){0,3}",
            plugin in "[a-z0-9-]{1,30}",
        ) {
            prop_assert_eq!(check_name(uid.as_bytes()), Ok(()));
            prop_assert_eq!(check_name(pv.as_bytes()), Ok(()));
            let escaped = format!("{vendor}~{plugin}");
            prop_assert_eq!(check_name(escaped.as_bytes()), Ok(()));
        }

        #[test]
        fn sha256_hex_is_a_staging_hash(bytes in proptest::array::uniform32(any::<u8>())) {
            let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
            prop_assert!(is_staging_hash(hex.as_bytes()));
            prop_assert!(!is_staging_hash(hex.to_uppercase().as_bytes()) || !hex.bytes().any(|b| b.is_ascii_alphabetic()));
            prop_assert!(!is_staging_hash(&hex.as_bytes()[1..]));
        }
    }
}
