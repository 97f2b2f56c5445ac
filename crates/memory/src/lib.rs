//! Guest memory as the device sees it, in the words every layer shares: the
//! controller walks PRPs and SGLs over it, vfio-user's DMA address space
//! implements it, and the `file` backend hands its pinned pieces to the
//! kernel.
//!
//! * [`GuestAddress`]: an address in guest memory, never a bare `u64`;
//! * [`GuestMemory`]: the one trait for guest memory (copies, the atomic
//!   dwords of shadow doorbells and completion entries, pins), implemented
//!   by vfio-user's `DmaSpace` (the client's DMA maps) and by the
//!   controller's test fakes, and called by the controller directly;
//! * [`DmaError`]: the one error of an access, with its cause (unmapped,
//!   no permission, a broken map), unconverted on its way up;
//! * [`Segment`]: one contiguous piece of a transfer in guest memory;
//! * [`MappedMemory`] and [`Region`]: guest memory held mapped in this
//!   process for the kernel to read or write in place (a pin).
//!
//! The crate sits below all of them (it depends on nothing of ours), so
//! vfio-user need not depend on a storage backend to hand memory to one.
//!
//! # Unsafe code
//!
//! [`MappedMemory`] is an `unsafe trait` (its implementation promises the
//! memory stays mapped); nothing here dereferences an address.
#![deny(unsafe_code)]

mod address;
mod error;
mod guest;
mod mapped;

pub use address::GuestAddress;
pub use error::DmaError;
pub use guest::{GuestMemory, Segment};
pub use mapped::{MappedMemory, Region};
