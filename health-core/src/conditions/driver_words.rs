//! A CSI driver's words made fit to be a condition.
//!
//! Every CSI entry (node Get, node storage health, controller Get and List)
//! passes through [`fit`] before the machine keeps it. A driver is another
//! party's code, and what it says ends up in Event reasons, in `VolumeHealth`
//! entries (whose schema wants a CamelCase reason of at most 128 bytes: one bad
//! reason would get the whole object of the claim refused) and on terminals.
//! So, whatever the driver sends:
//! - a reason that is not CamelCase becomes one made of its words
//!   (`disk-failure` → `DiskFailure`), and the message says what the driver
//!   wrote; an empty one becomes [`EMPTY_REASON`];
//! - control characters (newlines, escape sequences) in messages become
//!   spaces, and messages are cut at [`MAX_MESSAGE`] bytes;
//! - at most [`MAX_ENTRIES`] conditions per volume are kept, worst first; the
//!   last place then says how many were left out, so nothing is hidden
//!   silently and a driver listing thousands of conditions cannot turn them
//!   into thousands of Events.

use super::evidence::CsiEntry;
use super::format::clip_to;
use super::vocabulary::Status;

/// The `VolumeHealth` schema's bound on a reason.
pub const MAX_REASON: usize = 128;
/// The `VolumeHealth` schema's bound on a message.
pub const MAX_MESSAGE: usize = 4096;
/// Conditions kept per volume and source; the schema allows 32 per entry,
/// which also holds the kernel's and the checks' own.
pub const MAX_ENTRIES: usize = 16;
/// The reason given to an entry whose reason has no letters or digits.
pub const EMPTY_REASON: &str = "DriverReportedCondition";
/// The reason of the entry standing for those left out.
pub const TRUNCATED_REASON: &str = "DriverConditionsTruncated";

/// The entries as the machine keeps them: reasons CamelCase and unique per
/// status, messages clean, at most [`MAX_ENTRIES`], worst status first (the
/// driver's order kept within a status).
pub fn fit(entries: Vec<CsiEntry>) -> Vec<CsiEntry> {
    let mut out: Vec<CsiEntry> = Vec::with_capacity(entries.len().min(MAX_ENTRIES));
    let mut all = entries.into_iter().map(fit_one).collect::<Vec<_>>();
    all.sort_by_key(|e| e.status);
    let mut left_out = 0usize;
    for entry in all {
        // Two raw reasons may fold into one word; the first message stays.
        if out
            .iter()
            .any(|e| e.status == entry.status && e.reason == entry.reason)
        {
            continue;
        }
        if out.len() < MAX_ENTRIES {
            out.push(entry);
        } else {
            left_out += 1;
        }
    }
    if left_out > 0 {
        // The last kept place says what is missing (the mildest status: the
        // entries it stands for are already the mildest of the list).
        let replaced = out.pop().map_or(0, |_| 1);
        out.push(CsiEntry {
            status: Status::Degraded,
            reason: TRUNCATED_REASON.to_string(),
            message: format!(
                "{} more conditions reported by the driver are left out (this agent keeps {MAX_ENTRIES} per volume)",
                left_out + replaced
            ),
        });
    }
    out
}

fn fit_one(e: CsiEntry) -> CsiEntry {
    let message = clean_message(&e.message);
    if is_camel_case(&e.reason) {
        return CsiEntry { message, ..e };
    }
    let reason = camel_case(&e.reason);
    let shown: String = e.reason.chars().take(MAX_REASON).collect();
    let message = clip(format!("(driver reason {shown:?}) {message}"));
    CsiEntry {
        status: e.status,
        reason,
        message,
    }
}

/// `^[A-Z][A-Za-z0-9]*$`, at most [`MAX_REASON`] bytes: what the schema and
/// the KEP want.
pub fn is_camel_case(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= MAX_REASON
        && chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_alphanumeric())
}

/// The ASCII letters and digits of `raw`, each run capitalized and joined;
/// prefixed when it would start with a digit, cut at [`MAX_REASON`].
fn camel_case(raw: &str) -> String {
    let mut out = String::new();
    for word in raw
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
    {
        let mut chars = word.chars();
        if let Some(first) = chars.next() {
            out.push(first.to_ascii_uppercase());
            out.extend(chars);
        }
    }
    if out.is_empty() {
        return EMPTY_REASON.to_string();
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "Driver");
    }
    out.truncate(MAX_REASON);
    out
}

fn clean_message(raw: &str) -> String {
    let cleaned: String = raw
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    clip(cleaned)
}

/// Cut at [`MAX_MESSAGE`] bytes on a char boundary, marked with "...".
fn clip(s: String) -> String {
    clip_to(s, MAX_MESSAGE)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::conditions::testing::entry;

    #[test]
    fn good_reasons_pass_unchanged() {
        let e = entry(Status::DataLoss, "ChecksumMismatch", "block 7");
        assert_eq!(fit(vec![e.clone()]), vec![e]);
    }

    #[test]
    fn bad_reasons_become_camel_case_and_the_message_keeps_them() {
        let got = fit(vec![
            entry(Status::Degraded, "disk-failure", "slow"),
            entry(Status::Inaccessible, "", "gone"),
            entry(Status::Degraded, "5xx from backend", "x"),
            entry(Status::DataLoss, "ÄÖ", "y"),
        ]);
        let words: Vec<(&str, &str)> = got
            .iter()
            .map(|e| (e.reason.as_str(), e.message.as_str()))
            .collect();
        assert_eq!(
            words,
            vec![
                ("DriverReportedCondition", "(driver reason \"\") gone"),
                ("DriverReportedCondition", "(driver reason \"ÄÖ\") y"),
                ("DiskFailure", "(driver reason \"disk-failure\") slow"),
                (
                    "Driver5xxFromBackend",
                    "(driver reason \"5xx from backend\") x"
                ),
            ]
        );
    }

    #[test]
    fn control_characters_never_reach_a_terminal() {
        let got = fit(vec![entry(
            Status::Degraded,
            "Bad",
            "line1\nline2\x1b[31mred\x07",
        )]);
        assert_eq!(got[0].message, "line1 line2 [31mred ");
    }

    #[test]
    fn reasons_folding_into_one_keep_the_first() {
        let got = fit(vec![
            entry(Status::Degraded, "io error", "first"),
            entry(Status::Degraded, "io-error", "second"),
            entry(Status::DataLoss, "io error", "other status"),
        ]);
        assert_eq!(
            got.iter()
                .map(|e| (e.status, e.reason.as_str()))
                .collect::<Vec<_>>(),
            vec![(Status::DataLoss, "IoError"), (Status::Degraded, "IoError")]
        );
        assert_eq!(got[1].message, "(driver reason \"io error\") first");
    }

    #[test]
    fn thousands_of_conditions_are_cut_worst_first_and_say_so() {
        let mut many: Vec<CsiEntry> = (0..5000)
            .map(|i| entry(Status::Degraded, &format!("Slow{i}"), "m"))
            .collect();
        many.push(entry(Status::Inaccessible, "Gone", "m"));
        let got = fit(many);
        assert_eq!(got.len(), MAX_ENTRIES);
        assert_eq!(got[0].reason, "Gone");
        assert_eq!(got[1].reason, "Slow0");
        let last = &got[MAX_ENTRIES - 1];
        assert_eq!(
            (last.status, last.reason.as_str(), last.message.as_str()),
            (
                Status::Degraded,
                TRUNCATED_REASON,
                "4986 more conditions reported by the driver are left out (this agent keeps 16 per volume)"
            )
        );
    }

    proptest! {
        #[test]
        fn anything_a_driver_sends_fits_the_schema(
            raw in prop::collection::vec(
                (0..3u8, ".{0,300}", prop::collection::vec(any::<char>(), 0..5000)),
                0..40,
            )
        ) {
            let entries: Vec<CsiEntry> = raw
                .iter()
                .map(|(s, reason, message)| CsiEntry {
                    status: [Status::Inaccessible, Status::DataLoss, Status::Degraded][*s as usize],
                    reason: reason.clone(),
                    message: message.iter().collect(),
                })
                .collect();
            let got = fit(entries);
            prop_assert!(got.len() <= MAX_ENTRIES);
            for (i, e) in got.iter().enumerate() {
                prop_assert!(is_camel_case(&e.reason), "{:?}", e.reason);
                prop_assert!(e.message.len() <= MAX_MESSAGE);
                prop_assert!(!e.message.chars().any(char::is_control));
                prop_assert!(!got[..i].iter().any(|o| o.status == e.status && o.reason == e.reason));
                if i > 0 {
                    prop_assert!(got[i - 1].status <= e.status);
                }
            }
        }

        #[test]
        fn camel_case_reasons_are_kept(reason in "[A-Z][A-Za-z0-9]{0,127}") {
            let got = fit(vec![entry(Status::Degraded, &reason, "m")]);
            prop_assert_eq!(&got[0].reason, &reason);
            prop_assert_eq!(&got[0].message, "m");
        }
    }
}
