//! Hostile guests against the NVMe device over a real vfio-user connection
//! (`vnvme serve`'s server loop on a Unix socket). Each case asserts the
//! NVMe status (or the ignored-and-counted outcome) the spec asks for, and
//! then that the server still serves: the next command on the same
//! connection, and a new client after this one has gone.
//!
//! Structural immunity to QEMU's CVE-2021-3929 (DMA into the device's own
//! registers): the controller reaches guest memory only through the DMA map
//! table (`DmaSpace`), so a PRP or queue base that names BAR0 or the MSI-X
//! table, wherever the guest put them, is just an unmapped address.
//! CVE-2021-3947 (stack overflow from the changed namespace list): the list is
//! a bounded set (1024 entries, then the all-ones overflow marker), built
//! without recursion; see the controller's
//! `changed_namespace_list_overflows_to_all_ones` test and, here, reads of it
//! at hostile offsets.

mod admin;
mod client;
mod dma;
mod guest;
mod queues;
