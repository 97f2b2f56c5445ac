//! Guest memory as the device sees it, in the words every layer shares: the
//! controller walks PRPs and SGLs over it, vfio-user's DMA address space
//! implements it, and the `file` backend hands its pinned pieces to the
//! kernel.
//!
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

mod mapped;

pub use mapped::{MappedMemory, Region};
