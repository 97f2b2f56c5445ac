//! The Keep Alive Timer: KATO rounding, the Keep Alive command, and a
//! timeout that fires (error log entry, CSTS.CFS, no more commands) unless
//! the host keeps the controller alive.

use vnvme_spec::log::ErrorLogEntry;

use super::*;

const KEEP_ALIVE: u8 = 0x18;

impl Host {
    /// Waits up to `limit` for CSTS.CFS.
    fn wait_fatal(&self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.csts().cfs() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    fn kato(&mut self) -> u32 {
        let c = self.admin(get_features(0x0F, 0, DATA));
        assert_eq!(c.status(), Status::SUCCESS);
        c.dw0.get()
    }
}

#[test]
fn kato_rounds_up_to_100_ms_and_zero_disables() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.kato(), 0, "disabled by default on PCIe");
    for (set, got) in [(1, 100), (250, 300), (60_000, 60_000), (0, 0)] {
        assert_eq!(h.admin(set_features(0x0F, set)).status(), Status::SUCCESS);
        assert_eq!(h.kato(), got, "KATO {set}");
    }
    let c = h.admin(set_features(0x0F, u32::MAX));
    assert_eq!(
        c.status(),
        Status::KEEP_ALIVE_TIMEOUT_INVALID.with_dnr(true)
    );
    assert_eq!(h.kato(), 0, "unchanged");
    // The Keep Alive command succeeds whether or not the timer runs.
    assert_eq!(h.admin(cmd(KEEP_ALIVE)).status(), Status::SUCCESS);
    // And is listed in the Commands Supported and Effects log.
    assert_eq!(
        h.admin(get_log(0x05, 1, 4 * 0x18, DATA)).status(),
        Status::SUCCESS
    );
    assert_eq!(h.read_mem(DATA, 4), [1, 0, 0, 0], "keep alive: CSUPP");
}

#[test]
fn keep_alive_timeout_sets_cfs_and_logs_the_error() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.admin(set_features(0x0F, 100)).status(), Status::SUCCESS);
    assert!(
        h.wait_fatal(Duration::from_secs(10)),
        "no keep alive: timeout"
    );
    // Commands are no longer processed.
    let cid = h.push(0, identify(1, 0, DATA));
    h.ring_sq(0);
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        h.peek_cqe(0).is_none(),
        "command {cid} completed after the timeout"
    );
    // A controller reset recovers; the error log has the entry.
    h.reenable();
    assert!(!h.csts().cfs());
    assert_eq!(h.kato(), 0, "KATO back to its default");
    assert_eq!(
        h.admin(get_log(0x01, 16, 0, DATA)).status(),
        Status::SUCCESS
    );
    let e = ErrorLogEntry::read_from_bytes(&h.read_mem(DATA, 64)).unwrap();
    let status = Status::from_raw(e.status.get() >> 1);
    assert!(
        status.same_code(Status::KEEP_ALIVE_TIMEOUT_EXPIRED),
        "{status:?}"
    );
    assert_eq!(
        (e.sqid.get(), e.cid.get()),
        (0xFFFF, 0xFFFF),
        "no command's"
    );
    assert_eq!(h.ctrl.stats().fatal_errors, 1);
}

#[test]
fn keep_alive_commands_keep_the_controller_alive() {
    let mut h = Host::new();
    h.enable();
    // Generous against a loaded machine: a keep alive every 50 ms against
    // a 1 s timeout, for 3 s.
    assert_eq!(h.admin(set_features(0x0F, 1000)).status(), Status::SUCCESS);
    let end = Instant::now() + Duration::from_secs(3);
    while Instant::now() < end {
        assert_eq!(h.admin(cmd(KEEP_ALIVE)).status(), Status::SUCCESS);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!h.csts().cfs(), "kept alive");
    // Then silence: it fires.
    assert!(h.wait_fatal(Duration::from_secs(10)));
}

#[test]
fn disabling_or_shutting_down_stops_the_timer() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.admin(set_features(0x0F, 100)).status(), Status::SUCCESS);
    assert_eq!(h.admin(set_features(0x0F, 0)).status(), Status::SUCCESS);
    assert!(
        !h.wait_fatal(Duration::from_millis(500)),
        "KATO 0: disabled"
    );
    assert_eq!(h.admin(set_features(0x0F, 100)).status(), Status::SUCCESS);
    // CC.SHN: normal shutdown; the timer is inactive while notified.
    h.write32(offset::CC, 0x0046_0001 | (1 << 14));
    assert!(!h.wait_fatal(Duration::from_millis(500)), "shut down");
    // A controller reset disables it as well.
    h.reenable();
    assert!(!h.wait_fatal(Duration::from_millis(500)), "reset");
}

#[test]
fn one_thread_keeps_every_controllers_timer_and_one_expiry_touches_no_other() {
    const CONTROLLERS: usize = 8;
    let mut hosts: Vec<Host> = (0..CONTROLLERS).map(|_| Host::new()).collect();
    for h in &mut hosts {
        h.enable();
        assert_eq!(
            h.admin(set_features(0x0F, 60_000)).status(),
            Status::SUCCESS
        );
    }
    // Every enable armed a timer; one thread serves them all (it was a
    // thread per enable: eight here, more with the other tests').
    assert_eq!(crate::keep_alive::threads_named_keepalive(), 1);
    // The first host goes silent with a short KATO: it alone expires.
    assert_eq!(
        hosts[0].admin(set_features(0x0F, 100)).status(),
        Status::SUCCESS
    );
    assert!(hosts[0].wait_fatal(Duration::from_secs(10)));
    for (i, h) in hosts.iter_mut().enumerate().skip(1) {
        assert!(!h.csts().cfs(), "host {i}");
        assert_eq!(h.ctrl.stats().fatal_errors, 0, "host {i}");
        assert_eq!(h.admin(cmd(KEEP_ALIVE)).status(), Status::SUCCESS);
    }
    // Its reset disarms it and leaves the others armed.
    hosts[0].reenable();
    assert!(!hosts[0].csts().cfs());
    assert_eq!(hosts[0].ctrl.stats().fatal_errors, 1);
    assert_eq!(crate::keep_alive::threads_named_keepalive(), 1);
}
