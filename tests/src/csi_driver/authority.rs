//! The kubelet's plugin watcher dials a registration socket with grpc-go
//! and its path as the target, and grpc-go then sends that path as the
//! HTTP/2 `:authority` of every request (Kubernetes sets `localhost` on its
//! CSI and device plugin clients, not on this one: 1.37's
//! `pkg/kubelet/pluginmanager/operationexecutor`). The `h2` crate under
//! tonic refuses such a request outright ("malformed authority", a
//! PROTOCOL_ERROR stream reset: hyperium/h2#487, still open), so a
//! registration served by tonic alone is never read.
//!
//! [`accept`] puts a small rewriter between each accepted connection and
//! the server: the client's header blocks are decoded (HPACK, with the
//! connection's dynamic table) and encoded again with an authority that is
//! not one replaced by `localhost`; every other frame, and everything the
//! server sends, passes as it is. Written here because no crate offers it;
//! HPACK itself is `fluke-hpack`'s.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

/// The client's connection preface (RFC 9113, 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// SETTINGS_MAX_FRAME_SIZE's initial value (RFC 9113, 6.5.2): what the
/// server accepts before it says more.
const MAX_FRAME: usize = 16_384;
/// What replaces an authority that is none.
const LOCALHOST: &[u8] = b"localhost";

/// The server's end of a connection whose client is `client`: what the
/// server reads has every request's `:authority` made valid.
pub fn accept(client: UnixStream) -> io::Result<UnixStream> {
    let (server_end, ours) = UnixStream::pair()?;
    let (client_read, client_write) = client.into_split();
    let (ours_read, ours_write) = ours.into_split();
    tokio::spawn(async move {
        let mut ours_read = ours_read;
        let mut client_write = client_write;
        let _ = tokio::io::copy(&mut ours_read, &mut client_write).await;
        let _ = client_write.shutdown().await;
    });
    tokio::spawn(async move {
        if let Err(e) = rewrite(client_read, ours_write).await {
            tracing::debug!(error = %e, "registration connection ended");
        }
    });
    Ok(server_end)
}

/// Copies an HTTP/2 client's bytes from `from` to `to`, header blocks
/// rewritten (see the module's comment).
pub async fn rewrite(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
) -> io::Result<()> {
    let mut preface = [0u8; PREFACE.len()];
    from.read_exact(&mut preface).await?;
    if preface != PREFACE {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "not an HTTP/2 client preface",
        ));
    }
    to.write_all(&preface).await?;
    let mut decoder = fluke_hpack::Decoder::new();
    let mut encoder = fluke_hpack::Encoder::new();
    loop {
        let Some((kind, flags, stream, payload)) = read_frame(&mut from).await? else {
            return to.shutdown().await;
        };
        if kind != HEADERS {
            to.write_all(&frame(kind, flags, stream, &payload)).await?;
            continue;
        }
        let mut block = fragment(flags, &payload)?.to_vec();
        let mut end = flags & END_HEADERS != 0;
        while !end {
            let (kind, flags, _, payload) = read_frame(&mut from)
                .await?
                .ok_or_else(|| invalid("the connection ended inside a header block"))?;
            if kind != CONTINUATION {
                return Err(invalid("a header block not continued by CONTINUATION"));
            }
            block.extend_from_slice(&payload);
            end = flags & END_HEADERS != 0;
        }
        let headers = decoder
            .decode(&block)
            .map_err(|e| invalid(&format!("an HPACK block that does not decode: {e:?}")))?;
        let headers = with_valid_authority(headers);
        let encoded = encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        to.write_all(&header_frames(flags & END_STREAM, stream, &encoded))
            .await?;
    }
}

/// The headers with a `:authority` that is no URI authority (a socket
/// path) replaced by `localhost`.
pub fn with_valid_authority(mut headers: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<(Vec<u8>, Vec<u8>)> {
    for (name, value) in &mut headers {
        if name == b":authority" && http::uri::Authority::try_from(value.as_slice()).is_err() {
            *value = LOCALHOST.to_vec();
        }
    }
    headers
}

/// One frame: (type, flags, stream id, payload); `None` at a clean end of
/// the connection between frames.
async fn read_frame(
    from: &mut (impl AsyncRead + Unpin),
) -> io::Result<Option<(u8, u8, u32, Vec<u8>)>> {
    let mut head = [0u8; 9];
    match from.read_exact(&mut head).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    from.read_exact(&mut payload).await?;
    Ok(Some((head[3], head[4], stream, payload)))
}

/// A HEADERS payload's header block fragment: without its padding and
/// priority fields.
fn fragment(flags: u8, payload: &[u8]) -> io::Result<&[u8]> {
    let mut start = 0;
    let mut end = payload.len();
    if flags & PADDED != 0 {
        let pad = *payload
            .first()
            .ok_or_else(|| invalid("PADDED without a pad length"))? as usize;
        start = 1;
        end = end
            .checked_sub(pad)
            .ok_or_else(|| invalid("more padding than payload"))?;
    }
    if flags & PRIORITY != 0 {
        start += 5;
    }
    payload
        .get(start..end)
        .ok_or_else(|| invalid("a HEADERS frame shorter than its fields"))
}

/// The block as a HEADERS frame and as many CONTINUATION frames as the
/// initial frame size needs.
fn header_frames(end_stream: u8, stream: u32, block: &[u8]) -> Vec<u8> {
    let mut chunks: Vec<&[u8]> = block.chunks(MAX_FRAME).collect();
    if chunks.is_empty() {
        chunks.push(&[]);
    }
    let last = chunks.len() - 1;
    let mut out = Vec::with_capacity(block.len() + 9 * chunks.len());
    for (i, chunk) in chunks.iter().enumerate() {
        let end_headers = if i == last { END_HEADERS } else { 0 };
        let (kind, flags) = match i {
            0 => (HEADERS, end_stream | end_headers),
            _ => (CONTINUATION, end_headers),
        };
        out.extend_from_slice(&frame(kind, flags, stream, chunk));
    }
    out
}

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u32).to_be_bytes();
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(name: &str, value: &str) -> (Vec<u8>, Vec<u8>) {
        (name.as_bytes().to_vec(), value.as_bytes().to_vec())
    }

    #[test]
    fn a_socket_path_is_no_authority_and_a_host_is_kept() {
        let out = with_valid_authority(vec![
            h(":method", "POST"),
            h(":authority", "/var/lib/kubelet/plugins_registry/x-reg.sock"),
            h(":path", "/pluginregistration.Registration/GetInfo"),
        ]);
        assert_eq!(out[1], h(":authority", "localhost"));
        assert_eq!(
            out[2],
            h(":path", "/pluginregistration.Registration/GetInfo")
        );
        let kept = with_valid_authority(vec![h(":authority", "localhost:1234")]);
        assert_eq!(kept, vec![h(":authority", "localhost:1234")]);
    }

    /// A client's bytes (preface, SETTINGS, a padded HEADERS with priority
    /// split into a CONTINUATION, DATA) come out with the one header
    /// changed and every other frame as it was.
    #[tokio::test]
    async fn header_blocks_are_rewritten_and_other_frames_pass() {
        let headers = [
            h(":method", "POST"),
            h(":scheme", "http"),
            h(":path", "/p"),
            h(":authority", "/run/x.sock"),
            h("content-type", "application/grpc"),
        ];
        let mut client_encoder = fluke_hpack::Encoder::new();
        let block =
            client_encoder.encode(headers.iter().map(|(n, v)| (n.as_slice(), v.as_slice())));
        let (first, rest) = block.split_at(block.len() / 2);
        let mut headers_payload = vec![2u8]; // pad length
        headers_payload.extend_from_slice(&[0, 0, 0, 0, 15]); // priority
        headers_payload.extend_from_slice(first);
        headers_payload.extend_from_slice(&[0, 0]); // padding
        let mut input = PREFACE.to_vec();
        let settings = frame(0x4, 0, 0, &[]);
        let data = frame(0x0, END_STREAM, 1, b"\0\0\0\0\0");
        input.extend_from_slice(&settings);
        input.extend_from_slice(&frame(HEADERS, PADDED | PRIORITY, 1, &headers_payload));
        input.extend_from_slice(&frame(CONTINUATION, END_HEADERS, 1, rest));
        input.extend_from_slice(&data);

        let mut output = Vec::new();
        rewrite(input.as_slice(), &mut output).await.unwrap();

        let mut at = PREFACE.len();
        assert_eq!(&output[..at], PREFACE);
        assert_eq!(&output[at..at + settings.len()], settings.as_slice());
        at += settings.len();
        let mut reader = &output[at..];
        let (kind, flags, stream, payload) = read_frame(&mut reader).await.unwrap().unwrap();
        assert_eq!((kind, flags, stream), (HEADERS, END_HEADERS, 1));
        let decoded = fluke_hpack::Decoder::new().decode(&payload).unwrap();
        let mut want = headers.to_vec();
        want[3] = h(":authority", "localhost");
        assert_eq!(decoded, want);
        assert_eq!(reader, data.as_slice());
    }

    #[test]
    fn a_large_block_is_split_at_the_initial_frame_size() {
        let block = vec![7u8; MAX_FRAME + 10];
        let out = header_frames(END_STREAM, 3, &block);
        assert_eq!(out.len(), block.len() + 18);
        // 16,384 bytes, HEADERS, END_STREAM without END_HEADERS, stream 3.
        assert_eq!(
            out[..9],
            [0x00, 0x40, 0x00, HEADERS, END_STREAM, 0, 0, 0, 3]
        );
        let second = &out[9 + MAX_FRAME..];
        assert_eq!(second[3..5], [CONTINUATION, END_HEADERS]);
        assert_eq!(u32::from_be_bytes([0, second[0], second[1], second[2]]), 10);
    }
}
