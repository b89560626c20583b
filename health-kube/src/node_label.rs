//! Which node's agent wrote an object, as a label the API server selects on.
//!
//! A restarted agent continues its own Events and `VolumeHealth` entries.
//! Nothing else the server can select on names the writing node: core/v1
//! Events select on `reportingComponent` but not `reportingInstance`, and a
//! custom resource on 1.26 selects on no field but its name. Without a
//! label every agent would list every node's objects at each start. With it
//! the server (from its watch cache) sends each agent only its own.
//!
//! - Events the agent creates carry `volume-health.io/node=<node>`.
//! - A `VolumeHealth` carries `node.volume-health.io/<node>` (value empty)
//!   while that node has entries on it: several nodes may write one object
//!   (a claim used on several nodes), so each node has its own key.
//!
//! `<node>` is the node name when it is a valid label value (at most 63
//! bytes); a longer name keeps a prefix and a digest of the whole.

/// The label on the Events a node's agent creates.
pub const EVENT_NODE_LABEL: &str = "volume-health.io/node";
/// The prefix of the label a node's agent keeps on a `VolumeHealth` while
/// it has entries there.
pub const VOLUME_HEALTH_NODE_PREFIX: &str = "node.volume-health.io/";
/// A label value, and the name part of a key, is at most 63 bytes.
const MAX_LABEL: usize = 63;
/// Hex digits of the digest a long node name keeps.
const DIGEST_HEX: usize = 16;

/// `node` as a label value and key name: itself when it is valid as one,
/// else a prefix of its label-safe characters and a SHA-256 digest of the
/// whole name, so that two long names stay apart.
pub fn node_label(node: &str) -> String {
    if is_label_value(node) && !node.is_empty() {
        return node.to_string();
    }
    let hex = short_digest(node);
    let keep = MAX_LABEL - hex.len() - 1;
    let prefix: String = node
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(keep)
        .collect();
    // A value starts and ends with an alphanumeric character.
    let prefix = prefix.trim_matches(|c: char| !c.is_ascii_alphanumeric());
    if prefix.is_empty() {
        hex
    } else {
        format!("{prefix}-{hex}")
    }
}

/// The first 8 bytes of SHA-256(`s`) in hex: what keeps a shortened name
/// (this label, a field manager) apart from others sharing its prefix.
pub(crate) fn short_digest(s: &str) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(s.as_bytes());
    digest[..DIGEST_HEX / 2]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The key a node's agent keeps on the `VolumeHealth` objects where it has
/// entries.
pub fn volume_health_key(node: &str) -> String {
    format!("{VOLUME_HEALTH_NODE_PREFIX}{}", node_label(node))
}

/// The selector of the Events a node's agent created.
pub fn event_selector(node: &str) -> String {
    format!("{EVENT_NODE_LABEL}={}", node_label(node))
}

/// A label value as the API server validates it: at most 63 bytes of
/// `[A-Za-z0-9_.-]`, beginning and ending with an alphanumeric character.
fn is_label_value(s: &str) -> bool {
    s.len() <= MAX_LABEL
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && s.chars().next().is_none_or(|c| c.is_ascii_alphanumeric())
        && s.chars().last().is_none_or(|c| c.is_ascii_alphanumeric())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_usual_node_name_is_its_own_label() {
        assert_eq!(
            node_label("ip-10-0-3-17.ec2.internal"),
            "ip-10-0-3-17.ec2.internal"
        );
        assert_eq!(event_selector("node-1"), "volume-health.io/node=node-1");
        assert_eq!(volume_health_key("node-1"), "node.volume-health.io/node-1");
    }

    #[test]
    fn a_long_node_name_keeps_a_prefix_and_a_digest() {
        let long = format!("{}.example.com", "a".repeat(60));
        let label = node_label(&long);
        assert_eq!(label.len(), 63);
        assert!(label.starts_with(&"a".repeat(46)), "{label}");
        assert_eq!(label.as_bytes()[46], b'-');
        assert!(is_label_value(&label), "{label}");
        // Names that share the prefix stay apart.
        let other = format!("{}.example.org", "a".repeat(60));
        assert_ne!(node_label(&other), label);
        // The same name always gives the same label (a restart finds it).
        assert_eq!(node_label(&long), label);
    }

    #[test]
    fn a_prefix_never_ends_in_a_separator() {
        let name = format!("{}.{}", "b".repeat(45), "c".repeat(30));
        let label = node_label(&name);
        // 46 bytes would end in '.': trimmed before the digest.
        assert!(
            label.starts_with(&format!("{}-", "b".repeat(45))),
            "{label}"
        );
        assert!(is_label_value(&label), "{label}");
        assert_eq!(label.len(), 45 + 1 + DIGEST_HEX);
    }

    #[test]
    fn invalid_characters_are_not_carried_into_the_label() {
        let label = node_label("Node_With:Colon");
        assert!(is_label_value(&label), "{label}");
        assert!(label.starts_with("Node_WithColon-"), "{label}");
    }
}
