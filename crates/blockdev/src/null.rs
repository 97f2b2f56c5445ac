//! The `null` backend: reads return zeroes, writes are dropped; a
//! controller moves no data for it at all ([`BlockDevice::moves_no_data`]).

use crate::{check_range, BlockDevice, BlockError};

/// A device of a given size that stores nothing (a benchmark baseline).
#[derive(Debug, Clone)]
pub struct NullDevice {
    size: u64,
}

impl NullDevice {
    pub fn new(size: u64) -> Self {
        Self { size }
    }
}

impl BlockDevice for NullDevice {
    fn size(&self) -> u64 {
        self.size
    }

    fn moves_no_data(&self) -> bool {
        true
    }

    fn resized(&self, size: u64) -> Option<std::sync::Arc<dyn BlockDevice>> {
        Some(std::sync::Arc::new(Self::new(size)))
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size)?;
        buf.fill(0);
        Ok(())
    }

    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        check_range(offset, buf.len() as u64, self.size)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        check_range(offset, len, self.size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_reads_zeroes_after_write() {
        let dev = NullDevice::new(8192);
        dev.write(0, &[0xAA; 512]).unwrap();
        let mut buf = [0xFFu8; 512];
        dev.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }

    #[test]
    fn null_rejects_out_of_range() {
        let dev = NullDevice::new(4096);
        assert!(dev.read(4096, &mut [0u8; 1]).is_err());
        assert!(dev.write(u64::MAX, &[0u8; 2]).is_err());
    }
}
