//! `VfioUserAccess` against the real vfio-user server over a socketpair,
//! with a tiny device: registers, DMA reach and unmap, MSI-X enable and
//! eventfds, and a doorbell page offered as a sparse mmap area of a memfd.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use vnvme_driver::{DeviceAccess, DmaPool, VfioUserAccess};
use vnvme_vfio_user::GuestAddress;
use vnvme_vfio_user::{
    irq, region, Device, DeviceInfo, DmaSpace, Errno, GuestMemory, IrqInfo, RegionInfo, Server,
    SparseArea, VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_EVENTFD,
    VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};

const MSIX_CAP: usize = 0x50;

#[derive(Default)]
struct Shared {
    bar0: Vec<u8>,
    config: Vec<u8>,
    dma: Option<DmaSpace>,
    irq_fds: Vec<OwnedFd>,
    /// BAR0 offsets written over the socket, in order.
    bar0_writes: Vec<u64>,
}

/// BAR0 offset whose socket writes the device fails with EIO.
const FAILING_REGISTER: u64 = 0x40;

/// How the device offers BAR0 for mapping.
struct Mmap {
    fd: OwnedFd,
    areas: Vec<SparseArea>,
}

struct TinyDevice(Arc<Mutex<Shared>>, Option<Mmap>);

impl Device for TinyDevice {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
            num_regions: region::COUNT,
            num_irqs: irq::COUNT,
        }
    }

    fn region_info(&self, index: u32) -> Option<(RegionInfo, Option<BorrowedFd<'_>>)> {
        let size = match index {
            region::BAR0 => 0x4000,
            region::CONFIG => 256,
            _ => 0,
        };
        let mmap = self.1.as_ref().filter(|_| index == region::BAR0);
        Some((
            RegionInfo {
                flags: VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE,
                size,
                sparse_areas: mmap.map(|m| m.areas.clone()).unwrap_or_default(),
            },
            mmap.map(|m| m.fd.as_fd()),
        ))
    }

    fn irq_info(&self, index: u32) -> Option<IrqInfo> {
        (index < irq::COUNT).then_some(IrqInfo {
            flags: VFIO_IRQ_INFO_EVENTFD,
            count: if index == irq::MSIX { 4 } else { 1 },
        })
    }

    fn region_read(&mut self, index: u32, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let s = self.0.lock();
        let src = if index == region::CONFIG {
            &s.config
        } else {
            &s.bar0
        };
        let at = offset as usize;
        buf.copy_from_slice(&src[at..at + buf.len()]);
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let mut s = self.0.lock();
        if index == region::BAR0 {
            s.bar0_writes.push(offset);
            if offset == FAILING_REGISTER {
                return Err(libc::EIO);
            }
        }
        let dst = if index == region::CONFIG {
            &mut s.config
        } else {
            &mut s.bar0
        };
        let at = offset as usize;
        dst[at..at + data.len()].copy_from_slice(data);
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        _flags: u32,
        _start: u32,
        _count: u32,
        fds: Vec<OwnedFd>,
    ) -> Result<(), Errno> {
        if index == irq::MSIX {
            self.0.lock().irq_fds = fds;
        }
        Ok(())
    }

    fn attach(&mut self, dma: DmaSpace) {
        self.0.lock().dma = Some(dma);
    }

    fn detach(&mut self) {
        self.0.lock().dma = None;
    }

    fn reset(&mut self) {}
}

fn setup() -> (VfioUserAccess, Arc<Mutex<Shared>>) {
    setup_with(None)
}

/// A memfd of `file_len` bytes offered as BAR0 `areas`; fd offset == region offset.
fn doorbell_memfd(file_len: u64, areas: &[(u64, u64)]) -> Mmap {
    let fd = rustix::fs::memfd_create("tiny-bar0", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&fd, file_len).unwrap();
    Mmap {
        fd,
        areas: areas
            .iter()
            .map(|&(offset, size)| SparseArea { offset, size })
            .collect(),
    }
}

fn read_memfd_u32(fd: &OwnedFd, offset: u64) -> u32 {
    let mut b = [0u8; 4];
    rustix::io::pread(fd, &mut b, offset).unwrap();
    u32::from_le_bytes(b)
}

fn setup_with(mmap: Option<Mmap>) -> (VfioUserAccess, Arc<Mutex<Shared>>) {
    let mut config = vec![0u8; 256];
    config[0x06] = 1 << 4; // status: capability list
    config[0x34] = 0x40;
    config[0x40] = 0x01; // power management, next 0x50
    config[0x41] = MSIX_CAP as u8;
    config[MSIX_CAP] = 0x11;
    config[MSIX_CAP + 3] = 0x40; // function mask set
    let shared = Arc::new(Mutex::new(Shared {
        bar0: vec![0; 0x4000],
        config,
        ..Default::default()
    }));
    let (a, b) = UnixStream::pair().unwrap();
    let dev = TinyDevice(shared.clone(), mmap);
    std::thread::spawn(move || Server::new(dev).serve_stream(b));
    (VfioUserAccess::from_stream(a).unwrap(), shared)
}

#[test]
fn register_writes_are_posted_and_ordered_before_reads() {
    let (access, shared) = setup();
    access.write32(0x14, 0x0046_0001).unwrap();
    access.write64(0x28, 0x1234_5678_9ABC_D000).unwrap();
    assert_eq!(access.read32(0x14).unwrap(), 0x0046_0001);
    assert_eq!(access.read64(0x28).unwrap(), 0x1234_5678_9ABC_D000);
    assert_eq!(
        &shared.lock().bar0[0x28..0x2C],
        &0x9ABC_D000u32.to_le_bytes()
    );
}

#[test]
fn dma_buffers_are_reachable_by_the_device_at_their_iova() {
    let (access, shared) = setup();
    let buf = access.dma_alloc(8192).unwrap();
    buf.write_bytes(4000, b"hello device").unwrap();
    let dma = shared.lock().dma.clone().unwrap();
    let mut got = [0u8; 12];
    dma.read(GuestAddress(buf.iova() + 4000), &mut got).unwrap();
    assert_eq!(&got, b"hello device");
    dma.write(GuestAddress(buf.iova() + 16), b"hi driver")
        .unwrap();
    let mut back = [0u8; 9];
    buf.read_bytes(16, &mut back).unwrap();
    assert_eq!(&back, b"hi driver");
}

#[test]
fn freed_dma_memory_is_unmapped_with_or_without_its_fd() {
    for with_fd in [false, true] {
        let (access, shared) = setup();
        let access = access.unmap_with_fd(with_fd);
        // Past half the pool's chunk: a region, and a DMA_MAP, of its own.
        let buf = access.dma_alloc(DmaPool::DEFAULT_CHUNK).unwrap();
        let (iova, dma) = (buf.iova(), shared.lock().dma.clone().unwrap());
        dma.read(GuestAddress(iova), &mut [0u8; 4]).unwrap();
        drop(buf);
        assert!(
            dma.read(GuestAddress(iova), &mut [0u8; 4]).is_err(),
            "fd: {with_fd}"
        );
        assert_eq!(access.failed_unmaps(), 0);
    }
}

#[test]
fn a_dma_unmap_the_server_refuses_is_counted() {
    let (access, _) = setup();
    let buf = access.dma_alloc(DmaPool::DEFAULT_CHUNK).unwrap();
    // Unmapped behind the pool's back and mapped again straddling its start:
    // the pool's own DMA_UNMAP would cut that map in two, which the server
    // refuses (an unmap of nothing is no error, as the kernel's VFIO has it).
    let len = DmaPool::DEFAULT_CHUNK as u64;
    access.client().dma_unmap(buf.iova(), len).unwrap();
    let other = rustix::fs::memfd_create("straddle", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
    rustix::fs::ftruncate(&other, 0x2000).unwrap();
    access
        .client()
        .dma_map(buf.iova() - 0x1000, 0x2000, other.as_fd(), 0, true)
        .unwrap();
    drop(buf);
    assert_eq!(access.failed_unmaps(), 1);
}

#[test]
fn enabling_interrupts_sets_bus_master_and_msix_enable_and_passes_eventfds() {
    let (access, shared) = setup();
    let irqs = access.enable_interrupts(8).unwrap();
    assert_eq!(irqs.len(), 4, "capped by the device's vector count");
    {
        let s = shared.lock();
        let command = u16::from_le_bytes([s.config[4], s.config[5]]);
        assert_ne!(command & (1 << 2), 0, "bus master");
        let control = u16::from_le_bytes([s.config[MSIX_CAP + 2], s.config[MSIX_CAP + 3]]);
        assert_eq!(control & 0xC000, 0x8000, "MSI-X enabled, function unmasked");
        assert_eq!(s.irq_fds.len(), 4);
        rustix::io::write(&s.irq_fds[2], &1u64.to_ne_bytes()).unwrap();
    }
    assert!(irqs[2].wait(Duration::from_secs(5)).unwrap());
    assert!(!irqs[1].wait(Duration::from_millis(1)).unwrap());
    access.disable_interrupts().unwrap();
}

#[test]
fn sparse_mmap_doorbell_page_is_mapped_and_its_stores_send_no_message() {
    let mmap = doorbell_memfd(0x2000, &[(0x1000, 0x1000)]);
    let fd = mmap.fd.try_clone().unwrap();
    let (access, shared) = setup_with(Some(mmap));
    assert!(!access.is_mapped(0x1008));
    assert!(access.map_registers().unwrap());
    assert!(access.is_mapped(0x1008));
    assert!(
        !access.is_mapped(0x14),
        "registers outside the area still trap"
    );
    assert_eq!(access.mapped_areas().len(), 1);

    access.write32(0x1008, 7).unwrap();
    access.write32(0x100C, 0xABCD).unwrap();
    assert_eq!(
        read_memfd_u32(&fd, 0x1008),
        7,
        "the device's memfd sees the store"
    );
    assert_eq!(read_memfd_u32(&fd, 0x100C), 0xABCD);
    rustix::io::pwrite(&fd, &9u32.to_le_bytes(), 0x1010).unwrap();
    assert_eq!(
        access.read32(0x1010).unwrap(),
        9,
        "loads come from the mapping too"
    );

    access.write32(0x14, 1).unwrap();
    // A socket read orders everything sent before it.
    assert_eq!(access.read32(0x14).unwrap(), 1);
    assert_eq!(
        shared.lock().bar0_writes,
        [0x14],
        "no message for the doorbells"
    );
}

#[test]
fn once_mapped_socket_register_writes_wait_for_their_reply() {
    let mmap = doorbell_memfd(0x2000, &[(0x1000, 0x1000)]);
    let (access, _shared) = setup_with(Some(mmap));
    access
        .write32(FAILING_REGISTER, 1)
        .expect("posted: the device's error is not reported");
    assert!(access.map_registers().unwrap());
    assert!(
        access.write32(FAILING_REGISTER, 1).is_err(),
        "with a reply, the device's error is seen"
    );
}

#[test]
fn without_sparse_areas_nothing_is_mapped_and_writes_stay_posted() {
    let (access, shared) = setup();
    assert!(!access.map_registers().unwrap());
    assert!(!access.is_mapped(0x1000));
    access.write32(FAILING_REGISTER, 1).unwrap();
    access.write32(0x1000, 3).unwrap();
    assert_eq!(access.read32(0x1000).unwrap(), 3);
    assert_eq!(shared.lock().bar0_writes, [FAILING_REGISTER, 0x1000]);
}

#[test]
fn areas_past_the_end_of_the_file_or_misaligned_are_not_mapped() {
    // Touching a page past the end of the memfd would raise SIGBUS.
    let mmap = doorbell_memfd(0x1000, &[(0x1000, 0x1000), (0x800, 0x1000)]);
    let (access, shared) = setup_with(Some(mmap));
    assert!(!access.map_registers().unwrap());
    access.write32(0x1000, 5).unwrap();
    assert_eq!(access.read32(0x1000).unwrap(), 5);
    assert_eq!(shared.lock().bar0_writes, [0x1000]);
}
