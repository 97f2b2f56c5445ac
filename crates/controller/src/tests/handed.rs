//! Commands held back at a save for a live upgrade
//! ([`Controller::save_state_handing`]): handed to the restored controller,
//! which holds them again and completes each once; handed commands that
//! do not fit the restored queues are refused by name.

use super::*;
use crate::qos::{QosLimits, QosTarget};
use crate::{HandedCommand, Hold, SavedState};

fn read(slba: u64) -> Command {
    rw(NvmOpcode::READ, 1, slba, 1, DATA + slba * 512, 0)
}

/// Enabled, one I/O pair of 16 entries, reads limited to 20 a second
/// with a burst of one; `n` reads rung, the first reaped: the others
/// wait for the limit. Then paused. Their CIDs.
fn held_reads(n: u64) -> (Host, Vec<u16>) {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let mut l = QosLimits::default();
    l.set("read_iops", 20).unwrap();
    l.set("read_iops_burst", 1).unwrap();
    h.ctrl.qos_set(QosTarget::Namespace(1), l).unwrap();
    let cids: Vec<u16> = (0..n).map(|i| h.push(1, read(i))).collect();
    h.ring_sq(1);
    assert_eq!(h.reap(1).cid(), cids[0]);
    h.ctrl.pause();
    (h, cids[1..].to_vec())
}

/// `state` restored on a copy of `h`'s memory and namespace, with a host
/// side that goes on from `h`'s.
fn restored(h: &Host, state: &SavedState) -> Result<Host, crate::StateError> {
    let mem = Arc::new(VecMemory::new(MEM_SIZE));
    mem.write(GuestAddress(0), &h.read_mem(0, MEM_SIZE))
        .unwrap();
    let backend = Arc::new(RamDevice::new(NS_BLOCKS * 512));
    let irq = Arc::new(CountingIrq::default());
    let ns = NamespaceConfig::new(1, 512, backend.clone());
    let ctrl = Controller::restore(config(), vec![ns], state, mem.clone(), irq.clone())?;
    Ok(Host {
        ctrl,
        mem,
        irq,
        backend,
        rings: h.rings.clone(),
        cid: h.cid,
        dbbuf: h.dbbuf,
        spdk: h.spdk,
    })
}

/// The state `h` saves for an upgrade, through its encoding and the
/// manifest's JSON, as the new process reads it.
fn handed_over(h: &Host) -> SavedState {
    let saved = h
        .ctrl
        .save_state_handing()
        .expect("saved, held commands aside");
    let json = serde_json::to_string(saved.handed()).unwrap();
    let handed: Vec<HandedCommand> = serde_json::from_str(&json).unwrap();
    SavedState::decode(&saved.encode())
        .unwrap()
        .with_handed(handed)
}

#[test]
fn throttled_commands_are_handed_to_the_restored_controller_and_complete_once() {
    let (h, held) = held_reads(4);
    assert!(
        matches!(h.ctrl.save_state(), Err(crate::StateError::Busy(_))),
        "a plain save still refuses them"
    );
    let state = handed_over(&h);
    let handed = state.handed();
    assert_eq!(handed.len(), 3);
    assert!(handed
        .iter()
        .all(|c| c.hold == Hold::Qos && c.sqid == 1 && c.cqid == 1));
    let mut cids: Vec<u16> = handed.iter().map(|c| c.cid).collect();
    cids.sort_unstable();
    assert_eq!(cids, held);
    let mut b = restored(&h, &state).expect("restores with its held commands");
    let mut done: Vec<u16> = (0..3)
        .map(|_| {
            let c = b.reap(1);
            assert_eq!(c.status(), Status::SUCCESS, "{c:?}");
            c.cid()
        })
        .collect();
    done.sort_unstable();
    assert_eq!(done, held, "each held read completed once");
    assert!(b.wait_cqe(1).is_none(), "nothing more");
    // The queue goes on.
    assert_eq!(b.submit(1, read(9)).status(), Status::SUCCESS);
}

#[test]
fn handed_commands_that_do_not_fit_are_refused_by_name() {
    let (h, _) = held_reads(2);
    let state = handed_over(&h);
    let one = state.handed()[0].clone();
    let refused = |handed: Vec<HandedCommand>| {
        let s = state.clone().with_handed(handed);
        match restored(&h, &s) {
            Ok(_) => panic!("restored"),
            Err(e) => chain(&e),
        }
    };
    let mut bad_cid = one.clone();
    bad_cid.cid ^= 0x100;
    assert!(refused(vec![bad_cid]).contains("its SQE has CID"));
    let mut no_sq = one.clone();
    no_sq.sqid = 5;
    assert!(refused(vec![no_sq]).contains("SQ is not in the saved state"));
    let mut admin = one.clone();
    (admin.sqid, admin.cqid) = (0, 0);
    assert!(refused(vec![admin]).contains("the admin queue's"));
    let mut wrong_cq = one.clone();
    wrong_cq.cqid = 0;
    assert!(refused(vec![wrong_cq]).contains("SQ 1 posts to CQ 1, not 0"));
    // A CQ of 16 entries holds 15: one more has no room.
    let many: Vec<HandedCommand> = (0..16).map(|_| one.clone()).collect();
    assert!(refused(many).contains("no room"));
    let mut never = one.clone();
    never.hold = Hold::Never;
    never.sqid = 200;
    assert!(refused(vec![never]).contains("no such SQ"));
}

/// An error and its sources, as one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    s
}
