//! Entry points for coverage-guided fuzzing (`fuzz/src/bin/<target>.rs`, run
//! by `cargo xtask fuzz`): each module has a `pub fn run(data: &[u8])` that
//! feeds one input to a parser of outside input and must never panic. Not
//! part of the agent's API.

pub mod csi;
pub mod kubelet_dir;
pub mod vol_data;

#[cfg(test)]
mod tests {
    /// The committed seeds run through their targets (no panic), and the
    /// seed directories are where `fuzz/` expects them.
    #[test]
    fn the_seed_corpora_run() {
        let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
        type Target = fn(&[u8]);
        let targets: [(&str, Target); 3] = [
            ("vol_data", super::vol_data::run),
            ("kubelet_dir", super::kubelet_dir::run),
            ("csi", super::csi::run),
        ];
        for (name, run) in targets {
            let mut seeds = 0;
            for entry in std::fs::read_dir(corpus.join(name)).unwrap() {
                let data = std::fs::read(entry.unwrap().path()).unwrap();
                run(&data);
                seeds += 1;
            }
            assert!(seeds >= 8, "{name}: {seeds} seeds");
        }
    }
}
