//! One mapping per file: maps of one file share it, hugetlbfs maps at any
//! offset, and a mapping lives as long as a map in it.

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{fallocate, ftruncate, memfd_create, FallocateFlags, MemfdFlags};
use rustix::io::pread;

use crate::fault;
use crate::hugepages::HugePages;
use crate::GuestAddress;
use crate::{DmaError, DmaSpace, GuestMemory};

fn memfd(flags: MemfdFlags, size: u64) -> OwnedFd {
    let fd = memfd_create("vnvme-mmap-test", MemfdFlags::CLOEXEC | flags).unwrap();
    ftruncate(&fd, size).unwrap();
    fd
}

/// QEMU's DMA_MAPs of a guest's RAM: below the legacy VGA hole, then the
/// rest from 0xC0000 (the offsets and sizes are those of a 1 GiB guest,
/// scaled to `size`).
fn map_like_qemu(dma: &DmaSpace, fd: &OwnedFd, size: u64) -> Result<(), i32> {
    dma.map_fd(0, 0xA_0000, fd.as_fd(), 0, true, true)?;
    dma.map_fd(0xC_0000, size - 0xC_0000, fd.as_fd(), 0xC_0000, true, true)
}

#[test]
fn maps_of_one_file_are_slices_of_one_mapping() {
    let dma = DmaSpace::new_local();
    let fd = memfd(MemfdFlags::empty(), 0x20_0000);
    map_like_qemu(&dma, &fd, 0x20_0000).unwrap();
    let low = dma.host_address(0).unwrap() as usize;
    let high = dma.host_address(0xC_0000).unwrap() as usize;
    assert_eq!(high - low, 0xC_0000, "not one mapping of the file");
    // A vIOMMU's map of a page already mapped: the same memory, no new
    // mapping, at another IOVA.
    dma.map_fd(0x1_0000_0000, 0x1000, fd.as_fd(), 0x10_0000, true, true)
        .unwrap();
    assert_eq!(
        dma.host_address(0x1_0000_0000).unwrap() as usize,
        low + 0x10_0000
    );
    dma.write(GuestAddress(0x10_0000), b"shared").unwrap();
    let mut buf = [0u8; 6];
    dma.read(GuestAddress(0x1_0000_0000), &mut buf).unwrap();
    assert_eq!(&buf, b"shared");
    // The mapping stays while any map lies in it.
    dma.unmap(0, 0xA_0000).unwrap();
    dma.unmap(0xC_0000, 0x20_0000 - 0xC_0000).unwrap();
    assert!(fault::lookup(low).is_some(), "munmapped under a map");
    dma.read(GuestAddress(0x1_0000_0000), &mut buf).unwrap();
    dma.unmap(0x1_0000_0000, 0x1000).unwrap();
    assert_eq!(
        fault::lookup(low),
        None,
        "the last map's unmap left it mapped"
    );
}

#[test]
fn a_writable_map_of_a_file_first_mapped_read_only_gets_a_writable_mapping() {
    let dir = std::env::temp_dir().join(format!("vnvme-ro-{}", std::process::id()));
    std::fs::write(&dir, vec![0u8; 0x4000]).unwrap();
    let ro: OwnedFd = std::fs::File::open(&dir).unwrap().into();
    let rw: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&dir)
        .unwrap()
        .into();
    std::fs::remove_file(&dir).unwrap();
    let dma = DmaSpace::new_local();
    dma.map_fd(0x1000, 0x1000, ro.as_fd(), 0, true, false)
        .unwrap();
    assert!(matches!(
        dma.write(GuestAddress(0x1000), &[1]),
        Err(DmaError::Permission { .. })
    ));
    assert_eq!(
        dma.map_fd(0x8000, 0x1000, ro.as_fd(), 0x1000, true, true),
        Err(libc::EACCES),
        "a writable map over a read-only fd"
    );
    dma.map_fd(0x8000, 0x1000, rw.as_fd(), 0x1000, true, true)
        .unwrap();
    dma.write(GuestAddress(0x8000), &[7]).unwrap();
    let mut b = [0u8];
    dma.read(GuestAddress(0x8000), &mut b).unwrap();
    assert_eq!(b, [7]);
}

#[test]
fn unmap_removes_the_maps_inside_the_range_and_an_empty_range_is_no_error() {
    let dma = DmaSpace::new_local();
    let fd = memfd(MemfdFlags::empty(), 0x10_0000);
    for i in 0..4u64 {
        dma.map_fd(
            0x10_0000 + i * 0x1000,
            0x1000,
            fd.as_fd(),
            i * 0x1000,
            true,
            true,
        )
        .unwrap();
    }
    // QEMU behind a vIOMMU unmaps whole windows, mapped or not.
    assert_eq!(dma.unmap(0x1_0000_0000, 0x1_0000_0000), Ok(()));
    // A range that would split a map is refused and removes nothing.
    assert_eq!(dma.unmap(0x10_0800, 0x1000), Err(libc::EINVAL));
    assert_eq!(dma.map_count(), 4);
    dma.unmap(0x10_1000, 0x2000).unwrap();
    assert_eq!(dma.map_count(), 2);
    assert!(matches!(
        dma.load_u32(GuestAddress(0x10_1000)),
        Err(DmaError::Unmapped { .. })
    ));
    // To the end of the address space, as QEMU unmaps at shutdown.
    dma.unmap(0x10_0000, 0u64.wrapping_sub(0x10_0000)).unwrap();
    assert_eq!(dma.map_count(), 0);
    assert_eq!(dma.unmap(2, u64::MAX), Err(libc::EINVAL), "past the end");
    assert_eq!(dma.unmap(0x1000, 0), Err(libc::EINVAL));
}

#[test]
fn a_map_past_the_end_of_its_file_is_refused_and_an_access_there_stays_unmapped() {
    let dma = DmaSpace::new_local();
    let fd = memfd(MemfdFlags::empty(), 0x1000);
    assert_eq!(
        dma.map_fd(0x4000, 0x2000, fd.as_fd(), 0, true, true),
        Err(libc::EINVAL)
    );
    // Explained in the log; to the access, plain unmapped memory.
    assert!(matches!(
        dma.load_u32(GuestAddress(0x4000)),
        Err(DmaError::Unmapped {
            addr: GuestAddress(0x4000),
            ..
        })
    ));
    let refusals = dma.inner.refusals.lock();
    assert_eq!(refusals.len(), 1);
    assert!(refusals[0].explained, "the access was not explained");
    assert!(
        refusals[0]
            .what
            .contains("past the end of the 0x1000-byte tmpfs"),
        "{}",
        refusals[0].what
    );
}

/// Reserves `count` 2 MiB pages, or fails the test where it runs as root
/// (as CI does); elsewhere it says why it cannot and the test stops.
fn huge_pages(count: u64) -> Option<HugePages> {
    match HugePages::reserve(count, 2048) {
        Ok(p) => Some(p),
        Err(why) if !rustix::process::geteuid().is_root() => {
            eprintln!("not run: {why}");
            None
        }
        Err(why) => panic!("cannot reserve huge pages: {why}"),
    }
}

#[test]
fn hugetlbfs_ram_maps_at_the_offsets_qemu_sends() {
    let Some(_pages) = huge_pages(4) else { return };
    const SIZE: u64 = 4 << 20;
    let fd = memfd(MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB, SIZE);
    let dma = DmaSpace::new_local();
    map_like_qemu(&dma, &fd, SIZE).expect("hugetlbfs maps at QEMU's offsets");
    let low = dma.host_address(0).unwrap() as usize;
    assert_eq!(low % (2 << 20), 0, "a huge page mapping");
    assert_eq!(dma.host_address(0xC_0000).unwrap() as usize, low + 0xC_0000);
    dma.write(GuestAddress(SIZE - 8), b"lastword").unwrap();
    dma.write(GuestAddress(0x9_fff8), b"belowvga").unwrap();
    let mut buf = [0u8; 8];
    dma.read(GuestAddress(SIZE - 8), &mut buf).unwrap();
    assert_eq!(&buf, b"lastword");
    // A vIOMMU's 4 KiB map inside a huge page.
    dma.map_fd(0x1_0000_0000, 0x1000, fd.as_fd(), 0x9_f000, true, true)
        .unwrap();
    dma.read(GuestAddress(0x1_0000_0ff8), &mut buf).unwrap();
    assert_eq!(&buf, b"belowvga");
    dma.unmap(0, u64::MAX).unwrap();
    assert_eq!(fault::lookup(low), None);
}

#[test]
fn truncated_hugetlbfs_ram_fails_accesses_with_broken_and_the_process_lives() {
    let Some(_pages) = huge_pages(2) else { return };
    const SIZE: u64 = 4 << 20;
    let fd = memfd(MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB, SIZE);
    let dma = DmaSpace::new_local();
    map_like_qemu(&dma, &fd, SIZE).unwrap();
    dma.write(GuestAddress(0x10_0000), &[0xAB; 64]).unwrap();
    ftruncate(&fd, 0).unwrap();
    assert!(matches!(
        dma.load_u32(GuestAddress(SIZE - 4)),
        Err(DmaError::Broken { .. })
    ));
    // Both maps lie in the one mapping the guard replaced.
    assert!(matches!(
        dma.load_u32(GuestAddress(0)),
        Err(DmaError::Broken { .. })
    ));
    assert!(matches!(
        dma.write(GuestAddress(0x10_0000), &[1]),
        Err(DmaError::Broken { .. })
    ));
    dma.unmap(0, u64::MAX).unwrap();
    ftruncate(&fd, SIZE).unwrap();
    map_like_qemu(&dma, &fd, SIZE).unwrap();
    assert_eq!(
        dma.load_u32(GuestAddress(0x10_0000)).unwrap(),
        0,
        "a fresh mapping"
    );
}

/// SPDK's host with `-g` (DPDK's one hugetlbfs file per memory segment
/// list) and QEMU's hugetlbfs RAM with `reserve=off` share sparse files:
/// pages only where the client allocated them. SPDK sends each of its
/// pages where it lies in the file (IOVA = its virtual address from DPDK's
/// base 0x2000_0000_0000, offset = page index x 2 MiB), and the server maps
/// the whole file: it must not reserve huge pages for the holes. The file
/// is 1 TiB, more than any machine's pool, so a reserving mmap is refused
/// (ENOMEM) for sure.
#[test]
fn a_sparse_hugetlbfs_file_maps_whole_without_reserving_its_holes() {
    let Some(_pages) = huge_pages(2) else { return };
    const PAGE: u64 = 2 << 20;
    const SIZE: u64 = 1 << 40;
    const BASE: u64 = 0x2000_0000_0000;
    let fd = memfd(MemfdFlags::HUGETLB | MemfdFlags::HUGE_2MB, SIZE);
    let (first, last) = (2 * PAGE, SIZE - PAGE);
    for offset in [first, last] {
        fallocate(&fd, FallocateFlags::empty(), offset, PAGE).unwrap();
    }
    let dma = DmaSpace::new_local();
    for offset in [first, last] {
        dma.map_fd(BASE + offset, PAGE, fd.as_fd(), offset, true, true)
            .expect("a page of a sparse hugetlbfs file maps");
    }
    let low = dma.host_address(BASE + first).unwrap() as u64;
    let high = dma.host_address(BASE + last).unwrap() as u64;
    assert_eq!(high - low, last - first, "both pages in one mapping");
    dma.write(GuestAddress(BASE + first + 8), b"spdkpage")
        .unwrap();
    dma.write(GuestAddress(BASE + last + PAGE - 8), b"lastpage")
        .unwrap();
    // Written into the client's pages, not into pages of a mapping's own.
    let mut buf = [0u8; 8];
    pread(&fd, &mut buf, first + 8).unwrap();
    assert_eq!(&buf, b"spdkpage");
    pread(&fd, &mut buf, last + PAGE - 8).unwrap();
    assert_eq!(&buf, b"lastpage");
    dma.unmap(0, u64::MAX).unwrap();
    assert_eq!(fault::lookup(low as usize), None);
}
