//! `health-agent volumes` beside a running agent: the conditions it shows
//! are the agent's (what the Events say), asked on the agent's conditions
//! socket, and its own judgement only where no agent answers. A fresh
//! process judges from what it can see now; the agent also knows what it
//! saw go (a path whose controller was removed is listed nowhere any
//! more), kernel errors within their quiet window, and episodes it keeps
//! open. The command's own findings (CSI answers, kernel counters, the
//! stack) are shown either way.

use std::path::Path;

use super::pod_volumes::HeldCondition;
use super::{AgentSocket, PodVolumesAnswer};
use crate::volumes::kubelet::VolumeMode;
use crate::volumes::one_shot::{ConditionView, ConditionsFrom, VolumeView};

/// Whose conditions `volumes` shows, for its first line.
#[derive(Debug)]
pub enum Judged {
    /// The agent answered on this socket.
    ByAgent(std::path::PathBuf),
    /// None did: why, with the socket asked.
    Alone(anyhow::Error),
}

impl Judged {
    pub fn line(&self) -> String {
        match self {
            Judged::ByAgent(socket) => format!(
                "conditions: the running agent's (asked at {})\n",
                socket.display()
            ),
            Judged::Alone(why) => format!(
                "conditions: judged by this command alone, no agent answered ({why:#}); \
                 what only history shows (paths removed, errors within the quiet window) may be missing\n"
            ),
        }
    }
}

/// Asks the agent at `socket` and, when it answers, puts its conditions in
/// `views`.
pub async fn adopt_running_agents(views: &mut [VolumeView], socket: &Path) -> Judged {
    match AgentSocket::new(socket).ask_pod_volumes().await {
        Ok(answer) => {
            adopt(views, &answer);
            Judged::ByAgent(socket.to_path_buf())
        }
        Err(why) => Judged::Alone(why.into()),
    }
}

/// Each view's conditions become the agent's for that pod volume (none: the
/// agent holds the volume healthy).
pub fn adopt(views: &mut [VolumeView], answer: &PodVolumesAnswer) {
    for view in views {
        let block = view.volume_mode == VolumeMode::Block;
        let held = answer
            .volumes
            .iter()
            .find(|v| v.pod_uid == view.pod_uid && v.name == view.name && v.block == block);
        view.conditions = held
            .map(|v| v.conditions.iter().map(condition_view).collect())
            .unwrap_or_default();
        view.worst = view.conditions.iter().map(|c| c.status).min();
        view.conditions_from = ConditionsFrom::Agent;
    }
}

fn condition_view(c: &HeldCondition) -> ConditionView {
    ConditionView {
        status: c.status,
        reason: c.reason.clone(),
        message: c.message.clone(),
        since: c.since.clone(),
        last_probe: c.last_probe.clone(),
        source: c.source.clone(),
    }
}
