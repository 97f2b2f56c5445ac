//! A stop that wakes the server's threads instead of being polled for.
//!
//! A server stops when its stop flag is set; without a [`StopWake`] its
//! blocked threads (the door and the client loop) look at the flag every
//! [`STOP_POLL`](crate::door::STOP_POLL), which an idle server pays for
//! with ten wake-ups a second per thread. With one, whoever sets the flag
//! also calls [`StopWake::wake`] (or registers [`StopWake::signal_writer`]
//! for a signal, after the handler that sets the flag): the door polls the
//! wake and on stop shuts the client's connection down, which ends the
//! client loop's wait, so neither needs a timeout.
//!
//! A wake is final: its byte is never read, so every later poll sees it
//! at once. Use one per stop flag, never reset.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// The pollable side of a stop flag (see the module docs).
#[derive(Debug, Clone)]
pub struct StopWake(Arc<Pair>);

#[derive(Debug)]
struct Pair {
    /// Readable once woken.
    read: UnixStream,
    /// Written once per wake; non-blocking, so a wake never waits.
    write: UnixStream,
}

impl StopWake {
    pub fn new() -> std::io::Result<Self> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        Ok(Self(Arc::new(Pair { read, write })))
    }

    /// Wakes every thread polling it, now and later. Set the stop flag
    /// first: a thread woken before sees no stop and polls again.
    pub fn wake(&self) {
        // A full buffer means it has been woken already.
        let _ = (&self.0.write).write(&[1]);
    }

    /// A copy of the writing end, for a signal handler to write a byte to
    /// (signal-hook's `low_level::pipe::register`, which keeps it open for
    /// as long as the handler is installed): it wakes as
    /// [`wake`](Self::wake) does.
    pub fn signal_writer(&self) -> std::io::Result<UnixStream> {
        self.0.write.try_clone()
    }

    /// Whether it has been woken.
    pub fn woken(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &self.0.read,
            rustix::event::PollFlags::IN,
        )];
        crate::conn::poll(&mut fds, Some(std::time::Duration::ZERO)).is_ok()
            && !fds[0].revents().is_empty()
    }

    /// Blocks until woken (at once if it has been).
    pub fn wait(&self) {
        let mut fds = [rustix::event::PollFd::new(
            &self.0.read,
            rustix::event::PollFlags::IN,
        )];
        // An error other than EINTR (which poll retries) cannot happen on
        // a socket we own; waking again then is harmless.
        let _ = crate::conn::poll(&mut fds, None);
    }

    /// Blocks until `fd` is readable (or hung up) or this is woken;
    /// returns whether it was woken. An error of poll's own (not EINTR,
    /// which it retries) returns at once as "readable", so the caller's
    /// next call says what is wrong.
    pub fn wait_for(&self, fd: BorrowedFd<'_>) -> bool {
        use rustix::event::{PollFd, PollFlags};
        let mut fds = [
            PollFd::from_borrowed_fd(fd, PollFlags::IN),
            PollFd::new(&self.0.read, PollFlags::IN),
        ];
        crate::conn::poll(&mut fds, None).is_ok() && !fds[1].revents().is_empty()
    }

    /// The fd to poll for readability.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.read.as_fd()
    }
}
