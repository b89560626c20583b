//! The merged NodeGetVolumeHealth entries, within what Kubernetes 1.37
//! accepts in `pod.status.volumeHealth[].healthConditions`: at most
//! [`MAX_ENTRIES`], unique by `(status, reason)`, a reason of at most
//! [`MAX_REASON_BYTES`] and a message of at most [`MAX_MESSAGE_BYTES`], cut
//! on a UTF-8 boundary. Worst first, so what the limit drops is the mildest.

use health_core::conditions::{clip_to, Status};

use super::AgentCondition;
use crate::proto;

pub const MAX_ENTRIES: usize = 16;
pub const MAX_REASON_BYTES: usize = 256;
pub const MAX_MESSAGE_BYTES: usize = 1024;

pub(super) type WireEntry = proto::volume_health::VolumeHealthEntry;

/// The driver's entries and the agent's conditions as one list: worst
/// status first; at the same status the driver's entries before the agent's,
/// each in its own order; the first entry of each `(status, reason)` kept.
/// Agent messages say where they come from (`volume-health kernel: ...`),
/// so a reader of the pod's status can tell them from the driver's.
pub(super) fn merged(driver: Vec<WireEntry>, agent: &[AgentCondition]) -> Vec<WireEntry> {
    let agent = agent.iter().map(|c| WireEntry {
        status: wire_status(c.status) as i32,
        reason: c.reason.clone(),
        message: format!("volume-health {}: {}", c.source, c.message),
    });
    let mut all: Vec<WireEntry> = driver
        .into_iter()
        .chain(agent)
        .map(|e| WireEntry {
            status: e.status,
            reason: clip_to(e.reason, MAX_REASON_BYTES),
            message: clip_to(e.message, MAX_MESSAGE_BYTES),
        })
        .collect();
    // Stable: the driver-before-agent and in-list orders survive.
    all.sort_by_key(|e| rank(e.status));
    let mut seen: Vec<(i32, &str)> = Vec::with_capacity(MAX_ENTRIES);
    let mut keep = vec![false; all.len()];
    for (i, e) in all.iter().enumerate() {
        if seen.len() == MAX_ENTRIES {
            break;
        }
        if !seen.contains(&(e.status, e.reason.as_str())) {
            seen.push((e.status, e.reason.as_str()));
            keep[i] = true;
        }
    }
    let mut keep = keep.into_iter();
    all.retain(|_| keep.next().unwrap_or(false));
    all
}

fn wire_status(status: Status) -> proto::VolumeHealthErrorType {
    match status {
        Status::Inaccessible => proto::VolumeHealthErrorType::Inaccessible,
        Status::DataLoss => proto::VolumeHealthErrorType::DataLoss,
        Status::Degraded => proto::VolumeHealthErrorType::Degraded,
    }
}

/// Worst first: Inaccessible, DataLoss, Degraded, then values this build
/// does not know (a newer driver's), which are kept as the driver sent them.
fn rank(status: i32) -> u8 {
    match proto::VolumeHealthErrorType::try_from(status) {
        Ok(proto::VolumeHealthErrorType::Inaccessible) => 0,
        Ok(proto::VolumeHealthErrorType::DataLoss) => 1,
        Ok(proto::VolumeHealthErrorType::Degraded) => 2,
        Ok(proto::VolumeHealthErrorType::UnknownVolumeHealthType) | Err(_) => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INACCESSIBLE: i32 = proto::VolumeHealthErrorType::Inaccessible as i32;
    const DATA_LOSS: i32 = proto::VolumeHealthErrorType::DataLoss as i32;
    const DEGRADED: i32 = proto::VolumeHealthErrorType::Degraded as i32;

    fn wire(status: i32, reason: &str, message: &str) -> WireEntry {
        WireEntry {
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    fn agent(status: Status, reason: &str, message: &str) -> AgentCondition {
        AgentCondition {
            status,
            reason: reason.into(),
            message: message.into(),
            source: "kernel".into(),
        }
    }

    #[test]
    fn worst_first_driver_before_agent_and_unique_by_status_and_reason() {
        let driver = vec![
            wire(DEGRADED, "Slow", "driver slow"),
            wire(99, "FromTheFuture", "newer spec"),
            wire(DATA_LOSS, "BlockIOErrors", "driver saw errors"),
        ];
        let agent = [
            agent(Status::DataLoss, "BlockIOErrors", "3 write errors"),
            agent(Status::Inaccessible, "ReadOnlyRemount", "remounted ro"),
            agent(Status::Degraded, "Slow", "also slow"),
            agent(Status::Degraded, "CapacityLow", "2% free"),
        ];
        assert_eq!(
            merged(driver, &agent),
            vec![
                wire(
                    INACCESSIBLE,
                    "ReadOnlyRemount",
                    "volume-health kernel: remounted ro"
                ),
                wire(DATA_LOSS, "BlockIOErrors", "driver saw errors"),
                wire(DEGRADED, "Slow", "driver slow"),
                wire(DEGRADED, "CapacityLow", "volume-health kernel: 2% free"),
                wire(99, "FromTheFuture", "newer spec"),
            ]
        );
    }

    #[test]
    fn at_most_sixteen_and_the_mildest_go() {
        let driver: Vec<WireEntry> = (0..10)
            .map(|i| wire(DEGRADED, &format!("D{i:02}"), "d"))
            .collect();
        let agent: Vec<AgentCondition> = (0..10)
            .map(|i| agent(Status::DataLoss, &format!("A{i:02}"), "a"))
            .collect();
        let out = merged(driver, &agent);
        assert_eq!(out.len(), MAX_ENTRIES);
        let reasons: Vec<&str> = out.iter().map(|e| e.reason.as_str()).collect();
        let mut want: Vec<String> = (0..10).map(|i| format!("A{i:02}")).collect();
        want.extend((0..6).map(|i| format!("D{i:02}")));
        assert_eq!(reasons, want);
    }

    #[test]
    fn reason_and_message_are_cut_on_a_character_boundary() {
        // 'é' is two bytes: 300 of them are 600 bytes, and byte 253 is the
        // middle of one, so the cut goes back to 252.
        let long_reason = "é".repeat(300);
        let long_message = "é".repeat(1000);
        let out = merged(vec![wire(DEGRADED, &long_reason, &long_message)], &[]);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].reason, format!("{}...", "é".repeat(126)));
        assert_eq!(out[0].reason.len(), 255);
        assert_eq!(out[0].message, format!("{}...", "é".repeat(510)));
        assert_eq!(out[0].message.len(), 1023);
    }

    #[test]
    fn reasons_equal_after_the_cut_are_one_entry() {
        let a = format!("{}A", "R".repeat(300));
        let b = format!("{}B", "R".repeat(300));
        let out = merged(
            vec![wire(DEGRADED, &a, "first"), wire(DEGRADED, &b, "second")],
            &[],
        );
        assert_eq!(
            out,
            vec![wire(DEGRADED, &format!("{}...", "R".repeat(253)), "first")]
        );
    }

    #[test]
    fn nothing_and_nothing_is_nothing() {
        assert_eq!(merged(Vec::new(), &[]), Vec::<WireEntry>::new());
    }
}
