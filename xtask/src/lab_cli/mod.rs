//! The command lines of the commands the lab runs: `cargo xtask demo`,
//! `bench` and `cluster`.
//!
//! They are defined here, once, and parsed twice: by `cargo xtask`
//! (xtask/cli), which answers `--help` and usage errors at once, and by the
//! lab binary (lab/src/main.rs), which the command line builds and runs
//! only for real work with the same arguments. Before, xtask passed everything through and the lab
//! compiled (kube, aya, FUSE: minutes in release on a fresh machine) before
//! `--help` could print.

pub mod bench;
pub mod cluster;

use clap::Subcommand;

/// The lab's commands, as both `cargo xtask` and `health-lab` list them.
#[derive(Subcommand)]
pub enum LabCommand {
    /// Build, then show the agent catching real I/O errors on a fault disk (root, ~1 minute).
    Demo,
    /// Build, then measure latency, overhead, an error flood and the event path (root); updates
    /// docs/benchmarks.md.
    Bench(bench::BenchArgs),
    /// A single-node Kubernetes on this host from local parts (root): up, down, status, fault,
    /// and test (the end-to-end suite on it); docs/local-cluster.md.
    Cluster(cluster::ClusterArgs),
}

impl LabCommand {
    /// The lab's name for it (its subcommand).
    pub fn name(&self) -> &'static str {
        match self {
            LabCommand::Demo => "demo",
            LabCommand::Bench(_) => "bench",
            LabCommand::Cluster(_) => "cluster",
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    #[command(name = "cargo xtask")]
    struct Cli {
        #[command(subcommand)]
        command: LabCommand,
    }

    fn parse(words: &[&str]) -> Result<LabCommand, clap::Error> {
        Cli::try_parse_from(std::iter::once("cargo xtask").chain(words.iter().copied()))
            .map(|cli| cli.command)
    }

    /// Help for every command and subcommand, rendered by clap here: no
    /// lab is built for it.
    #[test]
    fn help_is_answered_from_the_definitions() {
        let cases: &[(&[&str], &str)] = &[
            (&["bench", "--help"], "--latency-errors <LATENCY_ERRORS>"),
            (&["cluster", "--help"], "--state-dir <DIR>"),
            (&["cluster", "up", "--help"], "--agent-archive <FILE>"),
            (&["cluster", "fault", "--help"], "Inject or clear errors"),
            (&["cluster", "fault", "add", "--help"], "--errno <ERRNO>"),
            (&["cluster", "test", "--help"], "[FILTER]..."),
            (&["demo", "--help"], "Usage: cargo xtask demo"),
        ];
        for (words, expected) in cases {
            let err = parse(words)
                .err()
                .unwrap_or_else(|| panic!("{words:?} parsed"));
            assert_eq!(err.kind(), ErrorKind::DisplayHelp, "{words:?}");
            let text = err.render().to_string();
            assert!(text.contains(expected), "{words:?}: {text}");
        }
        let err = parse(&["cluster"]).err().expect("a subcommand is required");
        assert_eq!(
            err.kind(),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
    }

    #[test]
    fn usage_errors_are_answered_from_the_definitions() {
        let cases: &[(&[&str], ErrorKind)] = &[
            (&["cluster", "upp"], ErrorKind::InvalidSubcommand),
            (&["bench", "--only", "latencyy"], ErrorKind::InvalidValue),
            (&["bench", "--rounds", "many"], ErrorKind::ValueValidation),
            (&["bench", "--kubernetes", "1.30"], ErrorKind::InvalidValue),
            (
                &["cluster", "fault", "add", "--errno", "EWHATEVER"],
                ErrorKind::ValueValidation,
            ),
            (
                &["cluster", "fault", "add", "--path", "/x", "--volume", "v"],
                ErrorKind::ArgumentConflict,
            ),
            (&["demo", "--nope"], ErrorKind::UnknownArgument),
        ];
        for (words, kind) in cases {
            let err = parse(words)
                .err()
                .unwrap_or_else(|| panic!("{words:?} parsed"));
            assert_eq!(err.kind(), *kind, "{words:?}: {}", err.render());
        }
    }

    #[test]
    fn the_bench_starts_the_newest_kubernetes_unless_told_the_oldest() {
        let version = |words: &[&str]| match parse(words).unwrap() {
            LabCommand::Bench(b) => b.kubernetes,
            _ => panic!("not bench"),
        };
        assert_eq!(version(&["bench"]), bench::Kubernetes::Newest);
        assert_eq!(
            version(&["bench", "--only", "scale", "--kubernetes", "oldest"]),
            bench::Kubernetes::Oldest
        );
    }

    #[test]
    fn real_work_parses_to_what_the_lab_runs() {
        let cluster = |words: &[&str]| match parse(words).unwrap() {
            LabCommand::Cluster(c) => c,
            _ => panic!("not cluster"),
        };
        let c = cluster(&[
            "cluster",
            "--state-dir",
            "/s",
            "fault",
            "add",
            "--errno",
            "ENOSPC",
            "--len",
            "64K",
        ]);
        assert_eq!(c.state_dir.as_deref(), Some(std::path::Path::new("/s")));
        match c.command {
            cluster::ClusterCommand::Fault(cluster::FaultArgs {
                command: cluster::FaultCommand::Add(add),
            }) => {
                assert_eq!(add.errno, libc::ENOSPC);
                assert_eq!(add.len, Some(64 << 10));
                assert_eq!(add.offset, None);
                assert_eq!(add.op.requests(), "writes");
            }
            _ => panic!("not fault add"),
        }
        match cluster(&["cluster", "test", "volume", "restart"]).command {
            cluster::ClusterCommand::Test { filter } => assert_eq!(filter, ["volume", "restart"]),
            _ => panic!("not test"),
        }
        match parse(&["bench", "--only", "latency,flood", "--no-write"]).unwrap() {
            LabCommand::Bench(b) => {
                assert_eq!(b.only, [bench::Part::Latency, bench::Part::Flood]);
                assert!(b.no_write);
                assert_eq!(b.latency_errors, 1000);
            }
            _ => panic!("not bench"),
        }
        assert_eq!(parse(&["demo"]).unwrap().name(), "demo");
    }
}
