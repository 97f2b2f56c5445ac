//! The one trait for guest memory: what the controller reads and writes
//! through, implemented by vfio-user's DMA address space (the client's
//! maps) and by in-process fakes in tests.

use crate::{DmaError, GuestAddress, MappedMemory};

/// One contiguous piece of a transfer in guest memory (a PRP never crosses
/// a page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u64,
}

impl Segment {
    /// The address of a segment whose bytes the controller discards (an
    /// SGL Bit Bucket in a controller-to-host transfer, see the
    /// controller's `sgl`). No data block can start there: it would end
    /// past the address space.
    pub const BIT_BUCKET: GuestAddress = GuestAddress(u64::MAX);
}

/// Guest physical memory as the device sees it (IOVAs given by DMA_MAP).
///
/// Every address comes from the guest and is hostile: implementations check
/// bounds and never panic. Accesses may span two adjacent mappings only if the
/// implementation supports it; otherwise they fail with `Unmapped`.
pub trait GuestMemory: Send + Sync {
    /// Copies `buf.len()` bytes from guest address `addr` into `buf`.
    fn read(&self, addr: GuestAddress, buf: &mut [u8]) -> Result<(), DmaError>;
    /// Copies `buf` to guest address `addr`.
    fn write(&self, addr: GuestAddress, buf: &[u8]) -> Result<(), DmaError>;
    /// Writes `len` zero bytes at `addr` (reads from a null namespace).
    fn zero(&self, addr: GuestAddress, len: u64) -> Result<(), DmaError>;
    /// Atomically loads the aligned little-endian dword at `addr` with
    /// acquire ordering (shadow doorbells, NVMe Base 2.0 §5.8).
    fn load_u32(&self, addr: GuestAddress) -> Result<u32, DmaError>;
    /// Atomically stores the aligned little-endian dword at `addr` with
    /// release ordering (EventIdx, §5.8).
    fn store_u32(&self, addr: GuestAddress, value: u32) -> Result<(), DmaError>;
    /// Copies `head` to `addr`, then stores `last` (aligned) right after it
    /// with release ordering: a reader that sees `last` sees `head` too (a
    /// completion queue entry, its phase tag in the last dword, §4.6).
    /// Implementations may do both in one access.
    fn write_then_store_u32(
        &self,
        addr: GuestAddress,
        head: &[u8],
        last: u32,
    ) -> Result<(), DmaError> {
        self.write(addr, head)?;
        self.store_u32(addr.wrapping_add(head.len() as u64), last)
    }
    /// The memory of `segs`, in order, held mapped for the kernel to read
    /// (and write, if `write`: a Read command's destination) in place until
    /// the result is dropped: an asynchronous backend then moves the data
    /// with no copy of ours. `None` where that cannot be (memory not in
    /// this process, no such permission, unmapped): the caller copies
    /// instead, which reports the error if there is one.
    fn pin(&self, _segs: &[Segment], _write: bool) -> Option<Box<dyn MappedMemory>> {
        None
    }
    /// Lets go of what the calling thread keeps of the memory between
    /// accesses (the vfio-user DMA space keeps a snapshot of the client's
    /// maps per thread, and an unmap waits until no thread holds the old
    /// one). A worker calls it before it blocks, so an unmap meanwhile need
    /// not wait for it; the next access takes the current maps.
    fn quiesce(&self) {}
}
