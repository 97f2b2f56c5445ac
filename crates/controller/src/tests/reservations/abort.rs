//! Preempt and Abort between hosts (§8.19.7): the preempted host's
//! commands in flight on the namespace, through its own controller,
//! complete with Command Aborted due to Preempt and Abort; another
//! registrant's, the preempting host's and those after a plain Preempt
//! complete as they would. The Acquire completes only after every command
//! admitted on the namespace before it (the fence): no write of the
//! preempted host lands after the preempting host's completion. The
//! backend holds requests until the test releases them, so the commands
//! are in flight when the preempt runs.

use vnvme_blockdev::held::{HeldRam, Release};

use super::*;

impl Host {
    /// Submits Reservation Acquire on queue 1 without waiting for its
    /// completion; its CID.
    fn acquire_later(&mut self, racqa: u32, rtype: u8, crkey: u64, prkey: u64) -> u16 {
        // Not BUF: the commands after it use that meanwhile.
        let data = BUF + 0x1000;
        self.mem
            .write(GuestAddress(data), &keys(crkey, prkey))
            .unwrap();
        let mut c = cmd(NvmOpcode::RESERVATION_ACQUIRE.0);
        c.nsid = U32::new(1);
        c.prp1 = U64::new(data);
        c.cdw10 = U32::new(racqa | u32::from(rtype) << 8);
        let cid = self.push(1, c);
        self.ring_sq(1);
        cid
    }

    /// Completions posted on queue 1 and not reaped yet.
    fn posted(&self) -> usize {
        let r = self.rings[1].unwrap();
        let (mut head, mut phase) = (r.head, r.phase);
        let mut n = 0;
        loop {
            let mut b = [0u8; 16];
            let at = GuestAddress(r.cq + u64::from(head) * 16);
            self.mem.read(at, &mut b).unwrap();
            if Completion::read_from_bytes(&b).unwrap().phase() != phase || n == r.cq_size {
                return usize::from(n);
            }
            n += 1;
            head += 1;
            if head == r.cq_size {
                (head, phase) = (0, !phase);
            }
        }
    }
}

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

    let acquire = b.acquire_later(2, 1, KEY_B, KEY_A);
    // The next command on b's queue completes: the preempt has run (b
    // holds the reservation), its completion waits for the five commands.
    let (head, regs) = b.status_of();
    assert_eq!(
        (head.rtype, head.regctl.get(), regs[0].cntlid.get()),
        (1, 1, 2)
    );
    assert_eq!(
        b.posted(),
        0,
        "the acquire waits for the commands before it"
    );
    assert_eq!(gate.held(), 5);
    gate.release_newest_first();
    let done = b.reap_batch(1, 2);
    let done: Vec<_> = done
        .iter()
        .map(|c| (c.cid() == acquire, c.status()))
        .collect();
    assert_eq!(
        done,
        [(false, Status::SUCCESS), (true, Status::SUCCESS)],
        "b's own read, then the acquire"
    );
    assert_eq!(
        a.posted(),
        4,
        "a's were posted before the acquire completed"
    );
    assert_eq!(statuses(&mut a, 4), [ABORTED; 4], "a's 3 writes and read");

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
    b.acquire_later(2, 3, KEY_B, KEY_A);
    b.status_of(); // Run: the report after it completes first.
    assert_eq!(b.posted(), 0, "the acquire waits");
    gate.release_newest_first();
    assert_eq!(statuses(&mut b, 1), [Status::SUCCESS], "after the four");
    assert_eq!(statuses(&mut a, 2), [ABORTED; 2]);
    assert_eq!(statuses(&mut c, 2), [Status::SUCCESS; 2], "c not preempted");

    // a registers again; a plain Preempt of it leaves its commands alone.
    assert_eq!(a.register(0, false, 0, 0, KEY_A), Status::SUCCESS);
    in_flight(&mut a, NvmOpcode::WRITE, 2);
    wait_held(&gate, 2);
    assert_eq!(
        b.acquire(1, 3, KEY_B, KEY_A),
        Status::SUCCESS,
        "a plain preempt completes with a's writes in flight"
    );
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
    assert_eq!(
        b.acquire(2, 1, KEY_B, KEY_A),
        Status::SUCCESS,
        "not fenced either: not counted"
    );
    gate.release_newest_first();
    assert_eq!(
        statuses(&mut a, 1),
        [Status::SUCCESS],
        "admitted before any registration: no second look"
    );
}

#[test]
fn a_command_that_fails_before_the_backend_leaves_nothing_to_wait_for() {
    let (mut a, mut b, gate) = pair_on_gate();
    gate.open();
    a.register(0, false, 0, 0, KEY_A);
    b.register(0, false, 0, 0, KEY_B);
    assert_eq!(a.acquire(0, 1, KEY_A, 0), Status::SUCCESS);
    // Counted when admitted, then failed: LBA out of range, a PRP that
    // maps nothing, a conflict; and one that ran.
    let out = rw(NvmOpcode::WRITE, 1, NS_BLOCKS, 1, IO, 0);
    assert_eq!(
        a.submit(1, out).status(),
        Status::LBA_OUT_OF_RANGE.with_dnr(true)
    );
    let unmapped = rw(NvmOpcode::WRITE, 1, 0, 1, MEM_SIZE as u64 + 0x1000, 0);
    assert_ne!(a.submit(1, unmapped).status(), Status::SUCCESS);
    assert_eq!(b.io(NvmOpcode::WRITE), CONFLICT);
    assert_eq!(a.io(NvmOpcode::WRITE), Status::SUCCESS);
    assert_eq!(a.ctrl.fence_pending(1), 0, "every count given back");
    assert_eq!(b.acquire(2, 1, KEY_B, KEY_A), Status::SUCCESS, "at once");
}

#[test]
fn a_preempt_and_abort_held_by_a_latency_fault_is_fenced_once_it_runs() {
    use crate::faults::{FaultKind, FaultSpec, Latency};
    let (mut a, mut b, gate) = pair_on_gate();
    a.register(0, false, 0, 0, KEY_A);
    b.register(0, false, 0, 0, KEY_B);
    assert_eq!(a.acquire(0, 1, KEY_A, 0), Status::SUCCESS);
    in_flight(&mut a, NvmOpcode::WRITE, 1);
    wait_held(&gate, 1);
    let delay = Latency::Fixed(Duration::from_millis(1));
    let spec = FaultSpec {
        opcodes: vec![NvmOpcode::RESERVATION_ACQUIRE.0],
        ..FaultSpec::new(FaultKind::Latency(delay))
    };
    b.ctrl.fault_add(spec).unwrap();
    let acquire = b.acquire_later(2, 1, KEY_B, KEY_A);
    // Run once its delay is over: then b holds the reservation.
    let deadline = Instant::now() + Duration::from_secs(5);
    while b.status_of().0.regctl.get() != 1 {
        assert!(Instant::now() < deadline, "the delayed preempt ran");
    }
    assert_eq!(b.posted(), 0, "run, and waiting for a's write");
    gate.release_newest_first();
    let done = b.reap(1);
    assert_eq!((done.cid(), done.status()), (acquire, Status::SUCCESS));
    assert_eq!(statuses(&mut a, 1), [ABORTED]);
}
