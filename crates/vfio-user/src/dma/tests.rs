//! The DMA space: bounds, adjacent maps, overlap and limits.
use std::os::fd::AsFd;

use super::*;
use crate::fault;
use crate::GuestMemory;

#[test]
fn anonymous_map_read_write_and_bounds() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(0x1000, 0x2000).unwrap();
    dma.write(GuestAddress(0x1ffe), &[1, 2, 3, 4]).unwrap();
    let mut b = [0u8; 4];
    dma.read(GuestAddress(0x1ffe), &mut b).unwrap();
    assert_eq!(b, [1, 2, 3, 4]);
    assert_eq!(
        dma.load_u32(GuestAddress(0x2000)).unwrap(),
        u32::from_le_bytes([3, 4, 0, 0])
    );
    dma.store_u32(GuestAddress(0x2004), 0xdead_beef).unwrap();
    assert_eq!(dma.load_u32(GuestAddress(0x2004)).unwrap(), 0xdead_beef);
    // Unaligned load falls back to a copy.
    assert_eq!(
        dma.load_u32(GuestAddress(0x1fff)).unwrap(),
        u32::from_le_bytes([2, 3, 4, 0])
    );
    assert!(matches!(
        dma.read(GuestAddress(0x2fff), &mut b),
        Err(DmaError::Unmapped { .. })
    ));
    assert!(matches!(
        dma.read(GuestAddress(u64::MAX - 1), &mut b),
        Err(DmaError::Unmapped { .. })
    ));
    assert!(matches!(
        dma.load_u32(GuestAddress(0xffc)),
        Err(DmaError::Unmapped { .. })
    ));
}

#[test]
fn access_spanning_adjacent_maps_works_and_gap_fails() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(0x1000, 0x1000).unwrap();
    dma.map_anonymous(0x2000, 0x1000).unwrap();
    dma.map_anonymous(0x4000, 0x1000).unwrap();
    dma.write(GuestAddress(0x1ff0), &[7u8; 32]).unwrap();
    let mut b = [0u8; 32];
    dma.read(GuestAddress(0x1ff0), &mut b).unwrap();
    assert_eq!(b, [7u8; 32]);
    dma.zero(GuestAddress(0x1ff8), 16).unwrap();
    dma.read(GuestAddress(0x1ff0), &mut b).unwrap();
    assert_eq!(&b[8..24], &[0u8; 16]);
    assert!(matches!(
        dma.write(GuestAddress(0x2ff0), &[0u8; 32]),
        Err(DmaError::Unmapped {
            addr: GuestAddress(0x3000),
            ..
        })
    ));
}

fn limited(max_maps: usize, max_bytes: u64) -> DmaSpace {
    DmaSpace::with_conn(
        None,
        MAX_DATA_XFER_SIZE,
        DmaLimits {
            max_maps,
            max_bytes,
        },
    )
}

#[test]
fn map_beyond_max_maps_is_enospc_until_one_is_unmapped() {
    let dma = limited(3, u64::MAX);
    for i in 0..3 {
        dma.map_anonymous(0x1000 * (i + 1), 0x1000).unwrap();
    }
    assert_eq!(dma.map_anonymous(0x8000, 0x1000), Err(libc::ENOSPC));
    // An fd-backed map is refused before anything is mapped.
    let fd = rustix::fs::memfd_create("vnvme-limit", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, 0x1000).unwrap();
    assert_eq!(
        dma.map_fd(0x8000, 0x1000, fd.as_fd(), 0, true, true),
        Err(libc::ENOSPC)
    );
    dma.unmap(0x2000, 0x1000).unwrap();
    dma.map_fd(0x8000, 0x1000, fd.as_fd(), 0, true, true)
        .unwrap();
    assert_eq!(dma.map_count(), 3);
    dma.unmap_all();
    dma.map_anonymous(0x8000, 0x1000).unwrap();
}

#[test]
fn maps_beyond_max_bytes_are_enomem_until_room_is_freed() {
    let dma = limited(100, 0x3000);
    assert_eq!(dma.limits().max_bytes, 0x3000);
    dma.map_anonymous(0x10000, 0x2000).unwrap();
    assert_eq!(dma.map_anonymous(0x20000, 0x2000), Err(libc::ENOMEM));
    dma.map_anonymous(0x20000, 0x1000).unwrap();
    assert_eq!(dma.map_anonymous(0x30000, 0x1000), Err(libc::ENOMEM));
    dma.unmap(0x10000, 0x2000).unwrap();
    dma.map_anonymous(0x30000, 0x2000).unwrap();
    // A huge map is refused before anything is reserved.
    assert_eq!(dma.map_anonymous(0x40000, u64::MAX >> 1), Err(libc::ENOMEM));
}

#[test]
fn default_limits_respect_max_map_count() {
    let limits = DmaLimits::default();
    assert!((1..=DEFAULT_MAX_DMA_MAPS).contains(&limits.max_maps));
    assert!(limits.max_maps <= fault::CAPACITY);
    assert_eq!(limits.max_bytes, 4 << 40);
    assert_eq!(DmaSpace::new_local().limits(), limits);
}

#[test]
fn overlapping_map_is_eexist_and_unmap_must_not_split_a_map() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(0x1000, 0x2000).unwrap();
    assert_eq!(dma.map_anonymous(0x2000, 0x1000), Err(libc::EEXIST));
    assert_eq!(dma.map_anonymous(0x0, 0x1001), Err(libc::EEXIST));
    assert_eq!(dma.map_anonymous(0x0, 0), Err(libc::EINVAL));
    assert_eq!(dma.map_anonymous(u64::MAX, 2), Err(libc::EINVAL));
    assert_eq!(dma.unmap(0x1000, 0x1000), Err(libc::EINVAL));
    assert_eq!(dma.unmap(0x8000, 0x1000), Ok(()), "nothing there to unmap");
    dma.unmap(0x1000, 0x2000).unwrap();
    assert!(matches!(
        dma.load_u32(GuestAddress(0x1000)),
        Err(DmaError::Unmapped { .. })
    ));
}

/// Readers on other threads never touch an unmapped map while it is
/// unmapped and mapped again under them: a munmap under a copy would crash
/// (SIGSEGV). A copy sees the old map, or the new one (zeroes, or being
/// filled), or no map at all.
#[test]
fn readers_never_touch_a_map_unmapped_and_remapped_under_them() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(0x10_0000, 0x10000).unwrap();
    dma.write(GuestAddress(0x10_0000), &[0xa5; 0x10000])
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (dma, stop) = (dma.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 0x10000];
                let (mut whole, mut gone) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    match dma.read(GuestAddress(0x10_0000), &mut buf) {
                        Ok(()) => {
                            assert!(buf.iter().all(|&b| b == 0xa5 || b == 0), "foreign bytes");
                            whole += 1;
                        }
                        Err(DmaError::Unmapped { .. }) => gone += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
                (whole, gone)
            })
        })
        .collect();
    for _ in 0..2000 {
        dma.unmap(0x10_0000, 0x10000).unwrap();
        dma.map_anonymous(0x10_0000, 0x10000).unwrap();
        dma.write(GuestAddress(0x10_0000), &[0xa5; 0x10000])
            .unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let (whole, _gone): (u64, u64) = readers
        .into_iter()
        .map(|r| r.join().unwrap())
        .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
    assert!(whole > 0, "no reader ever saw the map");
    dma.unmap_all();
    assert_eq!(dma.map_count(), 0);
}

fn memfd_map(dma: &DmaSpace, iova: u64, size: u64) -> std::os::fd::OwnedFd {
    let fd = rustix::fs::memfd_create("vnvme-dma-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, size).unwrap();
    dma.map_fd(iova, size, fd.as_fd(), 0, true, true).unwrap();
    fd
}

/// The unmapping thread (the vfio-user server's, whose trap path writes
/// guest memory) lets go of its own snapshot instead of waiting for itself.
#[test]
fn unmap_by_a_thread_that_accessed_the_map_does_not_wait_for_itself() {
    let dma = DmaSpace::new_local();
    let _fd = memfd_map(&dma, 0x10_0000, 0x4000);
    let ptr = dma.host_address(0x10_0000).unwrap() as usize;
    dma.store_u32(GuestAddress(0x10_0000), 7).unwrap();
    dma.unmap(0x10_0000, 0x4000).unwrap();
    assert_eq!(dma.late_unmaps(), 0);
    assert_eq!(fault::lookup(ptr), None, "unmapped at once");
}

/// A worker quiesces before it blocks: an unmap meanwhile does not wait
/// for it, and its next access finds the map gone.
#[test]
fn a_reader_that_quiesced_before_blocking_does_not_hold_up_an_unmap() {
    let dma = DmaSpace::new_local();
    let _fd = memfd_map(&dma, 0x10_0000, 0x4000);
    let ptr = dma.host_address(0x10_0000).unwrap() as usize;
    let (blocked_tx, blocked) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let reader = {
        let dma = dma.clone();
        std::thread::spawn(move || {
            dma.load_u32(GuestAddress(0x10_0000)).unwrap();
            dma.quiesce();
            blocked_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            dma.load_u32(GuestAddress(0x10_0000))
        })
    };
    blocked.recv().unwrap();
    dma.unmap(0x10_0000, 0x4000).unwrap();
    assert_eq!(dma.late_unmaps(), 0);
    assert_eq!(fault::lookup(ptr), None, "unmapped before the reply");
    go.send(()).unwrap();
    assert!(matches!(
        reader.join().unwrap(),
        Err(DmaError::Unmapped { .. })
    ));
}

/// A reader wedged with a snapshot (it neither accesses nor quiesces) does
/// not hang the unmap: past UNMAP_WAIT the unmap returns, but the memory
/// stays mapped (and guarded against SIGBUS) while the reader can reach
/// it, and is unmapped when the reader lets go at its next access, which
/// finds the map gone.
#[test]
fn a_wedged_reader_delays_an_unmap_by_the_bound_and_the_memory_outlives_it() {
    let dma = DmaSpace::new_local();
    let _fd = memfd_map(&dma, 0x10_0000, 0x4000);
    let ptr = dma.host_address(0x10_0000).unwrap() as usize;
    let (holding_tx, holding) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel::<()>();
    let reader = {
        let dma = dma.clone();
        std::thread::spawn(move || {
            dma.store_u32(GuestAddress(0x10_0000), 7).unwrap();
            holding_tx.send(()).unwrap();
            go_rx.recv().unwrap();
            dma.load_u32(GuestAddress(0x10_0000))
        })
    };
    holding.recv().unwrap();
    dma.unmap(0x10_0000, 0x4000).unwrap();
    assert_eq!(dma.late_unmaps(), 1);
    assert_eq!(dma.map_count(), 0);
    assert!(fault::lookup(ptr).is_some(), "still mapped for the reader");
    // The range is free for a new map at once.
    dma.map_anonymous(0x10_0000, 0x4000).unwrap();
    dma.unmap(0x10_0000, 0x4000).unwrap();
    go.send(()).unwrap();
    assert!(matches!(
        reader.join().unwrap(),
        Err(DmaError::Unmapped { .. })
    ));
    assert_eq!(fault::lookup(ptr), None, "unmapped by the reader's refresh");
}

/// A map published by one thread is seen by another thread's next access,
/// whatever snapshot that thread held.
#[test]
fn a_map_added_after_a_reader_snapshot_is_seen_at_its_next_access() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(0x1000, 0x1000).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let (back_tx, back) = std::sync::mpsc::channel();
    let reader = {
        let dma = dma.clone();
        std::thread::spawn(move || {
            dma.load_u32(GuestAddress(0x1000)).unwrap();
            back_tx
                .send(dma.load_u32(GuestAddress(0x8000)).is_err())
                .unwrap();
            rx.recv().unwrap();
            dma.load_u32(GuestAddress(0x8000))
        })
    };
    assert!(back.recv().unwrap(), "not mapped yet");
    dma.map_anonymous(0x8000, 0x1000).unwrap();
    dma.store_u32(GuestAddress(0x8000), 0x1234_5678).unwrap();
    tx.send(()).unwrap();
    assert_eq!(reader.join().unwrap(), Ok(0x1234_5678));
}

/// An unmap waits for an access in progress on the map (here held open
/// inside the table snapshot, as a copy or a DMA_READ round trip holds
/// it), munmaps only after it, and does not count as late.
#[test]
fn unmap_waits_for_an_access_in_progress_then_munmaps() {
    let dma = DmaSpace::new_local();
    let _fd = memfd_map(&dma, 0x10_0000, 0x4000);
    let ptr = dma.host_address(0x10_0000).unwrap() as usize;
    let (inside_tx, inside) = std::sync::mpsc::channel();
    let (finish, finish_rx) = std::sync::mpsc::channel::<()>();
    let reader = {
        let dma = dma.clone();
        std::thread::spawn(move || {
            dma.inner.maps.with(|table| {
                inside_tx.send(()).unwrap();
                finish_rx.recv().unwrap();
                table.find(0x10_0000).is_some()
            })
        })
    };
    inside.recv().unwrap();
    let (unmapped_tx, unmapped) = std::sync::mpsc::channel();
    let unmapper = {
        let dma = dma.clone();
        std::thread::spawn(move || {
            let r = dma.unmap(0x10_0000, 0x4000);
            unmapped_tx.send(r).unwrap();
        })
    };
    assert!(
        unmapped
            .recv_timeout(std::time::Duration::from_millis(100))
            .is_err(),
        "the unmap returned while an access held the map"
    );
    assert!(fault::lookup(ptr).is_some(), "munmapped under the access");
    finish.send(()).unwrap();
    assert!(reader.join().unwrap(), "the access saw the map");
    assert_eq!(unmapped.recv().unwrap(), Ok(()));
    unmapper.join().unwrap();
    assert_eq!(dma.late_unmaps(), 0);
    assert_eq!(fault::lookup(ptr), None);
}

/// Dropping a space lets go of the dropping thread's snapshot of it, so
/// its maps are munmapped then, not at that thread's next access.
#[test]
fn dropping_a_space_munmaps_its_maps_on_a_thread_that_accessed_them() {
    let dma = DmaSpace::new_local();
    let _fd = memfd_map(&dma, 0x10_0000, 0x4000);
    let ptr = dma.host_address(0x10_0000).unwrap() as usize;
    dma.load_u32(GuestAddress(0x10_0000)).unwrap();
    drop(dma);
    assert_eq!(fault::lookup(ptr), None);
}
