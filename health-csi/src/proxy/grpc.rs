//! The little of gRPC's HTTP/2 mapping the intercepted calls need: a unary
//! message's length-prefixed frame, and where the status is. Everything
//! else passes through without being looked at.

use bytes::{BufMut, Bytes, BytesMut};
use http::HeaderMap;

/// A message's frame prefix: one flag byte (1: compressed) and the length as
/// four big-endian bytes.
const PREFIX: usize = 5;

pub(super) const CONTENT_TYPE: &str = "application/grpc";
pub(super) const STATUS: &str = "grpc-status";
/// gRPC's OK.
pub(super) const OK: i32 = 0;

/// The one message of a unary call's body: `None` unless the body is
/// exactly one frame, uncompressed (the proxy never decompresses; such a
/// body passes as it is).
pub(super) fn unary_message(body: &[u8]) -> Option<&[u8]> {
    let (prefix, message) = body.split_at_checked(PREFIX)?;
    let [compressed, len @ ..] = prefix else {
        return None;
    };
    let len = usize::try_from(u32::from_be_bytes(len.try_into().ok()?)).ok()?;
    (*compressed == 0 && message.len() == len).then_some(message)
}

/// `message` as the body of a unary call.
pub(super) fn frame(message: &[u8]) -> Bytes {
    let len = u32::try_from(message.len()).expect("a CSI message fits gRPC's 4 GiB frame");
    let mut out = BytesMut::with_capacity(PREFIX + message.len());
    out.put_u8(0);
    out.put_u32(len);
    out.put_slice(message);
    out.freeze()
}

/// The call's grpc-status: in the trailers, or in the headers of a
/// trailers-only answer. `None` when there is none or it is not a number.
pub(super) fn status(headers: &HeaderMap, trailers: Option<&HeaderMap>) -> Option<i32> {
    trailers
        .and_then(|t| t.get(STATUS))
        .or_else(|| headers.get(STATUS))
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_flag_length_message() {
        assert_eq!(&frame(b"abc")[..], b"\x00\x00\x00\x00\x03abc");
        assert_eq!(&frame(b"")[..], b"\x00\x00\x00\x00\x00");
    }

    #[test]
    fn only_one_whole_uncompressed_frame_is_a_unary_message() {
        assert_eq!(unary_message(b"\x00\x00\x00\x00\x03abc"), Some(&b"abc"[..]));
        assert_eq!(unary_message(b"\x00\x00\x00\x00\x00"), Some(&b""[..]));
        // Compressed.
        assert_eq!(unary_message(b"\x01\x00\x00\x00\x03abc"), None);
        // Short, long, two frames, no prefix.
        assert_eq!(unary_message(b"\x00\x00\x00\x00\x04abc"), None);
        assert_eq!(unary_message(b"\x00\x00\x00\x00\x02abc"), None);
        assert_eq!(
            unary_message(b"\x00\x00\x00\x00\x01a\x00\x00\x00\x00\x01b"),
            None
        );
        assert_eq!(unary_message(b"\x00\x00\x00"), None);
        assert_eq!(unary_message(b""), None);
    }

    #[test]
    fn status_comes_from_trailers_else_headers() {
        let mut headers = HeaderMap::new();
        let mut trailers = HeaderMap::new();
        assert_eq!(status(&headers, None), None);
        headers.insert(STATUS, "5".parse().unwrap());
        assert_eq!(status(&headers, None), Some(5));
        trailers.insert(STATUS, "0".parse().unwrap());
        assert_eq!(status(&headers, Some(&trailers)), Some(0));
        trailers.insert(STATUS, "x".parse().unwrap());
        assert_eq!(status(&HeaderMap::new(), Some(&trailers)), None);
    }
}
