//! The NVMe PCI function served over vfio-user: PCI config space (region 7),
//! BAR0 (region 0: controller registers and doorbells, then the MSI-X table
//! and PBA), and interrupts as eventfds.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use clap::Args;
use vnvme_controller::{
    Controller, ControllerConfig, DoorbellMode, DoorbellPage, DEFAULT_DOZE, DEFAULT_IDLE_POLL,
    DEFAULT_READY_TIMEOUT,
};
use vnvme_pci::{MsixTable, PciConfig, PciFunction, CONFIG_SPACE_SIZE};
use vnvme_vfio_user::{
    irq, region, DeviceInfo, DmaSpace, Errno, IrqInfo, RegionInfo, SharedRegion, SparseArea,
    VFIO_DEVICE_FLAGS_PCI, VFIO_DEVICE_FLAGS_RESET, VFIO_IRQ_INFO_AUTOMASKED,
    VFIO_IRQ_INFO_EVENTFD, VFIO_IRQ_INFO_MASKABLE, VFIO_IRQ_INFO_NORESIZE,
    VFIO_IRQ_SET_ACTION_MASK, VFIO_IRQ_SET_ACTION_TRIGGER, VFIO_IRQ_SET_ACTION_UNMASK,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_IRQ_SET_DATA_NONE, VFIO_REGION_INFO_FLAG_READ,
    VFIO_REGION_INFO_FLAG_WRITE,
};

use crate::interrupts::EventfdInterrupts;
use crate::memory::DmaMemory;
use crate::namespace::NamespaceSpec;

/// BAR0 layout: registers and doorbells belong to the controller, then the
/// MSI-X table and PBA (one page each).
const MSIX_TABLE: u64 = 0x2000;
const MSIX_PBA: u64 = 0x3000;
/// BAR0's doorbell page, offered for mmap in mmap-poll mode.
const DOORBELLS: u64 = 0x1000;
const DOORBELLS_SIZE: u64 = 0x1000;
/// The MSI-X table has one page: 256 vectors of 16 bytes.
const MAX_VECTORS: u16 = 256;

/// Controller options shared by `vnvme serve` and `vnvme bench`.
#[derive(Args, Debug, Clone)]
pub struct DeviceOptions {
    /// Serial number reported by Identify Controller.
    #[arg(long, default_value = "VNVME0001")]
    pub serial: String,
    /// I/O queue pairs the controller grants at most.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..=255))]
    pub max_io_queues: u16,
    /// MSI-X vectors (default: one per I/O queue plus the admin queue); fewer than queues means vectors are shared.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub msix_vectors: Option<u16>,
    /// Queue worker threads in the controller.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub workers: u64,
    /// How guest doorbell writes reach the controller: trap (every write is
    /// a vfio-user message), shadow (Doorbell Buffer Config, QEMU's
    /// algorithm), adaptive (shadow doorbells polled while busy, armed when
    /// idle) or mmap-poll (the doorbell page is shared memory the workers poll).
    #[arg(long, value_name = "MODE", default_value_t = DoorbellMode::Adaptive)]
    pub doorbells: DoorbellMode,
    /// Adaptive: microseconds of polling without work before a worker arms
    /// EventIdx and sleeps. Mmap-poll: spin time before backing off.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub idle_poll_us: Option<u64>,
    /// Adaptive: let each worker shrink its poll window (down to 0) when polling
    /// finds nothing or loses the core, and grow it when it pays.
    #[arg(long)]
    pub adaptive_window: bool,
    /// Adaptive: microseconds after the poll window during which a worker
    /// still looks at the shadow doorbells every 25 µs, sleeping in between,
    /// before it arms EventIdx (0: arm at once). Default 1000.
    #[arg(long, value_name = "US", value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub doze_us: Option<u64>,
    /// Model number reported by Identify Controller.
    #[arg(long, default_value = "vnvme")]
    pub model: String,
    /// How long hosts should wait for namespaces to become ready (CRTO,
    /// CAP.TO; raised to cover the slowest `ready=`), and after which a
    /// never-ready namespace answers with DNR set. Default 5s.
    #[arg(long, value_name = "DURATION", value_parser = crate::namespace::parse_duration)]
    pub ready_timeout: Option<std::time::Duration>,
    /// Namespaces the subsystem supports (Identify Controller NN, at most
    /// 1024; default: as many as configured): Namespace Management creates
    /// namespaces with free NSIDs up to it.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub max_namespaces: u32,
    /// Total NVM capacity (TNVMCAP) namespaces are allocated from; what the
    /// configured namespaces leave is where Namespace Management creates
    /// RAM namespaces. Default: no room beyond the configured namespaces.
    #[arg(long, value_name = "SIZE", value_parser = crate::size::parse_size)]
    pub nvm_capacity: Option<u64>,
    /// How long Format NVM keeps a namespace busy (I/O gets Format In
    /// Progress meanwhile). Default 0.
    #[arg(long, value_name = "DURATION", value_parser = crate::namespace::parse_duration)]
    pub format_duration: Option<std::time::Duration>,
}

impl Default for DeviceOptions {
    fn default() -> Self {
        Self {
            serial: "VNVME0001".into(),
            max_io_queues: 64,
            msix_vectors: None,
            workers: 1,
            doorbells: DoorbellMode::default(),
            idle_poll_us: None,
            adaptive_window: false,
            doze_us: None,
            model: "vnvme".into(),
            ready_timeout: None,
            max_namespaces: 0,
            nvm_capacity: None,
            format_duration: None,
        }
    }
}

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
}

/// The doorbell page inside BAR0's shared region.
struct SharedDoorbells(Arc<SharedRegion>);

impl DoorbellPage for SharedDoorbells {
    fn load(&self, index: u32) -> u32 {
        self.0.load_u32(DOORBELLS as usize + index as usize * 4)
    }

    fn store(&self, index: u32, value: u32) {
        if u64::from(index) * 4 < DOORBELLS_SIZE {
            self.0
                .store_u32(DOORBELLS as usize + index as usize * 4, value);
        }
    }
}

impl NvmeDevice {
    pub fn new(opts: &DeviceOptions, namespaces: &[NamespaceSpec]) -> Result<Self> {
        let vectors = opts
            .msix_vectors
            .unwrap_or(opts.max_io_queues.saturating_add(1))
            .min(MAX_VECTORS);
        if namespaces.len() > 1024 {
            bail!(
                "at most 1024 namespaces are supported ({} given)",
                namespaces.len()
            );
        }
        let pci_config = PciConfig {
            bar0_size: Controller::BAR0_SIZE,
            msix_vectors: vectors,
            msix_table: (0, MSIX_TABLE as u32),
            msix_pba: (0, MSIX_PBA as u32),
            ..PciConfig::default()
        };
        let pci = PciFunction::nvme(pci_config.clone()).context("building the PCI function")?;
        let config = ControllerConfig {
            serial: opts.serial.clone(),
            max_io_queues: opts.max_io_queues,
            msix_vectors: vectors,
            workers: usize::try_from(opts.workers).unwrap_or(1),
            vid: pci_config.vendor,
            ssvid: pci_config.subsystem_vendor,
            doorbells: opts.doorbells,
            idle_poll: opts
                .idle_poll_us
                .map_or(DEFAULT_IDLE_POLL, std::time::Duration::from_micros),
            adaptive_window: opts.adaptive_window,
            doze: opts
                .doze_us
                .map_or(DEFAULT_DOZE, std::time::Duration::from_micros),
            model: opts.model.clone(),
            ready_timeout: opts.ready_timeout.unwrap_or(DEFAULT_READY_TIMEOUT),
            max_namespaces: opts.max_namespaces,
            nvm_capacity: opts.nvm_capacity.unwrap_or(0),
            format_duration: opts.format_duration.unwrap_or_default(),
            ..ControllerConfig::default()
        };
        let doorbell_region = match opts.doorbells {
            DoorbellMode::MmapPoll => Some(Arc::new(
                SharedRegion::new("vnvme-bar0", (DOORBELLS + DOORBELLS_SIZE) as usize)
                    .context("creating the shared doorbell page")?,
            )),
            _ => None,
        };
        let page = doorbell_region
            .as_ref()
            .map(|r| Arc::new(SharedDoorbells(r.clone())) as Arc<dyn DoorbellPage>);
        let namespaces = namespaces
            .iter()
            .zip(1u32..)
            .map(|(spec, nsid)| {
                spec.config(nsid)
                    .with_context(|| format!("namespace {nsid}"))
            })
            .collect::<Result<Vec<_>>>()?;
        let ctrl = Controller::with_doorbell_page(config, namespaces, page)
            .context("configuring the NVMe controller")?;
        Ok(Self {
            ctrl: Arc::new(ctrl),
            pci,
            msix: MsixTable::new(vectors),
            irqs: Arc::default(),
            doorbell_region,
        })
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
            // Mmap-poll: the client maps the doorbell page; its guest's
            // doorbell writes land in memory the workers poll.
            let info = RegionInfo {
                flags: rw,
                size: Controller::BAR0_SIZE,
                sparse_areas: vec![SparseArea {
                    offset: DOORBELLS,
                    size: DOORBELLS_SIZE,
                }],
            };
            return Some((info, Some(shared.fd())));
        }
        let info = match index {
            region::BAR0 => RegionInfo {
                flags: rw,
                size: Controller::BAR0_SIZE,
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
                flags: eventfd,
                count: 0,
            },
            irq::MSIX => IrqInfo {
                flags: eventfd | VFIO_IRQ_INFO_NORESIZE,
                count: self.vectors(),
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
            region::BAR0 if offset >= MSIX_PBA => self.msix.pba_read(offset - MSIX_PBA, buf),
            region::BAR0 if offset >= MSIX_TABLE => self.msix.table_read(offset - MSIX_TABLE, buf),
            region::BAR0 => self.ctrl.mmio_read(offset, buf),
            region::CONFIG => self.pci.config_read(offset, buf),
            _ => return Err(libc_einval()),
        }
        Ok(())
    }

    fn region_write(&mut self, index: u32, offset: u64, data: &[u8]) -> Result<(), Errno> {
        match index {
            // The PBA is read-only.
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
        let (first, n) = (start as usize, count as usize);
        match index {
            irq::MSIX => {
                if end > self.vectors() {
                    return Err(libc_einval());
                }
                if eventfds && trigger {
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
            }
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
            irq::MSI => {
                if count != 0 {
                    return Err(libc_einval());
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
        self.ctrl
            .attach(Arc::new(DmaMemory(dma)), Arc::clone(&self.irqs) as _);
    }

    fn detach(&mut self) {
        self.ctrl.detach();
        self.irqs.clear();
        self.pci.reset();
        self.msix.reset();
    }

    fn reset(&mut self) {
        self.ctrl.reset();
        self.pci.reset();
        self.msix.reset();
    }
}

fn libc_einval() -> Errno {
    libc::EINVAL
}

#[cfg(test)]
mod tests {
    use vnvme_vfio_user::Device;

    use super::*;

    fn device(mode: DoorbellMode) -> NvmeDevice {
        let opts = DeviceOptions {
            doorbells: mode,
            ..DeviceOptions::default()
        };
        NvmeDevice::new(&opts, &["1M:null".parse().unwrap()]).unwrap()
    }

    #[test]
    fn mmap_poll_offers_the_doorbell_page_for_mmap() {
        let mut d = device(DoorbellMode::MmapPoll);
        let (info, fd) = d.region_info(region::BAR0).unwrap();
        assert_eq!(
            info.sparse_areas,
            vec![SparseArea {
                offset: 0x1000,
                size: 0x1000
            }]
        );
        assert!(fd.is_some());
        // A guest store into the mapped page is what register reads return.
        d.doorbell_region.as_ref().unwrap().store_u32(0x1008, 5);
        let mut b = [0u8; 4];
        d.region_read(region::BAR0, 0x1008, &mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), 5);
    }

    #[test]
    fn other_modes_offer_no_mmap() {
        for mode in [
            DoorbellMode::Trap,
            DoorbellMode::Shadow,
            DoorbellMode::Adaptive,
        ] {
            let d = device(mode);
            let (info, fd) = d.region_info(region::BAR0).unwrap();
            assert!(info.sparse_areas.is_empty(), "{mode}");
            assert!(fd.is_none(), "{mode}");
        }
    }
}
