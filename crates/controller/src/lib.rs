//! The NVMe controller. Knows nothing of sockets: it sees guest memory through
//! [`GuestMemory`] and raises interrupts through [`InterruptSink`].
//!
//! * [`Controller`] — BAR0 registers and doorbells, enable/reset, workers.
//!
//! The modules are layered (docs/architecture.md, "Inside the controller"; the test
//! `tests/layers.rs` keeps it true): `worker` (queue workers and their wake
//! policies) over `admin` and `io` (command handlers) over `command` (what a
//! handler has at hand) over `inflight` (the one path of reads, writes and
//! flushes) over `state` over `queue` (SQ/CQ rings) over `doorbell` (every
//! doorbell value and its source: register, shadow buffer, mapped page)
//! over `subsystem`, `sanitize` and `self_test` (the background
//! operations' state) and `namespace` over `persistent_event_log` and
//! `telemetry` over `config` and `regs` over
//! [`vendor`] (vendor specific opcodes C0h-FFh) and [`prp`] over the
//! leaves ([`memory`], [`stats`], `backend_error`, `mailbox`,
//! `uncorrectable`, `keep_alive`, `firmware`, `streams`, `background`,
//! `protection`, `zoned`, `faults`).
#![forbid(unsafe_code)]

mod admin;
mod backend_error;
mod background;
mod command;
mod config;
mod controller;
mod doorbell;
pub mod faults;
mod firmware;
mod inflight;
mod io;
mod io_request;
mod irq_batch;
mod keep_alive;
mod mailbox;
pub mod memory;
mod namespace;
mod persistent_event_log;
mod poll_window;
mod protection;
pub mod prp;
mod queue;
mod regs;
mod reservation;
mod sanitize;
mod self_test;
mod sgl;
mod state;
pub mod stats;
mod streams;
mod subsystem;
mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod timestamp;
mod uncorrectable;
pub mod vendor;
mod worker;
mod zoned;

#[cfg(test)]
mod tests;

pub use config::{
    format_index_for, ConfigError, ControllerConfig, DoorbellMode, LbaFormatSpec, NamespaceConfig,
    Readiness, UnknownDoorbellMode, DEFAULT_DOZE, DEFAULT_FORMAT_INDEX, DEFAULT_IDLE_POLL,
    DEFAULT_READY_TIMEOUT, DEFAULT_SANITIZE_RATE, DEFAULT_SELF_TEST_RATE, LBA_FORMATS,
    MAX_NAMESPACES,
};
pub use controller::{Controller, NamespaceOpError};
pub use doorbell::{DoorbellPage, HeapDoorbellPage, DOORBELL_PAGE_DWORDS};
pub use faults::{Fault, FaultError, FaultKind, FaultSpec, Latency};
pub use memory::{DmaError, GuestMemory, InterruptSink, Segment};
pub use protection::{Guard, PiType, Protection};
pub use stats::{ControllerStats, QueueStats};
pub use vendor::{VendorCommand, VendorCommands};
pub use vnvme_blockdev::BlockDevice;
pub use zoned::{ZoneChange, ZoneOpError, ZonedConfig, ZonedError, MAX_ZONES};
