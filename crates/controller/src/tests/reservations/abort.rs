//! Preempt and Abort between hosts (§8.19.7): the preempted host's
//! commands in flight on the namespace, through its own controller,
//! complete with Command Aborted due to Preempt and Abort; another
//! registrant's, the preempting host's and those after a plain Preempt
//! complete as they would. The backend holds requests until the test
//! releases them, so the commands are in flight when the preempt runs.

use vnvme_blockdev::held::{HeldRam, Release};

use super::*;

const ABORTED: Status = Status::ABORTED_PREEMPT_AND_ABORT.with_dnr(true);
const KEY_C: u64 = 0xCCCC;

/// Waits until `n` requests are held.
fn wait_held(gate: &HeldRam, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while gate.held() < n {
        assert!(Instant::now() < deadline, "{n} requests in flight");
        std::thread::sleep(Duration::from_micros(100));
    }
}

/// Host 1 on CNTLID 1 and host 2 on CNTLID 2, their namespace on a gate.
fn pair_on_gate() -> (Host, Host, Arc<HeldRam>) {
    let gate = Arc::new(HeldRam::new(NS_BLOCKS * 512, Release::Test));
    let mut a = Host::enabled_on(config(), gate.clone());
    a.become_host(1, false);
    let b = Host::joining(&a, 2, 2);
    (a, b, gate)
}

/// Puts `n` one-block writes (or reads) on `h`'s queue 1 and rings it.
fn in_flight(h: &mut Host, op: NvmOpcode, n: u64) {
    for i in 0..n {
        h.push(1, rw(op, 1, i, 1, IO + i * 4096, 0));
    }
    h.ring_sq(1);
}

fn statuses(h: &mut Host, n: usize) -> Vec<Status> {
    h.reap_batch(1, n).iter().map(|c| c.status()).collect()
}

#[test]
fn preempt_and_abort_aborts_the_preempted_hosts_commands_in_flight() {
    let (mut a, mut b, gate) = pair_on_gate();
    assert_eq!(a.register(0, false, 0, 0, KEY_A), Status::SUCCESS);
    assert_eq!(
        a.acquire(0, 1, KEY_A, 0),
        Status::SUCCESS,
        "Write Exclusive"
    );
    assert_eq!(b.register(0, false, 0, 0, KEY_B), Status::SUCCESS);
    in_flight(&mut a, NvmOpcode::WRITE, 3);
    wait_held(&gate, 3);
    in_flight(&mut a, NvmOpcode::READ, 1);
    in_flight(&mut b, NvmOpcode::READ, 1);
    wait_held(&gate, 5);

    assert_eq!(
        b.acquire(2, 1, KEY_B, KEY_A),
        Status::SUCCESS,
        "preempt and abort, completed while the commands are in flight"
    );
    assert_eq!(gate.held(), 5);
    gate.release_newest_first();
    assert_eq!(statuses(&mut a, 4), [ABORTED; 4], "a's 3 writes and read");
    assert_eq!(statuses(&mut b, 1), [Status::SUCCESS], "b's own read");

    // Admitted after the preempt: the new reservation's table, no abort.
    gate.open();
    assert_eq!(a.io(NvmOpcode::WRITE), CONFLICT, "a is no registrant now");
    assert_eq!(a.io(NvmOpcode::READ), Status::SUCCESS);
    assert_eq!(b.io(NvmOpcode::WRITE), Status::SUCCESS);
    let (head, regs) = a.status_of();
    assert_eq!((head.rtype, head.regctl.get()), (1, 1));
    assert_eq!((regs[0].cntlid.get(), regs[0].rcsts), (2, 1));
}

#[test]
fn only_the_preempted_host_is_aborted_and_a_plain_preempt_aborts_nothing() {
    let (mut a, mut b, gate) = pair_on_gate();
    let mut c = Host::joining(&a, 3, 3);
    a.register(0, false, 0, 0, KEY_A);
    b.register(0, false, 0, 0, KEY_B);
    c.register(0, false, 0, 0, KEY_C);
    assert_eq!(
        a.acquire(0, 3, KEY_A, 0),
        Status::SUCCESS,
        "Write Exclusive - Registrants Only: every registrant writes"
    );
    in_flight(&mut a, NvmOpcode::WRITE, 2);
    in_flight(&mut c, NvmOpcode::WRITE, 2);
    wait_held(&gate, 4);
    assert_eq!(b.acquire(2, 3, KEY_B, KEY_A), Status::SUCCESS);
    gate.release_newest_first();
    assert_eq!(statuses(&mut a, 2), [ABORTED; 2]);
    assert_eq!(statuses(&mut c, 2), [Status::SUCCESS; 2], "c not preempted");

    // a registers again; a plain Preempt of it leaves its commands alone.
    assert_eq!(a.register(0, false, 0, 0, KEY_A), Status::SUCCESS);
    in_flight(&mut a, NvmOpcode::WRITE, 2);
    wait_held(&gate, 2);
    assert_eq!(b.acquire(1, 3, KEY_B, KEY_A), Status::SUCCESS, "preempt");
    gate.release_newest_first();
    assert_eq!(statuses(&mut a, 2), [Status::SUCCESS; 2]);
    assert_eq!(
        a.io(NvmOpcode::WRITE),
        CONFLICT,
        "unregistered all the same"
    );
}

#[test]
fn commands_admitted_with_no_registrant_are_never_aborted() {
    let (mut a, mut b, gate) = pair_on_gate();
    in_flight(&mut a, NvmOpcode::WRITE, 1);
    wait_held(&gate, 1);
    a.register(0, false, 0, 0, KEY_A);
    b.register(0, false, 0, 0, KEY_B);
    assert_eq!(b.acquire(2, 1, KEY_B, KEY_A), Status::SUCCESS);
    gate.release_newest_first();
    assert_eq!(
        statuses(&mut a, 1),
        [Status::SUCCESS],
        "admitted before any registration: no second look"
    );
}
