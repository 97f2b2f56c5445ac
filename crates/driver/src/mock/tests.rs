//! The driver against the mock controller: initialisation, data path,
//! errors, interrupts, reset.

use super::*;
use crate::controller::{Controller, InitOptions};
use crate::error::Error;
use crate::prp::PrpError;
use std::time::Duration;

fn init(cfg: MockConfig, opts: InitOptions) -> (Arc<MockDevice>, Result<Controller, Error>) {
    let dev = MockDevice::new(cfg);
    let ctrl = Controller::init(dev.clone(), opts);
    (dev, ctrl)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn init_sends_2n_plus_3_plus_ns_admin_commands() {
    let cfg = MockConfig {
        nsids: vec![1, 2],
        ..Default::default()
    };
    let opts = InitOptions {
        io_queues: 3,
        ..Default::default()
    };
    let (dev, ctrl) = init(cfg, opts);
    let ctrl = ctrl.unwrap();
    assert_eq!(ctrl.io_queue_count(), 3);
    assert_eq!(ctrl.namespaces().len(), 2);
    assert_eq!(ctrl.namespaces()[1].nsid, 2);
    assert_eq!(ctrl.namespaces()[0].lba_size, 512);
    assert_eq!(ctrl.init_admin_commands(), 2 * 3 + 3 + 2);
    let creates = dev.stats(|s| {
        s.admin_opcodes
            .iter()
            .filter(|&&o| o == 0x05 || o == 0x01)
            .count()
    });
    assert_eq!(creates, 6, "no create-learn-delete-recreate");
    assert!(!ctrl.interrupts_enabled());
}

#[test]
fn init_uses_the_granted_number_of_queues() {
    let cfg = MockConfig {
        max_queues: 2,
        ..Default::default()
    };
    let opts = InitOptions {
        io_queues: 8,
        ..Default::default()
    };
    let ctrl = init(cfg, opts).1.unwrap();
    assert_eq!(ctrl.io_queue_count(), 2);
    assert!(ctrl.take_io_queue(1).is_ok());
    assert!(matches!(ctrl.take_io_queue(1), Err(Error::QueueTaken(2))));
    assert!(matches!(ctrl.take_io_queue(2), Err(Error::NoSuchQueue(3))));
}

#[test]
fn controller_that_never_becomes_ready_times_out() {
    let cfg = MockConfig {
        never_ready: true,
        ..Default::default()
    };
    let opts = InitOptions {
        ready_timeout: Some(Duration::from_millis(30)),
        ..Default::default()
    };
    let err = init(cfg, opts).1.unwrap_err();
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
}

#[test]
fn namespace_not_ready_is_retried_and_invalid_namespace_skipped() {
    let cfg = MockConfig {
        nsids: vec![1, 2, 3],
        not_ready: [(1, 3)].into(),
        invalid: vec![2],
        ..Default::default()
    };
    let (dev, ctrl) = init(cfg, InitOptions::default());
    let ctrl = ctrl.unwrap();
    let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1, 3]);
    let identifies = dev.stats(|s| s.admin_opcodes.iter().filter(|&&o| o == 0x06).count());
    // Controller, list, nsid 1 four times, nsid 2 once, nsid 3 once.
    assert_eq!(identifies, 1 + 1 + 4 + 1 + 1);
}

#[test]
fn zero_namespaces_finishes_init() {
    let cfg = MockConfig {
        nsids: vec![],
        ..Default::default()
    };
    let ctrl = init(cfg, InitOptions::default()).1.unwrap();
    assert!(ctrl.namespaces().is_empty());
}

#[test]
fn write_then_read_round_trips_through_a_prp_list_at_an_offset() {
    let (dev, ctrl) = init(MockConfig::default(), InitOptions::default());
    let ctrl = ctrl.unwrap();
    let mut q = ctrl.take_io_queue(0).unwrap();
    let access = ctrl.access();
    let whole = access.dma_alloc(40960).unwrap();
    // 32 KiB starting 512 bytes into a page: 9 pages, a PRP list.
    let seg = whole.subrange(512, 32768).unwrap();
    let data = pattern(32768, 7);
    seg.write_bytes(0, &data).unwrap();
    q.write(1, 100, 64, &seg).unwrap();
    assert_eq!(dev.ns_bytes(1, 100 * 512, 32768), data);
    let mut back = access.dma_alloc(32768).unwrap();
    q.read(1, 100, 64, &mut back).unwrap();
    assert_eq!(back.to_vec(), data);
    q.flush(1).unwrap();
    let c = q.counters();
    assert_eq!((c.submitted, c.completions), (3, 3));
    assert_eq!((c.sq_doorbell_writes, c.cq_doorbell_writes), (3, 3));
}

#[test]
fn large_transfer_uses_chained_prp_lists() {
    let cfg = MockConfig {
        blocks: 16384,
        ..Default::default()
    };
    let opts = InitOptions {
        max_transfer: 4 << 20,
        queue_depth: 4,
        ..Default::default()
    };
    let (dev, ctrl) = init(cfg, opts);
    let ctrl = ctrl.unwrap();
    let mut q = ctrl.take_io_queue(0).unwrap();
    // 3 MiB: PRP1 + 767 list entries over two chained list pages.
    let len = 3 << 20;
    let buf = ctrl.access().dma_alloc(len).unwrap();
    let data = pattern(len, 3);
    buf.write_bytes(0, &data).unwrap();
    q.write(1, 8, (len / 512) as u32, &buf).unwrap();
    assert_eq!(dev.ns_bytes(1, 8 * 512, len), data);
}

#[test]
fn transfer_over_mdts_is_rejected_before_submission() {
    let cfg = MockConfig {
        mdts: 2,
        ..Default::default()
    };
    let (dev, ctrl) = init(cfg, InitOptions::default());
    let ctrl = ctrl.unwrap();
    assert_eq!(ctrl.max_transfer(), 16384);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut buf = ctrl.access().dma_alloc(32768).unwrap();
    let before = dev.stats(|s| s.sq_doorbells);
    let err = q.read(1, 0, 64, &mut buf).unwrap_err();
    assert!(
        matches!(err, Error::Prp(PrpError::TooLarge { .. })),
        "{err}"
    );
    assert_eq!(dev.stats(|s| s.sq_doorbells), before);
    assert_eq!(q.outstanding(), 0, "the command slot was given back");
    q.read(1, 0, 32, &mut buf).unwrap();
}

#[test]
fn batch_costs_one_sq_and_one_cq_doorbell() {
    let (dev, ctrl) = init(MockConfig::default(), InitOptions::default());
    let ctrl = ctrl.unwrap();
    let mut q = ctrl.take_io_queue(0).unwrap();
    let bufs: Vec<_> = (0..8)
        .map(|_| ctrl.access().dma_alloc(4096).unwrap())
        .collect();
    let before = dev.stats(|s| (s.sq_doorbells, s.cq_doorbells));
    for (i, b) in bufs.iter().enumerate() {
        q.enqueue_rw(NvmOpcode::READ, 1, i as u64 * 8, 8, b)
            .unwrap();
    }
    q.ring().unwrap();
    let mut out = Vec::new();
    assert_eq!(q.wait(&mut out, 64, Duration::from_secs(1)).unwrap(), 8);
    assert!(out.iter().all(|c| c.status().is_success()));
    let after = dev.stats(|s| (s.sq_doorbells, s.cq_doorbells));
    assert_eq!((after.0 - before.0, after.1 - before.1), (1, 1));
    assert_eq!(q.counters().sq_doorbell_writes, 1);
}

#[test]
fn admin_error_status_is_typed() {
    let ctrl = init(MockConfig::default(), InitOptions::default())
        .1
        .unwrap();
    let err = ctrl.admin(Command::new(0x3F, 0), None).unwrap_err();
    assert!(
        err.status().unwrap().same_code(Status::INVALID_OPCODE),
        "{err}"
    );
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut buf = ctrl.access().dma_alloc(4096).unwrap();
    let err = q.read(1, 16383, 8, &mut buf).unwrap_err();
    assert!(err.status().unwrap().same_code(Status::LBA_OUT_OF_RANGE));
    assert!(matches!(
        q.read(9, 0, 1, &mut buf),
        Err(Error::NoSuchNamespace(9))
    ));
}

#[test]
fn io_queues_get_their_own_msix_vector() {
    let cfg = MockConfig {
        msix_vectors: 8,
        ..Default::default()
    };
    let opts = InitOptions {
        io_queues: 2,
        ..Default::default()
    };
    let (dev, ctrl) = init(cfg, opts);
    let ctrl = ctrl.unwrap();
    assert!(ctrl.interrupts_enabled());
    assert_eq!(dev.cq_vector(0), Some(0));
    assert_eq!(dev.cq_vector(1), Some(1));
    assert_eq!(dev.cq_vector(2), Some(2));
    let mut q = ctrl.take_io_queue(1).unwrap();
    assert!(q.has_interrupt());
    q.flush(1).unwrap();
    assert!(dev.stats(|s| s.interrupts) >= 1);
}

#[test]
fn reset_makes_old_queues_stale_and_new_ones_work() {
    let (_dev, ctrl) = init(MockConfig::default(), InitOptions::default());
    let mut ctrl = ctrl.unwrap();
    let mut old = ctrl.take_io_queue(0).unwrap();
    ctrl.reset().unwrap();
    assert!(matches!(old.flush(1), Err(Error::StaleQueue(1))));
    let mut q = ctrl.take_io_queue(0).unwrap();
    q.flush(1).unwrap();
    ctrl.shutdown().unwrap();
    assert!(matches!(q.flush(1), Err(Error::StaleQueue(1))));
}
