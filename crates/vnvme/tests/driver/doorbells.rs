//! Doorbell modes from the driver's side: Doorbell Buffer Config sent or
//! not, shadow doorbells on the admin and I/O queues, EventIdx kept behind
//! by a polling controller, the mapped doorbell page, and what batches cost
//! in each mode.

use std::time::Duration;

use vnvme_controller::DoorbellMode;
use vnvme_driver::{DoorbellKind, InitOptions, IoQueue, NeedEvent};
use vnvme_spec::identify::{oacs, Cns};
use vnvme_spec::NvmOpcode;

use crate::rig::{device, polling_device, start, traps, Rig};

/// (SQ, CQ) traps the controller counted on queue `qid` since `before`.
fn traps_since(rig: &Rig, qid: u16, before: (u64, u64)) -> (u64, u64) {
    let (sq, cq) = traps(&rig.queue(qid));
    (sq - before.0, cq - before.1)
}

fn identify_controller(rig: &Rig) {
    let mut buf = rig.access.dma_alloc(4096).unwrap();
    rig.ctrl
        .admin(
            vnvme_driver::admin::identify(Cns::CONTROLLER, 0),
            Some(&mut buf),
        )
        .unwrap();
}

/// Flushes `n` times; returns the traps queue 1 cost.
fn flushes(rig: &Rig, q: &mut IoQueue, n: u64) -> (u64, u64) {
    let before = traps(&rig.queue(1));
    for _ in 0..n {
        q.flush(1).unwrap();
    }
    traps_since(rig, 1, before)
}

#[test]
fn dbbuf_config_is_sent_when_oacs_bit_8_is_set() {
    let rig = start(
        device(DoorbellMode::Shadow),
        &["16M:null"],
        InitOptions::default(),
    );
    assert_ne!(
        rig.ctrl.identify().oacs.get() & oacs::DOORBELL_BUFFER_CONFIG,
        0
    );
    assert_eq!(rig.ctrl.doorbell_kind(), DoorbellKind::Shadow);
    assert_eq!(rig.stats().dbbuf_configs, 1);
    assert_eq!(rig.ctrl.init_admin_commands(), 2 + 8);
}

#[test]
fn dbbuf_config_is_not_sent_when_oacs_bit_8_is_clear() {
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:null"],
        InitOptions::default(),
    );
    assert_eq!(
        rig.ctrl.identify().oacs.get() & oacs::DOORBELL_BUFFER_CONFIG,
        0
    );
    assert_eq!(rig.ctrl.doorbell_kind(), DoorbellKind::Mmio);
    assert_eq!(rig.admin_received("doorbell-buffer-config"), 0);
}

#[test]
fn dbbuf_config_is_not_sent_when_the_option_is_off() {
    let opts = InitOptions {
        shadow_doorbells: false,
        ..InitOptions::default()
    };
    let rig = start(device(DoorbellMode::Shadow), &["16M:null"], opts);
    assert_eq!(rig.ctrl.doorbell_kind(), DoorbellKind::Mmio);
    assert_eq!(rig.admin_received("doorbell-buffer-config"), 0);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    assert_eq!(flushes(&rig, &mut q, 3), (3, 3));
    let c = q.counters();
    assert_eq!((c.sq_shadow_updates, c.cq_shadow_updates), (0, 0));
    assert_eq!(rig.ctrl.admin_counters().sq_shadow_updates, 0);
}

#[test]
fn admin_queue_is_shadowed_by_default() {
    let rig = start(
        device(DoorbellMode::Shadow),
        &["16M:null"],
        InitOptions::default(),
    );
    let before = rig.ctrl.admin_counters();
    let server = rig.queue(0);
    identify_controller(&rig);
    let after = rig.ctrl.admin_counters();
    assert_eq!(after.sq_shadow_updates - before.sq_shadow_updates, 1);
    assert_eq!(after.cq_shadow_updates - before.cq_shadow_updates, 1);
    // Every register write the driver decided on reached the controller,
    // and no other: the controller read the rest from the shadow buffer.
    let writes = (
        after.sq_doorbell_writes - before.sq_doorbell_writes,
        after.cq_doorbell_writes - before.cq_doorbell_writes,
    );
    assert_eq!(traps_since(&rig, 0, traps(&server)), writes);
    assert!(writes.0 <= 1 && writes.1 <= 1, "{writes:?}");
    assert!(rig.queue(0).shadow_reads > server.shadow_reads);
}

#[test]
fn admin_queue_is_not_shadowed_with_shadow_admin_false() {
    let opts = InitOptions {
        shadow_admin: false,
        map_doorbells: false,
        ..InitOptions::default()
    };
    let rig = start(polling_device(), &["16M:null"], opts);
    assert_eq!(rig.ctrl.doorbell_kind(), DoorbellKind::Shadow);
    let before = traps(&rig.queue(0));
    identify_controller(&rig);
    let c = rig.ctrl.admin_counters();
    assert_eq!((c.sq_shadow_updates, c.cq_shadow_updates), (0, 0));
    assert_eq!(traps_since(&rig, 0, before), (1, 1));
    // I/O queues are still shadowed.
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    q.flush(1).unwrap();
    assert_eq!(q.counters().sq_shadow_updates, 1);
}

#[test]
fn polling_controller_costs_no_register_writes_across_ring_wraps() {
    for need_event in [NeedEvent::Linux, NeedEvent::Spdk] {
        let opts = InitOptions {
            need_event,
            queue_depth: 8,
            map_doorbells: false,
            ..InitOptions::default()
        };
        let rig = start(polling_device(), &["16M:null"], opts);
        let mut q = rig.ctrl.take_io_queue(0).unwrap();
        assert_eq!(q.size(), 8);
        // Wakes the worker if it slept (at most one trap); from then on it
        // polls and keeps EventIdx behind the host's updates.
        q.flush(1).unwrap();
        let before = q.counters();
        assert_eq!(flushes(&rig, &mut q, 20), (0, 0), "{need_event:?}");
        let c = q.counters();
        assert_eq!(
            (c.sq_doorbell_writes, c.cq_doorbell_writes),
            (before.sq_doorbell_writes, before.cq_doorbell_writes)
        );
        assert_eq!(c.sq_shadow_updates - before.sq_shadow_updates, 20);
        assert_eq!(c.cq_shadow_updates - before.cq_shadow_updates, 20);
        assert_eq!(c.completions, 21);
    }
}

#[test]
fn synchronous_io_works_with_a_qemu_style_controller() {
    let rig = start(
        device(DoorbellMode::Shadow),
        &["16M:ram"],
        InitOptions::default(),
    );
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let before = traps(&rig.queue(1));
    let buf = rig.access.dma_alloc(8192).unwrap();
    buf.write_bytes(0, &[0x5A; 8192]).unwrap();
    q.write(1, 40, 2, &buf).unwrap();
    let mut back = rig.access.dma_alloc(8192).unwrap();
    q.read(1, 40, 2, &mut back).unwrap();
    assert_eq!(back.to_vec(), vec![0x5A; 8192]);
    let c = q.counters();
    assert_eq!((c.sq_shadow_updates, c.cq_shadow_updates), (2, 2));
    // EventIdx is armed at the value the controller saw, so an update
    // traps unless the controller picked it up first; either way every
    // write the driver made arrived.
    assert_eq!(
        traps_since(&rig, 1, before),
        (c.sq_doorbell_writes, c.cq_doorbell_writes)
    );
    assert!(c.sq_doorbell_writes <= 2 && c.cq_doorbell_writes <= 2);
}

#[test]
fn mapped_doorbells_are_stores_not_traps() {
    let rig = start(
        device(DoorbellMode::MmapPoll),
        &["16M:null"],
        InitOptions::default(),
    );
    assert_eq!(rig.ctrl.doorbell_kind(), DoorbellKind::Mapped);
    assert_eq!(rig.ctrl.doorbell_kind().to_string(), "mapped");
    assert_eq!(rig.admin_received("doorbell-buffer-config"), 0);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let before = q.counters();
    q.flush(1).unwrap();
    let c = q.counters();
    assert_eq!(c.sq_mapped_writes - before.sq_mapped_writes, 1);
    assert_eq!(c.cq_mapped_writes - before.cq_mapped_writes, 1);
    assert_eq!((c.sq_doorbell_writes, c.cq_doorbell_writes), (0, 0));
    assert_eq!((c.sq_shadow_updates, c.cq_shadow_updates), (0, 0));
    // Not even the admin queue trapped, from enable on.
    let stats = rig.stats();
    assert_eq!((stats.sq_doorbell_traps, stats.cq_doorbell_traps), (0, 0));
    assert_eq!(rig.ctrl.admin_counters().sq_doorbell_writes, 0);
}

#[test]
fn map_doorbells_false_keeps_register_doorbells() {
    let opts = InitOptions {
        map_doorbells: false,
        ..InitOptions::default()
    };
    let rig = start(device(DoorbellMode::MmapPoll), &["16M:null"], opts);
    assert_eq!(rig.ctrl.doorbell_kind(), DoorbellKind::Mmio);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    assert_eq!(flushes(&rig, &mut q, 1), (1, 1));
    let c = q.counters();
    assert_eq!((c.sq_mapped_writes, c.cq_mapped_writes), (0, 0));
}

#[test]
fn reset_configures_fresh_shadow_buffers() {
    let opts = InitOptions {
        queue_depth: 8,
        map_doorbells: false,
        ..InitOptions::default()
    };
    let mut rig = start(polling_device(), &["16M:null"], opts);
    rig.ctrl.reset().unwrap();
    assert_eq!(rig.ctrl.doorbell_kind(), DoorbellKind::Shadow);
    assert_eq!(rig.stats().dbbuf_configs, 2);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    q.flush(1).unwrap();
    assert_eq!(flushes(&rig, &mut q, 10), (0, 0));
    assert_eq!(q.counters().sq_shadow_updates, 11);
}

/// A device in doorbell `mode` driven through queues of 64 entries, deep
/// enough for the batches below.
fn batching(mode: DoorbellMode) -> Rig {
    let opts = InitOptions {
        queue_depth: 64,
        ..InitOptions::default()
    };
    start(device(mode), &["16M:null"], opts)
}

/// Submits `batch` reads with one doorbell write and reaps them all.
fn run_batch(rig: &Rig, q: &mut IoQueue, batch: usize) {
    let bufs: Vec<_> = (0..batch)
        .map(|_| rig.access.dma_alloc(4096).unwrap())
        .collect();
    for (i, b) in bufs.iter().enumerate() {
        q.enqueue_rw(NvmOpcode::READ, 1, i as u64, 1, b).unwrap();
    }
    q.ring().unwrap();
    let mut done = Vec::new();
    while done.len() < batch {
        q.wait(&mut done, 256, Duration::from_secs(5)).unwrap();
    }
}

#[test]
fn trap_mode_costs_one_sq_trap_per_batch_and_one_cq_trap_per_reap() {
    let rig = batching(DoorbellMode::Trap);
    assert_eq!(rig.ctrl.doorbell_kind().to_string(), "mmio");
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let before = rig.queue(1);
    let driver_before = q.counters();
    for batch in [1usize, 5, 16, 3, 30] {
        run_batch(&rig, &mut q, batch);
    }
    let after = rig.queue(1);
    let driver = q.counters();
    assert_eq!(
        after.sq_doorbell_traps - before.sq_doorbell_traps,
        5,
        "one SQ trap per batch"
    );
    // Every CQ head write the driver made reached the server, and no other.
    let cq_writes = driver.cq_doorbell_writes - driver_before.cq_doorbell_writes;
    assert_eq!(
        after.cq_doorbell_traps - before.cq_doorbell_traps,
        cq_writes
    );
    assert!(
        (5..=55).contains(&cq_writes),
        "one CQ trap per reaped batch, {cq_writes}"
    );
    assert_eq!(after.commands - before.commands, 55);
}

#[test]
fn shadow_mode_uses_the_buffers_and_traps_at_most_once_per_batch() {
    let rig = batching(DoorbellMode::Shadow);
    assert_eq!(rig.ctrl.doorbell_kind().to_string(), "shadow");
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let before = rig.queue(1);
    for _ in 0..20 {
        run_batch(&rig, &mut q, 16);
    }
    let after = rig.queue(1);
    let sq = after.sq_doorbell_traps - before.sq_doorbell_traps;
    let cq = after.cq_doorbell_traps - before.cq_doorbell_traps;
    assert!(sq <= 20, "{sq} SQ traps for 20 batches");
    assert!(cq <= q.counters().cq_doorbell_writes, "{cq}");
    assert!(after.shadow_reads > before.shadow_reads);
    assert!(after.eventidx_writes > before.eventidx_writes);
}

#[test]
fn adaptive_mode_needs_almost_no_traps_under_load() {
    let rig = batching(DoorbellMode::Adaptive);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let before = rig.queue(1);
    let mut ios = 0u64;
    for _ in 0..400 {
        run_batch(&rig, &mut q, 32);
        ios += 32;
    }
    let after = rig.queue(1);
    let traps = (after.sq_doorbell_traps + after.cq_doorbell_traps)
        - (before.sq_doorbell_traps + before.cq_doorbell_traps);
    // The worker sleeps (and so re-arms EventIdx) only after an idle period;
    // a loaded test machine may preempt it, so allow a few wake-up traps.
    assert!(traps * 20 <= ios, "{traps} traps for {ios} I/Os");
}
