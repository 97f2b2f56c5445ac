//! How the driver reaches a device: BAR0 registers, DMA memory shared with the
//! device, and interrupts.
//!
//! DMA memory is a `MAP_SHARED` mapping of a memfd that the device also
//! maps, so it changes under our feet: it is never handed out as a Rust
//! reference, only read and written through bulk copies into and out of
//! Rust buffers and through atomics. Register areas the device offers for
//! mapping ([`MappedArea`]) are reached through atomics only. Both are a
//! [`SharedRegion`] of the vfio-user crate, which holds the `unsafe` of
//! mapping and reaching them: the driver has none.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustix::event::{EventfdFlags, PollFd, PollFlags};
use vnvme_vfio_user::SharedRegion;
use zerocopy::{FromBytes, Immutable, IntoBytes};

/// Size of a memory page as the driver uses it (CC.MPS = 0) and the alignment
/// of every DMA allocation.
pub const PAGE_SIZE: usize = 4096;

/// A boxed error from a device access backend, kept as the source of [`AccessError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Errors of a [`DeviceAccess`] backend or of a DMA buffer access.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("reading BAR0 at offset {offset:#x}")]
    RegisterRead {
        offset: u64,
        #[source]
        source: BoxError,
    },
    #[error("writing BAR0 at offset {offset:#x}")]
    RegisterWrite {
        offset: u64,
        #[source]
        source: BoxError,
    },
    #[error("allocating {size} bytes of DMA memory")]
    DmaAlloc {
        size: usize,
        #[source]
        source: BoxError,
    },
    #[error("DMA access of {len} bytes at offset {offset} is outside a {size}-byte buffer")]
    OutOfBounds {
        offset: usize,
        len: usize,
        size: usize,
    },
    #[error("DMA access at offset {offset} is not {align}-byte aligned")]
    Misaligned { offset: usize, align: usize },
    #[error("setting up interrupts")]
    Interrupts(#[source] BoxError),
    #[error("mapping device registers")]
    MapRegisters(#[source] BoxError),
}

/// Everything the driver needs from a device. Implementations: vfio-user
/// ([`crate::VfioUserAccess`]) and, in tests, a scripted fake.
pub trait DeviceAccess: Send + Sync + fmt::Debug {
    /// Reads a 32-bit register at a BAR0 offset.
    fn read32(&self, offset: u64) -> Result<u32, AccessError>;

    /// Writes a 32-bit register at a BAR0 offset. A write may be posted: it
    /// need not wait for the device, but it is ordered before any later access.
    fn write32(&self, offset: u64, value: u32) -> Result<(), AccessError>;

    /// Reads a 64-bit register as two 32-bit reads, low dword first (like
    /// Linux `lo_hi_readq`), which every controller accepts.
    fn read64(&self, offset: u64) -> Result<u64, AccessError> {
        let lo = self.read32(offset)?;
        let hi = self.read32(offset + 4)?;
        Ok(u64::from(lo) | (u64::from(hi) << 32))
    }

    /// Writes a 64-bit register as two 32-bit writes, low dword first.
    fn write64(&self, offset: u64, value: u64) -> Result<(), AccessError> {
        self.write32(offset, value as u32)?;
        self.write32(offset + 4, (value >> 32) as u32)
    }

    /// Allocates `size` bytes (rounded up to pages) of zeroed, page-aligned
    /// memory the device can reach at [`DmaBuffer::iova`].
    fn dma_alloc(&self, size: usize) -> Result<DmaBuffer, AccessError>;

    /// Sets up `n_vectors` interrupt vectors, vector `i` at index `i`. Fewer may
    /// be returned; none means the device has no usable interrupts and the
    /// driver polls.
    fn enable_interrupts(&self, n_vectors: u16) -> Result<Vec<Interrupt>, AccessError>;

    /// Tears interrupts down again (before a reset, or at shutdown).
    fn disable_interrupts(&self) -> Result<(), AccessError> {
        Ok(())
    }

    /// Maps the parts of BAR0 the device offers as memory (vfio-user sparse
    /// mmap areas, typically the doorbell page), so that accesses there are
    /// plain loads and stores the device polls instead of traps. Returns
    /// whether anything is mapped. Idempotent; a mapping, once made, lasts as
    /// long as the access. The default maps nothing.
    fn map_registers(&self) -> Result<bool, AccessError> {
        Ok(false)
    }

    /// Whether the 32-bit register at `offset` is reached through a mapping
    /// made by [`map_registers`](Self::map_registers).
    fn is_mapped(&self, _offset: u64) -> bool {
        false
    }
}

/// One `MAP_SHARED` memfd mapping, registered with the device at `iova`.
///
/// Dropped when the last [`DmaBuffer`] carved from it goes: the device mapping
/// is released first (through the `release` hook), then the memory is unmapped.
pub struct DmaRegion {
    memory: SharedRegion,
    iova: u64,
    release: Mutex<Option<ReleaseHook>>,
}

/// What runs when a [`DmaRegion`] is dropped, given the region.
type ReleaseHook = Box<dyn FnOnce(&DmaRegion) + Send>;

impl fmt::Debug for DmaRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaRegion")
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len())
            .finish()
    }
}

impl DmaRegion {
    /// Creates a memfd of `len` bytes (rounded up to pages), zero filled,
    /// sealed against resizing (the device gets the fd: it cannot shrink it
    /// under our mapping), and maps it shared.
    pub fn new(len: usize, iova: u64) -> io::Result<Self> {
        Ok(Self {
            memory: SharedRegion::new("vnvme-dma", len.max(1))?,
            iova,
            release: Mutex::new(None),
        })
    }

    /// As [`DmaRegion::new`], but not sealed: for a client that means to
    /// shrink its memory under the device (tests of a device's defences).
    pub fn resizable(len: usize, iova: u64) -> io::Result<Self> {
        Ok(Self {
            memory: SharedRegion::resizable("vnvme-dma", len.max(1))?,
            iova,
            release: Mutex::new(None),
        })
    }

    /// The memfd backing the region, for handing to the device (DMA_MAP).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.memory.fd()
    }

    pub fn len(&self) -> usize {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    pub fn iova(&self) -> u64 {
        self.iova
    }

    /// Runs `f` on the region when it is dropped, before the memory and
    /// its fd go (e.g. to DMA_UNMAP it from the device).
    pub fn on_release(&self, f: ReleaseHook) {
        *self.release.lock() = Some(f);
    }

    /// A buffer covering `len` bytes of the region from `offset`.
    pub fn buffer(self: &Arc<Self>, offset: usize, len: usize) -> Result<DmaBuffer, AccessError> {
        check_range(offset, len, self.len())?;
        Ok(DmaBuffer {
            region: Arc::clone(self),
            offset,
            len,
        })
    }
}

impl Drop for DmaRegion {
    fn drop(&mut self) {
        // Before the memory goes (unmapped when `memory` drops).
        if let Some(release) = self.release.get_mut().take() {
            release(self);
        }
    }
}

fn round_up_to_page(len: usize) -> Option<usize> {
    len.checked_add(PAGE_SIZE - 1).map(|l| l & !(PAGE_SIZE - 1))
}

fn check_range(offset: usize, len: usize, size: usize) -> Result<(), AccessError> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(AccessError::OutOfBounds { offset, len, size }),
    }
}

/// A piece of DMA memory: a window of a [`DmaRegion`] with its device address.
///
/// Cloning makes another handle on the same memory (the device may write it
/// at any time, so there are no `&[u8]` views; reads copy out).
#[derive(Clone)]
pub struct DmaBuffer {
    region: Arc<DmaRegion>,
    offset: usize,
    len: usize,
}

impl fmt::Debug for DmaBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaBuffer")
            .field("iova", &format_args!("{:#x}", self.iova()))
            .field("len", &self.len)
            .finish()
    }
}

impl DmaBuffer {
    /// The device address of the first byte.
    pub fn iova(&self) -> u64 {
        self.region.iova + self.offset as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A handle on `len` bytes of this buffer from `offset` (a segment to
    /// read into or write from).
    pub fn subrange(&self, offset: usize, len: usize) -> Result<DmaBuffer, AccessError> {
        check_range(offset, len, self.len)?;
        Ok(DmaBuffer {
            region: Arc::clone(&self.region),
            offset: self.offset + offset,
            len,
        })
    }

    /// Offset in the region of byte `offset` of this buffer, after checking
    /// that `len` bytes from there are inside it and that it is
    /// `align`-byte aligned.
    fn at(&self, offset: usize, len: usize, align: usize) -> Result<usize, AccessError> {
        check_range(offset, len, self.len)?;
        let at = self.offset + offset;
        if at & (align - 1) != 0 {
            return Err(AccessError::Misaligned { offset, align });
        }
        Ok(at)
    }

    /// What a region access outside the region would be (`at` checked
    /// against the buffer, which lies inside the region: never).
    fn outside(&self, offset: usize, len: usize) -> AccessError {
        AccessError::OutOfBounds {
            offset,
            len,
            size: self.len,
        }
    }

    /// Copies bytes out of the buffer from `offset` into `out`.
    pub fn read_bytes(&self, offset: usize, out: &mut [u8]) -> Result<(), AccessError> {
        let at = self.at(offset, out.len(), 1)?;
        match self.region.memory.read(at, out) {
            true => Ok(()),
            false => Err(self.outside(offset, out.len())),
        }
    }

    /// Copies `data` into the buffer at `offset`.
    pub fn write_bytes(&self, offset: usize, data: &[u8]) -> Result<(), AccessError> {
        let at = self.at(offset, data.len(), 1)?;
        match self.region.memory.write(at, data) {
            true => Ok(()),
            false => Err(self.outside(offset, data.len())),
        }
    }

    /// Fills `len` bytes from `offset` with `value`.
    pub fn fill(&self, offset: usize, len: usize, value: u8) -> Result<(), AccessError> {
        let at = self.at(offset, len, 1)?;
        match self.region.memory.fill(at, len, value) {
            true => Ok(()),
            false => Err(self.outside(offset, len)),
        }
    }

    /// Copies the whole buffer out.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len];
        // The range is the buffer itself, so this cannot fail.
        let _ = self.read_bytes(0, &mut v);
        v
    }

    /// Reads a plain-data structure (e.g. a CQE or an identify page) at `offset`.
    pub fn read_obj<T: FromBytes + IntoBytes>(&self, offset: usize) -> Result<T, AccessError> {
        let mut obj = T::new_zeroed();
        self.read_bytes(offset, obj.as_mut_bytes())?;
        Ok(obj)
    }

    /// Writes a plain-data structure (e.g. an SQE) at `offset`.
    pub fn write_obj<T: IntoBytes + Immutable>(
        &self,
        offset: usize,
        obj: &T,
    ) -> Result<(), AccessError> {
        self.write_bytes(offset, obj.as_bytes())
    }

    fn atomic_u32(&self, offset: usize) -> Result<&AtomicU32, AccessError> {
        let at = self.at(offset, 4, 4)?;
        self.region
            .memory
            .atomic_u32(at)
            .ok_or_else(|| self.outside(offset, 4))
    }

    fn atomic_u64(&self, offset: usize) -> Result<&AtomicU64, AccessError> {
        let at = self.at(offset, 8, 8)?;
        self.region
            .memory
            .atomic_u64(at)
            .ok_or_else(|| self.outside(offset, 8))
    }

    /// Loads a little-endian u32 at a 4-byte aligned `offset` with acquire
    /// ordering (later reads see what the device wrote before this value).
    pub fn load_u32(&self, offset: usize) -> Result<u32, AccessError> {
        Ok(u32::from_le(
            self.atomic_u32(offset)?.load(Ordering::Acquire),
        ))
    }

    /// Stores a little-endian u32 at a 4-byte aligned `offset` with release ordering.
    pub fn store_u32(&self, offset: usize, value: u32) -> Result<(), AccessError> {
        self.atomic_u32(offset)?
            .store(value.to_le(), Ordering::Release);
        Ok(())
    }

    /// Loads a little-endian u64 at an 8-byte aligned `offset` (acquire).
    pub fn load_u64(&self, offset: usize) -> Result<u64, AccessError> {
        Ok(u64::from_le(
            self.atomic_u64(offset)?.load(Ordering::Acquire),
        ))
    }

    /// Stores a little-endian u64 at an 8-byte aligned `offset` (release).
    pub fn store_u64(&self, offset: usize, value: u64) -> Result<(), AccessError> {
        self.atomic_u64(offset)?
            .store(value.to_le(), Ordering::Release);
        Ok(())
    }
}

/// A window of a device region mapped into the driver (a vfio-user sparse
/// mmap area, offset in the fd == offset in the region): the device sees the
/// stores as memory writes, with no message and no trap.
///
/// Accessed only through 32-bit atomics, never through references, like
/// [`DmaBuffer`].
pub struct MappedArea {
    memory: SharedRegion,
    /// Offset of the first byte in the region.
    region_offset: u64,
}

impl fmt::Debug for MappedArea {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MappedArea")
            .field("region_offset", &format_args!("{:#x}", self.region_offset))
            .field("len", &self.len())
            .finish()
    }
}

impl MappedArea {
    /// Maps `len` bytes of `fd` from `region_offset`, shared, read-write:
    /// page aligned, non-empty and inside the file, as
    /// [`SharedRegion::map`] checks (the device chose them).
    pub fn map(fd: BorrowedFd<'_>, region_offset: u64, len: u64) -> io::Result<Self> {
        Ok(Self {
            memory: SharedRegion::map(fd, region_offset, len)?,
            region_offset,
        })
    }

    /// Offset of the area in its region.
    pub fn region_offset(&self) -> u64 {
        self.region_offset
    }

    pub fn len(&self) -> usize {
        self.memory.len()
    }

    pub fn is_empty(&self) -> bool {
        self.memory.is_empty()
    }

    /// The 4-byte aligned atomic at region offset `offset`, if inside the area.
    fn atomic_u32(&self, offset: u64) -> Option<&AtomicU32> {
        let at = usize::try_from(offset.checked_sub(self.region_offset)?).ok()?;
        self.memory.atomic_u32(at)
    }

    /// Whether the 32-bit register at region offset `offset` is in the area.
    pub fn contains(&self, offset: u64) -> bool {
        self.atomic_u32(offset).is_some()
    }

    /// Loads the little-endian register at `offset` (acquire); `None` if it
    /// is not in the area.
    pub fn load_u32(&self, offset: u64) -> Option<u32> {
        Some(u32::from_le(
            self.atomic_u32(offset)?.load(Ordering::Acquire),
        ))
    }

    /// Stores the little-endian register at `offset` (release: earlier
    /// writes to DMA memory, e.g. SQEs, are visible first). Returns false,
    /// storing nothing, if it is not in the area.
    pub fn store_u32(&self, offset: u64, value: u32) -> bool {
        match self.atomic_u32(offset) {
            Some(a) => {
                a.store(value.to_le(), Ordering::Release);
                true
            }
            None => false,
        }
    }
}

/// Who registers DMA regions with the device.
pub trait DmaMapper: Send + Sync {
    /// Makes `region` reachable by the device at `region.iova()`.
    fn map(&self, region: &DmaRegion) -> Result<(), BoxError>;
    /// Removes the device mapping of `region` (called when it is dropped).
    fn unmap(&self, region: &DmaRegion);
}

/// The [`DmaMapper`] of a device in the driver's own process that finds
/// buffers by IOVA itself (the tests' fakes, the fuzzer's hostile device):
/// there is no IOMMU or server to tell.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoMapper;

impl DmaMapper for NoMapper {
    fn map(&self, _: &DmaRegion) -> Result<(), BoxError> {
        Ok(())
    }
    fn unmap(&self, _: &DmaRegion) {}
}

/// A bump allocator of DMA buffers carved from large memfd regions, so that
/// many small buffers (queues, PRP lists, identify pages) cost one DMA_MAP.
///
/// IOVAs are never reused: a region is unmapped from the device when its last
/// buffer is dropped, and new regions always get fresh addresses, so a late
/// device write can never land in memory that has been handed out again.
pub struct DmaPool {
    mapper: Arc<dyn DmaMapper>,
    chunk: usize,
    state: Mutex<PoolState>,
}

struct PoolState {
    next_iova: u64,
    current: Option<(Arc<DmaRegion>, usize)>,
}

impl fmt::Debug for DmaPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DmaPool")
            .field("chunk", &self.chunk)
            .field(
                "next_iova",
                &format_args!("{:#x}", self.state.lock().next_iova),
            )
            .finish()
    }
}

impl DmaPool {
    /// First IOVA handed out: 1 GiB, clear of anything a VMM might map low.
    pub const BASE_IOVA: u64 = 1 << 30;
    /// Default size of one carved region.
    pub const DEFAULT_CHUNK: usize = 2 << 20;

    pub fn new(mapper: Arc<dyn DmaMapper>, chunk: usize) -> Self {
        Self {
            mapper,
            chunk: round_up_to_page(chunk.max(PAGE_SIZE)).unwrap_or(Self::DEFAULT_CHUNK),
            state: Mutex::new(PoolState {
                next_iova: Self::BASE_IOVA,
                current: None,
            }),
        }
    }

    fn new_region(&self, state: &mut PoolState, len: usize) -> Result<Arc<DmaRegion>, AccessError> {
        let err = |source: BoxError| AccessError::DmaAlloc { size: len, source };
        let region = DmaRegion::new(len, state.next_iova).map_err(|e| err(e.into()))?;
        state.next_iova = state
            .next_iova
            .checked_add(region.len() as u64)
            .ok_or_else(|| err("IOVA space exhausted".into()))?;
        self.mapper.map(&region).map_err(err)?;
        let mapper = Arc::clone(&self.mapper);
        region.on_release(Box::new(move |r| mapper.unmap(r)));
        Ok(Arc::new(region))
    }

    /// Allocates a zeroed, page-aligned buffer of `size` bytes.
    pub fn alloc(&self, size: usize) -> Result<DmaBuffer, AccessError> {
        let rounded = round_up_to_page(size.max(1)).ok_or(AccessError::DmaAlloc {
            size,
            source: "size overflows".into(),
        })?;
        let mut state = self.state.lock();
        if rounded > self.chunk / 2 {
            let region = self.new_region(&mut state, rounded)?;
            return region.buffer(0, size);
        }
        let fits = matches!(&state.current, Some((r, used)) if r.len() - used >= rounded);
        if !fits {
            let region = self.new_region(&mut state, self.chunk)?;
            state.current = Some((region, 0));
        }
        let (region, used) = state.current.as_mut().ok_or(AccessError::DmaAlloc {
            size,
            source: "no current region".into(),
        })?;
        let buf = region.buffer(*used, size)?;
        *used += rounded;
        Ok(buf)
    }
}

/// One interrupt vector, signalled through an eventfd.
#[derive(Debug)]
pub struct Interrupt {
    fd: OwnedFd,
    vector: u16,
}

impl Interrupt {
    /// A fresh non-blocking eventfd for `vector`.
    pub fn new(vector: u16) -> io::Result<Self> {
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(Self { fd, vector })
    }

    pub fn vector(&self) -> u16 {
        self.vector
    }

    /// The eventfd, for handing to the device (SET_IRQS).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Another handle on the same eventfd (a device model signals through it).
    pub fn try_clone(&self) -> io::Result<Self> {
        Ok(Self {
            fd: self.fd.try_clone()?,
            vector: self.vector,
        })
    }

    /// Raises the interrupt (what the device does).
    pub fn signal(&self) -> io::Result<()> {
        rustix::io::write(&self.fd, &1u64.to_ne_bytes())?;
        Ok(())
    }

    /// Consumes a pending signal without waiting. Returns whether there was one.
    pub fn try_clear(&self) -> io::Result<bool> {
        let mut buf = [0u8; 8];
        match rustix::io::read(&self.fd, &mut buf) {
            Ok(_) => Ok(true),
            Err(rustix::io::Errno::AGAIN) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Waits up to `timeout` for the interrupt and consumes it. Returns
    /// whether it fired.
    pub fn wait(&self, timeout: Duration) -> io::Result<bool> {
        if self.try_clear()? {
            return Ok(true);
        }
        let ts = rustix::event::Timespec::try_from(timeout).unwrap_or(rustix::event::Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) | Err(rustix::io::Errno::INTR) => Ok(false),
            Ok(_) => self.try_clear(),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct NoMapper;
    impl DmaMapper for NoMapper {
        fn map(&self, _: &DmaRegion) -> Result<(), BoxError> {
            Ok(())
        }
        fn unmap(&self, _: &DmaRegion) {}
    }

    #[test]
    fn pool_buffers_are_page_aligned_zeroed_and_distinct() {
        let pool = DmaPool::new(Arc::new(NoMapper), 64 << 10);
        let a = pool.alloc(100).unwrap();
        let b = pool.alloc(5000).unwrap();
        let big = pool.alloc(1 << 20).unwrap();
        for buf in [&a, &b, &big] {
            assert_eq!(buf.iova() % PAGE_SIZE as u64, 0);
            assert!(buf.to_vec().iter().all(|&x| x == 0));
        }
        assert_eq!(b.iova(), a.iova() + 4096);
        assert!(big.iova() >= b.iova() + 8192);
    }

    #[test]
    fn buffer_accessors_check_bounds_and_alignment() {
        let pool = DmaPool::new(Arc::new(NoMapper), 64 << 10);
        let buf = pool.alloc(4096).unwrap();
        buf.store_u32(8, 0xDEAD_BEEF).unwrap();
        assert_eq!(buf.load_u32(8).unwrap(), 0xDEAD_BEEF);
        let mut b = [0u8; 4];
        buf.read_bytes(8, &mut b).unwrap();
        assert_eq!(b, 0xDEAD_BEEFu32.to_le_bytes());
        assert!(matches!(
            buf.load_u32(6),
            Err(AccessError::Misaligned { .. })
        ));
        assert!(matches!(
            buf.load_u64(4092),
            Err(AccessError::OutOfBounds { .. })
        ));
        let seg = buf.subrange(4000, 96).unwrap();
        seg.write_bytes(0, &[7; 96]).unwrap();
        assert_eq!(buf.to_vec()[4000], 7);
        assert!(seg.write_bytes(1, &[0; 96]).is_err());
    }

    #[test]
    fn interrupt_wait_sees_a_signal_and_times_out_without_one() {
        let irq = Interrupt::new(0).unwrap();
        assert!(!irq.wait(Duration::from_millis(1)).unwrap());
        irq.try_clone().unwrap().signal().unwrap();
        assert!(irq.wait(Duration::from_secs(1)).unwrap());
        assert!(!irq.try_clear().unwrap());
    }
}
