//! The DMA space: bounds, adjacent maps, overlap and limits.
use super::*;

#[test]
fn anonymous_map_read_write_and_bounds() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(0x1000, 0x2000).unwrap();
    dma.write(0x1ffe, &[1, 2, 3, 4]).unwrap();
    let mut b = [0u8; 4];
    dma.read(0x1ffe, &mut b).unwrap();
    assert_eq!(b, [1, 2, 3, 4]);
    assert_eq!(
        dma.load_u32(0x2000).unwrap(),
        u32::from_le_bytes([3, 4, 0, 0])
    );
    dma.store_u32(0x2004, 0xdead_beef).unwrap();
    assert_eq!(dma.load_u32(0x2004).unwrap(), 0xdead_beef);
    // Unaligned load falls back to a copy.
    assert_eq!(
        dma.load_u32(0x1fff).unwrap(),
        u32::from_le_bytes([2, 3, 4, 0])
    );
    assert!(matches!(
        dma.read(0x2fff, &mut b),
        Err(DmaError::Unmapped { .. })
    ));
    assert!(matches!(
        dma.read(u64::MAX - 1, &mut b),
        Err(DmaError::Unmapped { .. })
    ));
    assert!(matches!(
        dma.load_u32(0xffc),
        Err(DmaError::Unmapped { .. })
    ));
}

#[test]
fn access_spanning_adjacent_maps_works_and_gap_fails() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(0x1000, 0x1000).unwrap();
    dma.map_anonymous(0x2000, 0x1000).unwrap();
    dma.map_anonymous(0x4000, 0x1000).unwrap();
    dma.write(0x1ff0, &[7u8; 32]).unwrap();
    let mut b = [0u8; 32];
    dma.read(0x1ff0, &mut b).unwrap();
    assert_eq!(b, [7u8; 32]);
    dma.zero(0x1ff8, 16).unwrap();
    dma.read(0x1ff0, &mut b).unwrap();
    assert_eq!(&b[8..24], &[0u8; 16]);
    assert!(matches!(
        dma.write(0x2ff0, &[0u8; 32]),
        Err(DmaError::Unmapped { addr: 0x3000, .. })
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
fn overlapping_map_is_eexist_and_unmap_must_match() {
    let dma = DmaSpace::new_local();
    dma.map_anonymous(0x1000, 0x2000).unwrap();
    assert_eq!(dma.map_anonymous(0x2000, 0x1000), Err(libc::EEXIST));
    assert_eq!(dma.map_anonymous(0x0, 0x1001), Err(libc::EEXIST));
    assert_eq!(dma.map_anonymous(0x0, 0), Err(libc::EINVAL));
    assert_eq!(dma.map_anonymous(u64::MAX, 2), Err(libc::EINVAL));
    assert_eq!(dma.unmap(0x1000, 0x1000), Err(libc::EINVAL));
    assert_eq!(dma.unmap(0x8000, 0x1000), Err(libc::ENOENT));
    dma.unmap(0x1000, 0x2000).unwrap();
    assert!(matches!(
        dma.load_u32(0x1000),
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
    dma.write(0x10_0000, &[0xa5; 0x10000]).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (dma, stop) = (dma.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 0x10000];
                let (mut whole, mut gone) = (0u64, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    match dma.read(0x10_0000, &mut buf) {
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
        dma.write(0x10_0000, &[0xa5; 0x10000]).unwrap();
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
