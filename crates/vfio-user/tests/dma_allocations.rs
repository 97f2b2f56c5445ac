//! A guest behind a vIOMMU sends a DMA_MAP and a DMA_UNMAP per I/O buffer:
//! once the first few have filled the server's pools, a map and an unmap of
//! memory already mapped allocate nothing (counted by this binary's
//! allocator, on the test's own thread only: the test harness's thread may
//! allocate meanwhile, e.g. when it first waits for the test, which on a
//! loaded machine can fall inside the counted loop).

use std::cell::Cell;

use std::alloc::{GlobalAlloc, Layout, System};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{ftruncate, memfd_create, MemfdFlags};
use vnvme_vfio_user::GuestAddress;
use vnvme_vfio_user::{DmaSpace, GuestMemory};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Set on the test's thread: only its allocations are counted.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards every call to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn map_and_unmap_of_mapped_memory_allocate_nothing_once_warm() {
    const RAM: u64 = 16 << 20;
    COUNTED.set(true);
    let fd = memfd_create("vnvme-allocs", MemfdFlags::CLOEXEC).unwrap();
    ftruncate(&fd, RAM).unwrap();
    let dma = DmaSpace::new_local();
    dma.map_fd(0, RAM, fd.as_fd(), 0, true, true).unwrap();
    // A few buffers live at once, as at QD 4, mapped and unmapped in turn.
    let cycle = |i: u64| {
        let iova = 0x1_0000_0000 + (i % 4) * 0x1_0000;
        let page = (i * 97 % (RAM / 4096)) * 4096;
        if i >= 4 {
            dma.unmap(iova, 0x1000).unwrap();
        }
        dma.map_fd(iova, 0x1000, fd.as_fd(), page, true, true)
            .unwrap();
        dma.load_u32(GuestAddress(iova)).unwrap();
    };
    for i in 0..64 {
        cycle(i);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for i in 64..1064 {
        cycle(i);
    }
    let allocated = ALLOCATIONS.load(Ordering::Relaxed) - before;
    assert_eq!(allocated, 0, "allocations in 1000 map/unmap pairs");
}
