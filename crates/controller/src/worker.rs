//! Queue workers: threads that fetch commands, execute them and post
//! completions, woken by doorbell traps — or polling, per doorbell mode.
//!
//! Each worker has a pending list (SQs whose tail moved, CQs whose head moved
//! while the worker waited on them) behind a mutex and condvar. A trap pushes
//! and notifies — the doorbell slot's flag makes repeated traps for a queued
//! SQ free — and the worker drains the list, processing each SQ for at most
//! its size in commands before requeueing it behind the others.
//!
//! Per [`DoorbellMode`]:
//! * `trap`: sleep on the condvar; run what traps kick.
//! * `shadow` (QEMU): as trap; each pass ends by publishing SQ EventIdx =
//!   tail seen, a full fence and a re-read of the shadow tail (and CQ
//!   EventIdx = head, fence, re-read head after posting).
//! * `adaptive`: once Doorbell Buffer Config is on, after a wake-up keep
//!   polling every owned SQ's shadow tail, EventIdx kept one behind what was
//!   seen so the host never needs to trap; after the worker's poll window
//!   (at most `idle_poll`: see [`crate::poll_window`]) without work, doze:
//!   poll every 25 µs, sleeping in between, for `doze`; then arm EventIdx =
//!   tail seen, fence, re-read every shadow tail, and sleep only if none
//!   moved. A host that moves a tail after our re-read
//!   sees the armed EventIdx and traps, and the trap's kick is in the pending
//!   list before the worker can wait: no lost wake-up. While the guest uses
//!   the INTx pin, CQ EventIdx is armed instead of kept behind, so the host's
//!   head update traps: that BAR access is where QEMU deasserts the line.
//! * `mmap-poll`: poll the shared doorbell page; when idle, spin for
//!   `idle_poll`, then sleep on the condvar for 10 µs doubling to 200 µs
//!   (the latency a request arriving then pays), woken early by kicks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use vnvme_blockdev::{BlockCompletion, Waker};
use vnvme_spec::log::async_event;
use vnvme_spec::regs::Doorbell;
use vnvme_spec::{Command, Completion, Status};

use crate::admin;
use crate::config::DoorbellMode;
use crate::inflight::{InFlight, Request};
use crate::io;
use crate::poll_window::PollWindow;
use crate::queue::{Cq, Sq};
use crate::shadow::{barrier, behind};
use crate::state::{Ctx, Outcome, Scratch, Session, Shared};

/// Longest mmap-poll back-off sleep.
const MAX_BACKOFF: Duration = Duration::from_micros(200);
const MIN_BACKOFF: Duration = Duration::from_micros(10);
/// Idle polls between `yield_now` calls, so a core shared with the guest's
/// vCPUs is not monopolised while polling.
const POLLS_PER_YIELD: u32 = 16;
/// A gap between two idle polls longer than this means the worker lost its
/// core meanwhile (see [`PollWindow::preempted`]).
const PREEMPTED: Duration = Duration::from_micros(50);
/// Adaptive mode's sleep between polls once the poll window has passed
/// ([`ControllerConfig::doze`](crate::ControllerConfig::doze)): the most a
/// request arriving then waits, and few enough wake-ups (at most 40,000 a
/// second) to leave the core to the threads that produce the requests.
const DOZE_INTERVAL: Duration = Duration::from_micros(25);
/// Timer slack of polling workers: the kernel's default (50 µs) would
/// stretch every short sleep well past [`DOZE_INTERVAL`].
const TIMER_SLACK_NS: u64 = 1_000;

#[derive(Debug, Default)]
struct Pending {
    sqs: Vec<u16>,
    cqs: Vec<u16>,
    /// An asynchronous backend may have completions to reap.
    completions: bool,
    stop: bool,
}

impl Pending {
    fn any(&self) -> bool {
        !self.sqs.is_empty() || !self.cqs.is_empty() || self.completions
    }
}

/// The kick side of a worker, shared with the trap path. Lives as long as the
/// controller; threads come and go with enable and reset.
#[derive(Debug, Default)]
pub(crate) struct WorkerShared {
    pending: Mutex<Pending>,
    cv: Condvar,
    /// Something is in `pending` (set and cleared with its lock held), for
    /// polling workers to check without the lock.
    kicked: AtomicBool,
}

impl WorkerShared {
    pub fn push(&self, db: Doorbell) {
        let mut p = self.pending.lock();
        match db {
            Doorbell::SqTail(q) => p.sqs.push(q),
            Doorbell::CqHead(q) => p.cqs.push(q),
        }
        self.kicked.store(true, Ordering::Release);
        drop(p);
        self.cv.notify_one();
    }

    /// A backend's waker: commands in flight may have finished.
    pub fn wake_for_completions(&self) {
        let mut p = self.pending.lock();
        p.completions = true;
        self.kicked.store(true, Ordering::Release);
        drop(p);
        self.cv.notify_one();
    }

    pub fn stop(&self) {
        self.pending.lock().stop = true;
        self.kicked.store(true, Ordering::Release);
        self.cv.notify_one();
    }

    /// Clears the stop flag and any leftover kicks (before threads start).
    pub fn rearm(&self) {
        let mut p = self.pending.lock();
        *p = Pending::default();
        self.kicked.store(false, Ordering::Release);
    }
}

/// Result of one pass over an SQ.
enum Pass {
    /// Nothing left.
    Idle,
    /// The budget ran out with commands left: requeue.
    More,
    /// The CQ is full; resume when its head moves.
    Stalled(u16),
}

/// What a pass does with EventIdx (shadow sources only; a no-op otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventIdxPolicy {
    /// QEMU: EventIdx = value seen, fence, re-read.
    Publish,
    /// Adaptive while polling: EventIdx = value seen - 1 (mod 2^16), where
    /// neither the Linux nor the SPDK need-event test fires for any move the
    /// host can make (short of filling the ring completely).
    Behind,
}

struct Local {
    sqs: Vec<u16>,
    cqs: Vec<u16>,
    /// (sqid, cqid) waiting for CQ space.
    stalled: Vec<(u16, u16)>,
    /// CQs holding a coalesced interrupt.
    timers: Vec<u16>,
    scratch: Scratch,
    /// SQs this worker owns (polling modes), and the doorbell generation
    /// the list was built at.
    owned: Vec<u16>,
    generation: Option<u64>,
    inflight: InFlight,
    reaped: Vec<(Request, BlockCompletion)>,
    /// CQs posted to by the last reap, for one interrupt each.
    touched: Vec<u16>,
}

/// How long `take_kicks` may block.
#[derive(Debug, Clone, Copy)]
enum Wait {
    No,
    For(Duration),
    Until(Option<Instant>),
}

#[derive(Debug, Clone, Copy)]
enum Phase {
    Asleep,
    Polling {
        idle_since: Instant,
        idle_polls: u32,
        /// When the previous idle poll ran.
        last_poll: Instant,
    },
    /// Adaptive, after the poll window: short sleeps between polls, EventIdx
    /// still behind (the host does not trap), until `until`.
    Dozing {
        idle_since: Instant,
        until: Instant,
    },
}

/// The worker thread's body. Returns when stopped.
pub(crate) fn run(shared: Arc<Shared>, session: Arc<Session>, index: usize) {
    let Some(me) = shared.workers.get(index) else {
        return;
    };
    let mode = shared.config.doorbells;
    let policy = if mode == DoorbellMode::Adaptive {
        EventIdxPolicy::Behind
    } else {
        EventIdxPolicy::Publish
    };
    let mut local = Local {
        sqs: Vec::new(),
        cqs: Vec::new(),
        stalled: Vec::new(),
        timers: Vec::new(),
        scratch: Scratch::default(),
        owned: Vec::new(),
        generation: None,
        inflight: InFlight::new(waker(&shared, index)),
        reaped: Vec::new(),
        touched: Vec::new(),
    };
    if matches!(mode, DoorbellMode::Adaptive | DoorbellMode::MmapPoll) {
        let slack = std::num::NonZeroU64::new(TIMER_SLACK_NS);
        if let Err(e) = rustix::thread::set_current_timer_slack(slack) {
            tracing::debug!("setting the worker's timer slack: {e}");
        }
    }
    let mut phase = Phase::Asleep;
    let mut backoff = MIN_BACKOFF;
    let mut window = if shared.config.adaptive_window {
        PollWindow::new(shared.config.idle_poll)
    } else {
        PollWindow::fixed(shared.config.idle_poll)
    };
    // Adaptive: when the worker last had work before it went to sleep.
    let mut slept_after: Option<Instant> = None;
    loop {
        let mut wait = match (phase, mode) {
            (Phase::Polling { .. }, _) => Wait::No,
            (Phase::Dozing { .. }, _) => Wait::For(DOZE_INTERVAL),
            (Phase::Asleep, DoorbellMode::MmapPoll) => Wait::For(backoff),
            (Phase::Asleep, _) => Wait::Until(next_deadline(&shared, &local.timers)),
        };
        // Backend completions wake the worker only while it sleeps: turn
        // their wakers on, then reap what came before.
        let mut work = 0;
        if !matches!(wait, Wait::No) && !local.inflight.is_empty() {
            local.inflight.set_waking(true);
            work = complete_in_flight(&shared, &session, &mut local, policy);
            if work > 0 {
                wait = Wait::No;
            }
        }
        let Some((slept, kicked)) = take_kicks(me, &mut local, wait) else {
            return;
        };
        local.inflight.set_waking(false);
        work += run_kicked(&shared, &session, &mut local, policy);
        work += complete_in_flight(&shared, &session, &mut local, policy);
        let polls = match mode {
            DoorbellMode::MmapPoll => true,
            DoorbellMode::Adaptive => shared.dbbuf_on.load(Ordering::Acquire),
            DoorbellMode::Trap | DoorbellMode::Shadow => false,
        };
        if polls {
            work += poll_owned(&shared, &session, &mut local, index, policy);
            work += complete_in_flight(&shared, &session, &mut local, policy);
        }
        if slept && (kicked || work > 0) {
            shared.stats.worker_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        fire_timers(&shared, &session, &mut local.timers);
        if !polls {
            phase = Phase::Asleep;
            continue;
        }
        let now = Instant::now();
        if mode == DoorbellMode::Adaptive && work > 0 {
            match phase {
                Phase::Polling { idle_since, .. } | Phase::Dozing { idle_since, .. } => {
                    window.found(now.saturating_duration_since(idle_since));
                }
                Phase::Asleep => {
                    if let Some(t) = slept_after.take() {
                        window.woke(now.saturating_duration_since(t));
                    }
                }
            }
        }
        phase = match phase {
            _ if work > 0 => {
                backoff = MIN_BACKOFF;
                Phase::Polling {
                    idle_since: now,
                    idle_polls: 0,
                    last_poll: now,
                }
            }
            // A kick with nothing to do still starts a polling period: the
            // host is active.
            Phase::Asleep if mode == DoorbellMode::Adaptive && kicked => Phase::Polling {
                idle_since: now,
                idle_polls: 0,
                last_poll: now,
            },
            Phase::Asleep => {
                if slept {
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Phase::Asleep
            }
            Phase::Polling {
                idle_since,
                idle_polls,
                last_poll,
            } => {
                // Idle polls take well under a microsecond: a longer gap
                // means another thread had this core. Polling on is taking
                // it from someone (the guest's vCPUs, QEMU): stop and sleep.
                if mode == DoorbellMode::Adaptive
                    && idle_polls > 0
                    && now.saturating_duration_since(last_poll) > PREEMPTED
                {
                    window.preempted();
                }
                let limit = match mode {
                    DoorbellMode::Adaptive => window.current(),
                    _ => shared.config.idle_poll,
                };
                if now.saturating_duration_since(idle_since) < limit {
                    if idle_polls % POLLS_PER_YIELD == POLLS_PER_YIELD - 1 {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                    Phase::Polling {
                        idle_since,
                        idle_polls: idle_polls.wrapping_add(1),
                        last_poll: Instant::now(),
                    }
                } else if mode == DoorbellMode::Adaptive {
                    window.expired();
                    if shared.config.doze.is_zero() {
                        arm_or_sleep(&shared, &session, &local, idle_since, now, &mut slept_after)
                    } else {
                        Phase::Dozing {
                            idle_since,
                            until: now + shared.config.doze,
                        }
                    }
                } else {
                    backoff = MIN_BACKOFF;
                    Phase::Asleep
                }
            }
            Phase::Dozing { idle_since, until } if now < until => {
                Phase::Dozing { idle_since, until }
            }
            Phase::Dozing { idle_since, .. } => {
                arm_or_sleep(&shared, &session, &local, idle_since, now, &mut slept_after)
            }
        };
    }
}

/// Adaptive, idle for the whole window: arm EventIdx, then sleep unless a
/// tail moved meanwhile.
fn arm_or_sleep(
    shared: &Shared,
    session: &Session,
    local: &Local,
    idle_since: Instant,
    now: Instant,
    slept_after: &mut Option<Instant>,
) -> Phase {
    if arm(shared, session, local) {
        Phase::Polling {
            idle_since: now,
            idle_polls: 0,
            last_poll: now,
        }
    } else {
        *slept_after = Some(idle_since);
        Phase::Asleep
    }
}

/// Takes the pending kicks into `local`, blocking as `wait` allows. Returns
/// `None` when stopped, else whether it blocked and whether there were kicks.
fn take_kicks(me: &WorkerShared, local: &mut Local, wait: Wait) -> Option<(bool, bool)> {
    if matches!(wait, Wait::No) && !me.kicked.load(Ordering::Acquire) {
        return Some((false, false));
    }
    let mut p = me.pending.lock();
    let mut slept = false;
    loop {
        if p.stop {
            return None;
        }
        if p.any() {
            break;
        }
        match wait {
            Wait::No => break,
            Wait::For(d) => {
                if slept {
                    break;
                }
                slept = true;
                me.cv.wait_for(&mut p, d);
            }
            Wait::Until(Some(at)) => {
                slept = true;
                if me.cv.wait_until(&mut p, at).timed_out() {
                    break;
                }
            }
            Wait::Until(None) => {
                slept = true;
                me.cv.wait(&mut p);
            }
        }
    }
    let kicked = p.any();
    p.completions = false;
    std::mem::swap(&mut p.sqs, &mut local.sqs);
    std::mem::swap(&mut p.cqs, &mut local.cqs);
    me.kicked.store(false, Ordering::Release);
    Some((slept, kicked))
}

/// Runs the kicked queues: CQ kicks release the SQs stalled on them; each
/// kicked SQ gets one pass. Returns the commands run.
fn run_kicked(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    policy: EventIdxPolicy,
) -> u32 {
    for cqid in std::mem::take(&mut local.cqs) {
        local.stalled.retain(|&(sq, cq)| {
            if cq == cqid {
                local.sqs.push(sq);
                false
            } else {
                true
            }
        });
    }
    let sqs = std::mem::take(&mut local.sqs);
    let mut work = 0;
    for &qid in &sqs {
        shared.doorbells.take_pending(Doorbell::SqTail(qid));
        work += run_pass(shared, session, local, qid, policy);
    }
    local.sqs = sqs;
    local.sqs.clear();
    work
}

/// One pass over SQ `qid`, with its outcome recorded.
fn run_pass(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    qid: u16,
    policy: EventIdxPolicy,
) -> u32 {
    let mut ctx = Ctx {
        shared,
        session,
        scratch: &mut local.scratch,
        inflight: &mut local.inflight,
    };
    let (pass, done) = process_sq(&mut ctx, qid, &mut local.timers, policy);
    match pass {
        Pass::Idle => {}
        Pass::More => shared.kick_sq(qid),
        Pass::Stalled(cqid) => {
            if !local.stalled.contains(&(qid, cqid)) {
                local.stalled.push((qid, cqid));
            }
        }
    }
    done
}

/// Polling modes: one pass over every SQ this worker owns.
fn poll_owned(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    index: usize,
    policy: EventIdxPolicy,
) -> u32 {
    let generation = shared.doorbells.generation();
    if local.generation != Some(generation) {
        local.owned.clear();
        for qid in 0..shared.doorbells.queue_ids() {
            let qid = qid as u16;
            if shared.doorbells.owned_by(Doorbell::SqTail(qid), index) {
                local.owned.push(qid);
            }
        }
        local.generation = Some(generation);
    }
    let owned = std::mem::take(&mut local.owned);
    let mut work = 0;
    for &qid in &owned {
        work += run_pass(shared, session, local, qid, policy);
    }
    local.owned = owned;
    work
}

/// Adaptive mode, before sleeping: EventIdx = tail seen for every owned SQ,
/// a full fence, then re-read every shadow tail. Returns `true` if one moved
/// (keep polling). Either that re-read sees a host's new tail, or the host's
/// EventIdx read (after its own fence) sees ours and it traps.
fn arm(shared: &Shared, session: &Session, local: &Local) -> bool {
    shared.stats.eventidx_arms.fetch_add(1, Ordering::Relaxed);
    let mem = &*session.mem;
    let with_sq = |qid: u16, f: &mut dyn FnMut(&mut Sq)| {
        if let Some(slot) = shared.sqs.get(usize::from(qid)) {
            if let Some(sq) = slot.lock().as_mut() {
                f(sq);
            }
        }
    };
    let mut seen = Vec::with_capacity(local.owned.len());
    for &qid in &local.owned {
        with_sq(qid, &mut |sq| {
            let tail = sq.tail;
            sq.event_idx
                .publish(shared, qid, sq.source, tail as u16, true, mem);
            seen.push((qid, tail));
        });
    }
    barrier();
    let mut moved = false;
    for &(qid, tail) in &seen {
        with_sq(qid, &mut |sq| {
            sq.refresh_tail(shared, mem);
            moved |= sq.tail != tail;
        });
    }
    moved
}

/// Aggregation Time of the Interrupt Coalescing feature.
fn aggregation_time(shared: &Shared) -> Duration {
    let c = shared.coalescing.load(Ordering::Relaxed);
    Duration::from_micros(u64::from((c >> 8) & 0xFF) * 100)
}

fn next_deadline(shared: &Shared, timers: &[u16]) -> Option<Instant> {
    if timers.is_empty() {
        return None;
    }
    // Coarse: wake after one aggregation time and re-check every CQ.
    Some(Instant::now() + aggregation_time(shared).max(Duration::from_micros(50)))
}

fn fire_timers(shared: &Shared, session: &Session, timers: &mut Vec<u16>) {
    timers.retain(|&cqid| {
        let Some(slot) = shared.cqs.get(usize::from(cqid)) else {
            return false;
        };
        let mut g = slot.lock();
        match g.as_mut() {
            Some(cq) => !settle_interrupt(shared, session, cq, Instant::now()),
            None => false,
        }
    });
}

/// Raises the CQ's interrupt now or leaves it for coalescing (§5.27.1.6).
/// Returns `true` when nothing is left pending.
fn settle_interrupt(shared: &Shared, session: &Session, cq: &mut Cq, now: Instant) -> bool {
    if cq.irq_pending == 0 {
        return true;
    }
    let c = shared.coalescing.load(Ordering::Relaxed);
    let thr_z = c & 0xFF;
    let time = aggregation_time(shared);
    let exempt = cq.qid == 0
        || time.is_zero()
        || shared
            .coalescing_disabled
            .get(usize::from(cq.iv))
            .is_some_and(|d| d.load(Ordering::Relaxed));
    let due = exempt
        || cq.irq_pending > thr_z
        || cq
            .irq_since
            .is_none_or(|t| now.saturating_duration_since(t) >= time);
    if due {
        raise(shared, session, cq);
    }
    due
}

fn raise(shared: &Shared, session: &Session, cq: &mut Cq) {
    cq.irq_pending = 0;
    cq.irq_since = None;
    if !cq.ien {
        return;
    }
    if !session.irq.msix_enabled()
        && shared.intm.load(Ordering::Acquire) & (1u32 << (cq.iv & 31)) != 0
    {
        shared.intx_held.store(true, Ordering::Release);
        return;
    }
    session.irq.signal(cq.iv);
    if let Some(q) = shared.stats.queue(cq.qid) {
        q.interrupts.fetch_add(1, Ordering::Relaxed);
    }
}

/// Reads the CQ head; a bad value is ignored, counted and reported.
fn refresh_cq_head(shared: &Shared, session: &Session, cq: &mut Cq) {
    if cq.refresh_head(shared, &*session.mem).is_err() {
        if let Some(q) = shared.stats.queue(cq.qid) {
            q.invalid_doorbell_writes.fetch_add(1, Ordering::Relaxed);
        }
        shared.async_event(async_event::TYPE_ERROR, 0x01, 0x01);
    }
}

/// CQ EventIdx = head, fence, re-read the head: the host's next head update
/// traps (QEMU after posting; every mode when the CQ is full and we need the
/// head to move).
/// Unless `force`, an EventIdx already equal to the head is not rewritten
/// (a stalled queue polled again).
fn arm_cq(shared: &Shared, session: &Session, cq: &mut Cq, force: bool) {
    let head = cq.head as u16;
    if cq
        .event_idx
        .publish(shared, cq.qid, cq.source, head, force, &*session.mem)
    {
        barrier();
        refresh_cq_head(shared, session, cq);
    }
}

/// Adaptive: CQ EventIdx one behind the head seen (the host never traps on
/// a head update unless the worker arms it because the CQ is full).
///
/// Except while the guest uses the INTx pin: then EventIdx = head, so the
/// host's next head update traps. QEMU deasserts the line only at a BAR
/// access; without one after the host reaped, the line would stay asserted
/// and the guest's interrupt controller would redeliver it endlessly.
fn publish_cq_behind(shared: &Shared, session: &Session, cq: &mut Cq) {
    if cq.ien && !session.irq.msix_enabled() {
        arm_cq(shared, session, cq, false);
        return;
    }
    let ei = behind(cq.head as u16);
    cq.event_idx
        .publish(shared, cq.qid, cq.source, ei, false, &*session.mem);
}

/// The admin queue's sources follow Doorbell Buffer Config, which runs on
/// this worker while it holds the admin queue's locks.
fn refresh_admin_sources(shared: &Shared, sq: &mut Sq, cq: &mut Cq) {
    let s = shared.source_for(Doorbell::SqTail(0));
    if s != sq.source {
        sq.set_source(s);
    }
    let c = shared.source_for(Doorbell::CqHead(0));
    if c != cq.source {
        cq.set_source(c);
    }
}

/// One bounded pass over SQ `qid`: at most its size in commands. Returns
/// how the pass ended and the commands it ran.
fn process_sq(
    ctx: &mut Ctx<'_>,
    qid: u16,
    timers: &mut Vec<u16>,
    policy: EventIdxPolicy,
) -> (Pass, u32) {
    let shared = ctx.shared;
    let session = ctx.session;
    let Some(sq_slot) = shared.sqs.get(usize::from(qid)) else {
        return (Pass::Idle, 0);
    };
    let mut sq_guard = sq_slot.lock();
    let Some(sq) = sq_guard.as_mut().filter(|sq| sq.deleting.is_none()) else {
        return (Pass::Idle, 0);
    };
    let Some(cq_slot) = shared.cqs.get(usize::from(sq.cqid)) else {
        return (Pass::Idle, 0);
    };
    let mut cq_guard = cq_slot.lock();
    let Some(cq) = cq_guard.as_mut() else {
        return (Pass::Idle, 0);
    };
    if shared.fatal.load(Ordering::Acquire) {
        return (Pass::Idle, 0);
    }
    let mem = &*session.mem;
    sq.refresh_tail(shared, mem);
    if policy == EventIdxPolicy::Behind && !sq.is_empty() {
        // Before posting: a host that reaps what this pass posts must
        // already see EventIdx behind its head, or it would trap. (Not over
        // an EventIdx armed because the CQ is full.)
        refresh_cq_head(shared, session, cq);
        if !cq.is_full() {
            publish_cq_behind(shared, session, cq);
        }
    }
    let mut budget = sq.size;
    let mut done = 0u32;
    let pass = 'pass: loop {
        while !sq.is_empty() {
            if budget == 0 {
                break 'pass Pass::More;
            }
            refresh_cq_head(shared, session, cq);
            if cq.is_full() {
                // Ask the next head write to kick us (and, with shadow
                // doorbells, to trap), then look once more so a write that
                // raced with the flag is not lost.
                shared.doorbells.wait_for_head(Doorbell::CqHead(cq.qid));
                arm_cq(shared, session, cq, false);
                refresh_cq_head(shared, session, cq);
                if cq.is_full() {
                    break 'pass Pass::Stalled(cq.qid);
                }
            }
            let cmd = match sq.pop(mem) {
                Ok(cmd) => cmd,
                Err(_) => {
                    shared.set_fatal("submission queue entry unreadable");
                    return (Pass::Idle, done);
                }
            };
            budget -= 1;
            done += 1;
            shared.stats.command(qid, cmd.opcode());
            let outcome = if qid == 0 {
                admin::execute(ctx, &cmd)
            } else {
                io::execute(ctx, &cmd)
            };
            match outcome {
                Outcome::Done { dw0, status } => {
                    if !post(shared, session, sq.head as u16, qid, cq, &cmd, dw0, status) {
                        return (Pass::Idle, done);
                    }
                }
                Outcome::Submitted(token) => ctx.inflight.bind(token, sq, cq),
                Outcome::Deferred => {}
            }
        }
        let tail = sq.tail as u16;
        match policy {
            EventIdxPolicy::Publish => {
                if sq
                    .event_idx
                    .publish(shared, qid, sq.source, tail, true, mem)
                {
                    barrier();
                    sq.refresh_tail(shared, mem);
                    if !sq.is_empty() {
                        continue 'pass;
                    }
                }
            }
            EventIdxPolicy::Behind => {
                sq.event_idx
                    .publish(shared, qid, sq.source, behind(tail), false, mem);
            }
        }
        break Pass::Idle;
    };
    if qid == 0 {
        refresh_admin_sources(shared, sq, cq);
        deliver_events(shared, session, cq, sq.head as u16);
        finish_deletions(shared, session, cq, sq.head as u16);
    }
    if !matches!(pass, Pass::Stalled(_)) {
        match policy {
            EventIdxPolicy::Publish if done > 0 => arm_cq(shared, session, cq, true),
            EventIdxPolicy::Publish => {}
            EventIdxPolicy::Behind => publish_cq_behind(shared, session, cq),
        }
    }
    if !settle_interrupt(shared, session, cq, Instant::now()) && !timers.contains(&cq.qid) {
        timers.push(cq.qid);
    }
    (pass, done)
}

/// Posts the completion of `cmd`, fetched from SQ `sqid`, to `cq`; counts
/// it and logs a failure. Returns `false` (and sets CSTS.CFS) if the CQ is
/// unwritable.
#[allow(clippy::too_many_arguments)]
fn post(
    shared: &Shared,
    session: &Session,
    sq_head: u16,
    sqid: u16,
    cq: &mut Cq,
    cmd: &Command,
    dw0: u32,
    status: Status,
) -> bool {
    shared.stats.completion(sqid, status);
    if !status.is_success() {
        shared.log_error(sqid, cmd, status);
    }
    let cqe = Completion::new(dw0, sq_head, sqid, cmd.cid(), false, status);
    if cq.post(&*session.mem, cqe).is_err() {
        shared.set_fatal("completion queue unwritable");
        return false;
    }
    true
}

/// The waker a worker gives its asynchronous backends.
fn waker(shared: &Arc<Shared>, index: usize) -> Waker {
    let shared = Arc::clone(shared);
    Arc::new(move || {
        if let Some(w) = shared.workers.get(index) {
            w.wake_for_completions();
        }
    })
}

/// Posts the completions of commands that finished on asynchronous
/// backends, then settles each CQ's interrupt once. Returns how many.
fn complete_in_flight(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    policy: EventIdxPolicy,
) -> u32 {
    if local.inflight.is_empty() {
        return 0;
    }
    let mut reaped = std::mem::take(&mut local.reaped);
    local.inflight.reap(&mut reaped);
    let done = reaped.len() as u32;
    for (request, completion) in reaped.drain(..) {
        if let Some(cqid) = complete_one(shared, session, local, &request, &completion, policy) {
            if !local.touched.contains(&cqid) {
                local.touched.push(cqid);
            }
        }
        if let Some(buf) = completion.buf {
            local.inflight.recycle(buf);
        }
    }
    local.reaped = reaped;
    for cqid in local.touched.drain(..) {
        let Some(slot) = shared.cqs.get(usize::from(cqid)) else {
            continue;
        };
        if let Some(cq) = slot.lock().as_mut() {
            if !settle_interrupt(shared, session, cq, Instant::now())
                && !local.timers.contains(&cqid)
            {
                local.timers.push(cqid);
            }
        }
    }
    done
}

/// Finishes one command that was in flight and posts its completion into
/// the entry reserved for it. A completion whose SQ or CQ is gone (deleted,
/// or the controller reset) is dropped: the command was aborted. Returns
/// the CQ posted to.
fn complete_one(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    request: &Request,
    completion: &BlockCompletion,
    policy: EventIdxPolicy,
) -> Option<u16> {
    let mut sq_guard = shared.sqs.get(usize::from(request.sqid))?.lock();
    let mut cq_guard = shared.cqs.get(usize::from(request.cqid))?.lock();
    let cq = cq_guard
        .as_mut()
        .filter(|cq| cq.instance == request.cq_instance)?;
    // Full (with this entry reserved): an SQ may be stalled on this CQ,
    // with CQ EventIdx armed for the head update that releases it.
    let stalled = cq.is_full();
    cq.reserved = cq.reserved.saturating_sub(1);
    let sq = sq_guard
        .as_mut()
        .filter(|sq| sq.instance == request.sq_instance)?;
    sq.in_flight = sq.in_flight.saturating_sub(1);
    if sq.deleting.is_some() && sq.in_flight == 0 {
        // The admin queue's worker completes the Delete.
        shared.kick_sq(0);
    }
    if shared.fatal.load(Ordering::Acquire) {
        return None;
    }
    let mut ctx = Ctx {
        shared,
        session,
        scratch: &mut local.scratch,
        inflight: &mut local.inflight,
    };
    let status = io::finish(&mut ctx, request, completion);
    refresh_cq_head(shared, session, cq);
    if policy == EventIdxPolicy::Behind && !stalled {
        // As in `process_sq`: EventIdx behind the head before posting (not
        // over one armed for a stalled SQ).
        publish_cq_behind(shared, session, cq);
    }
    if !post(
        shared,
        session,
        sq.head as u16,
        sq.qid,
        cq,
        &request.cmd,
        0,
        status,
    ) {
        return None;
    }
    if policy == EventIdxPolicy::Publish {
        arm_cq(shared, session, cq, true);
    }
    Some(cq.qid)
}

/// Completes the Delete I/O Submission Queue commands that waited for
/// their SQ's commands in flight, now done. Runs on the admin queue's
/// worker, which holds the admin queue's locks (then SQ locks: lock order).
fn finish_deletions(shared: &Shared, session: &Session, cq: &mut Cq, sq_head: u16) {
    if shared.deleting_sqs.load(Ordering::Acquire) == 0 {
        return;
    }
    for slot in shared.sqs.iter().skip(1) {
        refresh_cq_head(shared, session, cq);
        if cq.is_full() {
            return;
        }
        let mut g = slot.lock();
        let cid = match g.as_ref() {
            Some(sq) if sq.in_flight == 0 => sq.deleting,
            _ => None,
        };
        let Some(cid) = cid else {
            continue;
        };
        admin::queues::remove_sq(shared, &mut g);
        shared.deleting_sqs.fetch_sub(1, Ordering::AcqRel);
        let mut delete = Command::default();
        delete.set_cid(cid);
        if !post(shared, session, sq_head, 0, cq, &delete, 0, Status::SUCCESS) {
            return;
        }
    }
}

/// Completes outstanding Asynchronous Event Requests with queued events.
fn deliver_events(shared: &Shared, session: &Session, cq: &mut Cq, sq_head: u16) {
    loop {
        refresh_cq_head(shared, session, cq);
        if cq.is_full() {
            return;
        }
        let (cid, dw0) = {
            let mut e = shared.events.lock();
            if e.outstanding.is_empty() || e.queue.is_empty() {
                return;
            }
            let cid = e.outstanding.remove(0);
            let Some(dw0) = e.queue.pop_front() else {
                return;
            };
            (cid, dw0)
        };
        shared.stats.completion(0, Status::SUCCESS);
        let cqe = Completion::new(dw0, sq_head, 0, cid, false, Status::SUCCESS);
        if cq.post(&*session.mem, cqe).is_err() {
            shared.set_fatal("completion queue unwritable");
            return;
        }
    }
}
