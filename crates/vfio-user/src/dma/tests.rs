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
