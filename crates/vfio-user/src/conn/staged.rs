//! Replies staged in a pipe the supervisor holds too (`vnvme serve
//! --supervise`), so a server killed at any instant leaves no doubt about
//! whether the client got its reply.
//!
//! A supervised server marks the message it handles in the crash area and
//! clears the mark once the message took effect and its state is kept. If
//! it sent the reply straight to the socket, a kill after the send and
//! before the clear would leave a client that has its reply behind a mark
//! that says it is owed, and the supervisor would have to close a healthy
//! connection; sending after the clear would leave, for a kill in between,
//! a client waiting for a reply nobody owes it. Two effects (the client's
//! and the mark) cannot both be made at one instant from user space.
//!
//! So the reply is written to this pipe first, while the message is still
//! marked, and moved to the socket with `splice` only after the mark is
//! cleared. The kernel moves bytes from the pipe to the socket without
//! their passing through the process, so at any instant each byte of the
//! reply is either still in the pipe or already the client's:
//!
//! * marked, pipe empty: the reply was not made; the message's effect is
//!   not known: the next server handles it again where that is safe
//!   (`handover::Marked::redo`), else the connection is closed;
//! * marked, bytes in the pipe: the same (the state the reply speaks of
//!   may not be kept); the next server drops them;
//! * not marked, bytes in the pipe: the reply is owed and whole in the
//!   pipe, the part already sent excepted; the next server sends the rest
//!   before anything else;
//! * not marked, pipe empty: nothing is owed.
//!
//! Only replies without fds (SCM_RIGHTS cannot go through a pipe) and no
//! larger than the pipe are staged; the others (region info with the
//! doorbell page's fd, at set-up) are sent straight, with the old doubt.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};

use rustix::pipe::SpliceFlags;

/// A pipe replies wait in between their being made and their being sent.
#[derive(Debug)]
pub struct ReplyPipe {
    rx: OwnedFd,
    tx: OwnedFd,
    /// The pipe's capacity: a staged reply never waits for room.
    capacity: usize,
    /// Bytes in the pipe (only the serving thread stages and sends).
    pending: AtomicUsize,
}

impl ReplyPipe {
    /// Makes the pipe's two ends (read, write), as large as a message
    /// where the kernel allows (`/proc/sys/fs/pipe-max-size` bounds an
    /// unprivileged process; smaller replies are staged anyway).
    pub fn create() -> io::Result<(OwnedFd, OwnedFd)> {
        let (rx, tx) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        for size in [super::MAX_MSG_SIZE, 1 << 20] {
            if rustix::pipe::fcntl_setpipe_size(&tx, size).is_ok() {
                break;
            }
        }
        Ok((rx, tx))
    }

    /// The pipe whose ends are `rx` and `tx` ([`ReplyPipe::create`]),
    /// holding what a dead server left in it.
    pub fn new(rx: OwnedFd, tx: OwnedFd) -> io::Result<Self> {
        let capacity = rustix::pipe::fcntl_getpipe_size(&tx)?;
        let pipe = Self {
            rx,
            tx,
            capacity,
            pending: AtomicUsize::new(0),
        };
        pipe.pending.store(pipe.unsent()?, Ordering::Relaxed);
        Ok(pipe)
    }

    /// The bytes in the pipe, as the kernel counts them.
    pub fn unsent(&self) -> io::Result<usize> {
        Ok(rustix::io::ioctl_fionread(&self.rx)? as usize)
    }

    /// Empties the pipe (a reply to a client that is gone, or to a message
    /// whose effect was not kept); returns how many bytes it dropped.
    pub fn discard(&self) -> io::Result<usize> {
        let mut dropped = 0;
        let mut buf = [0u8; 4096];
        loop {
            let left = self.unsent()?;
            if left == 0 {
                break;
            }
            // At most what is there: the read never waits.
            let n = rustix::io::read(&self.rx, &mut buf[..left.min(4096)])?;
            dropped += n;
        }
        self.pending.store(0, Ordering::Relaxed);
        Ok(dropped)
    }

    /// The ends, for a supervised server to pass on.
    pub fn fds(&self) -> (BorrowedFd<'_>, BorrowedFd<'_>) {
        (self.rx.as_fd(), self.tx.as_fd())
    }

    /// Whether a reply of `len` bytes fits beside what waits.
    pub(super) fn fits(&self, len: usize) -> bool {
        self.pending.load(Ordering::Relaxed) + len <= self.capacity
    }

    /// Whether something waits to be sent.
    pub(super) fn holds(&self) -> bool {
        self.pending.load(Ordering::Relaxed) > 0
    }

    /// Writes the reply `parts` (header and up to three more, as
    /// `Conn::send` joins them; it [`fits`](Self::fits), so the write
    /// never waits and is whole).
    pub(super) fn stage(&self, parts: &[&[u8]; 4]) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut done = 0;
        while done < total {
            let (iov, n) = super::unsent(parts, done);
            match rustix::io::writev(&self.tx, &iov[..n]) {
                Ok(n) => done += n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        self.pending.fetch_add(total, Ordering::Relaxed);
        Ok(())
    }

    /// Moves everything waiting to `socket` (the caller holds the send
    /// lock, so no other message goes in between).
    pub(super) fn send(&self, socket: BorrowedFd<'_>) -> io::Result<()> {
        loop {
            let left = self.pending.load(Ordering::Relaxed);
            if left == 0 {
                return Ok(());
            }
            match rustix::pipe::splice(&self.rx, None, socket, None, left, SpliceFlags::MOVE) {
                // The socket took nothing though the pipe holds bytes:
                // the peer is gone.
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.pending.fetch_sub(n, Ordering::Relaxed);
                }
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::os::unix::net::UnixStream;

    use super::*;

    /// A reply staged by one server and sent by the next (the first killed
    /// after its mark was cleared) reaches the client once and whole,
    /// however much of it the first had sent.
    #[test]
    fn a_staged_reply_is_sent_once_by_whoever_holds_the_pipe() {
        let (server, mut client) = UnixStream::pair().unwrap();
        let (rx, tx) = ReplyPipe::create().unwrap();
        let first =
            ReplyPipe::new(rustix::io::dup(&rx).unwrap(), rustix::io::dup(&tx).unwrap()).unwrap();
        assert!(first.fits(super::super::MAX_DATA_XFER_SIZE / 2));
        first.stage(&[b"head", b"-body-", b"tail", b""]).unwrap();
        assert!(first.holds());
        // Nothing reaches the client before the send.
        client.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 64];
        assert_eq!(
            client.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        // The first server moves 5 bytes, then dies.
        let moved =
            rustix::pipe::splice(&first.rx, None, &server, None, 5, SpliceFlags::MOVE).unwrap();
        assert_eq!(moved, 5);
        drop(first);
        // The next one finds the rest and sends it.
        let next = ReplyPipe::new(rx, tx).unwrap();
        assert_eq!(next.unsent().unwrap(), 9);
        next.send(server.as_fd()).unwrap();
        assert!(!next.holds());
        assert_eq!(next.unsent().unwrap(), 0);
        let n = client.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"head-body-tail");
        assert_eq!(
            client.read(&mut buf).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
    }

    /// What a reply left for a client that cannot be resumed is dropped,
    /// and the pipe serves the next client from empty.
    #[test]
    fn discard_empties_the_pipe() {
        let (rx, tx) = ReplyPipe::create().unwrap();
        let pipe = ReplyPipe::new(rx, tx).unwrap();
        let big = vec![7u8; 10_000];
        pipe.stage(&[&big, &[], &[], &[]]).unwrap();
        assert_eq!(pipe.unsent().unwrap(), 10_000);
        assert_eq!(pipe.discard().unwrap(), 10_000);
        assert!(!pipe.holds());
        assert_eq!(pipe.unsent().unwrap(), 0);
    }
}
