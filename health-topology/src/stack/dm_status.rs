//! The status lines of the device-mapper targets whose health the agent
//! reads: `multipath` (each path active or failed) and `thin-pool` (data and
//! metadata usage, mode). The thin pool's line is documented in the
//! kernel's `Documentation/admin-guide/device-mapper/thin-provisioning.rst`;
//! the multipath line only by `drivers/md/dm-mpath.c`'s status function:
//!
//! ```text
//! <#features> <features...> <#handler args> <handler args...>
//! <#groups> <next group> then per group:
//!   <A|E|D> <#selector args> <selector args...> <#paths> <#per-path selector args>
//!   then per path: <maj:min> <A|F> <fail count> <per-path selector args...>
//! ```
//!
//! In the status (not the table) the two features are whether I/O is being
//! queued now and how many path-group initialisations ran. Both parsers
//! reject what does not fit instead of guessing: a layout this code does not
//! know is reported as unreadable, never as healthy.

use health_core::dev::Dev;

/// One path of a multipath device, as dm-multipath sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultipathPath {
    pub dev: Dev,
    /// `A`: usable; `F`: failed by dm-multipath (after an I/O error on it or
    /// a `fail_path` message).
    pub active: bool,
    pub fail_count: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultipathStatus {
    /// dm-multipath is holding I/O back now (no usable path and
    /// `queue_if_no_path`, or a path group being initialised).
    pub queueing: bool,
    pub paths: Vec<MultipathPath>,
}

/// Parses a `multipath` target's status parameters.
pub fn parse_multipath(params: &str) -> Result<MultipathStatus, String> {
    let mut t = Tokens::new(params);
    let features = t.count("feature count")?;
    let queueing = if features >= 1 {
        t.next("queueing flag")? == "1"
    } else {
        false
    };
    t.skip(features.saturating_sub(1), "features")?;
    let handler = t.count("handler argument count")?;
    t.skip(handler, "handler arguments")?;
    let groups = t.count("path group count")?;
    t.next("next path group")?;
    let mut paths = Vec::new();
    for _ in 0..groups {
        let state = t.next("path group state")?;
        if !matches!(state, "A" | "E" | "D") {
            return Err(format!("path group state {state:?} is not A, E or D"));
        }
        let selector = t.count("selector argument count")?;
        t.skip(selector, "selector arguments")?;
        let n = t.count("path count")?;
        let per_path = t.count("per-path argument count")?;
        for _ in 0..n {
            let dev_text = t.next("path device")?;
            let dev: Dev = dev_text
                .parse()
                .map_err(|_| format!("path device {dev_text:?} is not MAJ:MIN"))?;
            let active = match t.next("path state")? {
                "A" => true,
                "F" => false,
                other => return Err(format!("path state {other:?} is not A or F")),
            };
            let fail_count = t.number("fail count")?;
            t.skip(per_path, "per-path arguments")?;
            paths.push(MultipathPath {
                dev,
                active,
                fail_count,
            });
        }
    }
    Ok(MultipathStatus { queueing, paths })
}

/// What a thin pool is doing, from the mode word of its status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolMode {
    ReadWrite,
    /// `out_of_data_space`: writes that need a new block queue (for up to
    /// `no_space_timeout`) or fail at once with `error_if_no_space`.
    OutOfDataSpace,
    /// `ro`: the pool stopped writing, after a metadata error or when its
    /// metadata device is full.
    ReadOnly,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ThinPoolStatus {
    Working(PoolUsage),
    /// `Fail`: the pool failed; every I/O errors.
    Failed,
    /// `Error`: the kernel could not read the pool's status.
    Error,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    pub metadata_used: u64,
    pub metadata_total: u64,
    pub data_used: u64,
    pub data_total: u64,
    pub mode: PoolMode,
    /// `error_if_no_space`: a full pool fails writes instead of queueing them.
    pub error_if_no_space: bool,
    /// The metadata needs `thin_check` before the pool may be written again.
    pub needs_check: bool,
}

impl PoolUsage {
    pub fn data_percent(&self) -> f64 {
        percent(self.data_used, self.data_total)
    }

    pub fn metadata_percent(&self) -> f64 {
        percent(self.metadata_used, self.metadata_total)
    }
}

fn percent(used: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        used as f64 * 100.0 / total as f64
    }
}

/// Parses a `thin-pool` target's status parameters:
/// `<transaction id> <used>/<total metadata blocks> <used>/<total data
/// blocks> <held root> rw|ro|out_of_data_space [no_]discard_passdown
/// error|queue_if_no_space needs_check|- [<metadata low watermark>]`, or
/// `Fail`, or `Error`. The words after the mode came in over the years
/// (Linux 3.x to 4.x): missing ones take the kernel's defaults.
pub fn parse_thin_pool(params: &str) -> Result<ThinPoolStatus, String> {
    let mut t = Tokens::new(params);
    match t.next("transaction id")? {
        "Fail" => return Ok(ThinPoolStatus::Failed),
        "Error" => return Ok(ThinPoolStatus::Error),
        id if id.parse::<u64>().is_err() => {
            return Err(format!("transaction id {id:?} is not a number"))
        }
        _ => {}
    }
    let (metadata_used, metadata_total) = ratio(t.next("metadata usage")?)?;
    let (data_used, data_total) = ratio(t.next("data usage")?)?;
    t.next("held metadata root")?;
    let mode = match t.next("mode")? {
        "rw" => PoolMode::ReadWrite,
        "ro" => PoolMode::ReadOnly,
        "out_of_data_space" => PoolMode::OutOfDataSpace,
        other => return Err(format!("pool mode {other:?} is unknown")),
    };
    let mut error_if_no_space = false;
    let mut needs_check = false;
    for word in t.rest() {
        match word {
            "error_if_no_space" => error_if_no_space = true,
            "needs_check" => needs_check = true,
            _ => {}
        }
    }
    Ok(ThinPoolStatus::Working(PoolUsage {
        metadata_used,
        metadata_total,
        data_used,
        data_total,
        mode,
        error_if_no_space,
        needs_check,
    }))
}

fn ratio(word: &str) -> Result<(u64, u64), String> {
    let (a, b) = word
        .split_once('/')
        .ok_or_else(|| format!("{word:?} is not used/total"))?;
    match (a.parse(), b.parse()) {
        (Ok(a), Ok(b)) => Ok((a, b)),
        _ => Err(format!("{word:?} is not used/total")),
    }
}

/// Whitespace-separated words with the errors the parsers report.
struct Tokens<'a> {
    it: std::str::SplitAsciiWhitespace<'a>,
}

/// No real device has this many paths, groups or arguments; a count above
/// it is a layout this parser misreads.
const MAX_COUNT: usize = 4096;

impl<'a> Tokens<'a> {
    fn new(s: &'a str) -> Self {
        Tokens {
            it: s.split_ascii_whitespace(),
        }
    }

    fn next(&mut self, what: &str) -> Result<&'a str, String> {
        self.it
            .next()
            .ok_or_else(|| format!("ends before the {what}"))
    }

    fn number<T: std::str::FromStr>(&mut self, what: &str) -> Result<T, String> {
        let w = self.next(what)?;
        w.parse()
            .map_err(|_| format!("{what} {w:?} is not a number"))
    }

    fn count(&mut self, what: &str) -> Result<usize, String> {
        let n: usize = self.number(what)?;
        if n > MAX_COUNT {
            return Err(format!("{what} {n} is implausible"));
        }
        Ok(n)
    }

    fn skip(&mut self, n: usize, what: &str) -> Result<(), String> {
        for _ in 0..n {
            self.next(what)?;
        }
        Ok(())
    }

    fn rest(self) -> std::str::SplitAsciiWhitespace<'a> {
        self.it
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multipath_status_gives_each_path_and_its_state() {
        // dmsetup status of two round-robin paths, the second failed.
        let s = parse_multipath("2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:16 F 3").unwrap();
        assert!(!s.queueing);
        assert_eq!(
            s.paths,
            [
                MultipathPath {
                    dev: Dev::new(8, 0),
                    active: true,
                    fail_count: 0
                },
                MultipathPath {
                    dev: Dev::new(8, 16),
                    active: false,
                    fail_count: 3
                },
            ]
        );
    }

    #[test]
    fn multipath_groups_handlers_and_selector_arguments_are_skipped() {
        // Two groups, an ALUA handler with one argument, service-time's two
        // per-path values, and I/O being queued now.
        let s = parse_multipath("2 1 0 1 alua 2 1 E 0 1 2 8:32 F 1 0 0 A 0 1 2 8:48 A 0 1 4096")
            .unwrap();
        assert!(s.queueing);
        let devs: Vec<(Dev, bool)> = s.paths.iter().map(|p| (p.dev, p.active)).collect();
        assert_eq!(devs, [(Dev::new(8, 32), false), (Dev::new(8, 48), true)]);
    }

    #[test]
    fn multipath_layouts_that_do_not_fit_are_errors() {
        for bad in [
            "",
            "2 0 0 0 1 1 A 0 2 0 8:0 A 0",
            "2 0 0 0 1 1 Q 0 1 0 8:0 A 0",
            "2 0 0 0 1 1 A 0 1 0 sda A 0",
            "2 0 0 0 1 1 A 0 1 0 8:0 X 0",
            "99999 0",
        ] {
            assert!(parse_multipath(bad).is_err(), "{bad:?}");
        }
        // No paths at all is a valid (empty) table.
        assert_eq!(parse_multipath("2 0 0 0 0 0").unwrap().paths, []);
    }

    #[test]
    fn thin_pool_status_gives_usage_and_mode() {
        let s =
            parse_thin_pool("1 91/1024 460/512 - rw no_discard_passdown queue_if_no_space - 1024")
                .unwrap();
        let ThinPoolStatus::Working(u) = s else {
            panic!("{s:?}")
        };
        assert_eq!((u.metadata_used, u.metadata_total), (91, 1024));
        assert_eq!((u.data_used, u.data_total), (460, 512));
        assert_eq!(u.mode, PoolMode::ReadWrite);
        assert!(!u.error_if_no_space && !u.needs_check);
        assert_eq!(u.data_percent(), 89.84375);
        let full = parse_thin_pool(
            "0 10/1024 512/512 - out_of_data_space discard_passdown error_if_no_space -",
        )
        .unwrap();
        let ThinPoolStatus::Working(f) = full else {
            panic!("{full:?}")
        };
        assert_eq!(f.mode, PoolMode::OutOfDataSpace);
        assert!(f.error_if_no_space);
        // An older kernel's shorter line; a read-only pool needing a check.
        let ro = parse_thin_pool("7 1024/1024 3/512 - ro needs_check").unwrap();
        let ThinPoolStatus::Working(r) = ro else {
            panic!("{ro:?}")
        };
        assert_eq!(r.mode, PoolMode::ReadOnly);
        assert!(r.needs_check);
        assert_eq!(parse_thin_pool("Fail").unwrap(), ThinPoolStatus::Failed);
        assert_eq!(parse_thin_pool("Error").unwrap(), ThinPoolStatus::Error);
    }

    #[test]
    fn thin_pool_lines_that_do_not_fit_are_errors() {
        for bad in [
            "",
            "x 1/2 3/4 - rw",
            "1 1-2 3/4 - rw",
            "1 1/2 3/4 - sleepy",
            "1 1/2",
        ] {
            assert!(parse_thin_pool(bad).is_err(), "{bad:?}");
        }
    }
}
