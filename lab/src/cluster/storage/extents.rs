//! From what a user names (a file's or a volume's bytes) to byte ranges of
//! the disk image, which is what the faultdisk server's rules match; and
//! the small parsers of `cluster fault add`'s arguments.

use anyhow::bail;
use health_tests::fs::Extent;

/// A half-open byte range `[start, end)`.
pub(super) type Range = (u64, u64);

/// The image ranges that hold the bytes `window` (all of them with `None`)
/// of a file with `extents` on a filesystem whose device starts `base`
/// bytes into the image. Extents without a location (delayed, inline) are
/// skipped; touching ranges are merged.
pub(super) fn file_ranges(extents: &[Extent], base: u64, window: Option<Range>) -> Vec<Range> {
    let mut out: Vec<Range> = Vec::new();
    for e in extents.iter().filter(|e| e.is_mapped() && e.len > 0) {
        let (lo, hi) = match window {
            Some((start, end)) => (e.logical.max(start), (e.logical + e.len).min(end)),
            None => (e.logical, e.logical + e.len),
        };
        if lo >= hi {
            continue;
        }
        let start = base + e.physical + (lo - e.logical);
        out.push((start, start + (hi - lo)));
    }
    out.sort_unstable();
    let mut merged: Vec<Range> = Vec::with_capacity(out.len());
    for r in out {
        match merged.last_mut() {
            Some(last) if last.1 >= r.0 => last.1 = last.1.max(r.1),
            _ => merged.push(r),
        }
    }
    merged
}

/// `window` (in the region's own bytes) of a region of the image that starts
/// at `offset` and is `bytes` long, as image bytes.
pub(super) fn region_range(
    offset: u64,
    bytes: u64,
    window: Option<Range>,
) -> anyhow::Result<Range> {
    let (start, end) = window.unwrap_or((0, bytes));
    if start >= end || end > bytes {
        bail!("bytes [{start}, {end}) are not inside the target's {bytes} bytes");
    }
    Ok((offset + start, offset + end))
}

/// `--offset`/`--len` as a window; `--len` without `--offset` starts at 0,
/// `--offset` without `--len` runs to the end.
pub(super) fn window(offset: Option<u64>, len: Option<u64>) -> anyhow::Result<Option<Range>> {
    match (offset, len) {
        (None, None) => Ok(None),
        (_, Some(0)) => bail!("--len 0 names no byte"),
        (offset, len) => {
            let start = offset.unwrap_or(0);
            Ok(Some((
                start,
                len.map_or(u64::MAX, |l| start.saturating_add(l)),
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn extent(logical: u64, physical: u64, len: u64, flags: u32) -> Extent {
        Extent {
            logical,
            physical,
            len,
            flags,
        }
    }

    #[test]
    fn extents_become_image_ranges_shifted_by_the_device_offset() {
        let extents = [
            extent(0, 8 << 20, 4096, 0),
            // Physically right after the first: one range.
            extent(4096, (8 << 20) + 4096, 4096, 0),
            extent(
                8192,
                1 << 20,
                8192,
                Extent::FLAG_UNWRITTEN | Extent::FLAG_LAST,
            ),
            // No location yet: skipped.
            extent(16384, 0, 4096, Extent::FLAG_DELALLOC),
        ];
        let base = 192 << 20;
        assert_eq!(
            file_ranges(&extents, base, None),
            vec![
                (base + (1 << 20), base + (1 << 20) + 8192),
                (base + (8 << 20), base + (8 << 20) + 8192),
            ]
        );
    }

    #[test]
    fn a_window_clips_extents_in_the_file_bytes() {
        let extents = [extent(0, 1 << 20, 8192, 0), extent(8192, 4 << 20, 8192, 0)];
        // Bytes 4096..12288 of the file: the second half of the first extent
        // and the first half of the second.
        assert_eq!(
            file_ranges(&extents, 0, Some((4096, 12288))),
            vec![
                ((1 << 20) + 4096, (1 << 20) + 8192),
                (4 << 20, (4 << 20) + 4096)
            ]
        );
        assert_eq!(file_ranges(&extents, 0, Some((1 << 30, u64::MAX))), vec![]);
    }

    #[test]
    fn region_windows_stay_inside_the_region() {
        assert_eq!(region_range(100, 50, None).unwrap(), (100, 150));
        assert_eq!(region_range(100, 50, Some((10, 20))).unwrap(), (110, 120));
        assert_eq!(
            region_range(100, 50, Some((10, 60)))
                .unwrap_err()
                .to_string(),
            "bytes [10, 60) are not inside the target's 50 bytes"
        );
    }

    #[test]
    fn offset_and_len_make_a_window() {
        assert_eq!(window(None, None).unwrap(), None);
        assert_eq!(window(Some(10), Some(5)).unwrap(), Some((10, 15)));
        assert_eq!(window(None, Some(5)).unwrap(), Some((0, 5)));
        assert_eq!(window(Some(10), None).unwrap(), Some((10, u64::MAX)));
        assert!(window(Some(1), Some(0)).is_err());
    }
}
