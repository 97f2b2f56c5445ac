//! A sanitize is the NVM subsystem's (Base 2.0 §8.21), whichever of its
//! controllers started it: every controller shows it in the Sanitize
//! Status log, refuses what it refuses and reports its end; a second one
//! from another controller gets Sanitize In Progress; it goes on when the
//! controller that started it goes away.

use super::*;

/// Sanitize Operation Completed: NVM command set specific (6), 01h, 81h.
const COMPLETED_EVENT: u32 = 6 | (1 << 8) | (0x81 << 16);

impl Host {
    /// Reads log 81h until the sanitize has ended (10 s at most), with an
    /// Asynchronous Event Request outstanding: the log then, and the
    /// events that came, every one after the operation ended (an event
    /// ahead of a log read that still shows it in progress fails: the
    /// admin queue posts in order).
    fn ended_with_events(&mut self) -> (SanitizeStatusLog, Vec<Completion>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut events = Vec::new();
        loop {
            let (c, seen) = self.admin_collect(get_log(0x81, 128, 0, LOG));
            assert_eq!(c.status(), Status::SUCCESS, "sanitize status log");
            let log = SanitizeStatusLog::read_from_bytes(&self.read_mem(LOG, 512)).unwrap();
            let running = log.sstat.get() & 0x7 == sstat::IN_PROGRESS;
            assert!(!running || seen.is_empty(), "an event while running");
            events.extend(seen);
            if !running && !events.is_empty() {
                return (log, events);
            }
            assert!(Instant::now() < deadline, "no end, or no event");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Controller 1 with a slow sanitize and I/O queue pair 1, and
/// controller 2 of its subsystem (enabled, I/O queue pair 1).
fn two() -> (Host, Host) {
    let mut a = Host::with(slow(), 512);
    a.enable();
    a.create_pair(1, 16);
    let b = Host::joining(&a, 2, 2);
    (a, b)
}

#[test]
fn the_other_controller_sees_it_in_log_81h_and_refuses_what_it_refuses() {
    let (mut a, mut b) = two();
    assert_eq!(b.sanitize_status().sstat.get(), sstat::NEVER_SANITIZED);
    assert_eq!(b.write8(1, 0, &data(1)), Status::SUCCESS);
    let aer_a = a.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    a.ring_sq(0);
    let aer_b = b.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    b.ring_sq(0);
    let c = a.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    let log = b.sanitize_status();
    assert_eq!(log.sstat.get(), sstat::IN_PROGRESS, "B sees A's sanitize");
    assert_ne!(log.sprog.get(), SPROG_IDLE);
    // A second sanitize, from either controller, while it runs.
    for action in [action::OVERWRITE, action::BLOCK_ERASE, action::CRYPTO_ERASE] {
        let c = b.admin(sanitize(action, 0, 0));
        assert_eq!(c.status(), in_progress(), "B's sanitize action {action}");
    }
    let c = b.admin(sanitize(action::EXIT_FAILURE_MODE, 0, 0));
    assert_eq!(c.status(), in_progress(), "B's exit failure mode");
    assert_eq!(
        a.admin(sanitize(action::BLOCK_ERASE, 0, 0)).status(),
        in_progress()
    );
    // What a sanitize refuses, on B too: I/O and Format.
    assert_eq!(b.read8(1, 0).0, in_progress());
    assert_eq!(b.write8(1, 0, &data(2)), in_progress());
    let mut format = cmd(AdminOpcode::FORMAT_NVM.0);
    format.nsid = U32::new(1);
    assert_eq!(b.admin(format).status(), in_progress());
    // Ended: completed for both, with Global Data Erased, and the event on
    // both controllers.
    let done = sstat::COMPLETED | sstat::GLOBAL_DATA_ERASED;
    for (h, aer) in [(&mut a, aer_a), (&mut b, aer_b)] {
        let (log, events) = h.ended_with_events();
        assert_eq!(log.sstat.get(), done);
        let got: Vec<_> = events.iter().map(|e| (e.cid(), e.dw0.get())).collect();
        assert_eq!(got, [(aer, COMPLETED_EVENT)]);
    }
    assert_eq!(b.read8(1, 0), (Status::SUCCESS, vec![0; 4096]));
    // A write through B is a write to the subsystem: no longer erased,
    // as A's log says too.
    assert_eq!(b.write8(1, 0, &data(3)), Status::SUCCESS);
    assert_eq!(a.sanitize_status().sstat.get(), sstat::COMPLETED);
    // Done: the other controller may start the next one.
    let c = b.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(a.sanitize_status().sstat.get(), sstat::IN_PROGRESS);
    assert_eq!(a.sanitized().sstat.get() & 0x7, sstat::COMPLETED);
}

#[test]
fn it_goes_on_when_the_controller_that_started_it_goes_away() {
    let (mut a, mut b) = two();
    assert_eq!(a.write8(1, 0, &data(1)), Status::SUCCESS);
    let aer = b.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    b.ring_sq(0);
    let c = a.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    drop(a);
    let (log, events) = b.ended_with_events();
    assert_eq!(log.sstat.get() & 0x7, sstat::COMPLETED);
    let got: Vec<_> = events.iter().map(|e| (e.cid(), e.dw0.get())).collect();
    assert_eq!(got, [(aer, COMPLETED_EVENT)]);
    assert_eq!(b.read8(1, 0), (Status::SUCCESS, vec![0; 4096]));
}

#[test]
fn a_start_on_one_controller_clears_the_others_unread_completion_event() {
    let (mut a, mut b) = two();
    // A first sanitize ends: its event waits on B, which has no request
    // outstanding to take it.
    let c = a.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    a.sanitized();
    // The second starts on A and clears it on B: B's request is answered
    // by the second's end only (ended_with_events fails on an event
    // while it runs), once.
    let c = a.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    let aer = b.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    b.ring_sq(0);
    let (log, events) = b.ended_with_events();
    assert_eq!(log.sstat.get() & 0x7, sstat::COMPLETED);
    let got: Vec<_> = events.iter().map(|e| (e.cid(), e.dw0.get())).collect();
    assert_eq!(got, [(aer, COMPLETED_EVENT)]);
}
