//! The controller's guest memory, over the client's vfio-user DMA maps.

use vnvme_blockdev::MappedBuf;
use vnvme_controller::{DmaError, GuestMemory, Segment};
use vnvme_vfio_user::{DmaError as MapError, DmaSpace};

/// A client's DMA space as the controller's [`GuestMemory`].
#[derive(Debug, Clone)]
pub struct DmaMemory(pub DmaSpace);

fn convert(e: MapError) -> DmaError {
    match e {
        MapError::Permission { addr, len } => DmaError::Permission { addr, len },
        MapError::Unmapped { addr, len } => DmaError::Unmapped { addr, len },
        // The client shrank the file behind the map: to the guest, the memory
        // is gone (Data Transfer Error), as if unmapped.
        MapError::Broken { addr, len } => DmaError::Unmapped { addr, len },
    }
}

impl GuestMemory for DmaMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), DmaError> {
        self.0.read(addr, buf).map_err(convert)
    }

    fn write(&self, addr: u64, buf: &[u8]) -> Result<(), DmaError> {
        self.0.write(addr, buf).map_err(convert)
    }

    fn zero(&self, addr: u64, len: u64) -> Result<(), DmaError> {
        self.0.zero(addr, len).map_err(convert)
    }

    fn load_u32(&self, addr: u64) -> Result<u32, DmaError> {
        self.0.load_u32(addr).map_err(convert)
    }

    fn store_u32(&self, addr: u64, value: u32) -> Result<(), DmaError> {
        self.0.store_u32(addr, value).map_err(convert)
    }

    fn write_then_store_u32(&self, addr: u64, head: &[u8], last: u32) -> Result<(), DmaError> {
        self.0
            .write_then_store_u32(addr, head, last)
            .map_err(convert)
    }

    /// Held mapped by a [`DmaPin`](vnvme_vfio_user::DmaPin): an unmap waits
    /// for the transfer.
    fn pin(&self, segs: &[Segment], write: bool) -> Option<MappedBuf> {
        let pin = self.0.pin(segs.iter().map(|s| (s.addr, s.len)), write)?;
        Some(MappedBuf::new(Box::new(pin)))
    }

    fn quiesce(&self) {
        self.0.quiesce();
    }
}
