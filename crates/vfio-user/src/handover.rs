//! Handing the served client to another process (a live upgrade).
//!
//! A vfio-user client does not reconnect (QEMU's proxy moves to an error
//! state, SPDK's host gives up), so a new server process can only serve it
//! on the very connection, guest memory and interrupt eventfds it has.
//! These are fds, which a process can pass on. The server keeps what a
//! successor needs for that:
//!
//! * the DMA maps and, for each file behind them, the fd the client gave
//!   (`DmaLedger`; the mapping alone cannot be passed on);
//! * the connection, at a message boundary: the handover runs between two
//!   requests, after the device's work stopped and the requests its
//!   workers read while waiting for a reply are answered, so nothing is
//!   half read and every request read has its reply.
//!
//! What to hand over and how is the [`Handover`] implementation's business
//! (the binary's: the controller's state, the process to start). The
//! successor serves the connection again with [`Adopted`] and
//! [`Server::serve_listener_with`](crate::Server::serve_listener_with).

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::conn::Conn;
use crate::dma::{DmaLimits, DmaSpace};

/// Most distinct files a client's DMA maps may lie in for the client to
/// be handed over: each costs this process an fd for as long as it is
/// mapped. QEMU uses a few (one memfd per RAM block); a client beyond it
/// is served as before, and an upgrade is refused.
pub const MAX_HANDED_FILES: usize = 256;

/// One DMA map as the successor makes it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HandedMap {
    pub iova: u64,
    pub size: u64,
    /// Offset of the map in its file.
    pub offset: u64,
    pub readable: bool,
    pub writable: bool,
    /// Index into the handed files; `None`: a map without an fd, reached
    /// with DMA_READ/DMA_WRITE messages.
    pub file: Option<usize>,
}

/// The client's parts a [`Handover`] passes on (borrowed from the server,
/// which keeps them until the process ends or the handover fails).
#[derive(Debug)]
pub struct ClientParts<'a> {
    /// The connection, between two messages.
    pub conn: BorrowedFd<'a>,
    /// The `max_data_xfer_size` the client negotiated.
    pub max_xfer: usize,
    pub maps: Vec<HandedMap>,
    /// The files the maps lie in, as [`HandedMap::file`] indexes them.
    pub files: Vec<BorrowedFd<'a>>,
}

/// Most bytes of a message (header included) a supervised server keeps
/// to handle it again after a crash ([`Marked::redo`]): a DMA_MAP (48
/// bytes), a DMA_UNMAP (40), a region info request (48) or a SET_IRQS
/// (36, and one byte per vector with DATA_BOOL: up to 476 vectors) fit.
/// The crash area's header page gives it its room.
pub const MAX_REDO_BYTES: usize = 512;

/// Most bytes of a region access kept to handle it again: up to 64 bytes
/// of data (registers, doorbells, the MSI-X table, config space).
pub const REGION_REDO_BYTES: usize = crate::wire::HEADER_SIZE + 16 + 64;

/// Whether a message of `command`, `len` bytes (header included) and
/// carrying the `fds` it needs, handled a second time after a crash ends
/// as handling it once, against a state that may or may not hold its
/// effect already:
///
/// * a region read or write without fds: NVMe's registers, doorbells, the
///   MSI-X table and config space take the same write twice to the same
///   end, and a read changes nothing;
/// * DMA_MAP (its fd, if any): a map already there exactly as asked is
///   answered as done (the server's `dma_map`); another one overlapping
///   is refused as ever;
/// * DMA_UNMAP (an fd SPDK sends with it means nothing and is not kept):
///   a range already empty unmaps nothing and is answered as done;
/// * SET_IRQS (its eventfds): the same fds set again are the same state;
///   a DATA_BOOL trigger fires its interrupts again (a spurious
///   interrupt, which drivers tolerate);
/// * a region info request: it changes nothing. Its reply carries the
///   doorbell page's fd and is sent straight, not staged, so the server
///   drops the kept bytes just before it sends that reply (see
///   `server.rs`): a kill from there on leaves the old doubt.
pub fn may_redo(command: u16, len: usize, fds: usize) -> bool {
    use crate::wire::cmd;
    match command {
        cmd::REGION_READ | cmd::REGION_WRITE => fds == 0 && len <= REGION_REDO_BYTES,
        cmd::DMA_MAP => fds <= 1 && len <= MAX_REDO_BYTES,
        cmd::DMA_UNMAP | cmd::DEVICE_GET_REGION_INFO => fds == 0 && len <= MAX_REDO_BYTES,
        cmd::DEVICE_SET_IRQS => fds <= crate::conn::MAX_MSG_FDS && len <= MAX_REDO_BYTES,
        _ => false,
    }
}

/// The message a supervised server starts handling (see
/// [`Handover::handling`]).
#[derive(Debug, Clone, Copy)]
pub struct Marked<'a> {
    pub msg_id: u16,
    pub command: u16,
    /// The whole message (header, payload), when handling it a second
    /// time after a crash ends as handling it once ([`may_redo`]). `None`:
    /// a crash while it is marked ends the connection.
    pub redo: Option<[&'a [u8]; 2]>,
    /// The fds handling it again needs (with [`redo`](Self::redo) only):
    /// the supervisor must hold copies before the message is handled.
    pub fds: &'a [OwnedFd],
}

/// What changed in the client's fds, for a supervisor (see
/// [`Handover::client_changed`]).
#[derive(Debug)]
pub enum ClientChange<'a> {
    /// The client negotiated (VERSION): its connection is served.
    Negotiated(ClientParts<'a>),
    /// A DMA_MAP or DMA_UNMAP: the maps and their files now.
    Maps(ClientParts<'a>),
    /// A SET_IRQS: the device's interrupt eventfds now.
    Irqs,
    /// The client went (or can no longer be handed over).
    Gone,
}

/// What the binary does for a live upgrade; the server calls it between
/// two messages (or while no client is connected) once [`asked`](Self::asked)
/// says so.
pub trait Handover<D>: Sync {
    /// Whether a handover is asked for.
    fn asked(&self) -> bool;
    /// A non-blocking fd (socket, pipe or eventfd) that becomes readable
    /// when a handover is asked, so the server loop, waiting for the
    /// client's next message, sees the request at once; the server empties
    /// it when a wait ends without a message, before it looks at
    /// [`asked`](Self::asked) again. `None`: the request
    /// is seen at the loop's next stop poll (up to 100 ms later).
    fn wake_fd(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// Takes the request back, refused for `why`; serving goes on.
    fn refuse(&self, why: String);
    /// Stops the device's work for a save (bounded); `Err`: why not, and
    /// the device runs on.
    fn pause(&self, device: &mut D) -> Result<(), String>;
    /// Starts the device's work again after a handover that failed.
    fn resume(&self, device: &mut D);
    /// Whether the server's fds are forwarded to a supervisor as they
    /// change (`vnvme serve --supervise`); only then does the server call
    /// [`client_changed`](Self::client_changed), so an unsupervised one
    /// pays nothing for it.
    fn supervised(&self) -> bool {
        false
    }
    /// The client's fds changed (called between two messages, or once it
    /// went): a supervised server forwards what changed.
    fn client_changed(&self, _device: &D, _change: ClientChange<'_>) {}
    /// A supervised server between two messages (after one was handled,
    /// or a wait ended without one): keeps what a crash would lose up to
    /// date (the binary's crash area). Called only when
    /// [`supervised`](Self::supervised).
    fn checkpoint(&self, _device: &D) {}
    /// A supervised server starts handling a message (`Some`), or has
    /// handled it and kept its effect (`None`, after
    /// [`checkpoint`](Self::checkpoint)): a crash in between leaves a
    /// message whose effect is not known, which a successor must know
    /// (and may handle again: [`Marked::redo`]). Called only when
    /// [`supervised`](Self::supervised).
    fn handling(&self, _msg: Option<Marked<'_>>) {}
    /// Where a supervised server stages its replies until the message is
    /// no longer marked as handled (see `conn/staged.rs`); `None`: they
    /// are sent at once. Asked once per client.
    fn reply_pipe(&self) -> Option<std::sync::Arc<crate::ReplyPipe>> {
        None
    }
    /// Gives the client (`None`: no client is connected) to the next
    /// process. On success it ends this process without touching anything
    /// the next one now serves (no shutdown of the connection, no socket
    /// file removed), so it returns only on failure, with why.
    fn transfer(&self, device: &mut D, client: Option<ClientParts<'_>>) -> String;
}

/// What the binary does for a live upgrade of every server one
/// [`serve_many`](crate::serve_many) thread serves (`[[controllers]]`):
/// they go to the next process together, since they share the process.
/// That thread waits until every client is between two messages (none half
/// read, no reply waiting for room in its socket, none in a helper), at
/// most [`gather_bound`](Self::gather_bound), then pauses each device with
/// a client, answers the requests their workers read meanwhile, and calls
/// [`transfer`](Self::transfer) with every server's parts.
pub trait HandoverAll<D>: Sync {
    /// Whether a handover is asked for.
    fn asked(&self) -> bool;
    /// A non-blocking fd readable once a handover is asked (see
    /// [`Handover::wake_fd`]); emptied by the serving thread.
    fn wake_fd(&self) -> BorrowedFd<'_>;
    /// Most time to wait for every client to reach a point between two
    /// messages before the request is refused.
    fn gather_bound(&self) -> std::time::Duration;
    /// Takes the request back, refused for `why`; serving goes on.
    fn refuse(&self, why: String);
    /// Stops server `index`'s device's work for a save (bounded); `Err`:
    /// why not, and the device runs on.
    fn pause(&self, index: usize, device: &mut D) -> Result<(), String>;
    /// Starts server `index`'s device's work again after a failed handover.
    fn resume(&self, index: usize, device: &mut D);
    /// Gives every server's device and client (`None`: no client) to the
    /// next process, in the order the servers were given. On success it
    /// ends this process without touching what the next one serves, so it
    /// returns only on failure, with why.
    fn transfer(&self, servers: Vec<(&mut D, Option<ClientParts<'_>>)>) -> String;
}

/// Which file an fd is, for sharing one kept fd among the maps in it: the
/// access mode too, since a read-only fd cannot back a writable map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct FileKey {
    dev: u64,
    ino: u64,
    writable: bool,
}

/// Which file `fd` is (see [`FileKey`]).
fn file_key(fd: &OwnedFd) -> Result<FileKey, String> {
    let st = rustix::fs::fstat(fd).map_err(|e| format!("fstat of a DMA map's fd: {e}"))?;
    let writable = rustix::fs::fcntl_getfl(fd)
        .is_ok_and(|f| f & rustix::fs::OFlags::ACCMODE == rustix::fs::OFlags::RDWR);
    Ok(FileKey {
        dev: st.st_dev,
        ino: st.st_ino,
        writable,
    })
}

#[derive(Debug)]
struct KeptFile {
    fd: Arc<OwnedFd>,
    maps: usize,
}

/// The client's DMA maps with the fds behind them (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct DmaLedger {
    maps: BTreeMap<u64, (HandedMap, Option<FileKey>)>,
    files: HashMap<FileKey, KeptFile>,
    /// A map's fd could not be kept (too many files, or fstat failed): the
    /// client can no longer be handed over, and says why.
    lost: Option<String>,
}

impl DmaLedger {
    /// Records a map the space accepted, keeping `fd` if its file is new.
    pub(crate) fn add(&mut self, mut map: HandedMap, fd: Option<OwnedFd>) {
        let key = match fd {
            None => None,
            Some(fd) => match self.keep(fd) {
                Ok(key) => Some(key),
                Err(why) => {
                    self.lost.get_or_insert(why);
                    None
                }
            },
        };
        map.file = None;
        self.maps.insert(map.iova, (map, key));
    }

    fn keep(&mut self, fd: OwnedFd) -> Result<FileKey, String> {
        let key = file_key(&fd)?;
        if let Some(kept) = self.files.get_mut(&key) {
            kept.maps += 1;
            return Ok(key);
        }
        if self.files.len() >= MAX_HANDED_FILES {
            return Err(format!(
                "the client's DMA maps lie in more than {MAX_HANDED_FILES} files"
            ));
        }
        self.files.insert(
            key,
            KeptFile {
                fd: Arc::new(fd),
                maps: 1,
            },
        );
        Ok(key)
    }

    /// Whether `map` (over `fd`'s file) is recorded exactly so: its
    /// range, offset, access and file.
    pub(crate) fn holds(&self, map: &HandedMap, fd: Option<&OwnedFd>) -> bool {
        let Some((kept, key)) = self.maps.get(&map.iova) else {
            return false;
        };
        let same_file = match (fd, key) {
            (None, None) => true,
            (Some(fd), Some(key)) => file_key(fd).is_ok_and(|k| k == *key),
            _ => false,
        };
        same_file
            && (kept.size, kept.offset, kept.readable, kept.writable)
                == (map.size, map.offset, map.readable, map.writable)
    }

    /// Forgets the maps in `[iova, iova + size)` (the space removed them).
    pub(crate) fn remove(&mut self, iova: u64, size: u64) {
        let last = iova.saturating_add(size.saturating_sub(1));
        let gone: Vec<u64> = self.maps.range(iova..=last).map(|(k, _)| *k).collect();
        for k in gone {
            if let Some((_, Some(key))) = self.maps.remove(&k) {
                if let Some(kept) = self.files.get_mut(&key) {
                    kept.maps -= 1;
                    if kept.maps == 0 {
                        self.files.remove(&key);
                    }
                }
            }
        }
    }

    pub(crate) fn clear(&mut self) {
        self.maps.clear();
        self.files.clear();
    }

    /// The maps and files for a successor, or why the client cannot be
    /// handed over.
    pub(crate) fn parts(&self) -> Result<(Vec<HandedMap>, Vec<BorrowedFd<'_>>), String> {
        if let Some(why) = &self.lost {
            return Err(why.clone());
        }
        let mut index = HashMap::new();
        let mut files = Vec::new();
        let mut maps = Vec::new();
        for (map, key) in self.maps.values() {
            let mut map = map.clone();
            if let Some(key) = key {
                let kept = self
                    .files
                    .get(key)
                    .ok_or_else(|| "a DMA map's file was forgotten".to_string())?;
                let i = *index.entry(*key).or_insert_with(|| {
                    files.push(kept.fd.as_fd());
                    files.len() - 1
                });
                map.file = Some(i);
            }
            maps.push(map);
        }
        Ok((maps, files))
    }
}

/// Why a handed-over client cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum AdoptError {
    #[error("framing the handed-over connection")]
    Conn(#[source] std::io::Error),
    #[error(
        "DMA map {index} ({iova:#x}+{size:#x}) names file {file}, and {files} were handed over"
    )]
    NoSuchFile {
        index: usize,
        iova: u64,
        size: u64,
        file: usize,
        files: usize,
    },
    #[error("DMA map {index} ({iova:#x}+{size:#x}) could not be made again (errno {errno})")]
    Map {
        index: usize,
        iova: u64,
        size: u64,
        errno: i32,
    },
    #[error("the handed-over max_data_xfer_size {0} is not 4..=1 MiB")]
    MaxXfer(usize),
    #[error("the message to handle again is refused: {0}")]
    Redo(String),
}

/// A client another process served, ready to be served here: its
/// connection framed and its DMA maps made again.
#[derive(Debug)]
pub struct Adopted {
    pub(crate) conn: Arc<Conn>,
    pub(crate) dma: DmaSpace,
    pub(crate) ledger: DmaLedger,
    /// A message the dead server was handling, to handle first.
    pub(crate) redo: Option<crate::conn::Message>,
}

impl Adopted {
    /// The client on `stream` with the maps `maps` over `files`, its
    /// messages timed by `message_timeout` and its maps limited by
    /// `limits` as this server's options say (a map beyond them is refused
    /// here as it would be at DMA_MAP).
    pub fn new(
        stream: UnixStream,
        max_xfer: usize,
        message_timeout: std::time::Duration,
        limits: DmaLimits,
        maps: &[HandedMap],
        files: Vec<OwnedFd>,
    ) -> Result<Self, AdoptError> {
        if !(4..=crate::MAX_DATA_XFER_SIZE).contains(&max_xfer) {
            return Err(AdoptError::MaxXfer(max_xfer));
        }
        let conn = Arc::new(Conn::new(stream, message_timeout).map_err(AdoptError::Conn)?);
        conn.set_negotiated();
        let dma = DmaSpace::with_conn(Some(conn.clone()), max_xfer, limits);
        let files: Vec<Arc<OwnedFd>> = files.into_iter().map(Arc::new).collect();
        let mut ledger = DmaLedger::default();
        for (index, m) in maps.iter().enumerate() {
            let fd = match m.file {
                None => None,
                Some(file) => Some(files.get(file).ok_or(AdoptError::NoSuchFile {
                    index,
                    iova: m.iova,
                    size: m.size,
                    file,
                    files: files.len(),
                })?),
            };
            let made = match fd {
                Some(fd) => {
                    dma.map_fd(m.iova, m.size, fd.as_fd(), m.offset, m.readable, m.writable)
                }
                None => dma.map_remote(m.iova, m.size, m.readable, m.writable),
            };
            made.map_err(|errno| AdoptError::Map {
                index,
                iova: m.iova,
                size: m.size,
                errno,
            })?;
            let kept = match fd {
                Some(fd) => Some(rustix::io::fcntl_dupfd_cloexec(fd.as_fd(), 0).map_err(|e| {
                    AdoptError::Map {
                        index,
                        iova: m.iova,
                        size: m.size,
                        errno: e.raw_os_error(),
                    }
                })?),
                None => None,
            };
            ledger.add(m.clone(), kept);
        }
        Ok(Self {
            conn,
            dma,
            ledger,
            redo: None,
        })
    }

    /// Handles the message `bytes` with `fds` (a [`Marked::redo`] and its
    /// [`Marked::fds`], which a crashed server left) before any the client
    /// sends, its reply the client's next; `Err` if `bytes` is not one
    /// such message.
    pub fn redo(&mut self, bytes: &[u8], fds: Vec<OwnedFd>) -> Result<(), AdoptError> {
        use zerocopy::FromBytes;
        let bad = |why: &str| AdoptError::Redo(why.to_string());
        if bytes.len() > MAX_REDO_BYTES {
            return Err(bad("longer than a kept message can be"));
        }
        let (header, payload) = crate::wire::Header::read_from_prefix(bytes)
            // A size error is the only one: the bytes are fewer than a header.
            .map_err(|_| bad("shorter than a header"))?;
        if header.msg_size as usize != bytes.len() {
            return Err(bad("its header's size is not its length"));
        }
        if !may_redo(header.command, bytes.len(), fds.len()) {
            return Err(bad(
                "not a message that may be handled again, or not with these fds",
            ));
        }
        self.redo = Some(crate::conn::Message {
            header,
            payload: payload.to_vec(),
            fds,
            fds_truncated: false,
        });
        Ok(())
    }

    /// The client's guest memory, for the device restored onto it.
    pub fn dma(&self) -> DmaSpace {
        self.dma.clone()
    }
}

/// Fd numbers [`claim_inherited`] gave out in this process.
static CLAIMED: parking_lot::Mutex<Vec<i32>> = parking_lot::Mutex::new(Vec::new());

/// Takes the fds a previous process left open for this one across exec
/// (their numbers come from the handover it wrote): each must be open,
/// above stderr, and claimed once per process. They are made close-on-exec,
/// so they do not leak into a process this one starts; a handover passes
/// fresh copies. Call it before the process opens files of its own, so no
/// number names something else.
pub fn claim_inherited(fds: &[i32]) -> Result<Vec<OwnedFd>, String> {
    let mut claimed = CLAIMED.lock();
    for (i, &fd) in fds.iter().enumerate() {
        if fd <= 2 {
            return Err(format!(
                "fd {fd} is stdin, stdout or stderr, not a handed-over fd"
            ));
        }
        if fds[..i].contains(&fd) || claimed.contains(&fd) {
            return Err(format!("fd {fd} is named twice"));
        }
        // SAFETY: F_GETFD reads a descriptor number's flags; on a number
        // that is not open it fails with EBADF and touches nothing.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
            return Err(format!(
                "fd {fd} is not open: {}",
                std::io::Error::last_os_error()
            ));
        }
    }
    let mut out = Vec::with_capacity(fds.len());
    for &fd in fds {
        claimed.push(fd);
        // SAFETY: fd is open (checked above) and was inherited across exec
        // for this purpose; CLAIMED makes this the only OwnedFd made of it
        // here, and the caller claims before opening files of its own, so
        // no other part of the process owns the number.
        let owned = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)
            .map_err(|e| format!("making fd {fd} close-on-exec: {e}"))?;
        out.push(owned);
    }
    Ok(out)
}
