//! What runs where: the kernels of `--kernel` and the suites of
//! `--tests`, each restricted to some kernels or not, and the steps each
//! kernel's guests take.

use anyhow::bail;

use super::kernels::Series;
use super::script::Step;
use crate::util::say;

#[derive(Clone, Copy, Debug)]
pub(super) enum Target {
    Host,
    Debian(Series),
}

pub(super) fn parse_kernel(s: &str) -> Result<Target, String> {
    use clap::ValueEnum;
    if s == "host" {
        return Ok(Target::Host);
    }
    Series::from_str(s, false)
        .map(Target::Debian)
        .map_err(|_| format!("unknown kernel {s:?}: expected 5.10, 6.1, 6.12 or host"))
}

/// One entry of `--tests`: a suite, and the kernels it runs on.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Suite {
    pub(super) name: String,
    /// `None`: every kernel given.
    pub(super) only: Option<Vec<Series>>,
}

impl Suite {
    pub(super) fn runs_on(&self, series: Series) -> bool {
        runs_on(self.only.as_deref(), series)
    }
}

pub(super) fn runs_on(only: Option<&[Series]>, series: Series) -> bool {
    only.is_none_or(|only| only.contains(&series))
}

/// The series' names joined by `sep`: `5.10+6.12` as `--tests` writes a
/// suite's kernels, `5.10,6.12` as `--kernel` does.
pub(super) fn series_names(series: &[Series], sep: &str) -> String {
    series
        .iter()
        .map(|s| s.name())
        .collect::<Vec<_>>()
        .join(sep)
}

/// `name`, `name@K` or `name@K+K...`, K as `--kernel` names a Debian series.
pub(super) fn parse_suite(s: &str) -> Result<Suite, String> {
    use clap::ValueEnum;
    let (name, kernels) = match s.split_once('@') {
        Some((name, kernels)) => (name, Some(kernels)),
        None => (s, None),
    };
    if name.is_empty() {
        return Err(format!(
            "no suite name in {s:?}: expected e.g. nfs or smb@6.12"
        ));
    }
    let Some(kernels) = kernels else {
        return Ok(Suite {
            name: name.to_string(),
            only: None,
        });
    };
    let mut only = Vec::new();
    for kernel in kernels.split('+') {
        if kernel.is_empty() {
            return Err(format!(
                "no kernel after @ or + in {s:?}: expected e.g. {name}@6.12 or {name}@6.1+6.12"
            ));
        }
        let series = Series::from_str(kernel, false).map_err(|_| {
            format!("unknown kernel {kernel:?} in {s:?}: expected 5.10, 6.1 or 6.12 after @")
        })?;
        // Named twice, it still runs once per guest.
        if !only.contains(&series) {
            only.push(series);
        }
    }
    Ok(Suite {
        name: name.to_string(),
        only: Some(only),
    })
}

/// Every kernel a suite is restricted to must be booted: otherwise it
/// would run on fewer kernels than it says, or on none, silently. The
/// host's kernel is no Debian series; `run` says what it leaves out.
pub(super) fn check_suites(kernels: &[Target], suites: &[Suite]) -> anyhow::Result<()> {
    let booted: Vec<Series> = kernels
        .iter()
        .filter_map(|k| match k {
            Target::Debian(series) => Some(*series),
            Target::Host => None,
        })
        .collect();
    if booted.is_empty() {
        return Ok(());
    }
    for suite in suites {
        let Some(only) = &suite.only else { continue };
        if let Some(missing) = only.iter().find(|s| !booted.contains(s)) {
            bail!(
                "--tests {}@{} names kernel {}, which --kernel {} does not boot: add it to --kernel or drop it after @",
                suite.name,
                series_names(only, "+"),
                missing.name(),
                series_names(&booted, ",")
            );
        }
    }
    Ok(())
}

/// The suites of `--tests` to run, after checking their kernels: on the
/// host's kernel, which is no Debian series, those restricted to some
/// kernels are left out, and said so.
pub(super) fn suites_to_run(
    kernels: &[Target],
    tests: &[Suite],
    host: bool,
) -> anyhow::Result<Vec<Suite>> {
    check_suites(kernels, tests)?;
    let mut suites = Vec::new();
    for suite in tests {
        match &suite.only {
            Some(only) if host => say(format!(
                "{}: runs only on Debian's {} (--tests {}@{}); not run on this machine's kernel",
                suite.name,
                series_names(only, ", "),
                suite.name,
                series_names(only, "+")
            )),
            _ => suites.push(suite.clone()),
        }
    }
    Ok(suites)
}

/// The steps a guest of `series` runs, in order.
pub(super) fn steps_on(steps: &[Step], series: Series) -> Vec<Step> {
    steps
        .iter()
        .filter(|step| runs_on(step.only.as_deref(), series))
        .cloned()
        .collect()
}

/// A suite as `--tests` gives it, for tests here and in `vm`'s.
#[cfg(test)]
pub(super) fn suite(name: &str, only: Option<&[Series]>) -> Suite {
    Suite {
        name: name.to_string(),
        only: only.map(<[Series]>::to_vec),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    #[test]
    fn a_suite_names_the_kernels_it_runs_on_after_an_at() {
        use Series::{V6_1, V6_12};
        assert_eq!(parse_suite("nfs"), Ok(suite("nfs", None)));
        assert_eq!(parse_suite("smb@6.12"), Ok(suite("smb", Some(&[V6_12]))));
        assert_eq!(
            parse_suite("smb@6.12+6.1"),
            Ok(suite("smb", Some(&[V6_12, V6_1])))
        );
        assert_eq!(parse_suite("smb@6.1+6.1"), Ok(suite("smb", Some(&[V6_1]))));
    }

    #[test]
    fn a_bad_suite_is_refused_with_what_was_expected() {
        assert_eq!(
            parse_suite("smb@4.19"),
            Err(
                r#"unknown kernel "4.19" in "smb@4.19": expected 5.10, 6.1 or 6.12 after @"#
                    .to_string()
            )
        );
        assert_eq!(
            parse_suite("smb@host"),
            Err(
                r#"unknown kernel "host" in "smb@host": expected 5.10, 6.1 or 6.12 after @"#
                    .to_string()
            )
        );
        let no_kernel = |s: &str| {
            format!(r#"no kernel after @ or + in "{s}": expected e.g. smb@6.12 or smb@6.1+6.12"#)
        };
        assert_eq!(parse_suite("smb@"), Err(no_kernel("smb@")));
        assert_eq!(parse_suite("smb@6.1+"), Err(no_kernel("smb@6.1+")));
        assert_eq!(parse_suite("smb@+6.1"), Err(no_kernel("smb@+6.1")));
        assert_eq!(
            parse_suite("@6.12"),
            Err(r#"no suite name in "@6.12": expected e.g. nfs or smb@6.12"#.to_string())
        );
        assert_eq!(
            parse_suite(""),
            Err(r#"no suite name in "": expected e.g. nfs or smb@6.12"#.to_string())
        );
    }

    #[test]
    fn a_suite_for_a_kernel_not_booted_is_refused() {
        use Series::{V5_10, V6_1, V6_12};
        let debian = [Target::Debian(V5_10), Target::Debian(V6_12)];
        let suites = [suite("nfs", None), suite("smb", Some(&[V6_12]))];
        assert!(check_suites(&debian, &suites).is_ok());
        let suites = [suite("nfs", None), suite("smb", Some(&[V6_12, V6_1]))];
        assert_eq!(
            check_suites(&debian, &suites).map_err(|e| e.to_string()),
            Err("--tests smb@6.12+6.1 names kernel 6.1, which --kernel 5.10,6.12 does not boot: add it to --kernel or drop it after @".to_string())
        );
        // On the host's kernel it is left out instead (`suites_to_run`).
        assert!(check_suites(&[Target::Host], &suites).is_ok());
    }

    #[test]
    fn each_kernel_gets_the_steps_of_its_suites_in_order() {
        use Series::{V5_10, V6_1, V6_12};
        let step = |label: &str, only: Option<&[Series]>| Step {
            label: label.to_string(),
            cwd: PathBuf::from("/w/tests"),
            argv: vec![format!("/w/{label}")],
            only: only.map(<[Series]>::to_vec),
        };
        let steps = [
            step("kernel_errors", None),
            step("smb", Some(&[V6_12])),
            step("nfs", None),
            step("iscsi", Some(&[V6_1, V6_12])),
        ];
        let labels = |series| {
            steps_on(&steps, series)
                .into_iter()
                .map(|s| s.label)
                .collect::<Vec<_>>()
        };
        assert_eq!(labels(V5_10), ["kernel_errors", "nfs"]);
        assert_eq!(labels(V6_1), ["kernel_errors", "nfs", "iscsi"]);
        assert_eq!(labels(V6_12), ["kernel_errors", "smb", "nfs", "iscsi"]);
        // The steps themselves, unchanged.
        assert_eq!(steps_on(&steps, V6_12), steps);
        assert_eq!(
            steps_on(&[step("smb", Some(&[V6_12]))], V5_10),
            Vec::<Step>::new()
        );
    }

    #[test]
    fn kernels() {
        assert!(matches!(parse_kernel("host"), Ok(Target::Host)));
        assert!(matches!(
            parse_kernel("6.1"),
            Ok(Target::Debian(Series::V6_1))
        ));
        assert!(parse_kernel("4.19").is_err());
    }
}
