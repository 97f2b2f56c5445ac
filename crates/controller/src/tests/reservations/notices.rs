//! Reservation Notifications between hosts (log page 80h, mask 82h): the
//! host a Preempt removes, the registrants of a released Registrants Only
//! or All Registrants reservation, and those a Clear removes are told, on
//! each of their controllers, by a log page and an I/O Command Specific
//! event; the issuing host is not. Masked types make no page; pages past
//! the queue are lost but counted.

use vnvme_spec::reservation::ReservationNotificationLog;

use super::hosts::pair;
use super::*;
use crate::reporting::reservation_notices::MAX_PAGES;

/// Completion dword 0 of the event: type 6 (I/O command specific),
/// information 00h (Reservation Log Page Available), log page 80h.
const EVENT: u32 = 0x0080_0006;

impl Host {
    /// Reads log page 80h: (Log Page Count, type, available, NSID).
    fn notice(&mut self) -> (u64, u8, u8, u32) {
        self.mem.write(GuestAddress(BUF), &[0xFF; 64]).unwrap();
        assert_eq!(
            self.admin(get_log(0x80, 16, 0, BUF)).status(),
            Status::SUCCESS
        );
        let log = ReservationNotificationLog::read_from_bytes(&self.read_mem(BUF, 64)).unwrap();
        (log.count.get(), log.kind, log.available, log.nsid.get())
    }

    /// Set Features 82h on namespace 1.
    fn mask(&mut self, value: u32) -> Status {
        let mut c = set_features(0x82, value);
        c.nsid = U32::new(1);
        self.admin(c).status()
    }

    fn mask_now(&mut self) -> u32 {
        let mut c = get_features(0x82, 0, BUF);
        c.nsid = U32::new(1);
        let done = self.admin(c);
        assert_eq!(done.status(), Status::SUCCESS);
        done.dw0.get()
    }
}

const EMPTY: (u64, u8, u8, u32) = (0, 0, 0, 0);

#[test]
fn the_preempted_host_gets_a_page_and_its_event_the_issuer_none() {
    let (mut a, mut b) = pair();
    let aer = a.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    a.ring_sq(0);
    assert_eq!(a.notice(), EMPTY, "nothing yet");
    a.register(0, false, 0, 0, KEY_A);
    a.acquire(0, 1, KEY_A, 0);
    b.register(0, false, 0, 0, KEY_B);
    assert_eq!(b.acquire(1, 1, KEY_B, KEY_A), Status::SUCCESS, "preempt");
    let c = a.reap(0);
    assert_eq!((c.cid(), c.dw0.get()), (aer, EVENT));
    assert_eq!(a.notice(), (1, 1, 0, 1), "Registration Preempted, NSID 1");
    assert_eq!(a.notice(), EMPTY, "read once");
    assert_eq!(b.notice(), EMPTY, "the issuer is not told");
}

#[test]
fn releases_and_clears_tell_the_other_registrants() {
    let (mut a, mut b) = pair();
    a.register(0, false, 0, 0, KEY_A);
    b.register(0, false, 0, 0, KEY_B);
    a.acquire(0, 3, KEY_A, 0);
    assert_eq!(a.release(0, false, 3, KEY_A), Status::SUCCESS);
    assert_eq!(b.notice(), (1, 2, 0, 1), "Reservation Released");
    assert_eq!(a.notice(), EMPTY);
    a.acquire(0, 1, KEY_A, 0);
    a.release(0, false, 1, KEY_A);
    assert_eq!(b.notice(), EMPTY, "Write Exclusive: no notice");
    a.acquire(0, 6, KEY_A, 0);
    a.release(0, false, 6, KEY_A);
    assert_eq!(b.notice().1, 2, "All Registrants released");
    a.acquire(0, 4, KEY_A, 0);
    assert_eq!(
        a.register(1, false, 0, KEY_A, 0),
        Status::SUCCESS,
        "unregister"
    );
    assert_eq!(b.notice(), (3, 2, 0, 1), "a Registrants Only holder left");
    a.register(0, false, 0, 0, KEY_A);
    assert_eq!(b.release(1, false, 0, KEY_B), Status::SUCCESS, "clear");
    assert_eq!(a.notice(), (1, 3, 0, 1), "Reservation Preempted");
    assert_eq!(b.notice(), EMPTY);
}

#[test]
fn masks_are_per_controller_and_namespace_and_lost_pages_are_counted() {
    let (mut a, mut b) = pair();
    let mut a2 = Host::joining(&a, 3, 1);
    assert_eq!(a.mask(0xFFFF_FFFF), Status::SUCCESS);
    assert_eq!(a.mask_now(), 0b1110, "reserved bits dropped");
    assert_eq!(a2.mask_now(), 0, "the other controller's own");
    a.register(0, false, 0, 0, KEY_A);
    a.acquire(0, 1, KEY_A, 0);
    b.register(0, false, 0, 0, KEY_B);
    b.acquire(1, 1, KEY_B, KEY_A);
    assert_eq!(a.notice(), EMPTY, "masked");
    assert_eq!(a2.notice(), (1, 1, 0, 1), "the host's other controller");

    // b told of each release, unread past the queue.
    a.register(0, false, 0, 0, KEY_A);
    b.release(0, false, 1, KEY_B);
    let n = MAX_PAGES as u64 + 2;
    for _ in 0..n {
        a.acquire(0, 3, KEY_A, 0);
        a.release(0, false, 3, KEY_A);
    }
    assert_eq!(b.notice(), (1, 2, MAX_PAGES as u8 - 1, 1));
    for _ in 1..MAX_PAGES {
        b.notice();
    }
    assert_eq!(b.notice(), EMPTY);
    a.acquire(0, 3, KEY_A, 0);
    a.release(0, false, 3, KEY_A);
    assert_eq!(b.notice().0, n + 1, "2 lost, counted");
}

#[test]
fn a_preempt_that_changes_the_type_tells_the_registrants_left_reservation_released() {
    let (mut a, mut b) = pair();
    a.register(0, false, 0, 0, KEY_A);
    b.register(0, false, 0, 0, KEY_B);
    assert_eq!(a.acquire(0, 1, KEY_A, 0), Status::SUCCESS);
    assert_eq!(a.acquire(1, 1, KEY_A, KEY_A), Status::SUCCESS, "same type");
    assert_eq!(b.notice(), EMPTY, "the type did not change");
    assert_eq!(a.acquire(1, 3, KEY_A, KEY_A), Status::SUCCESS, "to type 3");
    assert_eq!(b.notice(), (1, 2, 0, 1), "Reservation Released");
    assert_eq!(a.notice(), EMPTY, "not the issuer");
    assert_eq!(b.status_of().0.rtype, 3);
}
