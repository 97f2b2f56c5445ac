//! A backend that fails every operation: each command completes with the
//! status its operation's failure calls for, and the failure is counted,
//! whether the backend is synchronous or asynchronous (both finish through
//! the same completion function).

use parking_lot::Mutex;
use vnvme_blockdev::{
    AsyncBlockDevice, BlockCompletion, BlockError, BlockQueue, BlockRequest, Waker,
};

use super::*;

/// Fails with EIO; `asynchronous`: through a queue, as the file backend.
#[derive(Debug)]
struct Failing {
    asynchronous: bool,
}

fn eio() -> BlockError {
    BlockError::Io(std::io::Error::from_raw_os_error(5))
}

impl BlockDevice for Failing {
    fn size(&self) -> u64 {
        NS_BLOCKS * 512
    }
    fn read(&self, _offset: u64, _buf: &mut [u8]) -> Result<(), BlockError> {
        Err(eio())
    }
    fn write(&self, _offset: u64, _buf: &[u8]) -> Result<(), BlockError> {
        Err(eio())
    }
    fn volatile_cache(&self) -> bool {
        true
    }
    fn flush(&self) -> Result<(), BlockError> {
        Err(eio())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64) -> Result<(), BlockError> {
        Err(eio())
    }
    fn as_async(&self) -> Option<&dyn AsyncBlockDevice> {
        self.asynchronous.then_some(self as &dyn AsyncBlockDevice)
    }
}

impl AsyncBlockDevice for Failing {
    fn queue(&self, waker: Waker) -> Result<Box<dyn BlockQueue>, BlockError> {
        Ok(Box::new(FailingQueue {
            waker,
            done: Mutex::default(),
        }))
    }
}

/// Completes each request (with its failure) as soon as it is submitted.
struct FailingQueue {
    waker: Waker,
    done: Mutex<Vec<BlockCompletion>>,
}

impl BlockQueue for FailingQueue {
    fn submit(&mut self, request: BlockRequest, token: u64) -> Result<(), BlockRequest> {
        let device = Failing {
            asynchronous: false,
        };
        self.done.lock().push(request.run_on(&device, token));
        (self.waker)();
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<BlockCompletion>, max: usize) -> usize {
        let mut done = self.done.lock();
        let n = done.len().min(max);
        out.extend(done.drain(..n));
        n
    }
    fn in_flight(&self) -> usize {
        self.done.lock().len()
    }
}

fn failing_backend_gives_each_command_its_status_and_counts(asynchronous: bool) {
    let mut h = Host::enabled_on(config(), Arc::new(Failing { asynchronous }));
    h.create_pair(1, 16);
    let cases = [
        (NvmOpcode::READ, Status::UNRECOVERED_READ_ERROR),
        (NvmOpcode::WRITE, Status::WRITE_FAULT),
        (NvmOpcode::FLUSH, Status::INTERNAL_ERROR),
        (NvmOpcode::COMPARE, Status::UNRECOVERED_READ_ERROR),
        (NvmOpcode::WRITE_ZEROES, Status::WRITE_FAULT),
        (NvmOpcode::VERIFY, Status::UNRECOVERED_READ_ERROR),
        // Eight source ranges of one block at LBA 0 (DATA is zeroes).
        (NvmOpcode::COPY, Status::UNRECOVERED_READ_ERROR),
    ];
    for (i, (op, status)) in cases.into_iter().enumerate() {
        let done = h.submit(1, rw(op, 1, 0, 8, DATA, 0));
        assert_eq!(done.status(), status.with_dnr(true), "{op}");
        assert_eq!(h.ctrl.stats().backend_errors, i as u64 + 1, "{op}");
    }
    assert_eq!(h.ctrl.stats().queue(1).errors, cases.len() as u64);
}

#[test]
fn failing_synchronous_backend_gives_each_command_its_status_and_counts() {
    failing_backend_gives_each_command_its_status_and_counts(false);
}

#[test]
fn failing_asynchronous_backend_gives_each_command_its_status_and_counts() {
    failing_backend_gives_each_command_its_status_and_counts(true);
}

#[test]
fn volatile_write_cache_off_with_a_failing_flush_is_internal_error_and_counted() {
    let mut h = Host::enabled_on(
        config(),
        Arc::new(Failing {
            asynchronous: false,
        }),
    );
    let done = h.admin(set_features(0x06, 0));
    assert_eq!(done.status(), Status::INTERNAL_ERROR.with_dnr(true));
    assert_eq!(h.ctrl.stats().backend_errors, 1);
}
