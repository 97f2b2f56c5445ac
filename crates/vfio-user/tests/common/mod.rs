//! A small RAM-backed test device and socket helpers.
#![allow(dead_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::Mutex;
use vnvme_vfio_user::*;

pub const BAR0_SIZE: u64 = 0x4000;
pub const CONFIG_SIZE: u64 = 256;
pub const MSIX_VECTORS: u32 = 4;
/// A config write here makes the device DMA the data to `CONFIG_DMA_TARGET`.
pub const CONFIG_DMA_TRIGGER: u64 = 0xf0;
pub const CONFIG_DMA_TARGET: u64 = 0x40_0000;

/// What the test observes of the device from outside the server thread.
#[derive(Debug, Default)]
pub struct Shared {
    pub dma: Mutex<Option<DmaSpace>>,
    pub msix_fds: Mutex<Vec<Option<OwnedFd>>>,
    pub resets: AtomicUsize,
    pub attaches: AtomicUsize,
    pub detaches: AtomicUsize,
    pub unmapping: Mutex<Vec<(u64, u64)>>,
    /// Config writes at `CONFIG_DMA_TRIGGER` that began their DMA.
    pub dma_started: AtomicUsize,
}

#[derive(Debug)]
pub struct RamDevice {
    pub bar0: Vec<u8>,
    pub config: Vec<u8>,
    /// Backs the mmappable doorbell page of BAR0 (second 4 KiB).
    pub bar0_fd: OwnedFd,
    pub shared: Arc<Shared>,
}

impl RamDevice {
    pub fn new() -> (Self, Arc<Shared>) {
        let fd = rustix::fs::memfd_create("bar0", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, BAR0_SIZE).unwrap();
        let shared = Arc::new(Shared::default());
        shared
            .msix_fds
            .lock()
            .resize_with(MSIX_VECTORS as usize, || None);
        let dev = Self {
            bar0: vec![0; BAR0_SIZE as usize],
            config: vec![0; CONFIG_SIZE as usize],
            bar0_fd: fd,
            shared: shared.clone(),
        };
        (dev, shared)
    }
}

impl Device for RamDevice {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
            num_regions: region::COUNT,
            num_irqs: irq::COUNT,
        }
    }

    fn region_info(&self, index: u32) -> Option<(RegionInfo, Option<BorrowedFd<'_>>)> {
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        match index {
            region::BAR0 => Some((
                RegionInfo {
                    flags: rw,
                    size: BAR0_SIZE,
                    sparse_areas: vec![SparseArea {
                        offset: 0x1000,
                        size: 0x1000,
                    }],
                },
                Some(self.bar0_fd.as_fd()),
            )),
            region::CONFIG => Some((
                RegionInfo {
                    flags: rw,
                    size: CONFIG_SIZE,
                    sparse_areas: vec![],
                },
                None,
            )),
            i if i < region::COUNT => Some((RegionInfo::default(), None)),
            _ => None,
        }
    }

    fn irq_info(&self, index: u32) -> Option<IrqInfo> {
        match index {
            irq::MSIX => Some(IrqInfo {
                flags: VFIO_IRQ_INFO_EVENTFD | VFIO_IRQ_INFO_NORESIZE,
                count: MSIX_VECTORS,
            }),
            i if i < irq::COUNT => Some(IrqInfo {
                flags: VFIO_IRQ_INFO_EVENTFD,
                count: 1,
            }),
            _ => None,
        }
    }

    fn region_read(&mut self, index: u32, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let mem = match index {
            region::BAR0 => &self.bar0,
            region::CONFIG => &self.config,
            _ => return Err(libc::EINVAL),
        };
        let o = offset as usize;
        buf.copy_from_slice(mem.get(o..o + buf.len()).ok_or(libc::EINVAL)?);
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        if index == region::CONFIG && offset == CONFIG_DMA_TRIGGER {
            // DMA from the control thread, while the client waits for this reply.
            let dma = self.shared.dma.lock().clone().ok_or(libc::EIO)?;
            self.shared.dma_started.fetch_add(1, Ordering::SeqCst);
            // The tests check the client sees the failure, as EIO.
            return dma
                .write(GuestAddress(CONFIG_DMA_TARGET), data)
                .map_err(|_| libc::EIO);
        }
        let mem = match index {
            region::BAR0 => &mut self.bar0,
            region::CONFIG => &mut self.config,
            _ => return Err(libc::EINVAL),
        };
        let o = offset as usize;
        mem.get_mut(o..o + data.len())
            .ok_or(libc::EINVAL)?
            .copy_from_slice(data);
        Ok(())
    }

    fn set_irqs(
        &mut self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<OwnedFd>,
    ) -> Result<(), Errno> {
        if index != irq::MSIX {
            return Ok(());
        }
        let mut slots = self.shared.msix_fds.lock();
        if flags & VFIO_IRQ_SET_DATA_NONE != 0 && count == 0 {
            slots.iter_mut().for_each(|s| *s = None);
            return Ok(());
        }
        if flags & VFIO_IRQ_SET_DATA_EVENTFD != 0 {
            let mut fds = fds.into_iter();
            for v in start..start + count {
                slots[v as usize] = fds.next();
            }
        }
        Ok(())
    }

    fn attach(&mut self, dma: DmaSpace) {
        self.shared.attaches.fetch_add(1, Ordering::SeqCst);
        *self.shared.dma.lock() = Some(dma);
    }

    fn detach(&mut self) {
        self.shared.detaches.fetch_add(1, Ordering::SeqCst);
        *self.shared.dma.lock() = None;
        self.shared
            .msix_fds
            .lock()
            .iter_mut()
            .for_each(|s| *s = None);
    }

    fn reset(&mut self) {
        self.shared.resets.fetch_add(1, Ordering::SeqCst);
    }

    fn dma_unmapping(&mut self, iova: u64, size: u64) {
        self.shared.unmapping.lock().push((iova, size));
    }

    /// The DMA trigger waits for the client's DMA reply.
    fn write_may_wait(&self, index: u32, offset: u64) -> bool {
        index == region::CONFIG && offset == CONFIG_DMA_TRIGGER
    }
}

/// A server serving one socketpair end on a thread, and the client end.
pub fn pair() -> (Client, Arc<Shared>, JoinHandle<Result<(), Error>>) {
    let (a, b) = UnixStream::pair().unwrap();
    let (dev, shared) = RamDevice::new();
    let h = std::thread::spawn(move || Server::new(dev).serve_stream(a));
    let client = Client::from_stream(b).unwrap();
    (client, shared, h)
}

pub fn dma(shared: &Shared) -> DmaSpace {
    shared.dma.lock().clone().expect("device attached")
}

/// A server on a listening socket, stopped and joined on drop.
pub struct ListeningServer {
    pub path: PathBuf,
    pub shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<(), Error>>>,
}

impl ListeningServer {
    pub fn start(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!(
            "vnvme-vfio-user-{}-{name}.sock",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let (dev, shared) = RamDevice::new();
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::spawn(move || Server::new(dev).serve_listener(&listener, &stop2));
        Self {
            path,
            shared,
            stop,
            thread: Some(thread),
        }
    }

    pub fn raw(&self) -> UnixStream {
        UnixStream::connect(&self.path).unwrap()
    }

    /// A fresh client works: the server accepted a new connection.
    pub fn assert_serves_new_client(&self) {
        let c = Client::connect(&self.path).unwrap();
        assert_eq!(c.device_info().unwrap().num_irqs, irq::COUNT);
    }
}

impl Drop for ListeningServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let r = t.join();
            if !std::thread::panicking() {
                r.unwrap().unwrap();
            }
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
