//! Waiting for the agent's Events on an object, and telling them apart.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use super::{Kube, REASON, TEST_NAMESPACE};

/// Polls the events of one object until `wanted` accepts one.
pub(super) fn wait_event(
    kube: &Kube,
    kind: &str,
    name: &str,
    timeout: Duration,
    wanted: fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let selector = format!("involvedObject.kind={kind},involvedObject.name={name}");
    let deadline = Instant::now() + timeout;
    loop {
        let text = kube.output(&[
            "--namespace",
            TEST_NAMESPACE,
            "get",
            "events",
            "--field-selector",
            &selector,
            "-o",
            "json",
        ])?;
        let list: Value = serde_json::from_str(&text).context("kubectl get events -o json")?;
        let items = list["items"].as_array().cloned().unwrap_or_default();
        if let Some(found) = items.iter().find(|e| wanted(e)) {
            return Ok(found.clone());
        }
        if Instant::now() >= deadline {
            let seen: Vec<String> = items.iter().map(describe_event).collect();
            bail!(
                "no matching event on {kind} {name} within {timeout:?}; its events:\n{}",
                seen.join("\n")
            );
        }
        std::thread::sleep(Duration::from_secs(5));
    }
}

pub(super) fn is_warning(e: &Value) -> bool {
    e["type"] == "Warning" && e["reason"] == REASON
}

/// The agent's event saying the condition is over: Normal, from the agent
/// (not kubelet's Pulled/Started), naming the condition in its reason or
/// its message.
pub(super) fn is_clear_event(e: &Value) -> bool {
    // The recorder's recovery event: Normal, `<Reason>Cleared`, from the agent.
    e["type"] == "Normal"
        && e["reason"] == format!("{REASON}Cleared").as_str()
        && e["source"]["component"] == "volume-health-agent"
}

pub(super) fn describe_event(e: &Value) -> String {
    format!(
        "{} {} x{}: {}",
        e["type"].as_str().unwrap_or("?"),
        e["reason"].as_str().unwrap_or("?"),
        e["count"].as_u64().unwrap_or(1),
        e["message"].as_str().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_told_apart() {
        let warning = serde_json::json!({"type": "Warning", "reason": "BlockIOErrors", "message": "3 failed writes"});
        assert!(is_warning(&warning));
        assert!(!is_clear_event(&warning));
        let cleared = serde_json::json!({"type": "Normal", "reason": "BlockIOErrorsCleared", "message": "BlockIOErrors cleared", "source": {"component": "volume-health-agent"}});
        assert!(is_clear_event(&cleared));
        let kubelet = serde_json::json!({"type": "Normal", "reason": "Started", "message": "Started container writer (BlockIOErrors)", "source": {"component": "kubelet"}});
        assert!(!is_clear_event(&kubelet));
    }
}
