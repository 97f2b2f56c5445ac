//! Doorbell modes against the mock controller: Doorbell Buffer Config
//! negotiation and fallback, shadow doorbells with EventIdx under both
//! need-event tests, and a mapped doorbell page.
//!
//! Memory ordering (release fence, shadow store, full fence, EventIdx load)
//! is not tested here: it holds by construction in `DoorbellRegister::ring`.

use super::*;
use crate::controller::{Controller, InitOptions};
use crate::doorbell::{DoorbellKind, NeedEvent};
use crate::io::IoQueue;

fn init(cfg: MockConfig, opts: InitOptions) -> (Arc<MockDevice>, Controller) {
    let dev = MockDevice::new(cfg);
    let ctrl = Controller::init(dev.clone(), opts).unwrap();
    (dev, ctrl)
}

fn shadow_cfg(event_idx: EventIdxMode) -> MockConfig {
    MockConfig {
        dbbuf: true,
        event_idx,
        ..Default::default()
    }
}

fn opts(need_event: NeedEvent, queue_depth: u16) -> InitOptions {
    InitOptions {
        need_event,
        queue_depth,
        ..Default::default()
    }
}

/// (SQ traps, CQ traps) the device has seen.
fn traps(dev: &MockDevice) -> (u64, u64) {
    dev.stats(|s| (s.sq_doorbells, s.cq_doorbells))
}

/// Submits a flush, lets the device poll, reaps it, lets the device poll again.
fn flush_polled(dev: &MockDevice, q: &mut IoQueue) {
    let mut cmd = Command::new(NvmOpcode::FLUSH.0, 0);
    cmd.nsid = 1.into();
    q.submit(cmd).unwrap();
    dev.poll();
    let mut out = Vec::new();
    assert_eq!(q.poll(&mut out, 16).unwrap(), 1);
    assert!(out[0].status().is_success());
    dev.poll();
}

#[test]
fn dbbuf_config_is_sent_after_number_of_queues_when_oacs_bit_8_is_set() {
    let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Armed), InitOptions::default());
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Shadow);
    let ops = dev.stats(|s| s.admin_opcodes.clone());
    let at = |op: u8| ops.iter().position(|&o| o == op).unwrap();
    assert!(at(0x09) < at(0x7C), "after Set Features (Number of Queues)");
    assert!(at(0x7C) < at(0x05), "before any I/O queue exists");
    assert_eq!(ctrl.init_admin_commands(), 2 + 3 + 1 + 1);
}

#[test]
fn dbbuf_config_is_not_sent_when_oacs_bit_8_is_clear() {
    let (dev, ctrl) = init(MockConfig::default(), InitOptions::default());
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Mmio);
    assert!(!dev.stats(|s| s.admin_opcodes.contains(&0x7C)));
}

#[test]
fn dbbuf_config_is_not_sent_when_the_option_is_off() {
    let opts = InitOptions {
        shadow_doorbells: false,
        ..Default::default()
    };
    let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Armed), opts);
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Mmio);
    assert!(!dev.stats(|s| s.admin_opcodes.contains(&0x7C)));
}

#[test]
fn failed_dbbuf_config_falls_back_to_register_doorbells() {
    let cfg = MockConfig {
        dbbuf_fails: Some(Status::INVALID_FIELD.with_dnr(true)),
        ..shadow_cfg(EventIdxMode::Armed)
    };
    let (dev, ctrl) = init(cfg, InitOptions::default());
    assert!(dev.stats(|s| s.admin_opcodes.contains(&0x7C)));
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Mmio);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let before = traps(&dev);
    for _ in 0..3 {
        q.flush(1).unwrap();
    }
    let after = traps(&dev);
    assert_eq!((after.0 - before.0, after.1 - before.1), (3, 3));
    let c = q.counters();
    assert_eq!((c.sq_shadow_updates, c.cq_shadow_updates), (0, 0));
    assert_eq!(ctrl.admin_counters().sq_shadow_updates, 0);
}

#[test]
fn admin_queue_is_shadowed_by_default() {
    let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Armed), InitOptions::default());
    let before = ctrl.admin_counters();
    ctrl.admin(
        crate::admin::identify(vnvme_spec::identify::Cns::CONTROLLER, 0),
        None,
    )
    .ok();
    let after = ctrl.admin_counters();
    assert_eq!(after.sq_shadow_updates - before.sq_shadow_updates, 1);
    assert_eq!(after.cq_shadow_updates - before.cq_shadow_updates, 1);
    // QEMU-style device: EventIdx armed at the tail, so each update traps too.
    assert_eq!(after.sq_doorbell_writes - before.sq_doorbell_writes, 1);
    let tail = dev.shadow_value(Doorbell::SqTail(0)).unwrap();
    assert_eq!(tail, ctrl.admin_commands() as u32 % 32, "admin depth 32");
}

#[test]
fn admin_queue_is_not_shadowed_with_shadow_admin_false() {
    let opts = InitOptions {
        shadow_admin: false,
        ..Default::default()
    };
    let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Behind), opts);
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Shadow);
    let before = traps(&dev);
    let err = ctrl.admin(Command::new(0x3F, 0), None).unwrap_err();
    assert!(err.status().is_some(), "the command completed: {err}");
    let c = ctrl.admin_counters();
    assert_eq!((c.sq_shadow_updates, c.cq_shadow_updates), (0, 0));
    let after = traps(&dev);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    // I/O queues are still shadowed.
    let mut q = ctrl.take_io_queue(0).unwrap();
    flush_polled(&dev, &mut q);
    assert_eq!(q.counters().sq_shadow_updates, 1);
}

#[test]
fn event_idx_behind_the_tail_costs_no_register_writes_across_ring_wraps() {
    for need_event in [NeedEvent::Linux, NeedEvent::Spdk] {
        let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Behind), opts(need_event, 8));
        let mut q = ctrl.take_io_queue(0).unwrap();
        let before = traps(&dev);
        for _ in 0..20 {
            flush_polled(&dev, &mut q);
        }
        assert_eq!(traps(&dev), before, "{need_event:?}: no traps");
        let c = q.counters();
        assert_eq!((c.sq_doorbell_writes, c.cq_doorbell_writes), (0, 0));
        assert_eq!((c.sq_shadow_updates, c.cq_shadow_updates), (20, 20));
        assert_eq!(c.completions, 20);
        assert_eq!(dev.shadow_value(Doorbell::SqTail(1)), Some(20 % 8));
    }
}

#[test]
fn event_idx_at_the_tail_costs_exactly_one_register_write() {
    for need_event in [NeedEvent::Linux, NeedEvent::Spdk] {
        let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Manual), opts(need_event, 8));
        let mut q = ctrl.take_io_queue(0).unwrap();
        for tail in [0u16, 3] {
            while q.counters().submitted < u64::from(tail) {
                flush_polled(&dev, &mut q);
            }
            dev.set_event_idx(Doorbell::SqTail(1), tail);
            let before = q.counters().sq_doorbell_writes;
            flush_polled(&dev, &mut q);
            assert_eq!(
                q.counters().sq_doorbell_writes - before,
                1,
                "{need_event:?}: tail {tail} -> {}",
                tail + 1
            );
            // EventIdx not moved by the device: the next one is free.
            flush_polled(&dev, &mut q);
            assert_eq!(q.counters().sq_doorbell_writes - before, 1);
        }
    }
}

#[test]
fn reaching_event_idx_exactly_writes_for_spdk_but_not_for_linux() {
    for (need_event, writes) in [(NeedEvent::Linux, 0), (NeedEvent::Spdk, 1)] {
        let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Manual), opts(need_event, 8));
        let mut q = ctrl.take_io_queue(0).unwrap();
        dev.set_event_idx(Doorbell::SqTail(1), 1);
        let before = traps(&dev).0;
        flush_polled(&dev, &mut q);
        assert_eq!(traps(&dev).0 - before, writes, "{need_event:?}");
        assert_eq!(q.counters().sq_doorbell_writes, writes);
    }
}

#[test]
fn ring_wrap_crossing_event_idx_writes_the_register() {
    // A 4-entry ring; the fourth submission moves the tail 3 -> 0.
    for (need_event, ei, writes) in [
        (NeedEvent::Linux, 3, 1),
        (NeedEvent::Spdk, 3, 1),
        (NeedEvent::Linux, 0, 0),
        (NeedEvent::Spdk, 0, 1),
        (NeedEvent::Linux, 2, 0),
        (NeedEvent::Spdk, 2, 0),
    ] {
        let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Manual), opts(need_event, 4));
        let mut q = ctrl.take_io_queue(0).unwrap();
        assert_eq!(q.size(), 4);
        for _ in 0..3 {
            flush_polled(&dev, &mut q);
        }
        dev.set_event_idx(Doorbell::SqTail(1), ei);
        let before = q.counters().sq_doorbell_writes;
        flush_polled(&dev, &mut q);
        assert_eq!(dev.shadow_value(Doorbell::SqTail(1)), Some(0));
        assert_eq!(
            q.counters().sq_doorbell_writes - before,
            writes,
            "{need_event:?}, EventIdx {ei}"
        );
    }
}

#[test]
fn synchronous_io_works_with_a_qemu_style_device() {
    let (dev, ctrl) = init(shadow_cfg(EventIdxMode::Armed), InitOptions::default());
    let mut q = ctrl.take_io_queue(0).unwrap();
    let buf = ctrl.access().dma_alloc(8192).unwrap();
    buf.write_bytes(0, &[0x5A; 8192]).unwrap();
    q.write(1, 40, 16, &buf).unwrap();
    let mut back = ctrl.access().dma_alloc(8192).unwrap();
    q.read(1, 40, 16, &mut back).unwrap();
    assert_eq!(back.to_vec(), vec![0x5A; 8192]);
    assert_eq!(dev.ns_bytes(1, 40 * 512, 4), [0x5A; 4]);
    // Armed at the tail it saw: every update crosses EventIdx.
    let c = q.counters();
    assert_eq!((c.sq_doorbell_writes, c.sq_shadow_updates), (2, 2));
    assert_eq!((c.cq_doorbell_writes, c.cq_shadow_updates), (2, 2));
}

#[test]
fn mapped_doorbells_are_stores_not_traps_and_skip_dbbuf_config() {
    let cfg = MockConfig {
        mapped_doorbells: true,
        ..shadow_cfg(EventIdxMode::Armed)
    };
    let (dev, ctrl) = init(cfg, InitOptions::default());
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Mapped);
    assert!(!dev.stats(|s| s.admin_opcodes.contains(&0x7C)));
    assert_eq!(traps(&dev), (0, 0), "not even the admin queue traps");
    let mut q = ctrl.take_io_queue(0).unwrap();
    let stores = dev.stats(|s| s.mapped_doorbells);
    q.flush(1).unwrap();
    assert_eq!(dev.stats(|s| s.mapped_doorbells) - stores, 2);
    assert_eq!(traps(&dev), (0, 0));
    let c = q.counters();
    assert_eq!((c.sq_mapped_writes, c.cq_mapped_writes), (1, 1));
    assert_eq!((c.sq_doorbell_writes, c.cq_doorbell_writes), (0, 0));
    assert_eq!(c.sq_shadow_updates, 0);
}

#[test]
fn map_doorbells_false_keeps_register_doorbells() {
    let cfg = MockConfig {
        mapped_doorbells: true,
        ..Default::default()
    };
    let opts = InitOptions {
        map_doorbells: false,
        ..Default::default()
    };
    let (dev, ctrl) = init(cfg, opts);
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Mmio);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let before = traps(&dev);
    q.flush(1).unwrap();
    let after = traps(&dev);
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    assert_eq!(dev.stats(|s| s.mapped_doorbells), 0);
}

#[test]
fn reset_configures_fresh_shadow_buffers() {
    let (dev, mut ctrl) = init(shadow_cfg(EventIdxMode::Behind), opts(NeedEvent::Linux, 8));
    ctrl.reset().unwrap();
    assert_eq!(ctrl.doorbell_kind(), DoorbellKind::Shadow);
    let sent = dev.stats(|s| s.admin_opcodes.iter().filter(|&&o| o == 0x7C).count());
    assert_eq!(sent, 2);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let before = traps(&dev);
    for _ in 0..10 {
        flush_polled(&dev, &mut q);
    }
    assert_eq!(traps(&dev), before);
}
