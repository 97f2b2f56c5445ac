//! The server side: one client at a time, commands handled on the calling
//! thread, replies with real errnos.
//!
//! The client is not trusted (vfio-user.rst: "Clients should not trust
//! servers, and vice versa"), and neither are the connections that queue
//! behind it. [`Server::serve_listener`] runs a *door* thread that owns the
//! listening socket: it hands a connection to the control thread when the
//! device is free, refuses the others at once (an EBUSY reply to their
//! VERSION, then close), and on stop shuts the served connection down so no
//! blocked send or wait outlives it. A connection must send VERSION within
//! [`ServerOptions::handshake_timeout`], and every message, once started,
//! must arrive whole within [`ServerOptions::message_timeout`]; a negotiated
//! client that merely stays idle is never dropped.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zerocopy::IntoBytes;

use crate::conn::{
    error_header, reply_header, Conn, Message, Wanted, MAX_DATA_XFER_SIZE, MAX_MSG_FDS,
    MESSAGE_TIMEOUT,
};
use crate::dma::{DmaLimits, DmaSpace};
use crate::door::{Door, RateLimit, STOP_POLL};
use crate::handover::{Adopted, ClientChange, DmaLedger, HandedMap, Handover, Marked};
use crate::msg_times::MessageTimes;
use crate::stop::StopWake;
use crate::version::parse_version_caps;
use crate::wire::*;
use crate::{Device, Errno, Error};

mod handing;
mod hub;
mod irqs;
mod regions;

pub use hub::{serve_many, serve_many_with};

/// How long a new connection has to send a valid VERSION (the default of
/// [`ServerOptions::handshake_timeout`]).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// What the server allows a client.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// A connection that has not negotiated VERSION by then is dropped.
    pub handshake_timeout: Duration,
    /// A message, once its first byte is in, must arrive whole by then; a
    /// peer that does not read may block a send this long.
    pub message_timeout: Duration,
    /// DMA maps and bytes a client may map (advertised as `max_dma_maps`).
    pub dma_limits: DmaLimits,
    /// Woken with the stop flag (see [`StopWake`]): the server's threads
    /// then wait without a timeout. `None`: they poll the flag every 100 ms.
    pub stop_wake: Option<StopWake>,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            handshake_timeout: HANDSHAKE_TIMEOUT,
            message_timeout: MESSAGE_TIMEOUT,
            dma_limits: DmaLimits::default(),
            stop_wake: None,
        }
    }
}

/// Serves a [`Device`] to vfio-user clients.
#[derive(Debug)]
pub struct Server<D: Device> {
    device: D,
    opts: ServerOptions,
    /// Stop-poll periods that ran out while a handover was asked: each is
    /// up to [`STOP_POLL`] the request waited to be seen. A [`Handover`]
    /// with a wake fd keeps it at 0 (see [`Server::late_handover_polls`]).
    late_handover_polls: Arc<AtomicU64>,
    /// Waits of the door and the client loop that ended with nothing to
    /// do: the stop polls an idle server pays for (0 with a [`StopWake`]).
    idle_wakeups: Arc<AtomicU64>,
}

/// State of one client connection.
struct ClientState {
    conn: Arc<Conn>,
    dma: Option<DmaSpace>,
    /// (flags, size) per region index, read once at VERSION so region
    /// accesses (doorbell traps) need no `region_info` call.
    regions: Vec<Option<(u32, u64)>>,
    /// Warnings about this client's messages, at most one a second.
    warnings: RateLimit,
    /// How long each kind of message took, logged when the client goes.
    times: MessageTimes,
    /// The DMA maps with their files, for a handover.
    ledger: DmaLedger,
    /// A message a crashed server was handling, handled first.
    redo: Option<Message>,
    /// That message is being handled (again): its effect may be there
    /// already (see `handover::may_redo`).
    redoing: bool,
}

impl ClientState {
    /// A connection that has not sent VERSION yet.
    fn new(conn: Arc<Conn>) -> Self {
        Self {
            conn,
            dma: None,
            regions: Vec::new(),
            warnings: RateLimit::default(),
            times: MessageTimes::default(),
            ledger: DmaLedger::default(),
            redo: None,
            redoing: false,
        }
    }
}

/// Region indexes whose info is cached; others are looked up per access.
const CACHED_REGIONS: u32 = 16;

/// What a handler answers: the reply payload and an optional fd to pass.
type Handled = Result<Vec<u8>, Errno>;

impl<D: Device> Server<D> {
    pub fn new(device: D) -> Self {
        Self::with_options(device, ServerOptions::default())
    }

    pub fn with_options(device: D, opts: ServerOptions) -> Self {
        Self {
            device,
            opts,
            late_handover_polls: Arc::default(),
            idle_wakeups: Arc::default(),
        }
    }

    /// How many times the client loop's stop poll ran out while a handover
    /// was asked and not yet seen (its [`Handover::wake_fd`] did not wake
    /// the loop, or it has none): a count a test can check is 0.
    pub fn late_handover_polls(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.late_handover_polls)
    }

    /// How many waits of the door and the client loop ended with nothing
    /// to do (their stop polls): a count a test can check is 0 for an idle
    /// server with a [`StopWake`].
    pub fn idle_wakeups(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.idle_wakeups)
    }

    pub fn device(&self) -> &D {
        &self.device
    }

    pub fn device_mut(&mut self) -> &mut D {
        &mut self.device
    }

    pub fn into_device(self) -> D {
        self.device
    }

    /// Serves one already-connected stream until it closes or errors. Calls
    /// `attach` after VERSION and `detach` when the client goes. A clean
    /// disconnect is `Ok(())`.
    pub fn serve_stream(&mut self, stream: UnixStream) -> Result<(), Error> {
        self.serve(stream, None, None, None)
    }

    /// Serves clients on `listener`, one at a time, until `stop` is set
    /// (checked every 100 ms, so a signal handler may set it, or at once
    /// when [`ServerOptions::stop_wake`] is woken): while one
    /// owns the device, other connections are refused at once; when it
    /// goes (or misbehaves) the device is detached and the next connection
    /// is served. Stopping shuts the served connection down, so it never
    /// waits on the client.
    pub fn serve_listener(
        &mut self,
        listener: &UnixListener,
        stop: &AtomicBool,
    ) -> Result<(), Error> {
        self.serve_listener_with(listener, stop, None, None)
    }

    /// As [`serve_listener`](Self::serve_listener), serving `adopted` (a
    /// client another process handed over) first, and handing the client
    /// over when `handover` asks (see [`crate::handover`]).
    pub fn serve_listener_with(
        &mut self,
        listener: &UnixListener,
        stop: &AtomicBool,
        handover: Option<&dyn Handover<D>>,
        adopted: Option<Adopted>,
    ) -> Result<(), Error> {
        listener.set_nonblocking(true)?;
        let door = Door::default();
        let (wake, idle) = (self.opts.stop_wake.clone(), Arc::clone(&self.idle_wakeups));
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("vfio-user-door".into())
                .spawn_scoped(scope, || {
                    Door::watch_all(&[(&door, listener)], stop, wake.as_ref(), &idle)
                })?;
            self.serve_door_with(&door, stop, handover, adopted)
        })
    }

    /// Serves the clients `door` hands over, one at a time, until `stop`,
    /// as [`serve_listener`](Self::serve_listener) does, but without a
    /// thread for the door: the caller runs [`Door::watch_all`] on its
    /// listener, one thread for the doors of every server in the process.
    /// With a [`ServerOptions::stop_wake`] the stop is seen when that
    /// thread closes the door; without, every 100 ms as well.
    pub fn serve_door(&mut self, door: &Door, stop: &AtomicBool) -> Result<(), Error> {
        self.serve_door_with(door, stop, None, None)
    }

    /// As [`serve_door`](Self::serve_door), serving `adopted` (a client
    /// another process handed over) first, and handing the client over
    /// when `handover` asks (see [`crate::handover`]): one controller of a
    /// process serving several, each on its thread.
    pub fn serve_door_with(
        &mut self,
        door: &Door,
        stop: &AtomicBool,
        handover: Option<&dyn Handover<D>>,
        adopted: Option<Adopted>,
    ) -> Result<(), Error> {
        let asked = || handover.is_some_and(|h| h.asked());
        let mut client = adopted.map(|a| self.adopted_state(a));
        loop {
            if let Some(state) = client.take() {
                tracing::info!("vfio-user client handed over by the previous process");
                let result = self.serve_client(state, Some(stop), Some(door), handover);
                door.set_owner(None);
                match result {
                    Ok(()) => tracing::info!("vfio-user client disconnected"),
                    Err(e) => tracing::warn!(error = %e, "vfio-user client dropped"),
                }
                continue;
            }
            // Woken on stop by the door; a handover request with no
            // client is still looked for every stop poll.
            let poll = (self.opts.stop_wake.is_none() || handover.is_some()).then_some(STOP_POLL);
            let Some(stream) = door.next(stop, &asked, poll) else {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Some(h) = handover.filter(|h| h.asked()) {
                    // No client: only the sockets go to the next process.
                    let why = h.transfer(&mut self.device, None);
                    h.refuse(why);
                }
                continue;
            };
            tracing::info!("vfio-user client connected");
            let result = self.serve(stream, Some(stop), Some(door), handover);
            door.set_owner(None);
            match result {
                Ok(()) => tracing::info!("vfio-user client disconnected"),
                Err(e) => tracing::warn!(error = %e, "vfio-user client dropped"),
            }
        }
        Ok(())
    }

    /// The state of a client another process served: negotiated, its maps
    /// made ([`Adopted::new`]), the device restored onto them by the caller.
    fn adopted_state(&mut self, a: Adopted) -> ClientState {
        let regions = (0..CACHED_REGIONS)
            .map(|i| {
                self.device
                    .region_info(i)
                    .map(|(info, _)| (info.flags, info.size))
            })
            .collect();
        ClientState {
            conn: a.conn,
            dma: Some(a.dma),
            regions,
            warnings: RateLimit::default(),
            times: MessageTimes::default(),
            ledger: a.ledger,
            redo: a.redo,
            redoing: false,
        }
    }

    fn serve(
        &mut self,
        stream: UnixStream,
        stop: Option<&AtomicBool>,
        door: Option<&Door>,
        handover: Option<&dyn Handover<D>>,
    ) -> Result<(), Error> {
        let conn = Arc::new(Conn::new(stream, self.opts.message_timeout)?);
        self.serve_client(ClientState::new(conn), stop, door, handover)
    }

    fn serve_client(
        &mut self,
        mut client: ClientState,
        stop: Option<&AtomicBool>,
        door: Option<&Door>,
        handover: Option<&dyn Handover<D>>,
    ) -> Result<(), Error> {
        if let Some(door) = door {
            door.set_owner(Some(client.conn.clone()));
        }
        let result = self.run(&mut client, stop, handover);
        if let Some(h) = handover.filter(|h| h.supervised()) {
            h.client_changed(&self.device, ClientChange::Gone);
        }
        self.end_client(&mut client);
        match result {
            Err(Error::Disconnected) => Ok(()),
            r => r,
        }
    }

    /// A client is gone (or dropped): its times logged, its connection
    /// shut down, the device detached from its maps.
    fn end_client(&mut self, client: &mut ClientState) {
        tracing::info!("vfio-user client's {}", client.times.summary());
        // Order matters: first fail any DMA_READ/WRITE a worker is waiting
        // for, then let the device stop its workers, then unmap.
        client.conn.shutdown();
        if let Some(dma) = client.dma.take() {
            self.device.detach();
            dma.unmap_all();
        }
        client.ledger.clear();
    }

    fn run(
        &mut self,
        s: &mut ClientState,
        stop: Option<&AtomicBool>,
        handover: Option<&dyn Handover<D>>,
    ) -> Result<(), Error> {
        let handshake_deadline = Instant::now() + self.opts.handshake_timeout;
        // Asked once per client, so a message (a trapped doorbell) pays a
        // test of this flag, not a call.
        let supervisor = handover.filter(|h| h.supervised());
        let (adopted, redo) = (s.dma.is_some(), s.redo.take());
        if let Some(pipe) = supervisor.and_then(|h| h.reply_pipe()) {
            // What a dead server staged is owed to the client it served,
            // unless the message it answers is handled again; a new
            // client's first reply is its own.
            if (adopted && redo.is_none()) || handing::discard_staged(&pipe) {
                s.conn.stage_replies(pipe);
            }
        }
        if let Some(h) = supervisor.filter(|_| adopted) {
            // A client adopted from a dead or upgraded process: the
            // supervisor learns it as a new one, with its fds, and the
            // reply a dead one owed it goes first.
            handing::tell_supervisor(s, cmd::VERSION, &self.device, h);
            h.checkpoint(&self.device);
            s.conn.send_staged()?;
        }
        if let Some(msg) = redo {
            tracing::info!(
                msg_id = msg.header.msg_id,
                command = msg.header.command,
                "handling again the vfio-user message the dead server was handling"
            );
            s.redoing = true;
            let served = self.serve_message(s, msg, supervisor);
            s.redoing = false;
            served?;
        }
        loop {
            if stop.is_some_and(|f| f.load(Ordering::Relaxed)) {
                return Ok(());
            }
            let wake = handover.and_then(|h| h.wake_fd());
            if let Some(h) = handover.filter(|h| h.asked()) {
                self.hand_over(s, h)?;
            }
            let now = Instant::now();
            // With a stop wake the door shuts the connection down on stop,
            // which ends this wait: no stop poll.
            let mut deadline = stop
                .filter(|_| self.opts.stop_wake.is_none())
                .map(|_| now + STOP_POLL);
            if s.dma.is_none() {
                if now >= handshake_deadline {
                    return Err(Error::Protocol(format!(
                        "no valid VERSION within {:?} of connecting",
                        self.opts.handshake_timeout
                    )));
                }
                deadline = Some(deadline.map_or(handshake_deadline, |d| d.min(handshake_deadline)));
            }
            let msg = match s.conn.wait_or_wake(&Wanted::Request, deadline, wake) {
                Ok(Some(m)) => m,
                Ok(None) => {
                    // Emptied only when the wait ended without a message, so
                    // a trapped doorbell pays no read for it: a request is
                    // flagged before its byte is written, so a byte left
                    // here costs one more turn, and one written after this
                    // read wakes the next wait.
                    if let Some(fd) = wake {
                        handing::drain_wake(fd);
                    }
                    // An admin command run by a worker wakes the loop (the
                    // binary's crash record pokes the wake fd) to keep it.
                    if let Some(h) = supervisor {
                        h.checkpoint(&self.device);
                    }
                    let timed_out = deadline.is_some_and(|d| Instant::now() >= d);
                    if timed_out && handover.is_some_and(|h| h.asked()) {
                        self.late_handover_polls.fetch_add(1, Ordering::Relaxed);
                    }
                    if timed_out {
                        self.idle_wakeups.fetch_add(1, Ordering::Relaxed);
                    }
                    continue;
                }
                Err(Error::Refused {
                    msg_id,
                    command,
                    size,
                    errno,
                }) => {
                    // The body was not read, so the stream cannot be resynchronised:
                    // answer, then close.
                    let req = Header {
                        msg_id,
                        command,
                        ..Default::default()
                    };
                    let _ = s.conn.send(&error_header(&req, errno), &[], &[]);
                    return Err(Error::Refused {
                        msg_id,
                        command,
                        size,
                        errno,
                    });
                }
                Err(e) => return Err(e),
            };
            self.serve_message(s, msg, supervisor)?;
        }
    }

    /// Handles one message and sends its reply; supervised, marked in
    /// the crash area until its effect is kept.
    fn serve_message(
        &mut self,
        s: &mut ClientState,
        msg: Message,
        supervisor: Option<&dyn Handover<D>>,
    ) -> Result<(), Error> {
        let (command, started) = (msg.header.command, Instant::now());
        if let Some(h) = supervisor {
            h.handling(Some(handing::marked(&msg)));
        }
        self.handle_marked(s, msg, supervisor)?;
        s.times.add(command, started.elapsed());
        if let Some(h) = supervisor {
            // The effect kept, then the mark cleared, then the staged
            // reply sent: a crash anywhere leaves either a message not
            // done (handled again or the connection closed) or a reply
            // owed whole (conn/staged.rs).
            handing::tell_supervisor(s, command, &self.device, h);
            h.checkpoint(&self.device);
            h.handling(None);
            s.conn.send_staged()?;
        }
        Ok(())
    }

    /// Handles one request and sends its reply (unless NO_REPLY).
    fn handle(&mut self, s: &mut ClientState, msg: Message) -> Result<(), Error> {
        self.handle_marked(s, msg, None)
    }

    /// As [`handle`](Self::handle); `supervisor`: the message is marked
    /// (see `serve_message`).
    fn handle_marked(
        &mut self,
        s: &mut ClientState,
        msg: Message,
        supervisor: Option<&dyn Handover<D>>,
    ) -> Result<(), Error> {
        let hdr = msg.header;
        let no_reply = hdr.no_reply();
        // One line per message at trace (`vnvme -vv serve`): how a client
        // such as QEMU actually talks to us, for debugging and replay tests.
        tracing::trace!(
            msg_id = hdr.msg_id,
            command = hdr.command,
            bytes = msg.payload.len(),
            fds = msg.fds.len(),
            no_reply,
            payload = %HexPrefix(&msg.payload),
            "request"
        );
        if hdr.msg_type() != flags::TYPE_COMMAND {
            return send_result(s, &hdr, no_reply, Err(libc::EINVAL), None);
        }
        // SPDK's host sends DMA_UNMAP with the map's fd again; libvfio-user
        // ignores it, and so do we. Fds a message does not take are closed
        // with it (dropping `msg`), never kept.
        let fd_limit = match hdr.command {
            cmd::DMA_MAP | cmd::DMA_UNMAP => 1,
            cmd::DEVICE_SET_IRQS => MAX_MSG_FDS,
            _ => 0,
        };
        if msg.fds_truncated || msg.fds.len() > fd_limit {
            if let Some(suppressed) = s.warnings.allow() {
                tracing::warn!(
                    command = hdr.command,
                    fds = msg.fds.len(),
                    truncated = msg.fds_truncated,
                    suppressed,
                    "vfio-user message with more fds than it takes: refused (EINVAL), fds closed"
                );
            }
            return send_result(s, &hdr, no_reply, Err(libc::EINVAL), None);
        }
        if s.dma.is_none() && hdr.command != cmd::VERSION {
            return send_result(s, &hdr, no_reply, Err(libc::EINVAL), None);
        }
        let payload = &msg.payload[..];
        let mut fds = msg.fds;
        match hdr.command {
            cmd::VERSION => {
                let r = self.version(s, payload);
                send_result(s, &hdr, no_reply, r, None)
            }
            cmd::DMA_MAP => {
                let r = self.dma_map(s, payload, fds.pop());
                send_result(s, &hdr, no_reply, r, None)
            }
            cmd::DMA_UNMAP => {
                let r = self.dma_unmap(s, payload);
                send_result(s, &hdr, no_reply, r, None)
            }
            cmd::DEVICE_GET_INFO => {
                let r = self.device_info(payload);
                send_result(s, &hdr, no_reply, r, None)
            }
            cmd::DEVICE_GET_REGION_INFO => {
                // The fd borrows from the device, so reply here.
                let (r, fd) = match self.region_info(payload) {
                    Ok((bytes, fd)) => (Ok(bytes), fd),
                    Err(e) => (Err(e), None),
                };
                if let (Some(h), Some(_), false) = (supervisor, fd, no_reply) {
                    // An fd cannot be staged: the reply goes straight to
                    // the socket, while the message is marked. Kept no
                    // more from here on: a kill before this handles it
                    // again (nothing of it reached the client), one after
                    // cannot tell whether the client got the reply.
                    h.handling(Some(Marked {
                        msg_id: hdr.msg_id,
                        command: hdr.command,
                        redo: None,
                        fds: &[],
                    }));
                }
                send_result(s, &hdr, no_reply, r, fd)
            }
            cmd::DEVICE_GET_IRQ_INFO => {
                let r = self.irq_info(payload);
                send_result(s, &hdr, no_reply, r, None)
            }
            cmd::DEVICE_SET_IRQS => {
                let r = self.set_irqs(s, payload, fds);
                send_result(s, &hdr, no_reply, r, None)
            }
            cmd::REGION_READ => {
                let r = self.region_read(s, payload);
                send_result(s, &hdr, no_reply, r, None)
            }
            cmd::REGION_WRITE => {
                let r = self.region_write(s, payload);
                if let Err(errno) = r {
                    if no_reply {
                        tracing::debug!(errno, "posted REGION_WRITE failed");
                    }
                }
                send_result(s, &hdr, no_reply, r, None)
            }
            cmd::DEVICE_RESET => {
                self.device.reset();
                send_result(s, &hdr, no_reply, Ok(Vec::new()), None)
            }
            // Not offered: ioeventfds need a hypervisor on our side.
            cmd::DEVICE_GET_REGION_IO_FDS => {
                send_result(s, &hdr, no_reply, Err(libc::ENOTSUP), None)
            }
            _ => {
                tracing::debug!(command = hdr.command, "unknown vfio-user command");
                send_result(s, &hdr, no_reply, Err(libc::ENOSYS), None)
            }
        }
    }

    fn version(&mut self, s: &mut ClientState, payload: &[u8]) -> Handled {
        if s.dma.is_some() {
            return Err(libc::EINVAL);
        }
        let v = read_prefix::<Version>(payload).ok_or(libc::EINVAL)?;
        if v.major != 0 {
            return Err(libc::ENOTSUP);
        }
        let caps = parse_version_caps(&payload[size_of::<Version>()..])?;
        let reply_caps = serde_json::json!({
            "capabilities": {
                "max_msg_fds": MAX_MSG_FDS,
                "max_data_xfer_size": MAX_DATA_XFER_SIZE,
                "max_dma_maps": self.opts.dma_limits.max_maps,
                "pgsizes": 4096,
            }
        });
        let mut out = Version { major: 0, minor: 0 }.as_bytes().to_vec();
        out.extend_from_slice(reply_caps.to_string().as_bytes());
        out.push(0);
        s.regions = (0..CACHED_REGIONS)
            .map(|i| {
                self.device
                    .region_info(i)
                    .map(|(info, _)| (info.flags, info.size))
            })
            .collect();
        let dma = DmaSpace::with_conn(
            Some(s.conn.clone()),
            caps.max_data_xfer_size,
            self.opts.dma_limits,
        );
        s.dma = Some(dma.clone());
        self.device.attach(dma);
        s.conn.set_negotiated();
        Ok(out)
    }

    fn dma_map(&mut self, s: &mut ClientState, payload: &[u8], fd: Option<OwnedFd>) -> Handled {
        let m = read_prefix::<DmaMap>(payload).ok_or(libc::EINVAL)?;
        if (m.argsz as usize) < size_of::<DmaMap>() || m.argsz as usize > payload.len() {
            return Err(libc::EINVAL);
        }
        if m.flags & !(DMA_MAP_FLAG_READ | DMA_MAP_FLAG_WRITE) != 0 {
            return Err(libc::EINVAL);
        }
        let dma = s.dma.as_ref().ok_or(libc::EINVAL)?;
        let readable = m.flags & DMA_MAP_FLAG_READ != 0;
        let writable = m.flags & DMA_MAP_FLAG_WRITE != 0;
        let map = HandedMap {
            iova: m.address,
            size: m.size,
            offset: m.offset,
            readable,
            writable,
            file: None,
        };
        if s.redoing && s.ledger.holds(&map, fd.as_ref()) {
            // Handled again after a crash that came once its map was
            // kept: done already.
            tracing::info!(
                iova = m.address,
                size = m.size,
                "DMA_MAP handled again: the map is there already, answered as done"
            );
            return Ok(Vec::new());
        }
        match &fd {
            Some(fd) => dma.map_fd(m.address, m.size, fd.as_fd(), m.offset, readable, writable)?,
            None => dma.map_remote(m.address, m.size, readable, writable)?,
        }
        s.ledger.add(map, fd);
        Ok(Vec::new())
    }

    fn dma_unmap(&mut self, s: &mut ClientState, payload: &[u8]) -> Handled {
        let u = read_prefix::<DmaUnmap>(payload).ok_or(libc::EINVAL)?;
        if (u.argsz as usize) < size_of::<DmaUnmap>() {
            return Err(libc::EINVAL);
        }
        let dma = s.dma.as_ref().ok_or(libc::EINVAL)?;
        if u.flags & DMA_UNMAP_FLAG_GET_DIRTY_BITMAP != 0
            || u.flags & !(DMA_UNMAP_FLAG_ALL | 1) != 0
        {
            return Err(libc::ENOTSUP);
        }
        if u.flags & DMA_UNMAP_FLAG_ALL != 0 {
            if u.address != 0 || u.size != 0 {
                return Err(libc::EINVAL);
            }
            self.device.dma_unmapping(0, u64::MAX);
            dma.unmap_all();
            s.ledger.clear();
        } else {
            self.device.dma_unmapping(u.address, u.size);
            dma.unmap(u.address, u.size)?;
            s.ledger.remove(u.address, u.size);
        }
        let reply = DmaUnmap {
            argsz: size_of::<DmaUnmap>() as u32,
            ..u
        };
        Ok(reply.as_bytes().to_vec())
    }
}

fn send_result(
    s: &ClientState,
    req: &Header,
    no_reply: bool,
    result: Handled,
    fd: Option<std::os::fd::BorrowedFd<'_>>,
) -> Result<(), Error> {
    if no_reply {
        return Ok(());
    }
    match result {
        Ok(payload) => {
            let fds: Vec<_> = fd.into_iter().collect();
            s.conn.send(&reply_header(req), &[&payload], &fds)
        }
        Err(errno) => s.conn.send(&error_header(req, errno), &[], &[]),
    }
}

/// The first bytes of a payload in hex, for trace logs (REGION_WRITE data
/// and DMA_MAP arguments fit; bulk transfers are cut).
struct HexPrefix<'a>(&'a [u8]);

impl std::fmt::Display for HexPrefix<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const SHOWN: usize = 48;
        for b in self.0.iter().take(SHOWN) {
            write!(f, "{b:02x}")?;
        }
        if self.0.len() > SHOWN {
            write!(f, "..")?;
        }
        Ok(())
    }
}
