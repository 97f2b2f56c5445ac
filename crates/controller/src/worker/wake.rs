//! Wake policies: how a worker learns of new work and what it does when it
//! finds none, one type per [`DoorbellMode`](crate::DoorbellMode). The
//! worker loop ([`super::run_with`]) is the same for all; a policy decides
//! how long the worker may block, whether it polls its SQs, and what comes
//! after a round.
//!
//! * [`OnKick`] (`trap` and `shadow`): sleep on the mailbox; run what traps
//!   kick. The two modes differ only in where a doorbell value comes from
//!   (register or shadow buffer) and in the EventIdx a pass publishes.
//! * [`Adaptive`]: once Doorbell Buffer Config is on, or at once where the
//!   doorbell page is offered, poll the shadow doorbells (or the page) while
//!   busy with EventIdx kept behind, doze, then arm EventIdx and sleep: until
//!   a trap, or with the page offered, for a growing back-off, since a
//!   client ringing through the page never traps. While requests are in
//!   flight on an asynchronous backend, a poll that finds nothing is
//!   followed by a sleep until one completes ([`BACKEND_WAIT`] at most),
//!   not by spinning: the storage may need this core to complete them.
//! * [`MmapPoll`]: poll the shared doorbell page, spin, then back off.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::clock::Clock;
use super::cq::next_deadline;
use super::{EventIdxPolicy, Local};
use crate::doorbell::barrier;
use crate::doorbell::Doorbells;
use crate::interrupts::Interrupts;
use crate::queue::mailbox::Wait;
use crate::state::Session;
use crate::stats::Stats;
use crate::worker::poll_window::PollWindow;

/// Longest mmap-poll back-off sleep of an I/O worker.
pub(super) const MAX_BACKOFF: Duration = Duration::from_micros(200);
/// Longest mmap-poll back-off sleep of the admin worker: admin commands are
/// rare and not latency critical, and an idle client should cost little.
pub(super) const MAX_ADMIN_BACKOFF: Duration = Duration::from_millis(1);
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
/// The longest a polling worker sleeps, after a round without work, while
/// its only business is requests in flight on an asynchronous backend (the
/// `file` backend's io_uring): their completion wakes it at once (the
/// backend's waker kicks the mailbox), and this bounds what a new command
/// that does not trap waits meanwhile, as a doze does. Spinning instead
/// would take the core the storage needs to finish them: io_uring's
/// workers, or a loop device's kernel thread, on a file in tmpfs.
const BACKEND_WAIT: Duration = DOZE_INTERVAL;
/// Longest sleep of an adaptive I/O worker whose doorbell page is offered:
/// the most a request that a page-ringing client sends to an idle
/// controller waits, and at most 1,000 idle wake-ups a second.
pub(super) const MAX_PAGE_BACKOFF: Duration = Duration::from_millis(1);
/// The same for the admin worker: admin commands are rare and not latency
/// critical, and an idle client should cost the server well under 2% of a
/// core.
pub(super) const MAX_ADMIN_PAGE_BACKOFF: Duration = Duration::from_millis(5);
/// After this long asleep the page back-off may grow five times longer (5
/// ms, 25 ms for the admin worker): a wake-up costs 10-25 µs of a core on
/// a virtual machine like the development one, so 1,000 a second cost an
/// idle QEMU guest's server 2.1% of a core (1.2% with this); only the first
/// request after a second of silence waits longer.
const DEEP_IDLE: Duration = Duration::from_secs(1);
const DEEP_IDLE_FACTOR: u32 = 5;

/// What one round of the worker loop did.
#[derive(Debug, Clone, Copy)]
pub(super) struct Round {
    /// Commands run and completions posted.
    pub work: u32,
    /// The worker blocked in its mailbox.
    pub slept: bool,
    /// Kicks were waiting (or arrived).
    pub kicked: bool,
    /// The round polled every owned SQ.
    pub polled: bool,
}

/// How a worker waits for work.
pub(super) trait Wake {
    /// What a pass over an SQ does with EventIdx.
    const EVENT_IDX: EventIdxPolicy;
    /// How long the worker may block in its mailbox before the next round
    /// (`clock`: now, read only if needed).
    fn wait(&self, interrupts: &Interrupts, local: &Local, clock: &mut Clock) -> Wait;
    /// Whether this round polls every SQ the worker owns (after the kicked
    /// ones).
    fn polls(&self, doorbells: &Doorbells) -> bool;
    /// After a round: what comes next (may arm EventIdx before sleeping).
    fn after(
        &mut self,
        round: Round,
        clock: &mut Clock,
        doorbells: &Doorbells,
        stats: &Stats,
        session: &Session,
        local: &mut Local,
    );
    /// Whether the worker is idle and its wait is only a back-off before
    /// it looks at the doorbell page again: a look any earlier serves it as
    /// well (a poll group gives all such members their looks on one
    /// wake-up).
    fn looks(&self) -> bool {
        false
    }
    /// Whether the worker armed SQ EventIdx before it slept (shadow
    /// doorbells then ring the register too).
    fn armed(&self) -> bool {
        false
    }
    /// For a worker that [`looks`](Self::looks): its back-off, if it is
    /// at its ceiling, so that an idle look changes nothing in the policy
    /// and the next wait is this long after it (a poll group then looks
    /// for the worker without touching it, see `look::Card`).
    fn steady(&self) -> Option<Duration> {
        None
    }
}

/// One idle poll's pause: a spin hint, and every few polls the core.
fn idle_pause(idle_polls: u32) {
    if idle_polls % POLLS_PER_YIELD == POLLS_PER_YIELD - 1 {
        std::thread::yield_now();
    } else {
        std::hint::spin_loop();
    }
}

/// `trap` and `shadow` modes: sleep until kicked (or a coalesced
/// interrupt's timer). A shadow pass ends by publishing SQ EventIdx = tail
/// seen, a full fence and a re-read of the shadow tail (QEMU's algorithm).
#[derive(Debug, Default)]
pub(super) struct OnKick;

impl Wake for OnKick {
    const EVENT_IDX: EventIdxPolicy = EventIdxPolicy::Publish;

    fn wait(&self, interrupts: &Interrupts, local: &Local, _: &mut Clock) -> Wait {
        Wait::Until(next_deadline(interrupts, &local.rings, &local.timers))
    }

    fn polls(&self, _: &Doorbells) -> bool {
        false
    }

    fn after(
        &mut self,
        _: Round,
        _: &mut Clock,
        _: &Doorbells,
        _: &Stats,
        _: &Session,
        _: &mut Local,
    ) {
    }
}

/// `mmap-poll`: poll the shared doorbell page; when idle, spin for
/// `idle_poll`, then sleep in the mailbox for 10 µs doubling to 200 µs (the
/// latency a request arriving then pays; 1 ms for the admin worker), woken
/// early by kicks.
#[derive(Debug)]
pub(super) struct MmapPoll {
    idle_poll: Duration,
    /// Spinning since `idle_since`, or backing off.
    spinning: Option<(Instant, u32)>,
    backoff: Duration,
    max_backoff: Duration,
}

impl MmapPoll {
    pub fn new(idle_poll: Duration, max_backoff: Duration) -> Self {
        Self {
            idle_poll,
            spinning: None,
            backoff: MIN_BACKOFF,
            max_backoff,
        }
    }
}

impl Wake for MmapPoll {
    const EVENT_IDX: EventIdxPolicy = EventIdxPolicy::Publish;

    fn wait(&self, _: &Interrupts, _: &Local, _: &mut Clock) -> Wait {
        match self.spinning {
            Some(_) => Wait::No,
            None => Wait::For(self.backoff),
        }
    }

    fn polls(&self, _: &Doorbells) -> bool {
        true
    }

    fn after(
        &mut self,
        round: Round,
        clock: &mut Clock,
        _: &Doorbells,
        _: &Stats,
        _: &Session,
        _: &mut Local,
    ) {
        let now = clock.now();
        self.spinning = match self.spinning {
            _ if round.work > 0 => {
                self.backoff = MIN_BACKOFF;
                Some((now, 0))
            }
            None => {
                if round.slept {
                    self.backoff = (self.backoff * 2).min(self.max_backoff);
                }
                None
            }
            Some((idle_since, polls))
                if now.saturating_duration_since(idle_since) < self.idle_poll =>
            {
                idle_pause(polls);
                Some((idle_since, polls.wrapping_add(1)))
            }
            Some(_) => {
                self.backoff = MIN_BACKOFF;
                None
            }
        };
    }

    fn looks(&self) -> bool {
        self.spinning.is_none()
    }

    fn steady(&self) -> Option<Duration> {
        (self.spinning.is_none() && self.backoff == self.max_backoff).then_some(self.backoff)
    }
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
    /// After the poll window: short sleeps between polls, EventIdx still
    /// behind (the host does not trap), until `until`.
    Dozing {
        idle_since: Instant,
        until: Instant,
    },
}

impl Phase {
    fn polling(now: Instant) -> Self {
        Phase::Polling {
            idle_since: now,
            idle_polls: 0,
            last_poll: now,
        }
    }
}

/// `adaptive`: once Doorbell Buffer Config is on, after a wake-up keep
/// polling every owned SQ's shadow tail, EventIdx kept one behind what was
/// seen so the host never needs to trap; after the worker's poll window (at
/// most `idle_poll`: see [`crate::worker::poll_window`]) without work, doze: poll
/// every 25 µs, sleeping in between, for `doze`; then arm EventIdx = tail
/// seen, fence, re-read every shadow tail, and sleep only if none moved. A
/// host that moves a tail after our re-read sees the armed EventIdx and
/// traps, and the trap's kick is in the mailbox before the worker can wait:
/// no lost wake-up. While the guest uses the INTx pin, CQ EventIdx is armed
/// instead of kept behind, so the host's head update traps: that BAR access
/// is where QEMU deasserts the line. Before Doorbell Buffer Config, as
/// [`OnKick`].
///
/// Where the doorbell page is offered, the client may have mapped it (SPDK's
/// host rings every doorbell there; QEMU maps it into its guest, whose
/// register writes then land there too): its rings never trap. So the
/// worker polls from the start (the page is the register file before
/// Doorbell Buffer Config), and asleep it wakes after a back-off, 25 µs
/// doubling to [`MAX_PAGE_BACKOFF`] ([`MAX_ADMIN_PAGE_BACKOFF`] for the
/// admin worker; five times that after a second of silence), to look again;
/// a trap still wakes it at once.
#[derive(Debug)]
pub(super) struct Adaptive {
    phase: Phase,
    window: PollWindow,
    doze: Duration,
    /// When the worker last had work before it went to sleep.
    slept_after: Option<Instant>,
    /// The doorbell page is offered: sleeps are bounded by `backoff`,
    /// which grows up to this.
    max_backoff: Option<Duration>,
    backoff: Duration,
    /// Asleep after arming EventIdx ([`Adaptive::arm_or_sleep`]).
    armed: bool,
}

impl Adaptive {
    pub fn new(window: PollWindow, doze: Duration, max_backoff: Option<Duration>) -> Self {
        Self {
            phase: Phase::Asleep,
            window,
            doze,
            slept_after: None,
            max_backoff,
            backoff: DOZE_INTERVAL,
            armed: false,
        }
    }

    /// Idle for the whole window: arm EventIdx, then sleep unless a tail
    /// moved meanwhile.
    fn arm_or_sleep(
        &mut self,
        doorbells: &Doorbells,
        stats: &Stats,
        session: &Session,
        local: &mut Local,
        idle_since: Instant,
        now: Instant,
    ) -> Phase {
        if arm(doorbells, stats, session, local) {
            Phase::polling(now)
        } else {
            self.slept_after = Some(idle_since);
            self.backoff = DOZE_INTERVAL;
            self.armed = true;
            Phase::Asleep
        }
    }
}

impl Wake for Adaptive {
    const EVENT_IDX: EventIdxPolicy = EventIdxPolicy::Behind;

    fn wait(&self, interrupts: &Interrupts, local: &Local, clock: &mut Clock) -> Wait {
        match self.phase {
            Phase::Polling { idle_polls, .. } if waits_on_backend(idle_polls, local) => {
                Wait::For(BACKEND_WAIT)
            }
            Phase::Polling { .. } => Wait::No,
            Phase::Dozing { .. } => Wait::For(DOZE_INTERVAL),
            Phase::Asleep if self.max_backoff.is_some() => {
                let wake = clock.now() + self.backoff;
                let deadline = next_deadline(interrupts, &local.rings, &local.timers);
                Wait::Until(Some(deadline.map_or(wake, |d| d.min(wake))))
            }
            Phase::Asleep => Wait::Until(next_deadline(interrupts, &local.rings, &local.timers)),
        }
    }

    fn polls(&self, doorbells: &Doorbells) -> bool {
        self.max_backoff.is_some() || doorbells.dbbuf_on()
    }

    fn after(
        &mut self,
        round: Round,
        clock: &mut Clock,
        doorbells: &Doorbells,
        stats: &Stats,
        session: &Session,
        local: &mut Local,
    ) {
        if !round.polled {
            self.phase = Phase::Asleep;
            self.armed = false;
            return;
        }
        let now = clock.now();
        if round.work > 0 {
            match self.phase {
                Phase::Polling { idle_since, .. } | Phase::Dozing { idle_since, .. } => {
                    self.window.found(now.saturating_duration_since(idle_since));
                }
                Phase::Asleep => {
                    if let Some(t) = self.slept_after.take() {
                        self.window.woke(now.saturating_duration_since(t));
                    }
                }
            }
        }
        self.phase = match self.phase {
            _ if round.work > 0 => Phase::polling(now),
            // A kick with nothing to do still starts a polling period: the
            // host is active.
            Phase::Asleep if round.kicked => Phase::polling(now),
            Phase::Asleep => {
                if let (true, Some(max)) = (round.slept, self.max_backoff) {
                    let deep = self
                        .slept_after
                        .is_some_and(|t| now.saturating_duration_since(t) > DEEP_IDLE);
                    let max = if deep { max * DEEP_IDLE_FACTOR } else { max };
                    self.backoff = (self.backoff * 2).min(max);
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
                // (Not a gap the worker slept through, waiting on its
                // backend.)
                if idle_polls > 0
                    && !round.slept
                    && now.saturating_duration_since(last_poll) > PREEMPTED
                {
                    self.window.preempted();
                }
                if now.saturating_duration_since(idle_since) < self.window.current() {
                    // The next round sleeps on the backend instead.
                    if !waits_on_backend(idle_polls.wrapping_add(1), local) {
                        idle_pause(idle_polls);
                    }
                    Phase::Polling {
                        idle_since,
                        idle_polls: idle_polls.wrapping_add(1),
                        // This round's clock: the pause is part of the
                        // gap, and a pause that yielded the core to a
                        // runnable thread is the core lost.
                        last_poll: now,
                    }
                } else {
                    self.window.expired();
                    if self.doze.is_zero() {
                        self.arm_or_sleep(doorbells, stats, session, local, idle_since, now)
                    } else {
                        Phase::Dozing {
                            idle_since,
                            until: now + self.doze,
                        }
                    }
                }
            }
            Phase::Dozing { idle_since, until } if now < until => {
                Phase::Dozing { idle_since, until }
            }
            Phase::Dozing { idle_since, .. } => {
                self.arm_or_sleep(doorbells, stats, session, local, idle_since, now)
            }
        };
        if !matches!(self.phase, Phase::Asleep) {
            self.armed = false;
        }
    }

    fn looks(&self) -> bool {
        matches!(self.phase, Phase::Asleep) && self.max_backoff.is_some()
    }

    fn armed(&self) -> bool {
        self.armed
    }

    /// At the deep-idle ceiling, which only a second of silence reaches
    /// (so `slept_after` is that old, and stays until work comes).
    fn steady(&self) -> Option<Duration> {
        let ceiling = self.max_backoff? * DEEP_IDLE_FACTOR;
        let deep = matches!(self.phase, Phase::Asleep) && self.slept_after.is_some();
        (deep && self.backoff == ceiling).then_some(ceiling)
    }
}

/// Whether a polling worker whose last `idle_polls` rounds found no work
/// should sleep until its backend completes something (at most
/// [`BACKEND_WAIT`]) rather than poll again: requests are in flight there,
/// so their completions are the work to come. The first round after work
/// still polls at once (the host's next commands follow its completions).
fn waits_on_backend(idle_polls: u32, local: &Local) -> bool {
    idle_polls > 0 && !local.inflight.is_empty()
}

/// Adaptive mode, before sleeping: EventIdx = tail seen for every owned SQ,
/// a full fence, then re-read every shadow tail. Returns `true` if one moved
/// (keep polling). Either that re-read sees a host's new tail, or the host's
/// EventIdx read (after its own fence) sees ours and it traps.
fn arm(doorbells: &Doorbells, stats: &Stats, session: &Session, local: &mut Local) -> bool {
    stats.eventidx_arms.fetch_add(1, Ordering::Relaxed);
    let mem = &*session.mem;
    let mut seen = Vec::with_capacity(local.owned.len());
    for &qid in &local.owned {
        if let Some(sq) = local.rings.sq_mut(qid) {
            let tail = sq.tail;
            sq.event_idx
                .publish(doorbells, qid, sq.source, tail as u16, true, mem);
            seen.push((qid, tail));
        }
    }
    barrier();
    let mut moved = false;
    for &(qid, tail) in &seen {
        if let Some(sq) = local.rings.sq_mut(qid) {
            sq.refresh_tail(doorbells, mem);
            moved |= sq.tail != tail;
        }
    }
    moved
}
