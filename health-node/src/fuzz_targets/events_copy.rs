//! This node's copy of its Events (`events.json` under `--state-dir`, a
//! file on the node that a crash can tear and anyone with the hostPath can
//! change) as a restarted agent reads it: any bytes load or are refused,
//! never a panic; what a loaded copy saves loads back with the same Events
//! (those past the server's TTL dropped), and saving it again changes
//! nothing (times are kept to the second, as the API server keeps them).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use health_kube::events::LocalCopy;

/// When the copy is saved: Events last written an hour before go.
fn now() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)
}

/// A file of this process's own under the temporary directory.
fn scratch_file() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("events-copy-{}-{n}.json", std::process::id()))
}

pub fn run(data: &[u8]) {
    let path = scratch_file();
    std::fs::write(&path, data).expect("writing the input");
    let loaded = LocalCopy::load(&path);
    let _ = std::fs::remove_file(&path);
    let Ok(mut copy) = loaded else {
        return;
    };
    copy.save(now()).expect("saving the copy");
    let mut again = LocalCopy::load(&path).expect("a saved copy loads");
    assert_eq!(names(&again), names(&copy), "no Event lost or added");
    again.save(now()).expect("saving it again");
    let third = LocalCopy::load(&path).expect("a saved copy loads");
    let _ = std::fs::remove_file(&path);
    assert_eq!(
        third.events(),
        again.events(),
        "a saved copy saves as it loads"
    );
}

fn names(copy: &LocalCopy) -> Vec<(Option<String>, Option<String>)> {
    copy.events()
        .into_iter()
        .map(|e| (e.metadata.namespace, e.metadata.name))
        .collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn file(events: &[(String, u64, i32)]) -> Vec<u8> {
        let events: Vec<serde_json::Value> = events
            .iter()
            .map(|(name, age, count)| {
                let last = now() - Duration::from_secs(*age);
                let last = k8s_openapi::jiff::Timestamp::try_from(last).unwrap();
                json!({"metadata": {"namespace": "shop", "name": name},
                       "involvedObject": {"kind": "Pod", "namespace": "shop", "name": "web-0"},
                       "reason": "BlockIOErrors", "message": "m", "count": count,
                       "lastTimestamp": last.to_string()})
            })
            .collect();
        serde_json::to_vec(&json!({"version": 1, "events": events})).unwrap()
    }

    #[test]
    fn a_saved_copy_drops_what_the_server_expired_and_loads_back() {
        // Read as the agent reads it: two within the hour, one past it.
        let path = scratch_file();
        std::fs::write(
            &path,
            file(&[
                ("a".into(), 10, 3),
                ("b".into(), 3599, 1),
                ("c".into(), 3601, 7),
            ]),
        )
        .unwrap();
        let mut copy = LocalCopy::load(&path).unwrap();
        assert_eq!(copy.len(), 3);
        copy.save(now()).unwrap();
        let names: Vec<_> = LocalCopy::load(&path)
            .unwrap()
            .events()
            .into_iter()
            .map(|e| e.metadata.name.unwrap())
            .collect();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(names, ["a", "b"]);
    }

    proptest! {
        /// Any bytes: loaded or refused, never a panic.
        #[test]
        fn any_bytes_load_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            run(&bytes);
        }

        /// Any copy the agent could have written, and any tear of it.
        #[test]
        fn any_copy_and_any_tear_of_it_round_trips_or_is_refused(
            events in proptest::collection::vec(("[a-z0-9.-]{1,20}", 0u64..7200, 1i32..100_000), 0..20),
            cut in any::<proptest::sample::Index>(),
        ) {
            let bytes = file(&events);
            run(&bytes);
            run(&bytes[..cut.index(bytes.len() + 1)]);
        }
    }
}
