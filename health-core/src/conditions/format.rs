//! Formatting helpers shared with `checks`: errno names, times, durations,
//! sizes as the conditions' messages and JSON print them.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serializer;

/// `EIO`, or `errno 4242` for numbers the platform does not name.
pub fn errno_name(errno: i32) -> String {
    match nix::errno::Errno::from_raw(errno) {
        nix::errno::Errno::UnknownErrno => format!("errno {errno}"),
        e => format!("{e:?}"),
    }
}

/// `s` cut to at most `max` bytes on a char boundary, marked with "..."
/// when cut: the one bound on free text the schemas and APIs limit.
pub fn clip_to(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max.saturating_sub(3);
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// RFC 3339 in UTC, to the second.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("@{secs}"))
}

pub(super) fn serialize_time<S: Serializer>(t: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&rfc3339(*t))
}

/// `45s`, `2m13s`, `3h05m`, `750ms`.
pub fn human_duration(d: Duration) -> String {
    let secs = d.as_secs();
    if secs == 0 {
        return format!("{}ms", d.as_millis());
    }
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// `12.3 MiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut v = b as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[unit])
    }
}

pub(super) fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formatting_helpers() {
        assert_eq!(errno_name(libc::EIO), "EIO");
        assert_eq!(errno_name(libc::EROFS), "EROFS");
        assert_eq!(errno_name(4242), "errno 4242");
        assert_eq!(human_duration(Duration::from_millis(750)), "750ms");
        assert_eq!(human_duration(Duration::from_secs(133)), "2m13s");
        assert_eq!(human_duration(Duration::from_secs(3 * 3600 + 300)), "3h05m");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
    }
}
