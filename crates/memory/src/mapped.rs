//! Memory a request reads into or writes from in place: guest memory
//! mapped into this process, which the kernel moves data to and from
//! without a copy through a buffer of ours.
//!
//! Whoever maps the memory promises, by implementing the unsafe trait
//! [`MappedMemory`], that it stays mapped for as long as the value lives;
//! a request keeps the value until the kernel is done with it (see
//! blockdev's `uring`). The memory is shared with another process that may
//! change it at any time, so it is never seen through a Rust reference:
//! the kernel reads and writes it, and copies of it are raw.
// Declaring the unsafe trait is the point of this module.
#![allow(unsafe_code)]

/// A run of bytes of memory mapped in this process: its address and
/// length. Plain numbers, not a pointer: only the kernel and raw copies
/// use them, under [`MappedMemory`]'s promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub addr: usize,
    pub len: usize,
}

/// Memory mapped in this process, held mapped for as long as the value
/// lives (a pin on guest memory).
///
/// # Safety
///
/// An implementation promises, for as long as the value lives:
/// * every region of [`regions`](Self::regions) is mapped in this process
///   and readable, and writable too unless [`writable`](Self::writable) is
///   false; it is not unmapped, nor is anything else mapped in its place
///   (replacing it with anonymous memory of the same size, as the SIGBUS
///   guard of a truncated shared file does, is allowed: the addresses stay
///   valid);
/// * `regions` and `writable` answer the same at every call.
///
/// The kernel writes the memory from other threads while the value lives
/// (io_uring), so an implementation never hands it out as a Rust
/// reference.
pub unsafe trait MappedMemory: Send + std::fmt::Debug {
    /// The memory of one transfer, in order.
    fn regions(&self) -> &[Region];

    /// Whether the kernel may write the memory (a read's destination).
    fn writable(&self) -> bool;

    /// Whether the memory is still the one that was mapped: false once it
    /// was lost (the file behind it shrank), so what a transfer moved
    /// cannot be trusted.
    fn intact(&self) -> bool {
        true
    }
}
