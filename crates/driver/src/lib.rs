//! A user-space NVMe host driver.
//!
//! The driver talks to a device through [`DeviceAccess`] (BAR0 registers,
//! DMA memory, interrupts); [`VfioUserAccess`] implements it over a
//! vfio-user socket. [`Controller::init`] brings the controller up and
//! creates one [`IoQueue`] per thread; the admin queue sits behind a mutex,
//! the I/O path takes no lock.
//!
//! Doorbells ([`DoorbellKind`], chosen at initialisation from what the device
//! offers and [`InitOptions`]): a mapped doorbell page when the device offers
//! it as sparse mmap (`map_doorbells`); else shadow doorbells with EventIdx
//! when Identify Controller OACS bit 8 is set (`shadow_doorbells`,
//! `shadow_admin`, `need_event`); else one register write per update.
//! [`QueueCounters`] tells traps, mapped stores and shadow updates apart.
//!
//! Initialisation ([`init`]): queue pairs are created once, on MSI-X
//! vectors mapped from what the driver knows (shared when there are fewer
//! vectors than queues, see [`irq`]); [`InitMode::Learning`] reproduces the
//! old create-learn-delete-recreate dance for comparison. Namespaces
//! ([`Controller::namespace_report`]) are ready, not ready yet, or skipped
//! with a reason; [`Controller::poll_events`] and [`Controller::rescan`]
//! pick up namespaces attached or made ready later.
//!
//! Passthrough ([`passthru`]): any admin or I/O command, synchronous
//! ([`Controller::admin_passthru`], [`IoQueue::passthru`]) or asynchronous
//! with tokens and registered buffers ([`AsyncQueue`]).
//!
//! Zoned namespaces ([`zone`]): Report Zones, the zone actions and Zone
//! Append on an [`IoQueue`].
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use vnvme_driver::{Controller, DeviceAccess, InitOptions, VfioUserAccess};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let access = Arc::new(VfioUserAccess::connect("/run/vnvme.sock")?);
//! let ctrl = Controller::init(access.clone(), InitOptions::default())?;
//! let mut q = ctrl.take_io_queue(0)?;
//! let mut buf = access.dma_alloc(4096)?;
//! q.read(1, 0, 8, &mut buf)?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

pub mod access;
pub mod admin;
pub mod controller;
pub mod doorbell;
pub mod error;
#[cfg(test)]
mod fake;
pub mod init;
pub mod io;
pub mod irq;
pub mod namespace;
pub mod passthru;
pub mod pi;
pub mod prp;
pub mod queue;
#[cfg(test)]
mod recorder;
mod vfio_user_access;
pub mod zone;

pub use access::{AccessError, DeviceAccess, DmaBuffer, DmaPool, Interrupt, MappedArea};
pub use controller::{AsyncEvent, Controller, InitOptions};
pub use doorbell::{DoorbellKind, NeedEvent};
pub use error::Error;
pub use init::InitMode;
pub use io::{IoQueue, MetadataPointer};
pub use namespace::{Namespace, NamespaceState, NsState};
pub use passthru::{
    AsyncCompletion, AsyncQueue, BufferSlice, DataDirection, PassthruCompletion, PassthruData,
};
pub use pi::{NsProtection, PiError};
pub use queue::QueueCounters;
pub use vfio_user_access::VfioUserAccess;
