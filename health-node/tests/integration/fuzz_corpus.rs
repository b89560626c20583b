//! The fuzz targets without afl: every binary in fuzz/src/bin has its entry
//! point in `health_node::fuzz_targets`, and every seed of its corpus
//! (regression inputs of past findings included) runs through it without a
//! panic. Cheap enough for every `cargo xtask test`; `cargo xtask fuzz`
//! does the coverage-guided search.

use std::path::{Path, PathBuf};

use health_node::fuzz_targets::TARGETS;

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

fn files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("listing {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    v.sort();
    v
}

#[test]
fn every_fuzz_binary_calls_its_entry_point() {
    let bins: Vec<String> = files(&fuzz_dir().join("src/bin"))
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .map(|p| p.file_stem().unwrap().to_string_lossy().into_owned())
        .collect();
    let mut names: Vec<String> = TARGETS.iter().map(|(n, _)| n.to_string()).collect();
    names.sort();
    assert_eq!(bins, names, "fuzz/src/bin and fuzz_targets::TARGETS differ");
    for name in &names {
        let source =
            std::fs::read_to_string(fuzz_dir().join(format!("src/bin/{name}.rs"))).unwrap();
        let call = format!("health_node::fuzz_targets::{name}::run");
        assert!(
            source.contains(&call),
            "fuzz/src/bin/{name}.rs does not call {call}"
        );
    }
}

#[test]
fn every_seed_runs_through_its_target_without_a_panic() {
    let mut ran = 0;
    for (name, run) in TARGETS {
        let seeds = files(&fuzz_dir().join("corpus").join(name));
        assert!(!seeds.is_empty(), "no seeds for {name}");
        for seed in seeds {
            let data = std::fs::read(&seed).unwrap();
            let outcome = std::panic::catch_unwind(|| run(&data));
            assert!(outcome.is_ok(), "{name}: {} panicked", seed.display());
            ran += 1;
        }
    }
    assert!(ran >= TARGETS.len() * 2, "only {ran} seeds");
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config::with_cases(64))]
    /// What afl does, a little: random bytes, and seeds with bytes
    /// overwritten and cut short, through every target.
    #[test]
    fn mutated_seeds_and_random_bytes_never_panic(
        random in proptest::collection::vec(proptest::num::u8::ANY, 0..2048),
        flips in proptest::collection::vec((proptest::num::usize::ANY, proptest::num::u8::ANY), 0..8),
        cut in proptest::num::usize::ANY,
        pick in proptest::num::usize::ANY,
    ) {
        for (name, run) in TARGETS {
            run(&random);
            let seeds = files(&fuzz_dir().join("corpus").join(name));
            let mut data = std::fs::read(&seeds[pick % seeds.len()]).unwrap();
            if data.is_empty() {
                continue;
            }
            for &(at, byte) in &flips {
                let len = data.len();
                data[at % len] = byte;
            }
            data.truncate(cut % (data.len() + 1));
            run(&data);
        }
    }
}
