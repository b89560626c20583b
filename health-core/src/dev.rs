//! Device numbers as the agent passes them around.

use std::fmt;
use std::str::FromStr;

use health_common::kdev;

/// A device number (major, minor).
///
/// The kernel programs carry the kernel-internal encoding
/// (`major << 20 | minor`); userspace `stat` returns glibc's encoding. This
/// type is the one place both are converted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(into = "String")]
pub struct Dev {
    pub major: u32,
    pub minor: u32,
}

impl Dev {
    pub const fn new(major: u32, minor: u32) -> Self {
        Self { major, minor }
    }

    /// From the kernel-internal encoding used in tracepoints.
    pub const fn from_kernel(dev: u32) -> Self {
        Self::new(kdev::major(dev), kdev::minor(dev))
    }

    /// To the kernel-internal encoding used in BPF map keys.
    pub const fn to_kernel(self) -> u32 {
        kdev::make(self.major, self.minor)
    }

    /// From a `st_dev` / `st_rdev` as returned by `stat(2)`.
    pub fn from_stat(dev: libc::dev_t) -> Self {
        Self::new(libc::major(dev), libc::minor(dev))
    }

    /// Anonymous devices (major 0) back tmpfs, overlay, btrfs subvolumes and
    /// the kernel's block-device pseudo filesystem.
    pub const fn is_anonymous(self) -> bool {
        self.major == 0
    }
}

impl fmt::Display for Dev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

impl From<Dev> for String {
    fn from(d: Dev) -> String {
        d.to_string()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("invalid device number {0:?}: expected MAJOR:MINOR")]
pub struct ParseDevError(pub String);

impl FromStr for Dev {
    type Err = ParseDevError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseDevError(s.to_string());
        let (maj, min) = s.trim().split_once(':').ok_or_else(err)?;
        Ok(Dev::new(
            maj.parse().map_err(|_| err())?,
            min.parse().map_err(|_| err())?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodings_round_trip() {
        let d = Dev::new(259, 1);
        assert_eq!(Dev::from_kernel(d.to_kernel()), d);
        assert_eq!(d.to_kernel(), (259 << 20) | 1);
        assert_eq!(Dev::from_stat(libc::makedev(259, 1)), d);
        assert_eq!(d.to_string(), "259:1");
        assert_eq!("7:3".parse::<Dev>(), Ok(Dev::new(7, 3)));
        assert_eq!("7".parse::<Dev>(), Err(ParseDevError("7".into())));
        assert_eq!(serde_json::to_string(&Dev::new(8, 0)).unwrap(), "\"8:0\"");
    }
}
