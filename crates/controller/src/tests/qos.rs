//! IOPS limits seen as a host sees them: a throttled command waits, Abort
//! completes it, and a pause and resume of the workers keeps it.

use super::*;
use crate::qos::{QosLimits, QosTarget};

fn read(slba: u64) -> Command {
    rw(NvmOpcode::READ, 1, slba, 1, DATA, 0)
}

fn host() -> Host {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    h
}

/// Namespace 1 at one read a second, a burst of one.
fn one_a_second(h: &Host) {
    let mut l = QosLimits::default();
    l.set("read_iops", 1).unwrap();
    l.set("read_iops_burst", 1).unwrap();
    h.ctrl.qos_set(QosTarget::Namespace(1), l).unwrap();
}

fn abort(sqid: u16, cid: u16) -> Command {
    let mut c = cmd(AdminOpcode::ABORT.0);
    c.cdw10 = U32::new(u32::from(sqid) | (u32::from(cid) << 16));
    c
}

#[test]
fn abort_completes_a_throttled_command() {
    let mut h = host();
    one_a_second(&h);
    let first = h.push(1, read(0));
    let second = h.push(1, read(1));
    h.ring_sq(1);
    assert_eq!(h.reap(1).cid(), first);
    let a = h.admin(abort(1, second));
    assert_eq!(a.status(), Status::SUCCESS);
    assert_eq!(a.dw0.get() & 1, 0, "reported aborted");
    let c = h.reap(1);
    assert_eq!(c.cid(), second);
    assert_eq!(c.status(), Status::ABORTED_BY_REQUEST);
    assert_eq!(h.ctrl.stats().qos_throttled_commands, 1);
}

#[test]
fn a_throttled_command_survives_a_pause_and_resume() {
    let mut h = host();
    // At one a second, with the limit lifted after the resume: the
    // second read completes only if the resumed worker still holds it.
    one_a_second(&h);
    let first = h.push(1, read(0));
    let second = h.push(1, read(1));
    h.ring_sq(1);
    assert_eq!(h.reap(1).cid(), first);
    h.ctrl.pause();
    h.ctrl.resume().unwrap();
    h.ctrl
        .qos_set(QosTarget::Namespace(1), QosLimits::default())
        .unwrap();
    let c = h.reap(1);
    assert_eq!(c.cid(), second);
    assert_eq!(c.status(), Status::SUCCESS);
}
