//! [`DeviceAccess`] over a vfio-user connection: BAR0 through REGION_READ /
//! REGION_WRITE or, where the device offers sparse mmap areas, through a
//! mapping; DMA memory as memfds handed over with DMA_MAP; MSI-X vectors as
//! eventfds given with SET_IRQS.

use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use vnvme_vfio_user::{irq, region, Client};

use crate::access::{
    AccessError, BoxError, DeviceAccess, DmaBuffer, DmaMapper, DmaPool, DmaRegion, Interrupt,
    MappedArea,
};

/// PCI config space offsets used to turn MSI-X on (PCI Local Bus 3.0 §6.2, §6.8.2).
mod pci {
    pub const COMMAND: u64 = 0x04;
    pub const STATUS: u64 = 0x06;
    pub const CAPABILITIES_POINTER: u64 = 0x34;
    /// Status: the function has a capability list.
    pub const STATUS_CAP_LIST: u16 = 1 << 4;
    pub const COMMAND_MEMORY: u16 = 1 << 1;
    pub const COMMAND_BUS_MASTER: u16 = 1 << 2;
    pub const COMMAND_INTX_DISABLE: u16 = 1 << 10;
    pub const CAP_ID_MSIX: u8 = 0x11;
    /// MSI-X Message Control: MSI-X Enable.
    pub const MSIX_ENABLE: u16 = 1 << 15;
    /// MSI-X Message Control: Function Mask.
    pub const MSIX_FUNCTION_MASK: u16 = 1 << 14;
}

#[derive(Debug)]
struct ClientMapper {
    client: Arc<Client>,
    /// Send the region's fd with DMA_UNMAP (see [`VfioUserAccess::unmap_with_fd`]).
    unmap_with_fd: AtomicBool,
    /// DMA_UNMAPs the server refused or that never got an answer: each
    /// leaves a map behind on the server.
    failed_unmaps: AtomicU64,
}

impl DmaMapper for ClientMapper {
    fn map(&self, region: &DmaRegion) -> Result<(), BoxError> {
        self.client
            .dma_map(region.iova(), region.len() as u64, region.fd(), 0, true)
            .map_err(Into::into)
    }

    fn unmap(&self, region: &DmaRegion) {
        let (iova, len) = (region.iova(), region.len() as u64);
        let sent = if self.unmap_with_fd.load(Ordering::Relaxed) {
            self.client.dma_unmap_with_fd(iova, len, region.fd())
        } else {
            self.client.dma_unmap(iova, len)
        };
        if let Err(e) = sent {
            self.failed_unmaps.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, iova, "DMA_UNMAP failed");
        }
    }
}

/// An NVMe device reached over a vfio-user socket.
///
/// Register writes are posted (REGION_WRITE with NO_REPLY, as QEMU does for
/// BARs); a later read on the same socket is ordered after them. After
/// [`map_registers`](DeviceAccess::map_registers) has mapped BAR0's sparse
/// mmap areas, accesses inside them are atomic loads and stores on the
/// mapping, and the writes that still go over the socket wait for their
/// reply, as QEMU does once any region is mapped.
#[derive(Debug)]
pub struct VfioUserAccess {
    client: Arc<Client>,
    mapper: Arc<ClientMapper>,
    pool: DmaPool,
    msix_enabled: Mutex<bool>,
    /// BAR0 areas mapped by `map_registers`; set once, kept until drop, so
    /// the register path reads it without a lock.
    mapped: OnceLock<Vec<MappedArea>>,
}

impl VfioUserAccess {
    /// Connects to a vfio-user server listening at `path`.
    pub fn connect(path: impl AsRef<Path>) -> Result<Self, vnvme_vfio_user::Error> {
        Ok(Self::from_client(Client::connect(path)?))
    }

    /// Uses one end of an already connected socket (e.g. a socketpair with
    /// an in-process server).
    pub fn from_stream(stream: UnixStream) -> Result<Self, vnvme_vfio_user::Error> {
        Ok(Self::from_client(Client::from_stream(stream)?))
    }

    pub fn from_client(client: Client) -> Self {
        let client = Arc::new(client);
        let mapper = Arc::new(ClientMapper {
            client: Arc::clone(&client),
            unmap_with_fd: AtomicBool::new(false),
            failed_unmaps: AtomicU64::new(0),
        });
        let pool = DmaPool::new(mapper.clone(), DmaPool::DEFAULT_CHUNK);
        Self {
            client,
            mapper,
            pool,
            msix_enabled: Mutex::new(false),
            mapped: OnceLock::new(),
        }
    }

    /// Sends each DMA_UNMAP with the fd of the memory it unmaps attached, as
    /// SPDK's NVMe host does, to drive a server the way SPDK does. Off by
    /// default: QEMU sends none, and the fd means nothing to the protocol.
    pub fn unmap_with_fd(self, on: bool) -> Self {
        self.mapper.unmap_with_fd.store(on, Ordering::Relaxed);
        self
    }

    /// DMA_UNMAPs (of DMA memory this access freed) that failed so far;
    /// each left its map on the server.
    pub fn failed_unmaps(&self) -> u64 {
        self.mapper.failed_unmaps.load(Ordering::Relaxed)
    }

    /// The BAR0 areas mapped so far (empty before `map_registers`, or when
    /// the device offers none).
    pub fn mapped_areas(&self) -> &[MappedArea] {
        self.mapped.get().map_or(&[], Vec::as_slice)
    }

    /// Maps every sparse mmap area of BAR0 that the device offers with an
    /// fd. Areas that are malformed or fail to map are skipped with a
    /// warning: the registers there stay reachable over the socket.
    fn map_bar0_areas(&self) -> Result<Vec<MappedArea>, vnvme_vfio_user::Error> {
        let (info, fd) = self.client.region_info(region::BAR0)?;
        let Some(fd) = fd else {
            return Ok(Vec::new());
        };
        // A region flagged mappable without sparse areas would be mappable
        // whole; we map only what is offered area by area, since registers
        // such as CC must keep trapping.
        let mut areas = Vec::new();
        for area in &info.sparse_areas {
            let inside = area
                .offset
                .checked_add(area.size)
                .is_some_and(|end| end <= info.size);
            let mapped = if inside {
                MappedArea::map(fd.as_fd(), area.offset, area.size)
            } else {
                Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "area outside the region",
                ))
            };
            match mapped {
                Ok(m) => areas.push(m),
                Err(e) => tracing::warn!(
                    error = %e,
                    offset = area.offset,
                    size = area.size,
                    "not mapping a BAR0 sparse mmap area"
                ),
            }
        }
        Ok(areas)
    }

    /// The underlying client (config space, region info, reset...).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn config_read16(&self, offset: u64) -> Result<u16, vnvme_vfio_user::Error> {
        let mut b = [0u8; 2];
        self.client.region_read(region::CONFIG, offset, &mut b)?;
        Ok(u16::from_le_bytes(b))
    }

    fn config_write16(&self, offset: u64, value: u16) -> Result<(), vnvme_vfio_user::Error> {
        self.client
            .region_write(region::CONFIG, offset, &value.to_le_bytes())
    }

    /// Offset of the MSI-X capability, walking the capability list (bounded:
    /// a malicious list may loop).
    fn find_msix(&self) -> Result<Option<u64>, vnvme_vfio_user::Error> {
        if self.config_read16(pci::STATUS)? & pci::STATUS_CAP_LIST == 0 {
            return Ok(None);
        }
        let mut ptr = self.config_read16(pci::CAPABILITIES_POINTER)? & 0xFC;
        for _ in 0..48 {
            if ptr < 0x40 {
                return Ok(None);
            }
            let header = self.config_read16(u64::from(ptr))?;
            if header as u8 == pci::CAP_ID_MSIX {
                return Ok(Some(u64::from(ptr)));
            }
            ptr = (header >> 8) & 0xFC;
        }
        Ok(None)
    }

    fn setup_msix(&self, n_vectors: u16) -> Result<Vec<Interrupt>, vnvme_vfio_user::Error> {
        let info = self.client.irq_info(irq::MSIX)?;
        let n = u32::from(n_vectors).min(info.count);
        if n == 0 {
            return Ok(Vec::new());
        }
        let command = self.config_read16(pci::COMMAND)?;
        self.config_write16(
            pci::COMMAND,
            command | pci::COMMAND_MEMORY | pci::COMMAND_BUS_MASTER | pci::COMMAND_INTX_DISABLE,
        )?;
        if let Some(cap) = self.find_msix()? {
            let control = self.config_read16(cap + 2)?;
            self.config_write16(
                cap + 2,
                (control | pci::MSIX_ENABLE) & !pci::MSIX_FUNCTION_MASK,
            )?;
        }
        let irqs = (0..n as u16)
            .map(Interrupt::new)
            .collect::<Result<Vec<_>, _>>()?;
        let fds: Vec<BorrowedFd<'_>> = irqs.iter().map(Interrupt::fd).collect();
        self.client.set_irqs_eventfds(irq::MSIX, 0, &fds)?;
        *self.msix_enabled.lock() = true;
        Ok(irqs)
    }
}

impl DeviceAccess for VfioUserAccess {
    fn read32(&self, offset: u64) -> Result<u32, AccessError> {
        if let Some(v) = self.mapped_areas().iter().find_map(|a| a.load_u32(offset)) {
            return Ok(v);
        }
        let mut b = [0u8; 4];
        self.client
            .region_read(region::BAR0, offset, &mut b)
            .map_err(|e| AccessError::RegisterRead {
                offset,
                source: e.into(),
            })?;
        Ok(u32::from_le_bytes(b))
    }

    fn write32(&self, offset: u64, value: u32) -> Result<(), AccessError> {
        let areas = self.mapped_areas();
        if areas.iter().any(|a| a.store_u32(offset, value)) {
            return Ok(());
        }
        let bytes = value.to_le_bytes();
        // With a mapping in place, a posted socket write could be overtaken
        // by later stores to the mapping that the device sees at once (QEMU
        // stops posting for the same reason): wait for the reply.
        let sent = if areas.is_empty() {
            self.client
                .region_write_posted(region::BAR0, offset, &bytes)
        } else {
            self.client.region_write(region::BAR0, offset, &bytes)
        };
        sent.map_err(|e| AccessError::RegisterWrite {
            offset,
            source: e.into(),
        })
    }

    fn map_registers(&self) -> Result<bool, AccessError> {
        if self.mapped.get().is_none() {
            let areas = self
                .map_bar0_areas()
                .map_err(|e| AccessError::MapRegisters(e.into()))?;
            // A concurrent caller may have won: its areas stay, ours unmap.
            let _ = self.mapped.set(areas);
        }
        Ok(!self.mapped_areas().is_empty())
    }

    fn is_mapped(&self, offset: u64) -> bool {
        self.mapped_areas().iter().any(|a| a.contains(offset))
    }

    fn dma_alloc(&self, size: usize) -> Result<DmaBuffer, AccessError> {
        self.pool.alloc(size)
    }

    fn enable_interrupts(&self, n_vectors: u16) -> Result<Vec<Interrupt>, AccessError> {
        self.setup_msix(n_vectors)
            .map_err(|e| AccessError::Interrupts(e.into()))
    }

    fn disable_interrupts(&self) -> Result<(), AccessError> {
        let mut enabled = self.msix_enabled.lock();
        if *enabled {
            self.client
                .disable_irqs(irq::MSIX)
                .map_err(|e| AccessError::Interrupts(e.into()))?;
            *enabled = false;
        }
        Ok(())
    }
}
