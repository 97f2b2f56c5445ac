//! Commands in flight on an asynchronous backend: completions posted when
//! the backend finishes, in any order, into CQ entries reserved for them;
//! a Delete of their SQ waits for them; a reset drops them.
//!
//! The backend here is a gate the test opens: requests wait until released,
//! so the tests decide what is in flight and in which order it finishes.

use vnvme_blockdev::held::{HeldRam, Release};
use vnvme_blockdev::{BlockDevice, BlockRequest, FileDevice};

use super::*;
use crate::memory::GuestAddress;

/// Waits until `n` requests are held.
fn wait_held(gate: &HeldRam, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while gate.held() < n {
        assert!(Instant::now() < deadline, "{n} requests in flight");
        std::thread::sleep(Duration::from_micros(100));
    }
}

fn host_with_gate(mode: DoorbellMode, size: u16) -> (Host, Arc<HeldRam>) {
    let backend = Arc::new(HeldRam::new(NS_BLOCKS * 512, Release::Test));
    let mut h = Host::enabled_on(mode_config(mode), backend.clone());
    if mode != DoorbellMode::Trap {
        h.enable_dbbuf();
    }
    h.create_pair(1, size);
    (h, backend)
}

/// Buffer of the `i`-th command's 4 KiB.
fn buf(i: u64) -> u64 {
    DATA + i * 4096
}

fn pattern(i: u64) -> Vec<u8> {
    (0..4096).map(|b| (b as u64 * 7 + i * 13) as u8).collect()
}

#[test]
fn completions_posted_in_the_order_the_backend_finishes() {
    let (mut h, gate) = host_with_gate(DoorbellMode::Trap, 16);
    let mut cids = Vec::new();
    for i in 0..4 {
        h.mem.write(GuestAddress(buf(i)), &pattern(i)).unwrap();
        cids.push(h.push(1, rw(NvmOpcode::WRITE, 1, i * 8, 8, buf(i), 0)));
    }
    h.ring_sq(1);
    wait_held(&gate, 4);
    assert!(
        h.peek_cqe(1).is_none(),
        "nothing completes before the backend"
    );

    gate.release_newest_first();
    let posted: Vec<u16> = h.reap_batch(1, 4).iter().map(|c| c.cid()).collect();
    let newest_first: Vec<u16> = cids.iter().rev().copied().collect();
    assert_eq!(posted, newest_first);

    // Read back through the queue, into zeroed buffers.
    for i in 0..4 {
        h.mem.zero(GuestAddress(buf(i)), 4096).unwrap();
        h.push(1, rw(NvmOpcode::READ, 1, i * 8, 8, buf(i), 0));
    }
    h.ring_sq(1);
    wait_held(&gate, 4);
    gate.release_newest_first();
    for c in h.reap_batch(1, 4) {
        assert_eq!(c.status(), Status::SUCCESS);
    }
    for i in 0..4 {
        assert_eq!(h.read_mem(buf(i), 4096), pattern(i), "block {i}");
    }
}

/// A CQ of 4 entries holds 3 completions: with 9 commands in a larger SQ,
/// only 3 may be in flight at a time, in every doorbell mode (the adaptive
/// mode must not lose the CQ head update that lets the next ones in).
#[test]
fn commands_in_flight_never_exceed_the_free_cq_entries() {
    for mode in [
        DoorbellMode::Trap,
        DoorbellMode::Shadow,
        DoorbellMode::Adaptive,
    ] {
        let (mut h, gate) = host_with_gate(mode, 4);
        let c = h.admin(delete(AdminOpcode::DELETE_IO_SQ, 1));
        assert_eq!(c.status(), Status::SUCCESS);
        let c = h.admin(create_sq(1, 16, 1, sq_base(1)));
        assert_eq!(c.status(), Status::SUCCESS);
        let mut ring = Ring::new(sq_base(1), cq_base(1), 16);
        ring.cq_size = 4;
        h.rings[1] = Some(ring);

        for i in 0..9 {
            h.push(1, rw(NvmOpcode::READ, 1, i, 1, buf(i), 0));
        }
        h.ring_sq(1);
        for round in 0..3 {
            wait_held(&gate, 3);
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(gate.held(), 3, "{mode:?} round {round}");
            gate.release_newest_first();
            for c in h.reap_batch(1, 3) {
                assert_eq!(c.status(), Status::SUCCESS, "{mode:?}");
            }
        }
        assert_eq!(gate.peak(), 3, "{mode:?}");
    }
}

/// §5.6: the Delete completes after the SQ's commands in flight, and
/// nothing more is fetched from the SQ meanwhile.
#[test]
fn deleting_an_sq_waits_for_its_commands_in_flight() {
    let (mut h, gate) = host_with_gate(DoorbellMode::Trap, 4);
    gate.write(0, &pattern(1)).unwrap();
    h.mem.write(GuestAddress(buf(0)), &[0xAA; 4096]).unwrap();
    let read = h.push(1, rw(NvmOpcode::READ, 1, 0, 8, buf(0), 0));
    h.ring_sq(1);
    wait_held(&gate, 1);

    let del = h.push(0, delete(AdminOpcode::DELETE_IO_SQ, 1));
    h.ring_sq(0);
    std::thread::sleep(Duration::from_millis(50));
    assert!(h.peek_cqe(0).is_none(), "the Delete waits for the read");
    h.push(1, rw(NvmOpcode::READ, 1, 8, 8, buf(1), 0));
    h.ring_sq(1);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(gate.held(), 1, "nothing more fetched from a deleting SQ");

    gate.release_newest_first();
    let c = h.reap(1);
    assert_eq!((c.cid(), c.status()), (read, Status::SUCCESS));
    assert_eq!(h.read_mem(buf(0), 4096), pattern(1));
    let c = h.reap(0);
    assert_eq!((c.cid(), c.status()), (del, Status::SUCCESS));
    assert!(
        h.peek_cqe(1).is_none(),
        "the read queued after the Delete never ran"
    );
    assert_eq!(gate.held(), 0);

    // The queue is gone: deleting it again is an invalid QID, and its CQ
    // can go.
    let c = h.admin(delete(AdminOpcode::DELETE_IO_SQ, 1));
    assert_eq!(c.status(), Status::INVALID_QID.with_dnr(true));
    let c = h.admin(delete(AdminOpcode::DELETE_IO_CQ, 1));
    assert_eq!(c.status(), Status::SUCCESS);
}

#[test]
fn controller_reset_closes_backend_queues_and_posts_nothing() {
    let (mut h, gate) = host_with_gate(DoorbellMode::Trap, 4);
    gate.write(0, &pattern(1)).unwrap();
    h.mem.write(GuestAddress(buf(0)), &[0xAA; 4096]).unwrap();
    h.push(1, rw(NvmOpcode::READ, 1, 0, 8, buf(0), 0));
    h.ring_sq(1);
    wait_held(&gate, 1);
    assert!(gate.queues_open() >= 1);

    h.write32(offset::CC, 0);
    assert!(!h.csts().rdy());
    assert_eq!(
        gate.queues_open(),
        0,
        "the stopped worker dropped its queue"
    );
    gate.release_newest_first();
    std::thread::sleep(Duration::from_millis(20));
    assert!(h.peek_cqe(1).is_none());
    assert_eq!(
        h.read_mem(buf(0), 4096),
        vec![0xAA; 4096],
        "no data after a reset"
    );
}

/// A pause whose drain bound runs out with commands still on the backend
/// (a supervised server's checkpoint under load: 100 ms) keeps them: the
/// save refuses, and after the resume they complete, each once. Before,
/// the stopped worker dropped its backend queue with them, and the host
/// waited for their completions for ever.
fn commands_in_flight_at_a_pause_complete_after_the_resume(mode: DoorbellMode) {
    let (mut h, gate) = host_with_gate(mode, 16);
    let mut cids = Vec::new();
    for i in 0..4 {
        h.mem.write(GuestAddress(buf(i)), &pattern(i)).unwrap();
        cids.push(h.push(1, rw(NvmOpcode::WRITE, 1, i * 8, 8, buf(i), 0)));
    }
    h.ring_sq(1);
    wait_held(&gate, 4);
    h.ctrl.pause_draining(Duration::ZERO);
    let refused = h.ctrl.save_state().err().map(|e| e.to_string());
    assert_eq!(
        refused.as_deref(),
        Some(
            "the controller is not quiescent (SQ 1 has 4 commands in flight): let its commands \
             complete before saving"
        ),
    );
    assert_eq!(gate.queues_open(), 1, "the paused worker's queue is kept");
    h.ctrl.resume().unwrap();
    gate.release_newest_first();
    let mut posted: Vec<u16> = h.reap_batch(1, 4).iter().map(|c| c.cid()).collect();
    posted.sort_unstable();
    assert_eq!(posted, cids);
    std::thread::sleep(Duration::from_millis(20));
    assert!(h.peek_cqe(1).is_none(), "each completed once");
    h.ctrl.pause();
    h.ctrl.save_state().expect("nothing in flight any more");
    h.ctrl.resume().unwrap();
}

#[test]
fn commands_in_flight_at_a_pause_complete_after_the_resume_trap() {
    commands_in_flight_at_a_pause_complete_after_the_resume(DoorbellMode::Trap);
}

#[test]
fn commands_in_flight_at_a_pause_complete_after_the_resume_adaptive() {
    commands_in_flight_at_a_pause_complete_after_the_resume(DoorbellMode::Adaptive);
}

/// A reset while paused drops the commands the paused workers kept, as it
/// drops those of running ones: their backend queue closes, nothing posts.
#[test]
fn a_reset_during_a_pause_drops_the_commands_it_kept() {
    let (mut h, gate) = host_with_gate(DoorbellMode::Trap, 4);
    h.mem.write(GuestAddress(buf(0)), &[0xAA; 4096]).unwrap();
    h.push(1, rw(NvmOpcode::READ, 1, 0, 8, buf(0), 0));
    h.ring_sq(1);
    wait_held(&gate, 1);
    h.ctrl.pause_draining(Duration::ZERO);
    assert_eq!(gate.queues_open(), 1);
    h.write32(offset::CC, 0);
    assert_eq!(gate.queues_open(), 0, "the reset dropped the kept queue");
    gate.release_newest_first();
    std::thread::sleep(Duration::from_millis(20));
    assert!(h.peek_cqe(1).is_none());
    assert_eq!(h.read_mem(buf(0), 4096), vec![0xAA; 4096]);
}

#[test]
fn fua_write_and_flush_go_down_as_asynchronous_requests() {
    let (mut h, gate) = host_with_gate(DoorbellMode::Trap, 8);
    let mut fua = rw(NvmOpcode::WRITE, 1, 0, 8, buf(0), 0);
    fua.cdw12 = U32::new(fua.cdw12.get() | (1 << 30));
    let cid_write = h.push(1, fua);
    let mut flush = cmd(NvmOpcode::FLUSH.0);
    flush.nsid = U32::new(1);
    let cid_flush = h.push(1, flush);
    h.ring_sq(1);
    wait_held(&gate, 2);
    gate.with_held(|held| {
        assert_ne!(held[0].0, held[1].0, "one token per command");
        assert!(matches!(held[0].1, BlockRequest::Write { fua: true, .. }));
        assert!(matches!(held[1].1, BlockRequest::Flush));
    });
    gate.release_newest_first();
    let cids: Vec<u16> = h.reap_batch(1, 2).iter().map(|c| c.cid()).collect();
    assert_eq!(cids, [cid_flush, cid_write]);
}

/// Adaptive mode with polling on (Doorbell Buffer Config) and a poll window
/// longer than the test, so the worker never arms: its I/O worker runs one
/// round at a time (see `modes::adaptive_stepped`).
fn adaptive_stepped_on_gate() -> (Host, Arc<HeldRam>) {
    let backend = Arc::new(HeldRam::new(NS_BLOCKS * 512, Release::Test));
    let mut h = Host::new();
    let config = ControllerConfig {
        idle_poll: Duration::from_secs(3600),
        doze: Duration::ZERO,
        ..mode_config(DoorbellMode::Adaptive)
    };
    h.ctrl = Controller::new(config, vec![NamespaceConfig::new(1, 512, backend.clone())]).unwrap();
    h.ctrl.attach(h.mem.clone(), h.irq.clone());
    h.ctrl.worker_steps(1).start();
    h.enable();
    h.enable_dbbuf();
    h.create_pair(1, 16);
    (h, backend)
}

/// A polling worker whose only business is a request in flight on its
/// backend sleeps until the backend completes it, every round, instead of
/// spinning on a core the storage may need (io_uring's workers, a loop
/// device's thread); the completion wakes it. With nothing in flight it
/// polls without sleeping, as before.
#[test]
fn adaptive_polling_worker_sleeps_while_its_backend_works() {
    let (mut h, gate) = adaptive_stepped_on_gate();
    h.push(1, rw(NvmOpcode::READ, 1, 0, 8, buf(0), 0));
    assert!(
        h.ring_sq(1),
        "EventIdx starts at 0: the first command traps"
    );
    // The trap's round runs the command: it goes to the backend.
    h.ctrl.worker_steps(1).round();
    assert_eq!(gate.held(), 1);
    // The first round after work polls at once: the host's next commands
    // would follow at once.
    h.ctrl.worker_steps(1).round();
    assert_eq!(
        h.ctrl.worker_steps(1).sleeps(),
        0,
        "the first idle round polls"
    );
    // From then on every round sleeps (until the backend's waker or the
    // short bound wakes it), and polls once when it wakes.
    for round in 1..=5 {
        let steps = h.ctrl.worker_steps(1);
        steps.round_asleep();
        steps.finish();
        assert_eq!(steps.sleeps(), round, "round {round} slept");
        assert!(h.peek_cqe(1).is_none());
    }
    // The backend finishes: its waker kicks the worker, whose next round
    // posts the completion.
    gate.release_newest_first();
    h.ctrl.worker_steps(1).round();
    assert!(h.reap(1).status().is_success());
    // Nothing in flight: polling the shadow doorbells, never asleep.
    for _ in 0..5 {
        h.ctrl.worker_steps(1).round();
    }
    assert_eq!(
        h.ctrl.worker_steps(1).sleeps(),
        5,
        "no sleep with nothing in flight"
    );
    // Polling still: the next command needs no trap.
    h.push(1, rw(NvmOpcode::READ, 1, 8, 8, buf(1), 0));
    assert!(!h.ring_sq(1), "a polling worker needs no trap");
    h.ctrl.worker_steps(1).round();
    assert_eq!(gate.held(), 1);
    gate.open();
    h.ctrl.worker_steps(1).round();
    assert!(h.reap(1).status().is_success());
    let s = h.ctrl.stats();
    assert_eq!(s.queue(1).sq_doorbell_traps, 1);
    assert_eq!(s.queue(1).commands, 2);
    assert_eq!(s.eventidx_arms, 0);
}

/// A controller on a fresh file of the namespace's size, one I/O pair.
fn host_on_file(name: &str) -> (Host, Arc<FileDevice>, std::path::PathBuf) {
    let path =
        std::env::temp_dir().join(format!("vnvme-inflight-{name}-{}.img", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let file = Arc::new(FileDevice::open(&path, Some(NS_BLOCKS * 512)).unwrap());
    let mut h = Host::enabled_on(config(), file.clone());
    h.create_pair(1, 16);
    (h, file, path)
}

/// Pushes reads of 4 KiB number `0..n` (LBAs `i * 8`), rung with one
/// doorbell write: one pass runs them all. Their completions, by CID order.
fn read_in_one_pass(h: &mut Host, n: u64) -> Vec<(u16, Status)> {
    let cids: Vec<u16> = (0..n)
        .map(|i| h.push(1, rw(NvmOpcode::READ, 1, i * 8, 8, buf(i), 0)))
        .collect();
    h.ring_sq(1);
    let done = h.reap_batch(1, n as usize);
    cids.iter()
        .map(|&cid| {
            let c = done.iter().find(|c| c.cid() == cid).expect("completed");
            (cid, c.status())
        })
        .collect()
}

#[test]
fn a_pass_of_reads_on_the_file_backend_is_one_io_uring_submit() {
    let (mut h, file, path) = host_on_file("one-submit");
    file.write(0, &pattern(3)).unwrap();
    let before = file.counters().submit_calls;
    let done = read_in_one_pass(&mut h, 8);
    assert!(done.iter().all(|&(_, s)| s == Status::SUCCESS), "{done:?}");
    assert_eq!(
        file.counters().submit_calls,
        before + 1,
        "8 reads, 1 submit"
    );
    let mut back = vec![0u8; 4096];
    h.mem.read(GuestAddress(buf(0)), &mut back).unwrap();
    assert_eq!(back, pattern(3));
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_failed_submit_fails_the_reads_it_did_not_take_and_the_others_complete() {
    let (mut h, file, path) = host_on_file("failed-submit");
    let before = file.counters();
    file.inject_submit_fault(vnvme_blockdev::SubmitFault {
        take: 3,
        errno: Some(libc_eagain()),
    });
    let done = read_in_one_pass(&mut h, 8);
    let failed = Status::UNRECOVERED_READ_ERROR.with_dnr(true);
    let expect: Vec<Status> = (0..8)
        .map(|i| if i < 3 { Status::SUCCESS } else { failed })
        .collect();
    let got: Vec<Status> = done.iter().map(|&(_, s)| s).collect();
    assert_eq!(got, expect, "the first 3 were taken");
    let c = file.counters();
    assert_eq!(c.submit_calls, before.submit_calls + 1);
    assert_eq!(c.submit_failures, before.submit_failures + 1);
    // Nothing was lost or left behind: the queue goes on, on a new ring.
    let again = read_in_one_pass(&mut h, 4);
    assert!(
        again.iter().all(|&(_, s)| s == Status::SUCCESS),
        "{again:?}"
    );
    assert_eq!(file.counters().submit_calls, before.submit_calls + 2);
    let _ = std::fs::remove_file(&path);
}

/// EAGAIN: what io_uring_enter answers when it cannot allocate requests.
fn libc_eagain() -> i32 {
    rustix::io::Errno::AGAIN.raw_os_error()
}
