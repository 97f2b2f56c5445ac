//! The NVMe controller. Knows nothing of sockets: it sees guest memory through
//! [`GuestMemory`] and raises interrupts through [`InterruptSink`].
//!
//! * [`Controller`] — BAR0 registers and doorbells, enable/reset, workers.
//!
//! The modules are layered (docs/architecture.md, "Inside the controller";
//! the test `tests/layers.rs` keeps it true): `worker` (queue workers and
//! their wake policies) over `admin` and `io` (command handlers) over
//! `command` (what a handler has at hand) over `inflight` (the one path of
//! reads, writes and flushes) over `state` over `interrupts` (whether a
//! CQE gets an interrupt) over `queue` (SQ/CQ rings) over
//! `doorbell` (every doorbell value and its source: register, shadow buffer,
//! mapped page) over `subsystem` (with the firmware slots) and `background`
//! (sanitize and self-test) over `namespace` (with its reservations) over
//! `reporting` (Persistent Event Log, telemetry) over `config` and `regs`
//! over [`vendor`] (vendor specific opcodes C0h-FFh) and [`prp`] over the
//! leaves ([`memory`], [`stats`], `backend_error`, `irq_batch`,
//! `keep_alive`, `streams`, `lifecycle` (CC, RDY, CFS, the Timestamp
//! clock), `protection`, `zoned`, `faults`, `qos` (IOPS and bandwidth limits)).
#![forbid(unsafe_code)]

mod admin;
mod backend_error;
mod background;
mod command;
mod config;
mod controller;
pub mod crash_record;
mod doorbell;
pub mod faults;
mod features;
mod inflight;
mod interrupts;
mod io;
mod io_request;
mod irq_batch;
mod keep_alive;
mod lifecycle;
pub mod memory;
mod namespace;
mod protection;
pub mod prp;
pub mod qos;
mod queue;
mod regs;
mod reporting;
mod saved_check;
mod saved_state;
mod sgl;
mod state;
pub mod stats;
mod streams;
mod subsystem;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod thread_slot;
pub mod vendor;
mod worker;
mod zoned;

#[cfg(test)]
mod tests;

pub use config::{
    format_index_for, ConfigError, ControllerConfig, DoorbellMode, LbaFormatSpec, NamespaceConfig,
    NamespaceIds, Readiness, UnknownDoorbellMode, DEFAULT_DOZE, DEFAULT_FORMAT_INDEX,
    DEFAULT_IDLE_POLL, DEFAULT_READY_TIMEOUT, DEFAULT_SANITIZE_RATE, DEFAULT_SELF_TEST_RATE,
    DEFAULT_VENDOR_ID, LBA_FORMATS, MAX_NAMESPACES,
};
pub use controller::{AnaError, Controller, NamespaceOpError};
pub use doorbell::{DoorbellPage, HeapDoorbellPage, DOORBELL_PAGE_DWORDS};
pub use faults::{AnaFault, Fault, FaultError, FaultKind, FaultSpec, Latency};
pub use memory::{DmaError, GuestAddress, GuestMemory, InterruptSink, Segment};
pub use protection::{Guard, PiType, Protection};
pub use qos::{
    QosError, QosGroup, QosLimits, QosRate, QosReport, QosTarget, TargetReport, ThrottleReport,
};
pub use saved_check::InvalidState;
pub use saved_state::{
    HandedCommand, Hold, Positions, SavedState, StateError, FORMAT_VERSION, HEADER_LEN, MAGIC,
    OLDEST_READABLE_VERSION,
};
pub use stats::{ControllerStats, QueueStats};
pub use subsystem::ana::AnaState;
pub use vendor::{VendorCommand, VendorCommands};
pub use vnvme_blockdev::BlockDevice;
pub use worker::group::{GroupCounts, PollGroupError, PollGroups, MAX_POLL_GROUPS};
pub use zoned::{ZoneChange, ZoneOpError, ZonedConfig, ZonedError, MAX_RECORDED_ZCAP, MAX_ZONES};
