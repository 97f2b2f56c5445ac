//! What a supervised server tells its supervisor, one note per datagram on
//! a `SOCK_SEQPACKET` socketpair: a JSON object, with at most one fd
//! (SCM_RIGHTS) when the note names one. Both ends are this binary, but the
//! supervisor still checks what it reads (a child's bug must not make it
//! keep a wrong fd or panic): a note that does not parse, or an fd missing
//! or extra, is logged and dropped.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};

/// Largest note read: notes are a few dozen bytes.
const MAX_NOTE: usize = 4096;

/// One change in what a successor would need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Note {
    /// A client negotiated; the fd is its connection. What the previous
    /// client left is forgotten.
    Client {
        max_xfer: usize,
        /// Names the client in the crash area's slots, so a slot of a
        /// client gone before is never restored onto this one.
        #[serde(default)]
        serial: u64,
    },
    /// BAR0's doorbell memfd (adaptive and mmap-poll), with the fd.
    Doorbells,
    /// A file behind the client's DMA maps, kept under `id`, with the fd.
    File { id: u64 },
    /// The last map in file `id` went.
    DropFile { id: u64 },
    /// The interrupt eventfds are set again: the ones sent before are
    /// forgotten, the new ones follow.
    IrqsCleared,
    /// MSI-X (or MSI) vector `index`'s eventfd, with the fd.
    Vector { index: usize },
    /// INTx's eventfd, with the fd.
    Intx,
    /// The client went: everything of it is forgotten.
    Gone,
    /// Fd `index` of the `of` a vfio-user message carries, with the fd,
    /// sent before the message is marked as handled, under an `id` the
    /// crash area's mark names (see `crash_area::handling`): the next
    /// child handles the message again with them. An id other than the
    /// one held replaces the fds held.
    MessageFd { id: u64, index: usize, of: usize },
    /// The memfd `ram` namespace `nsid` keeps its data in, with the fd:
    /// the server's, not the client's, so kept across clients and
    /// children (it replaces the one sent before for `nsid`).
    Ram { nsid: u32 },
    /// A live upgrade started its new process, `pid`, which is not ready
    /// yet: a crash of this server kills it (it must not serve the client
    /// beside the server started after the crash).
    Successor { pid: u32 },
    /// The new process failed and is gone: this server serves on.
    SuccessorFailed,
    /// The new process `pid`, running `exe`, serves from now on: this
    /// server exits next, and the supervisor adopts `pid` and starts
    /// `exe` after a crash.
    HandedOver { pid: u32, exe: String },
}

impl Note {
    /// Whether the note carries an fd.
    pub fn has_fd(&self) -> bool {
        matches!(
            self,
            Note::Client { .. }
                | Note::Doorbells
                | Note::File { .. }
                | Note::Vector { .. }
                | Note::Intx
                | Note::MessageFd { .. }
                | Note::Ram { .. }
        )
    }
}

/// Sends `note` (with `fd` exactly when the note takes one).
pub fn send(sock: BorrowedFd<'_>, note: &Note, fd: Option<BorrowedFd<'_>>) -> std::io::Result<()> {
    let bytes = serde_json::to_vec(note).map_err(std::io::Error::other)?;
    let fds: Vec<BorrowedFd<'_>> = fd.into_iter().collect();
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(std::io::Error::other("no room for the fd"));
    }
    loop {
        match rustix::net::sendmsg(
            sock,
            &[std::io::IoSlice::new(&bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// What [`recv`] read.
#[derive(Debug)]
pub enum Received {
    Note(Note, Option<OwnedFd>),
    /// A datagram that is not a sound note (why), its fds closed.
    Bad(String),
    /// The child's end is closed.
    Closed,
    /// Nothing to read now.
    Empty,
}

/// Reads one note without blocking.
pub fn recv(sock: impl AsFd) -> std::io::Result<Received> {
    let mut buf = vec![0u8; MAX_NOTE];
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(4))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let msg = loop {
        match rustix::net::recvmsg(
            sock.as_fd(),
            &mut [std::io::IoSliceMut::new(&mut buf)],
            &mut control,
            RecvFlags::DONTWAIT | RecvFlags::CMSG_CLOEXEC,
        ) {
            Ok(m) => break m,
            Err(rustix::io::Errno::INTR) => continue,
            Err(rustix::io::Errno::AGAIN) => return Ok(Received::Empty),
            Err(e) => return Err(e.into()),
        }
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    for m in control.drain() {
        if let RecvAncillaryMessage::ScmRights(got) = m {
            fds.extend(got);
        }
    }
    if msg.bytes == 0 && fds.is_empty() {
        return Ok(Received::Closed);
    }
    if msg.flags.contains(rustix::net::ReturnFlags::TRUNC)
        || msg.flags.contains(rustix::net::ReturnFlags::CTRUNC)
    {
        return Ok(Received::Bad("a note longer than its buffer".into()));
    }
    let note: Note = match serde_json::from_slice(&buf[..msg.bytes]) {
        Ok(n) => n,
        Err(e) => return Ok(Received::Bad(format!("a note that is not one ({e})"))),
    };
    let want = usize::from(note.has_fd());
    if fds.len() != want {
        return Ok(Received::Bad(format!(
            "{note:?} came with {} fds, it takes {want}",
            fds.len()
        )));
    }
    Ok(Received::Note(note, fds.pop()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_and_its_fd_arrive_together_and_a_missing_fd_is_refused() {
        use rustix::net::{AddressFamily, SocketFlags, SocketType};
        let (a, b) = rustix::net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        send(a.as_fd(), &Note::File { id: 7 }, Some(file.as_fd())).unwrap();
        send(a.as_fd(), &Note::Gone, None).unwrap();
        send(a.as_fd(), &Note::Intx, None).unwrap();
        match recv(&b).unwrap() {
            Received::Note(Note::File { id: 7 }, Some(_)) => {}
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            recv(&b).unwrap(),
            Received::Note(Note::Gone, None)
        ));
        assert!(matches!(recv(&b).unwrap(), Received::Bad(_)));
        assert!(matches!(recv(&b).unwrap(), Received::Empty));
        drop(a);
        assert!(matches!(recv(&b).unwrap(), Received::Closed));
    }
}
