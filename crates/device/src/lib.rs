//! The NVMe PCI function served over vfio-user: PCI config space with its
//! capabilities, BAR0 as [`Bar0Layout`](vnvme_spec::regs::Bar0Layout) lays it
//! out (controller registers and doorbells, then the MSI-X table and PBA),
//! interrupts as eventfds, and guest memory as the client's DMA maps.
//!
//! [`NvmeDevice`] is built from plain values ([`DeviceConfig`]: a controller
//! configuration and opened namespaces); command lines and files are the
//! binary's business. [`InProcessServer`] serves one on a socketpair, so any
//! crate's tests can stand up a real controller behind a real vfio-user
//! connection.
#![forbid(unsafe_code)]

mod config;
mod device;
mod inproc;
mod interrupts;

pub use config::{DeviceConfig, DeviceError, CLASS_CODE_NVME, DEFAULT_DEVICE_ID, MAX_MSIX_VECTORS};
pub use device::{FunctionState, NvmeDevice};
pub use inproc::{InProcessServer, ServeError};
pub use interrupts::{EventfdInterrupts, IrqFds};
pub use vnvme_pci::{Interrupts, UnknownInterrupts};
