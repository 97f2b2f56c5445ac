//! What waiting for a completion costs the caller, counted exactly on the
//! fake, which posts each completion inside the SQ doorbell write: the
//! block, synchronous and asynchronous passthrough waits read the clock
//! only when there is nothing to reap, and each API the same number of
//! times (issue 37: the asynchronous wait read it three times for a
//! completion already posted, the block wait once).

use std::time::Duration;

use vnvme_spec::command::Command;
use vnvme_spec::NvmOpcode;

use super::*;
use crate::controller::{Controller, InitOptions};
use crate::error::Error;
use crate::passthru::{AsyncCompletion, AsyncQueue};
use crate::queue::clock;

const COMMANDS: u64 = 16;
const LONG: Duration = Duration::from_secs(10);

fn flush() -> Command {
    let mut c = Command::new(NvmOpcode::FLUSH.0, 0);
    c.nsid = 1.into();
    c
}

fn controller() -> Controller {
    let dev = FakeDevice::new(Script {
        version: vnvme_spec::regs::version(1, 4, 0),
        nsids: vec![1],
        ..Script::default()
    });
    Controller::init(dev, InitOptions::default()).unwrap()
}

#[test]
fn a_posted_completion_is_reaped_without_reading_the_clock() {
    let ctrl = controller();
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut done = Vec::new();
    let before = clock::reads();
    for _ in 0..COMMANDS {
        q.submit(flush()).unwrap();
        assert_eq!(q.wait(&mut done, 1, LONG).unwrap(), 1);
    }
    assert_eq!(clock::reads() - before, 0, "block API");
    for _ in 0..COMMANDS {
        let c = q.passthru(flush(), None).unwrap();
        assert!(c.is_success());
    }
    assert_eq!(clock::reads() - before, 0, "synchronous passthrough");

    let mut aq = AsyncQueue::new(q);
    let mut reaped: Vec<AsyncCompletion> = Vec::new();
    for token in 0..COMMANDS {
        aq.submit_one(flush(), None, token).unwrap();
        assert_eq!(aq.wait(&mut reaped, 1, LONG).unwrap(), 1);
    }
    assert_eq!(clock::reads() - before, 0, "asynchronous passthrough");
    let tokens: Vec<u64> = reaped.iter().map(|c| c.token).collect();
    assert_eq!(tokens, (0..COMMANDS).collect::<Vec<_>>());
    assert!(reaped.iter().all(|c| c.completion.is_success()));
}

#[test]
fn an_empty_queue_reads_the_clock_once_before_giving_up() {
    let ctrl = controller();
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut done = Vec::new();
    let before = clock::reads();
    let r = q.wait(&mut done, 1, Duration::ZERO);
    assert!(matches!(r, Err(Error::WaitTimeout { qid: 1, .. })), "{r:?}");
    assert_eq!(clock::reads() - before, 1, "block API");

    let mut aq = AsyncQueue::new(q);
    let mut reaped = Vec::new();
    let before = clock::reads();
    let r = aq.wait(&mut reaped, 1, Duration::ZERO);
    assert!(matches!(r, Err(Error::WaitTimeout { qid: 1, .. })), "{r:?}");
    assert_eq!(clock::reads() - before, 1, "asynchronous passthrough");
    assert!(reaped.is_empty());
}

#[test]
fn a_timeout_past_the_clocks_end_waits_without_overflowing() {
    // `Instant::now() + Duration::MAX` panics; a caller asking to wait
    // "for ever" gets its completions instead.
    let ctrl = controller();
    let mut aq = AsyncQueue::new(ctrl.take_io_queue(0).unwrap());
    let mut reaped = Vec::new();
    for token in 0..2 {
        aq.prepare(flush(), None, token).unwrap();
    }
    aq.submit().unwrap();
    assert_eq!(aq.wait(&mut reaped, 2, Duration::MAX).unwrap(), 2);
    let (mut q, _) = aq.into_inner();
    q.submit(flush()).unwrap();
    let mut done = Vec::new();
    assert_eq!(q.wait(&mut done, 4, Duration::MAX).unwrap(), 1);
}
