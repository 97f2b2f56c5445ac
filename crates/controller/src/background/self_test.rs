//! Device Self-test (NVMe Base 2.0 §5.9 the command, §8.22 the
//! operation): the test in progress, the last 20 results, and the Device
//! Self-test log (06h) that shows them.
//!
//! One test runs at a time in the subsystem (DSTO.SDSO). It ends by
//! itself, with a result entry, or is aborted, with one saying why: by a
//! Device Self-test command (Fh), a Controller Level Reset (a short test
//! only: an extended test goes on across it), a Format NVM or a deletion
//! of a namespace it tests, or the start of a sanitize operation. The
//! aborting party writes the entry at once; the test's thread, which may
//! be in the middle of a step, finds another generation when it ends and
//! writes nothing.

use std::collections::VecDeque;

use parking_lot::Mutex;
use vnvme_spec::log::self_test::{code, result, vdi, RESULTS};
use vnvme_spec::log::{SelfTestLog, SelfTestResult};
use vnvme_spec::Status;
use zerocopy::little_endian::{U32, U64};

use crate::background::Task;
use crate::namespace::NSID_ALL;

mod saved;
pub(crate) use saved::SavedSelfTest;

#[derive(Debug, Default)]
pub(crate) struct SelfTest {
    state: Mutex<State>,
    pub task: Task,
}

#[derive(Debug, Default)]
struct State {
    running: Option<Running>,
    /// Newest first, at most [`RESULTS`].
    results: VecDeque<SelfTestResult>,
    /// Counts tests started: tells a test's thread whether its test is
    /// still the one running.
    generation: u64,
}

#[derive(Debug, Clone, Copy)]
struct Running {
    /// Self-test Code: short or extended.
    code: u8,
    /// 0: the controller only; FFFFFFFFh: and every active namespace.
    nsid: u32,
    percent: u8,
    generation: u64,
}

/// Why a test failed: the first failed segment, and where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failure {
    /// Segment Number, from 1.
    pub segment: u8,
    pub nsid: u32,
    /// The failing block, if the failure is one.
    pub lba: Option<u64>,
    pub status: Status,
}

impl SelfTest {
    /// Starts a test of `code` on `nsid`: its generation, or Device
    /// Self-test In Progress.
    pub fn start(&self, code: u8, nsid: u32) -> Result<u64, Status> {
        let mut s = self.state.lock();
        if s.running.is_some() {
            return Err(Status::SELF_TEST_IN_PROGRESS.with_dnr(false));
        }
        s.generation = s.generation.wrapping_add(1);
        s.running = Some(Running {
            code,
            nsid,
            percent: 0,
            generation: s.generation,
        });
        Ok(s.generation)
    }

    /// Test `generation` is `percent` done; false if it is not running
    /// any more.
    pub fn progress(&self, generation: u64, percent: u8) -> bool {
        let mut s = self.state.lock();
        match s.running.as_mut().filter(|r| r.generation == generation) {
            Some(r) => {
                r.percent = percent.min(99);
                true
            }
            None => false,
        }
    }

    /// Test `generation` ended: its result entry, unless it was aborted.
    pub fn finish(&self, generation: u64, outcome: Result<(), Failure>, poh: u64) {
        let mut s = self.state.lock();
        if let Some(r) = s.running.filter(|r| r.generation == generation) {
            let entry = match outcome {
                Ok(()) => entry(r.code, result::NO_ERROR, poh),
                Err(f) => failed(r.code, poh, f),
            };
            s.end(entry);
        }
    }

    /// Aborts the running test, if any, with result `why`.
    pub fn abort(&self, why: u8, poh: u64) {
        self.abort_if(why, poh, |_| true);
    }

    /// Aborts a running test that covers namespace `nsid` (it is being
    /// formatted or deleted).
    pub fn abort_for(&self, nsid: u32, why: u8, poh: u64) {
        self.abort_if(why, poh, |r| r.nsid == nsid || r.nsid == NSID_ALL);
    }

    /// A Controller Level Reset: a short test ends with it (§8.22.1); an
    /// extended test goes on (§8.22.2).
    pub fn controller_reset(&self, poh: u64) {
        self.abort_if(result::ABORTED_RESET, poh, |r| r.code == code::SHORT);
    }

    fn abort_if(&self, why: u8, poh: u64, covers: impl Fn(&Running) -> bool) {
        let mut s = self.state.lock();
        if let Some(r) = s.running.filter(|r| covers(r)) {
            s.end(entry(r.code, why, poh));
            drop(s);
            self.task.signal_stop();
        }
    }

    /// The Device Self-test log.
    pub fn log(&self) -> Box<SelfTestLog> {
        let s = self.state.lock();
        let mut log = SelfTestLog::new_boxed();
        if let Some(r) = s.running {
            log.current_operation = r.code;
            log.completion = r.percent;
        }
        for (slot, e) in log
            .results
            .iter_mut()
            .zip(s.results.iter().copied().chain(std::iter::repeat(unused())))
        {
            *slot = e;
        }
        log
    }
}

impl State {
    fn end(&mut self, entry: SelfTestResult) {
        self.running = None;
        self.results.push_front(entry);
        self.results.truncate(RESULTS);
    }
}

/// A result entry without diagnostic information.
fn entry(code: u8, result: u8, poh: u64) -> SelfTestResult {
    let mut e = SelfTestResult::default();
    e.dsts = (code << 4) | (result & 0xF);
    e.poh = U64::new(poh);
    e
}

fn failed(code: u8, poh: u64, f: Failure) -> SelfTestResult {
    let mut e = entry(code, result::SEGMENT_FAILED, poh);
    e.seg = f.segment;
    e.vdi = vdi::NSID | vdi::SCT | vdi::SC;
    e.nsid = U32::new(f.nsid);
    if let Some(lba) = f.lba {
        e.vdi |= vdi::FLBA;
        e.flba = U64::new(lba);
    }
    e.sct = f.status.sct();
    e.sc = f.status.sc();
    e
}

/// An entry that holds no result.
fn unused() -> SelfTestResult {
    entry(0, result::NOT_USED, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_are_kept_newest_first_twenty_at_most() {
        let t = SelfTest::default();
        for i in 0..25u64 {
            let g = t.start(code::SHORT, 0).unwrap();
            t.finish(g, Ok(()), i);
        }
        let log = t.log();
        assert_eq!(log.current_operation, 0);
        assert_eq!(log.results.len(), RESULTS);
        assert_eq!(log.results[0].poh.get(), 24);
        assert_eq!(log.results[19].poh.get(), 5);
        assert_eq!(log.results[0].dsts, code::SHORT << 4);
    }

    #[test]
    fn an_aborted_test_gets_its_entry_from_the_abort_not_its_thread() {
        let t = SelfTest::default();
        let log = t.log();
        assert!(log.results.iter().all(|e| e.dsts == result::NOT_USED));
        let g = t.start(code::EXTENDED, 1).unwrap();
        assert!(t.progress(g, 40));
        assert_eq!((t.log().current_operation, t.log().completion), (2, 40));
        assert_eq!(
            t.start(code::SHORT, 1),
            Err(Status::SELF_TEST_IN_PROGRESS.with_dnr(false))
        );
        // An extended test survives a reset; a format of another
        // namespace leaves it alone.
        t.controller_reset(0);
        t.abort_for(2, result::ABORTED_FORMAT, 0);
        assert_eq!(t.log().current_operation, 2);
        t.abort_for(1, result::ABORTED_FORMAT, 3);
        // The thread's late word changes nothing.
        assert!(!t.progress(g, 50));
        t.finish(g, Ok(()), 9);
        let log = t.log();
        assert_eq!(log.current_operation, 0);
        assert_eq!(log.results[0].dsts, (2 << 4) | result::ABORTED_FORMAT);
        assert_eq!(log.results[0].poh.get(), 3);
        assert_eq!(log.results[1].dsts, result::NOT_USED);
    }

    #[test]
    fn a_failure_names_segment_namespace_and_block() {
        let t = SelfTest::default();
        let g = t.start(code::SHORT, NSID_ALL).unwrap();
        let status = Status::UNRECOVERED_READ_ERROR;
        let f = Failure {
            segment: 2,
            nsid: 1,
            lba: Some(77),
            status,
        };
        t.finish(g, Err(f), 0);
        let e = t.log().results[0];
        assert_eq!(e.dsts, (1 << 4) | result::SEGMENT_FAILED);
        assert_eq!((e.seg, e.nsid.get(), e.flba.get()), (2, 1, 77));
        assert_eq!(e.vdi, vdi::NSID | vdi::FLBA | vdi::SCT | vdi::SC);
        assert_eq!((e.sct, e.sc), (status.sct(), status.sc()));
    }
}
