//! An Asynchronous Event Request the host submitted after the last slot:
//! the restore keeps it outstanding. Linux's nvme driver re-arms an AER
//! only after a successful completion, so completing it with Command
//! Interrupted would end the guest's asynchronous events for good.

use super::*;

/// The admin SQ's head as last recorded.
fn admin_head(rec: &Recorder) -> Option<u32> {
    rec.with(|k| k.sqs.iter().find(|(q, _)| *q == 0).map(|(_, p)| p.head))
}

/// Submits an AER and waits until the admin worker took it.
fn aer_taken(h: &mut Host, rec: &Recorder) -> u16 {
    let before = admin_head(rec);
    let aer = h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    h.ring_sq(0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while admin_head(rec) == before {
        assert!(Instant::now() < deadline, "the AER was not taken");
        std::thread::sleep(Duration::from_millis(1));
    }
    aer
}

/// A doorbell write to a queue that does not exist raises an error
/// event, which the outstanding AER `aer` completes.
fn event_completes(h: &mut Host, aer: u16) {
    h.write32(0x1000 + 8 * 5, 1);
    let c = h.reap(0);
    assert_eq!((c.cid(), c.status()), (aer, Status::SUCCESS));
    assert_eq!(c.dw0.get() & 0x7, 0, "error event type");
}

/// Crashed before any slot held the AER: the restore keeps it
/// outstanding (not completed, not interrupted), and the next event
/// completes it. Failed before: the AER was lost (no event completed it).
#[test]
fn an_aer_submitted_after_the_last_slot_is_outstanding_after_the_restore() {
    let (mut h, rec) = recorded_host(config());
    let saved = create_pair_kept(&mut h, &rec, 1, 8);
    let aer = aer_taken(&mut h, &rec);
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![]);
    assert_eq!(h.peek_cqe(0), None, "nothing posted for the AER");
    event_completes(&mut h, aer);
}

/// Crashed after a slot that holds the AER (its checkpoint): the AER is
/// outstanding once, not twice.
#[test]
fn an_aer_the_slot_holds_is_outstanding_once_after_the_restore() {
    let (mut h, rec) = recorded_host(config());
    create_pair_kept(&mut h, &rec, 1, 8);
    let aer = aer_taken(&mut h, &rec);
    let saved = checkpoint(&h, &rec);
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![]);
    event_completes(&mut h, aer);
    // The error log read (which unmasks error events), another event
    // finds no AER: nothing more is posted.
    assert_eq!(
        h.admin(get_log(0x01, 64, 0, DATA)).status(),
        Status::SUCCESS
    );
    h.write32(0x1000 + 8 * 6, 1);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(h.peek_cqe(0), None, "a second completion of the AER");
}
