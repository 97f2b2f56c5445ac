//! The NVMe PCI function served over vfio-user: PCI config space (region 7),
//! BAR0 (region 0: controller registers and doorbells, then the MSI-X table
//! and PBA, as [`Bar0Layout`] places them), and interrupts as eventfds
//! (MSI-X, or MSI when [`DeviceConfig::interrupts`] asks for it, and INTx).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU32;
use std::sync::Arc;

use vnvme_controller::{Controller, DoorbellPage, DEFAULT_VENDOR_ID};
use vnvme_pci::{Interrupts, MsixTable, PciConfig, PciFunction, CONFIG_SPACE_SIZE};
use vnvme_spec::regs::Bar0Layout;
use vnvme_vfio_user::{
    irq, region, DeviceInfo, DmaSpace, Errno, IrqInfo, RegionInfo, SharedRegion, SparseArea,
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_AUTOMASKED,
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE, VFIO_IRQ_INFO_NORESIZE,
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};

use crate::config::{DeviceConfig, DeviceError, CLASS_CODE_NVME, DEFAULT_DEVICE_ID};
use crate::interrupts::EventfdInterrupts;

mod handover;
pub use handover::FunctionState;

/// BAR0 offsets the PCI layer owns.
const MSIX_TABLE: u64 = Bar0Layout::MSIX_TABLE.start;
const MSIX_PBA: u64 = Bar0Layout::MSIX_PBA.start;

/// The vfio-user device: a PCI function whose BAR0 is an NVMe controller.
#[derive(Debug)]
pub struct NvmeDevice {
    ctrl: Arc<Controller>,
    pci: PciFunction,
    msix: MsixTable,
    irqs: Arc<EventfdInterrupts>,
    /// Mmap-poll: BAR0 as a memfd (offset in the fd == offset in BAR0), of
    /// which only the doorbell page is offered for mmap.
    doorbell_region: Option<Arc<SharedRegion>>,
    /// Writes that may change what a successor restores besides the
    /// admin commands: config space, the MSI-X table, BAR0's registers
    /// (not its doorbells), resets. A supervised server compares it
    /// between two messages ([`state_writes`](Self::state_writes)).
    state_writes: u64,
}

/// The doorbell page inside BAR0's shared region; `kept`: a region a
/// previous process handed over (see [`DoorbellPage::kept`]).
struct SharedDoorbells(Arc<SharedRegion>, bool);

impl DoorbellPage for SharedDoorbells {
    fn load(&self, index: u32) -> u32 {
        self.0.load_u32(doorbell_at(index))
    }

    fn store(&self, index: u32, value: u32) {
        let page = Bar0Layout::DOORBELLS;
        if u64::from(index) * 4 < page.end - page.start {
            self.0.store_u32(doorbell_at(index), value);
        }
    }

    fn replace(&self, index: u32, current: u32, new: u32) -> bool {
        let page = Bar0Layout::DOORBELLS;
        u64::from(index) * 4 < page.end - page.start
            && self
                .0
                .compare_exchange_u32(doorbell_at(index), current, new)
    }

    fn kept(&self) -> bool {
        self.1
    }

    fn dword(&self, index: u32) -> Option<&AtomicU32> {
        let page = Bar0Layout::DOORBELLS;
        if u64::from(index) * 4 < page.end - page.start {
            self.0.atomic_u32(doorbell_at(index))
        } else {
            None
        }
    }
}

/// Where doorbell `index` (DSTRD 0) lies in BAR0, hence in the shared
/// region (offset in the memfd == offset in BAR0).
fn doorbell_at(index: u32) -> usize {
    Bar0Layout::DOORBELLS.start as usize + index as usize * 4
}

impl NvmeDevice {
    /// The function `config` describes, its controller configured and
    /// disabled (CC.EN = 0) until a client enables it.
    pub fn new(config: DeviceConfig) -> Result<Self, DeviceError> {
        let first = config.subsystem_of.clone();
        Self::build(config, None, move |controller, namespaces, page, groups| {
            match &first {
                Some(first) => Controller::joining(first, controller, page, groups),
                None => Controller::with_poll_groups(controller, namespaces, page, groups),
            }
            .map_err(DeviceError::Controller)
        })
    }

    /// The function `config` describes, with BAR0's shared doorbell region
    /// `doorbells` if given (a live upgrade's: the client has it mapped)
    /// and its controller made by `make` from its configuration,
    /// namespaces, doorbell page and poll groups.
    pub(crate) fn build(
        config: DeviceConfig,
        doorbells: Option<Arc<SharedRegion>>,
        make: impl FnOnce(
            vnvme_controller::ControllerConfig,
            Vec<vnvme_controller::NamespaceConfig>,
            Option<Arc<dyn DoorbellPage>>,
            Option<vnvme_controller::PollGroups>,
        ) -> Result<Controller, DeviceError>,
    ) -> Result<Self, DeviceError> {
        let vectors = config.vectors()?;
        config.check_namespaces()?;
        // BAR0 as Bar0Layout lays it out: registers and doorbells, then the
        // MSI-X table and PBA.
        let pci_config = PciConfig {
            vendor: DEFAULT_VENDOR_ID,
            device: DEFAULT_DEVICE_ID,
            subsystem_vendor: DEFAULT_VENDOR_ID,
            subsystem: DEFAULT_DEVICE_ID,
            revision: 1,
            class_code: CLASS_CODE_NVME,
            bar0_size: Bar0Layout::SIZE,
            interrupts: config.interrupts,
            msix_vectors: vectors,
            msix_table: (0, MSIX_TABLE as u32),
            msix_pba: (0, MSIX_PBA as u32),
        };
        let pci = PciFunction::new(pci_config.clone()).map_err(DeviceError::Pci)?;
        let controller = vnvme_controller::ControllerConfig {
            msix_vectors: vectors,
            vid: pci_config.vendor,
            ssvid: pci_config.subsystem_vendor,
            ..config.controller
        };
        // A handed-over page holds the host's latest register values,
        // written during the handover too: the restore leaves them. (A
        // queue whose doorbell is shadowed reads the shadow buffer, not the
        // page.)
        let kept = doorbells.is_some();
        let doorbell_region = match (controller.doorbells.offers_page(), doorbells) {
            (false, _) => None,
            (true, Some(region)) => Some(region),
            (true, None) => Some(Arc::new(
                SharedRegion::new("vnvme-bar0", Bar0Layout::DOORBELLS.end as usize)
                    .map_err(DeviceError::DoorbellPage)?,
            )),
        };
        let page = doorbell_region
            .as_ref()
            .map(|r| Arc::new(SharedDoorbells(r.clone(), kept)) as Arc<dyn DoorbellPage>);
        let ctrl = make(controller, config.namespaces, page, config.poll_groups)?;
        Ok(Self {
            ctrl: Arc::new(ctrl),
            pci,
            msix: MsixTable::new(vectors),
            irqs: Arc::default(),
            doorbell_region,
            state_writes: 0,
        })
    }

    /// How many writes so far may have changed the function's or the
    /// registers' state (see the field): a crash record keeps the state
    /// again when it moved.
    pub fn state_writes(&self) -> u64 {
        self.state_writes
    }

    /// The controller, for counters.
    pub fn controller(&self) -> &Arc<Controller> {
        &self.ctrl
    }

    /// Interrupts that had no eventfd to go to.
    pub fn dropped_interrupts(&self) -> u64 {
        self.irqs.dropped()
    }

    /// Interrupts that found their eventfd at its maximum count (signalled
    /// already; a client can preload one).
    pub fn saturated_interrupts(&self) -> u64 {
        self.irqs.saturated()
    }

    fn vectors(&self) -> u32 {
        u32::from(self.pci.msix_vectors())
    }

    /// The vectors behind IRQ index `index` (MSI-X or MSI): all of them for
    /// the kind the function offers, none for the other.
    fn vectors_of(&self, index: u32) -> u32 {
        match (index, self.pci.interrupts()) {
            (irq::MSIX, Interrupts::Msix) | (irq::MSI, Interrupts::Msi) => self.vectors(),
            _ => 0,
        }
    }

    /// SET_IRQS for MSI-X or MSI: eventfds per vector (one table serves
    /// both; the function offers one kind).
    fn set_vectors(
        &self,
        index: u32,
        flags: u32,
        start: u32,
        count: u32,
        fds: Vec<OwnedFd>,
    ) -> Result<(), Errno> {
        let end = start.checked_add(count).ok_or_else(libc_einval)?;
        let have = self.vectors_of(index);
        if have == 0 {
            // The kind the function does not offer: a disable is a no-op.
            return if count == 0 {
                Ok(())
            } else {
                Err(libc_einval())
            };
        }
        if end > have {
            return Err(libc_einval());
        }
        let trigger = flags & VFIO_IRQ_SET_ACTION_TRIGGER != 0;
        let (first, n) = (start as usize, count as usize);
        if flags & VFIO_IRQ_SET_DATA_EVENTFD != 0 && trigger {
            if fds.is_empty() {
                self.irqs.clear_msix(first, n.max(1));
            } else {
                self.irqs.set_msix(first, fds);
            }
        } else if flags & VFIO_IRQ_SET_DATA_NONE != 0 && trigger {
            if count == 0 {
                self.irqs.clear_msix(0, 0);
            } else {
                // A loopback trigger: fire the vectors now.
                for v in start..end {
                    vnvme_controller::InterruptSink::signal(&*self.irqs, v as u16);
                }
            }
        }
        Ok(())
    }

    /// Whether BAR0 holds an MSI-X table and PBA: with MSI that part of
    /// BAR0 is reserved (reads 0, writes ignored).
    fn offers_msix(&self) -> bool {
        self.pci.interrupts() == Interrupts::Msix
    }
}

impl vnvme_vfio_user::Device for NvmeDevice {
    fn device_info(&self) -> DeviceInfo {
        DeviceInfo {
            flags: VFIO_DEVICE_FLAGS_PCI | VFIO_DEVICE_FLAGS_RESET,
            num_regions: region::COUNT,
            num_irqs: irq::COUNT,
        }
    }

    fn region_info(&self, index: u32) -> Option<(RegionInfo, Option<BorrowedFd<'_>>)> {
        let rw = VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE;
        if let (region::BAR0, Some(shared)) = (index, &self.doorbell_region) {
            // Adaptive and mmap-poll: the client may map the doorbell page;
            // its (guest's) doorbell writes then land in memory the workers
            // poll.
            let info = RegionInfo {
                flags: rw,
                size: Bar0Layout::SIZE,
                sparse_areas: vec![SparseArea {
                    offset: Bar0Layout::DOORBELLS.start,
                    size: Bar0Layout::DOORBELLS.end - Bar0Layout::DOORBELLS.start,
                }],
            };
            return Some((info, Some(shared.fd())));
        }
        let info = match index {
            region::BAR0 => RegionInfo {
                flags: rw,
                size: Bar0Layout::SIZE,
                sparse_areas: Vec::new(),
            },
            region::CONFIG => RegionInfo {
                flags: rw,
                size: CONFIG_SPACE_SIZE as u64,
                sparse_areas: Vec::new(),
            },
            i if i < region::COUNT => RegionInfo::default(),
            _ => return None,
        };
        Some((info, None))
    }

    fn irq_info(&self, index: u32) -> Option<IrqInfo> {
        let eventfd = VFIO_IRQ_INFO_EVENTFD;
        Some(match index {
            irq::INTX => IrqInfo {
                flags: eventfd | VFIO_IRQ_INFO_MASKABLE | VFIO_IRQ_INFO_AUTOMASKED,
                count: 1,
            },
            irq::MSI => IrqInfo {
                flags: eventfd | VFIO_IRQ_INFO_NORESIZE,
                count: self.vectors_of(irq::MSI),
            },
            irq::MSIX => IrqInfo {
                flags: eventfd | VFIO_IRQ_INFO_NORESIZE,
                count: self.vectors_of(irq::MSIX),
            },
            irq::ERR | irq::REQ => IrqInfo {
                flags: eventfd,
                count: 1,
            },
            _ => return None,
        })
    }

    fn region_read(&mut self, index: u32, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        match index {
            region::BAR0 if offset >= MSIX_TABLE && !self.offers_msix() => buf.fill(0),
            region::BAR0 if offset >= MSIX_PBA => self.msix.pba_read(offset - MSIX_PBA, buf),
            region::BAR0 if offset >= MSIX_TABLE => self.msix.table_read(offset - MSIX_TABLE, buf),
            region::BAR0 => self.ctrl.mmio_read(offset, buf),
            region::CONFIG => self.pci.config_read(offset, buf),
            _ => return Err(libc_einval()),
        }
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        if index != region::BAR0 || !Bar0Layout::DOORBELLS.contains(&offset) {
            self.state_writes += 1;
        }
        match index {
            // The PBA is read-only; without MSI-X the part is reserved.
            region::BAR0 if offset >= MSIX_TABLE && !self.offers_msix() => {}
            region::BAR0 if offset >= MSIX_PBA => {}
            region::BAR0 if offset >= MSIX_TABLE => {
                self.msix.table_write(offset - MSIX_TABLE, data)
            }
            region::BAR0 => self.ctrl.mmio_write(offset, data),
            region::CONFIG => self.pci.config_write(offset, data),
            _ => return Err(libc_einval()),
        }
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
        let end = start.checked_add(count).ok_or_else(libc_einval)?;
        let eventfds = flags & VFIO_IRQ_SET_DATA_EVENTFD != 0;
        let trigger = flags & VFIO_IRQ_SET_ACTION_TRIGGER != 0;
        match index {
            irq::MSIX | irq::MSI => self.set_vectors(index, flags, start, count, fds)?,
            irq::INTX => {
                if end > 1 {
                    return Err(libc_einval());
                }
                if eventfds && trigger {
                    self.irqs.set_intx(fds.into_iter().next());
                } else if flags & VFIO_IRQ_SET_DATA_NONE != 0 && trigger && count == 0 {
                    self.irqs.set_intx(None);
                } else if flags & VFIO_IRQ_SET_ACTION_UNMASK != 0 {
                    if eventfds {
                        // A resample eventfd (KVM irqfd) we do not watch.
                        self.irqs.intx_without_automask();
                    } else {
                        // The client deasserted the line (at a BAR access
                        // after an interrupt) and unmasks: a level still high
                        // means completions it has not consumed, so assert
                        // it again.
                        let ctrl = &self.ctrl;
                        self.irqs.unmask_intx(|| ctrl.intx_asserted());
                    }
                } else if flags & VFIO_IRQ_SET_ACTION_MASK != 0 {
                    self.irqs.mask_intx();
                }
            }
            // Error and request notifiers: accepted, never signalled.
            irq::ERR | irq::REQ => {
                if end > 1 {
                    return Err(libc_einval());
                }
            }
            _ => return Err(libc_einval()),
        }
        Ok(())
    }

    fn attach(&mut self, dma: DmaSpace) {
        // The DMA space is the controller's guest memory as it is.
        self.ctrl.attach(Arc::new(dma), Arc::clone(&self.irqs) as _);
    }

    fn detach(&mut self) {
        self.ctrl.detach();
        self.irqs.clear();
        self.pci.reset();
        self.msix.reset();
    }

    fn reset(&mut self) {
        self.state_writes += 1;
        self.ctrl.reset();
        self.pci.reset();
        self.msix.reset();
    }

    /// CC (enable, disable, shutdown) and NSSR (subsystem reset) may wait
    /// for the controller's in-flight commands, which may wait on the
    /// client's DMA replies; an 8-byte write at 0x10 covers CC too.
    fn write_may_wait(&self, index: u32, offset: u64) -> bool {
        use vnvme_spec::regs::offset::{CC, NSSR};
        index == region::BAR0 && [CC - 4, CC, NSSR].contains(&offset)
    }
}

fn libc_einval() -> Errno {
    libc::EINVAL
}

#[cfg(test)]
mod tests {
    use vnvme_blockdev::NullDevice;
    use vnvme_controller::{ControllerConfig, DoorbellMode, NamespaceConfig};
    use vnvme_vfio_user::Device;

    use super::*;

    fn device(mode: DoorbellMode) -> NvmeDevice {
        let controller = ControllerConfig {
            doorbells: mode,
            ..ControllerConfig::default()
        };
        let ns = NamespaceConfig::new(1, 4096, Arc::new(NullDevice::new(1 << 20)));
        NvmeDevice::new(DeviceConfig::new(controller, vec![ns])).unwrap()
    }

    #[test]
    fn adaptive_and_mmap_poll_offer_the_doorbell_page_for_mmap() {
        for mode in [DoorbellMode::Adaptive, DoorbellMode::MmapPoll] {
            let mut d = device(mode);
            let (info, fd) = d.region_info(region::BAR0).unwrap();
            assert_eq!(
                info.sparse_areas,
                vec![SparseArea {
                    offset: 0x1000,
                    size: 0x1000
                }],
                "{mode}"
            );
            assert!(fd.is_some(), "{mode}");
            // A guest store into the mapped page is what register reads return.
            d.doorbell_region.as_ref().unwrap().store_u32(0x1008, 5);
            let mut b = [0u8; 4];
            d.region_read(region::BAR0, 0x1008, &mut b).unwrap();
            assert_eq!(u32::from_le_bytes(b), 5, "{mode}");
        }
    }

    #[test]
    fn the_reference_modes_offer_no_mmap() {
        for mode in [DoorbellMode::Trap, DoorbellMode::Shadow] {
            let d = device(mode);
            let (info, fd) = d.region_info(region::BAR0).unwrap();
            assert!(info.sparse_areas.is_empty(), "{mode}");
            assert!(fd.is_none(), "{mode}");
        }
    }

    #[test]
    fn default_vectors_are_one_per_queue_within_the_table_page() {
        let d = device(DoorbellMode::Trap);
        assert_eq!(d.irq_info(irq::MSIX).unwrap().count, 65);
        let controller = ControllerConfig {
            max_io_queues: 400,
            ..ControllerConfig::default()
        };
        let d = NvmeDevice::new(DeviceConfig::new(controller, Vec::new())).unwrap();
        assert_eq!(
            d.irq_info(irq::MSIX).unwrap().count,
            u32::from(crate::MAX_MSIX_VECTORS)
        );
    }

    #[test]
    fn too_many_vectors_names_the_real_limit() {
        let config = DeviceConfig {
            msix_vectors: Some(300),
            ..DeviceConfig::new(ControllerConfig::default(), Vec::new())
        };
        let err = NvmeDevice::new(config).unwrap_err().to_string();
        assert!(err.contains("1..=256"), "{err}");
        assert!(err.contains("got 300"), "{err}");
    }

    #[test]
    fn an_msi_function_signals_msi_eventfds_and_has_no_msix() {
        use std::io::Read;
        let config = DeviceConfig {
            interrupts: Interrupts::Msi,
            ..DeviceConfig::new(ControllerConfig::default(), Vec::new())
        };
        let mut d = NvmeDevice::new(config).unwrap();
        // 65 vectors wished (64 I/O queues + admin): MSI announces 32.
        assert_eq!(d.irq_info(irq::MSI).unwrap().count, 32);
        assert_eq!(d.irq_info(irq::MSIX).unwrap().count, 0);
        let eventfd_trigger = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER;
        let (mut rx, tx) = std::io::pipe().unwrap();
        d.set_irqs(irq::MSI, eventfd_trigger, 0, 1, vec![tx.into()])
            .unwrap();
        vnvme_controller::InterruptSink::signal(&*d.irqs, 0);
        let mut got = [0u8; 8];
        rx.read_exact(&mut got).unwrap();
        assert_eq!(u64::from_ne_bytes(got), 1);
        assert_eq!(
            d.set_irqs(irq::MSI, eventfd_trigger, 32, 1, Vec::new()),
            Err(libc::EINVAL)
        );
        assert_eq!(
            d.set_irqs(irq::MSIX, eventfd_trigger, 0, 1, Vec::new()),
            Err(libc::EINVAL)
        );
        // QEMU disables the kind it does not use: a no-op.
        let none_trigger = VFIO_IRQ_SET_DATA_NONE | VFIO_IRQ_SET_ACTION_TRIGGER;
        assert_eq!(
            d.set_irqs(irq::MSIX, none_trigger, 0, 0, Vec::new()),
            Ok(())
        );
        // Where the MSI-X table would be, BAR0 is reserved.
        d.region_write(region::BAR0, MSIX_TABLE, &[0xff; 4])
            .unwrap();
        let mut b = [0xaau8; 4];
        d.region_read(region::BAR0, MSIX_TABLE, &mut b).unwrap();
        assert_eq!(b, [0; 4]);
    }

    #[test]
    fn identify_and_config_space_report_one_vendor() {
        let mut d = device(DoorbellMode::Trap);
        let mut id = [0u8; 2];
        d.region_read(region::CONFIG, 0, &mut id).unwrap();
        assert_eq!(u16::from_le_bytes(id), vnvme_controller::DEFAULT_VENDOR_ID);
        assert_eq!(
            ControllerConfig::default().vid,
            vnvme_controller::DEFAULT_VENDOR_ID
        );
    }
}
