//! Poll groups: a fixed set of threads that serve the queues of many
//! controllers, as SPDK's reactors do (a poll group per thread).
//!
//! Without poll groups every controller starts its own threads at enable
//! (its admin worker and `workers` I/O workers), so N busy controllers on K
//! cores are N sets of pollers fighting over the cores. With them, each
//! controller's workers are [`Member`]s: at enable they join the groups
//! their mailboxes were assigned to when the controller was made (the
//! controller's I/O workers spread over every group, from an offset that
//! turns with each controller, so the first queue of each controller lands
//! on a different thread), and they leave at reset.
//!
//! A group's thread runs passes over its members, round-robin: each pass
//! gives every member that has work (a kick, a polling policy, a deadline
//! passed) one round, and a round runs each queue for at most
//! [`GROUP_PASS_BUDGET`](super::GROUP_PASS_BUDGET) commands, so a busy
//! controller never holds the thread while another waits. When no member
//! has work the thread sleeps on the group's [`Bell`] until the earliest
//! member's deadline; any member's mailbox rings it.
//!
//! Idle, one look for all: a member whose client maps the doorbell page
//! (QEMU maps it into its guest) can learn of new work only by looking at
//! the page, so idle it still wakes after a back-off (up to 5 ms, see
//! `wake::Adaptive`). Each member on its own clock would wake the thread
//! once per member per back-off. Instead, when one member's look falls
//! due, every member that waits only for such a look gets its round in
//! the same pass: from then on their looks fall due together, and an idle
//! group wakes once per back-off whatever its number of members. A look
//! only comes earlier than the member asked, never later, so the first
//! command after a long idle still waits at most one back-off. And a look
//! is no round where it need not be: the member compares its SQs' tail
//! doorbells in the page with what they were before its last round
//! (`worker::look`), and runs a round only if one moved or something else
//! waits (a kick, a timer, commands in flight).
//!
//! An idle wake-up is kept cheap, since it comes 200 times a second: the
//! group reads the clock once and gives that reading to every member's
//! look, and reads no member's mailbox when its bell was not rung while it
//! slept (every kick rings the bell after it marks the mailbox, so a quiet
//! bell means no kicks the last pass did not see). On a virtual machine
//! each of those, after 5 ms asleep, is a cache miss or a clock read per
//! member. In deep idle (every member at its back-off's ceiling, holding
//! a card) it reads not even its members: a table of the page dwords their
//! cards compare with (`worker::idle_table`) serves each wake-up until the
//! bell rings or a dword moves. It sleeps in one system call (`queue::bell`: a futex wait
//! whose timeout is the deadline itself) and takes the lock of the members
//! waiting to join only when the bell rang (a join rings it). A busy pass (one that follows a pass without sleeping) reads
//! the mailboxes of its sleeping members only if the bell rang since the
//! pass before, by the same rule: with 64 controllers, one busy and 63
//! idle, a pass no longer reads 64 mailboxes to find no kick.
//!
//! A controller's client connecting, resetting or dying touches only that
//! controller's members: the reset stops them (their mailboxes' stop flag),
//! the group drops them at their next round, and the reset waits for that
//! ([`Detached`]) before it clears the queues. What no group can give: a
//! member blocked inside a backend call (a storage that hangs) blocks its
//! group's other members too.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::clock::Clock;
use super::idle_table::IdleTable;
use super::look::Card;
use super::{Member, Take, TIMER_SLACK_NS};
use crate::queue::bell::{Bell, Woke};
use crate::queue::mailbox::Wait;

/// Most poll groups a process may have.
pub const MAX_POLL_GROUPS: usize = 64;

/// A set of poll group threads, shared by the controllers made with it
/// ([`Controller::with_poll_groups`](crate::Controller::with_poll_groups)).
/// Cloning shares the threads; they stop when the last clone and the last
/// controller using them are gone.
#[derive(Clone)]
pub struct PollGroups(Arc<Inner>);

impl std::fmt::Debug for PollGroups {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PollGroups")
            .field("threads", &self.0.groups.len())
            .finish_non_exhaustive()
    }
}

/// Why poll groups could not start.
#[derive(Debug, thiserror::Error)]
pub enum PollGroupError {
    #[error("poll groups must number 1..={MAX_POLL_GROUPS}, not {0}")]
    Count(usize),
    #[error("starting poll group thread {0}")]
    Spawn(usize, #[source] std::io::Error),
}

struct Inner {
    groups: Vec<Arc<Group>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Controllers made so far: where the next one's workers start.
    controllers: AtomicUsize,
}

/// What a group's thread and the controllers share.
struct Group {
    bell: Arc<Bell>,
    /// Members waiting to join (enable puts them here).
    joining: Mutex<Vec<Joining>>,
    stop: AtomicBool,
    /// Members now served.
    members: AtomicUsize,
    counts: Mutex<GroupCounts>,
}

/// A poll group thread's wake-ups ([`PollGroups::counts`]): what an idle
/// group costs is mostly these.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GroupCounts {
    /// Times the thread slept and woke (deadline or bell).
    pub wakeups: u64,
    /// Of those, the wake-ups that found every member idle, waiting only
    /// to look at its doorbell page again.
    pub idle_wakeups: u64,
    /// Members served on those wake-ups: with one look for all, the
    /// members times `idle_wakeups`.
    pub idle_rounds: u64,
    /// Of those, the ones a look at the doorbell page served without a
    /// round (nothing had come).
    pub idle_looks: u64,
    /// Times those wake-ups read the clock (one each: the members' looks
    /// share the group's reading).
    pub idle_clock_reads: u64,
    /// Members' mailboxes those wake-ups read for kicks (none unless one
    /// rang the group's bell).
    pub idle_kick_checks: u64,
    /// System calls the sleeps before those wake-ups made (one each: the
    /// futex wait, see `queue::bell`).
    pub idle_sleep_calls: u64,
    /// Times those wake-ups took the lock of the members waiting to join
    /// (none unless the bell rang: a join rings it).
    pub idle_join_checks: u64,
    /// Looks that asked the member (its back-off still growing, or the
    /// page moved); the others the group took from the member's card.
    pub idle_member_looks: u64,
    /// Members (the group's own record of each) those wake-ups read: all
    /// of them on a pass, none when the deep-idle table served it.
    pub idle_members_touched: u64,
    /// Of the idle wake-ups, those the deep-idle table served alone
    /// (every member at its back-off's ceiling, `worker::idle_table`).
    pub idle_table_wakeups: u64,
    /// Page dwords those wake-ups read (one per SQ its members own).
    pub idle_table_dwords: u64,
    /// Passes that followed a pass without a sleep (a member was busy).
    pub busy_passes: u64,
    /// Members' mailboxes those passes read for kicks (none unless one
    /// rang the group's bell since the pass before).
    pub busy_kick_checks: u64,
}

struct Joining {
    member: Box<dyn Member>,
    left: Arc<Detached>,
}

/// Counts a controller's members still in their groups, so its reset can
/// wait until none serves its queues.
#[derive(Debug, Default)]
pub(crate) struct Detached {
    remaining: Mutex<usize>,
    cv: Condvar,
}

impl Detached {
    pub fn new(members: usize) -> Arc<Self> {
        Arc::new(Self {
            remaining: Mutex::new(members),
            cv: Condvar::new(),
        })
    }

    pub fn left(&self) {
        let mut n = self.remaining.lock();
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.cv.notify_all();
        }
    }

    /// Waits until every member has left its group (the caller stopped
    /// their mailboxes). Bounded: past `timeout` it returns `false` (a
    /// member blocked in storage that does not answer).
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut n = self.remaining.lock();
        while *n > 0 {
            if self.cv.wait_until(&mut n, deadline).timed_out() {
                return *n == 0;
            }
        }
        true
    }
}

impl PollGroups {
    /// Starts `threads` poll group threads, named `vnvme-pg{i}`.
    pub fn new(threads: usize) -> Result<Self, PollGroupError> {
        if !(1..=MAX_POLL_GROUPS).contains(&threads) {
            return Err(PollGroupError::Count(threads));
        }
        let groups: Vec<Arc<Group>> = (0..threads)
            .map(|_| {
                Arc::new(Group {
                    bell: Arc::default(),
                    joining: Mutex::new(Vec::new()),
                    stop: AtomicBool::new(false),
                    members: AtomicUsize::new(0),
                    counts: Mutex::default(),
                })
            })
            .collect();
        let inner = Inner {
            groups,
            threads: Mutex::new(Vec::new()),
            controllers: AtomicUsize::new(0),
        };
        for (i, g) in inner.groups.iter().enumerate() {
            let g = Arc::clone(g);
            let t = std::thread::Builder::new()
                .name(format!("vnvme-pg{i}"))
                .spawn(move || serve(&g))
                .map_err(|e| PollGroupError::Spawn(i, e))?;
            inner.threads.lock().push(t);
        }
        Ok(Self(Arc::new(inner)))
    }

    /// How many threads (groups).
    pub fn len(&self) -> usize {
        self.0.groups.len()
    }

    /// Always false: there is at least one group.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Members (workers of enabled controllers) each group serves now.
    pub fn members(&self) -> Vec<usize> {
        self.0
            .groups
            .iter()
            .map(|g| g.members.load(Ordering::Relaxed))
            .collect()
    }

    /// Each group thread's wake-ups so far.
    pub fn counts(&self) -> Vec<GroupCounts> {
        self.0.groups.iter().map(|g| *g.counts.lock()).collect()
    }

    /// The groups and bells of a new controller's workers: the admin
    /// worker's first, then one I/O worker per group, starting at a group
    /// that turns with each controller.
    pub(crate) fn assign(&self) -> Vec<(usize, Arc<Bell>)> {
        let n = self.0.groups.len();
        let start = self.0.controllers.fetch_add(1, Ordering::Relaxed) % n;
        let bell = |g: usize| (g, Arc::clone(&self.0.groups[g].bell));
        std::iter::once(bell(start))
            .chain((0..n).map(|k| bell((start + k) % n)))
            .collect()
    }

    /// Hands `member` to group `group` (an index [`assign`](Self::assign)
    /// gave); `left` is told when it leaves.
    pub(crate) fn join(&self, group: usize, member: Box<dyn Member>, left: Arc<Detached>) {
        match self.0.groups.get(group) {
            Some(g) => {
                g.joining.lock().push(Joining { member, left });
                g.bell.ring();
            }
            None => left.left(),
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for g in &self.groups {
            g.stop.store(true, Ordering::Release);
            g.bell.ring();
        }
        // The last controller may go on a group thread: that one cannot
        // join itself, and ends on its own.
        let me: ThreadId = std::thread::current().id();
        for t in self.threads.get_mut().drain(..) {
            if t.thread().id() != me {
                let _ = t.join();
            }
        }
    }
}

/// A member as its group holds it.
struct Served {
    member: Box<dyn Member>,
    left: Arc<Detached>,
    /// What it asked for before its next round, and until when.
    wait: Wait,
    due: Option<Instant>,
    /// Idle: `due` is only its next look at its doorbell page.
    looks: bool,
    /// Its looks change nothing in it but `due`: the group looks for it.
    card: Option<Card>,
}

impl Served {
    /// After a round (or on joining): what it waits for now.
    fn prepare(&mut self, clock: &mut Clock) {
        let wait = self.member.prepare(clock);
        self.set_wait(wait, clock);
        self.looks = !matches!(self.wait, Wait::No) && self.member.looks();
        self.card = if self.looks { self.member.card() } else { None };
    }

    fn set_wait(&mut self, wait: Wait, clock: &mut Clock) {
        self.wait = wait;
        self.due = match wait {
            Wait::No => None,
            Wait::For(d) => Some(clock.now() + d),
            Wait::Until(at) => at,
        };
    }

    /// Whether its look at its doorbell page is due.
    fn look_due(&self, now: Instant) -> bool {
        self.looks && self.due.is_some_and(|d| now >= d)
    }

    /// Whether its deadline has passed (or it does not wait).
    fn due(&self, now: Instant) -> bool {
        matches!(self.wait, Wait::No) || self.due.is_some_and(|d| now >= d)
    }
}

/// What one pass did, for the counts of an idle wake-up.
#[derive(Debug, Default)]
struct Pass {
    rounds: u64,
    looked: u64,
    clock_reads: u64,
    kick_checks: u64,
    member_looks: u64,
    join_checks: u64,
    members_touched: u64,
}

/// Busy passes counted on the thread before they go into the group's
/// counts (see `flush_busy`).
const BUSY_COUNTS_EVERY: u64 = 1024;

/// Adds `busy` (passes, mailbox reads) to the group's counts; returns
/// zeros to count on from.
fn flush_busy(group: &Group, busy: (u64, u64)) -> (u64, u64) {
    if busy != (0, 0) {
        let mut c = group.counts.lock();
        c.busy_passes += busy.0;
        c.busy_kick_checks += busy.1;
    }
    (0, 0)
}

/// Table wake-ups counted on the thread before they go into the group's
/// counts: the counts' lock is one more cold line per wake-up.
const TABLE_COUNTS_EVERY: u64 = 16;

/// How a stretch of deep idle ended.
struct DeepIdle {
    /// The wake-up the members must see: the bell rang, or a page moved.
    woke: Woke,
    /// When the table last looked for them (none: at once).
    looked: Option<Instant>,
}

/// Deep idle: every member sleeps at its back-off's ceiling and holds a
/// card. Wakes at `deadline`, looks at the pages from the table alone
/// (`worker::idle_table`), and sleeps again one back-off later, until a
/// wake-up needs the members: the bell rang (a kick, a join, the groups'
/// stop), or a page moved (a look through the member, then its round).
/// That wake-up is the caller's to serve and count.
fn deep_idle(group: &Group, table: &IdleTable<'_>, mut deadline: Instant) -> DeepIdle {
    let mut looked = None;
    let mut counted = GroupCounts::default();
    let woke = loop {
        let woke = group.bell.wait(Some(deadline));
        if woke.rung {
            break woke;
        }
        if !table.quiet() {
            break woke;
        }
        // The one clock read of the wake-up.
        let now = group.bell.now();
        looked = Some(now);
        deadline = now + table.backoff();
        counted.wakeups += 1;
        counted.idle_wakeups += 1;
        counted.idle_rounds += table.members();
        counted.idle_looks += table.members();
        counted.idle_clock_reads += 1;
        counted.idle_sleep_calls += u64::from(woke.calls);
        counted.idle_table_wakeups += 1;
        counted.idle_table_dwords += table.dwords();
        if counted.wakeups == TABLE_COUNTS_EVERY {
            counted = flush_table(group, counted);
        }
    };
    flush_table(group, counted);
    DeepIdle { woke, looked }
}

/// Adds the table's wake-ups to the group's counts; returns zeros.
fn flush_table(group: &Group, t: GroupCounts) -> GroupCounts {
    if t.wakeups > 0 {
        let mut c = group.counts.lock();
        c.wakeups += t.wakeups;
        c.idle_wakeups += t.idle_wakeups;
        c.idle_rounds += t.idle_rounds;
        c.idle_looks += t.idle_looks;
        c.idle_clock_reads += t.idle_clock_reads;
        c.idle_sleep_calls += t.idle_sleep_calls;
        c.idle_table_wakeups += t.idle_table_wakeups;
        c.idle_table_dwords += t.idle_table_dwords;
    }
    GroupCounts::default()
}

/// A group's thread: passes over its members until the groups stop.
fn serve(group: &Group) {
    let slack = std::num::NonZeroU64::new(TIMER_SLACK_NS);
    if let Err(e) = rustix::thread::set_current_timer_slack(slack) {
        tracing::debug!("setting the poll group's timer slack: {e}");
    }
    let mut members: Vec<Served> = Vec::new();
    // The thread slept before this pass, and every member was idle then.
    let mut slept = false;
    let mut all_idle = false;
    // A mailbox may hold kicks no pass has seen: its bell was rung (seen
    // by the wait, or without a sleep by a take), or members joined (a
    // mailbox may hold ring operations from before).
    let mut rung = true;
    // Busy passes and their mailbox reads not yet in the group's counts.
    let mut busy = (0u64, 0u64);
    // System calls of the last sleep.
    let mut sleep_calls = 0u32;
    loop {
        if group.stop.load(Ordering::Acquire) {
            break;
        }
        let mut pass = Pass::default();
        // A join rings the bell after it queues the member: a quiet bell
        // means none waits, and the lock need not be touched.
        let joined = if rung {
            pass.join_checks += 1;
            std::mem::take(&mut *group.joining.lock())
        } else {
            Vec::new()
        };
        for j in joined {
            let mut s = Served {
                member: j.member,
                left: j.left,
                wait: Wait::No,
                due: None,
                looks: false,
                card: None,
            };
            let mut clock = Clock::default();
            s.prepare(&mut clock);
            pass.clock_reads += u64::from(clock.reads());
            members.push(s);
            rung = true;
        }
        // One reading for the whole pass's looks; a member that has a
        // round reads its own after it.
        let mut clock = Clock::read();
        let now = clock.now();
        // One look for all (see the module's comment).
        let look = members.iter().any(|s| s.look_due(now));
        pass.members_touched = members.len() as u64;
        let mut i = 0;
        while let Some(s) = members.get_mut(i) {
            let asleep = !matches!(s.wait, Wait::No);
            let kicked = rung && asleep && {
                pass.kick_checks += 1;
                s.member.kicked()
            };
            if kicked || s.due(now) || (look && s.looks) {
                pass.rounds += 1;
                if s.looks && !kicked {
                    if let Some(backoff) = s.card.as_ref().filter(|c| c.quiet()).map(|c| c.backoff)
                    {
                        // Nothing came, and the member's look would
                        // change nothing but this.
                        pass.looked += 1;
                        s.wait = Wait::Until(Some(now + backoff));
                        s.due = Some(now + backoff);
                        i += 1;
                        continue;
                    }
                    pass.member_looks += 1;
                    if let Some(wait) = s.member.look(&mut clock) {
                        // Nothing came: no round.
                        pass.looked += 1;
                        s.set_wait(wait, &mut clock);
                        s.card = s.member.card();
                        i += 1;
                        continue;
                    }
                }
                if !s.member.round(Take::Now { slept: asleep }) {
                    // Dropped (its session, its commands' state) before
                    // its controller's reset goes on, as a joined thread.
                    let gone = members.remove(i);
                    let left = gone.left;
                    drop(gone.member);
                    left.left();
                    continue;
                }
                let mut own = Clock::default();
                s.prepare(&mut own);
                pass.clock_reads += u64::from(own.reads());
            }
            i += 1;
        }
        pass.clock_reads += u64::from(clock.reads());
        if !slept {
            busy.1 += pass.kick_checks;
        }
        if slept {
            let mut c = group.counts.lock();
            c.wakeups += 1;
            if all_idle {
                c.idle_wakeups += 1;
                c.idle_rounds += pass.rounds;
                c.idle_looks += pass.looked;
                c.idle_clock_reads += pass.clock_reads;
                c.idle_kick_checks += pass.kick_checks;
                c.idle_member_looks += pass.member_looks;
                c.idle_sleep_calls += u64::from(sleep_calls);
                c.idle_join_checks += pass.join_checks;
                c.idle_members_touched += pass.members_touched;
            }
        }
        group.members.store(members.len(), Ordering::Relaxed);
        if members.iter().any(|s| matches!(s.wait, Wait::No)) {
            if !slept {
                busy.0 += 1;
                // Handed over now and then, not at every pass: the
                // counts' lock is not free.
                if busy.0 == BUSY_COUNTS_EVERY {
                    busy = flush_busy(group, busy);
                }
            }
            slept = false;
            // Kicks since the last wait or take rang the bell: taken
            // without sleeping, it says whether the next pass must read
            // the mailboxes.
            rung = group.bell.take();
            continue;
        }
        all_idle = !members.is_empty() && members.iter().all(|s| s.looks);
        let deadline = members.iter().filter_map(|s| s.due).min();
        busy = flush_busy(group, busy);
        // A kick after a member's prepare rang the bell: the wait returns
        // at once for it.
        let table = all_idle
            .then(|| IdleTable::new(members.iter().map(|s| s.card.as_ref())))
            .flatten();
        let woke = match (table, deadline) {
            (Some(table), Some(deadline)) => {
                let idle = deep_idle(group, &table, deadline);
                drop(table);
                // Their deadlines as the table's looks left them (the next
                // look one back-off after the last).
                if let Some(at) = idle.looked {
                    for s in &mut members {
                        if let Some(backoff) = s.card.as_ref().map(|c| c.backoff) {
                            s.wait = Wait::Until(Some(at + backoff));
                            s.due = Some(at + backoff);
                        }
                    }
                }
                idle.woke
            }
            _ => group.bell.wait(deadline),
        };
        rung = woke.rung;
        sleep_calls = woke.calls;
        slept = true;
    }
    // Stopped with members left (the process is ending): let their
    // controllers' resets go on.
    for s in members {
        s.left.left();
    }
    let joined = std::mem::take(&mut *group.joining.lock());
    for j in joined {
        j.left.left();
    }
}
