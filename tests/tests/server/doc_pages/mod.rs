//! Shared by docs.rs: Markdown pages read the way GitHub renders them (as
//! far as links and headings go), the comments of the code that cite
//! them, the measured figures they state, and the `--help` of the built
//! binaries.

pub mod citations;
pub mod figures;
pub mod help;
pub mod markdown;
