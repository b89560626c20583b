//! Entry points of the fuzz targets (`fuzz/src/bin/<target>.rs`, run by
//! `cargo xtask fuzz`): each takes the raw input bytes and must not panic.

pub mod csi;
