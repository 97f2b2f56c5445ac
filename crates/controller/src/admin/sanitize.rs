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
use vnvme_spec::log::sanitize::action;
use vnvme_spec::{AdminOpcode, Command, Status};

use super::invalid_field;
use crate::backend_error::BackendOp;
use crate::background::sanitize::{Method, Operation, Position, Sanitize};
use crate::background::Pace;
use crate::command::Ctx;
use crate::namespace::Namespace;
use crate::reporting::persistent_event_log::{sanitize_completion, sanitize_start};
use crate::state::Shared;
use crate::stats::Stats;
use crate::subsystem::Namespaces;

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
            if shared.sanitize().exit_failure_mode()? {
                block_io(&shared.subsystem.namespaces, None);
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
    start(&Runner::of(shared), op, cmd.cdw11.get())
}

/// What a sanitize's thread holds: the NVM subsystem, not a controller
/// (the operation is the subsystem's, §8.21: it goes on when the
/// controller that started it goes away, and every controller reports
/// its end), the starting controller's counters (a media error is
/// counted there) and the pace.
struct Runner {
    subsystem: Namespaces,
    stats: Arc<Stats>,
    rate: u64,
}

impl Runner {
    fn of(shared: &Shared) -> Self {
        Self {
            subsystem: shared.subsystem.namespaces.clone(),
            stats: Arc::clone(&shared.stats),
            rate: shared.config.sanitize_rate,
        }
    }

    fn sanitize(&self) -> &Sanitize {
        &self.subsystem.table().sanitize
    }
}

/// Starts `op` for the whole subsystem: a second one, from any of its
/// controllers, gets Sanitize In Progress until it ends.
fn start(runner: &Runner, op: Operation, cdw11: u32) -> Result<u32, Status> {
    let sanitize = runner.sanitize();
    sanitize.begin(&op)?;
    // The last operation's thread may still be reporting its end: done
    // with that before its event is cleared.
    sanitize.task.stop();
    // §8.21: on every controller of the subsystem, a start clears the
    // completion event and aborts the device self-test.
    let event = sanitize_start(SANICAP, op.cdw10, cdw11);
    for (_, member) in runner.subsystem.live() {
        member.sanitize_started(&event);
    }
    let namespaces = block_io(
        &runner.subsystem,
        Some(Status::SANITIZE_IN_PROGRESS.with_dnr(false)),
    );
    tracing::debug!(?op, "sanitize started");
    spawn(runner, op, namespaces, true)
}

/// Starts the operation's thread; if there is none, the operation fails.
fn spawn(
    runner: &Runner,
    op: Operation,
    namespaces: Vec<Arc<Namespace>>,
    drain: bool,
) -> Result<u32, Status> {
    let mine = Runner {
        subsystem: runner.subsystem.clone(),
        stats: Arc::clone(&runner.stats),
        rate: runner.rate,
    };
    let spawned = runner
        .sanitize()
        .task
        .start("vnvme-sanitize", move || mine.run(&op, namespaces, drain));
    spawned.map(|()| 0).map_err(|e| {
        tracing::error!("no thread for the sanitize operation: {e}");
        runner.fail(&op);
        Status::INTERNAL_ERROR.with_dnr(true)
    })
}

/// Gives every namespace's I/O `status` (None: lets it through again);
/// returns the namespaces as they were.
fn block_io(namespaces: &Namespaces, status: Option<Status>) -> Vec<Arc<Namespace>> {
    namespaces.update(|map| {
        let before: Vec<Arc<Namespace>> = map.values().cloned().collect();
        for ns in map.values_mut() {
            Arc::make_mut(ns).sanitize = status;
        }
        before
    })
}

/// Goes on with a sanitize in progress whose thread a pause stopped (or
/// that a restored state holds): from where it was, with its media key.
/// Nothing if none is in progress or its thread runs. Any controller of
/// the subsystem may resume it (its enable, reset or resume).
pub(crate) fn resume(shared: &Shared) {
    let sanitize = shared.sanitize();
    let Some(pos) = sanitize.position() else {
        return;
    };
    if sanitize.task.running() {
        return;
    }
    let runner = Runner::of(shared);
    let namespaces = runner.subsystem.allocated_list();
    tracing::debug!(done = pos.done, "sanitize resumed");
    // A failure to spawn is logged and fails the operation.
    let _ = spawn(&runner, pos.op, namespaces, false);
}

impl Runner {
    /// The operation's thread: `namespaces` as they were before I/O was
    /// refused; `drain`: wait for commands that found them before (not
    /// when resuming: the pause that stopped the run drained them).
    fn run(&self, op: &Operation, namespaces: Vec<Arc<Namespace>>, drain: bool) {
        let sanitize = self.sanitize();
        let task = &sanitize.task;
        // Commands that found their namespace before it was blocked may
        // still write to it (an I/O in flight on the file backend): erase
        // after them.
        for ns in namespaces.iter().filter(|_| drain) {
            while Arc::strong_count(ns) > 1 {
                if !task.pace(Instant::now() + DRAIN_POLL) {
                    return;
                }
            }
        }
        let Some(from) = sanitize.position() else {
            return;
        };
        match erase(sanitize, &self.stats, self.rate, &from, &namespaces) {
            Ended::Completed => {
                // Erased blocks are not uncorrectable any more.
                for ns in &namespaces {
                    ns.uncorrectable.clear(0, ns.nsze);
                    // ZNS 1.1 §5.3: every zone of a sanitized namespace is
                    // empty (erased already: nothing more to erase).
                    if let Some(zones) = &ns.zones {
                        zones.empty_all();
                    }
                }
                drop(namespaces);
                block_io(&self.subsystem, None);
                sanitize.complete(true, op.ause, user_data_writes(&self.subsystem));
                tracing::debug!("sanitize completed");
                self.report();
            }
            Ended::Failed => self.fail(op),
            // The subsystem's last controller is going away.
            Ended::Stopped => {}
        }
    }

    /// The operation failed: failure mode, I/O gets Sanitize Failed.
    fn fail(&self, op: &Operation) {
        block_io(
            &self.subsystem,
            Some(Status::SANITIZE_FAILED.with_dnr(true)),
        );
        self.sanitize()
            .complete(false, op.ause, user_data_writes(&self.subsystem));
        tracing::debug!("sanitize failed");
        self.report();
    }

    /// Sanitize Operation Completed, to every live controller of the
    /// subsystem: the log (the same for all) tells how it ended, and so
    /// does each one's Persistent Event Log.
    fn report(&self) {
        let log = self.sanitize().log(user_data_writes(&self.subsystem), 0, 0);
        let event = sanitize_completion(log.sprog.get(), log.sstat.get());
        for (_, member) in self.subsystem.live() {
            member.sanitize_ended(&event);
        }
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

/// Commands that wrote user data so far, through every live controller
/// of the subsystem (Global Data Erased while it stays where a completed
/// sanitize left it).
fn user_data_writes(subsystem: &Namespaces) -> u64 {
    let each = subsystem.live().into_iter();
    each.map(|(_, m)| m.io_commands(crate::io::WRITES_USER_DATA))
        .fold(0, u64::wrapping_add)
}

/// The Sanitize Status log page (the subsystem's, the same through
/// every controller). The whole [`Shared`]: it reads the sanitize
/// state, the subsystem and the configuration.
pub(super) fn log(shared: &Shared) -> Vec<u8> {
    let namespaces = &shared.subsystem.namespaces;
    let log = shared.sanitize().log(
        user_data_writes(namespaces),
        namespaces.media_bytes(),
        shared.config.sanitize_rate,
    );
    zerocopy::IntoBytes::as_bytes(&*log).to_vec()
}
