//! A live upgrade of every server a [`serve_many`](super::serve_many)
//! thread serves ([`HandoverAll`]): they share the process, so they go to
//! the next one together. The thread looks between two turns of its loop:
//! once every client is between two messages (none half read, no reply
//! waiting for room in its socket, none with a helper, none still
//! connecting), it pauses every device with a client (bounded drain),
//! answers what their workers read meanwhile and hands every server over.
//! A client not between two messages makes it wait and serve on, at most
//! [`HandoverAll::gather_bound`]; then the request is refused, saying
//! which controller and why. Nothing is paused while it waits.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Hub, Parts, Slot};
use crate::handover::{ClientParts, HandoverAll};
use crate::Device;

/// How soon a request that had to wait is looked at again.
pub(super) const RETRY: Duration = Duration::from_millis(10);

/// Why a handover did not happen.
enum Gather {
    /// A client is not between two messages: looked at again.
    NotYet(String),
    /// Refused or failed: every device runs on.
    Failed(String),
}

impl Hub {
    /// Serves a request of `h`, if one is asked (first looked at
    /// `asked_since`, `now` now): returns when it was first looked at
    /// while it waits, `None` once it is answered (or none is asked).
    pub(super) fn gather<D: Device>(
        &self,
        slots: &mut [Slot<'_, D>],
        h: &dyn HandoverAll<D>,
        asked_since: Option<Instant>,
        now: Instant,
    ) -> Option<Instant> {
        if !h.asked() {
            return None;
        }
        let since = asked_since.unwrap_or(now);
        match hand_over_all(slots, h) {
            Gather::NotYet(why) if now >= since + h.gather_bound() => {
                h.refuse(format!(
                    "{why}, for {:?}: every controller's client must be between two messages \
                     at once; try again",
                    h.gather_bound()
                ));
                None
            }
            Gather::NotYet(_) => Some(since),
            Gather::Failed(why) => {
                h.refuse(why);
                None
            }
        }
    }
}

/// Why `slot`'s client is not between two messages now, if it is not.
fn not_between<D: Device>(slot: &Slot<'_, D>) -> Option<String> {
    let name = &slot.name;
    if slot.away.load(Ordering::Acquire) {
        return Some(format!("{name}: a message that may wait is being handled"));
    }
    let conn = slot.conn.as_ref()?;
    let connecting = (slot.parts.lock().client.as_ref()).is_some_and(|c| c.state.dma.is_none());
    if connecting {
        return Some(format!(
            "{name}: a client is connecting (it has not sent VERSION yet)"
        ));
    }
    if conn.message_deadline().is_some() {
        return Some(format!("{name}: its client is half way through a message"));
    }
    if conn.has_unsent() {
        return Some(format!(
            "{name}: replies wait for room in its client's socket"
        ));
    }
    None
}

/// Hands every server over if every client is between two messages;
/// returns only if it did not (success ends the process).
fn hand_over_all<D: Device>(slots: &mut [Slot<'_, D>], h: &dyn HandoverAll<D>) -> Gather {
    if let Some(why) = slots.iter().find_map(not_between) {
        return Gather::NotYet(why);
    }
    let arcs: Vec<_> = slots.iter().map(|s| Arc::clone(&s.parts)).collect();
    let mut guards: Vec<_> = arcs.iter().map(|p| p.lock()).collect();
    let mut paused = Vec::new();
    for (i, g) in guards.iter_mut().enumerate() {
        if g.client.is_none() {
            continue;
        }
        if let Err(why) = h.pause(i, &mut g.server.device) {
            resume(h, &mut guards, &paused);
            return Gather::Failed(format!("{}: {why}", slots[i].name));
        }
        paused.push(i);
    }
    // Requests a worker read while it waited for a DMA reply: their
    // replies are owed by this process. None is read from the sockets
    // here, so none is left half read.
    for &i in &paused {
        let Parts { server, client, .. } = &mut *guards[i];
        let Some(c) = client.as_mut() else {
            continue;
        };
        let mut failed = None;
        while let Some(msg) = c.state.conn.take_request() {
            if let Err(e) = server.handle(&mut c.state, msg) {
                failed = Some(e);
                break;
            }
        }
        let failed = failed.or_else(|| c.state.conn.flush().err());
        let waiting = c.state.conn.message_deadline().is_some() || c.state.conn.has_unsent();
        if let Some(e) = failed {
            // The connection's error shows on the thread's next turn,
            // which drops that client.
            resume(h, &mut guards, &paused);
            return Gather::Failed(format!(
                "{}: the client's connection failed: {e}",
                slots[i].name
            ));
        }
        if waiting {
            resume(h, &mut guards, &paused);
            return Gather::NotYet(format!(
                "{}: its client's messages are under way",
                slots[i].name
            ));
        }
    }
    let why = {
        let mut servers = Vec::new();
        let mut refused = None;
        for (g, slot) in guards.iter_mut().zip(slots.iter()) {
            let Parts { server, client, .. } = &mut **g;
            let parts = match client.as_ref() {
                None => None,
                Some(c) => match (&c.state.dma, c.state.ledger.parts()) {
                    (Some(dma), Ok((maps, files))) => Some(ClientParts {
                        conn: c.state.conn.fd(),
                        max_xfer: dma.max_xfer(),
                        maps,
                        files,
                    }),
                    (_, Err(why)) => {
                        refused = Some(format!(
                            "{}: the client cannot be handed over: {why}",
                            slot.name
                        ));
                        break;
                    }
                    (None, _) => {
                        refused = Some(format!("{}: the client is connecting", slot.name));
                        break;
                    }
                },
            };
            servers.push((&mut server.device, parts));
        }
        match refused {
            Some(why) => why,
            None => h.transfer(servers),
        }
    };
    resume(h, &mut guards, &paused);
    Gather::Failed(why)
}

/// Starts the `paused` servers' devices again.
fn resume<D: Device>(
    h: &dyn HandoverAll<D>,
    guards: &mut [parking_lot::MutexGuard<'_, Parts<D>>],
    paused: &[usize],
) {
    for &i in paused {
        h.resume(i, &mut guards[i].server.device);
    }
}
