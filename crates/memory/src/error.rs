//! The one error of a guest memory access, from the DMA map table up to
//! the controller, which turns it into a Data Transfer Error (or ignores
//! it, for a shadow doorbell): no layer converts it.

use crate::GuestAddress;

/// A guest memory access that cannot be performed. The range is the one
/// the access asked for, its first byte to its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// Part of the range is not mapped (or the access crosses out of a
    /// mapping, or, for a map without an fd, the client did not complete
    /// the DMA_READ/DMA_WRITE).
    #[error("guest address {addr:#x}+{len:#x} is not mapped")]
    Unmapped { addr: GuestAddress, len: u64 },
    /// The range is mapped without the needed read or write permission.
    #[error("guest address {addr:#x}+{len:#x} is mapped without the needed permission")]
    Permission { addr: GuestAddress, len: u64 },
    /// The client shrank the file behind the map: to the guest the memory
    /// is gone, as if unmapped; the map stays broken until it is unmapped.
    #[error(
        "the client shrank the file behind guest address {addr:#x}+{len:#x}: the map is broken"
    )]
    Broken { addr: GuestAddress, len: u64 },
}
