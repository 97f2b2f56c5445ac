//! A device for unit tests that records register writes and does nothing
//! else: reads are 0, DMA memory is real but mapped nowhere, no interrupts.

use parking_lot::Mutex;

use crate::access::{AccessError, DeviceAccess, DmaBuffer, DmaPool, Interrupt, NoMapper};

#[derive(Debug)]
pub(crate) struct Recorder {
    pool: DmaPool,
    /// (BAR0 offset, value) of every register write, in order.
    pub(crate) writes: Mutex<Vec<(u64, u32)>>,
}

impl Recorder {
    pub(crate) fn new() -> Self {
        Self {
            pool: DmaPool::new(std::sync::Arc::new(NoMapper), DmaPool::DEFAULT_CHUNK),
            writes: Mutex::new(Vec::new()),
        }
    }
}

impl DeviceAccess for Recorder {
    fn read32(&self, _: u64) -> Result<u32, AccessError> {
        Ok(0)
    }
    fn write32(&self, offset: u64, value: u32) -> Result<(), AccessError> {
        self.writes.lock().push((offset, value));
        Ok(())
    }
    fn dma_alloc(&self, size: usize) -> Result<DmaBuffer, AccessError> {
        self.pool.alloc(size)
    }
    fn enable_interrupts(&self, _: u16) -> Result<Vec<Interrupt>, AccessError> {
        Ok(Vec::new())
    }
}
