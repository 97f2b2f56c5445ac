//! Message framing over a Unix stream socket (with SCM_RIGHTS), shared by the
//! server and the client.
//!
//! Both ends of a vfio-user connection receive requests *and* replies on the
//! same socket (we do not negotiate twin-socket mode). [`Conn`] therefore uses a
//! leader/follower receive scheme: any thread that waits for something (the
//! control thread for the next command, a device worker for the reply to its
//! DMA_READ, a client thread for its reply) becomes the socket's reader if no
//! other thread is reading, reads exactly one message, files it (replies by
//! message id for the thread waiting on it, requests in a queue) and hands the
//! reader role back. So a worker never needs the control thread to be free to
//! get its reply, and the control thread can itself issue DMA requests while
//! handling a command without deadlocking.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::{self, IoSlice};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use zerocopy::IntoBytes;

use crate::wire::{flags, Header, HEADER_SIZE};
use crate::Error;

mod pump;
mod staged;

pub(crate) use pump::Bell;
use pump::{Outbox, Partial, Step};
pub use staged::ReplyPipe;

/// Most messages one [`Conn::pump`] takes in before it lets the thread
/// turn to other connections.
const PUMP_BATCH: usize = 64;

/// Maximum number of fds accepted in one message; more are closed and the
/// message is answered with EINVAL.
pub const MAX_MSG_FDS: usize = 16;
/// Maximum `count` of one REGION/DMA read or write (also the default of the spec).
pub const MAX_DATA_XFER_SIZE: usize = 1 << 20;
/// Largest message accepted: a full data transfer plus its fixed parts.
pub const MAX_MSG_SIZE: usize = HEADER_SIZE + 64 + MAX_DATA_XFER_SIZE;
/// How long a message, once its first byte has arrived, may take to arrive
/// whole (the default of
/// [`ServerOptions::message_timeout`](crate::ServerOptions::message_timeout));
/// also how long a peer that does not read may keep us from sending one. A
/// deadline per message, not per read: a peer that sends one byte every few
/// seconds is dropped all the same.
pub const MESSAGE_TIMEOUT: Duration = Duration::from_secs(5);
/// Past this many unprocessed incoming requests, threads that only wait for a
/// reply stop reading, so a flooding peer cannot grow the queue without bound.
const MAX_QUEUED_REQUESTS: usize = 256;

/// One received message.
#[derive(Debug)]
pub struct Message {
    pub header: Header,
    pub payload: Vec<u8>,
    pub fds: Vec<OwnedFd>,
    /// More fds were sent than [`MAX_MSG_FDS`]; the extra ones were closed.
    pub fds_truncated: bool,
}

#[derive(Debug, Default)]
struct RecvState {
    reader_busy: bool,
    waiting: HashSet<u16>,
    replies: HashMap<u16, Message>,
    requests: VecDeque<Message>,
    closed: bool,
    /// The error that closed the connection, for the control thread.
    fatal: Option<Error>,
    /// Replies no one waited for (dropped): a server that answers a
    /// message twice shows here.
    unexpected: u64,
}

/// A framed, thread-safe vfio-user connection.
#[derive(Debug)]
pub struct Conn {
    stream: UnixStream,
    /// See [`MESSAGE_TIMEOUT`].
    message_timeout: Duration,
    /// Held for a whole send, so concurrent senders never interleave; with
    /// [`Conn::pumped`], what the socket had no room for yet.
    send_lock: Mutex<Outbox>,
    /// Set for a connection read without blocking (see [`Conn::pumped`],
    /// [`Conn::pump_with`]).
    pumped: OnceLock<Pumped>,
    state: Mutex<RecvState>,
    cv: Condvar,
    next_id: AtomicU16,
    /// The peer completed the VERSION exchange (server side).
    negotiated: AtomicBool,
    /// Where replies wait until [`Conn::send_staged`] (a supervised
    /// server, see `conn/staged.rs`).
    staging: OnceLock<Arc<ReplyPipe>>,
}

/// What a connection served among many keeps (see `conn/pump.rs`).
#[derive(Debug)]
struct Pumped {
    /// The message under way; used by whoever holds the reader role.
    partial: Mutex<Partial>,
    /// Rung when a thread other than the serving one has read (it may have
    /// filed requests, or left bytes the serving thread's event missed).
    bell: Arc<Bell>,
}

/// What a waiting thread takes out of the receive state.
pub enum Wanted {
    /// The reply to our message id.
    Reply(u16),
    /// The next request.
    Request,
    /// Our reply, or any request (client side: requests are served inline).
    ReplyOrRequest(u16),
}

impl Conn {
    /// Frames `stream` (blocking mode: reads wait with poll, so an idle peer
    /// is never dropped; a started message must arrive whole within
    /// `message_timeout`, and a send may block that long).
    pub fn new(stream: UnixStream, message_timeout: Duration) -> io::Result<Self> {
        stream.set_nonblocking(false)?;
        stream.set_read_timeout(None)?;
        stream.set_write_timeout(Some(message_timeout))?;
        Ok(Self {
            stream,
            message_timeout,
            send_lock: Mutex::default(),
            pumped: OnceLock::new(),
            state: Mutex::new(RecvState::default()),
            cv: Condvar::new(),
            next_id: AtomicU16::new(0),
            negotiated: AtomicBool::new(false),
            staging: OnceLock::new(),
        })
    }

    /// Frames `stream` for a thread that serves many connections
    /// (`server/hub.rs`): the socket is non-blocking, that thread reads it
    /// with [`Conn::pump`] when epoll says so and sends what waits with
    /// [`Conn::flush`]; a send the socket has no room for is queued (at
    /// most `pump::MAX_QUEUED_SENDS`, else the connection is closed). A
    /// thread waiting for a reply reads the socket itself while that
    /// thread does not, and rings `bell` when it has.
    pub(crate) fn pumped(
        stream: UnixStream,
        message_timeout: Duration,
        bell: Arc<Bell>,
    ) -> io::Result<Self> {
        let conn = Self::new(stream, message_timeout)?;
        conn.pump_with(bell)?;
        Ok(conn)
    }

    /// Makes a connection made with [`Conn::new`] one read as
    /// [`Conn::pumped`] is: a client a live upgrade's old process handed
    /// over, adopted by a thread that serves many (`server/hub.rs`). Before
    /// anything else reads or writes it (the adopting thread has not
    /// started serving it, and the device's workers wait for no reply from
    /// a client they never sent a request to).
    pub(crate) fn pump_with(&self, bell: Arc<Bell>) -> io::Result<()> {
        self.stream.set_nonblocking(true)?;
        // Set once: a second call keeps the first bell.
        let _ = self.pumped.set(Pumped {
            partial: Mutex::default(),
            bell,
        });
        Ok(())
    }

    /// Whether replies wait for room in the socket (a [`Conn::pumped`]
    /// connection): a handover passes the socket only once they are sent.
    pub(crate) fn has_unsent(&self) -> bool {
        self.send_lock.lock().holds()
    }

    /// Reads what has arrived (a [`Conn::pumped`] connection, without
    /// waiting), filing whole messages as [`Conn::wait`] does. `Ok(true)`:
    /// it stopped after a batch and more may wait (edge-triggered epoll
    /// will not say so again). Another thread reading it meanwhile rings
    /// the bell when done, so nothing is missed.
    pub(crate) fn pump(&self) -> Result<bool, Error> {
        let Some(p) = self.pumped.get() else {
            return Ok(false);
        };
        {
            let mut st = self.state.lock();
            if st.closed {
                return Err(st.fatal.take().unwrap_or(Error::Disconnected));
            }
            if st.reader_busy {
                return Ok(false);
            }
            st.reader_busy = true;
        }
        let mut partial = p.partial.lock();
        let mut got = Vec::new();
        let res = loop {
            if got.len() == PUMP_BATCH {
                break Ok(true);
            }
            match partial.step(&self.stream) {
                Ok(Step::Message(m)) => got.push(m),
                Ok(Step::Drained) => break Ok(false),
                Err(e) => break Err(e),
            }
        };
        drop(partial);
        let mut st = self.state.lock();
        st.reader_busy = false;
        for m in got {
            file_message(&mut st, m);
        }
        if res.is_err() {
            st.closed = true;
        }
        self.cv.notify_all();
        res
    }

    /// The next request filed, if any.
    pub(crate) fn take_request(&self) -> Option<Message> {
        self.state.lock().requests.pop_front()
    }

    /// When the message under way must be whole (a [`Conn::pumped`]
    /// connection), if one is under way.
    pub(crate) fn message_deadline(&self) -> Option<Instant> {
        let p = self.pumped.get()?;
        // The reader role's holder has it: its own wait is bounded.
        let partial = p.partial.try_lock()?;
        partial.deadline(self.message_timeout)
    }

    /// Sends what waits for room in the socket (a [`Conn::pumped`]
    /// connection); an error shuts the connection down.
    pub(crate) fn flush(&self) -> Result<(), Error> {
        let res = self.send_lock.lock().flush(&self.stream);
        if res.is_err() {
            self.shutdown();
        }
        res
    }

    /// The peer has closed or shut down its end (or we shut ours down):
    /// nothing more will come. Does not consume anything.
    pub fn peer_gone(&self) -> bool {
        if self.state.lock().closed {
            return true;
        }
        let mut pfd = [PollFd::new(&self.stream, PollFlags::RDHUP)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match rustix::event::poll(&mut pfd, Some(&zero)) {
            Ok(0) => false,
            Ok(_) => pfd[0]
                .revents()
                .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR),
            Err(_) => true,
        }
    }

    /// The socket, for a handover to pass on (between two messages).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.stream)
    }

    /// Marks the VERSION exchange done: from now on the peer is a client
    /// that keeps the device, not a connection that may be displaced.
    pub fn set_negotiated(&self) {
        self.negotiated.store(true, Ordering::Release);
    }

    /// Whether [`Conn::set_negotiated`] was called.
    pub fn negotiated(&self) -> bool {
        self.negotiated.load(Ordering::Acquire)
    }

    pub fn next_msg_id(&self) -> u16 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Closes the connection: wakes every waiter and makes the peer see EOF.
    pub fn shutdown(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        let mut st = self.state.lock();
        st.closed = true;
        st.replies.clear();
        st.requests.clear();
        self.cv.notify_all();
    }

    /// How many replies arrived that no one waited for (and were dropped).
    pub fn unexpected_replies(&self) -> u64 {
        self.state.lock().unexpected
    }

    /// From now on replies without fds wait in `pipe` until
    /// [`Conn::send_staged`] (see `conn/staged.rs`).
    pub fn stage_replies(&self, pipe: Arc<ReplyPipe>) {
        // Set once per connection: a second call keeps the first pipe.
        let _ = self.staging.set(pipe);
    }

    /// Sends the staged replies, what a dead server left included.
    pub fn send_staged(&self) -> Result<(), Error> {
        let Some(pipe) = self.staging.get().filter(|p| p.holds()) else {
            return Ok(());
        };
        let guard = self.send_lock.lock();
        let sent = pipe.send(self.fd());
        drop(guard);
        sent.map_err(|e| {
            // A partial message would desynchronise the stream for good.
            self.shutdown();
            Error::Io(e)
        })
    }

    /// Sends one message whole (header, payload parts, fds) under the send
    /// lock, so concurrent senders never interleave; a reply is staged
    /// instead where [`Conn::stage_replies`] asked and it can be.
    pub fn send(
        &self,
        header: &Header,
        parts: &[&[u8]],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), Error> {
        let total = HEADER_SIZE + parts.iter().map(|p| p.len()).sum::<usize>();
        if total > MAX_MSG_SIZE || fds.len() > MAX_MSG_FDS {
            return Err(Error::TooLarge(total));
        }
        let mut header = *header;
        // Out of u32 range is the conversion's only failure; `total` says it.
        header.msg_size = u32::try_from(total).map_err(|_| Error::TooLarge(total))?;
        // Header plus up to three parts without allocating (the posted
        // doorbell path); more parts are joined.
        let joined: Vec<u8>;
        let mut slices: [&[u8]; 4] = [header.as_bytes(), &[], &[], &[]];
        if parts.len() <= 3 {
            for (slot, p) in slices[1..].iter_mut().zip(parts) {
                *slot = p;
            }
        } else {
            joined = parts.concat();
            slices[1] = &joined;
        }
        if header.flags & flags::TYPE_MASK == flags::TYPE_REPLY && fds.is_empty() {
            if let Some(pipe) = self.staging.get().filter(|p| p.fits(total)) {
                return pipe.stage(&slices).map_err(|e| {
                    self.shutdown();
                    Error::Io(e)
                });
            }
        }
        let mut guard = self.send_lock.lock();
        if self.pumped.get().is_some() {
            let res = guard.send(&self.stream, &slices, total, fds);
            drop(guard);
            return match res {
                Ok(Ok(())) => Ok(()),
                Ok(Err(over)) => {
                    tracing::warn!(
                        messages = over.messages,
                        bytes = over.bytes,
                        "closing a vfio-user connection that does not read its replies: \
                         too many wait for room in its socket"
                    );
                    self.shutdown();
                    Err(Error::Protocol(format!(
                        "peer does not read: {} messages ({} bytes) waiting to be sent",
                        over.messages, over.bytes
                    )))
                }
                Err(e) => {
                    // A partial message would desynchronise the stream for good.
                    self.shutdown();
                    Err(e)
                }
            };
        }
        let mut sent = 0usize;
        while sent < total {
            let (iov, n_iov) = unsent(&slices, sent);
            let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_MSG_FDS))];
            let mut control = SendAncillaryBuffer::new(&mut space);
            // The fds travel with the first byte of the message.
            if sent == 0 && !fds.is_empty() {
                control.push(SendAncillaryMessage::ScmRights(fds));
            }
            match rustix::net::sendmsg(
                &self.stream,
                &iov[..n_iov],
                &mut control,
                SendFlags::NOSIGNAL,
            ) {
                Ok(n) => sent += n,
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => {
                    // A partial message would desynchronise the stream for good.
                    drop(guard);
                    self.shutdown();
                    return Err(Error::Io(e.into()));
                }
            }
        }
        Ok(())
    }

    /// Registers interest in the reply to `msg_id`; call before sending the
    /// request so a fast reply is not dropped.
    pub fn expect_reply(&self, msg_id: u16) {
        let mut st = self.state.lock();
        st.waiting.insert(msg_id);
        st.replies.remove(&msg_id);
    }

    /// Drops interest in `msg_id` (after a timeout or an error).
    pub fn forget_reply(&self, msg_id: u16) {
        let mut st = self.state.lock();
        st.waiting.remove(&msg_id);
        st.replies.remove(&msg_id);
    }

    /// Waits for what `wanted` names, until `deadline` (None: forever).
    /// Returns `Ok(None)` on timeout.
    pub fn wait(
        &self,
        wanted: &Wanted,
        deadline: Option<Instant>,
    ) -> Result<Option<Message>, Error> {
        self.wait_or_wake(wanted, deadline, None)
    }

    /// As [`wait`](Self::wait), also returning `Ok(None)` as soon as `wake`
    /// is readable, if this thread is the one reading the socket (another
    /// reader, a worker waiting for a DMA reply, ends the wait only at the
    /// deadline or with a message).
    pub fn wait_or_wake(
        &self,
        wanted: &Wanted,
        deadline: Option<Instant>,
        wake: Option<BorrowedFd<'_>>,
    ) -> Result<Option<Message>, Error> {
        let mut st = self.state.lock();
        loop {
            let taken = match *wanted {
                Wanted::Reply(id) => take_reply(&mut st, id),
                Wanted::Request => st.requests.pop_front(),
                Wanted::ReplyOrRequest(id) => {
                    take_reply(&mut st, id).or_else(|| st.requests.pop_front())
                }
            };
            if let Some(msg) = taken {
                return Ok(Some(msg));
            }
            if st.closed {
                if matches!(wanted, Wanted::Request) {
                    if let Some(e) = st.fatal.take() {
                        return Err(e);
                    }
                }
                return Err(Error::Disconnected);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let may_read =
                matches!(wanted, Wanted::Request) || st.requests.len() < MAX_QUEUED_REQUESTS;
            if !st.reader_busy && may_read {
                st.reader_busy = true;
                drop(st);
                let timeout = deadline.map(|d| d.saturating_duration_since(now));
                if let Some(p) = self.pumped.get() {
                    let res = self.read_pumped(p, timeout, wake);
                    st = self.state.lock();
                    st.reader_busy = false;
                    let woken = matches!(res, Ok(ref got) if got.is_empty());
                    match res {
                        Ok(got) => got.into_iter().for_each(|m| file_message(&mut st, m)),
                        Err(e) => {
                            st.closed = true;
                            st.fatal = Some(e);
                        }
                    }
                    // The serving thread looks at what was filed, and reads
                    // what came after our last read.
                    p.bell.ring();
                    self.cv.notify_all();
                    if woken && wake.is_some() {
                        return Ok(None);
                    }
                    continue;
                }
                let res = read_message(&self.stream, timeout, self.message_timeout, wake);
                st = self.state.lock();
                st.reader_busy = false;
                match res {
                    Ok(Some(msg)) => file_message(&mut st, msg),
                    Ok(None) if wake.is_some() => {
                        // Timed out or woken: either way the caller looks.
                        self.cv.notify_all();
                        return Ok(None);
                    }
                    Ok(None) => {}
                    Err(e) => {
                        // The owner shuts the socket down (the server may
                        // still answer an oversized message first).
                        st.closed = true;
                        st.fatal = Some(e);
                    }
                }
                self.cv.notify_all();
            } else {
                match deadline {
                    Some(d) => {
                        self.cv.wait_until(&mut st, d);
                    }
                    None => self.cv.wait(&mut st),
                }
            }
        }
    }
}

impl Conn {
    /// A waiting thread's read of a [`Conn::pumped`] connection: waits up
    /// to `timeout` for bytes (or `wake`), then takes what has arrived.
    /// A message under way stays in the buffer for the next reader; the
    /// serving thread holds it to its deadline.
    fn read_pumped(
        &self,
        p: &Pumped,
        timeout: Option<Duration>,
        wake: Option<BorrowedFd<'_>>,
    ) -> Result<Vec<Message>, Error> {
        let mut pfd = vec![PollFd::new(&self.stream, PollFlags::IN)];
        if let Some(w) = &wake {
            pfd.push(PollFd::from_borrowed_fd(*w, PollFlags::IN));
        }
        poll(&mut pfd, timeout).map_err(|e| Error::Io(e.into()))?;
        let mut got = Vec::new();
        let mut partial = p.partial.lock();
        while got.len() < PUMP_BATCH {
            match partial.step(&self.stream)? {
                Step::Message(m) => got.push(m),
                Step::Drained => break,
            }
        }
        Ok(got)
    }
}

fn take_reply(st: &mut RecvState, id: u16) -> Option<Message> {
    let msg = st.replies.remove(&id)?;
    st.waiting.remove(&id);
    Some(msg)
}

fn file_message(st: &mut RecvState, msg: Message) {
    if msg.header.is_reply() {
        if st.waiting.contains(&msg.header.msg_id) {
            st.replies.insert(msg.header.msg_id, msg);
        } else {
            st.unexpected += 1;
            tracing::debug!(msg_id = msg.header.msg_id, "dropping unexpected reply");
        }
    } else {
        st.requests.push_back(msg);
    }
}

/// Reads one whole message. `Ok(None)`: nothing arrived within `timeout`.
/// Once the first byte is in, the rest must follow within `message_timeout`.
fn read_message(
    stream: &UnixStream,
    timeout: Option<Duration>,
    message_timeout: Duration,
    wake: Option<BorrowedFd<'_>>,
) -> Result<Option<Message>, Error> {
    let readable = match wake {
        None => wait_readable(stream, timeout)?,
        Some(wake) => {
            let mut pfd = [
                PollFd::new(stream, PollFlags::IN),
                PollFd::new(&wake, PollFlags::IN),
            ];
            poll(&mut pfd, timeout).map_err(|e| Error::Io(e.into()))?;
            !pfd[0].revents().is_empty()
        }
    };
    if !readable {
        return Ok(None);
    }
    let mut rx = Receiver {
        stream,
        deadline: Instant::now() + message_timeout,
        fds: Vec::new(),
        fds_truncated: false,
    };
    let mut hbuf = [0u8; HEADER_SIZE];
    let got = rx.fill(&mut hbuf, true)?;
    if got == 0 {
        return Err(Error::Disconnected);
    }
    if got < HEADER_SIZE {
        return Err(Error::Protocol(format!("truncated header ({got} bytes)")));
    }
    let (header, mut payload) = header_and_room(&hbuf)?;
    let got = rx.fill(&mut payload, false)?;
    if got < payload.len() {
        return Err(Error::Protocol(format!(
            "truncated message: {got} of {} payload bytes",
            payload.len()
        )));
    }
    Ok(Some(Message {
        header,
        payload,
        fds: rx.fds,
        fds_truncated: rx.fds_truncated,
    }))
}

/// A whole header checked, with room made for its payload: a size past
/// [`MAX_MSG_SIZE`] (or one the allocator refuses) is refused before
/// anything is allocated, so the reply can name the message.
pub(crate) fn header_and_room(hbuf: &[u8; HEADER_SIZE]) -> Result<(Header, Vec<u8>), Error> {
    let header = crate::wire::read_prefix::<Header>(hbuf)
        .ok_or_else(|| Error::Protocol("short header".into()))?;
    let size = header.msg_size as usize;
    if size < HEADER_SIZE {
        return Err(Error::Protocol(format!(
            "message size {size} smaller than its header"
        )));
    }
    let refused = |errno| Error::Refused {
        msg_id: header.msg_id,
        command: header.command,
        size,
        errno,
    };
    if size > MAX_MSG_SIZE {
        return Err(refused(libc::E2BIG));
    }
    let mut payload = Vec::new();
    payload
        .try_reserve_exact(size - HEADER_SIZE)
        // An allocation failure says nothing more than ENOMEM.
        .map_err(|_| refused(libc::ENOMEM))?;
    payload.resize(size - HEADER_SIZE, 0);
    Ok((header, payload))
}

/// Waits until the socket is readable; false on timeout.
pub(crate) fn wait_readable(fd: impl AsFd, timeout: Option<Duration>) -> Result<bool, Error> {
    let mut pfd = [PollFd::new(&fd, PollFlags::IN)];
    Ok(poll(&mut pfd, timeout).map_err(|e| Error::Io(e.into()))? > 0)
}

/// `poll(2)` on `fds` for at most `timeout` (`None`: no limit), retried
/// when a signal interrupts it; the number of fds with events.
pub(crate) fn poll(fds: &mut [PollFd<'_>], timeout: Option<Duration>) -> rustix::io::Result<usize> {
    let ts = timeout.map(|t| Timespec {
        tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(t.subsec_nanos()),
    });
    loop {
        match rustix::event::poll(fds, ts.as_ref()) {
            Err(rustix::io::Errno::INTR) => continue,
            r => return r,
        }
    }
}

/// The receiving half of one message: its deadline and the fds that came
/// with it.
struct Receiver<'a> {
    stream: &'a UnixStream,
    deadline: Instant,
    fds: Vec<OwnedFd>,
    /// More fds were sent than [`MAX_MSG_FDS`]; the extra ones were closed.
    fds_truncated: bool,
}

impl Receiver<'_> {
    /// Fills `buf` with non-blocking recvmsg calls, waiting for data no later
    /// than the message's deadline, and collects fds. Returns the bytes read,
    /// less than `buf.len()` only at end of stream. `at_start`: EOF before any
    /// byte is a clean close.
    fn fill(&mut self, buf: &mut [u8], at_start: bool) -> Result<usize, Error> {
        let mut got = 0;
        while got < buf.len() {
            let n = pump::recv_some(
                self.stream,
                &mut buf[got..],
                &mut self.fds,
                &mut self.fds_truncated,
            )?;
            let Some(n) = n else {
                let left = self.deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || !wait_readable(self.stream, Some(left))? {
                    return Err(Error::Protocol(
                        "peer stalled in the middle of a message".into(),
                    ));
                }
                continue;
            };
            if n == 0 {
                if at_start && got == 0 {
                    return Ok(0);
                }
                return Ok(got);
            }
            got += n;
        }
        Ok(got)
    }
}

/// What is left of a message's `parts` after its first `done` bytes (a
/// send or a write may take part of it): an iovec and how many of its
/// entries are used.
fn unsent<'a>(parts: &[&'a [u8]; 4], done: usize) -> ([IoSlice<'a>; 4], usize) {
    let (mut skip, mut n) = (done, 0);
    let mut iov = [IoSlice::new(&[]); 4];
    for p in parts {
        if skip >= p.len() {
            skip -= p.len();
            continue;
        }
        iov[n] = IoSlice::new(&p[skip..]);
        n += 1;
        skip = 0;
    }
    (iov, n)
}

/// Builds a reply header for `req`.
pub fn reply_header(req: &Header) -> Header {
    Header {
        msg_id: req.msg_id,
        command: req.command,
        msg_size: 0,
        flags: flags::TYPE_REPLY,
        error: 0,
    }
}

/// Builds an error reply header for `req`.
pub fn error_header(req: &Header, errno: i32) -> Header {
    Header {
        msg_id: req.msg_id,
        command: req.command,
        msg_size: 0,
        flags: flags::TYPE_REPLY | flags::ERROR,
        error: u32::try_from(errno).unwrap_or(libc::EINVAL as u32),
    }
}
