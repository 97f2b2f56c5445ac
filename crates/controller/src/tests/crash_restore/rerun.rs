//! An admin command a crash interrupted before a slot held its effect is
//! run again by the restored controller (`saved_state::rerun`) and
//! completed with its real status, once: Linux sends admin commands
//! with REQ_FAILFAST_DRIVER, so Command Interrupted would reach the
//! caller (nvme-cli, the driver's own Set Features). Commands whose effect
//! lies outside the saved state (Format NVM) are still interrupted.

use super::*;

/// Submits admin command `c` and waits until it ran (its completion
/// owed, nothing posted): the crash will fall before its slot.
fn owed_admin(h: &mut Host, rec: &Recorder, c: Command) -> u16 {
    let cid = h.push(0, c);
    h.ring_sq(0);
    await_admin_ran(h, rec, cid);
    assert!(h.peek_cqe(0).is_none(), "posted before a slot held it");
    cid
}

/// The restored controller gets its crash record (the new child's
/// keeper), which starts a new generation: nothing in flight in it.
fn record_again(h: &Host, rec: &Arc<Recorder>) {
    rec.with(|k| {
        k.dead = false;
        k.open.clear();
        k.admin.clear();
    });
    assert!(h.ctrl.record_crash_state(rec.clone()));
}

/// With its record the restored controller runs the kept commands again,
/// their completions owed to the next checkpoint, which releases them.
fn recorded_again(h: &mut Host, rec: &Arc<Recorder>, cids: &[u16]) -> SavedState {
    assert!(h.peek_cqe(0).is_none(), "posted before the record");
    let before = rec.with(|k| k.admin_done);
    record_again(h, rec);
    await_owed_again(rec, before, cids.len());
    checkpoint(h, rec)
}

/// Waits until the admin worker ran `n` commands again and owes their
/// completions (`admin_done` called twice for each since `before`: the
/// record already holds them in flight from its attaching).
fn await_owed_again(rec: &Recorder, before: usize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while rec.with(|k| k.admin_done) < before + 2 * n {
        assert!(Instant::now() < deadline, "not run again");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Arbitration (FID 01h) with AB = 3.
const ARBITRATION: u32 = 3;

/// A Set Features of Arbitration owed, then a crash before its slot: the
/// host, the record, the slot restored and the command's CID.
fn set_features_interrupted() -> (Host, Arc<Recorder>, SavedState, u16) {
    let (mut h, rec) = recorded_host(config());
    let saved = checkpoint(&h, &rec);
    let set = owed_admin(&mut h, &rec, set_features(0x01, ARBITRATION));
    crash_and_restore(&mut h, config(), &rec, &saved);
    (h, rec, saved, set)
}

/// A Set Features and a Create I/O CQ killed before their slot complete
/// with success after the restore, their effect there: the feature reads
/// back, the CQ takes a SQ that serves I/O. Failed before: both were in
/// the interrupted list and completed with Command Interrupted.
#[test]
fn a_set_features_and_a_create_cq_interrupted_before_their_slot_run_again() {
    let (mut h, rec) = recorded_host(config());
    let saved = checkpoint(&h, &rec);
    let set = owed_admin(&mut h, &rec, set_features(0x01, ARBITRATION));
    h.mem.zero(GuestAddress(cq_base(1)), 8 * 16).unwrap();
    let create = owed_admin(&mut h, &rec, create_cq(1, 8, 1, cq_base(1)));
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![], "nothing completed as interrupted");
    recorded_again(&mut h, &rec, &[set, create]);
    for cid in [set, create] {
        let c = h.reap(0);
        assert_eq!((c.cid(), c.status()), (cid, Status::SUCCESS));
    }
    assert!(h.peek_cqe(0).is_none(), "a second completion");
    let c = h.admin(get_features(0x01, 0, 0));
    assert_eq!(c.dw0.get() & 0x7, ARBITRATION, "the feature set again");
    // The CQ is there: a SQ on it serves a read.
    let (c, _) = admin_kept(&mut h, &rec, create_sq(1, 8, 1, sq_base(1)));
    assert_eq!(
        c.status(),
        Status::SUCCESS,
        "create sq 1 on the CQ run again"
    );
    h.rings[1] = Some(Ring::new(sq_base(1), cq_base(1), 8));
    assert_eq!(read_on_1(&mut h, 0), Status::SUCCESS);
}

/// A Format NVM killed before its slot is still completed with Command
/// Interrupted: the blocks it erased are in the backend, not the state.
#[test]
fn a_format_interrupted_before_its_slot_is_still_interrupted() {
    let (mut h, rec) = recorded_host(config());
    let saved = checkpoint(&h, &rec);
    let mut format = cmd(AdminOpcode::FORMAT_NVM.0);
    format.nsid = U32::new(1);
    let cid = owed_admin(&mut h, &rec, format);
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![(0, cid)]);
    let c = h.reap(0);
    assert_eq!((c.cid(), c.status()), (cid, Status::COMMAND_INTERRUPTED));
    assert!(!c.status().dnr(), "the host may retry it");
}

/// A command run again and completed is not run or posted again at a
/// later restore (from the slot that holds it); one run again and killed
/// again before its slot is run again once more (its bytes kept anew).
#[test]
fn a_command_run_again_completes_once() {
    let (mut h, rec, saved, set) = set_features_interrupted();
    // Run again, killed again before its slot: run a third time.
    let before = rec.with(|k| k.admin_done);
    record_again(&h, &rec);
    await_owed_again(&rec, before, 1);
    assert!(h.peek_cqe(0).is_none(), "posted before a slot held it");
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![]);
    let saved = recorded_again(&mut h, &rec, &[set]);
    let c = h.reap(0);
    assert_eq!((c.cid(), c.status()), (set, Status::SUCCESS));
    // Killed after the post: the slot holds the feature, nothing is run
    // or posted again.
    let mut state = saved.clone();
    let kept = rec.with(|k| k.clone());
    let mem = VecMemory::new(MEM_SIZE);
    mem.write(GuestAddress(0), &h.read_mem(0, MEM_SIZE))
        .unwrap();
    assert_eq!(state.put_positions(&kept, &mem), Ok(vec![]));
    assert_eq!(state.reruns(), 0, "run again after its completion");
    crash_and_restore(&mut h, config(), &rec, &saved);
    record_again(&h, &rec);
    let c = h.admin(get_features(0x01, 0, 0));
    assert_eq!(
        (c.status(), c.dw0.get() & 0x7),
        (Status::SUCCESS, ARBITRATION)
    );
}

/// Killed again as soon as the restored controller has its record (its
/// keeper voided the dead child's entries), whether or not its admin
/// worker ran the command yet: attaching the record keeps it in flight
/// with its bytes, so the next restore runs it again.
#[test]
fn a_command_to_run_again_is_kept_from_the_moment_the_record_is_attached() {
    let (mut h, rec, saved, set) = set_features_interrupted();
    record_again(&h, &rec);
    let kept = rec.with(|k| k.admin.len());
    assert_eq!(kept, 1, "kept when the record was attached");
    assert_eq!(crash_and_restore(&mut h, config(), &rec, &saved), vec![]);
    recorded_again(&mut h, &rec, &[set]);
    let c = h.reap(0);
    assert_eq!((c.cid(), c.status()), (set, Status::SUCCESS));
    let c = h.admin(get_features(0x01, 0, 0));
    assert_eq!(c.dw0.get() & 0x7, ARBITRATION);
}

/// A checkpoint between the attaching of the record and the admin
/// worker's first pass (the slot lacks the command's effect and does not
/// carry the list) keeps the command in flight with its bytes: a kill
/// after its slot runs it again.
#[test]
fn a_checkpoint_before_the_first_pass_keeps_the_commands_to_run_again() {
    let (mut h, rec, _, set) = set_features_interrupted();
    h.ctrl.pause();
    record_again(&h, &rec);
    let saved = h.ctrl.save_state().expect("quiescent");
    assert_eq!(saved.reruns(), 1, "waiting, saved with the state");
    rec.checkpoint(&saved);
    // Killed before the admin worker ran it.
    assert_eq!(crash_and_restore(&mut h, config(), &rec, &saved), vec![]);
    recorded_again(&mut h, &rec, &[set]);
    let c = h.reap(0);
    assert_eq!((c.cid(), c.status()), (set, Status::SUCCESS));
}
