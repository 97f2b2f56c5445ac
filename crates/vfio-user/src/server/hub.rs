//! One thread for the clients of many servers ([`serve_many`]): it waits
//! in one epoll for every client connection, reads each message piece by
//! piece into its connection's buffer (`conn/pump.rs`) and handles it when
//! it is whole, so the threads of a process with many controllers do not
//! grow with their number. A client that half-sends a message, or stops
//! reading its replies, holds up no other: its bytes wait in its buffer
//! until its message deadline, its replies in its bounded queue.
//!
//! A device worker waiting for the reply to its DMA_READ/DMA_WRITE gets it
//! from this thread, or reads the socket itself while this thread is busy
//! with another message (and rings the bell so this thread looks at what
//! it read): a handler that waits for such a worker does not deadlock.
//!
//! A message whose handling may wait (DEVICE_RESET, DMA_UNMAP, a register
//! write the device says may wait, [`Device::write_may_wait`], such as an
//! NVMe controller's disable waiting for its commands, which may wait for
//! the client's DMA replies) is handed to a helper thread of its own, the
//! `vnvme-helper`, which takes that server and client until it is done:
//! their later requests wait in the connection's queue (in order), their
//! replies and DMA replies are still read here, and every other client is
//! served meanwhile. The helper rings the bell when done.
//!
//! A live upgrade of every server at once ([`serve_many_with`] with a
//! [`HandoverAll`]) is gathered here too (`hub/gather.rs`): between two
//! turns, once every client is between two messages.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::event::Timespec;

use super::{ClientState, Server};
use crate::conn::Message;
use crate::conn::{error_header, Bell, Conn};
use crate::door::Door;
use crate::handover::{Adopted, HandoverAll};
use crate::stop::StopWake;
use crate::wire::{cmd, read_prefix, Header, RegionAccess};
use crate::{Device, Error};

mod gather;

/// Epoll tokens besides the connections' (their slot's index).
const WAKE: u64 = u64::MAX;
const BELL: u64 = u64::MAX - 1;
/// A live upgrade is asked ([`HandoverAll::wake_fd`]).
const UPGRADE: u64 = u64::MAX - 2;

/// One server among many: its door, and its server and client.
struct Slot<'a, D: Device> {
    name: String,
    door: &'a Door,
    /// This thread's, or a helper's while `away`.
    parts: Arc<Mutex<Parts<D>>>,
    /// A helper has `parts` (set here, cleared by the helper when done).
    away: Arc<AtomicBool>,
    /// The client's connection, read here also while `away`.
    conn: Option<Arc<Conn>>,
}

struct Parts<D: Device> {
    server: Server<D>,
    client: Option<Served>,
    /// How a helper's message ended the client: it is dropped when back.
    failed: Option<Error>,
}

struct Served {
    state: ClientState,
    /// VERSION must have come by then.
    handshake: Instant,
    /// Its last read stopped after a batch: more may wait in the socket,
    /// and edge-triggered epoll will not say so again.
    more: bool,
}

/// Serves the clients of every `(name for the log, server, door)` on the
/// calling thread until `stop` (set before `wake` is woken): each door's
/// connections one at a time, as [`Server::serve_door`] does, with no
/// thread per server (a helper thread only while a message that may wait
/// is handled, see the module docs). The caller runs [`Door::watch_all`]
/// on their listeners. Waits that end with nothing to do count in `idle`
/// (none while no client has a deadline: the wait has no timeout then).
pub fn serve_many<D: Device + 'static>(
    servers: Vec<(String, Server<D>, &Door)>,
    stop: &AtomicBool,
    wake: &StopWake,
    idle: &AtomicU64,
) -> Result<(), Error> {
    let servers = servers
        .into_iter()
        .map(|(name, server, door)| (name, server, door, None))
        .collect();
    serve_many_with(servers, stop, wake, idle, None)
}

/// As [`serve_many`], each server serving its `Option<Adopted>` (a client
/// a live upgrade's old process handed over) first, and every server's
/// client handed over at once when `handover` asks (see `hub/gather.rs`).
pub fn serve_many_with<D: Device + 'static>(
    servers: Vec<(String, Server<D>, &Door, Option<Adopted>)>,
    stop: &AtomicBool,
    wake: &StopWake,
    idle: &AtomicU64,
    handover: Option<&dyn HandoverAll<D>>,
) -> Result<(), Error> {
    let bell = Arc::new(Bell::new()?);
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(io)?;
    epoll::add(&ep, wake.fd(), EventData::new_u64(WAKE), EventFlags::IN).map_err(io)?;
    epoll::add(&ep, bell.fd(), EventData::new_u64(BELL), EventFlags::IN).map_err(io)?;
    if let Some(h) = handover {
        let token = EventData::new_u64(UPGRADE);
        epoll::add(&ep, h.wake_fd(), token, EventFlags::IN).map_err(io)?;
    }
    let mut adopted = Vec::new();
    let mut slots: Vec<Slot<'_, D>> = servers
        .into_iter()
        .map(|(name, server, door, a)| {
            adopted.push(a);
            door.set_bell(Arc::clone(&bell));
            Slot {
                name,
                door,
                parts: Arc::new(Mutex::new(Parts {
                    server,
                    client: None,
                    failed: None,
                })),
                away: Arc::default(),
                conn: None,
            }
        })
        .collect();
    let hub = Hub { ep, bell };
    for (i, (slot, a)) in slots.iter_mut().zip(adopted).enumerate() {
        if let Some(a) = a {
            hub.adopt(slot, i, a);
        }
    }
    // When the upgrade being asked was first looked at.
    let mut asked_since: Option<Instant> = None;
    let mut events = Vec::with_capacity(64);
    // Every slot is looked at: at start, and when the bell rang (a door
    // has a connection, a waiting worker read a socket, a helper is done).
    let mut all = true;
    while !stop.load(Ordering::Relaxed) {
        if all {
            hub.bell.drain();
            for (i, slot) in slots.iter_mut().enumerate() {
                hub.admit(slot, i);
                hub.service(slot);
            }
            all = false;
        }
        // While an upgrade waits for every client to be between two
        // messages, looked at again soon.
        let retry = asked_since.map(|_| Instant::now() + gather::RETRY);
        let timeout = [next_deadline(&slots), retry]
            .into_iter()
            .flatten()
            .min()
            .map(|d| {
                // Rounded up to epoll's milliseconds, so the wait does not end
                // just before the deadline and spin to it.
                let t = d.saturating_duration_since(Instant::now()) + Duration::from_nanos(999_999);
                Timespec {
                    tv_sec: i64::try_from(t.as_secs()).unwrap_or(i64::MAX),
                    tv_nsec: i64::from(t.subsec_nanos()),
                }
            });
        events.clear();
        match epoll::wait(
            &hub.ep,
            rustix::buffer::spare_capacity(&mut events),
            timeout.as_ref(),
        ) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io(e)),
        }
        if events.is_empty() {
            idle.fetch_add(1, Ordering::Relaxed);
        }
        for ev in &events {
            match ev.data.u64() {
                WAKE => {}
                BELL => all = true,
                UPGRADE => {
                    // Emptied before `asked` is looked at: a request is
                    // flagged before its byte is written.
                    if let Some(h) = handover {
                        super::handing::drain_wake(h.wake_fd());
                    }
                }
                i => {
                    if let Some(slot) = usize::try_from(i).ok().and_then(|i| slots.get_mut(i)) {
                        hub.service(slot);
                    }
                }
            }
        }
        let now = Instant::now();
        for slot in &mut slots {
            hub.look_at_deadlines(slot, now);
        }
        if let Some(h) = handover {
            asked_since = hub.gather(&mut slots, h, asked_since, now);
        }
    }
    for slot in &mut slots {
        // A helper's waits end with the connection.
        if let Some(c) = &slot.conn {
            c.shutdown();
        }
        hub.finish(slot, &mut slot.parts.clone().lock(), Ok(()));
    }
    Ok(())
}

fn io(e: rustix::io::Errno) -> Error {
    Error::Io(e.into())
}

/// The earliest deadline of any client: now if one has more to read.
fn next_deadline<D: Device>(slots: &[Slot<'_, D>]) -> Option<Instant> {
    slots
        .iter()
        .filter_map(|s| {
            let conn = s.conn.as_ref()?;
            let message = conn.message_deadline();
            if s.away.load(Ordering::Acquire) {
                return message;
            }
            let parts = s.parts.lock();
            let c = parts.client.as_ref()?;
            if c.more {
                return Some(Instant::now());
            }
            let handshake = c.state.dma.is_none().then_some(c.handshake);
            [handshake, message].into_iter().flatten().min()
        })
        .min()
}

impl Served {
    /// Why the client is dropped now, if its time is up: no VERSION within
    /// the handshake timeout, or a message begun and not finished within
    /// the message timeout.
    fn overdue<D: Device>(&self, server: &Server<D>, now: Instant) -> Option<String> {
        if self.state.dma.is_none() && now >= self.handshake {
            return Some(format!(
                "no valid VERSION within {:?} of connecting",
                server.opts.handshake_timeout
            ));
        }
        if stalled(&self.state.conn, now) {
            return Some("peer stalled in the middle of a message".into());
        }
        None
    }
}

fn stalled(conn: &Conn, now: Instant) -> bool {
    conn.message_deadline().is_some_and(|d| now >= d)
}

/// Whether handling `msg` may wait (see the module docs).
fn may_wait<D: Device>(device: &D, msg: &Message) -> bool {
    match msg.header.command {
        cmd::DEVICE_RESET | cmd::DMA_UNMAP => true,
        cmd::REGION_WRITE => read_prefix::<RegionAccess>(&msg.payload)
            .is_some_and(|a| device.write_may_wait(a.region, a.offset)),
        _ => false,
    }
}

/// The epoll every client connection is in, and the bell.
struct Hub {
    ep: std::os::fd::OwnedFd,
    bell: Arc<Bell>,
}

impl Hub {
    /// Serves `a`, a client the previous process handed over, as `slot`'s
    /// (number `index`); if its connection cannot be watched it is dropped.
    fn adopt<D: Device>(&self, slot: &mut Slot<'_, D>, index: usize, a: Adopted) {
        let _span = tracing::info_span!("controller", name = %slot.name).entered();
        let conn = Arc::clone(&a.conn);
        let parts_arc = Arc::clone(&slot.parts);
        let mut parts = parts_arc.lock();
        let state = parts.server.adopted_state(a);
        // More may wait in its socket already: looked at on the first turn.
        parts.client = Some(Served {
            state,
            handshake: Instant::now(),
            more: true,
        });
        slot.door.set_owner(Some(Arc::clone(&conn)));
        slot.conn = Some(Arc::clone(&conn));
        let token = EventData::new_u64(index as u64);
        let flags = EventFlags::IN | EventFlags::OUT | EventFlags::RDHUP | EventFlags::ET;
        let watched = conn
            .pump_with(Arc::clone(&self.bell))
            .map_err(Error::Io)
            .and_then(|()| epoll::add(&self.ep, conn.fd(), token, flags).map_err(io));
        match watched {
            Ok(()) => tracing::info!("vfio-user client handed over by the previous process"),
            Err(e) => {
                tracing::warn!(error = %e, "the handed-over vfio-user client is dropped: watching its socket");
                self.finish(slot, &mut parts, Err(e));
            }
        }
    }

    /// Takes the connection `slot`'s door has ready, if it has no client.
    fn admit<D: Device>(&self, slot: &mut Slot<'_, D>, index: usize) {
        if slot.conn.is_some() {
            return;
        }
        let Ok(Some(stream)) = slot.door.try_next() else {
            return;
        };
        let _span = tracing::info_span!("controller", name = %slot.name).entered();
        let mut parts = slot.parts.lock();
        let opts = &parts.server.opts;
        let conn = match Conn::pumped(stream, opts.message_timeout, Arc::clone(&self.bell)) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                tracing::warn!(error = %e, "vfio-user client dropped: setting its socket up");
                slot.door.set_owner(None);
                return;
            }
        };
        slot.door.set_owner(Some(Arc::clone(&conn)));
        let token = EventData::new_u64(index as u64);
        let flags = EventFlags::IN | EventFlags::OUT | EventFlags::RDHUP | EventFlags::ET;
        if let Err(e) = epoll::add(&self.ep, conn.fd(), token, flags) {
            tracing::warn!(error = %e, "vfio-user client dropped: watching its socket");
            conn.shutdown();
            slot.door.set_owner(None);
            return;
        }
        tracing::info!("vfio-user client connected");
        let handshake = Instant::now() + opts.handshake_timeout;
        parts.client = Some(Served {
            handshake,
            state: ClientState::new(Arc::clone(&conn)),
            more: false,
        });
        slot.conn = Some(conn);
    }

    /// Sends what waits, reads what came and handles each whole request
    /// of `slot`'s client (or hands it to a helper); drops the client on
    /// an error.
    fn service<D: Device + 'static>(&self, slot: &mut Slot<'_, D>) {
        let Some(conn) = slot.conn.clone() else {
            return;
        };
        let _span = tracing::info_span!("controller", name = %slot.name).entered();
        let away = slot.away.load(Ordering::Acquire);
        let parts_arc = Arc::clone(&slot.parts);
        if !away {
            let mut parts = parts_arc.lock();
            if let Some(e) = parts.failed.take() {
                return self.finish(slot, &mut parts, Err(e));
            }
        }
        if let Err(e) = conn.flush() {
            if !away {
                self.finish(slot, &mut parts_arc.lock(), Err(e));
            }
            return;
        }
        let pumped = conn.pump();
        if away {
            // The helper's client: its requests wait; an error shows in
            // the helper's wait, and here when it is back.
            return;
        }
        let mut guard = parts_arc.lock();
        let parts = &mut *guard;
        // Requests read before an error (a VERSION, then a hang-up) are
        // handled first.
        while let Some(msg) = conn.take_request() {
            let Some(c) = parts.client.as_mut() else {
                return;
            };
            if may_wait(parts.server.device(), &msg) {
                drop(guard);
                return self.hand_to_helper(slot, msg);
            }
            let (command, started) = (msg.header.command, Instant::now());
            if let Err(e) = parts.server.handle(&mut c.state, msg) {
                return self.finish(slot, parts, Err(e));
            }
            c.state.times.add(command, started.elapsed());
        }
        match pumped {
            Ok(more) => {
                if let Some(c) = parts.client.as_mut() {
                    c.more = more;
                }
            }
            Err(Error::Refused {
                msg_id,
                command,
                size,
                errno,
            }) => {
                // The body was not read, so the stream cannot be
                // resynchronised: answer, then close.
                let req = Header {
                    msg_id,
                    command,
                    ..Default::default()
                };
                let _ = conn.send(&error_header(&req, errno), &[], &[]);
                let _ = conn.flush();
                let e = Error::Refused {
                    msg_id,
                    command,
                    size,
                    errno,
                };
                self.finish(slot, parts, Err(e));
            }
            Err(e) => self.finish(slot, parts, Err(e)),
        }
    }

    /// Hands `msg` (one that may wait) and `slot`'s server and client to
    /// a thread of its own, which rings the bell when done. If no thread
    /// can start, it is handled here.
    fn hand_to_helper<D: Device + 'static>(&self, slot: &mut Slot<'_, D>, msg: Message) {
        let parts = Arc::clone(&slot.parts);
        let away = Arc::clone(&slot.away);
        let bell = Arc::clone(&self.bell);
        let name = slot.name.clone();
        away.store(true, Ordering::Release);
        // Given back by the thread, or here if it never starts.
        let msg = Arc::new(Mutex::new(Some(msg)));
        let given = Arc::clone(&msg);
        let started = std::thread::Builder::new()
            .name("vnvme-helper".into())
            .spawn(move || {
                let _span = tracing::info_span!("controller", name = %name).entered();
                if let Some(msg) = given.lock().take() {
                    handle_one(&mut parts.lock(), msg);
                }
                away.store(false, Ordering::Release);
                bell.ring();
            });
        if let Err(e) = started {
            tracing::warn!(error = %e, "starting a helper thread: the message is handled here");
            slot.away.store(false, Ordering::Release);
            if let Some(msg) = msg.lock().take() {
                handle_one(&mut slot.parts.lock(), msg);
            }
            self.bell.ring();
        }
    }

    /// Drops clients whose time is up: here, or for a helper's client,
    /// its connection is shut down (which ends the helper's waits) and it
    /// is dropped when the helper is done.
    fn look_at_deadlines<D: Device + 'static>(&self, slot: &mut Slot<'_, D>, now: Instant) {
        let Some(conn) = slot.conn.clone() else {
            return;
        };
        if slot.away.load(Ordering::Acquire) {
            if stalled(&conn, now) {
                conn.shutdown();
            }
            return;
        }
        let parts_arc = Arc::clone(&slot.parts);
        let mut parts = parts_arc.lock();
        if parts.client.as_ref().is_some_and(|c| c.more) {
            drop(parts);
            self.service(slot);
            parts = parts_arc.lock();
        }
        let why = parts
            .client
            .as_ref()
            .and_then(|c| c.overdue(&parts.server, now));
        if let Some(why) = why {
            self.finish(slot, &mut parts, Err(Error::Protocol(why)));
        }
    }

    /// Ends `slot`'s client, if it has one, as [`Server::serve_door`] does.
    fn finish<D: Device>(
        &self,
        slot: &mut Slot<'_, D>,
        parts: &mut Parts<D>,
        result: Result<(), Error>,
    ) {
        slot.conn = None;
        let Some(mut c) = parts.client.take() else {
            return;
        };
        let _span = tracing::info_span!("controller", name = %slot.name).entered();
        // Gone from the set before its fd can be closed and reused.
        if let Err(e) = epoll::delete(&self.ep, c.state.conn.fd().as_fd()) {
            tracing::debug!(error = %e, "removing a vfio-user connection from epoll");
        }
        parts.server.end_client(&mut c.state);
        slot.door.set_owner(None);
        // A connection the door took while this client was being dropped
        // (its bell rang then, and `admit` found the slot still taken)
        // is admitted on the next turn, not left waiting for another bell.
        self.bell.ring();
        match result {
            Ok(()) | Err(Error::Disconnected) => tracing::info!("vfio-user client disconnected"),
            Err(e) => tracing::warn!(error = %e, "vfio-user client dropped"),
        }
    }
}

/// Handles one request of `parts`' client (on a helper thread); an error
/// is kept for the serving thread, which drops the client.
fn handle_one<D: Device>(parts: &mut Parts<D>, msg: Message) {
    let Some(c) = parts.client.as_mut() else {
        return;
    };
    let (command, started) = (msg.header.command, Instant::now());
    match parts.server.handle(&mut c.state, msg) {
        Ok(()) => c.state.times.add(command, started.elapsed()),
        Err(e) => parts.failed = Some(e),
    }
}
