//! In-process fakes for tests: Vec-backed guest memory and a counting
//! interrupt sink.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::memory::{DmaError, GuestAddress, GuestMemory, InterruptSink};

/// Guest memory `0..size` backed by a vector.
#[derive(Debug)]
pub struct VecMemory {
    data: Mutex<Vec<u8>>,
}

impl VecMemory {
    pub fn new(size: usize) -> Self {
        Self {
            data: Mutex::new(vec![0; size]),
        }
    }

    fn range(
        &self,
        addr: GuestAddress,
        len: u64,
        size: usize,
    ) -> Result<std::ops::Range<usize>, DmaError> {
        let end = addr
            .checked_add(len)
            .ok_or(DmaError::Unmapped { addr, len })?;
        if end.raw() > size as u64 {
            return Err(DmaError::Unmapped { addr, len });
        }
        Ok(addr.raw() as usize..end.raw() as usize)
    }
}

impl GuestMemory for VecMemory {
    fn read(&self, addr: GuestAddress, buf: &mut [u8]) -> Result<(), DmaError> {
        let data = self.data.lock();
        let r = self.range(addr, buf.len() as u64, data.len())?;
        buf.copy_from_slice(&data[r]);
        Ok(())
    }

    fn write(&self, addr: GuestAddress, buf: &[u8]) -> Result<(), DmaError> {
        let mut data = self.data.lock();
        let r = self.range(addr, buf.len() as u64, data.len())?;
        data[r].copy_from_slice(buf);
        Ok(())
    }

    fn zero(&self, addr: GuestAddress, len: u64) -> Result<(), DmaError> {
        let mut data = self.data.lock();
        let r = self.range(addr, len, data.len())?;
        data[r].fill(0);
        Ok(())
    }

    fn load_u32(&self, addr: GuestAddress) -> Result<u32, DmaError> {
        let mut b = [0u8; 4];
        self.read(addr, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn store_u32(&self, addr: GuestAddress, value: u32) -> Result<(), DmaError> {
        self.write(addr, &value.to_le_bytes())
    }
}

/// Counts signals per vector (first 64 vectors).
#[derive(Debug)]
pub struct CountingIrq {
    counts: Vec<AtomicU64>,
    /// Report INTx mode (MSI-X disabled) to the controller.
    pub intx: AtomicBool,
}

impl Default for CountingIrq {
    fn default() -> Self {
        Self {
            counts: (0..64).map(|_| AtomicU64::new(0)).collect(),
            intx: AtomicBool::new(false),
        }
    }
}

impl CountingIrq {
    pub fn count(&self, vector: u16) -> u64 {
        self.counts
            .get(usize::from(vector))
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::SeqCst)).sum()
    }
}

impl InterruptSink for CountingIrq {
    fn signal(&self, vector: u16) {
        if let Some(c) = self.counts.get(usize::from(vector)) {
            c.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn msix_enabled(&self) -> bool {
        !self.intx.load(Ordering::SeqCst)
    }
}
