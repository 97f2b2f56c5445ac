//! The Sanitize command (NVMe Base 2.0 §5.24), the commands a sanitize
//! refuses, and the operation's thread (the methods and the state are in
//! [`crate::background::sanitize`]).
//!
//! The command only starts the operation: the thread then erases the
//! medium at [`ControllerConfig::sanitize_rate`](crate::ControllerConfig)
//! and the Sanitize Status log shows how far it is. Meanwhile I/O and the
//! admin commands outside [`PERMITTED`] get Sanitize In Progress, and
//! after a failure Sanitize Failed, until a sanitize completes (or, when
//! the failed one allowed it, Exit Failure Mode). A controller reset does
//! not stop it; the completion is reported as an asynchronous event
//! (NVM command set specific, Sanitize Operation Completed, log 81h).

use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_spec::cdw::Cdw10Sanitize;
use vnvme_spec::identify::sanicap;
use vnvme_spec::log::persistent_event::EventType;
use vnvme_spec::log::sanitize::action;
use vnvme_spec::log::self_test::result::ABORTED_SANITIZE;
use vnvme_spec::log::{async_event, LogPageId};
use vnvme_spec::{AdminOpcode, Command, Status};

use super::invalid_field;
use crate::backend_error::BackendOp;
use crate::background::sanitize::{Method, Operation, Position, Sanitize};
use crate::background::Pace;
use crate::command::Ctx;
use crate::namespace::Namespace;
use crate::reporting::persistent_event_log::{sanitize_completion, sanitize_start};
use crate::reporting::Reporting;
use crate::state::Shared;
use crate::stats::Stats;
use crate::subsystem::Subsystem;

/// Admin commands a sanitize in progress or failed permits (§8.21): none
/// touches user data. Sanitize itself is here to recover from a failure.
const PERMITTED: &[AdminOpcode] = &[
    AdminOpcode::ABORT,
    AdminOpcode::ASYNC_EVENT_REQUEST,
    AdminOpcode::CREATE_IO_CQ,
    AdminOpcode::CREATE_IO_SQ,
    AdminOpcode::DELETE_IO_CQ,
    AdminOpcode::DELETE_IO_SQ,
    AdminOpcode::DOORBELL_BUFFER_CONFIG,
    AdminOpcode::GET_FEATURES,
    AdminOpcode::GET_LOG_PAGE,
    AdminOpcode::IDENTIFY,
    AdminOpcode::KEEP_ALIVE,
    AdminOpcode::SANITIZE,
    AdminOpcode::SET_FEATURES,
];

/// Sanitize Capabilities (Identify Controller SANICAP): crypto erase,
/// block erase and overwrite; a sanitize leaves deallocated blocks as it
/// wrote them (No-Deallocate Modifies Media After Sanitize: not modified).
pub(super) const SANICAP: u32 =
    sanicap::CES | sanicap::BES | sanicap::OWS | sanicap::NODMMAS_NOT_MODIFIED;

/// How often the thread looks whether commands that started before the
/// sanitize are done with the medium.
const DRAIN_POLL: Duration = Duration::from_millis(1);

/// The status `op` gets now, if a sanitize refuses it.
pub(super) fn refusal(sanitize: &Sanitize, op: AdminOpcode) -> Option<Status> {
    if PERMITTED.contains(&op) {
        return None;
    }
    sanitize.refusal()
}

/// Sanitize: CDW10 SANACT (2:0), AUSE (3), OWPASS (7:4), OIPBP (8), NDAS
/// (9), EMVS (10); CDW11 the Overwrite Pattern.
pub(super) fn sanitize(ctx: &mut Ctx<'_>, cmd: &Command) -> Result<u32, Status> {
    let cdw10 = Cdw10Sanitize::from(cmd.cdw10);
    let shared = ctx.shared;
    let method = match cdw10.sanact() {
        action::EXIT_FAILURE_MODE => {
            if shared.sanitize.exit_failure_mode()? {
                block_io(&shared.subsystem, None);
            }
            return Ok(0);
        }
        action::BLOCK_ERASE => Method::BlockErase,
        action::CRYPTO_ERASE => Method::CryptoErase,
        action::OVERWRITE => Method::Overwrite {
            pattern: cmd.cdw11.get(),
            passes: match cdw10.owpass() {
                0 => 16,
                n => n,
            },
            invert: cdw10.oipbp(),
        },
        // Exit Media Verification and the reserved values.
        _ => return Err(invalid_field()),
    };
    // No media verification state (SANICAP.VERS clear).
    if cdw10.emvs() {
        return Err(invalid_field());
    }
    let op = Operation {
        method,
        ndas: cdw10.ndas(),
        ause: cdw10.ause(),
        cdw10: cmd.cdw10.get(),
    };
    start(shared, op, cmd.cdw11.get())
}

/// The whole [`Shared`]: the operation's thread holds it, and starting
/// touches the sanitize state, the namespaces and the event logs.
fn start(shared: &Shared, op: Operation, cdw11: u32) -> Result<u32, Status> {
    let me = shared
        .me
        .upgrade()
        .ok_or(Status::INTERNAL_ERROR.with_dnr(true))?;
    shared.sanitize.begin(&op)?;
    shared.reporting.persistent_events.record(
        EventType::SANITIZE_START,
        Instant::now(),
        sanitize_start(SANICAP, op.cdw10, cdw11),
    );
    // The last operation's thread may still be reporting its end: done
    // with that before its event is cleared.
    shared.sanitize.task.stop();
    shared
        .self_test
        .abort(ABORTED_SANITIZE, shared.lifecycle.power_on_hours());
    clear_completion_event(&shared.reporting);
    let namespaces = block_io(
        &shared.subsystem,
        Some(Status::SANITIZE_IN_PROGRESS.with_dnr(false)),
    );
    tracing::debug!(?op, "sanitize started");
    let spawned = shared
        .sanitize
        .task
        .start("vnvme-sanitize", move || run(&me, &op, namespaces, true));
    spawned.map(|()| 0).map_err(|e| {
        tracing::error!("no thread for the sanitize operation: {e}");
        fail(shared, &op);
        Status::INTERNAL_ERROR.with_dnr(true)
    })
}

/// Gives every namespace's I/O `status` (None: lets it through again);
/// returns the namespaces as they were.
fn block_io(subsystem: &Subsystem, status: Option<Status>) -> Vec<Arc<Namespace>> {
    subsystem.namespaces.update(|map| {
        let before: Vec<Arc<Namespace>> = map.values().cloned().collect();
        for ns in map.values_mut() {
            Arc::make_mut(ns).sanitize = status;
        }
        before
    })
}

/// §5.24: starting a sanitize clears a Sanitize Operation Completed event
/// the host has not had or not acknowledged.
fn clear_completion_event(reporting: &Reporting) {
    let kind = async_event::TYPE_IO_COMMAND_SET;
    let completed = async_event::dword0(
        kind,
        async_event::IO_SANITIZE_COMPLETED,
        LogPageId::SANITIZE_STATUS.0,
    );
    let mut e = reporting.events.lock();
    e.queue.retain(|&dw| dw != completed);
    e.masked &= !(1 << kind);
}

/// Goes on with a sanitize in progress whose thread a pause stopped (or
/// that a restored state holds): from where it was, with its media key.
/// Nothing if none is in progress or its thread runs. The whole
/// [`Shared`]: it starts the operation's thread, which holds it.
pub(crate) fn resume(shared: &Shared) {
    let Some(pos) = shared.sanitize.position() else {
        return;
    };
    if shared.sanitize.task.running() {
        return;
    }
    let Some(me) = shared.me.upgrade() else {
        return;
    };
    let namespaces: Vec<Arc<Namespace>> = shared
        .subsystem
        .namespaces
        .update(|map| map.values().cloned().collect());
    tracing::debug!(done = pos.done, "sanitize resumed");
    let spawned = shared.sanitize.task.start("vnvme-sanitize", move || {
        run(&me, &pos.op, namespaces, false)
    });
    if let Err(e) = spawned {
        tracing::error!("no thread to resume the sanitize operation: {e}");
        fail(shared, &pos.op);
    }
}

/// The operation's thread: `namespaces` as they were before I/O was
/// refused; `drain`: wait for commands that found them before (not when
/// resuming: the pause that stopped the run drained them). The whole
/// [`Shared`]: it ends by reporting to the host (see [`report`]).
fn run(shared: &Shared, op: &Operation, namespaces: Vec<Arc<Namespace>>, drain: bool) {
    let task = &shared.sanitize.task;
    // Commands that found their namespace before it was blocked may still
    // write to it (an I/O in flight on the file backend): erase after them.
    for ns in namespaces.iter().filter(|_| drain) {
        while Arc::strong_count(ns) > 1 {
            if !task.pace(Instant::now() + DRAIN_POLL) {
                return;
            }
        }
    }
    let Some(from) = shared.sanitize.position() else {
        return;
    };
    let rate = shared.config.sanitize_rate;
    match erase(&shared.sanitize, &shared.stats, rate, &from, &namespaces) {
        Ended::Completed => {
            // Erased blocks are not uncorrectable any more.
            for ns in &namespaces {
                ns.uncorrectable.clear(0, ns.nsze);
                // ZNS 1.1 §5.3: every zone of a sanitized namespace is empty
                // (erased already: nothing more to erase).
                if let Some(zones) = &ns.zones {
                    zones.empty_all();
                }
            }
            drop(namespaces);
            block_io(&shared.subsystem, None);
            shared
                .sanitize
                .complete(true, op.ause, user_data_writes(&shared.stats));
            tracing::debug!("sanitize completed");
            report(shared);
        }
        Ended::Failed => fail(shared, op),
        // The controller is going away.
        Ended::Stopped => {}
    }
}

enum Ended {
    Completed,
    Failed,
    Stopped,
}

/// Runs every pass over every namespace, from `from.done` bytes in, at
/// `rate` bytes a second (the operation's speed-up aside); the progress is
/// the sanitize state's, a media error the statistics'.
fn erase(
    sanitize: &Sanitize,
    stats: &Stats,
    rate: u64,
    from: &Position,
    namespaces: &[Arc<Namespace>],
) -> Ended {
    let op = &from.op;
    let media: Vec<&Arc<Namespace>> = namespaces
        .iter()
        .filter(|ns| !ns.backend.moves_no_data())
        .collect();
    let passes = op.passes();
    let total = media
        .iter()
        .map(|ns| ns.backend.size())
        .sum::<u64>()
        .saturating_mul(u64::from(passes));
    let pace = Pace::new(rate.saturating_mul(op.speedup()));
    let (key, step) = (from.key, pace.step());
    let mut buf = Vec::new();
    let mut done = 0u64;
    let per_pass = total / u64::from(passes.max(1));
    if matches!(op.method, Method::Overwrite { .. }) {
        let passes_done = from.done.checked_div(per_pass).unwrap_or(0);
        sanitize.set_passes(u8::try_from(passes_done).unwrap_or(u8::MAX));
    }
    let failed = |nsid, e| {
        stats.backend_error(BackendOp::Sanitize, nsid, &e);
        Ended::Failed
    };
    for pass in 0..passes {
        for ns in &media {
            let size = ns.backend.size();
            // Resumed: what was done before is skipped (a pause stops the
            // thread between two steps, so `from.done` ends a step).
            let skip = (from.done - done.min(from.done)).min(size);
            let mut offset = skip;
            done += skip;
            while offset < size {
                let len = step.min(size - offset);
                if let Err(e) = op.erase(&*ns.backend, key, pass, offset, len, &mut buf) {
                    return failed(ns.nsid, e);
                }
                offset += len;
                done += len;
                sanitize.progress(done, total);
                if !pace.wait(&sanitize.task, done - from.done) {
                    return Ended::Stopped;
                }
            }
        }
        if matches!(op.method, Method::Overwrite { .. }) {
            sanitize.pass_done();
        }
    }
    for ns in &media {
        if let Err(e) = op.finish(&*ns.backend) {
            return failed(ns.nsid, e);
        }
    }
    Ended::Completed
}

/// The operation failed: failure mode, I/O gets Sanitize Failed. The
/// whole [`Shared`]: namespaces, sanitize state and [`report`].
fn fail(shared: &Shared, op: &Operation) {
    block_io(
        &shared.subsystem,
        Some(Status::SANITIZE_FAILED.with_dnr(true)),
    );
    shared
        .sanitize
        .complete(false, op.ause, user_data_writes(&shared.stats));
    tracing::debug!("sanitize failed");
    report(shared);
}

/// Sanitize Operation Completed: the log tells how it ended, and so does
/// the Persistent Event Log. The whole [`Shared`]: it may raise an
/// asynchronous event.
fn report(shared: &Shared) {
    let log = shared.sanitize.log(user_data_writes(&shared.stats), 0, 0);
    shared.reporting.persistent_events.record(
        EventType::SANITIZE_COMPLETION,
        Instant::now(),
        sanitize_completion(log.sprog.get(), log.sstat.get()),
    );
    shared.async_event(
        async_event::TYPE_IO_COMMAND_SET,
        async_event::IO_SANITIZE_COMPLETED,
        LogPageId::SANITIZE_STATUS.0,
    );
}

/// Commands that wrote user data so far (Global Data Erased while it
/// stays where a completed sanitize left it).
fn user_data_writes(stats: &Stats) -> u64 {
    crate::io::WRITES_USER_DATA
        .iter()
        .map(|&op| stats.io_commands(op))
        .sum()
}

/// The Sanitize Status log page. The whole [`Shared`]: it reads the
/// sanitize state, statistics, namespaces and configuration.
pub(super) fn log(shared: &Shared) -> Vec<u8> {
    let log = shared.sanitize.log(
        user_data_writes(&shared.stats),
        shared.subsystem.namespaces.media_bytes(),
        shared.config.sanitize_rate,
    );
    zerocopy::IntoBytes::as_bytes(&*log).to_vec()
}
