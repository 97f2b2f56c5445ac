//! The vfio-user protocol (QEMU `docs/interop/vfio-user.rst`): wire types,
//! framing with SCM_RIGHTS, a [`Server`] over a [`Device`] trait, and a
//! [`Client`].
//!
//! Written here rather than taken from crates.io because the device model is a
//! security boundary: every errno is real, unknown commands are consumed and
//! answered ENOSYS so the stream stays in sync, malformed input is an error
//! reply and never a panic, maps without an fd are served with
//! DMA_READ/DMA_WRITE, and DMA_UNMAP can never race a worker into freed
//! memory (see [`DmaSpace`]).
//!
//! Threading: the [`Server`] handles client commands on the thread that calls
//! `serve_*` (the control path). [`DmaSpace`] is used from any thread; for maps
//! without an fd its requests and their replies share the socket with client
//! commands, and any waiting thread reads the socket for the others (see
//! `conn.rs`), so neither side has to be idle for the other to progress.

pub mod activation;
mod client;
mod conn;
mod dma;
mod door;
mod fault;
pub mod handover;
pub mod hugepages;
mod msg_times;
mod server;
mod shared;
mod stop;
mod version;
pub mod wire;

use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};

pub use client::Client;
pub use conn::{ReplyPipe, MAX_DATA_XFER_SIZE, MAX_MSG_FDS, MAX_MSG_SIZE, MESSAGE_TIMEOUT};
pub use dma::{
    DmaLimits, DmaPin, DmaSpace, DEFAULT_MAX_DMA_BYTES, DEFAULT_MAX_DMA_MAPS, REMOTE_DMA_TIMEOUT,
};
pub use door::Door;
/// Most fd-backed DMA maps the whole process can hold (the SIGBUS guard's
/// registry): the highest `max_dma_maps` worth configuring.
pub use fault::CAPACITY as MAX_FD_DMA_MAPS;
pub use server::{serve_many, serve_many_with, Server, ServerOptions, HANDSHAKE_TIMEOUT};
pub use shared::SharedRegion;
pub use stop::StopWake;
/// [`DmaSpace`] is guest memory in `vnvme-memory`'s words: its accesses are
/// the [`GuestMemory`] trait's, and fail with its [`DmaError`].
pub use vnvme_memory::{DmaError, GuestAddress, GuestMemory};
pub use wire::{
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_AUTOMASKED,
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE, VFIO_IRQ_INFO_NORESIZE,
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK,
    VFIO_IRQ_SET_DATA_BOOL, VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE,
    VFIO_REGION_INFO_FLAG_CAPS, VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};

/// PCI region indexes (`VFIO_PCI_*_REGION_INDEX`).
pub mod region {
    pub const BAR0: u32 = 0;
    pub const BAR1: u32 = 1;
    pub const BAR2: u32 = 2;
    pub const BAR3: u32 = 3;
    pub const BAR4: u32 = 4;
    pub const BAR5: u32 = 5;
    pub const ROM: u32 = 6;
    pub const CONFIG: u32 = 7;
    pub const VGA: u32 = 8;
    /// `VFIO_PCI_NUM_REGIONS`.
    pub const COUNT: u32 = 9;
}

/// PCI interrupt indexes (`VFIO_PCI_*_IRQ_INDEX`). QEMU requires all 5.
pub mod irq {
    pub const INTX: u32 = 0;
    pub const MSI: u32 = 1;
    pub const MSIX: u32 = 2;
    pub const ERR: u32 = 3;
    pub const REQ: u32 = 4;
    /// `VFIO_PCI_NUM_IRQS`.
    pub const COUNT: u32 = 5;
}

/// A Unix errno (`libc::EINVAL`...), replied to the peer as is.
pub type Errno = i32;

/// DEVICE_GET_INFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceInfo {
    /// `VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET`.
    pub flags: u32,
    pub num_regions: u32,
    pub num_irqs: u32,
}

/// DEVICE_GET_REGION_INFO.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RegionInfo {
    /// `VFIO_REGION_INFO_FLAG_{READ,WRITE,MMAP}`. The server sets MMAP and
    /// CAPS itself from `sparse_areas` and the fd, so a device may leave them out.
    pub flags: u32,
    pub size: u64,
    /// Areas the client may mmap (offsets within the region); empty = none.
    pub sparse_areas: Vec<SparseArea>,
}

/// One mmappable area of a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SparseArea {
    pub offset: u64,
    pub size: u64,
}

/// DEVICE_GET_IRQ_INFO.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IrqInfo {
    /// `VFIO_IRQ_INFO_*`.
    pub flags: u32,
    pub count: u32,
}

/// A device served over vfio-user. All methods run on the server's control
/// thread; the device hands [`DmaSpace`] clones to its own workers.
pub trait Device: Send {
    fn device_info(&self) -> DeviceInfo;
    /// The region and, if it has sparse mmap areas, the fd to mmap them from
    /// (offset in the fd == region offset).
    fn region_info(&self, index: u32) -> Option<(RegionInfo, Option<BorrowedFd<'_>>)>;
    fn irq_info(&self, index: u32) -> Option<IrqInfo>;
    /// REGION_READ; the server has checked the range against the region size.
    fn region_read(&mut self, index: u32, offset: u64, buf: &mut [u8]) -> Result<(), Errno>;
    /// REGION_WRITE; the server has checked the range against the region size.
    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno>;
    /// SET_IRQS. `fds` holds the eventfds for DATA_EVENTFD (one per vector
    /// from `start`), empty otherwise. DATA_EVENTFD with `count > 0` and no fds
    /// de-assigns those vectors (QEMU sends that for vectors it disables);
    /// DATA_NONE with `count == 0` disables the whole index. DATA_BOOL is
    /// turned into one DATA_NONE call per true entry.
    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<OwnedFd>,
    ) -> Result<(), Errno>;
    /// A new client connected; `dma` is its DMA address space, valid until `detach`.
    fn attach(&mut self, dma: DmaSpace);
    /// The client disconnected (or is being replaced): stop all DMA, reset.
    /// Called before the DmaSpace is torn down.
    fn detach(&mut self);
    /// DEVICE_RESET.
    fn reset(&mut self);
    /// Called before a DMA_UNMAP takes effect, so the device can quiesce users
    /// of that range if it wants. `size == u64::MAX` for "unmap all".
    fn dma_unmapping(&mut self, _iova: u64, _size: u64) {}
    /// Whether a REGION_WRITE at `offset` of region `index` may wait (for
    /// the device's workers, which may wait on the client's DMA replies;
    /// or for the client itself): a server that serves many devices' clients
    /// on one thread ([`serve_many`]) hands such a message to a helper
    /// thread, so the others' messages do not wait with it. DEVICE_RESET
    /// and DMA_UNMAP are always handed so.
    fn write_may_wait(&self, _index: u32, _offset: u64) -> bool {
        false
    }
}

/// Errors of the server loop and the client.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("socket I/O failed")]
    Io(#[from] io::Error),
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("peer failed command {command} with errno {errno}")]
    Remote { command: u16, errno: i32 },
    #[error("peer closed the connection")]
    Disconnected,
    /// The server refused VERSION with EBUSY: another client owns the device.
    #[error("the server is serving another client (it takes one at a time): stop that client or use another server")]
    Busy,
    #[error("timed out waiting for the peer")]
    Timeout,
    #[error("message of {0} bytes is too large to send")]
    TooLarge(usize),
    /// A message announced a body we will not take: larger than
    /// [`MAX_MSG_SIZE`] (E2BIG) or more than we can allocate (ENOMEM). The
    /// body was not read, so the stream cannot continue.
    #[error("peer sent message {msg_id} (command {command}) of {size} bytes: refused with errno {errno}")]
    Refused {
        msg_id: u16,
        command: u16,
        size: usize,
        errno: i32,
    },
}

impl Error {
    /// The errno a remote failure carried, if any.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Error::Remote { errno, .. } => Some(*errno),
            _ => None,
        }
    }
}
