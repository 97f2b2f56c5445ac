//! The driver against what only a misbehaving or unusual device does.

use std::time::Duration;

use vnvme_spec::regs::version;
use vnvme_spec::AdminOpcode;

use super::*;
use crate::controller::{Controller, InitOptions};
use crate::doorbell::DoorbellKind;
use crate::error::Error;
use crate::io::MetadataPointer;
use crate::namespace::NsState;

fn script(nsids: Vec<u32>) -> Script {
    Script {
        version: version(1, 4, 0),
        nsids,
        ..Script::default()
    }
}

fn init(script: Script) -> (Arc<FakeDevice>, Controller) {
    let dev = FakeDevice::new(script);
    let ctrl = Controller::init(dev.clone(), InitOptions::default()).unwrap();
    (dev, ctrl)
}

#[test]
fn controller_that_never_becomes_ready_times_out() {
    let dev = FakeDevice::new(Script {
        never_ready: true,
        ..script(vec![1])
    });
    let opts = InitOptions {
        ready_timeout: Some(Duration::from_millis(30)),
        ..InitOptions::default()
    };
    let err = Controller::init(dev.clone(), opts).unwrap_err();
    assert!(
        matches!(
            err,
            Error::ReadyTimeout {
                what: "set CSTS.RDY",
                ..
            }
        ),
        "{err}"
    );
    assert!(dev.admin_opcodes().is_empty());
}

#[test]
fn only_generic_namespace_not_ready_without_dnr_is_retried() {
    let media_0x82 = Status::from_raw((2 << 8) | 0x82);
    let mut s = script(vec![1, 2, 3, 4]);
    s.identify_ns = HashMap::from([
        (1, vec![Status::NAMESPACE_NOT_READY; 2]),
        (2, vec![media_0x82]),
        (3, vec![Status::NAMESPACE_NOT_READY.with_dnr(true)]),
        (4, vec![Status::INVALID_NAMESPACE_OR_FORMAT]),
    ]);
    let (dev, ctrl) = init(s);
    // Namespace 1 twice more; the others, listed but failing, once each.
    assert_eq!(dev.identify_ns(), [1, 1, 1, 2, 3, 4]);
    // NVMe 1.4: no NSTAT (CNS 08h); controller and list besides.
    assert_eq!(ctrl.init_admin_by_opcode()["identify"], 2 + 6);
    let report = ctrl.namespace_report();
    let states: Vec<_> = report.iter().map(|r| (r.nsid, r.state)).collect();
    assert_eq!(
        states,
        [
            (1, NsState::Ready),
            (2, NsState::Skipped),
            (3, NsState::Skipped),
            (4, NsState::Skipped)
        ]
    );
    let reason = |i: usize| report[i].reason.clone().unwrap_or_default();
    assert!(reason(1).contains("sct 0x2"), "{}", reason(1));
    assert!(reason(2).contains("dnr"), "{}", reason(2));
    assert!(
        reason(3).contains("invalid-namespace-or-format"),
        "{}",
        reason(3)
    );
    let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1]);
}

#[test]
fn failed_dbbuf_config_is_sent_after_number_of_queues_and_falls_back() {
    let (dev, ctrl) = init(Script {
        dbbuf: Some(Status::INVALID_FIELD.with_dnr(true)),
        ..script(vec![1])
    });
    let ops = dev.admin_opcodes();
    let at = |op: AdminOpcode| ops.iter().position(|&o| o == op.0).unwrap();
    assert!(at(AdminOpcode::SET_FEATURES) < at(AdminOpcode::DOORBELL_BUFFER_CONFIG));
    assert!(
        at(AdminOpcode::DOORBELL_BUFFER_CONFIG) < at(AdminOpcode::CREATE_IO_CQ),
        "before any I/O queue exists: {ops:x?}"
    );
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Mmio);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let (before, _) = dev.doorbells();
    for _ in 0..3 {
        q.flush(1).unwrap();
    }
    assert_eq!(dev.doorbells().0 - before, 3 + 3, "SQ and CQ, each flush");
    let c = q.counters();
    assert_eq!((c.sq_doorbell_writes, c.cq_doorbell_writes), (3, 3));
    assert_eq!((c.sq_shadow_updates, c.cq_shadow_updates), (0, 0));
    assert_eq!(ctrl.admin_counters().sq_shadow_updates, 0);
}

#[test]
fn mapped_doorbells_are_preferred_to_an_offered_dbbuf_config() {
    let (dev, ctrl) = init(Script {
        dbbuf: Some(Status::SUCCESS),
        mapped: true,
        ..script(vec![1])
    });
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Mapped);
    let dbbuf = AdminOpcode::DOORBELL_BUFFER_CONFIG.0;
    assert!(!dev.admin_opcodes().contains(&dbbuf));
    let mut q = ctrl.take_io_queue(0).unwrap();
    let (traps, stores) = dev.doorbells();
    q.flush(1).unwrap();
    assert_eq!(dev.doorbells(), (traps, stores + 2));
    let c = q.counters();
    assert_eq!((c.sq_mapped_writes, c.cq_mapped_writes), (1, 1));
    assert_eq!(traps, 0);
}

#[test]
fn metadata_sgls_are_refused_by_the_driver_when_sgls_bit_19_is_clear() {
    // The fake's Identify Controller reports SGLS 0: no SGLs at all.
    let (_dev, ctrl) = init(script(vec![]));
    let mut q = ctrl.take_io_queue(0).unwrap();
    for mode in [MetadataPointer::Sgl, MetadataPointer::SglPerBlock] {
        assert!(matches!(
            q.set_metadata_pointer(mode),
            Err(Error::Unsupported(_))
        ));
    }
    q.set_metadata_pointer(MetadataPointer::Contiguous).unwrap();
}
