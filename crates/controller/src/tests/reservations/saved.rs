//! A subsystem of two controllers saved and restored whole (format 2 of
//! docs/state-format.md, a live upgrade of `--socket A --socket B`): the
//! first restored with [`Controller::restore`], the second joining it
//! with [`Controller::restore_joining`]. Host 1's reservation, the ANA
//! state of controller 2's path and each controller's attachment come
//! back, through two save and restore rounds.

use super::hosts::pair;
use super::*;
use crate::subsystem::ana::AnaState;
use crate::testing::{CountingIrq, VecMemory};
use crate::{SavedState, StateError};

const INACCESSIBLE: Status = Status::ASYMMETRIC_ACCESS_INACCESSIBLE.with_dnr(false);
const NOT_ATTACHED: Status = Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true);

/// `h`'s controller paused and saved through its encoding.
fn saved(h: &Host) -> SavedState {
    h.ctrl.pause();
    let state = h.ctrl.save_state().expect("saved at a quiescent point");
    SavedState::decode(&state.encode()).expect("its own encoding decodes")
}

/// `h`'s host side on `ctrl`, with a copy of its guest memory.
fn moved(h: &Host, make: impl FnOnce(Arc<VecMemory>, Arc<CountingIrq>) -> Controller) -> Host {
    let mem = Arc::new(VecMemory::new(MEM_SIZE));
    mem.write(GuestAddress(0), &h.read_mem(0, MEM_SIZE))
        .unwrap();
    let irq = Arc::new(CountingIrq::default());
    Host {
        ctrl: make(mem.clone(), irq.clone()),
        mem,
        irq,
        backend: h.backend.clone(),
        rings: h.rings.clone(),
        cid: h.cid,
        dbbuf: h.dbbuf,
        spdk: h.spdk,
    }
}

/// Both controllers paused at once, saved, and restored as a new
/// subsystem on the same namespace (the old controllers stay paused).
fn upgraded(a: &Host, b: &Host) -> (Host, Host) {
    let (sa, sb) = (saved(a), saved(b));
    let ns = vec![NamespaceConfig::new(1, 512, a.backend.clone())];
    let na = moved(a, |mem, irq| {
        Controller::restore(config(), ns, &sa, mem, irq).expect("controller 1 restores")
    });
    let cfg = ControllerConfig {
        cntlid: 2,
        ..config()
    };
    let nb = moved(b, |mem, irq| {
        Controller::restore_joining(&na.ctrl, cfg, None, None, &sb, mem, irq)
            .expect("controller 2 restores, joining controller 1")
    });
    (na, nb)
}

#[test]
fn two_controllers_keep_reservation_ana_and_attachment_through_two_restores() {
    let (mut a, mut b) = pair();
    assert_eq!(a.register(0, false, 0, 0, KEY_A), Status::SUCCESS);
    assert_eq!(
        a.acquire(0, 1, KEY_A, 0),
        Status::SUCCESS,
        "Write Exclusive"
    );
    assert_eq!(a.ctrl.ana_set(2, Some(1), AnaState::Inaccessible), Ok(true));
    assert_eq!(b.io(NvmOpcode::READ), INACCESSIBLE);

    let (mut a, mut b) = upgraded(&a, &b);
    assert_eq!(
        a.ctrl.ana_states(),
        vec![(1, 1, AnaState::Optimized), (2, 1, AnaState::Inaccessible)],
        "controller 2's path is still inaccessible"
    );
    assert_eq!(b.io(NvmOpcode::READ), INACCESSIBLE);
    assert_eq!(a.io(NvmOpcode::WRITE), Status::SUCCESS);
    assert_eq!(a.ctrl.ana_set(2, Some(1), AnaState::Optimized), Ok(true));
    assert_eq!(b.io(NvmOpcode::WRITE), CONFLICT, "host 1 still holds it");
    assert_eq!(b.io(NvmOpcode::READ), Status::SUCCESS);
    let (head, regs) = b.status_of();
    assert_eq!((head.rtype, head.regctl.get()), (1, 1));
    assert_eq!((regs[0].cntlid.get(), regs[0].hostid), (1, id(1)));

    // Namespace 1 detached from controller 2 only, through controller 1.
    // A Controller List: one identifier, CNTLID 2.
    let mut list = vec![0u8; 4096];
    list[..4].copy_from_slice(&[1, 0, 2, 0]);
    a.mem.write(GuestAddress(BUF), &list).unwrap();
    let mut c = cmd(AdminOpcode::NAMESPACE_ATTACHMENT.0);
    c.nsid = U32::new(1);
    c.prp1 = U64::new(BUF);
    c.cdw10 = U32::new(1);
    assert_eq!(a.admin(c).status(), Status::SUCCESS, "detached from 2");
    assert_eq!(b.io(NvmOpcode::READ), NOT_ATTACHED);

    let (mut a, mut b) = upgraded(&a, &b);
    assert_eq!(b.io(NvmOpcode::READ), NOT_ATTACHED, "still detached from 2");
    assert_eq!(a.io(NvmOpcode::WRITE), Status::SUCCESS, "attached to 1");
    assert_eq!(
        a.ctrl.ana_states(),
        vec![(1, 1, AnaState::Optimized), (2, 1, AnaState::Optimized)]
    );
    assert_eq!(a.release(0, false, 1, KEY_A), Status::SUCCESS);
}

#[test]
fn a_joining_state_that_disagrees_with_the_subsystem_is_refused() {
    let (a, b) = pair();
    let (sa, sb) = (saved(&a), saved(&b));
    // Controller 2's state restored as controller 1's: its attachment
    // names controller 2, which the joiner (CNTLID 3) then disagrees with.
    let ns = vec![NamespaceConfig::new(1, 512, a.backend.clone())];
    let first = moved(&a, |mem, irq| {
        Controller::restore(config(), ns, &sa, mem, irq).unwrap()
    });
    let cfg = ControllerConfig {
        cntlid: 3,
        ..config()
    };
    let mem = Arc::new(VecMemory::new(MEM_SIZE));
    let irq = Arc::new(CountingIrq::default());
    match Controller::restore_joining(&first.ctrl, cfg, None, None, &sb, mem, irq) {
        Err(StateError::Invalid(e)) => {
            assert!(e.to_string().contains("attachment to controller 3"), "{e}")
        }
        other => panic!("refused as invalid, got {:?}", other.map(|_| ())),
    }
}

/// `state` as format 1 wrote it: without `attached_to` and `ana`.
fn as_format_1(state: &SavedState) -> Vec<u8> {
    let mut body: serde_json::Value =
        serde_json::from_slice(&state.encode()[crate::HEADER_LEN..]).unwrap();
    let sub = body["subsystem"].as_object_mut().unwrap();
    assert!(sub.remove("ana").is_some());
    for ns in sub["namespaces"].as_array_mut().unwrap() {
        assert!(ns.as_object_mut().unwrap().remove("attached_to").is_some());
    }
    let json = serde_json::to_vec(&body).unwrap();
    let mut out = crate::MAGIC.to_vec();
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&(crate::HEADER_LEN as u32).to_le_bytes());
    out.extend_from_slice(&(json.len() as u64).to_le_bytes());
    out.extend_from_slice(&vnvme_crc::crc64_nvme(&json).to_le_bytes());
    out.extend_from_slice(&json);
    out
}

#[test]
fn a_format_1_state_reads_as_its_controller_only_and_cannot_join() {
    let (a, b) = pair();
    assert_eq!(a.ctrl.ana_set(2, Some(1), AnaState::Inaccessible), Ok(true));
    let (sa, sb) = (saved(&a), saved(&b));
    let old_a = SavedState::decode(&as_format_1(&sa)).expect("format 1 is read");
    let old_b = SavedState::decode(&as_format_1(&sb)).expect("format 1 is read");
    let ns = vec![NamespaceConfig::new(1, 512, a.backend.clone())];
    let mut na = moved(&a, |mem, irq| {
        Controller::restore(config(), ns, &old_a, mem, irq).expect("restores alone")
    });
    assert_eq!(na.io(NvmOpcode::WRITE), Status::SUCCESS, "attached to 1");
    assert_eq!(
        na.ctrl.ana_states(),
        vec![],
        "format 1 had no ANA states, and the subsystem one controller yet"
    );
    // Format 1 knew one controller's attachment: the joiner's says it is
    // attached, the table (from controller 1's state) that it is not.
    let cfg = ControllerConfig {
        cntlid: 2,
        ..config()
    };
    let (mem, irq) = (
        Arc::new(VecMemory::new(MEM_SIZE)),
        Arc::new(CountingIrq::default()),
    );
    match Controller::restore_joining(&na.ctrl, cfg, None, None, &old_b, mem, irq) {
        Err(StateError::Invalid(e)) => {
            assert!(e.to_string().contains("attachment to controller 2"), "{e}")
        }
        other => panic!("refused as invalid, got {:?}", other.map(|_| ())),
    }
}
