//! A CSI driver's NodeGetVolumeHealth answer body as `health-agent
//! csi-proxy` reads it (one gRPC frame, decoded, merged with the agent's
//! conditions within the 1.37 limits, framed again):
//! `health_csi::proxy::fuzz_driver_answer` panics when a limit is broken.

pub fn run(data: &[u8]) {
    health_csi::proxy::fuzz_driver_answer(data);
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::run;

    /// A gRPC frame of `message` as a driver sends it.
    fn frame(message: &[u8]) -> Vec<u8> {
        let mut out = vec![0];
        out.extend(u32::try_from(message.len()).unwrap().to_be_bytes());
        out.extend(message);
        out
    }

    proptest! {
        #[test]
        fn any_bytes_as_the_drivers_answer_never_break_a_limit(
            body in prop::collection::vec(any::<u8>(), 0..2048),
        ) {
            run(&body);
            run(&frame(&body));
        }

        #[test]
        fn any_entries_a_driver_can_encode_merge_within_the_limits(
            entries in prop::collection::vec((0i32..6, ".{0,300}", ".{0,1100}"), 0..40),
        ) {
            use prost::Message;
            let answer = health_csi::proto::NodeGetVolumeHealthResponse {
                volume_health: Some(health_csi::proto::VolumeHealth {
                    volume_id: "vol-1".into(),
                    health_statuses: entries
                        .into_iter()
                        .map(|(status, reason, message)| {
                            health_csi::proto::volume_health::VolumeHealthEntry { status, reason, message }
                        })
                        .collect(),
                }),
            };
            run(&frame(&answer.encode_to_vec()));
        }
    }
}
