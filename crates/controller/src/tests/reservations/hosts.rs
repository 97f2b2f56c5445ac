//! Reservations between hosts: controllers of one subsystem
//! (`Controller::joining`), each with its own Host Identifier, share one
//! namespace and its registrants. A host is its identifier: two
//! controllers with the same one are one host, listed once per controller
//! in Reservation Report.

use super::*;
use crate::testing::{CountingIrq, VecMemory};

const KEY_C: u64 = 0xCCCC;

impl Host {
    /// Controller `cntlid` of `first`'s subsystem, enabled, as host `n`
    /// (8-byte identifier), with I/O queue pair 1.
    pub(in crate::tests) fn joining(first: &Host, cntlid: u16, n: u8) -> Host {
        let cfg = ControllerConfig { cntlid, ..config() };
        let ctrl = Controller::joining(&first.ctrl, cfg, None, None).unwrap();
        let mem = Arc::new(VecMemory::new(MEM_SIZE));
        let irq = Arc::new(CountingIrq::default());
        ctrl.attach(mem.clone(), irq.clone());
        let mut h = Host {
            ctrl,
            mem,
            irq,
            backend: first.backend.clone(),
            rings: vec![None; 16],
            cid: 0,
            dbbuf: None,
            spdk: false,
        };
        h.enable();
        h.become_host(n, false);
        h
    }
}

/// Host 1 on CNTLID 1 and host 2 on CNTLID 2.
pub(super) fn pair() -> (Host, Host) {
    let a = host(1);
    let b = Host::joining(&a, 2, 2);
    (a, b)
}

#[test]
fn write_exclusive_held_by_one_controller_conflicts_on_the_other() {
    let (mut a, mut b) = pair();
    assert_eq!(a.register(0, false, 0, 0, KEY_A), Status::SUCCESS);
    assert_eq!(a.acquire(0, 1, KEY_A, 0), Status::SUCCESS);
    assert_eq!(b.io(NvmOpcode::WRITE), CONFLICT);
    assert_eq!(b.io(NvmOpcode::READ), Status::SUCCESS);
    assert_eq!(a.io(NvmOpcode::WRITE), Status::SUCCESS);
    let (head, regs) = b.status_of();
    assert_eq!((head.rtype, head.regctl.get()), (1, 1));
    assert_eq!(
        (regs[0].cntlid.get(), regs[0].hostid, regs[0].rcsts),
        (1, id(1), 1),
        "host 1 is on CNTLID 1"
    );
    assert_eq!(b.acquire(0, 1, KEY_B, 0), CONFLICT, "not registered");
    assert_eq!(a.release(0, false, 1, KEY_A), Status::SUCCESS);
    assert_eq!(b.io(NvmOpcode::WRITE), Status::SUCCESS);
    assert_eq!(b.status_of().0.rtype, 0);
}

#[test]
fn each_type_held_on_one_controller_answers_the_other_as_the_spec_table() {
    let ok = |allowed: bool| if allowed { Status::SUCCESS } else { CONFLICT };
    for (rtype, reg_read, reg_write, read, write) in super::TYPE_TABLE {
        let (mut a, mut b) = pair();
        a.register(0, false, 0, 0, KEY_A);
        assert_eq!(a.acquire(0, rtype, KEY_A, 0), Status::SUCCESS);
        for op in [NvmOpcode::READ, NvmOpcode::COMPARE, NvmOpcode::VERIFY] {
            assert_eq!(
                b.io(op).same_code(CONFLICT),
                !read,
                "other's {op:?}, type {rtype}"
            );
        }
        for op in [
            NvmOpcode::WRITE,
            NvmOpcode::WRITE_ZEROES,
            NvmOpcode::FLUSH,
            NvmOpcode::WRITE_UNCORRECTABLE,
            NvmOpcode::DATASET_MANAGEMENT,
        ] {
            assert_eq!(
                b.io(op).same_code(CONFLICT),
                !write,
                "other's {op:?}, type {rtype}"
            );
        }
        assert_eq!(
            b.flush_all(),
            ok(write),
            "other's Flush to every namespace, type {rtype}"
        );
        assert_eq!(a.flush_all(), Status::SUCCESS, "holder's, type {rtype}");
        assert_eq!(b.register(0, false, 0, 0, KEY_B), Status::SUCCESS);
        assert_eq!(
            b.io(NvmOpcode::READ),
            ok(reg_read),
            "registrant reads, {rtype}"
        );
        assert_eq!(
            b.io(NvmOpcode::WRITE),
            ok(reg_write),
            "registrant writes, {rtype}"
        );
        assert_eq!(
            b.flush_all(),
            ok(reg_write),
            "registrant's Flush to every namespace, {rtype}"
        );
        assert_eq!(
            a.io(NvmOpcode::WRITE),
            Status::SUCCESS,
            "holder, type {rtype}"
        );
        let (head, regs) = a.status_of();
        assert_eq!(head.regctl.get(), 2);
        let all = rtype >= 5;
        assert_eq!(
            regs.iter()
                .map(|r| (r.cntlid.get(), r.rcsts))
                .collect::<Vec<_>>(),
            [(1, 1), (2, u8::from(all))],
            "holders, type {rtype}"
        );
    }
}

#[test]
fn controllers_with_one_host_identifier_are_one_host() {
    let (mut a, mut b) = pair();
    let mut a2 = Host::joining(&a, 3, 1);
    a.register(0, false, 0, 0, KEY_A);
    assert_eq!(
        a.acquire(0, 2, KEY_A, 0),
        Status::SUCCESS,
        "Exclusive Access"
    );
    assert_eq!(
        a2.io(NvmOpcode::WRITE),
        Status::SUCCESS,
        "the holder's other controller"
    );
    assert_eq!(a2.io(NvmOpcode::READ), Status::SUCCESS);
    assert_eq!(b.io(NvmOpcode::READ), CONFLICT);
    assert_eq!(
        a2.register(0, false, 0, 0, KEY_C),
        CONFLICT,
        "registered already, with another key"
    );
    assert_eq!(
        a2.register(0, false, 0, 0, KEY_A),
        Status::SUCCESS,
        "same key"
    );
    b.register(0, false, 0, 0, KEY_B);
    let (head, regs) = b.status_of();
    assert_eq!((head.regctl.get(), head.gen.get()), (3, 2));
    assert_eq!(
        regs.iter()
            .map(|r| (r.cntlid.get(), r.hostid, r.rcsts, r.rkey.get()))
            .collect::<Vec<_>>(),
        [
            (1, id(1), 1, KEY_A),
            (3, id(1), 1, KEY_A),
            (2, id(2), 0, KEY_B)
        ]
    );
    // The host's registration outlives one of its controllers.
    drop(a);
    let (head, regs) = b.status_of();
    assert_eq!(head.regctl.get(), 2);
    assert_eq!((regs[0].cntlid.get(), regs[0].hostid), (3, id(1)));
    drop(a2);
    let (head, regs) = b.status_of();
    assert_eq!(head.regctl.get(), 2);
    assert_eq!(
        (regs[0].cntlid.get(), regs[0].hostid, regs[0].rcsts),
        (0xFFFF, id(1), 1),
        "no controller: CNTLID FFFFh"
    );
}

#[test]
fn preempt_from_the_other_controller_takes_the_reservation() {
    let (mut a, mut b) = pair();
    a.register(0, false, 0, 0, KEY_A);
    a.acquire(0, 1, KEY_A, 0);
    assert_eq!(b.acquire(1, 1, KEY_B, KEY_A), CONFLICT, "not registered");
    b.register(0, false, 0, 0, KEY_B);
    assert_eq!(b.acquire(1, 1, KEY_A, KEY_A), CONFLICT, "not b's key");
    assert_eq!(b.acquire(1, 3, KEY_B, KEY_A), Status::SUCCESS);
    assert_eq!(a.io(NvmOpcode::WRITE), CONFLICT, "a is no registrant now");
    assert_eq!(a.io(NvmOpcode::READ), Status::SUCCESS);
    assert_eq!(a.release(0, false, 3, KEY_A), CONFLICT, "a's key is gone");
    let (head, regs) = a.status_of();
    assert_eq!((head.rtype, head.regctl.get()), (3, 1));
    assert_eq!((regs[0].cntlid.get(), regs[0].rcsts), (2, 1));
    assert_eq!(b.io(NvmOpcode::WRITE), Status::SUCCESS);
}

#[test]
fn admin_commands_of_the_write_group_are_refused_to_a_host_that_may_not_write() {
    let (mut a, mut b) = pair();
    assert_eq!(a.register(0, false, 0, 0, KEY_A), Status::SUCCESS);
    assert_eq!(a.acquire(0, 1, KEY_A, 0), Status::SUCCESS);
    let admin = |op: AdminOpcode, nsid: u32, cdw10: u32| {
        let mut c = cmd(op.0);
        c.nsid = U32::new(nsid);
        c.cdw10 = U32::new(cdw10);
        c
    };
    let format = admin(AdminOpcode::FORMAT_NVM, 1, 0);
    for c in [
        format,
        admin(AdminOpcode::FORMAT_NVM, 0xFFFF_FFFF, 0),
        admin(AdminOpcode::NAMESPACE_ATTACHMENT, 1, 1),
        admin(AdminOpcode::NAMESPACE_MANAGEMENT, 1, 1),
        admin(AdminOpcode::NAMESPACE_MANAGEMENT, 0xFFFF_FFFF, 1),
        admin(AdminOpcode::SANITIZE, 0, 2),
    ] {
        let op = AdminOpcode(c.opcode());
        assert_eq!(
            b.admin(c).status(),
            CONFLICT,
            "{op:?} nsid {}",
            c.nsid.get()
        );
    }
    assert_eq!(
        b.io(NvmOpcode::READ),
        Status::SUCCESS,
        "nothing was changed"
    );
    // The holder may format; the other host may once it is released.
    assert_eq!(a.admin(format).status(), Status::SUCCESS);
    assert_eq!(a.release(0, false, 1, KEY_A), Status::SUCCESS);
    assert_eq!(b.admin(format).status(), Status::SUCCESS);
}
