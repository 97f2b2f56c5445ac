//! Handing the served client over (a live upgrade, see [`crate::handover`]):
//! the part of the server loop that runs between two messages once a
//! [`Handover`] asks, and the wake that makes the loop see the request at
//! once instead of at its next stop poll.

use std::io::ErrorKind;
use std::os::fd::BorrowedFd;
use std::time::Instant;

use zerocopy::IntoBytes;

use super::{ClientState, Server};
use crate::conn::{Message, Wanted};
use crate::handover::{may_redo, ClientChange, ClientParts, Handover, Marked};
use crate::wire::{cmd, HEADER_SIZE};
use crate::{Device, Error};

impl<D: Device> Server<D> {
    /// Hands the client over (see [`crate::handover`]), between two
    /// messages; returns only if that failed (or was refused), with the
    /// device running again. An error is the connection's, met while
    /// answering the requests read before the handover.
    pub(super) fn hand_over(
        &mut self,
        s: &mut ClientState,
        h: &dyn Handover<D>,
    ) -> Result<(), Error> {
        if s.dma.is_none() {
            h.refuse("a client is connecting (it has not sent VERSION yet): try again".into());
            return Ok(());
        }
        if let Err(why) = h.pause(&mut self.device) {
            h.refuse(why);
            return Ok(());
        }
        // Requests a worker read while it waited for a DMA reply: their
        // replies are owed by this process. A deadline of now never starts
        // reading a message, so none is left half read.
        loop {
            let next = s.conn.wait(&Wanted::Request, Some(Instant::now()));
            let failed = match next {
                Ok(Some(msg)) => self.handle(s, msg).err(),
                Ok(None) => break,
                Err(e) => Some(e),
            };
            if let Some(e) = failed {
                h.resume(&mut self.device);
                h.refuse(format!("the client's connection failed: {e}"));
                return Err(e);
            }
        }
        let why = match (&s.dma, s.ledger.parts()) {
            (Some(dma), Ok((maps, files))) => {
                let parts = ClientParts {
                    conn: s.conn.fd(),
                    max_xfer: dma.max_xfer(),
                    maps,
                    files,
                };
                h.transfer(&mut self.device, Some(parts))
            }
            (_, Err(why)) => format!("the client cannot be handed over: {why}"),
            (None, _) => "the client went away".into(),
        };
        h.resume(&mut self.device);
        h.refuse(why);
        Ok(())
    }
}

/// Tells a supervising [`Handover`] what the message `command` just
/// handled changed in the client's fds (see [`Handover::client_changed`]);
/// a client whose maps cannot be handed over is told as gone, since no
/// successor could serve it.
pub(super) fn tell_supervisor<D: Device>(
    s: &ClientState,
    command: u16,
    device: &D,
    h: &dyn Handover<D>,
) {
    let negotiated = match command {
        cmd::VERSION => true,
        cmd::DMA_MAP | cmd::DMA_UNMAP => false,
        cmd::DEVICE_SET_IRQS => {
            h.client_changed(device, ClientChange::Irqs);
            return;
        }
        _ => return,
    };
    let Some(dma) = &s.dma else {
        return;
    };
    match s.ledger.parts() {
        Ok((maps, files)) => {
            let parts = ClientParts {
                conn: s.conn.fd(),
                max_xfer: dma.max_xfer(),
                maps,
                files,
            };
            h.client_changed(
                device,
                if negotiated {
                    ClientChange::Negotiated(parts)
                } else {
                    ClientChange::Maps(parts)
                },
            );
        }
        Err(why) => {
            tracing::warn!("the client can no longer be recovered after a crash: {why}");
            h.client_changed(device, ClientChange::Gone);
        }
    }
}

/// Empties a [`Handover::wake_fd`] once a wait ended without a message,
/// before the loop looks at [`Handover::asked`] again, so a request made
/// after that look leaves it readable and ends the next wait at once. A read error other than
/// "nothing left" leaves the fd readable too: the loop then merely turns
/// once more, and the request flag, not the fd, says what to do.
pub(super) fn drain_wake(fd: BorrowedFd<'_>) {
    let mut buf = [0u8; 64];
    // Bounded: a peer writing without end cannot keep the loop here.
    for _ in 0..16 {
        match rustix::io::read(fd, &mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if std::io::Error::from(e).kind() == ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// Drops what a dead server staged for a client that was not resumed, so
/// a new client's first reply is its own; `false` if the pipe could not
/// be emptied (its replies are then sent straight).
pub(super) fn discard_staged(pipe: &crate::ReplyPipe) -> bool {
    match pipe.discard() {
        Ok(0) => true,
        Ok(n) => {
            tracing::info!(
                "dropped {n} bytes of replies a dead server staged for a client that was not \
                 resumed"
            );
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, "emptying the reply pipe: replies are sent straight");
            false
        }
    }
}

/// `msg` as a supervised server marks it (see [`Marked::redo`]): kept to
/// handle again where [`may_redo`] says so, with the fds that needs (a
/// DMA_UNMAP's fd means nothing, and is not kept).
pub(super) fn marked(msg: &Message) -> Marked<'_> {
    let fds: &[std::os::fd::OwnedFd] = match msg.header.command {
        cmd::DMA_UNMAP => &[],
        _ => &msg.fds,
    };
    let redo = !msg.fds_truncated
        && may_redo(
            msg.header.command,
            HEADER_SIZE + msg.payload.len(),
            fds.len(),
        );
    Marked {
        msg_id: msg.header.msg_id,
        command: msg.header.command,
        redo: redo.then(|| [msg.header.as_bytes(), &msg.payload[..]]),
        fds: if redo { fds } else { &[] },
    }
}
