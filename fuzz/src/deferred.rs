//! A RAM backend with an asynchronous side, for the controller harness: its
//! requests finish on the poll after their submission, newest first, and
//! at most [`LIMIT`] are in flight (the next are given back), so the
//! controller's commands-in-flight path (CQ entry reservations, completions
//! out of order, queues deleted or reset under them) meets hostile input.

use std::sync::Mutex;

use vnvme_blockdev::{
    AsyncBlockDevice, BlockCompletion, BlockDevice, BlockError, BlockQueue, BlockRequest,
    RamDevice, Waker,
};

/// Requests in flight per queue.
const LIMIT: usize = 4;

#[derive(Debug)]
pub struct Deferred {
    ram: std::sync::Arc<RamDevice>,
}

impl Deferred {
    pub fn new(size: u64) -> Self {
        Self {
            ram: std::sync::Arc::new(RamDevice::new(size)),
        }
    }
}

impl BlockDevice for Deferred {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn volatile_cache(&self) -> bool {
        true
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.ram.write(offset, buf)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.ram.write_zeroes(offset, len)
    }
    fn as_async(&self) -> Option<&dyn AsyncBlockDevice> {
        Some(self)
    }
}

impl AsyncBlockDevice for Deferred {
    fn queue(&self, waker: Waker) -> Result<Box<dyn BlockQueue>, BlockError> {
        Ok(Box::new(DeferredQueue {
            ram: self.ram.clone(),
            waker,
            held: Mutex::new(Vec::new()),
        }))
    }
}

struct DeferredQueue {
    ram: std::sync::Arc<RamDevice>,
    waker: Waker,
    held: Mutex<Vec<(u64, BlockRequest)>>,
}

impl BlockQueue for DeferredQueue {
    fn submit(&mut self, request: BlockRequest, token: u64) -> Result<(), BlockRequest> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if held.len() >= LIMIT {
            return Err(request);
        }
        held.push((token, request));
        drop(held);
        (self.waker)();
        Ok(())
    }

    fn poll(&mut self, out: &mut Vec<BlockCompletion>, max: usize) -> usize {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut n = 0;
        while n < max {
            let Some((token, request)) = held.pop() else {
                break;
            };
            out.push(request.run_on(&*self.ram, token));
            n += 1;
        }
        n
    }

    fn in_flight(&self) -> usize {
        self.held.lock().map_or(0, |h| h.len())
    }
}
