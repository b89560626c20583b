//! The running kernel's release, for the few decisions that depend on the
//! version rather than on a feature the kernel can be asked about.

use std::path::Path;

/// The running kernel's release (`uname -r`), from
/// `<proc>/sys/kernel/osrelease`.
pub fn running_release(proc_root: &Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(proc_root.join("sys/kernel/osrelease"))?;
    Ok(text.trim().to_string())
}

/// `(major, minor)` of a release such as `5.10.0-34-amd64`.
pub fn parse_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::parse_version;

    #[test]
    fn versions_of_distribution_releases() {
        assert_eq!(parse_version("5.10.0-34-amd64"), Some((5, 10)));
        assert_eq!(parse_version("6.18.44-fc-v657"), Some((6, 18)));
        assert_eq!(parse_version("4.18.0-553.el8_10.x86_64"), Some((4, 18)));
        assert_eq!(parse_version("weird"), None);
    }
}
