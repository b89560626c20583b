//! Connections that remember when the kernel received what was last read
//! from them (`SO_TIMESTAMPNS`): the time a request reached this host,
//! before the server's own scheduling and parsing. Timing benchmarks
//! measure a client against that, so that a busy (debug-built) server
//! thread does not count as the client's latency.
//!
//! Written here because tokio's `TcpStream` reads with `recv`, which drops
//! the timestamp control message; this reads with `recvmsg` instead.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsRawFd, RawFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use nix::sys::socket::{
    recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags, SockaddrStorage,
};
use nix::sys::time::TimeSpec;
use nix::time::{clock_gettime, ClockId};
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The kernel's receive time (CLOCK_REALTIME ns) of the last bytes read
/// from a [`StampedStream`]; 0 until a read carried one.
#[derive(Clone, Default)]
pub(super) struct LastReceived(Arc<AtomicU64>);

impl LastReceived {
    /// The last receive time as CLOCK_MONOTONIC ns (the clock the rest of
    /// the recording uses), converted with the two clocks' offset now.
    pub(super) fn mono_ns(&self) -> Option<u64> {
        let real = self.0.load(Ordering::Acquire);
        if real == 0 {
            return None;
        }
        let now_real = ns(clock_gettime(ClockId::CLOCK_REALTIME).ok()?);
        let now_mono = ns(clock_gettime(ClockId::CLOCK_MONOTONIC).ok()?);
        (real + now_mono).checked_sub(now_real)
    }
}

pub(super) struct StampedStream {
    inner: TcpStream,
    last: LastReceived,
}

impl StampedStream {
    /// Asks the kernel to timestamp what `inner` receives. Refused (a
    /// kernel without it): the stream still works and reports no time.
    pub(super) fn new(inner: TcpStream) -> (StampedStream, LastReceived) {
        if let Err(e) = setsockopt(&inner, sockopt::ReceiveTimestampns, &true) {
            eprintln!("fake apiserver: SO_TIMESTAMPNS refused ({e}): no receive times");
        }
        let last = LastReceived::default();
        (
            StampedStream {
                inner,
                last: last.clone(),
            },
            last,
        )
    }
}

/// Asks the kernel to timestamp what connections accepted from `listener`
/// receive: they inherit the option, so a request that arrived before the
/// server accepted its connection (a loaded machine: seen once in a full
/// suite run) carries a time too, which turning it on per connection,
/// after the accept, misses. Refused: connections report no time.
pub(super) fn stamp_accepted(listener: &std::net::TcpListener) {
    if let Err(e) = setsockopt(listener, sockopt::ReceiveTimestampns, &true) {
        eprintln!("fake apiserver: SO_TIMESTAMPNS refused on the listener ({e})");
    }
}

/// One `recvmsg` into `dst`: the bytes read and the receive time of the
/// last of them, if the kernel attached one.
fn recv_stamped(fd: RawFd, dst: &mut [u8]) -> io::Result<(usize, Option<u64>)> {
    let mut iov = [IoSliceMut::new(dst)];
    let mut space = nix::cmsg_space!(TimeSpec);
    let msg = recvmsg::<SockaddrStorage>(fd, &mut iov, Some(&mut space), MsgFlags::empty())?;
    let stamp = msg.cmsgs()?.find_map(|c| match c {
        ControlMessageOwned::ScmTimestampns(ts) => Some(ns(ts)),
        _ => None,
    });
    Ok((msg.bytes, stamp))
}

fn ns(ts: TimeSpec) -> u64 {
    ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64
}

impl AsyncRead for StampedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            ready!(this.inner.poll_read_ready(cx))?;
            let fd = this.inner.as_raw_fd();
            let dst = buf.initialize_unfilled();
            match this
                .inner
                .try_io(Interest::READABLE, || recv_stamped(fd, dst))
            {
                Ok((n, stamp)) => {
                    if let Some(real) = stamp {
                        this.last.0.store(real, Ordering::Release);
                    }
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                // Readiness was stale: wait again.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }
}

impl AsyncWrite for StampedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}
