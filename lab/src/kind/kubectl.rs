//! kubectl with the cluster's kubeconfig.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use xtask::util::{output, run as run_cmd};

pub(super) struct Kube {
    pub(super) kubeconfig: PathBuf,
}

impl Kube {
    fn cmd(&self) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig").arg(&self.kubeconfig);
        cmd
    }

    pub(super) fn run(&self, args: &[&str]) -> anyhow::Result<()> {
        run_cmd(self.cmd().args(args))
    }

    pub(super) fn output(&self, args: &[&str]) -> anyhow::Result<String> {
        output(self.cmd().args(args))
    }

    /// `kubectl apply -f -` with `yaml` on its stdin.
    pub(super) fn apply(&self, yaml: &str) -> anyhow::Result<()> {
        let mut child = self
            .cmd()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .spawn()
            .context("starting kubectl apply")?;
        let mut stdin = child.stdin.take().context("kubectl's stdin")?;
        stdin.write_all(yaml.as_bytes())?;
        drop(stdin);
        let status = child.wait()?;
        if !status.success() {
            bail!("kubectl apply failed with {status}");
        }
        Ok(())
    }
}
