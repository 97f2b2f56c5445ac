//! The client's DMA address space as the device sees it.
//!
//! Maps that came with an fd are slices of a MAP_SHARED mapping of their file
//! in this process, one per file however many maps lie in it (`mmap.rs`: how
//! hugetlbfs memory maps at all, and how a vIOMMU's stream of small maps
//! stays cheap), accessed with plain memory copies: no allocation and no
//! syscall on the hot path. Maps without an fd are reached with
//! DMA_READ/DMA_WRITE messages to the client.
//!
//! The map table is immutable: DMA_MAP and DMA_UNMAP publish a new one, and
//! each thread accesses through its own snapshot of it, checked against the
//! current generation with one atomic load and no lock (`snapshot.rs`). An
//! access holds its snapshot for its copy (or its DMA_READ/DMA_WRITE round
//! trip), and a thread keeps it until its next access or until it quiesces
//! ([`DmaSpace::quiesce`]) before blocking. DMA_UNMAP waits until no snapshot
//! holds the removed map, then drops it (munmapping its file's mapping if it
//! was the last map in it). So once the server replies to DMA_UNMAP no
//! access can touch the range, and no access can ever touch
//! memory that was unmapped; the wait is bounded, and past the bound only the
//! first promise is given up, for an access in progress all that time.
//!
//! The kernel can also read and write the maps in place, for I/O on behalf
//! of the device ([`DmaSpace::pin`], `pin.rs`): a [`DmaPin`] holds the maps
//! it touches as a snapshot does, so an unmap waits for that I/O too, and
//! memory the kernel may still write is never unmapped.
//!
//! A client may shrink (ftruncate) the file behind a map at any time: QEMU
//! and SPDK do not seal their memory, and a regular file cannot be sealed.
//! The file is checked to be large enough at map time; an access after it
//! shrank raises SIGBUS, which `fault.rs` turns into a *broken* map (the
//! mapping replaced with zero pages) instead of the death of the process.
//! Every access to an fd-backed map checks the broken flag before its copy
//! and again after it (the copy may have faulted and been redone on zero
//! pages), so it fails with [`DmaError::Broken`] and the command with a Data
//! Transfer Error; the map stays broken until the client unmaps it.
//!
//! Resources: a map costs at most a kernel VMA and, with an fd, a slot of the
//! process-wide fault registry (fewer where maps share a file), so a client
//! gets at most [`DmaLimits::max_maps`] maps and [`DmaLimits::max_bytes`] bytes at once;
//! beyond them DMA_MAP fails with ENOSPC and ENOMEM.

use std::os::fd::BorrowedFd;
use std::sync::atomic::{compiler_fence, AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use vnvme_memory::{DmaError, GuestAddress};

use crate::conn::{Conn, MAX_DATA_XFER_SIZE};
use crate::Errno;

mod access;
mod mmap;
mod pin;
mod remote;
mod snapshot;
use mmap::{FileMaps, Mmap};
pub use pin::DmaPin;
use snapshot::Tables;

/// Most maps a client may have at once, unless `vm.max_map_count` asks for
/// fewer (see [`DmaLimits::default`]).
pub const DEFAULT_MAX_DMA_MAPS: usize = 4096;
/// Most bytes a client may have mapped at once by default: 4 TiB.
pub const DEFAULT_MAX_DMA_BYTES: u64 = 4 << 40;
/// How long a DMA_READ/DMA_WRITE waits for the client's reply.
pub const REMOTE_DMA_TIMEOUT: Duration = Duration::from_secs(5);

/// What one client may map at once. Each map costs a kernel VMA
/// (`vm.max_map_count` bounds them per process) and, with an fd, a slot of
/// the process-wide SIGBUS registry (16384 slots); the bytes are address
/// space the client makes this process reserve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DmaLimits {
    /// Most maps (advertised to the client as `max_dma_maps`); one more is
    /// refused with ENOSPC.
    pub max_maps: usize,
    /// Most bytes over all maps; a map beyond it is refused with ENOMEM.
    pub max_bytes: u64,
}

impl Default for DmaLimits {
    /// [`DEFAULT_MAX_DMA_MAPS`], or a quarter of `vm.max_map_count` if that
    /// is less (the rest is for the process itself, its other clients and
    /// the kernel's splitting of maps); [`DEFAULT_MAX_DMA_BYTES`]. Computed
    /// once.
    fn default() -> Self {
        static DEFAULT: OnceLock<DmaLimits> = OnceLock::new();
        *DEFAULT.get_or_init(|| {
            let max_map_count = std::fs::read_to_string("/proc/sys/vm/max_map_count")
                .ok()
                .and_then(|s| s.trim().parse::<usize>().ok())
                .unwrap_or(65530);
            DmaLimits {
                max_maps: DEFAULT_MAX_DMA_MAPS.min(max_map_count / 4).max(1),
                max_bytes: DEFAULT_MAX_DMA_BYTES,
            }
        })
    }
}

#[derive(Debug)]
enum Backing {
    /// At `delta` bytes into a mapping it may share with other maps.
    Mmap { mm: Arc<Mmap>, delta: usize },
    /// Reached with DMA_READ/DMA_WRITE messages.
    Remote,
}

#[derive(Debug)]
struct Mapping {
    iova: u64,
    size: u64,
    readable: bool,
    writable: bool,
    backing: Backing,
}

impl Mapping {
    fn end(&self) -> u64 {
        // Cannot overflow: checked when the map was added.
        self.iova + self.size
    }

    /// Fails the access `[addr, end)` if `mm`, this map's memory, is broken.
    #[inline]
    fn check_intact(&self, mm: &Mmap, addr: u64, end: u64) -> Result<(), DmaError> {
        if mm.is_broken() {
            return Err(self.broken(mm, addr, end));
        }
        Ok(())
    }

    #[cold]
    fn broken(&self, mm: &Mmap, addr: u64, end: u64) -> DmaError {
        if !mm.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "the client truncated the shared memory behind DMA map {:#x}+{:#x} \
                 (its file shrank under the mapping): accesses to it fail with a \
                 Data Transfer Error until the client unmaps it",
                self.iova,
                self.size
            );
        }
        DmaError::Broken {
            addr: GuestAddress(addr),
            len: end - addr,
        }
    }
}

/// One version of the maps; replaced whole, never changed.
#[derive(Debug, Default, Clone)]
struct MapTable {
    /// Sorted by `iova`, non-overlapping. Shared with the other versions
    /// that hold the same map; the map is munmapped with the last.
    maps: Vec<Arc<Mapping>>,
    /// Sum of the maps' sizes.
    bytes: u64,
    /// Unique in the process (see `snapshot.rs`).
    generation: u64,
}

impl MapTable {
    /// Index of the map containing `addr`.
    fn find(&self, addr: u64) -> Option<usize> {
        let idx = self
            .maps
            .partition_point(|m| m.iova <= addr)
            .checked_sub(1)?;
        (addr < self.maps[idx].end()).then_some(idx)
    }
}

#[derive(Debug)]
struct DmaInner {
    maps: Tables,
    /// The connection DMA_READ/DMA_WRITE go over; None for a local space.
    conn: Option<Arc<Conn>>,
    /// Largest data transfer the client accepts in one message.
    max_xfer: usize,
    limits: DmaLimits,
    /// Whether a DMA_MAP was refused already (later refusals log at debug).
    refused: AtomicBool,
    /// The latest refused DMA_MAPs, oldest first.
    refusals: Mutex<Vec<Refused>>,
    /// The client's files as mapped here, shared by its maps.
    files: FileMaps,
}

/// The client's DMA maps as the device sees them. Cheap to clone, Send + Sync.
/// Every method checks bounds (addresses are hostile) and never panics.
#[derive(Debug, Clone)]
pub struct DmaSpace {
    inner: Arc<DmaInner>,
}

/// One contiguous piece of an access.
enum Piece<'a> {
    Local(*mut u8),
    Remote(&'a Conn),
}

impl Default for DmaSpace {
    fn default() -> Self {
        Self::new_local()
    }
}

impl DmaSpace {
    /// An empty space not attached to any client: maps are added with
    /// [`DmaSpace::map_fd`] or [`DmaSpace::map_anonymous`]. Useful to test a
    /// device without a socket.
    pub fn new_local() -> Self {
        Self::with_conn(None, MAX_DATA_XFER_SIZE, DmaLimits::default())
    }

    pub(crate) fn with_conn(conn: Option<Arc<Conn>>, max_xfer: usize, limits: DmaLimits) -> Self {
        Self {
            inner: Arc::new(DmaInner {
                maps: Tables::default(),
                conn,
                max_xfer: max_xfer.clamp(4, MAX_DATA_XFER_SIZE),
                limits,
                refused: AtomicBool::new(false),
                refusals: Mutex::new(Vec::new()),
                files: FileMaps::default(),
            }),
        }
    }

    /// What this client may map.
    pub fn limits(&self) -> DmaLimits {
        self.inner.limits
    }

    /// The largest DMA_READ/DMA_WRITE transfer the client takes.
    pub fn max_xfer(&self) -> usize {
        self.inner.max_xfer
    }

    /// Number of maps.
    pub fn map_count(&self) -> usize {
        self.inner.maps.current().maps.len()
    }

    /// Lets go of the calling thread's snapshot of the maps (of any space),
    /// so a DMA_UNMAP meanwhile need not wait for this thread. A thread that
    /// accessed guest memory calls it before it blocks for long; its next
    /// access takes the current maps.
    pub fn quiesce(&self) {
        snapshot::quiesce();
    }

    /// DMA_UNMAPs that stopped waiting for a thread to let go of the map
    /// (a wait bounded at one second, see the module docs).
    pub fn late_unmaps(&self) -> u64 {
        self.inner.maps.late_unmaps.load(Ordering::Relaxed)
    }

    /// Maps `size` bytes of `fd` from `file_offset` at `iova`: a slice of
    /// this client's MAP_SHARED mapping of that file, made now if no map
    /// holds one that covers it (`mmap.rs`), registered with the SIGBUS
    /// guard (see the module docs). Errors are errnos for a DMA_MAP reply;
    /// a refusal is logged with its cause.
    pub fn map_fd(
        &self,
        iova: u64,
        size: u64,
        fd: BorrowedFd<'_>,
        file_offset: u64,
        readable: bool,
        writable: bool,
    ) -> Result<(), Errno> {
        self.check_new_map(iova, size)?;
        let whole_up_to = self.inner.limits.max_bytes;
        let (mm, delta) = self
            .inner
            .files
            .get(fd, file_offset, size, writable, whole_up_to)
            .map_err(|r| {
                self.refuse(
                    iova,
                    size,
                    r.errno,
                    format_args!("{} (file offset {file_offset:#x})", r.why),
                )
            })?;
        self.insert(Mapping {
            iova,
            size,
            readable,
            writable,
            backing: Backing::Mmap { mm, delta },
        })
    }

    /// Maps `size` bytes of fresh zeroed anonymous memory at `iova`: device
    /// tests use it as guest memory.
    pub fn map_anonymous(&self, iova: u64, size: u64) -> Result<(), Errno> {
        self.check_new_map(iova, size)?;
        // Only a size beyond the address space fails: no more to say.
        let len = usize::try_from(size).map_err(|_| libc::ENOMEM)?;
        let mm = Arc::new(Mmap::anonymous(len)?);
        self.insert(Mapping {
            iova,
            size,
            readable: true,
            writable: true,
            backing: Backing::Mmap { mm, delta: 0 },
        })
    }

    /// A map reached through DMA_READ/DMA_WRITE.
    pub(crate) fn map_remote(
        &self,
        iova: u64,
        size: u64,
        readable: bool,
        writable: bool,
    ) -> Result<(), Errno> {
        self.check_new_map(iova, size)?;
        if self.inner.conn.is_none() {
            return Err(libc::EINVAL);
        }
        self.insert(Mapping {
            iova,
            size,
            readable,
            writable,
            backing: Backing::Remote,
        })
    }

    fn check_new_map(&self, iova: u64, size: u64) -> Result<(), Errno> {
        if size == 0 || iova.checked_add(size).is_none() {
            return Err(libc::EINVAL);
        }
        let table = self.inner.maps.current();
        self.check_room(&table, iova, size)?;
        if overlaps(&table, iova, size) {
            return Err(libc::EEXIST);
        }
        Ok(())
    }

    /// The client's limits allow one more map of `size` bytes.
    fn check_room(&self, table: &MapTable, iova: u64, size: u64) -> Result<(), Errno> {
        let limits = self.inner.limits;
        if table.maps.len() >= limits.max_maps {
            return Err(self.refuse(
                iova,
                size,
                libc::ENOSPC,
                format_args!(
                    "the client has {} DMA maps, the limit; raise it with `vnvme serve \
                     --max-dma-maps`",
                    table.maps.len()
                ),
            ));
        }
        if table
            .bytes
            .checked_add(size)
            .is_none_or(|total| total > limits.max_bytes)
        {
            return Err(self.refuse(
                iova,
                size,
                libc::ENOMEM,
                format_args!(
                    "the client has {:#x} bytes mapped and may map {:#x}; raise the limit \
                     with `vnvme serve --max-dma-size`",
                    table.bytes, limits.max_bytes
                ),
            ));
        }
        Ok(())
    }

    /// A refused DMA_MAP: logged (a warning the first time for this client,
    /// then debug lines, so a flooding client cannot flood the log) and
    /// remembered, so that a later access to the range can say why it is
    /// not mapped. Returns `errno`.
    #[cold]
    fn refuse(&self, iova: u64, size: u64, errno: Errno, why: std::fmt::Arguments<'_>) -> Errno {
        let what = format!(
            "DMA_MAP of {size:#x} bytes at {iova:#x} refused ({}): {why}",
            errno_name(errno)
        );
        if self.inner.refused.swap(true, Ordering::Relaxed) {
            tracing::debug!("{what}");
        } else {
            tracing::warn!("{what} (further refusals for this client are logged at debug level)");
        }
        let mut refusals = self.inner.refusals.lock();
        if refusals.len() >= MAX_REFUSALS_KEPT {
            refusals.remove(0);
        }
        refusals.push(Refused {
            iova,
            size,
            what,
            explained: false,
        });
        errno
    }

    /// An access failed on unmapped memory: if it lies in a DMA_MAP that was
    /// refused, say so (once per refused map), with the refusal's cause.
    #[cold]
    fn explain(&self, e: &DmaError) {
        let DmaError::Unmapped { addr, .. } = *e else {
            return;
        };
        let mut refusals = self.inner.refusals.lock();
        let Some(r) = refusals
            .iter_mut()
            .rev()
            .find(|r| addr.raw().wrapping_sub(r.iova) < r.size)
        else {
            return;
        };
        if !std::mem::replace(&mut r.explained, true) {
            tracing::warn!(
                "guest memory at {addr:#x} is not mapped: the client's {} (the access fails; \
                 a command on it completes with a Data Transfer Error)",
                r.what
            );
        }
    }

    fn insert(&self, m: Mapping) -> Result<(), Errno> {
        let mut w = self.inner.maps.lock();
        // Checked again with the writers serialised: maps may have changed.
        self.check_room(&w, m.iova, m.size)?;
        if overlaps(&w, m.iova, m.size) {
            return Err(libc::EEXIST);
        }
        let (iova, size) = (m.iova, m.size);
        let m = w.new_map(m);
        self.inner.maps.publish(&mut w, |next| {
            let idx = next.maps.partition_point(|x| x.iova < iova);
            next.bytes += size;
            next.maps.insert(idx, m);
        });
        Ok(())
    }

    /// Removes the maps that lie in `[iova, iova + size)`, as the kernel's
    /// VFIO_IOMMU_UNMAP_DMA does: a range that holds none is no error (QEMU
    /// behind a vIOMMU unmaps whole IOVA windows at shutdown), one that would
    /// split a map is EINVAL. The vfio-user specification and libvfio-user
    /// expect exactly one map's range, a case of this. Waits (at most one
    /// second) until no thread holds a removed map; after it returns no
    /// access touches the range (see the module docs for past the bound).
    pub fn unmap(&self, iova: u64, size: u64) -> Result<(), Errno> {
        // Inclusive: QEMU unmaps up to the end of the address space
        // (`iova + size` = 2^64), which the kernel accepts too.
        let last = size
            .checked_sub(1)
            .and_then(|s| iova.checked_add(s))
            .ok_or(libc::EINVAL)?;
        let mut removed = {
            let mut w = self.inner.maps.lock();
            let first = w.maps.partition_point(|m| m.end() <= iova);
            let after = w.maps.partition_point(|m| m.iova <= last);
            let inside = w.maps.get(first..after).unwrap_or_default();
            if inside.iter().any(|m| m.iova < iova || m.end() - 1 > last) {
                return Err(libc::EINVAL);
            }
            if inside.is_empty() {
                return Ok(());
            }
            // Lent out while this unmap waits: no allocation per unmap.
            let mut removed = std::mem::take(&mut w.removed);
            self.inner.maps.publish(&mut w, |next| {
                removed.extend(next.maps.drain(first..after));
                next.bytes -= removed.iter().map(|m| m.size).sum::<u64>();
            });
            removed
        };
        // Waits outside the lock: threads with an old snapshot take it to
        // refresh.
        self.inner.maps.retire(&mut removed);
        self.inner.maps.lock().removed = removed;
        Ok(())
    }

    /// Removes every map, waiting as [`DmaSpace::unmap`] does.
    pub fn unmap_all(&self) {
        let mut removed = {
            let mut w = self.inner.maps.lock();
            let mut removed = std::mem::take(&mut w.removed);
            self.inner.maps.publish(&mut w, |next| {
                removed.append(&mut next.maps);
                next.bytes = 0;
            });
            removed
        };
        self.inner.maps.retire(&mut removed);
        self.inner.maps.lock().removed = removed;
    }

    /// Where `iova` is in this process, for tests of the mapping itself.
    #[cfg(test)]
    pub(crate) fn host_address(&self, iova: u64) -> Option<*mut u8> {
        let table = self.inner.maps.current();
        let m = table.maps.get(table.find(iova)?)?;
        match &m.backing {
            Backing::Mmap { mm, delta } => {
                Some(mm.ptr.wrapping_add(delta + (iova - m.iova) as usize))
            }
            Backing::Remote => None,
        }
    }

    /// Walks `[iova, iova + len)` map by map, calling `f(piece, offset, n)`
    /// for each contiguous piece, all on this thread's snapshot of the maps.
    fn walk(
        &self,
        iova: u64,
        len: u64,
        write: bool,
        mut f: impl FnMut(Piece<'_>, u64, usize, usize) -> Result<(), DmaError>,
    ) -> Result<(), DmaError> {
        if len == 0 {
            return Ok(());
        }
        let end = iova.checked_add(len).ok_or(DmaError::Unmapped {
            addr: GuestAddress(iova),
            len,
        })?;
        self.inner
            .maps
            .with(|table| self.walk_in(table, iova, end, write, &mut f))
            .inspect_err(|e| self.explain(e))
    }

    /// [`DmaSpace::walk`] on `table`.
    fn walk_in(
        &self,
        table: &MapTable,
        iova: u64,
        end: u64,
        write: bool,
        f: &mut impl FnMut(Piece<'_>, u64, usize, usize) -> Result<(), DmaError>,
    ) -> Result<(), DmaError> {
        let unmapped = DmaError::Unmapped {
            addr: GuestAddress(iova),
            len: end - iova,
        };
        let mut idx = table.find(iova).ok_or(unmapped)?;
        let mut addr = iova;
        let mut done = 0usize;
        loop {
            let m = table.maps.get(idx).ok_or(DmaError::Unmapped {
                addr: GuestAddress(addr),
                len: end - addr,
            })?;
            if m.iova != addr && done != 0 {
                return Err(DmaError::Unmapped {
                    addr: GuestAddress(addr),
                    len: end - addr,
                });
            }
            let n = (end.min(m.end()) - addr) as usize;
            if (write && !m.writable) || (!write && !m.readable) {
                return Err(DmaError::Permission {
                    addr: GuestAddress(addr),
                    len: end - addr,
                });
            }
            let off = addr - m.iova;
            match &m.backing {
                Backing::Mmap { mm, delta } => {
                    m.check_intact(mm, addr, end)?;
                    // In bounds: off + n <= m.size and the mapping is
                    // delta + size bytes long.
                    // SAFETY: the offset stays inside the mapping (above).
                    let p = unsafe { mm.ptr.add(delta + off as usize) };
                    f(Piece::Local(p), addr, done, n)?;
                    // A copy that faulted was redone on zero pages by the
                    // SIGBUS handler, on this thread: the fence keeps the
                    // flag's load after the copy.
                    compiler_fence(Ordering::SeqCst);
                    m.check_intact(mm, addr, end)?;
                }
                Backing::Remote => {
                    let conn = self.inner.conn.as_deref().ok_or(DmaError::Unmapped {
                        addr: GuestAddress(addr),
                        len: n as u64,
                    })?;
                    f(Piece::Remote(conn), addr, done, n)?;
                }
            }
            done += n;
            addr += n as u64;
            if addr >= end {
                return Ok(());
            }
            idx += 1;
        }
    }
}

/// Refused DMA_MAPs remembered per client, to explain later accesses.
const MAX_REFUSALS_KEPT: usize = 16;

/// A refused DMA_MAP (see [`DmaSpace::refuse`]).
#[derive(Debug)]
struct Refused {
    iova: u64,
    size: u64,
    /// The log line that refused it.
    what: String,
    /// Whether an access to it was explained already.
    explained: bool,
}

/// The symbolic name of a DMA_MAP reply's errno, for messages.
fn errno_name(e: Errno) -> std::borrow::Cow<'static, str> {
    let name = match e {
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::ENOSPC => "ENOSPC",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::ENODEV => "ENODEV",
        libc::EBADF => "EBADF",
        libc::EEXIST => "EEXIST",
        libc::EOVERFLOW => "EOVERFLOW",
        other => return format!("errno {other}").into(),
    };
    name.into()
}

fn overlaps(table: &MapTable, iova: u64, size: u64) -> bool {
    let end = iova.saturating_add(size);
    let idx = table.maps.partition_point(|m| m.end() <= iova);
    table.maps.get(idx).is_some_and(|m| m.iova < end)
}

#[cfg(test)]
mod tests;
