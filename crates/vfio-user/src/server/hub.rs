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

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::epoll::{self, EventData, EventFlags};
use rustix::event::Timespec;

use super::{ClientState, Server};
use crate::conn::{error_header, Bell, Conn};
use crate::door::Door;
use crate::stop::StopWake;
use crate::wire::Header;
use crate::{Device, Error};

/// Epoll tokens besides the connections' (their slot's index).
const WAKE: u64 = u64::MAX;
const BELL: u64 = u64::MAX - 1;

/// One server among many: its door and its client, if it has one.
struct Slot<'a, D: Device> {
    name: String,
    server: Server<D>,
    door: &'a Door,
    client: Option<Served>,
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
/// thread per server. The caller runs [`Door::watch_all`] on their
/// listeners. Waits that end with nothing to do count in `idle` (none
/// while no client has a deadline: the wait has no timeout then).
pub fn serve_many<D: Device>(
    servers: Vec<(String, Server<D>, &Door)>,
    stop: &AtomicBool,
    wake: &StopWake,
    idle: &AtomicU64,
) -> Result<(), Error> {
    let bell = Arc::new(Bell::new()?);
    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(io)?;
    epoll::add(&ep, wake.fd(), EventData::new_u64(WAKE), EventFlags::IN).map_err(io)?;
    epoll::add(&ep, bell.fd(), EventData::new_u64(BELL), EventFlags::IN).map_err(io)?;
    let mut slots: Vec<Slot<'_, D>> = servers
        .into_iter()
        .map(|(name, server, door)| {
            door.set_bell(Arc::clone(&bell));
            Slot {
                name,
                server,
                door,
                client: None,
            }
        })
        .collect();
    let hub = Hub { ep, bell };
    let mut events = Vec::with_capacity(64);
    // Every slot is looked at: at start, and when the bell rang (a door
    // has a connection, or a waiting worker read a socket).
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
        let timeout = next_deadline(&slots).map(|d| {
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
                i => {
                    if let Some(slot) = usize::try_from(i).ok().and_then(|i| slots.get_mut(i)) {
                        hub.service(slot);
                    }
                }
            }
        }
        let now = Instant::now();
        for slot in &mut slots {
            if slot.client.as_ref().is_some_and(|c| c.more) {
                hub.service(slot);
            }
            if let Some(why) = slot
                .client
                .as_ref()
                .and_then(|c| c.overdue(&slot.server, now))
            {
                hub.finish(slot, Err(Error::Protocol(why)));
            }
        }
    }
    for slot in &mut slots {
        hub.finish(slot, Ok(()));
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
            let c = s.client.as_ref()?;
            if c.more {
                return Some(Instant::now());
            }
            let handshake = c.state.dma.is_none().then_some(c.handshake);
            let message = c.state.conn.message_deadline();
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
        if self.state.conn.message_deadline().is_some_and(|d| now >= d) {
            return Some("peer stalled in the middle of a message".into());
        }
        None
    }
}

/// The epoll every client connection is in, and the bell.
struct Hub {
    ep: std::os::fd::OwnedFd,
    bell: Arc<Bell>,
}

impl Hub {
    /// Takes the connection `slot`'s door has ready, if it has no client.
    fn admit<D: Device>(&self, slot: &mut Slot<'_, D>, index: usize) {
        if slot.client.is_some() {
            return;
        }
        let Ok(Some(stream)) = slot.door.try_next() else {
            return;
        };
        let _span = tracing::info_span!("controller", name = %slot.name).entered();
        let opts = &slot.server.opts;
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
        slot.client = Some(Served {
            handshake: Instant::now() + opts.handshake_timeout,
            state: ClientState::new(conn),
            more: false,
        });
    }

    /// Sends what waits, reads what came and handles each whole request
    /// of `slot`'s client; drops the client on an error.
    fn service<D: Device>(&self, slot: &mut Slot<'_, D>) {
        let Some(c) = &mut slot.client else {
            return;
        };
        let _span = tracing::info_span!("controller", name = %slot.name).entered();
        let conn = Arc::clone(&c.state.conn);
        if let Err(e) = conn.flush() {
            return self.finish(slot, Err(e));
        }
        // Requests read before an error (a VERSION, then a hang-up) are
        // handled first.
        let pumped = conn.pump();
        while let Some(msg) = conn.take_request() {
            let (command, started) = (msg.header.command, Instant::now());
            if let Err(e) = slot.server.handle(&mut c.state, msg) {
                return self.finish(slot, Err(e));
            }
            c.state.times.add(command, started.elapsed());
        }
        match pumped {
            Ok(more) => c.more = more,
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
                self.finish(slot, Err(e));
            }
            Err(e) => self.finish(slot, Err(e)),
        }
    }

    /// Ends `slot`'s client, if it has one, as [`Server::serve_door`] does.
    fn finish<D: Device>(&self, slot: &mut Slot<'_, D>, result: Result<(), Error>) {
        let Some(mut c) = slot.client.take() else {
            return;
        };
        let _span = tracing::info_span!("controller", name = %slot.name).entered();
        // Gone from the set before its fd can be closed and reused.
        if let Err(e) = epoll::delete(&self.ep, c.state.conn.fd().as_fd()) {
            tracing::debug!(error = %e, "removing a vfio-user connection from epoll");
        }
        slot.server.end_client(&mut c.state);
        slot.door.set_owner(None);
        match result {
            Ok(()) | Err(Error::Disconnected) => tracing::info!("vfio-user client disconnected"),
            Err(e) => tracing::warn!(error = %e, "vfio-user client dropped"),
        }
    }
}
