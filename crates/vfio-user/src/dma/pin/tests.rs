//! Pins: the host memory they give, what they refuse, and how they hold a
//! map against an unmap.
use std::os::fd::AsFd;
use std::sync::mpsc;
use std::time::Duration;

use super::*;
use crate::dma::DmaError;
use crate::fault;
use crate::GuestAddress;
use crate::GuestMemory;

fn memfd(size: u64) -> std::os::fd::OwnedFd {
    let fd = rustix::fs::memfd_create("vnvme-pin-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, size).unwrap();
    fd
}

fn host(dma: &DmaSpace, iova: u64) -> usize {
    dma.host_address(iova).unwrap() as usize
}

#[test]
fn a_pin_gives_host_regions_merging_pieces_that_touch() {
    let dma = DmaSpace::new_local();
    let fd = memfd(0x4000);
    dma.map_fd(0x10_0000, 0x4000, fd.as_fd(), 0, true, true)
        .unwrap();
    dma.map_anonymous(0x20_0000, 0x1000).unwrap();
    let pages = [
        (0x10_0000, 0x1000),
        (0x10_1000, 0x1000),
        (0x10_3000, 0x200),
        (0x20_0100, 0x100),
    ];
    let pin = dma.pin(pages, true).unwrap();
    assert_eq!(
        pin.regions(),
        &[
            Region {
                addr: host(&dma, 0x10_0000),
                len: 0x2000
            },
            Region {
                addr: host(&dma, 0x10_3000),
                len: 0x200
            },
            Region {
                addr: host(&dma, 0x20_0100),
                len: 0x100
            },
        ]
    );
    assert_eq!(pin.maps.len(), 2, "each map held once");
    assert!(pin.writable() && pin.intact());
}

#[test]
fn a_pin_is_refused_for_memory_the_kernel_cannot_be_handed() {
    let dma = DmaSpace::new_local();
    let ro = memfd(0x2000);
    dma.map_fd(0x1000, 0x2000, ro.as_fd(), 0, true, false)
        .unwrap();
    dma.map_anonymous(0x4000, 0x1000).unwrap();
    assert!(
        dma.pin([(0x1000, 0x1000)], false).is_some(),
        "read-only, read"
    );
    assert!(
        dma.pin([(0x1000, 0x1000)], true).is_none(),
        "read-only, written"
    );
    assert!(dma.pin([(0x9000, 0x1000)], false).is_none(), "not mapped");
    assert!(
        dma.pin([(0x2800, 0x1000)], false).is_none(),
        "runs into a gap"
    );
    assert!(dma.pin([(u64::MAX, 2)], false).is_none(), "wraps");
    // A map the client truncated, found broken by an access of ours.
    let rw = memfd(0x1000);
    dma.map_fd(0x8000, 0x1000, rw.as_fd(), 0, true, true)
        .unwrap();
    rustix::fs::ftruncate(&rw, 0).unwrap();
    assert!(matches!(
        dma.load_u32(GuestAddress(0x8000)),
        Err(DmaError::Broken { .. })
    ));
    assert!(dma.pin([(0x8000, 0x1000)], true).is_none(), "broken");
}

/// An unmap waits for the pin (the kernel's transfer in flight), not
/// counting as late, and munmaps when the pin is dropped.
#[test]
fn an_unmap_waits_for_a_pin_and_munmaps_when_it_is_dropped() {
    let dma = DmaSpace::new_local();
    let fd = memfd(0x4000);
    dma.map_fd(0x10_0000, 0x4000, fd.as_fd(), 0, true, true)
        .unwrap();
    let ptr = host(&dma, 0x10_0000);
    let pin = dma.pin([(0x10_1000, 0x1000)], true).unwrap();
    // As a worker does before it blocks: only the pin holds the map now.
    dma.quiesce();
    let (unmapped_tx, unmapped) = mpsc::channel();
    let unmapper = {
        let dma = dma.clone();
        std::thread::spawn(move || unmapped_tx.send(dma.unmap(0x10_0000, 0x4000)).unwrap())
    };
    assert!(
        unmapped.recv_timeout(Duration::from_millis(100)).is_err(),
        "the unmap returned while a pin held the map"
    );
    assert!(fault::lookup(ptr).is_some(), "munmapped under the pin");
    drop(pin);
    assert_eq!(unmapped.recv().unwrap(), Ok(()));
    unmapper.join().unwrap();
    assert_eq!(dma.late_unmaps(), 0);
    assert_eq!(fault::lookup(ptr), None);
}

/// A pin held past the bound (storage that takes over a second) does not
/// hang the unmap, and its memory stays mapped until it is dropped.
#[test]
fn past_the_bound_a_pinned_map_stays_mapped_until_the_pin_is_dropped() {
    let dma = DmaSpace::new_local();
    let fd = memfd(0x4000);
    dma.map_fd(0x10_0000, 0x4000, fd.as_fd(), 0, true, true)
        .unwrap();
    let ptr = host(&dma, 0x10_0000);
    let pin = dma.pin([(0x10_0000, 0x4000)], true).unwrap();
    dma.unmap(0x10_0000, 0x4000).unwrap();
    assert_eq!(dma.late_unmaps(), 1);
    assert_eq!(dma.map_count(), 0);
    assert!(fault::lookup(ptr).is_some(), "still mapped for the pin");
    // The range is free for a new map at once, elsewhere in this process.
    dma.map_anonymous(0x10_0000, 0x4000).unwrap();
    assert_ne!(host(&dma, 0x10_0000), ptr);
    drop(pin);
    assert_eq!(fault::lookup(ptr), None, "unmapped with the pin");
}
