//! One connection to an NBD server in the transmission phase, with many
//! requests in flight.
//!
//! * Requests are sent by whoever submits them, under a lock on the
//!   sending half; each first takes a cookie in the table of requests in
//!   flight, so its reply always finds it.
//! * Replies are read by a thread of the connection's own
//!   (`vnvme-nbd-reply`), which moves a read's data into its buffer and
//!   hands each completion to the [`Sink`] of whoever submitted it, then
//!   calls the sinks' wakers once it has read every reply buffered.
//! * Whatever goes wrong (the server closes, resets, sends a reply the
//!   protocol does not allow, or makes no progress for the I/O timeout
//!   while requests wait) kills the connection: the socket is shut down
//!   and every request in flight completes with an error. Nothing waits
//!   forever. A dead connection stays dead; [`Link`](super::link::Link)
//!   opens a new one.
//!
//! A request in the table is completed by whoever takes it out of the
//! table (the reply thread, for a reply or when the connection dies), so
//! it completes exactly once.

use std::collections::HashMap;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::proto::{self, cmd, ExportInfo, ProtocolError};
use super::stream::{Deadline, Stream};
use super::uri::Address;
use super::Timeouts;
use crate::{BlockCompletion, BlockError, Data, IoBuf, Waker};

/// How often the reply thread, blocked on a silent server, looks at the
/// age of the requests in flight.
const TICK: Duration = Duration::from_millis(250);

/// Bytes of replies read from the socket at once: many 4 KiB reads' worth,
/// so a busy connection costs few system calls.
const READ_BUFFER: usize = 256 << 10;

/// How long closing waits to say goodbye (`NBD_CMD_DISC`) to a server
/// that does not read.
const DISC_TIMEOUT: Duration = Duration::from_millis(100);

/// Where completions go: a queue's list, reaped by its `poll`, or one
/// synchronous caller waiting on it.
pub(super) struct Sink {
    done: Mutex<Vec<BlockCompletion>>,
    ready: Condvar,
    waker: Option<Waker>,
    waking: AtomicBool,
}

impl Sink {
    pub fn new(waker: Option<Waker>) -> Arc<Self> {
        Arc::new(Self {
            done: Mutex::new(Vec::new()),
            ready: Condvar::new(),
            waking: AtomicBool::new(waker.is_some()),
            waker,
        })
    }

    pub fn push(&self, completion: BlockCompletion) {
        self.done.lock().push(completion);
        self.ready.notify_all();
    }

    /// Calls the waker, unless its consumer turned it off.
    pub fn wake(&self) {
        if let Some(waker) = self
            .waker
            .as_ref()
            .filter(|_| self.waking.load(Ordering::Acquire))
        {
            waker();
        }
    }

    pub fn set_waking(&self, on: bool) {
        self.waking.store(on, Ordering::Release);
    }

    /// Moves at most `max` completions to `out`; returns how many.
    pub fn take(&self, out: &mut Vec<BlockCompletion>, max: usize) -> usize {
        let mut done = self.done.lock();
        let n = done.len().min(max);
        out.extend(done.drain(..n));
        n
    }

    /// Waits until `count` completions are waiting, or `deadline`; returns
    /// whether they are.
    pub fn wait_for(&self, count: usize, deadline: Instant) -> bool {
        let mut done = self.done.lock();
        while done.len() < count {
            if self.ready.wait_until(&mut done, deadline).timed_out() {
                return done.len() >= count;
            }
        }
        true
    }
}

/// A request whose reply has not arrived.
struct Pending {
    token: u64,
    /// A read's destination (a write's data is not kept: the reply only
    /// says whether it landed).
    read_into: Option<Data>,
    sink: Arc<Sink>,
    sent_at: Instant,
}

struct Table {
    pending: HashMap<u64, Pending>,
    next_cookie: u64,
    /// Why the connection died, once it has.
    dead: Option<String>,
}

struct Shared {
    table: Mutex<Table>,
    /// A handle on the socket to shut it down from anywhere.
    socket: Stream,
    timeouts: Timeouts,
}

impl Shared {
    /// Kills the connection: later submissions fail at once, and the reply
    /// thread, whose reads now fail, fails every request in flight.
    fn kill(&self, why: String) {
        let mut table = self.table.lock();
        if table.dead.is_none() {
            tracing::warn!("NBD connection lost: {why}");
            table.dead = Some(why);
        }
        drop(table);
        self.socket.shutdown();
    }
}

/// One open connection.
pub(super) struct Conn {
    shared: Arc<Shared>,
    writer: Mutex<Writer>,
    reply_thread: Option<JoinHandle<()>>,
    export: ExportInfo,
    address: Address,
}

struct Writer {
    stream: Stream,
    /// Guest memory a write carries is copied here to be sent.
    scratch: IoBuf,
}

/// What to send: an NBD command with its range and flags.
#[derive(Debug, Clone, Copy)]
pub(super) struct Command {
    pub kind: u16,
    pub flags: u16,
    pub offset: u64,
    pub len: u32,
}

impl Conn {
    /// Connects and runs the handshake, each within the connect timeout
    /// (the handshake as a whole, however the server spreads its bytes).
    pub fn open(address: &Address, export: &str, timeouts: Timeouts) -> Result<Self, OpenError> {
        let mut stream = Stream::connect(address, timeouts.connect).map_err(OpenError::Connect)?;
        let mut until = Deadline {
            stream: &mut stream,
            at: Instant::now() + timeouts.connect,
        };
        let info = proto::handshake(&mut until, export).map_err(OpenError::Handshake)?;
        let setup = || -> io::Result<(Stream, Stream)> {
            stream.set_timeouts(TICK, timeouts.io)?;
            Ok((stream.try_clone()?, stream.try_clone()?))
        };
        let (reader, socket) = setup().map_err(OpenError::Connect)?;
        let shared = Arc::new(Shared {
            table: Mutex::new(Table {
                pending: HashMap::new(),
                next_cookie: 1,
                dead: None,
            }),
            socket,
            timeouts,
        });
        let reply_thread = std::thread::Builder::new()
            .name("vnvme-nbd-reply".into())
            .spawn({
                let shared = shared.clone();
                move || reply_loop(reader, &shared)
            })
            .map_err(OpenError::Connect)?;
        Ok(Self {
            shared,
            writer: Mutex::new(Writer {
                stream,
                scratch: IoBuf::new(),
            }),
            reply_thread: Some(reply_thread),
            export: info,
            address: address.clone(),
        })
    }

    pub fn export(&self) -> ExportInfo {
        self.export
    }

    /// Why the connection died, if it has.
    pub fn dead_reason(&self) -> Option<String> {
        self.shared.table.lock().dead.clone()
    }

    /// Sends `command` (with `data`: a write's payload, or a read's
    /// destination); its completion goes to `sink` under `token`. When
    /// the connection is already dead, nothing is sent and the data comes
    /// back with the error.
    pub fn submit(
        &self,
        command: Command,
        data: Option<Data>,
        token: u64,
        sink: &Arc<Sink>,
    ) -> Result<(), (Option<Data>, BlockError)> {
        let mut writer = self.writer.lock();
        let (read_into, payload) = match (command.kind, data) {
            (cmd::WRITE, Some(Data::Buf(buf))) => (None, Some(buf)),
            (cmd::WRITE, Some(Data::Mapped(mem))) => {
                let mut scratch = std::mem::take(&mut writer.scratch);
                scratch.set_len(mem.len());
                if let Err(e) = mem.copy_to(&mut scratch) {
                    writer.scratch = scratch;
                    return Err((Some(Data::Mapped(mem)), BlockError::Io(e)));
                }
                (None, Some(scratch))
            }
            (_, data) => (data, None),
        };
        let cookie = {
            let mut table = self.shared.table.lock();
            if let Some(why) = &table.dead {
                return Err((read_into, gone(why)));
            }
            let cookie = table.next_cookie;
            table.next_cookie = cookie.wrapping_add(1);
            table.pending.insert(
                cookie,
                Pending {
                    token,
                    read_into,
                    sink: sink.clone(),
                    sent_at: Instant::now(),
                },
            );
            cookie
        };
        let header = proto::request(
            command.kind,
            command.flags,
            cookie,
            command.offset,
            command.len,
        );
        let body = payload.as_deref().unwrap_or_default();
        let sent = write_all(&mut writer.stream, &header, body);
        if let Some(buf) = payload.filter(|b| b.capacity() > 0 && command.kind == cmd::WRITE) {
            // Keep the larger buffer as scratch for the next mapped write.
            if buf.capacity() > writer.scratch.capacity() {
                writer.scratch = buf;
            }
        }
        if let Err(e) = sent {
            // The request is in the table: the reply thread fails it.
            self.shared
                .kill(format!("sending to {} failed: {e}", self.address));
        }
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        {
            let mut writer = self.writer.lock();
            if self.dead_reason().is_none() {
                // Tell the server we are leaving, so it does not log an error.
                let _ = writer.stream.set_timeouts(TICK, DISC_TIMEOUT);
                let disc = proto::request(cmd::DISC, 0, 0, 0, 0);
                let _ = writer.stream.write_all(&disc);
            }
        }
        // Closed on purpose: no warning, unlike `kill`.
        self.shared
            .table
            .lock()
            .dead
            .get_or_insert_with(|| "connection closed".into());
        self.shared.socket.shutdown();
        if let Some(t) = self.reply_thread.take() {
            let _ = t.join();
        }
    }
}

fn gone(why: &str) -> BlockError {
    BlockError::Io(io::Error::new(
        io::ErrorKind::NotConnected,
        format!("NBD server unreachable: {why}"),
    ))
}

/// Writes a header and its payload, in one system call when the socket
/// takes it all.
fn write_all(stream: &mut Stream, header: &[u8], body: &[u8]) -> io::Result<()> {
    let total = header.len() + body.len();
    let mut done = 0;
    while done < total {
        let (h, b) = if done < header.len() {
            (&header[done..], body)
        } else {
            (&[][..], &body[done - header.len()..])
        };
        match stream.write_vectored(&[IoSlice::new(h), IoSlice::new(b)]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot connect")]
    Connect(#[source] io::Error),
    #[error("NBD handshake failed")]
    Handshake(#[source] ProtocolError),
}

/// The receiving half, owned by the reply thread.
struct Replies {
    reader: BufReader<Stream>,
    /// When the request whose data is being read was sent (it is out of
    /// the table meanwhile).
    reading: Option<Instant>,
    /// Where a read for guest memory lands before it is copied there.
    bounce: IoBuf,
}

fn reply_loop(stream: Stream, shared: &Shared) {
    let mut reader = Replies {
        reader: BufReader::with_capacity(READ_BUFFER, stream),
        reading: None,
        bounce: IoBuf::new(),
    };
    let mut woken: Vec<Arc<Sink>> = Vec::new();
    let why = loop {
        if reader.reader.buffer().is_empty() {
            // Every reply that arrived is handed over: wake their owners
            // before blocking for more.
            for sink in woken.drain(..) {
                sink.wake();
            }
        }
        if let Err(e) = next_reply(&mut reader, shared, &mut woken) {
            break e;
        }
    };
    let mut table = shared.table.lock();
    if table.dead.is_none() {
        tracing::warn!("NBD connection lost: {why}");
    }
    let why = table.dead.get_or_insert(why).clone();
    let failed: Vec<Pending> = table.pending.drain().map(|(_, p)| p).collect();
    drop(table);
    shared.socket.shutdown();
    for p in failed {
        p.sink.push(BlockCompletion {
            token: p.token,
            data: p.read_into,
            result: Err(gone(&why)),
        });
        if !woken.iter().any(|s| Arc::ptr_eq(s, &p.sink)) {
            woken.push(p.sink);
        }
    }
    for sink in woken {
        sink.wake();
    }
}

/// Reads one reply and completes its request.
fn next_reply(
    reader: &mut Replies,
    shared: &Shared,
    woken: &mut Vec<Arc<Sink>>,
) -> Result<(), String> {
    let mut header = [0u8; 16];
    fill(reader, &mut header, shared)?;
    let reply =
        proto::parse_reply(&header).map_err(|e| format!("server broke the protocol: {e}"))?;
    let pending = shared
        .table
        .lock()
        .pending
        .remove(&reply.cookie)
        .ok_or_else(|| {
            format!(
                "server broke the protocol: {}",
                ProtocolError::UnknownCookie(reply.cookie)
            )
        })?;
    let mut data = pending.read_into;
    reader.reading = Some(pending.sent_at);
    let result = if reply.error != 0 {
        Err(BlockError::Io(proto::reply_error(reply.error)))
    } else {
        match &mut data {
            None => Ok(()),
            Some(Data::Buf(buf)) => {
                let r = fill(reader, buf, shared);
                fail_read_on_error(r, &pending.sink, pending.token, &mut data)?;
                Ok(())
            }
            Some(Data::Mapped(mem)) => {
                let mut bounce = std::mem::take(&mut reader.bounce);
                bounce.set_len(mem.len());
                let r = fill(reader, &mut bounce, shared);
                reader.bounce = bounce;
                fail_read_on_error(r, &pending.sink, pending.token, &mut data)?;
                match &mut data {
                    Some(Data::Mapped(mem)) => {
                        mem.copy_from(&reader.bounce).map_err(BlockError::Io)
                    }
                    _ => Ok(()),
                }
            }
        }
    };
    reader.reading = None;
    pending.sink.push(BlockCompletion {
        token: pending.token,
        data,
        result,
    });
    if !woken.iter().any(|s| Arc::ptr_eq(s, &pending.sink)) {
        woken.push(pending.sink);
    }
    Ok(())
}

/// A read whose data did not arrive fails with the connection: completes
/// it here, since it is no longer in the table.
fn fail_read_on_error(
    r: Result<(), String>,
    sink: &Arc<Sink>,
    token: u64,
    data: &mut Option<Data>,
) -> Result<(), String> {
    r.inspect_err(|why| {
        sink.push(BlockCompletion {
            token,
            data: data.take(),
            result: Err(gone(why)),
        });
        sink.wake();
    })
}

/// Reads exactly `buf.len()` bytes. Between bytes the socket times out
/// every [`TICK`]: a server that leaves any request unanswered for the I/O
/// timeout is given up on, however many bytes it trickles meanwhile, as is
/// one that takes that long over one reply header.
fn fill(reader: &mut Replies, buf: &mut [u8], shared: &Shared) -> Result<(), String> {
    let mut done = 0;
    let mut first_byte = None;
    while done < buf.len() {
        match reader.reader.read(&mut buf[done..]) {
            Ok(0) => {
                return Err(if done == 0 {
                    "the server closed the connection".into()
                } else {
                    "the server closed the connection in the middle of a reply".into()
                })
            }
            Ok(n) => {
                done += n;
                first_byte.get_or_insert_with(Instant::now);
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                let table = shared.table.lock();
                if let Some(why) = &table.dead {
                    return Err(why.clone());
                }
                let oldest = table
                    .pending
                    .values()
                    .map(|p| p.sent_at)
                    .chain(reader.reading);
                let since = oldest.chain(first_byte).min();
                if since.is_some_and(|t| t.elapsed() > shared.timeouts.io) {
                    return Err(format!(
                        "a request went unanswered for more than {:?}",
                        shared.timeouts.io
                    ));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("receiving failed: {e}")),
        }
    }
    Ok(())
}
