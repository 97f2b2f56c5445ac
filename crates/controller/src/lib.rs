//! The NVMe controller. Knows nothing of sockets: it sees guest memory through
//! [`GuestMemory`] and raises interrupts through [`InterruptSink`].
#![forbid(unsafe_code)]

pub mod memory;

pub use memory::{DmaError, GuestMemory, InterruptSink};
