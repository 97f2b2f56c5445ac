//! Queue workers: threads that fetch commands, execute them and post
//! completions, woken by doorbell traps — or polling, per doorbell mode.
//!
//! A worker takes the kicks in its [`Mailbox`](crate::queue::mailbox::Mailbox)
//! (SQs whose tail moved, CQs whose head moved while it waited on them) and
//! processes each kicked SQ for at most its size in commands before
//! requeueing it behind the others. How it waits, and whether it also polls
//! the SQs it owns, is its wake policy ([`wake`]), one per
//! [`DoorbellMode`]. The completion side (CQ entries, CQ EventIdx,
//! interrupts) is in [`cq`]; completions of asynchronous backends in
//! [`reap`].

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vnvme_blockdev::BlockCompletion;
use vnvme_spec::regs::Doorbell;
use vnvme_spec::{AdminOpcode, Status};

mod clock;
mod cq;
pub(crate) mod group;
mod held;
mod idle_table;
mod look;
mod ops;
mod owe;
mod poll_window;
mod priority;
mod reap;
mod wake;

use clock::Clock;
use cq::{
    arm_cq, deliver_events, fire_timers, post, post_answers, publish_cq_behind, refresh_cq_head,
    settle_interrupt,
};
use look::PageLook;
use priority::Priority;
use reap::{complete_in_flight, waker};
use wake::{
    Adaptive, MmapPoll, OnKick, Round, Wake, MAX_ADMIN_BACKOFF, MAX_ADMIN_PAGE_BACKOFF,
    MAX_BACKOFF, MAX_PAGE_BACKOFF,
};

use crate::admin;
use crate::command::{Ctx, Outcome, Scratch};
use crate::config::{ControllerConfig, DoorbellMode};
use crate::doorbell::{barrier, behind, Doorbells};
use crate::faults::Held;
use crate::inflight::{InFlight, Request};
use crate::io;
use crate::queue::mailbox::Wait;
use crate::queue::rings::{RingOp, Rings};
use crate::queue::{Cq, Sq};
use crate::state::{Session, Shared, ADMIN_WORKER};
use poll_window::PollWindow;

/// Timer slack of polling workers: the kernel's default (50 µs) would
/// stretch every short sleep (adaptive dozes for 25 µs) far too long.
const TIMER_SLACK_NS: u64 = 1_000;

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
    /// The SQs and CQs this worker serves: its own, no lock per pass.
    rings: Rings,
    sqs: Vec<u16>,
    cqs: Vec<u16>,
    /// Ring operations taken from the mailbox ([`ops`]).
    ops: Vec<RingOp>,
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
    /// Commands a fault holds back ([`held`]).
    held: Vec<Held>,
    /// I/O workers in the idle scheduling class, watched for starving.
    priority: Option<Priority>,
    /// Commands a pass over one SQ runs at most besides the queue's size
    /// ([`GROUP_PASS_BUDGET`] in a poll group).
    budget: u32,
}

/// The worker thread's body. Returns when stopped.
pub(crate) fn run(shared: Arc<Shared>, session: Arc<Session>, index: usize) {
    set_timer_slack(&shared.config);
    let Some(mut worker) = member(shared, session, index, false) else {
        return;
    };
    loop {
        let wait = worker.prepare(&mut Clock::default());
        if !worker.round(Take::Block(wait)) {
            return;
        }
    }
}

/// A pause for a save (a live upgrade, a supervised server's checkpoint)
/// lets the commands in flight on a backend complete before the worker
/// stops, within the pause's bound: a save refuses while one is there.
/// Those left when the bound runs out wait, on their backend queues, for
/// the next worker ([`reap::park`]). Nothing new is fetched
/// meanwhile. The whole [`Shared`]: the bound is the queue table's, and
/// completing needs it ([`complete_in_flight`]).
fn drain_in_flight(shared: &Shared, session: &Session, local: &mut Local, policy: EventIdxPolicy) {
    let Some(until) = *shared.queues.drain_until.lock() else {
        return;
    };
    while !local.inflight.is_empty() && Instant::now() < until {
        if complete_in_flight(shared, session, local, policy) == 0 {
            std::thread::sleep(DRAIN_POLL);
        }
    }
}

/// How often a draining worker looks for its backends' completions.
const DRAIN_POLL: Duration = Duration::from_micros(50);

/// Polling modes sleep for tens of microseconds: the kernel's default
/// slack would stretch them.
fn set_timer_slack(config: &ControllerConfig) {
    if matches!(
        config.doorbells,
        DoorbellMode::Adaptive | DoorbellMode::MmapPoll
    ) {
        let slack = std::num::NonZeroU64::new(TIMER_SLACK_NS);
        if let Err(e) = rustix::thread::set_current_timer_slack(slack) {
            tracing::debug!("setting the worker's timer slack: {e}");
        }
    }
}

/// How a round takes its mailbox's kicks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Take {
    /// A thread of its own: block as the wait allows.
    Block(Wait),
    /// A poll group member: take what is there now; `slept` says whether
    /// the member waited (its wait was not [`Wait::No`]) since its last
    /// round.
    Now { slept: bool },
}

/// A queue worker as a value, one round at a time: a thread of its own
/// ([`run`]) or a member of a poll group ([`group`]) runs it.
pub(crate) trait Member: Send {
    /// Before a round: how long the worker may wait for kicks (reaping
    /// what its backends finished meanwhile, and letting go of guest
    /// memory if it may wait); `clock` is now, read if needed.
    fn prepare(&mut self, clock: &mut Clock) -> Wait;
    /// One round. Returns `false` once stopped (the controller's reset or
    /// end): the member is done.
    fn round(&mut self, take: Take) -> bool;
    /// Whether kicks wait in the mailbox (a group looks before waking a
    /// member early).
    fn kicked(&self) -> bool;
    /// Whether, after its last round, the member is idle and waits only to
    /// look at a mapped doorbell page again (its back-off): a round any
    /// earlier serves it as well.
    fn looks(&self) -> bool;
    /// For a member that [`looks`](Self::looks) and has no kicks waiting
    /// (its group knows: no mailbox of the group rang, or it read this
    /// one's): looks at its doorbell page without a round ([`look`]).
    /// `Some(wait)`: nothing came, this counted as an idle round (its
    /// back-off grew), it still only looks, and `wait` is what
    /// [`prepare`](Self::prepare) would now say (nothing to reap, no guest
    /// memory touched to let go of); `None`: it needs a round. `clock` is
    /// the group's reading of this wake-up.
    fn look(&mut self, clock: &mut Clock) -> Option<Wait>;
    /// For a member that looks and whose looks would change nothing but
    /// its next deadline: what its group needs to look for it without
    /// touching it ([`look::Card`]).
    fn card(&self) -> Option<look::Card>;
}

/// Worker `index` of `shared` with its wake policy, as a [`Member`]; `None`
/// if the controller has no such worker. A poll group member has no
/// scheduling priority of its own: its thread serves other controllers.
pub(crate) fn member(
    shared: Arc<Shared>,
    session: Arc<Session>,
    index: usize,
    in_group: bool,
) -> Option<Box<dyn Member>> {
    let config = &shared.config;
    Some(match config.doorbells {
        DoorbellMode::Trap | DoorbellMode::Shadow => {
            Box::new(Worker::new(shared, session, index, in_group, OnKick)?)
        }
        DoorbellMode::MmapPoll if index == ADMIN_WORKER => {
            let wake = MmapPoll::new(Duration::ZERO, MAX_ADMIN_BACKOFF);
            Box::new(Worker::new(shared, session, index, in_group, wake)?)
        }
        DoorbellMode::MmapPoll => {
            let wake = MmapPoll::new(config.idle_poll, MAX_BACKOFF);
            Box::new(Worker::new(shared, session, index, in_group, wake)?)
        }
        DoorbellMode::Adaptive => {
            let window = if config.adaptive_window {
                PollWindow::new(config.idle_poll)
            } else {
                PollWindow::fixed(config.idle_poll)
            };
            let max_backoff = match index {
                _ if shared.doorbells.page().is_none() => None,
                ADMIN_WORKER => Some(MAX_ADMIN_PAGE_BACKOFF),
                _ => Some(MAX_PAGE_BACKOFF),
            };
            let wake = Adaptive::new(window, config.doze, max_backoff);
            Box::new(Worker::new(shared, session, index, in_group, wake)?)
        }
    })
}

/// Commands one pass over an SQ runs at most in a poll group, whatever the
/// queue's size: a deep queue of one controller yields the thread to the
/// other members after this many (round-robin with a budget per pass).
const GROUP_PASS_BUDGET: u32 = 128;

/// One worker: its controller, wake policy and local state.
struct Worker<W> {
    shared: Arc<Shared>,
    session: Arc<Session>,
    index: usize,
    wake: W,
    local: Local,
    /// Work done by `prepare` (completions reaped before waiting).
    reaped: u32,
    look: PageLook,
}

impl<W: Wake> Worker<W> {
    fn new(
        shared: Arc<Shared>,
        session: Arc<Session>,
        index: usize,
        in_group: bool,
        wake: W,
    ) -> Option<Self> {
        shared.queues.mailboxes.get(index)?;
        let mut local = Local {
            rings: Rings::take(&shared.queues, index),
            sqs: Vec::new(),
            cqs: Vec::new(),
            ops: Vec::new(),
            stalled: Vec::new(),
            timers: Vec::new(),
            scratch: Scratch::default(),
            owned: Vec::new(),
            generation: None,
            // What the worker a pause stopped had still in flight.
            inflight: reap::adopt(&shared, index)
                .unwrap_or_else(|| InFlight::new(waker(&shared, index))),
            reaped: Vec::new(),
            touched: Vec::new(),
            held: Vec::new(),
            priority: (shared.config.idle_class && index != ADMIN_WORKER && !in_group)
                .then(|| Priority::new(Instant::now()))
                .flatten(),
            budget: if in_group {
                GROUP_PASS_BUDGET
            } else {
                u32::MAX
            },
        };
        local.held = shared
            .faults
            .adopt(|h| shared.queues.worker_for(h.cqid) == index);
        Some(Self {
            shared,
            session,
            index,
            wake,
            local,
            reaped: 0,
            look: PageLook::default(),
        })
    }
}

/// The worker loop, the same for every wake policy and whoever runs it:
/// take the mailbox's kicks (blocking as the policy allows), run the
/// kicked SQs, poll the owned ones if the policy polls, reap asynchronous
/// completions, then let the policy choose what comes next.
impl<W: Wake + Send> Member for Worker<W> {
    fn prepare(&mut self, clock: &mut Clock) -> Wait {
        let (shared, session) = (&*self.shared, &*self.session);
        let local = &mut self.local;
        let policy = W::EVENT_IDX;
        let wait = self.wake.wait(&shared.interrupts, local, clock);
        let mut wait = held::clamp(wait, &local.held);
        // Backend completions wake the worker only while it sleeps: turn
        // their wakers on, then reap what came before.
        let mut work = 0;
        if !matches!(wait, Wait::No) && !local.inflight.is_empty() {
            local.inflight.set_waking(true);
            work = complete_in_flight(shared, session, local, policy);
            if work > 0 {
                wait = Wait::No;
            }
        }
        if !matches!(wait, Wait::No) {
            // It may block: a DMA_UNMAP meanwhile must not wait for it.
            session.mem.quiesce();
        }
        self.reaped = work;
        wait
    }

    fn round(&mut self, take: Take) -> bool {
        let (shared, session) = (&*self.shared, &*self.session);
        let local = &mut self.local;
        let policy = W::EVENT_IDX;
        let Some(me) = shared.queues.mailboxes.get(self.index) else {
            return false;
        };
        let taken = match take {
            Take::Block(wait) => me.take(wait, &mut local.sqs, &mut local.cqs, &mut local.ops),
            Take::Now { slept } => me
                .take(Wait::No, &mut local.sqs, &mut local.cqs, &mut local.ops)
                .map(|(_, kicked)| (slept, kicked)),
        };
        let Some((slept, kicked)) = taken else {
            drain_in_flight(shared, session, local, policy);
            // A pause stops the workers without a reset: the commands held
            // back (a fault's delay, a QoS limit), and those still on a
            // backend after the drain, wait for the next ones (a reset
            // drops them).
            shared.faults.park(std::mem::take(&mut local.held));
            let inflight = std::mem::replace(
                &mut local.inflight,
                InFlight::new(waker(&self.shared, self.index)),
            );
            reap::park(shared, self.index, inflight);
            // The rings go back to the table, for a save or the next
            // workers (a reset clears them there).
            local.rings.put_back(&shared.queues);
            // Stopped: let go of guest memory now. A thread of its own
            // lets go as it ends; a poll group's thread goes on and may
            // sleep, and the client's DMA_UNMAP must not wait for it.
            session.mem.quiesce();
            return false;
        };
        // An idle worker's round: what the page says before it polls, for
        // the looks that may follow (poll groups only).
        let idle = matches!(take, Take::Now { .. }) && self.wake.looks();
        if idle {
            self.look.record(&shared.doorbells, local);
        }
        let mut work = std::mem::take(&mut self.reaped);
        local.inflight.set_waking(false);
        ops::apply(shared, session, local);
        work += held::release(shared, session, local, policy);
        work += run_kicked(shared, session, local, policy);
        work += complete_in_flight(shared, session, local, policy);
        let polled = self.wake.polls(&shared.doorbells);
        if polled {
            work += poll_owned(shared, session, local, self.index, policy);
            work += complete_in_flight(shared, session, local, policy);
        }
        if let Some(p) = &mut local.priority {
            p.check(Instant::now());
        }
        if slept && (kicked || work > 0) {
            shared.stats.worker_wakeups.fetch_add(1, Ordering::Relaxed);
        }
        fire_timers(shared, session, &mut local.rings, &mut local.timers);
        crate::crash_record::after_round(shared.crash.get(), &mut local.rings);
        let round = Round {
            work,
            slept,
            kicked,
            polled,
        };
        let mut clock = Clock::default();
        self.wake.after(
            round,
            &mut clock,
            &shared.doorbells,
            &shared.stats,
            session,
            local,
        );
        if idle {
            // Anything but a host's doorbell write also needs a round: a
            // look trusts the page only while nothing else waits (what
            // comes later, a kick or a completion, rings the mailbox).
            let idle = work == 0
                && !kicked
                && self.wake.looks()
                && local.timers.is_empty()
                && local.stalled.is_empty()
                && local.held.is_empty()
                && local.inflight.is_empty();
            self.look
                .settle(idle, self.wake.armed(), &shared.doorbells, local);
        }
        true
    }

    fn kicked(&self) -> bool {
        self.shared
            .queues
            .mailboxes
            .get(self.index)
            .is_some_and(|m| m.kicked())
    }

    fn looks(&self) -> bool {
        self.wake.looks()
    }

    fn look(&mut self, clock: &mut Clock) -> Option<Wait> {
        let (shared, session) = (&*self.shared, &*self.session);
        // What else may need a round was settled after the last one
        // (`PageLook::settle`); kicks are the group's to check.
        if self.reaped > 0 || !self.wake.looks() || !self.look.quiet(&shared.doorbells) {
            return None;
        }
        let round = Round {
            work: 0,
            slept: true,
            kicked: false,
            polled: self.wake.polls(&shared.doorbells),
        };
        self.wake.after(
            round,
            clock,
            &shared.doorbells,
            &shared.stats,
            session,
            &mut self.local,
        );
        let local = &self.local;
        let wait = self.wake.wait(&shared.interrupts, local, clock);
        Some(held::clamp(wait, &local.held))
    }

    fn card(&self) -> Option<look::Card> {
        if self.reaped > 0 || !self.wake.looks() || !self.local.held.is_empty() {
            return None;
        }
        let backoff = self.wake.steady()?;
        self.look.card(&self.shared, backoff)
    }
}

/// Runs the kicked queues: CQ kicks release the SQs stalled on them; each
/// kicked SQ gets one pass. Returns the commands run. The whole
/// [`Shared`]: as [`run_pass`].
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

/// One pass over SQ `qid`, with its outcome recorded. The whole
/// [`Shared`]: the pass's commands run with it ([`Ctx`]).
fn run_pass(
    shared: &Shared,
    session: &Session,
    local: &mut Local,
    qid: u16,
    policy: EventIdxPolicy,
) -> u32 {
    let mut ctx = Ctx {
        shared,
        qid,
        session,
        scratch: &mut local.scratch,
        inflight: &mut local.inflight,
    };
    let (pass, done) = process_sq(
        &mut ctx,
        &mut local.rings,
        qid,
        &mut local.timers,
        &mut local.held,
        policy,
        local.budget,
    );
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

/// Polling modes: one pass over every SQ this worker owns. The whole
/// [`Shared`]: as [`run_pass`].
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

/// The admin queue's sources follow Doorbell Buffer Config, which runs on
/// this worker while it holds the admin queue's rings.
fn refresh_admin_sources(doorbells: &Doorbells, sq: &mut Sq, cq: &mut Cq) {
    let s = doorbells.source_for(Doorbell::SqTail(0));
    if s != sq.source {
        sq.set_source(s);
    }
    let c = doorbells.source_for(Doorbell::CqHead(0));
    if c != cq.source {
        cq.set_source(c);
    }
}

/// One bounded pass over SQ `qid`: at most its size in commands. Returns
/// how the pass ended and the commands it ran.
fn process_sq(
    ctx: &mut Ctx<'_>,
    rings: &mut Rings,
    qid: u16,
    timers: &mut Vec<u16>,
    held: &mut Vec<Held>,
    policy: EventIdxPolicy,
    cap: u32,
) -> (Pass, u32) {
    let shared = ctx.shared;
    let session = ctx.session;
    let Some((sq, cq)) = rings.pair(qid).filter(|(sq, _)| sq.deleting.is_none()) else {
        return (Pass::Idle, 0);
    };
    if shared.lifecycle.fatal() {
        return (Pass::Idle, 0);
    }
    if qid == 0 && owe::owing(shared).is_none() && shared.queues.owed.reruns() {
        // Commands to run again go first, under a record: attaching it
        // kicks this SQ.
        return (Pass::Idle, 0);
    }
    let mem = &*session.mem;
    if qid == 0 {
        shared.doorbells.sync_admin_page();
    }
    sq.refresh_tail(&shared.doorbells, mem);
    // Behind: SQ EventIdx behind the tail just read is published before
    // this pass posts its first completion. A host that reaps what the
    // pass posts may then submit up to a ring past its commands: an
    // EventIdx left from an older pass would lie in that move (a trap at
    // every wrap of a short ring). Not right after reading the tail: the
    // host's move that ended there may not have read EventIdx yet, and
    // behind(tail) lies in that move.
    let mut sq_behind = policy == EventIdxPolicy::Behind && !sq.is_empty();
    if sq_behind {
        // Before posting: a host that reaps what this pass posts must
        // already see CQ EventIdx behind its head. (Not over an EventIdx
        // armed because the CQ is full.)
        refresh_cq_head(shared, session, cq);
        if !cq.is_full() {
            publish_cq_behind(shared, session, cq);
        }
    }
    let mut budget = sq.size.min(cap);
    let mut done = 0u32;
    // Admin commands a crash interrupted, run again before the SQ's next
    // entries (`saved_state::rerun`); only under a record, which owes
    // their completions to a slot as their first run did.
    let reruns = || qid == 0 && shared.queues.owed.reruns();
    let pass = 'pass: loop {
        while !sq.is_empty() || reruns() {
            if budget == 0 {
                break 'pass Pass::More;
            }
            // The head is read only when the CQ looks full: a stale head
            // only underestimates the room, and reading the host's line on
            // every command costs a cache miss each.
            if cq.is_full() {
                refresh_cq_head(shared, session, cq);
            }
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
            let again = reruns().then(|| shared.queues.owed.next_rerun());
            let cmd = match again.flatten().map_or_else(|| sq.pop(mem), Ok) {
                Ok(cmd) => cmd,
                Err(e) => {
                    shared.set_fatal(&format!(
                        "submission queue {qid} entry unreadable ({e}): the host's queue \
                         memory is not mapped"
                    ));
                    return (Pass::Idle, done);
                }
            };
            budget -= 1;
            done += 1;
            let started = shared.stats.command(qid, cmd.opcode()).then(Instant::now);
            let outcome = if sq.take_abort(cmd.cid()) {
                Outcome::Done {
                    dw0: 0,
                    status: Status::ABORTED_BY_REQUEST,
                }
            } else if qid == 0 {
                let outcome = admin::execute(ctx, &cmd);
                if owe::changes_state(&cmd) {
                    crate::crash_record::admin_done(shared.crash.get());
                }
                outcome
            } else {
                shared
                    .faults
                    .on_command(&cmd)
                    .and_then(|hit| held::hold(&shared.faults, held, sq, cq, &cmd, hit))
                    .or_else(|| held::throttle(shared, held, sq, cq, &cmd))
                    .unwrap_or_else(|| io::execute(ctx, &cmd))
            };
            if std::mem::take(&mut sq_behind) {
                let ei = behind(sq.tail as u16);
                sq.event_idx
                    .publish(&shared.doorbells, qid, sq.source, ei, false, mem);
            }
            let outcome = match outcome {
                Outcome::Fenced => match ctx.scratch.fence.take() {
                    Some(fence) => {
                        held::fence(held, sq, cq, &cmd, fence);
                        Outcome::Deferred
                    }
                    None => Outcome::ok(0),
                },
                outcome => outcome,
            };
            match outcome {
                // Supervised: an admin command's completion (but a read's:
                // Identify, Get Features), a reservation command's that
                // changed something, waits for a crash-area slot holding
                // its effect (`owe`).
                Outcome::Done { dw0, status } | Outcome::Owed { dw0, status }
                    if (qid == 0 && owe::changes_state(&cmd)
                        || matches!(outcome, Outcome::Owed { .. }))
                        && owe::owing(shared).is_some() =>
                {
                    if let Some(rec) = owe::owing(shared) {
                        owe::owe(shared, rec, sq, cq, &cmd, u64::from(dw0), status);
                    }
                }
                Outcome::Owed { dw0, status } | Outcome::Done { dw0, status } => {
                    let dw = u64::from(dw0);
                    if !post(shared, session, sq.head as u16, qid, cq, &cmd, dw, status) {
                        return (Pass::Idle, done);
                    }
                    shared.stats.latency(qid, started);
                }
                Outcome::Appended(lba) => {
                    let ok = Status::SUCCESS;
                    if !post(shared, session, sq.head as u16, qid, cq, &cmd, lba, ok) {
                        return (Pass::Idle, done);
                    }
                    shared.stats.latency(qid, started);
                }
                Outcome::Submitted(token) => {
                    ctx.inflight.bind(token, sq, cq, started);
                    crate::crash_record::fetched(shared.crash.get(), sq, cmd.cid());
                }
                // On an I/O queue only a hold defers (a fault, a QoS
                // limit, a fence).
                Outcome::Deferred | Outcome::Fenced if qid != 0 => {
                    crate::crash_record::fetched(shared.crash.get(), sq, cmd.cid());
                }
                // The admin queue's deferred commands (AERs, queue
                // deletions) are in its saved state, but an AER taken
                // after the last slot is not: recorded in flight, a
                // restore keeps it outstanding.
                Outcome::Deferred if cmd.opcode() == AdminOpcode::ASYNC_EVENT_REQUEST.0 => {
                    crate::crash_record::fetched(shared.crash.get(), sq, cmd.cid());
                }
                Outcome::Deferred | Outcome::Fenced => {}
            }
        }
        let tail = sq.tail as u16;
        match policy {
            EventIdxPolicy::Publish => {
                if sq
                    .event_idx
                    .publish(&shared.doorbells, qid, sq.source, tail, true, mem)
                {
                    barrier();
                    sq.refresh_tail(&shared.doorbells, mem);
                    if !sq.is_empty() {
                        continue 'pass;
                    }
                }
            }
            // Published before the first completion. An empty pass leaves
            // EventIdx alone: a sleeping worker polling the page after a
            // back-off must not take back the EventIdx it armed, or a host
            // that traps would wait for the back-off instead.
            EventIdxPolicy::Behind => {}
        }
        break Pass::Idle;
    };
    if qid == 0 {
        refresh_admin_sources(&shared.doorbells, sq, cq);
        deliver_events(shared, session, sq, cq);
        post_answers(shared, session, sq, cq);
    } else if done > 0 {
        shared.interrupts.fetched(cq, Instant::now());
    }
    if !owe::post_owed(shared, session, sq, cq) {
        return (Pass::Idle, done);
    }
    if !matches!(pass, Pass::Stalled(_)) {
        match policy {
            EventIdxPolicy::Publish if done > 0 => arm_cq(shared, session, cq, true),
            EventIdxPolicy::Publish => {}
            EventIdxPolicy::Behind => publish_cq_behind(shared, session, cq),
        }
    }
    if !settle_interrupt(shared, session, cq) && !timers.contains(&cq.qid) {
        timers.push(cq.qid);
    }
    (pass, done)
}
