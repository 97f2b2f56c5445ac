//! Idle controllers in one poll group: their clients map the doorbell page,
//! so idle workers still look at it after a back-off, and the group gives
//! all of them their looks on one wake-up of its thread, not one each; a
//! look reads the page, and only a doorbell written there brings a round.

use std::sync::atomic::{fence, Ordering};

use super::*;
use crate::{DoorbellPage, GroupCounts, HeapDoorbellPage, PollGroups};

const CONTROLLERS: usize = 8;
/// Every controller's admin worker and its one I/O worker (one group).
const MEMBERS: u64 = 2 * CONTROLLERS as u64;

/// The group's counts once `ready` holds; gives up (fails) after 30 s, a
/// bound on a hang only.
fn counts_when(groups: &PollGroups, ready: impl Fn(&GroupCounts) -> bool) -> GroupCounts {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = groups.counts()[0];
        if ready(&c) {
            return c;
        }
        assert!(Instant::now() < deadline, "the group's counts stayed {c:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The group's counts once ten wake-ups in a row found every member idle:
/// from then on nothing wakes a member but its look.
fn settled(groups: &PollGroups) -> GroupCounts {
    let mut before = counts_when(groups, |c| c.idle_wakeups > 0);
    loop {
        let next = counts_when(groups, |c| c.wakeups >= before.wakeups + 10);
        let settled = next.wakeups - before.wakeups == next.idle_wakeups - before.idle_wakeups;
        before = next;
        if settled {
            return before;
        }
    }
}

/// A controller in `groups` with `page` offered, enabled, with SQ/CQ 1.
fn host_in(groups: &PollGroups, page: &Arc<HeapDoorbellPage>, dbbuf: bool) -> Host {
    let backend = Arc::new(RamDevice::new(NS_BLOCKS * 512));
    let mut h = Host::new();
    h.ctrl = Controller::with_poll_groups(
        mode_config(DoorbellMode::Adaptive),
        vec![NamespaceConfig::new(1, 512, backend)],
        Some(page.clone()),
        Some(groups.clone()),
    )
    .unwrap();
    h.ctrl.attach(h.mem.clone(), h.irq.clone());
    h.enable();
    if dbbuf {
        h.enable_dbbuf();
    }
    h.create_pair(1, 16);
    h
}

#[test]
fn an_idle_poll_group_wakes_once_to_look_at_every_members_doorbell_page() {
    let groups = PollGroups::new(1).unwrap();
    let mut hosts = Vec::new();
    let mut pages = Vec::new();
    for _ in 0..CONTROLLERS {
        let page = Arc::new(HeapDoorbellPage::default());
        hosts.push(host_in(&groups, &page, false));
        pages.push(page);
    }
    assert_eq!(groups.members(), vec![MEMBERS as usize]);
    // Nothing rings now. The last Create I/O SQ may still be on its way to
    // its worker (a kick, then a poll window).
    let before = settled(&groups);
    let after = counts_when(&groups, |c| c.idle_wakeups >= before.idle_wakeups + 50);
    let wakeups = after.wakeups - before.wakeups;
    let idle = after.idle_wakeups - before.idle_wakeups;
    assert_eq!(wakeups, idle, "every wake-up found every member idle");
    assert_eq!(
        after.idle_rounds - before.idle_rounds,
        MEMBERS * idle,
        "each wake-up looked at all {MEMBERS} members: one wake-up for all, not one each"
    );
    assert_eq!(
        after.idle_looks - before.idle_looks,
        MEMBERS * idle,
        "every look read the page only: nothing had come, no round"
    );
    assert_eq!(
        after.idle_clock_reads - before.idle_clock_reads,
        idle,
        "one clock reading per wake-up, shared by the {MEMBERS} looks"
    );
    assert_eq!(
        after.idle_kick_checks - before.idle_kick_checks,
        0,
        "no mailbox read: nothing rang the group's bell"
    );
    assert_eq!(
        after.idle_sleep_calls - before.idle_sleep_calls,
        idle,
        "one system call per sleep: the futex wait"
    );
    assert_eq!(
        after.idle_join_checks - before.idle_join_checks,
        0,
        "no look at the joining list: nothing rang the group's bell"
    );
    let table = after.idle_table_wakeups - before.idle_table_wakeups;
    assert_eq!(
        after.idle_members_touched - before.idle_members_touched,
        MEMBERS * (idle - table),
        "a pass reads each member once; a wake-up the deep-idle table served, none"
    );
    assert_eq!(
        after.idle_table_dwords - before.idle_table_dwords,
        MEMBERS * table
    );
    // The looks serve a client that rings through the page: a read on each
    // controller, its tail stored to the page only (no trap).
    reads_rung_through_the_pages_are_served(&mut hosts, &pages);
}

/// After a second of silence every member's back-off reaches its ceiling
/// (5 ms, 25 ms for an admin worker), and a look then changes nothing in it
/// but its next deadline: the group looks at the page from its own copy
/// (`look::Card`), gathered in its deep-idle table (`worker::idle_table`:
/// a dword per SQ, no controller read), and touches no member, not even its own record
/// of it; a moved page still brings a round.
#[test]
fn a_deep_idle_group_looks_at_the_pages_without_touching_its_members() {
    let groups = PollGroups::new(1).unwrap();
    let pages: Vec<_> = (0..CONTROLLERS)
        .map(|_| Arc::new(HeapDoorbellPage::default()))
        .collect();
    let mut hosts: Vec<Host> = pages.iter().map(|p| host_in(&groups, p, false)).collect();
    // Until five idle wake-ups in a row asked no member (a bound on a hang
    // only).
    let deadline = Instant::now() + Duration::from_secs(30);
    let before = loop {
        assert!(
            Instant::now() < deadline,
            "the group kept asking its members"
        );
        let b = settled(&groups);
        let n = counts_when(&groups, |c| c.wakeups >= b.wakeups + 5);
        // (The deep-idle table hands its counts over 16 wake-ups at a
        // time.)
        let all_idle = n.idle_wakeups - b.idle_wakeups == n.wakeups - b.wakeups;
        if all_idle && n.idle_member_looks == b.idle_member_looks {
            break n;
        }
    };
    let after = counts_when(&groups, |c| c.idle_wakeups >= before.idle_wakeups + 20);
    let idle = after.idle_wakeups - before.idle_wakeups;
    assert_eq!(after.wakeups - before.wakeups, idle);
    assert_eq!(after.idle_looks - before.idle_looks, MEMBERS * idle);
    assert_eq!(
        after.idle_member_looks - before.idle_member_looks,
        0,
        "every look taken from the group's card, no member touched"
    );
    assert_eq!(after.idle_clock_reads - before.idle_clock_reads, idle);
    assert_eq!(after.idle_kick_checks - before.idle_kick_checks, 0);
    assert_eq!(after.idle_sleep_calls - before.idle_sleep_calls, idle);
    assert_eq!(after.idle_join_checks - before.idle_join_checks, 0);
    assert_eq!(
        after.idle_table_wakeups - before.idle_table_wakeups,
        idle,
        "every wake-up served by the group's deep-idle table alone"
    );
    assert_eq!(
        after.idle_members_touched - before.idle_members_touched,
        0,
        "no member's record in the group read"
    );
    assert_eq!(
        after.idle_table_dwords - before.idle_table_dwords,
        MEMBERS * idle,
        "one page dword per owned SQ: SQ 0 of each admin worker, SQ 1 of each I/O worker"
    );
    reads_rung_through_the_pages_are_served(&mut hosts, &pages);
}

/// The group's counts once a stretch of wake-ups was served by its
/// deep-idle table alone (every member a second silent, at its back-off's
/// ceiling).
fn deep(groups: &PollGroups) -> GroupCounts {
    let mut before = settled(groups);
    loop {
        let next = counts_when(groups, |c| c.wakeups >= before.wakeups + 16);
        let table = next.idle_table_wakeups - before.idle_table_wakeups;
        let done = table == next.wakeups - before.wakeups;
        before = next;
        if done {
            return before;
        }
    }
}

/// The deep-idle table reads no doorbell generation (`worker::idle_table`):
/// a queue created meanwhile reaches its worker through its mailbox, whose
/// ring ends the table's sleep; the worker's next card, and the table made
/// from it, watch the new SQ too, and a command rung through the page only
/// on it is served.
#[test]
fn a_queue_created_in_deep_idle_is_watched_from_the_table() {
    let groups = PollGroups::new(1).unwrap();
    let page = Arc::new(HeapDoorbellPage::default());
    let mut h = host_in(&groups, &page, false);
    let before = deep(&groups);
    let after = counts_when(&groups, |c| c.idle_wakeups >= before.idle_wakeups + 16);
    let idle = after.idle_wakeups - before.idle_wakeups;
    assert_eq!(after.idle_table_wakeups - before.idle_table_wakeups, idle);
    assert_eq!(after.idle_table_dwords - before.idle_table_dwords, 2 * idle);
    h.create_pair(2, 16);
    let before = deep(&groups);
    let after = counts_when(&groups, |c| c.idle_wakeups >= before.idle_wakeups + 16);
    let idle = after.idle_wakeups - before.idle_wakeups;
    assert_eq!(after.idle_table_wakeups - before.idle_table_wakeups, idle);
    assert_eq!(
        after.idle_table_dwords - before.idle_table_dwords,
        3 * idle,
        "SQ 0, SQ 1 and the new SQ 2 watched"
    );
    h.push(2, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    page.store(4, u32::from(h.rings[2].unwrap().tail));
    assert!(h.wait_cqe(2).is_some_and(|c| c.status().is_success()));
    assert_eq!(h.ctrl.stats().queue(2).sq_doorbell_traps, 0);
    assert_eq!(h.ctrl.stats().queue(2).commands, 1);
}

/// A kick to an idle group (a doorbell register write that traps, as
/// from a client that does not map the page) rings its bell: the wake-up
/// it brings reads every member's mailbox, once, and serves the command;
/// the timed wake-ups before and after it read none.
///
/// The trap stores the value in the page before it kicks (see
/// `Controller::doorbell_write`), so a look falling due between the two
/// serves the command from the page, and the kick then finds its member
/// awake: no idle mailbox read at all (a loaded CI machine saw it once).
/// That order is told apart (0 reads) and the kick tried again.
#[test]
fn a_kick_rings_an_idle_group_awake_to_read_its_members_mailboxes_once() {
    let groups = PollGroups::new(1).unwrap();
    let mut hosts: Vec<Host> = (0..CONTROLLERS)
        .map(|_| host_in(&groups, &Arc::new(HeapDoorbellPage::default()), false))
        .collect();
    let h = &mut hosts[3];
    for kick in 1..=5u64 {
        let before = settled(&groups);
        h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
        assert!(h.ring_sq(1), "a register write traps");
        assert!(h.wait_cqe(1).is_some_and(|c| c.status().is_success()));
        let after = settled(&groups);
        assert_eq!(h.ctrl.stats().queue(1).sq_doorbell_traps, kick);
        assert_eq!(h.ctrl.stats().queue(1).commands, kick);
        match after.idle_kick_checks - before.idle_kick_checks {
            // A look took the command first.
            0 => continue,
            reads => {
                assert_eq!(
                    reads, MEMBERS,
                    "the kick's wake-up read each of the {MEMBERS} mailboxes once, the others none"
                );
                return;
            }
        }
    }
    panic!("a look took the command before the kick five times in a row");
}

/// Linux's doorbell update with shadow doorbells, its register write
/// landing in the mapped page (no trap): store the shadow tail, full
/// fence, read EventIdx, write the register if the need-event test says
/// so. Returns whether it wrote the page.
fn ring_through_page(h: &mut Host, page: &HeapDoorbellPage, qid: u16) -> bool {
    let (shadow, event_idx) = h.dbbuf.unwrap();
    let r = h.rings[usize::from(qid)].unwrap();
    let index = 2 * u32::from(qid);
    let off = u64::from(index) * 4;
    h.mem
        .store_u32(GuestAddress(shadow + off), u32::from(r.tail))
        .unwrap();
    fence(Ordering::SeqCst);
    let ei = h.mem.load_u32(GuestAddress(event_idx + off)).unwrap() as u16;
    let need = need_event_linux(ei, r.tail, r.sq_db);
    if need {
        page.store(index, u32::from(r.tail));
    }
    if let Some(r) = h.rings[usize::from(qid)].as_mut() {
        r.sq_db = r.tail;
    }
    need
}

#[test]
fn a_look_at_the_page_serves_shadow_doorbells_once_eventidx_is_armed() {
    let groups = PollGroups::new(1).unwrap();
    let pages: Vec<_> = (0..2)
        .map(|_| Arc::new(HeapDoorbellPage::default()))
        .collect();
    let mut hosts: Vec<Host> = pages.iter().map(|p| host_in(&groups, p, true)).collect();
    for round in 0..3 {
        // Idle until every wake-up is looks only: each worker armed
        // EventIdx before it slept, or it would need rounds.
        let before = settled(&groups);
        let after = counts_when(&groups, |c| c.idle_wakeups >= before.idle_wakeups + 20);
        assert_eq!(
            after.idle_looks - before.idle_looks,
            4 * (after.idle_wakeups - before.idle_wakeups),
            "round {round}: every idle member served by a look"
        );
        for (h, page) in hosts.iter_mut().zip(&pages) {
            h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
            assert!(
                ring_through_page(h, page, 1),
                "round {round}: armed EventIdx asks for the register write"
            );
            assert!(h.wait_cqe(1).is_some_and(|c| c.status().is_success()));
            h.advance_head(1);
        }
    }
    for h in &hosts {
        let s = h.ctrl.stats();
        assert_eq!(s.queue(1).sq_doorbell_traps, 0);
        assert_eq!(s.queue(1).commands, 3);
    }
}

/// A host that moves on through the shadow doorbell alone (the worker had
/// not armed EventIdx again yet, so the need-event test asks for no
/// register write) leaves the page's dword behind the worker's tail. The
/// worker's next idle round swaps its tail in, so the looks after it are
/// trusted again; and the host's next register write, which stores that
/// old value once its tail wraps round to it, is still seen.
#[test]
fn a_page_left_behind_by_the_shadow_doorbell_is_brought_to_the_tail() {
    let groups = PollGroups::new(1).unwrap();
    let page = Arc::new(HeapDoorbellPage::default());
    let mut h = host_in(&groups, &page, true);
    let read = || rw(NvmOpcode::READ, 1, 0, 1, DATA, 0);
    // Two reads rung back to back: the first through the page (the idle
    // worker armed EventIdx), the second in the shadow only (the worker has
    // not run since). Again if the worker came in between.
    let behind = loop {
        settled(&groups);
        h.push(1, read());
        assert!(ring_through_page(&mut h, &page, 1), "armed EventIdx");
        let first = h.rings[1].unwrap().tail;
        h.push(1, read());
        let rang = ring_through_page(&mut h, &page, 1);
        h.reap_batch(1, 2);
        if !rang {
            break first;
        }
    };
    let before = settled(&groups);
    let tail = h.rings[1].unwrap().tail;
    assert_eq!(
        page.load(2),
        u32::from(tail),
        "an idle round swapped the worker's tail in"
    );
    let after = counts_when(&groups, |c| c.idle_wakeups >= before.idle_wakeups + 20);
    assert_eq!(
        after.idle_looks - before.idle_looks,
        2 * (after.idle_wakeups - before.idle_wakeups),
        "every idle member served by a look"
    );
    // The host's tail goes round to the value the page held: one register
    // write of that value, which must bring a round.
    let n = (behind + 16 - tail) % 16;
    assert_eq!(n, 15);
    for _ in 0..n {
        h.push(1, read());
    }
    assert!(ring_through_page(&mut h, &page, 1), "armed EventIdx");
    assert_eq!(page.load(2), u32::from(behind));
    let cqes = h.reap_batch(1, usize::from(n));
    assert!(cqes.iter().all(|c| c.status().is_success()));
    assert_eq!(h.ctrl.stats().queue(1).sq_doorbell_traps, 0);
    // An admin command rung through the page only, as QEMU's guest does
    // (Linux rings the admin SQ's register, never its shadow): the page is
    // its tail, which no swap may take back.
    settled(&groups);
    let traps = h.ctrl.stats().queue(0).sq_doorbell_traps;
    h.push(0, get_features(0x07, 0, 0));
    page.store(0, u32::from(h.rings[0].unwrap().tail));
    assert!(h.wait_cqe(0).is_some_and(|c| c.status().is_success()));
    assert_eq!(h.ctrl.stats().queue(0).sq_doorbell_traps, traps);
}

/// A read on each host's I/O queue 1, its tail stored to its page only (no
/// trap), completes: the group's looks serve a client that rings through
/// the page.
fn reads_rung_through_the_pages_are_served(hosts: &mut [Host], pages: &[Arc<HeapDoorbellPage>]) {
    for (h, page) in hosts.iter_mut().zip(pages) {
        h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
        page.store(2, u32::from(h.rings[1].unwrap().tail));
        assert!(h.wait_cqe(1).is_some_and(|c| c.status().is_success()));
        assert_eq!(h.ctrl.stats().queue(1).sq_doorbell_traps, 0);
        assert_eq!(h.ctrl.stats().queue(1).commands, 1);
    }
}

/// A group kept busy by one member (an mmap-poll I/O worker whose idle
/// poll never ends) beside seven idle controllers: its passes read no
/// sleeping member's mailbox while nothing rings the bell (each pass read
/// all 15 before), and a trap on an idle controller is still served.
#[test]
fn busy_passes_read_no_mailbox_until_the_bell_rings() {
    let groups = PollGroups::new(1).unwrap();
    let mut hosts: Vec<Host> = (0..CONTROLLERS - 1)
        .map(|_| host_in(&groups, &Arc::new(HeapDoorbellPage::default()), false))
        .collect();
    let config = ControllerConfig {
        doorbells: DoorbellMode::MmapPoll,
        idle_poll: Duration::from_secs(3600),
        ..config()
    };
    let mut busy = Host::new();
    busy.ctrl = Controller::with_poll_groups(
        config,
        vec![NamespaceConfig::new(
            1,
            512,
            Arc::new(RamDevice::new(NS_BLOCKS * 512)),
        )],
        Some(Arc::new(HeapDoorbellPage::default())),
        Some(groups.clone()),
    )
    .unwrap();
    busy.ctrl.attach(busy.mem.clone(), busy.irq.clone());
    busy.enable();
    busy.create_pair(1, 16);
    // One command, and its I/O worker polls from then on.
    busy.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    busy.ring_sq(1);
    assert!(busy.wait_cqe(1).is_some_and(|c| c.status().is_success()));
    // Until a stretch of busy passes read no mailbox (the kicks of the
    // set-up have been seen); a bound on a hang only. Before, every busy
    // pass read each sleeping member's.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(
            Instant::now() < deadline,
            "busy passes kept reading mailboxes"
        );
        let b = counts_when(&groups, |c| c.busy_passes > 0);
        let n = counts_when(&groups, |c| c.busy_passes >= b.busy_passes + 4096);
        if n.busy_kick_checks == b.busy_kick_checks {
            break;
        }
    }
    // The group never slept meanwhile, and a trap on an idle controller
    // rings the bell: a pass reads the mailboxes and serves it.
    let before = groups.counts()[0];
    let h = &mut hosts[3];
    h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    assert!(h.ring_sq(1), "a register write traps");
    assert!(h.wait_cqe(1).is_some_and(|c| c.status().is_success()));
    assert_eq!(h.ctrl.stats().queue(1).commands, 1);
    let after = counts_when(&groups, |c| c.busy_passes >= before.busy_passes + 2048);
    assert!(after.busy_kick_checks > before.busy_kick_checks);
    assert_eq!(after.wakeups, before.wakeups, "the busy group never slept");
}
