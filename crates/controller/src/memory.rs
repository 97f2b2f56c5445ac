//! The controller's view of the outside world: guest memory and interrupts.
//! Guest memory is `vnvme-memory`'s one trait, which vfio-user's DMA space
//! implements (and `testing::VecMemory` in tests): the controller
//! calls it directly, and its errors reach the controller unconverted.
//! Interrupts go to eventfds in `vnvme-device`, and to a counting fake in
//! tests.

pub use vnvme_memory::{DmaError, GuestAddress, GuestMemory, Segment};

/// Where the controller's interrupts go: MSI-X vectors (eventfds given by
/// SET_IRQS) or, when MSI-X is disabled, the INTx pin.
pub trait InterruptSink: Send + Sync {
    /// Signals MSI-X vector `vector`, or asserts INTx if MSI-X is not enabled.
    fn signal(&self, vector: u16);
    /// Deasserts INTx (level triggered; no-op for MSI-X).
    fn deassert_intx(&self) {}
    /// Whether MSI-X is enabled. When it is not, INTMS/INTMC mask the
    /// (INTx or MSI) interrupt and the controller holds it while masked.
    fn msix_enabled(&self) -> bool {
        true
    }
}
