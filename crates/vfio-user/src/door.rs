//! The door: what keeps a server's listening socket. It hands a
//! connection to the control thread when the device is free (or its owner
//! has hung up and is being torn down), refuses every other one at once
//! with an EBUSY reply to its VERSION, and on stop shuts the served
//! connection down, so no blocked send or wait outlives the stop. One
//! thread keeps the doors of every server in a process that has many
//! ([`Door::watch_all`]): doors never wait on a client, so they need no
//! thread each.
//!
//! A served connection that has not sent VERSION yet does not hold the
//! device against a client that does: connections that arrive meanwhile
//! wait at the door (a few, the oldest dropped for a newer one), and the
//! first of them to speak displaces the silent one. So a connection that
//! says nothing (a port scanner, a stuck launcher) cannot keep QEMU out
//! until its handshake deadline.

use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use zerocopy::IntoBytes;

use crate::conn::{error_header, Bell, Conn};
use crate::stop::StopWake;
use crate::wire::{cmd, Header, HEADER_SIZE};

/// How often a blocked server looks at its `stop` flag.
pub(crate) const STOP_POLL: Duration = Duration::from_millis(100);
/// How long a refused connection is kept open, and how many at most.
const REFUSED_LINGER: Duration = Duration::from_secs(1);
const MAX_LINGERING: usize = 16;
/// Connections waiting at the door while the served one is silent.
const MAX_CHALLENGERS: usize = 4;

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

/// The listening socket's keeper (see the module docs). Its thread is
/// [`Door::watch_all`], which may keep the doors of many servers in one
/// process; each server's control thread takes its connections with
/// [`Server::serve_door`](crate::Server::serve_door).
#[derive(Debug, Default)]
pub struct Door {
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
    /// Rung with every notify: the thread that serves many doors' clients
    /// waits in epoll, not on the condition variable.
    bell: Option<Arc<Bell>>,
}

/// What the watching thread keeps for one door between its waits.
struct Watch<'a> {
    door: &'a Door,
    listener: &'a UnixListener,
    lingering: Lingering,
    challengers: VecDeque<UnixStream>,
    errors: RateLimit,
    /// After an accept error (e.g. EMFILE) the listener is left out of the
    /// wait until then, instead of the thread sleeping: the other doors it
    /// keeps are not held up, and a listener that stays readable does not
    /// spin.
    paused_until: Option<Instant>,
}

impl Door {
    /// The thread that keeps `doors` (each with its listening socket, set
    /// non-blocking here): accepts until `stop` (looked at every
    /// 100 ms, or when `wake` wakes), then shuts each served
    /// connection down. One poll covers every listener and every waiting
    /// connection, and no door's work waits on a client (accepts and
    /// refusals never block), so one slow or hostile client holds up no
    /// other door. Waits that end with nothing to do count in `idle`.
    pub fn watch_all(
        doors: &[(&Door, &UnixListener)],
        stop: &AtomicBool,
        wake: Option<&StopWake>,
        idle: &AtomicU64,
    ) {
        let mut watches: Vec<Watch<'_>> = doors
            .iter()
            .map(|&(door, listener)| {
                if let Err(e) = listener.set_nonblocking(true) {
                    // Then an accept may block this thread; every other
                    // call on it has already succeeded on our own socket.
                    tracing::error!(error = %e, "making a vfio-user listener non-blocking");
                }
                Watch {
                    door,
                    listener,
                    lingering: Lingering::default(),
                    challengers: VecDeque::new(),
                    errors: RateLimit::default(),
                    paused_until: None,
                }
            })
            .collect();
        while !stop.load(Ordering::Relaxed) {
            let now = Instant::now();
            // Without a wake, the flag is looked at every stop poll; either
            // way the first lingering connection is closed when due.
            let mut timeout = wake.is_none().then_some(STOP_POLL);
            for w in &mut watches {
                w.lingering.expire();
                // A wait may have ended: the owner spoke, or left.
                w.door.settle(&mut w.challengers, &mut w.lingering);
                if w.paused_until.is_some_and(|t| t <= now) {
                    w.paused_until = None;
                }
                let due = [
                    w.lingering.next_due(),
                    w.paused_until.map(|t| t.saturating_duration_since(now)),
                ];
                for d in due.into_iter().flatten() {
                    timeout = Some(timeout.map_or(d, |t| t.min(d)));
                }
            }
            let spoke = match wait_any(&watches, wake, timeout) {
                Ok(ready) => ready,
                Err(e) => {
                    tracing::error!(error = %e, "polling the vfio-user sockets");
                    std::thread::sleep(STOP_POLL);
                    continue;
                }
            };
            let busy = spoke.woken || spoke.doors.iter().any(|(l, c)| *l || !c.is_empty());
            if !busy {
                idle.fetch_add(1, Ordering::Relaxed);
            }
            for (w, (listener, challengers)) in watches.iter_mut().zip(spoke.doors) {
                w.handle(listener, challengers);
            }
        }
        for w in &watches {
            w.door.close();
        }
    }

    /// Stopped: no connection is handed over any more, and the served one
    /// is shut down (which ends its control thread's wait).
    fn close(&self) {
        let mut st = self.state.lock();
        st.stopped = true;
        st.pending = None;
        if let Some(owner) = &st.owner {
            owner.shutdown();
        }
        self.notify(&st);
    }

    /// A new connection: the next to be served if the device is free (or
    /// its owner has already hung up and is being torn down); left to wait
    /// if the owner has not sent VERSION yet; else refused.
    fn offer(&self, stream: UnixStream) -> Offer {
        let mut st = self.state.lock();
        if st.is_free() {
            st.pending = Some(stream);
            self.notify(&st);
            return Offer::Taken;
        }
        if st.pending.is_none() && !st.owner_negotiated() {
            return Offer::Wait(stream);
        }
        drop(st);
        Offer::Refused(self.refuse(stream))
    }

    /// Waiting connections once the owner has left (the oldest is served
    /// next) or has completed VERSION (they are refused).
    fn settle(&self, challengers: &mut VecDeque<UnixStream>, lingering: &mut Lingering) {
        if challengers.is_empty() {
            return;
        }
        let mut st = self.state.lock();
        if st.is_free() {
            st.pending = challengers.pop_front();
            self.notify(&st);
        } else if st.pending.is_some() || st.owner_negotiated() {
            drop(st);
            for c in challengers.drain(..) {
                lingering.add(self.refuse(c));
            }
        }
    }

    /// A waiting connection that spoke: it takes the place of an owner that
    /// still has not sent VERSION, whose connection is shut down; refused
    /// (and given back) if the owner has meanwhile.
    fn displace(&self, stream: UnixStream) -> Option<UnixStream> {
        let mut st = self.state.lock();
        if st.pending.is_none() && (st.is_free() || !st.owner_negotiated()) {
            if let Some(silent) = st.owner.clone() {
                silent.shutdown();
                if let Some(suppressed) = st.refusals.allow() {
                    tracing::warn!(
                        suppressed,
                        "dropped a vfio-user connection that had not sent VERSION for one that did"
                    );
                }
            }
            st.pending = Some(stream);
            self.notify(&st);
            return None;
        }
        drop(st);
        Some(self.refuse(stream))
    }

    /// Refuses `stream` (logged at most once a second) and gives it back,
    /// to be closed a moment later.
    fn refuse(&self, stream: UnixStream) -> UnixStream {
        let log = self.state.lock().refusals.allow();
        if let Some(suppressed) = log {
            tracing::warn!(
                suppressed,
                "refused a vfio-user connection: the device is in use by another client \
                 (one client at a time)"
            );
        }
        refuse(&stream);
        stream
    }

    /// The next connection to serve; `None` on stop, or when `asked()`
    /// (a handover while no client is connected), both looked at every
    /// `poll` (`None`: only when the door thread notifies, as it does on
    /// stop).
    pub(crate) fn next(
        &self,
        stop: &AtomicBool,
        asked: &dyn Fn() -> bool,
        poll: Option<Duration>,
    ) -> Option<UnixStream> {
        let mut st = self.state.lock();
        loop {
            if st.stopped || stop.load(Ordering::Relaxed) || asked() {
                return None;
            }
            if let Some(s) = st.pending.take() {
                st.serving = true;
                return Some(s);
            }
            match poll {
                Some(t) => {
                    self.cv.wait_for(&mut st, t);
                }
                None => self.cv.wait(&mut st),
            }
        }
    }

    fn notify(&self, st: &DoorState) {
        self.cv.notify_all();
        if let Some(bell) = &st.bell {
            bell.ring();
        }
    }

    /// Rings `bell` whenever a connection is ready to be taken with
    /// [`Door::try_next`], and on stop.
    pub(crate) fn set_bell(&self, bell: Arc<Bell>) {
        self.state.lock().bell = Some(bell);
    }

    /// The next connection to serve if one is ready, without waiting;
    /// `Err(())` once the door is closed (stopped).
    pub(crate) fn try_next(&self) -> Result<Option<UnixStream>, ()> {
        let mut st = self.state.lock();
        if st.stopped {
            return Err(());
        }
        let next = st.pending.take();
        if next.is_some() {
            st.serving = true;
        }
        Ok(next)
    }

    /// The served connection, once it exists; None when it is done with.
    pub(crate) fn set_owner(&self, conn: Option<Arc<Conn>>) {
        let mut st = self.state.lock();
        st.serving = conn.is_some();
        // A connection waiting at the door spoke before this one was even
        // framed: it has been displaced already.
        if st.stopped || st.pending.is_some() {
            if let Some(c) = &conn {
                c.shutdown();
            }
        }
        st.owner = conn;
    }
}

impl Watch<'_> {
    /// What one wait found for this door: a connection on its listener,
    /// and `spoke`, waiting connections that sent something (index, and
    /// whether it hung up instead).
    fn handle(&mut self, listener: bool, spoke: Vec<(usize, bool)>) {
        // Taken out newest first (the indexes stay valid), then offered
        // oldest first: the first to speak takes a silent owner's place.
        let mut spoken: Vec<_> = spoke
            .into_iter()
            .rev()
            .filter_map(|(i, hung_up)| Some((self.challengers.remove(i)?, hung_up)))
            .collect();
        spoken.reverse();
        for (stream, hung_up) in spoken {
            if hung_up {
                continue;
            }
            if let Some(refused) = self.door.displace(stream) {
                self.lingering.add(refused);
            }
        }
        if !listener {
            return;
        }
        match self.listener.accept() {
            Ok((stream, _)) => match self.door.offer(stream) {
                Offer::Taken => {}
                Offer::Refused(stream) => self.lingering.add(stream),
                Offer::Wait(stream) => {
                    if self.challengers.len() >= MAX_CHALLENGERS {
                        self.challengers.pop_front();
                    }
                    self.challengers.push_back(stream);
                }
            },
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) => {}
            Err(e) => {
                // E.g. EMFILE: keep serving the client we have; retry later.
                if let Some(suppressed) = self.errors.allow() {
                    tracing::warn!(error = %e, suppressed, "accepting a vfio-user connection");
                }
                self.paused_until = Some(Instant::now() + STOP_POLL);
            }
        }
    }
}

/// Refused connections, kept open a moment so their VERSION is sent and
/// our EBUSY reply read rather than their send failing with EPIPE; at most
/// a few, so refused clients cannot pile up fds.
#[derive(Default)]
struct Lingering(VecDeque<(UnixStream, Instant)>);

impl Lingering {
    fn add(&mut self, refused: UnixStream) {
        if self.0.len() >= MAX_LINGERING {
            self.0.pop_front();
        }
        self.0.push_back((refused, Instant::now()));
    }

    /// How long until the oldest is closed.
    fn next_due(&self) -> Option<Duration> {
        self.0
            .front()
            .map(|(_, t)| REFUSED_LINGER.saturating_sub(t.elapsed()))
    }

    fn expire(&mut self) {
        while self
            .0
            .front()
            .is_some_and(|(_, t)| t.elapsed() >= REFUSED_LINGER)
        {
            self.0.pop_front();
        }
    }
}

/// What [`Door::offer`] did with a new connection.
enum Offer {
    /// To be served next.
    Taken,
    /// Refused: to be closed a moment later.
    Refused(UnixStream),
    /// To wait: the owner has not sent VERSION.
    Wait(UnixStream),
}

impl DoorState {
    /// No connection is being served, or the served one has hung up and
    /// is being torn down.
    fn is_free(&self) -> bool {
        self.pending.is_none()
            && (!self.serving || self.owner.as_ref().is_some_and(|c| c.peer_gone()))
    }

    /// The served connection has completed VERSION (one handed over but
    /// not yet framed has not).
    fn owner_negotiated(&self) -> bool {
        self.owner.as_ref().is_some_and(|c| c.negotiated())
    }
}

/// What [`wait_any`] found readable.
struct Ready {
    /// The stop wake.
    woken: bool,
    /// Per door: whether its listener has a connection, and the indexes
    /// of its waiting connections that sent something, each with whether
    /// it hung up instead.
    doors: Vec<(bool, Vec<(usize, bool)>)>,
}

/// Waits up to `timeout` (`None`: without end) for a connection on a
/// listener (but those paused), bytes (or a hang-up) on a waiting
/// connection, or `wake`.
fn wait_any(
    watches: &[Watch<'_>],
    wake: Option<&StopWake>,
    timeout: Option<Duration>,
) -> std::io::Result<Ready> {
    use rustix::event::{PollFd, PollFlags};
    let mut fds = Vec::new();
    for w in watches {
        // A paused listener is polled for nothing: it keeps its place.
        let flags = match w.paused_until {
            Some(_) => PollFlags::empty(),
            None => PollFlags::IN,
        };
        fds.push(PollFd::new(w.listener, flags));
        fds.extend(
            w.challengers
                .iter()
                .map(|c| PollFd::new(c, PollFlags::IN | PollFlags::RDHUP)),
        );
    }
    if let Some(w) = wake {
        fds.push(PollFd::from_borrowed_fd(w.fd(), PollFlags::IN));
    }
    crate::conn::poll(&mut fds, timeout)?;
    let gone = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR;
    let mut doors = Vec::with_capacity(watches.len());
    let mut at = 0;
    for w in watches {
        let listener = fds[at].revents().contains(PollFlags::IN);
        let first = at + 1;
        at = first + w.challengers.len();
        let spoke = fds[first..at]
            .iter()
            .enumerate()
            .filter(|(_, f)| !f.revents().is_empty())
            .map(|(i, f)| (i, f.revents().intersects(gone)))
            .collect();
        doors.push((listener, spoke));
    }
    let woken = wake.is_some() && fds.get(at).is_some_and(|f| !f.revents().is_empty());
    Ok(Ready { woken, doors })
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
