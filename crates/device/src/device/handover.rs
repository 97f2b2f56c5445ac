//! A live upgrade's part of the PCI function: what the next process needs
//! beside the controller's saved state (docs/state-format.md) to go on
//! serving the same client, and the function built again from it.
//!
//! The client keeps its view of the function: config space (BARs, the
//! command register, MSI-X enable), the MSI-X table, the interrupt eventfds
//! it gave with SET_IRQS, and, with the doorbell page offered, the memfd it
//! has mapped. The eventfds and the memfd are fds: the caller passes them,
//! this module only says which is which.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use vnvme_controller::{Controller, SavedState};
use vnvme_pci::CONFIG_SPACE_SIZE;
use vnvme_spec::regs::Bar0Layout;
use vnvme_vfio_user::{DmaSpace, SharedRegion};

use super::NvmeDevice;
use crate::config::{DeviceConfig, DeviceError};
use crate::interrupts::IrqFds;

/// The function's own values a live upgrade carries (no fds).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FunctionState {
    /// PCI config space, as the guest left it.
    pub config: Vec<u8>,
    /// The MSI-X table's dwords (address low, high, data, vector control
    /// per entry).
    pub msix_table: Vec<u32>,
    /// The INTx unmask came with a resample eventfd (no automask).
    pub intx_no_automask: bool,
}

impl NvmeDevice {
    /// Config space, the MSI-X table and the INTx mode, for the next
    /// process.
    pub fn function_state(&self) -> FunctionState {
        let mut table = vec![0u8; self.msix.table_size() as usize];
        for (i, dword) in table.chunks_mut(4).enumerate() {
            self.msix.table_read(4 * i as u64, dword);
        }
        FunctionState {
            config: self.pci.config_space().bytes().to_vec(),
            msix_table: table
                .chunks(4)
                .map(|d| u32::from_le_bytes([d[0], d[1], d[2], d[3]]))
                .collect(),
            intx_no_automask: self.irqs.no_automask(),
        }
    }

    /// Copies of the interrupt eventfds, to pass to the next process.
    pub fn irq_fds(&self) -> std::io::Result<IrqFds> {
        self.irqs.export()
    }

    /// BAR0's shared region (the doorbell page the client may have mapped),
    /// if the doorbell mode offers it.
    pub fn doorbell_fd(&self) -> Option<BorrowedFd<'_>> {
        self.doorbell_region.as_ref().map(|r| r.fd())
    }

    /// A new function for another controller of `config.subsystem_of`'s
    /// subsystem, attached to the namespaces the subsystem's table says
    /// (none copied from the first controller): a live upgrade's
    /// controller whose client had not connected, in a subsystem
    /// restored from a state that carried every controller's attachment.
    pub fn joining_as_saved(config: DeviceConfig) -> Result<Self, DeviceError> {
        let Some(first) = config.subsystem_of.clone() else {
            return Err(DeviceError::Handover(
                "a controller joining a restored subsystem needs its first controller".into(),
            ));
        };
        Self::build(config, None, move |c, _ns, page, groups| {
            Controller::joining_as_saved(&first, c, page, groups).map_err(DeviceError::Controller)
        })
    }

    /// The function `config` describes, serving the client a previous
    /// process served: its config space and MSI-X table from `function`,
    /// its interrupt eventfds, the shared doorbell region it mapped (an fd
    /// of the previous process's [`doorbell_fd`](Self::doorbell_fd), needed
    /// exactly when the doorbell mode offers the page), its guest memory
    /// `dma`, and the controller restored from `state` (running again if it
    /// ran; with `config.subsystem_of`, joining that controller's
    /// subsystem, see `Controller::restore_joining`). A state that does
    /// not fit `config` is refused with why.
    pub fn restored(
        config: DeviceConfig,
        function: &FunctionState,
        irqs: IrqFds,
        doorbells: Option<OwnedFd>,
        state: &SavedState,
        dma: DmaSpace,
    ) -> Result<Self, DeviceError> {
        let offers = config.controller.doorbells.offers_page();
        let region = match (offers, doorbells) {
            (true, Some(fd)) => Some(Arc::new(
                SharedRegion::map(fd.as_fd(), 0, Bar0Layout::DOORBELLS.end)
                    .map_err(DeviceError::DoorbellPage)?,
            )),
            (false, None) => None,
            (true, None) => {
                return Err(DeviceError::Handover(
                    "the doorbell mode offers the doorbell page, and no page was handed over"
                        .into(),
                ))
            }
            (false, Some(_)) => {
                return Err(DeviceError::Handover(
                    "a doorbell page was handed over to a doorbell mode that offers none".into(),
                ))
            }
        };
        if function.config.len() != CONFIG_SPACE_SIZE {
            return Err(DeviceError::Handover(format!(
                "the config space handed over is {} bytes, not {CONFIG_SPACE_SIZE}",
                function.config.len()
            )));
        }
        // Interrupts before the controller: a restored running controller
        // signals every CQ holding entries at once.
        let sink = Arc::new(crate::EventfdInterrupts::default());
        sink.import(irqs, function.intx_no_automask);
        let mem = Arc::new(dma);
        let irq = Arc::clone(&sink);
        // Another controller of a subsystem joins the first, restored
        // already with the subsystem's shared parts.
        let first = config.subsystem_of.clone();
        let mut dev = Self::build(config, region, move |c, ns, page, groups| {
            match &first {
                Some(first) => Controller::restore_joining(first, c, page, groups, state, mem, irq),
                None => Controller::restore_with_poll_groups(c, ns, page, groups, state, mem, irq),
            }
            .map_err(DeviceError::Restore)
        })?;
        let table_dwords = dev.msix.table_size() / 4;
        if function.msix_table.len() as u64 != table_dwords {
            return Err(DeviceError::Handover(format!(
                "the MSI-X table handed over has {} dwords, this function's {table_dwords}",
                function.msix_table.len()
            )));
        }
        for (i, dword) in function.msix_table.iter().enumerate() {
            dev.msix.table_write(4 * i as u64, &dword.to_le_bytes());
        }
        dev.pci.restore_config(&function.config);
        dev.irqs = sink;
        Ok(dev)
    }
}
