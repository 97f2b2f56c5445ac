//! A supervised server's restore after a crash, in process: a recorder
//! kept as the crash area would be ([`CrashRecord`]), a "crash" (the
//! recorder stops taking anything, guest memory is copied as it stands),
//! then the saved state with the recorded positions put over it
//! ([`SavedState::put_positions`]) restored into a new controller that
//! the same host goes on with. Plus the CQ reading by itself.

use std::sync::Mutex;

use vnvme_spec::regs::Doorbell;

use super::*;
use crate::crash_record::{CqPosition, CrashRecord, CrashRecorded, Open, SqPosition, ZoneRecorder};
use crate::faults::{FaultKind, FaultSpec};
use crate::queue::{SavedCq, SavedSource};
use crate::saved_state::positions::{read_posted, Posted};
use crate::SavedState;

mod aer;
mod rerun;
mod uncorrectable;
mod zones;

/// What the crash area would hold.
#[derive(Debug, Default, Clone)]
struct Kept {
    sqs: Vec<(u16, SqPosition)>,
    cqs: Vec<(u16, CqPosition)>,
    open: Vec<(u16, Open)>,
    doorbells: Vec<(Doorbell, u32)>,
    /// The admin commands kept to run again, by CID and head.
    admin: Vec<((u16, u32), [u8; 64])>,
    /// Calls of `admin_done`: two per admin command owed (after it ran,
    /// and as its completion is owed).
    admin_done: usize,
    /// Zone words and write words by NSID and zone.
    zones: std::collections::HashMap<(u32, u32), (u64, u64)>,
    /// Rounds' positions are no longer stored (a crash inside a long
    /// round): commands going in flight are stored late.
    words_frozen: bool,
    /// The process is dead: nothing is stored.
    dead: bool,
    /// Write words are no longer cleared (each write's completion falls
    /// after the crash).
    unsettled: bool,
}

fn set<K: PartialEq, V>(v: &mut Vec<(K, V)>, k: K, val: V) {
    v.retain(|(x, _)| *x != k);
    v.push((k, val));
}

#[derive(Debug, Default)]
struct Recorder(Mutex<Kept>);

impl Recorder {
    fn with<R>(&self, f: impl FnOnce(&mut Kept) -> R) -> R {
        f(&mut self.0.lock().unwrap())
    }

    /// The words of a saved state, as a checkpoint stores them, and its
    /// completions owed, the AERs taken and the commands waiting to run
    /// again in flight again.
    fn checkpoint(&self, state: &SavedState) {
        let (sqs, cqs) = state.positions();
        let aers = state.outstanding_aers();
        self.with(|k| {
            (k.sqs, k.cqs) = (sqs, cqs);
            k.doorbells.clear();
            let taken = k
                .open
                .iter()
                .filter(|(q, o)| *q == 0 && aers.contains(&o.cid));
            k.open = [taken.copied().collect(), state.owed()].concat();
            // The commands waiting to run again, kept anew.
            for (cid, head, sqe) in state.rerun_commands() {
                set(&mut k.admin, (cid, head), sqe);
                let late = false;
                k.open.push((0, Open { cid, head, late }));
            }
        });
    }
}

impl CrashRecord for Recorder {
    fn sq(&self, qid: u16, pos: SqPosition) {
        self.with(|k| {
            if !k.dead && !k.words_frozen {
                set(&mut k.sqs, qid, pos);
            }
        });
    }

    fn cq(&self, qid: u16, pos: CqPosition) {
        self.with(|k| {
            if !k.dead && !k.words_frozen {
                set(&mut k.cqs, qid, pos);
            }
        });
    }

    fn admin_done(&self) {
        self.with(|k| k.admin_done += 1);
    }

    fn fetched(&self, qid: u16, cid: u16, pos: SqPosition) {
        self.with(|k| {
            if k.dead {
                return;
            }
            let late = k.words_frozen;
            if !late {
                set(&mut k.sqs, qid, pos);
            }
            k.open.retain(|(q, o)| !(*q == qid && o.cid == cid));
            k.open.push((
                qid,
                Open {
                    cid,
                    head: pos.head,
                    late,
                },
            ));
        });
    }

    fn completed(&self, qid: u16, cid: u16) {
        self.with(|k| {
            if !k.dead {
                k.open.retain(|(q, o)| !(*q == qid && o.cid == cid));
            }
        });
    }

    fn doorbell(&self, db: Doorbell, value: u32) {
        self.with(|k| {
            if !k.dead {
                set(&mut k.doorbells, db, value);
            }
        });
    }

    fn admin_command(&self, cid: u16, head: u32, sqe: &[u8; 64]) {
        self.with(|k| {
            if !k.dead {
                set(&mut k.admin, (cid, head), *sqe);
            }
        });
    }
}

impl ZoneRecorder for Recorder {
    fn zone(&self, nsid: u32, zone: u32, word: u64) {
        self.with(|k| {
            if !k.dead {
                k.zones.entry((nsid, zone)).or_default().0 = word;
            }
        });
    }

    fn zone_write(&self, nsid: u32, zone: u32, word: u64) {
        self.with(|k| {
            let lost = k.unsettled && word == 0;
            if !k.dead && !lost {
                k.zones.entry((nsid, zone)).or_default().1 = word;
            }
        });
    }
}

impl CrashRecorded for Kept {
    fn sq(&self, qid: u16) -> Option<SqPosition> {
        self.sqs.iter().find(|(q, _)| *q == qid).map(|(_, p)| *p)
    }

    fn cq(&self, qid: u16) -> Option<CqPosition> {
        self.cqs.iter().find(|(q, _)| *q == qid).map(|(_, p)| *p)
    }

    fn open(&self, qid: u16) -> Vec<Open> {
        let open = self.open.iter().filter(|(q, _)| *q == qid);
        open.map(|(_, o)| *o).collect()
    }

    fn admin_command(&self, cid: u16, head: u32) -> Option<[u8; 64]> {
        let kept = self.admin.iter().find(|(k, _)| *k == (cid, head));
        kept.map(|(_, sqe)| *sqe)
    }

    fn doorbell(&self, db: Doorbell) -> Option<u32> {
        self.doorbells
            .iter()
            .find(|(d, _)| *d == db)
            .map(|(_, v)| *v)
    }

    fn zone(&self, nsid: u32, zone: u32) -> (u64, u64) {
        self.zones.get(&(nsid, zone)).copied().unwrap_or_default()
    }
}

/// Enabled with `config`, recording into a [`Recorder`].
fn recorded_host(config: ControllerConfig) -> (Host, Arc<Recorder>) {
    let mut h = Host::with(config, 512);
    h.enable();
    let rec = Arc::new(Recorder::default());
    assert!(h.ctrl.record_crash_state(rec.clone()));
    (h, rec)
}

/// Saved now (paused, then resumed), the recorder's words set from it,
/// the completions owed released after it, as the keeper does.
fn checkpoint(h: &Host, rec: &Recorder) -> SavedState {
    checkpoint_then(h, rec, true)
}

/// As [`checkpoint`], releasing the completions owed if `release` (else
/// a crash falls between the slot and their release).
fn checkpoint_then(h: &Host, rec: &Recorder, release: bool) -> SavedState {
    h.ctrl.pause();
    let saved = h.ctrl.save_state().expect("quiescent");
    rec.checkpoint(&saved);
    if release {
        h.ctrl.release_owed();
    }
    h.ctrl.resume().unwrap();
    saved
}

/// Waits until admin command `cid` ran: its completion owed (recorded in
/// flight on SQ 0, nothing posted), or posted (a controller that does
/// not owe it).
fn await_admin_ran(h: &Host, rec: &Recorder, cid: u16) {
    await_ran(h, rec, 0, cid);
}

/// As [`await_admin_ran`], for command `cid` of SQ `qid` (on CQ `qid`).
fn await_ran(h: &Host, rec: &Recorder, qid: u16, cid: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let owed = || rec.with(|k| k.open.iter().any(|(q, o)| *q == qid && o.cid == cid));
    while !owed() && h.peek_cqe(qid).is_none() {
        assert!(
            Instant::now() < deadline,
            "command {cid} of SQ {qid} did not run"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Runs an admin command under a recorder, as the keeper would: its
/// completion comes after the checkpoint its effect is in.
fn admin_kept(h: &mut Host, rec: &Recorder, cmd: Command) -> (Completion, SavedState) {
    let cid = h.push(0, cmd);
    h.ring_sq(0);
    await_admin_ran(h, rec, cid);
    let saved = checkpoint(h, rec);
    let c = h.reap(0);
    assert_eq!(c.cid(), cid);
    (c, saved)
}

/// [`Host::create_pair`] under a recorder: the last checkpoint.
fn create_pair_kept(h: &mut Host, rec: &Recorder, qid: u16, size: u16) -> SavedState {
    h.mem
        .zero(GuestAddress(cq_base(qid)), u64::from(size) * 16)
        .unwrap();
    let (c, _) = admin_kept(h, rec, create_cq(qid, size, qid, cq_base(qid)));
    assert_eq!(c.status(), Status::SUCCESS, "create cq {qid}");
    let (c, saved) = admin_kept(h, rec, create_sq(qid, size, qid, sq_base(qid)));
    assert_eq!(c.status(), Status::SUCCESS, "create sq {qid}");
    h.rings[usize::from(qid)] = Some(Ring::new(sq_base(qid), cq_base(qid), size));
    saved
}

/// The crash: nothing more is recorded; the new controller gets `saved`
/// with what was recorded put over it, on a copy of guest memory and of
/// the namespace; the same host goes on with it. The commands completed
/// as interrupted.
fn crash_and_restore(
    h: &mut Host,
    config: ControllerConfig,
    rec: &Recorder,
    saved: &SavedState,
) -> Vec<(u16, u16)> {
    crash_and_restore_with(h, config, rec, saved, Vec::new())
}

/// As [`crash_and_restore`], with namespaces `more` beside namespace 1
/// (on copies the caller made at the crash).
fn crash_and_restore_with(
    h: &mut Host,
    config: ControllerConfig,
    rec: &Recorder,
    saved: &SavedState,
    more: Vec<NamespaceConfig>,
) -> Vec<(u16, u16)> {
    let kept = rec.with(|k| {
        k.dead = true;
        k.clone()
    });
    let mem = Arc::new(VecMemory::new(MEM_SIZE));
    mem.write(GuestAddress(0), &h.read_mem(0, MEM_SIZE))
        .unwrap();
    let mut state = saved.clone();
    let interrupted = state
        .put_positions(&kept, &*mem)
        .expect("the positions go on");
    let backend = Arc::new(RamDevice::new(h.backend.size()));
    let mut data = vec![0; h.backend.size() as usize];
    h.backend.read(0, &mut data).unwrap();
    backend.write(0, &data).unwrap();
    let irq = Arc::new(CountingIrq::default());
    let ctrl = Controller::restore(
        config,
        [vec![NamespaceConfig::new(1, 512, backend.clone())], more].concat(),
        &state,
        mem.clone(),
        irq.clone(),
    )
    .expect("the state restores");
    h.ctrl = ctrl;
    (h.mem, h.irq, h.backend) = (mem, irq, backend);
    interrupted
}

fn read(slba: u64) -> Command {
    rw(NvmOpcode::READ, 1, slba, 1, DATA, 0)
}

fn write(slba: u64) -> Command {
    rw(NvmOpcode::WRITE, 1, slba, 1, DATA, 0)
}

/// Waits until the recorder holds `n` commands in flight.
fn await_open(rec: &Recorder, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while rec.with(|k| k.open.len()) != n {
        assert!(Instant::now() < deadline, "{:?}", rec.with(|k| k.clone()));
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// CQ entry `i` of CQ 1 once it carries `phase`.
fn await_entry(h: &Host, i: u64, phase: bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let b = h.read_mem(cq_base(1) + i * 16, 16);
        if (b[14] & 1 == 1) == phase {
            return;
        }
        assert!(Instant::now() < deadline, "CQ entry {i} not posted");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Two SQs on one CQ of 8 entries; after the words stop (a crash inside a
/// long round), reads complete on both (the CQ wraps, its phase turns),
/// a write is held on each, one reusing the CID of a read completed
/// before it. The restore finds the three entries posted, completes the
/// two writes with Command Interrupted (DNR clear) after them with each
/// SQ's head, and the host goes on: the next command on each SQ is its
/// own, not a held write fetched again.
#[test]
fn commands_in_flight_complete_as_interrupted_after_the_entries_posted() {
    let (mut h, rec) = recorded_host(config());
    create_pair_kept(&mut h, &rec, 1, 8);
    let (c, saved) = admin_kept(&mut h, &rec, create_sq(2, 8, 1, sq_base(2)));
    assert_eq!(c.status(), Status::SUCCESS);
    h.rings[2] = Some(Ring::new(sq_base(2), cq_base(1), 8));
    for lba in 0..6 {
        assert_eq!(h.submit(1, read(lba)).status(), Status::SUCCESS);
    }
    rec.with(|k| k.words_frozen = true);
    // CQ 1's entries 6 and 7 (phase 1), on SQ 1 and SQ 2.
    let a = h.push(1, read(6));
    h.ring_sq(1);
    await_entry(&h, 6, true);
    let b = h.push(2, read(7));
    h.ring_sq(2);
    await_entry(&h, 7, true);
    let spec = FaultSpec {
        nsid: Some(1),
        opcodes: vec![NvmOpcode::WRITE.0],
        count: Some(2),
        ..FaultSpec::new(FaultKind::NeverComplete)
    };
    h.ctrl.fault_add(spec).unwrap();
    // The host saw A's entry: it may use A's CID again.
    h.cid = a - 1;
    let c = h.push(1, write(8));
    assert_eq!(c, a);
    h.ring_sq(1);
    h.cid = b + 10;
    let d = h.push(2, write(9));
    h.ring_sq(2);
    await_open(&rec, 2);
    // CQ 1's entry 0 of the next lap (phase 0).
    let e = h.push(1, read(10));
    h.ring_sq(1);
    await_entry(&h, 0, false);
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![(1, c), (2, d)]);
    let got: Vec<(u16, u16, u16, Status)> = h
        .reap_batch(1, 5)
        .iter()
        .map(|x| (x.sqid(), x.cid(), x.sq_head(), x.status()))
        .collect();
    // SQ 1: A, C, E fetched (head 9 % 8 = 1); SQ 2: B, D (head 2).
    assert_eq!(
        got,
        vec![
            (1, a, 7, Status::SUCCESS),
            (2, b, 1, Status::SUCCESS),
            (1, e, 1, Status::SUCCESS),
            (1, c, 1, Status::COMMAND_INTERRUPTED),
            (2, d, 2, Status::COMMAND_INTERRUPTED),
        ]
    );
    assert!(!Status::COMMAND_INTERRUPTED.dnr());
    // The CQ's interrupt was raised for them.
    assert!(h.irq.count(1) >= 1);
    // Retried, each completes; nothing else was fetched before them.
    let next = h.push(2, write(9));
    h.ring_sq(2);
    let x = h.reap(1);
    assert_eq!((x.sqid(), x.cid(), x.status()), (2, next, Status::SUCCESS));
    let next = h.push(1, write(8));
    h.ring_sq(1);
    let x = h.reap(1);
    assert_eq!((x.sqid(), x.cid(), x.status()), (1, next, Status::SUCCESS));
}

/// `trap` mode: a SQ tail doorbell write answered while the workers do
/// not run (the worker had not taken it at the crash) is not lost: the
/// restored controller fetches the command it rang.
#[test]
fn a_trapped_doorbell_no_worker_took_is_fetched_after_the_restore() {
    let trap = mode_config(DoorbellMode::Trap);
    let (mut h, rec) = recorded_host(trap.clone());
    let saved = create_pair_kept(&mut h, &rec, 1, 8);
    for lba in 0..2 {
        assert_eq!(h.submit(1, read(lba)).status(), Status::SUCCESS);
    }
    h.ctrl.pause();
    let r = h.push(1, read(2));
    h.ring_sq(1);
    assert_eq!(
        rec.with(|k| k.doorbell(Doorbell::SqTail(1))),
        Some(3),
        "the trap was recorded"
    );
    let interrupted = crash_and_restore(&mut h, trap, &rec, &saved);
    assert_eq!(interrupted, vec![]);
    let x = h.reap(1);
    assert_eq!((x.cid(), x.sq_head(), x.status()), (r, 3, Status::SUCCESS));
}

/// A CQ in guest memory, for [`read_posted`].
fn cq(size: u32, tail: u32, phase: bool) -> SavedCq {
    SavedCq {
        qid: 1,
        base: cq_base(1),
        size,
        head: tail,
        tail,
        phase,
        ien: true,
        iv: 1,
        source: SavedSource::Register,
        bad_head: None,
    }
}

fn put_entry(mem: &VecMemory, i: u32, sqid: u16, cid: u16, sqhd: u16, phase: bool) {
    let cqe = Completion::new(0, sqhd, sqid, cid, phase, Status::SUCCESS);
    mem.write(GuestAddress(cq_base(1) + u64::from(i) * 16), cqe.as_bytes())
        .unwrap();
}

/// The CQ reading by itself: entries past the tail while they carry the
/// lap's phase, across the end of the ring (the phase turns), from
/// several SQs, in the order posted; never more than a full CQ holds.
#[test]
fn the_cq_is_read_past_its_tail_by_phase() {
    let mem = VecMemory::new(MEM_SIZE);
    // The recorded tail is 2 in a phase 1 lap: 0 and 1 were posted in it
    // (phase 1), 2 and 3 in the lap before (phase 0). Then 2 (phase 1)
    // at 2 and 3, and 1 of the next lap (phase 0) at 0.
    for i in 0..4 {
        put_entry(&mem, i, 9, 99, 0, i < 2);
    }
    put_entry(&mem, 2, 1, 10, 5, true);
    put_entry(&mem, 3, 2, 11, 6, true);
    put_entry(&mem, 0, 1, 12, 7, false);
    let mut c = cq(4, 2, true);
    let found = read_posted(&mut c, &mem).unwrap();
    let p = |sqid, cid, sqhd| Posted { sqid, cid, sqhd };
    assert_eq!(found, vec![p(1, 10, 5), p(2, 11, 6), p(1, 12, 7)]);
    assert_eq!((c.tail, c.phase), (1, false));
    // Nothing new: nothing read, nothing moved.
    let found = read_posted(&mut c, &mem).unwrap();
    assert_eq!((found.len(), c.tail, c.phase), (0, 1, false));
    // A full CQ: every entry carries the phase; size - 1 at most are new
    // (a CQ holds no more), so the reading stops there.
    for i in 0..4 {
        put_entry(&mem, i, 1, i as u16, 0, true);
    }
    let mut c = cq(4, 1, true);
    let found = read_posted(&mut c, &mem).unwrap();
    assert_eq!(
        found.iter().map(|f| f.cid).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    assert_eq!((c.tail, c.phase), (0, false));
    // Positions out of range read nothing.
    let mut c = cq(4, 4, true);
    assert_eq!(read_posted(&mut c, &mem).unwrap(), vec![]);
    // Unreadable memory is an error that names the entry.
    let mut c = SavedCq {
        base: MEM_SIZE as u64,
        ..cq(4, 0, true)
    };
    let err = read_posted(&mut c, &mem).unwrap_err();
    assert!(err.starts_with("reading CQ 1's entry 0: "), "{err}");
}

/// Reads LBA `slba` on queue pair 1: its status.
fn read_on_1(h: &mut Host, slba: u64) -> Status {
    h.submit(1, read(slba)).status()
}

/// The gap of issue 35 item 3: an admin command whose completion the
/// guest saw must be in the state a crash restores. Its completion is
/// owed until a checkpoint holds its effect: killed before (the last
/// checkpoint without the new queue), the guest never saw it complete,
/// and the restored controller runs it again (`rerun.rs`), not as
/// interrupted. (Before, the completion was posted at once: the guest saw
/// its CQ created, and the restored controller did not know it.)
#[test]
fn an_admin_completion_is_not_visible_before_a_checkpoint_holds_its_effect() {
    let (mut h, rec) = recorded_host(config());
    let saved = checkpoint(&h, &rec);
    // A read of the state (Identify) is posted at once.
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
    h.mem.zero(GuestAddress(cq_base(1)), 8 * 16).unwrap();
    let cid = h.push(0, create_cq(1, 8, 1, cq_base(1)));
    h.ring_sq(0);
    await_admin_ran(&h, &rec, cid);
    assert!(
        h.peek_cqe(0).is_none(),
        "Create I/O CQ completed before a checkpoint held the new CQ"
    );
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![], "run again, not interrupted");
    assert!(h.peek_cqe(0).is_none(), "completed before it ran again");
}

/// Killed after the checkpoint that holds the new queues and before their
/// completion was posted: the restored controller posts it, once, and
/// the queue pair serves I/O. Killed after the post: it is not posted
/// again.
#[test]
fn a_completion_owed_at_the_crash_is_posted_once_by_the_restore() {
    let (mut h, rec) = recorded_host(config());
    create_pair_kept(&mut h, &rec, 1, 8);
    // Create I/O SQ 2 on CQ 1: the checkpoint holds it, no post yet.
    let cid = h.push(0, create_sq(2, 8, 1, sq_base(2)));
    h.ring_sq(0);
    await_admin_ran(&h, &rec, cid);
    let saved = checkpoint_then(&h, &rec, false);
    assert!(h.peek_cqe(0).is_none(), "posted before its release");
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![]);
    let c = h.reap(0);
    assert_eq!((c.cid(), c.status()), (cid, Status::SUCCESS));
    h.rings[2] = Some(Ring::new(sq_base(2), cq_base(1), 8));
    // The queue is there: a read on it completes on CQ 1.
    let r = h.push(2, read(1));
    h.ring_sq(2);
    let x = h.reap(1);
    assert_eq!((x.sqid(), x.cid(), x.status()), (2, r, Status::SUCCESS));
    // Once: the next admin completion is the next command's.
    assert!(h.ctrl.record_crash_state(rec.clone()));
    rec.with(|k| k.dead = false);
    let (c, saved) = admin_kept(&mut h, &rec, delete(AdminOpcode::DELETE_IO_SQ, 2));
    assert_eq!(c.status(), Status::SUCCESS);
    // Killed after that one was posted (its checkpoint released it):
    // the restore posts nothing.
    let interrupted = crash_and_restore(&mut h, config(), &rec, &saved);
    assert_eq!(interrupted, vec![]);
    // The restored controller has no record: posted at once.
    let c = h.admin(get_features(0x07, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(read_on_1(&mut h, 2), Status::SUCCESS);
}

/// The completions owed are in the encoded state (format 3) and read
/// back; a format 2 state (never any) reads as none owed; a state owing
/// a completion on a SQ it does not hold, or more than its CQ has room
/// for, is refused at the restore by name.
#[test]
fn owed_completions_are_encoded_and_a_hostile_list_is_refused() {
    let (mut h, rec) = recorded_host(config());
    create_pair_kept(&mut h, &rec, 1, 8);
    let cid = h.push(0, create_sq(2, 8, 1, sq_base(2)));
    h.ring_sq(0);
    await_admin_ran(&h, &rec, cid);
    let saved = checkpoint_then(&h, &rec, false);
    assert_eq!(
        saved.owed(),
        vec![(
            0,
            Open {
                cid,
                head: 3,
                late: false
            }
        )]
    );
    let bytes = saved.encode();
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), 3);
    assert_eq!(SavedState::decode(&bytes).unwrap(), saved);
    // Format 2: the same body without `owed`.
    let mut none = saved.clone();
    none.body.queues.owed.clear();
    let mut v2 = none.encode();
    v2[8..12].copy_from_slice(&2u32.to_le_bytes());
    assert_eq!(SavedState::decode(&v2).unwrap(), none);
    let restore = |state: &SavedState| {
        let mem = Arc::new(VecMemory::new(MEM_SIZE));
        let backend = Arc::new(RamDevice::new(h.backend.size()));
        let err = Controller::restore(
            config(),
            vec![NamespaceConfig::new(1, 512, backend)],
            state,
            mem,
            Arc::new(CountingIrq::default()),
        )
        .map(drop)
        .unwrap_err();
        let why = std::error::Error::source(&err).map(|e| e.to_string());
        format!("{err}: {}", why.unwrap_or_default())
    };
    let mut hostile = saved.clone();
    hostile.body.queues.owed[0].sqid = 9;
    let err = restore(&hostile);
    assert!(
        err.contains("a completion is owed on SQ 9, which is not saved"),
        "{err}"
    );
    // The admin CQ has 32 entries (31 usable); the first that finds no
    // room refuses the restore.
    let mut hostile = saved.clone();
    hostile.body.queues.owed = vec![hostile.body.queues.owed[0]; 40];
    let err = restore(&hostile);
    assert!(
        err.contains("CQ 0 has no room for the completion owed"),
        "{err}"
    );
}

/// Reservation Register (RREGA 0: register `key`) on SQ 1, its data at
/// `DATA`.
fn register(h: &mut Host, key: u64) -> u16 {
    let data = [0u64.to_le_bytes(), key.to_le_bytes()].concat();
    h.mem.write(GuestAddress(DATA), &data).unwrap();
    let mut c = cmd(NvmOpcode::RESERVATION_REGISTER.0);
    c.nsid = U32::new(1);
    c.prp1 = U64::new(DATA);
    h.push(1, c)
}

/// Reservation Acquire (Write Exclusive) with `key`: its status.
fn acquire(h: &mut Host, key: u64) -> Status {
    let data = [key.to_le_bytes(), 0u64.to_le_bytes()].concat();
    h.mem.write(GuestAddress(DATA), &data).unwrap();
    let mut c = cmd(NvmOpcode::RESERVATION_ACQUIRE.0);
    c.nsid = U32::new(1);
    c.prp1 = U64::new(DATA);
    c.cdw10 = U32::new(1 << 8);
    h.submit(1, c).status()
}

/// Host Identifier 7, queue pair 1 and a Reservation Register of `key`
/// run, its completion owed: the checkpoint before it.
fn registered_and_owed(key: u64) -> (Host, Arc<Recorder>, SavedState, u16) {
    let (mut h, rec) = recorded_host(config());
    h.mem.write(GuestAddress(DATA), &[7; 8]).unwrap();
    let mut c = set_features(0x81, 0);
    c.prp1 = U64::new(DATA);
    assert_eq!(admin_kept(&mut h, &rec, c).0.status(), Status::SUCCESS);
    let before = create_pair_kept(&mut h, &rec, 1, 8);
    let cid = register(&mut h, key);
    h.ring_sq(1);
    await_ran(&h, &rec, 1, cid);
    assert!(
        h.peek_cqe(1).is_none(),
        "posted before a checkpoint held it"
    );
    (h, rec, before, cid)
}

/// A reservation command that changed something is owed as an admin
/// command is: a crash before the checkpoint that holds the new
/// registrant completes the Register with Command Interrupted, and the
/// key is unknown (an Acquire with it is a conflict); retried, it
/// registers.
#[test]
fn a_registrant_the_host_did_not_see_registered_is_interrupted() {
    const KEY: u64 = 0xA1;
    let (mut h, rec, before, cid) = registered_and_owed(KEY);
    let interrupted = crash_and_restore(&mut h, config(), &rec, &before);
    assert_eq!(interrupted, vec![(1, cid)]);
    let x = h.reap(1);
    assert_eq!((x.cid(), x.status()), (cid, Status::COMMAND_INTERRUPTED));
    let conflict = Status::RESERVATION_CONFLICT.with_dnr(true);
    assert_eq!(acquire(&mut h, KEY), conflict);
    let again = register(&mut h, KEY);
    h.ring_sq(1);
    let x = h.reap(1);
    assert_eq!((x.cid(), x.status()), (again, Status::SUCCESS));
    assert_eq!(acquire(&mut h, KEY), Status::SUCCESS);
}

/// A crash after the checkpoint that holds the new registrant and before
/// the Register's completion was posted: the restore posts it, once, and
/// the key is registered (an Acquire with it succeeds). (Before, the
/// Register was posted at once, and a crash before the next checkpoint
/// forgot the registrant the host had seen registered.)
#[test]
fn a_registrant_the_host_saw_registered_survives_the_crash() {
    const KEY: u64 = 0xA1;
    let (mut h, rec, _, cid) = registered_and_owed(KEY);
    let slot = checkpoint_then(&h, &rec, false);
    assert!(h.peek_cqe(1).is_none(), "posted before its release");
    let interrupted = crash_and_restore(&mut h, config(), &rec, &slot);
    assert_eq!(interrupted, vec![]);
    let x = h.reap(1);
    assert_eq!((x.cid(), x.status()), (cid, Status::SUCCESS));
    assert_eq!(acquire(&mut h, KEY), Status::SUCCESS);
    assert!(h.peek_cqe(1).is_none(), "a second completion");
}
