//! The Device Self-test command (NVMe Base 2.0 §5.9) and the test's
//! thread (the state and the log are in [`crate::background::self_test`]).
//!
//! The command completes once the test has started; the Device Self-test
//! log shows its progress and, at the end, its result. A test covers the
//! controller and the namespaces its NSID names (0: none; FFFFFFFFh: every
//! active one), in three segments:
//! 1. NVM integrity: each namespace's backend flushes;
//! 2. metadata validation: no block is marked by Write Uncorrectable (the
//!    first marked block is the failing LBA);
//! 3. media check: the blocks read back through the backend, at
//!    [`ControllerConfig::self_test_rate`](crate::ControllerConfig): all
//!    of them in an extended test, one step in [`SHORT_SAMPLE`] in a short
//!    one.
//!
//! A failure ends the test with the segment, the namespace, the failing
//! block and the status a command would have got.

use std::sync::Arc;

use vnvme_spec::cdw::Cdw10DeviceSelfTest;
use vnvme_spec::log::self_test::{code, result};
use vnvme_spec::{Command, Status};

use super::invalid_field;
use crate::backend_error::BackendOp;
use crate::background::self_test::{Failure, SelfTest};
use crate::background::Pace;
use crate::command::Ctx;
use crate::namespace::{Namespace, NSID_ALL};
use crate::stats::Stats;

/// A short test reads one step of the medium in this many.
const SHORT_SAMPLE: u64 = 16;

/// Device Self-test: CDW10 STC (3:0) 1h short, 2h extended, Fh abort.
pub(super) fn device_self_test(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let stc = Cdw10DeviceSelfTest::from(cmd.cdw10).stc();
    let shared = ctx.shared;
    match stc {
        code::SHORT | code::EXTENDED => {}
        code::ABORT => {
            shared
                .self_test
                .abort(result::ABORTED, shared.lifecycle.power_on_hours());
            return Ok(0);
        }
        _ => return Err(invalid_field()),
    }
    let nsid = cmd.nsid.get();
    let namespaces = match nsid {
        0 => Vec::new(),
        NSID_ALL => shared.subsystem.namespaces.active_list(),
        id => vec![shared.namespace(id)?],
    };
    let me = shared
        .me
        .upgrade()
        .ok_or(Status::INTERNAL_ERROR.with_dnr(true))?;
    let generation = shared.self_test.start(stc, nsid)?;
    let spawned = shared.self_test.task.start("vnvme-self-test", move || {
        let rate = me.config.self_test_rate;
        if let Some(outcome) = test(&me.self_test, &me.stats, rate, stc, generation, &namespaces) {
            me.self_test
                .finish(generation, outcome, me.lifecycle.power_on_hours());
        }
    });
    spawned.map(|()| 0).map_err(|e| {
        tracing::error!("no thread for the device self-test: {e}");
        let poh = shared.lifecycle.power_on_hours();
        shared.self_test.abort(result::FATAL_ERROR, poh);
        Status::INTERNAL_ERROR.with_dnr(true)
    })
}

/// Runs test `generation` at `rate` bytes a second: its outcome, or None
/// once it was aborted.
fn test(
    self_test: &SelfTest,
    stats: &Stats,
    rate: u64,
    stc: u8,
    generation: u64,
    namespaces: &[Arc<Namespace>],
) -> Option<Result<(), Failure>> {
    let failure = |segment, nsid, lba, status| {
        Some(Err(Failure {
            segment,
            nsid,
            lba,
            status,
        }))
    };
    for ns in namespaces {
        if let Err(e) = ns.backend.flush() {
            let status = stats.backend_error(BackendOp::Flush, ns.nsid, &e);
            return failure(1, ns.nsid, None, status);
        }
    }
    for ns in namespaces {
        if let Some(lba) = ns.uncorrectable.first() {
            return failure(2, ns.nsid, Some(lba), unrecovered());
        }
    }
    let media: Vec<&Arc<Namespace>> = namespaces
        .iter()
        .filter(|ns| !ns.backend.moves_no_data())
        .collect();
    let pace = Pace::new(rate);
    let step = pace.step();
    let every = if stc == code::SHORT { SHORT_SAMPLE } else { 1 };
    let steps = |ns: &Namespace| (ns.nsze * ns.stride()).div_ceil(step * every);
    let total: u64 = media.iter().map(|ns| steps(ns)).sum();
    let (mut buf, mut steps_done, mut bytes_done) = (Vec::new(), 0u64, 0u64);
    for ns in media {
        // The blocks: a backend may be a little larger.
        let size = ns.nsze * ns.stride();
        for offset in (0..size).step_by(step as usize * every as usize) {
            let len = step.min(size - offset);
            buf.resize(len as usize, 0);
            if ns.backend.read(offset, &mut buf).is_err() {
                let lba = first_bad_block(stats, ns, offset, len);
                return failure(3, ns.nsid, Some(lba), unrecovered());
            }
            steps_done += 1;
            bytes_done += len;
            let percent = steps_done * 100 / total.max(1);
            if !self_test.progress(generation, percent as u8)
                || !pace.wait(&self_test.task, bytes_done)
            {
                return None;
            }
        }
    }
    Some(Ok(()))
}

fn unrecovered() -> Status {
    Status::UNRECOVERED_READ_ERROR
}

/// The first block of `len` bytes at `offset` that fails to read alone
/// (counted as a media error); the first block if none does now.
fn first_bad_block(stats: &Stats, ns: &Namespace, offset: u64, len: u64) -> u64 {
    let stride = ns.stride();
    let mut block = vec![0u8; stride as usize];
    let first = offset / stride;
    let bad = (first..(offset + len).div_ceil(stride)).find_map(|lba| {
        let e = ns.backend.read(lba * stride, &mut block).err()?;
        stats.backend_error(BackendOp::Read, ns.nsid, &e);
        Some(lba)
    });
    bad.unwrap_or(first)
}
