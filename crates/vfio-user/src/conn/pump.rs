//! A connection read and written without blocking, for a thread that
//! serves many (see `server/hub.rs`): a message arrives piece by piece
//! into a per-connection buffer (header, then payload, with the fds that
//! came along), so a peer that half-sends one holds up no other
//! connection; and a reply the socket has no room for waits in a bounded
//! per-connection queue, so a peer that stops reading blocks no sender.

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};

use super::{Message, MAX_MSG_FDS, MAX_MSG_SIZE};
use crate::wire::{Header, HEADER_SIZE};
use crate::Error;

/// Most replies (and DMA requests) waiting for room in one peer's socket;
/// a peer past it does not read what it asked for and is closed.
pub(crate) const MAX_QUEUED_SENDS: usize = 256;
/// Most bytes waiting so: a full data transfer and then some.
pub(crate) const MAX_QUEUED_BYTES: usize = 2 * MAX_MSG_SIZE;

/// One message on its way in.
#[derive(Debug, Default)]
pub(crate) struct Partial {
    header: [u8; HEADER_SIZE],
    /// Header bytes in.
    got: usize,
    /// The header, once whole, and the payload so far.
    body: Option<(Header, Vec<u8>, usize)>,
    fds: Vec<OwnedFd>,
    fds_truncated: bool,
    /// When its first byte came: it must be whole within the message timeout.
    started: Option<Instant>,
}

/// What one non-blocking read step found.
pub(crate) enum Step {
    /// A whole message.
    Message(Message),
    /// Nothing more to read now.
    Drained,
}

impl Partial {
    /// When the message under way must be whole, if one is.
    pub(crate) fn deadline(&self, timeout: Duration) -> Option<Instant> {
        self.started.map(|t| t + timeout)
    }

    /// Reads from `stream` (non-blocking) until a message is whole or
    /// nothing more has arrived. End of stream between messages is
    /// [`Error::Disconnected`], inside one a protocol error; a header that
    /// announces more than [`MAX_MSG_SIZE`] (or than we can allocate) is
    /// [`Error::Refused`] before its body is read.
    pub(crate) fn step(&mut self, stream: &UnixStream) -> Result<Step, Error> {
        loop {
            let n = match &mut self.body {
                None => {
                    let got = self.got;
                    recv_some(
                        stream,
                        &mut self.header[got..],
                        &mut self.fds,
                        &mut self.fds_truncated,
                    )?
                }
                Some((_, payload, got)) => {
                    let at = *got;
                    if at == payload.len() {
                        return Ok(Step::Message(self.take()));
                    }
                    recv_some(
                        stream,
                        &mut payload[at..],
                        &mut self.fds,
                        &mut self.fds_truncated,
                    )?
                }
            };
            let Some(n) = n else {
                return Ok(Step::Drained);
            };
            if n == 0 {
                return Err(self.ended());
            }
            self.started.get_or_insert_with(Instant::now);
            match &mut self.body {
                Some((_, _, got)) => *got += n,
                None => {
                    self.got += n;
                    if self.got == HEADER_SIZE {
                        self.begin_body()?;
                    }
                }
            }
        }
    }

    /// The header is whole: checks its size and makes room for the body.
    fn begin_body(&mut self) -> Result<(), Error> {
        let (header, payload) = super::header_and_room(&self.header)?;
        self.body = Some((header, payload, 0));
        Ok(())
    }

    fn take(&mut self) -> Message {
        let done = std::mem::take(self);
        let (header, payload, _) = done.body.unwrap_or_default();
        Message {
            header,
            payload,
            fds: done.fds,
            fds_truncated: done.fds_truncated,
        }
    }

    /// The error for end of stream now.
    fn ended(&self) -> Error {
        match &self.body {
            None if self.got == 0 => Error::Disconnected,
            None => Error::Protocol(format!("truncated header ({} bytes)", self.got)),
            Some((_, payload, got)) => Error::Protocol(format!(
                "truncated message: {got} of {} payload bytes",
                payload.len()
            )),
        }
    }
}

/// One non-blocking `recvmsg` into `buf`, keeping the fds that came with
/// it (past [`MAX_MSG_FDS`] they are closed and `truncated` set).
/// `Ok(None)`: nothing to read now; `Ok(Some(0))`: end of stream.
pub(crate) fn recv_some(
    stream: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    truncated: &mut bool,
) -> Result<Option<usize>, Error> {
    loop {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_MSG_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let mut iov = [IoSliceMut::new(buf)];
        let res = rustix::net::recvmsg(
            stream.as_fd(),
            &mut iov,
            &mut control,
            RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT,
        );
        let msg = match res {
            Ok(m) => m,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => return Ok(None),
            Err(e) => return Err(Error::Io(e.into())),
        };
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            *truncated = true;
        }
        for cmsg in control.drain() {
            if let RecvAncillaryMessage::ScmRights(rights) = cmsg {
                for fd in rights {
                    if fds.len() < MAX_MSG_FDS {
                        fds.push(fd);
                    } else {
                        *truncated = true;
                    }
                }
            }
        }
        return Ok(Some(msg.bytes));
    }
}

/// Messages (or their ends) the socket had no room for, oldest first.
#[derive(Debug, Default)]
pub(crate) struct Outbox {
    queue: VecDeque<Queued>,
    bytes: usize,
}

#[derive(Debug)]
struct Queued {
    data: Vec<u8>,
    sent: usize,
    /// Go with the first byte, so only while `sent == 0`.
    fds: Vec<OwnedFd>,
}

/// Why a send could not be queued: the peer does not read.
#[derive(Debug)]
pub(crate) struct Overflow {
    pub(crate) messages: usize,
    pub(crate) bytes: usize,
}

impl Outbox {
    /// Sends `slices` (one message, `total` bytes) now as far as the
    /// socket takes it, queueing the rest behind what waits already.
    pub(crate) fn send(
        &mut self,
        stream: &UnixStream,
        slices: &[&[u8]],
        total: usize,
        fds: &[BorrowedFd<'_>],
    ) -> Result<Result<(), Overflow>, Error> {
        let mut sent = 0;
        if self.queue.is_empty() {
            while sent < total {
                match send_some(stream, slices, sent, if sent == 0 { fds } else { &[] })? {
                    Some(n) => sent += n,
                    None => break,
                }
            }
            if sent == total {
                return Ok(Ok(()));
            }
        }
        if self.queue.len() >= MAX_QUEUED_SENDS || self.bytes + total - sent > MAX_QUEUED_BYTES {
            return Ok(Err(Overflow {
                messages: self.queue.len() + 1,
                bytes: self.bytes + total - sent,
            }));
        }
        let mut data = Vec::with_capacity(total - sent);
        let mut skip = sent;
        for s in slices {
            let cut = skip.min(s.len());
            data.extend_from_slice(&s[cut..]);
            skip -= cut;
        }
        let fds = if sent == 0 {
            fds.iter()
                .map(|fd| fd.try_clone_to_owned())
                .collect::<Result<_, _>>()?
        } else {
            Vec::new()
        };
        self.bytes += data.len();
        self.queue.push_back(Queued { data, sent: 0, fds });
        Ok(Ok(()))
    }

    /// Whether anything waits for room in the socket.
    pub(crate) fn holds(&self) -> bool {
        !self.queue.is_empty()
    }

    /// Sends what waits, as far as the socket takes it.
    pub(crate) fn flush(&mut self, stream: &UnixStream) -> Result<(), Error> {
        while let Some(q) = self.queue.front_mut() {
            let fds: Vec<BorrowedFd<'_>> = q.fds.iter().map(AsFd::as_fd).collect();
            let fds = if q.sent == 0 { &fds[..] } else { &[] };
            match send_some(stream, &[&q.data], q.sent, fds)? {
                Some(n) => {
                    q.sent += n;
                    self.bytes -= n;
                }
                None => return Ok(()),
            }
            if q.sent == q.data.len() {
                self.queue.pop_front();
            }
        }
        Ok(())
    }
}

/// One non-blocking `sendmsg` of `slices` from byte `from` on, with `fds`;
/// `Ok(None)`: the socket has no room now.
fn send_some(
    stream: &UnixStream,
    slices: &[&[u8]],
    from: usize,
    fds: &[BorrowedFd<'_>],
) -> Result<Option<usize>, Error> {
    let mut skip = from;
    let mut iov = Vec::with_capacity(slices.len());
    for s in slices {
        if skip >= s.len() {
            skip -= s.len();
            continue;
        }
        iov.push(IoSlice::new(&s[skip..]));
        skip = 0;
    }
    loop {
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_MSG_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() {
            control.push(SendAncillaryMessage::ScmRights(fds));
        }
        match rustix::net::sendmsg(
            stream,
            &iov,
            &mut control,
            SendFlags::NOSIGNAL | SendFlags::DONTWAIT,
        ) {
            Ok(n) => return Ok(Some(n)),
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => return Ok(None),
            Err(e) => return Err(Error::Io(e.into())),
        }
    }
}

/// Wakes a thread waiting in epoll: an eventfd, written without blocking.
#[derive(Debug)]
pub(crate) struct Bell(OwnedFd);

impl Bell {
    pub(crate) fn new() -> std::io::Result<Self> {
        use rustix::event::{eventfd, EventfdFlags};
        Ok(Self(eventfd(
            0,
            EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
        )?))
    }

    pub(crate) fn ring(&self) {
        // A full counter has been rung already.
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// Takes the rings so far (the next wait sleeps until the next one).
    pub(crate) fn drain(&self) {
        let mut buf = [0u8; 8];
        // Nothing to read: not rung, which is as good.
        let _ = rustix::io::read(&self.0, &mut buf);
    }

    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}
