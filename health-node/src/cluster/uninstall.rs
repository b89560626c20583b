//! An agent that stops because it was uninstalled removes what it pinned
//! on the node; one that stops for any other reason (a rolling update, a
//! drain, an eviction) leaves it for the next agent, which adopts it and
//! loses nothing. Which of the two is the API server's to say
//! ([`health_kube::uninstalled`]).

use std::path::Path;

use health_kube::uninstalled::{daemonset_fate, DaemonSetFate};

use super::DaemonSetRef;

/// Asks whether `daemonset` was removed and, if so, removes the pins under
/// `pin_root` (and the tracer witness kept with them; tracefs under
/// `sys_root`). Everything is logged; nothing here fails the agent's exit.
pub(super) async fn unpin_if_uninstalled(
    client: kube::Client,
    daemonset: &DaemonSetRef,
    pin_root: &Path,
    sys_root: &Path,
) {
    let why = match daemonset_fate(client, &daemonset.namespace, &daemonset.name).await {
        DaemonSetFate::Running => {
            tracing::info!(
                pins = %pin_root.display(),
                "the DaemonSet is still there: the pinned kernel state stays for the next agent"
            );
            return;
        }
        DaemonSetFate::Unknown(e) => {
            tracing::warn!(
                pins = %pin_root.display(),
                "could not tell whether the agent was uninstalled ({e}): the pinned kernel state stays (`health-agent uninstall` removes it)"
            );
            return;
        }
        DaemonSetFate::Removed(why) => why,
    };
    match health_kernel::uninstall::uninstall(pin_root, sys_root) {
        Ok(done) => {
            let removed = done.removed.map_or_else(
                || "nothing was pinned".to_string(),
                |r| {
                    format!(
                        "{} links detached, {} programs and {} maps unpinned",
                        r.links, r.programs, r.maps
                    )
                },
            );
            tracing::info!(pins = %pin_root.display(), "{why}: removed the pinned kernel state: {removed}");
            if let Err(e) = done.witness {
                tracing::warn!("the tracer witness kept with the pins may remain (the next agent removes it): {e}");
            }
        }
        Err(e) => tracing::error!(
            pins = %pin_root.display(),
            "{why}, but removing the pinned kernel state failed: {e} (`health-agent uninstall` removes it)"
        ),
    }
}
