//! The door: the thread that owns a server's listening socket. It hands a
//! connection to the control thread when the device is free (or its owner
//! has hung up and is being torn down), refuses every other one at once
//! with an EBUSY reply to its VERSION, and on stop shuts the served
//! connection down, so no blocked send or wait outlives the stop.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use zerocopy::IntoBytes;

use crate::conn::{error_header, wait_readable, Conn};
use crate::wire::{cmd, Header, HEADER_SIZE};

/// How often a blocked server looks at its `stop` flag.
pub(crate) const STOP_POLL: Duration = Duration::from_millis(100);
/// How long a refused connection is kept open, and how many at most.
const REFUSED_LINGER: Duration = Duration::from_secs(1);
const MAX_LINGERING: usize = 16;

/// Lets one log line through a second; counts the rest, so a client that
/// repeats a bad message cannot flood the log.
#[derive(Debug, Default)]
pub(crate) struct RateLimit {
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimit {
    /// `Some(lines suppressed since the last one)` when a line may be logged.
    pub(crate) fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// The listening socket's keeper (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Door {
    state: Mutex<DoorState>,
    cv: Condvar,
}

#[derive(Debug, Default)]
struct DoorState {
    /// A connection was handed to the control thread and is being served
    /// (its `owner` is set once its `Conn` exists).
    serving: bool,
    /// The connection being served.
    owner: Option<Arc<Conn>>,
    /// A connection accepted for the control thread to serve next.
    pending: Option<UnixStream>,
    refusals: RateLimit,
    stopped: bool,
}

impl Door {
    /// The door thread: accepts until `stop`, then shuts the served
    /// connection down.
    pub(crate) fn run(&self, listener: &UnixListener, stop: &AtomicBool) {
        let mut errors = RateLimit::default();
        // Refused connections stay open a moment, so their VERSION is sent
        // and our EBUSY reply read rather than their send failing with EPIPE;
        // at most a few, so refused clients cannot pile up fds.
        let mut lingering: VecDeque<(UnixStream, Instant)> = VecDeque::new();
        while !stop.load(Ordering::Relaxed) {
            while lingering
                .front()
                .is_some_and(|(_, t)| t.elapsed() >= REFUSED_LINGER)
            {
                lingering.pop_front();
            }
            match wait_readable(listener, Some(STOP_POLL)) {
                Ok(false) => continue,
                Ok(true) => {}
                Err(e) => {
                    tracing::error!(error = %e, "polling the vfio-user socket");
                    std::thread::sleep(STOP_POLL);
                    continue;
                }
            }
            match listener.accept() {
                Ok((stream, _)) => {
                    if let Some(refused) = self.offer(stream) {
                        if lingering.len() >= MAX_LINGERING {
                            lingering.pop_front();
                        }
                        lingering.push_back((refused, Instant::now()));
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                    ) => {}
                Err(e) => {
                    // E.g. EMFILE: keep serving the client we have; retry later.
                    if let Some(suppressed) = errors.allow() {
                        tracing::warn!(error = %e, suppressed, "accepting a vfio-user connection");
                    }
                    std::thread::sleep(STOP_POLL);
                }
            }
        }
        let mut st = self.state.lock();
        st.stopped = true;
        st.pending = None;
        if let Some(owner) = &st.owner {
            owner.shutdown();
        }
        self.cv.notify_all();
    }

    /// A new connection: the next to be served if the device is free (or
    /// its owner has already hung up and is being torn down), else refused
    /// and given back.
    fn offer(&self, stream: UnixStream) -> Option<UnixStream> {
        let mut st = self.state.lock();
        let free = st.pending.is_none()
            && (!st.serving || st.owner.as_ref().is_some_and(|c| c.peer_gone()));
        if free {
            st.pending = Some(stream);
            self.cv.notify_all();
            return None;
        }
        let log = st.refusals.allow();
        drop(st);
        if let Some(suppressed) = log {
            tracing::warn!(
                suppressed,
                "refused a vfio-user connection: the device is in use by another client \
                 (one client at a time)"
            );
        }
        refuse(&stream);
        Some(stream)
    }

    /// Waits for the next connection to serve; None once stopped.
    pub(crate) fn next(&self, stop: &AtomicBool) -> Option<UnixStream> {
        let mut st = self.state.lock();
        loop {
            if st.stopped || stop.load(Ordering::Relaxed) {
                return None;
            }
            if let Some(s) = st.pending.take() {
                st.serving = true;
                return Some(s);
            }
            self.cv.wait_for(&mut st, STOP_POLL);
        }
    }

    /// The served connection, once it exists; None when it is done with.
    pub(crate) fn set_owner(&self, conn: Option<Arc<Conn>>) {
        let mut st = self.state.lock();
        st.serving = conn.is_some();
        if st.stopped {
            if let Some(c) = &conn {
                c.shutdown();
            }
        }
        st.owner = conn;
    }
}

/// Answers a connection we will not serve: an EBUSY reply to the VERSION it
/// is about to send (message id 0, the first a client uses), sent without
/// waiting; the caller closes the socket a little later.
fn refuse(stream: &UnixStream) {
    let req = Header {
        msg_id: 0,
        command: cmd::VERSION,
        ..Default::default()
    };
    let mut reply = error_header(&req, libc::EBUSY);
    reply.msg_size = HEADER_SIZE as u32;
    let _ = rustix::net::send(
        stream.as_fd(),
        reply.as_bytes(),
        rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL,
    );
}
