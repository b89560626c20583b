//! `cargo xtask kind`: the options of the end-to-end run in kind
//! (lab/src/kind/ runs it).

#[derive(clap::Args)]
pub struct KindArgs {
    /// Leave the cluster (with the agent) running afterwards; the test's pod,
    /// volume and fault disk are removed in any case.
    #[arg(long)]
    pub keep: bool,
    /// Use the cluster if it exists (made by an earlier run with --keep)
    /// instead of refusing to touch it.
    #[arg(long)]
    pub reuse: bool,
    /// kind node image (default: kind's own).
    #[arg(long, value_name = "IMAGE")]
    pub node_image: Option<String>,
    /// Seconds to wait for the Warning events once writes fail.
    #[arg(long, default_value_t = 180)]
    pub warning_timeout: u64,
    /// Seconds to wait for the Normal event once the fault is cleared (the
    /// agent's quiet window for kernel conditions is 5 minutes).
    #[arg(long, default_value_t = 480)]
    pub clear_timeout: u64,
}
