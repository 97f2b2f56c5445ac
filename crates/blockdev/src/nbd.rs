//! The `nbd` backend: an export of a Network Block Device server
//! (nbdkit, qemu-nbd, qemu-storage-daemon, nbd-server...) over TCP
//! (`nbd://HOST[:PORT]/EXPORT`) or a UNIX socket
//! (`nbd+unix:///EXPORT?socket=PATH`), through a client of vnvme's own
//! (see `proto`; docs/nbd.md, "Why a client of our own and not libnbd",
//! says why not libnbd).
//!
//! * The namespace's size is the export's, rounded down to 4 KiB, or a
//!   size given that the export holds. A read-only export is refused.
//! * Flush is `NBD_CMD_FLUSH` and the device reports a volatile write
//!   cache when the server accepts it; a FUA write is a write with
//!   `NBD_CMD_FLAG_FUA`, or a write and a flush where the server has no
//!   FUA.
//! * Write Zeroes and Deallocate are both `NBD_CMD_WRITE_ZEROES` without
//!   `NBD_CMD_FLAG_NO_HOLE`, so the server may punch a hole: `NBD_CMD_TRIM`
//!   leaves the contents undefined, while vnvme promises that deallocated
//!   blocks read as zeroes (DLFEAT). A server without Write Zeroes gets
//!   zeroes written.
//! * Connections: the synchronous calls of [`BlockDevice`] share one. A
//!   queue of [`AsyncBlockDevice`] opens one of its own when the server
//!   offers multi-conn (using the shared one until it is open) (`NBD_FLAG_CAN_MULTI_CONN`: a flush on one
//!   connection covers writes completed on all, and all see the same
//!   data); otherwise every queue shares the one connection, as anything
//!   else could let a read miss a completed write.
//! * A server that goes away fails the requests in flight and the next
//!   ones with an error at once (no hang: a server that leaves a request
//!   unanswered for the I/O timeout is given up on); a thread reconnects
//!   in the background, trying again every [`Timeouts::retry`] while
//!   requests come (see `link`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::{
    check_range, AsyncBlockDevice, BlockDevice, BlockError, BlockQueue, Data, IoBuf, Waker,
};

mod conn;
mod link;
mod proto;
mod queue;
mod stream;
mod uri;

#[cfg(test)]
mod servers;
#[cfg(test)]
mod tests;

use conn::{Command, Conn, Sink};
use link::Link;
use proto::{cmd, tflag, ExportInfo};

pub use conn::OpenError;
pub use proto::ProtocolError;
pub use uri::{Address, NbdUri, UriError};

/// Namespace sizes are multiples of this (the largest LBA size in use).
const SIZE_GRANULE: u64 = 4096;

/// Largest Write Zeroes one command asks for: a 4 KiB multiple that fits
/// the protocol's 32-bit length.
const MAX_ZEROES: u64 = 1 << 30;

/// Bounds on waiting for a server.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// Connecting and the handshake, each.
    pub connect: Duration,
    /// A connection whose server leaves a request unanswered this long is
    /// given up on (the guest's own I/O timeout is 30 s).
    pub io: Duration,
    /// Time between two reconnection attempts while the server is away.
    pub retry: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self {
            connect: Duration::from_secs(5),
            io: Duration::from_secs(10),
            retry: Duration::from_secs(1),
        }
    }
}

/// Why an NBD export cannot back a namespace.
#[derive(Debug, thiserror::Error)]
pub enum NbdError {
    #[error(transparent)]
    Uri(#[from] UriError),
    #[error("cannot open NBD export '{export}' at {address}")]
    Open {
        address: Address,
        export: String,
        #[source]
        source: OpenError,
    },
    #[error("NBD export '{export}' at {address} is read-only: vnvme needs a writable export")]
    ReadOnly { address: Address, export: String },
    #[error("NBD export '{export}' at {address} is {size} bytes: a namespace needs at least {needed} bytes (and a multiple of 4096)")]
    TooSmall {
        address: Address,
        export: String,
        size: u64,
        needed: u64,
    },
}

/// What every connection of a device goes to.
pub(crate) struct Target {
    uri: NbdUri,
    /// The namespace's size.
    size: u64,
    timeouts: Timeouts,
}

/// Checks that an export can serve a namespace of `size` bytes.
fn check_export(uri: &NbdUri, info: ExportInfo, size: u64) -> Result<(), NbdError> {
    if info.has(tflag::READ_ONLY) {
        return Err(NbdError::ReadOnly {
            address: uri.address.clone(),
            export: uri.export.clone(),
        });
    }
    if size < SIZE_GRANULE || info.size < size || !size.is_multiple_of(SIZE_GRANULE) {
        return Err(NbdError::TooSmall {
            address: uri.address.clone(),
            export: uri.export.clone(),
            size: info.size,
            needed: size.max(SIZE_GRANULE),
        });
    }
    Ok(())
}

/// A namespace on an NBD export.
pub struct NbdDevice {
    inner: Arc<Inner>,
}

struct Inner {
    target: Arc<Target>,
    /// As the first connection found it; a reconnection must match it.
    export: ExportInfo,
    /// The connection of synchronous calls, and of every queue without
    /// multi-conn.
    shared: Arc<Link>,
}

impl std::fmt::Debug for NbdDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NbdDevice")
            .field("uri", &self.inner.target.uri)
            .field("size", &self.inner.target.size)
            .field("export", &self.inner.export)
            .finish()
    }
}

impl NbdDevice {
    /// Connects to the export at `uri`; `size`: the namespace's, or the
    /// export's (rounded down to 4 KiB).
    pub fn open(uri: &str, size: Option<u64>) -> Result<Self, NbdError> {
        Self::open_with(uri, size, Timeouts::default())
    }

    pub fn open_with(uri: &str, size: Option<u64>, timeouts: Timeouts) -> Result<Self, NbdError> {
        let uri: NbdUri = uri.parse()?;
        let conn =
            Conn::open(&uri.address, &uri.export, timeouts).map_err(|source| NbdError::Open {
                address: uri.address.clone(),
                export: uri.export.clone(),
                source,
            })?;
        let export = conn.export();
        let size = size.unwrap_or(export.size / SIZE_GRANULE * SIZE_GRANULE);
        check_export(&uri, export, size)?;
        tracing::debug!(
            ?export,
            "NBD export '{}' at {} opened",
            uri.export,
            uri.address
        );
        let target = Arc::new(Target {
            uri,
            size,
            timeouts,
        });
        Ok(Self {
            inner: Arc::new(Inner {
                shared: Arc::new(Link::new(target.clone(), Some(conn))),
                target,
                export,
            }),
        })
    }

    /// Whether each queue has a connection of its own.
    pub fn multi_conn(&self) -> bool {
        self.inner.export.has(tflag::CAN_MULTI_CONN)
    }

    /// Runs one command on the shared connection and waits for it.
    fn call(&self, command: Command, data: Option<Data>) -> (Option<Data>, Result<(), BlockError>) {
        let conn = match self.inner.shared.get() {
            Ok(c) => c,
            Err(e) => return (data, Err(e)),
        };
        let sink = Sink::new(None);
        if let Err((data, e)) = conn.submit(command, data, 0, &sink) {
            return (data, Err(e));
        }
        // The reply thread completes every request within the I/O timeout
        // and a tick; the margin only guards against a bug there.
        let deadline = Instant::now() + self.inner.target.timeouts.io * 2;
        let mut out = Vec::with_capacity(1);
        if sink.wait_for(1, deadline) && sink.take(&mut out, 1) == 1 {
            if let Some(done) = out.pop() {
                return (done.data, done.result);
            }
        }
        (
            None,
            Err(BlockError::Io(std::io::ErrorKind::TimedOut.into())),
        )
    }

    fn max_payload(&self) -> usize {
        self.inner.export.max_payload as usize
    }

    fn write_with(&self, offset: u64, buf: &[u8], flags: u16) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size())?;
        let mut at = 0;
        for piece in buf.chunks(self.max_payload()) {
            let mut data = IoBuf::zeroed(piece.len());
            data.copy_from_slice(piece);
            let command = Command {
                kind: cmd::WRITE,
                flags,
                offset: offset + at,
                len: piece.len() as u32,
            };
            self.call(command, Some(Data::Buf(data))).1?;
            at += piece.len() as u64;
        }
        Ok(())
    }
}

impl BlockDevice for NbdDevice {
    fn size(&self) -> u64 {
        self.inner.target.size
    }

    fn volatile_cache(&self) -> bool {
        self.inner.export.has(tflag::SEND_FLUSH)
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size())?;
        let mut at = 0;
        for piece in buf.chunks_mut(self.max_payload()) {
            let command = Command {
                kind: cmd::READ,
                flags: 0,
                offset: offset + at,
                len: piece.len() as u32,
            };
            let (data, result) = self.call(command, Some(Data::Buf(IoBuf::zeroed(piece.len()))));
            result?;
            match data {
                Some(Data::Buf(b)) if b.len() == piece.len() => piece.copy_from_slice(&b),
                _ => {
                    return Err(BlockError::Io(std::io::Error::other(
                        "NBD read lost its buffer",
                    )))
                }
            }
            at += piece.len() as u64;
        }
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.write_with(offset, buf, 0)
    }

    fn write_fua(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        if self.inner.export.has(tflag::SEND_FUA) {
            self.write_with(offset, buf, cmd::FLAG_FUA)
        } else {
            self.write(offset, buf)?;
            self.flush()
        }
    }

    fn flush(&self) -> Result<(), BlockError> {
        if !self.inner.export.has(tflag::SEND_FLUSH) {
            // The server offers no cache to flush: its writes are stable.
            return Ok(());
        }
        let command = Command {
            kind: cmd::FLUSH,
            flags: 0,
            offset: 0,
            len: 0,
        };
        self.call(command, None).1
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        check_range(offset, len, self.size())?;
        let native = self.inner.export.has(tflag::SEND_WRITE_ZEROES);
        let piece_max = if native { MAX_ZEROES } else { 1 << 20 };
        let mut at = 0;
        while at < len {
            let piece = (len - at).min(piece_max);
            if native {
                let command = Command {
                    kind: cmd::WRITE_ZEROES,
                    flags: 0,
                    offset: offset + at,
                    len: piece as u32,
                };
                self.call(command, None).1?;
            } else {
                self.write(offset + at, &vec![0; piece as usize])?;
            }
            at += piece;
        }
        Ok(())
    }

    fn as_async(&self) -> Option<&dyn AsyncBlockDevice> {
        Some(self)
    }
}

impl AsyncBlockDevice for NbdDevice {
    fn queue(&self, waker: Waker) -> Result<Box<dyn BlockQueue>, BlockError> {
        let own = self.multi_conn().then(|| {
            let link = Link::new(self.inner.target.clone(), None);
            // Starts connecting; the shared connection serves meanwhile.
            let _ = link.get();
            link
        });
        Ok(Box::new(queue::NbdQueue::new(
            self.inner.target.size,
            self.inner.export,
            self.inner.target.timeouts,
            own,
            self.inner.shared.clone(),
            Sink::new(Some(waker)),
        )))
    }
}
