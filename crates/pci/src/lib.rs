//! A PCI function as state: 4 KiB configuration space stored next to its
//! writable and write-1-to-clear masks, the capability list (power
//! management, MSI-X or MSI, PCI Express), a 64-bit BAR0, and an MSI-X table + PBA
//! model. No I/O and no unsafe: the vfio-user server forwards config region
//! accesses here.
#![forbid(unsafe_code)]

mod config;
mod function;
mod msi;
mod msix;

pub use config::{cap_id, ConfigSpace, CONFIG_SPACE_SIZE};
pub use function::{
    command, msix_ctrl, offset, status, PciConfig, PciError, PciFunction, MSIX_CAP, MSI_CAP,
    PCIE_CAP, PM_CAP,
};
pub use msi::{msi_ctrl, msi_vectors, Interrupts, UnknownInterrupts, MAX_MSI_VECTORS};
pub use msix::{MsixEntry, MsixTable, MSIX_ENTRY_SIZE};
