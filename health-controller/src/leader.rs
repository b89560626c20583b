//! Leadership through a coordination.k8s.io Lease (kube-lease-manager): one
//! replica works, the others stand by and take over once the lease
//! expires (within one lease duration of the leader's last renewal), or at
//! once when the leader releases it on shutdown.
//!
//! Leadership is published on a watch channel. The controller stops
//! writing the moment it reads `false`; since kube-lease-manager reports a
//! failed renewal as an error and not as a loss, an error is treated as a
//! loss here too (this replica can no longer prove it holds the lease), and
//! the lease is taken up again from scratch with a new manager.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use tokio::sync::{oneshot, watch};

/// Where and as whom to hold the lease.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub duration: Duration,
}

impl LeaseConfig {
    /// Renew this long before the lease would expire: a third of its
    /// duration (at least a second), which leaves room for a slow request
    /// and for clock skew between replicas.
    fn grace_secs(&self) -> u64 {
        (self.duration.as_secs() / 3).max(1)
    }
}

const RETRY_MIN: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// The running election: `leader()` follows it; `shutdown` gives the lease
/// up.
pub struct Election {
    pub leader: watch::Receiver<bool>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Election {
    /// Starts contending in the background.
    pub fn start(client: Client, config: LeaseConfig) -> Election {
        let (tx, rx) = watch::channel(false);
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(contend(client, config, tx, stop_rx));
        Election {
            leader: rx,
            stop: Some(stop_tx),
            task,
        }
    }

    /// Releases the lease (so a standby takes over at once) and stops.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if tokio::time::timeout(Duration::from_secs(5), &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!("releasing the lease took too long; a standby waits for it to expire");
            self.task.abort();
        }
    }
}

async fn build(
    client: &Client,
    config: &LeaseConfig,
) -> Result<LeaseManager, kube_lease_manager::LeaseManagerError> {
    LeaseManagerBuilder::new(client.clone(), &config.name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(config.duration.as_secs().max(1))
        .with_grace(config.grace_secs())
        .build()
        .await
}

async fn contend(
    client: Client,
    config: LeaseConfig,
    tx: watch::Sender<bool>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut retry = RETRY_MIN;
    loop {
        let manager = tokio::select! {
            built = build(&client, &config) => built,
            _ = &mut stop => return,
        };
        let manager = match manager {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(lease = %config.name, namespace = %config.namespace, "cannot use the lease: {e}");
                tokio::select! {
                    _ = tokio::time::sleep(retry) => {}
                    _ = &mut stop => return,
                }
                retry = (retry * 2).min(RETRY_MAX);
                continue;
            }
        };
        loop {
            tokio::select! {
                changed = manager.changed() => match changed {
                    Ok(leader) => {
                        retry = RETRY_MIN;
                        if leader {
                            tracing::info!(identity = %config.identity, lease = %config.name, "acquired the lease: this replica is the leader");
                        } else {
                            tracing::info!(identity = %config.identity, lease = %config.name, "lost the lease: standing by");
                        }
                        tx.send_replace(leader);
                    }
                    Err(e) => {
                        // Cannot prove we hold it: stop working now.
                        if tx.send_replace(false) {
                            tracing::warn!("renewing the lease failed ({e}); stepping down");
                        } else {
                            tracing::warn!("contending for the lease failed: {e}");
                        }
                        break;
                    }
                },
                _ = &mut stop => {
                    tx.send_replace(false);
                    if let Err(e) = manager.release().await {
                        tracing::warn!("releasing the lease: {e}");
                    }
                    return;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(retry) => {}
            _ = &mut stop => return,
        }
        retry = (retry * 2).min(RETRY_MAX);
    }
}
