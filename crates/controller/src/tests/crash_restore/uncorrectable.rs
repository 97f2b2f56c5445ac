//! Write Uncorrectable's marks across a crash: a mark set, or cleared by
//! a write, is saved state no crash record word holds, so its command's
//! completion is owed until a checkpoint keeps it (as a reservation
//! command's).

use super::*;

fn uncorrectable(slba: u64, nlb: u32) -> Command {
    rw(NvmOpcode::WRITE_UNCORRECTABLE, 1, slba, nlb, 0, 0)
}

/// Runs I/O command `c` on SQ 1 under the recorder: its completion is
/// owed (not posted) until the checkpoint after it, which it returns
/// with the completion.
fn io_kept(h: &mut Host, rec: &Recorder, c: Command) -> (Completion, SavedState) {
    let cid = h.push(1, c);
    h.ring_sq(1);
    await_ran(h, rec, 1, cid);
    assert_eq!(h.peek_cqe(1), None, "posted before a slot held its effect");
    let saved = checkpoint(h, rec);
    let c = h.reap(1);
    assert_eq!((c.cid(), c.status()), (cid, Status::SUCCESS));
    (c, saved)
}

/// A mark the host saw set survives the crash; one whose command the
/// crash forestalled is interrupted (the host marks again). Failed before:
/// the completion was posted at once, and a crash before the next
/// checkpoint forgot the mark.
#[test]
fn a_mark_the_host_saw_set_survives_the_crash() {
    let (mut h, rec) = recorded_host(config());
    let before = create_pair_kept(&mut h, &rec, 1, 8);
    let (_, saved) = io_kept(&mut h, &rec, uncorrectable(10, 2));
    crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(
        read_on_1(&mut h, 11),
        Status::UNRECOVERED_READ_ERROR.with_dnr(true)
    );
    assert_eq!(read_on_1(&mut h, 12), Status::SUCCESS);

    // Killed before the slot: restored from the one before, the mark's
    // command interrupted.
    let (mut h, rec) = recorded_host(config());
    create_pair_kept(&mut h, &rec, 1, 8);
    let cid = h.push(1, uncorrectable(10, 2));
    h.ring_sq(1);
    await_ran(&h, &rec, 1, cid);
    let interrupted = crash_and_restore(&mut h, config(), &rec, &before);
    assert_eq!(interrupted, vec![(1, cid)]);
    let c = h.reap(1);
    assert_eq!((c.cid(), c.status()), (cid, Status::COMMAND_INTERRUPTED));
}

/// A write over a mark, which the host saw complete, is not undone by the
/// crash: the block reads as written, not as uncorrectable. A write on
/// blocks never marked completes at once. Failed before: the restored slot
/// brought the mark back.
#[test]
fn a_mark_a_write_cleared_stays_cleared_after_the_crash() {
    let (mut h, rec) = recorded_host(config());
    create_pair_kept(&mut h, &rec, 1, 8);
    io_kept(&mut h, &rec, uncorrectable(10, 2));
    let (_, saved) = io_kept(&mut h, &rec, write(11));
    // Nothing marked there: posted at once, no checkpoint waited for.
    assert_eq!(h.submit(1, write(20)).status(), Status::SUCCESS);
    crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(read_on_1(&mut h, 11), Status::SUCCESS);
    assert_eq!(
        read_on_1(&mut h, 10),
        Status::UNRECOVERED_READ_ERROR.with_dnr(true)
    );
}
