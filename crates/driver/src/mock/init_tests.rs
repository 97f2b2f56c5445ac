//! Initialisation against the mock: admin command counts (fast and
//! learning), shared interrupt vectors, namespace readiness retries and
//! skips, and namespaces picked up after initialisation.

use std::time::Duration;

use vnvme_spec::regs::version;

use super::*;
use crate::controller::{Controller, InitOptions};
use crate::error::Error;
use crate::init::InitMode;
use crate::io::IoQueue;
use crate::namespace::NsState;

/// A 2.0 controller with shadow doorbells and namespace notices.
fn cfg(nsids: Vec<u32>) -> MockConfig {
    MockConfig {
        nsids,
        dbbuf: true,
        aen: true,
        version: version(2, 0, 0),
        ..Default::default()
    }
}

fn opts(io_queues: u16, init_mode: InitMode) -> InitOptions {
    InitOptions {
        io_queues,
        init_mode,
        queue_depth: 16,
        ..Default::default()
    }
}

fn init(cfg: MockConfig, opts: InitOptions) -> (Arc<MockDevice>, Controller) {
    let dev = MockDevice::new(cfg);
    let ctrl = Controller::init(dev.clone(), opts).unwrap();
    (dev, ctrl)
}

fn count(ctrl: &Controller, name: &str) -> u64 {
    ctrl.init_admin_by_opcode().get(name).copied().unwrap_or(0)
}

#[test]
fn fast_init_with_32_queues_sends_2n_plus_6_plus_2_per_namespace() {
    let (dev, ctrl) = init(cfg(vec![1]), opts(32, InitMode::Fast));
    assert_eq!(ctrl.io_queue_count(), 32);
    // Identify Controller, Number of Queues, Doorbell Buffer Config, 32 x
    // (CQ + SQ), Async Event Configuration, active list, CNS 00h + 08h,
    // and the Asynchronous Event Request left outstanding.
    assert_eq!(ctrl.init_admin_commands(), 2 * 32 + 6 + 2);
    assert!(ctrl.init_admin_commands() <= 2 * 32 + 10);
    assert_eq!(count(&ctrl, "create-io-cq"), 32);
    assert_eq!(count(&ctrl, "create-io-sq"), 32);
    assert_eq!(count(&ctrl, "identify"), 4);
    assert_eq!(count(&ctrl, "set-features"), 2);
    assert_eq!(count(&ctrl, "doorbell-buffer-config"), 1);
    assert_eq!(count(&ctrl, "async-event-request"), 1);
    assert_eq!(
        count(&ctrl, "delete-io-sq") + count(&ctrl, "delete-io-cq"),
        0
    );
    assert_eq!(ctrl.init_io_commands(), 0);
    assert_eq!(dev.stats(|s| s.io_commands), 0, "nothing learnt by reads");
    assert_eq!(
        ctrl.init_admin_by_opcode().values().sum::<u64>(),
        ctrl.init_admin_commands()
    );
}

#[test]
fn learning_mode_reproduces_the_old_7n_cost() {
    let (dev, ctrl) = init(cfg(vec![1]), opts(32, InitMode::Learning));
    assert_eq!(ctrl.io_queue_count(), 32);
    // Fast's 2N + 8, plus N x (delete SQ + delete CQ) and N x (CQ + SQ) again.
    assert_eq!(ctrl.init_admin_commands(), 6 * 32 + 8);
    assert_eq!(count(&ctrl, "create-io-cq"), 64);
    assert_eq!(count(&ctrl, "create-io-sq"), 64);
    assert_eq!(count(&ctrl, "delete-io-sq"), 32);
    assert_eq!(count(&ctrl, "delete-io-cq"), 32);
    // One learning read per queue: 7N + 8 commands in all, the patch's 224 + 8.
    assert_eq!(ctrl.init_io_commands(), 32);
    assert_eq!(dev.stats(|s| s.io_commands), 32);
    assert_eq!(
        ctrl.init_admin_commands() + ctrl.init_io_commands(),
        224 + 8
    );
    // The re-created queues work.
    let mut q = ctrl.take_io_queue(31).unwrap();
    let mut buf = ctrl.access().dma_alloc(512).unwrap();
    q.read(1, 0, 1, &mut buf).unwrap();
}

#[test]
fn fewer_vectors_than_queues_share_them_and_every_queue_does_io() {
    let cfg = MockConfig {
        msix_vectors: 3,
        ..cfg(vec![1])
    };
    let (dev, ctrl) = init(cfg, opts(8, InitMode::Fast));
    assert_eq!(ctrl.io_queue_count(), 8);
    assert_eq!(ctrl.interrupt_vectors(), 3);
    let queues: Vec<IoQueue> = (0..8).map(|i| ctrl.take_io_queue(i).unwrap()).collect();
    for q in &queues {
        let expect = (q.qid() - 1) % 3;
        assert_eq!(q.interrupt_vector(), Some(expect), "queue {}", q.qid());
        assert_eq!(dev.cq_vector(q.qid()), Some(expect));
        assert!(q.shares_vector());
    }
    let access = Arc::clone(ctrl.access());
    std::thread::scope(|s| {
        for mut q in queues {
            let access = Arc::clone(&access);
            s.spawn(move || {
                let mut buf = access.dma_alloc(512).unwrap();
                for lba in 0..20 {
                    q.read(1, lba, 1, &mut buf).unwrap();
                }
            });
        }
        // The admin queue shares vector 0 with I/O queues 1, 4 and 7.
        for _ in 0..20 {
            let buf = ctrl.access().dma_alloc(4096).unwrap();
            let mut buf = buf;
            ctrl.admin(
                crate::admin::identify(vnvme_spec::identify::Cns::CONTROLLER, 0),
                Some(&mut buf),
            )
            .unwrap();
        }
    });
    assert_eq!(dev.stats(|s| s.io_commands), 8 * 20);
}

#[test]
fn only_generic_namespace_not_ready_without_dnr_is_retried() {
    let media_0x82 = Status::from_raw((2 << 8) | 0x82);
    let mut cfg = cfg(vec![1, 2, 3, 4]);
    cfg.statuses = HashMap::from([
        (1, vec![Status::NAMESPACE_NOT_READY; 2]),
        (2, vec![media_0x82]),
        (3, vec![Status::NAMESPACE_NOT_READY.with_dnr(true)]),
        (4, vec![Status::INVALID_NAMESPACE_OR_FORMAT]),
    ]);
    let (dev, ctrl) = init(cfg, opts(1, InitMode::Fast));
    // 3 for namespace 1 (two retries), 1 each for the others.
    assert_eq!(dev.identify_count(0), 3 + 1 + 1 + 1);
    // NSTAT only for the namespace that was identified.
    assert_eq!(dev.identify_count(8), 1);
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
    assert!(
        reason(3).contains("invalid-namespace-or-format"),
        "{}",
        reason(3)
    );
    assert!(reason(1).contains("sct 0x2"), "{}", reason(1));
    assert!(reason(2).contains("dnr"), "{}", reason(2));
    assert_eq!(ctrl.namespaces().len(), 1);
}

#[test]
fn namespace_with_metadata_is_skipped_with_its_reason() {
    let cfg = MockConfig {
        metadata: vec![2],
        ..cfg(vec![1, 2])
    };
    let (dev, ctrl) = init(cfg, opts(1, InitMode::Fast));
    let report = ctrl.namespace_report();
    assert_eq!(report[1].state, NsState::Skipped);
    assert_eq!(
        report[1].reason.as_deref(),
        Some("unsupported LBA format: metadata")
    );
    assert_eq!(dev.identify_count(0), 2, "no retry");
    assert_eq!(dev.identify_count(8), 1, "no NSTAT for a skipped format");
    let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1]);
}

#[test]
fn zero_namespaces_finish_with_one_list_and_no_identify() {
    let (dev, ctrl) = init(cfg(vec![]), opts(4, InitMode::Fast));
    assert!(ctrl.namespace_report().is_empty());
    // 2N + 6: no Identify Namespace at all, nothing waited for.
    assert_eq!(ctrl.init_admin_commands(), 2 * 4 + 6);
    assert_eq!(dev.identify_count(0) + dev.identify_count(8), 0);
}

#[test]
fn learning_with_zero_namespaces_sends_no_reads() {
    let (_dev, ctrl) = init(cfg(vec![]), opts(4, InitMode::Learning));
    assert_eq!(ctrl.init_admin_commands(), 6 * 4 + 6);
    assert_eq!(ctrl.init_io_commands(), 0);
}

#[test]
fn namespace_not_ready_past_the_timeout_is_picked_up_on_its_event() {
    let mut cfg = cfg(vec![1]);
    cfg.nstat_not_ready = HashMap::from([(1, u32::MAX)]);
    let opts = InitOptions {
        ready_timeout: Some(Duration::from_millis(40)),
        ..opts(1, InitMode::Fast)
    };
    let (dev, ctrl) = init(cfg, opts);
    assert_eq!(ctrl.namespace_report()[0].state, NsState::NotReady);
    assert!(ctrl.namespaces().is_empty());
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut buf = ctrl.access().dma_alloc(512).unwrap();
    assert!(matches!(
        q.read(1, 0, 1, &mut buf),
        Err(Error::NoSuchNamespace(1))
    ));
    assert!(ctrl.poll_events().unwrap().is_empty());

    dev.make_ready(1);
    let events = ctrl.wait_events(Duration::from_secs(5)).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].namespaces[0].state, NsState::Ready);
    assert_eq!(ctrl.namespace_report()[0].state, NsState::Ready);
    assert!(ctrl.async_events_armed(), "the request is re-armed");
    // The queue taken before sees the namespace at its next read.
    q.read(1, 0, 1, &mut buf).unwrap();
}

#[test]
fn namespace_attached_after_init_is_picked_up_on_its_event() {
    let (dev, ctrl) = init(cfg(vec![1]), opts(1, InitMode::Fast));
    let before = ctrl.admin_commands();
    assert!(ctrl.poll_events().unwrap().is_empty());
    assert_eq!(ctrl.admin_commands(), before, "no event, no command");
    dev.attach(2);
    let events = ctrl.wait_events(Duration::from_secs(5)).unwrap();
    assert_eq!(events[0].namespaces.len(), 1);
    assert_eq!(events[0].namespaces[0].nsid, 2);
    // Get Log Page 04h, CNS 00h + 08h, a new Asynchronous Event Request.
    assert_eq!(ctrl.admin_commands(), before + 4);
    let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1, 2]);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut buf = ctrl.access().dma_alloc(512).unwrap();
    q.read(2, 0, 1, &mut buf).unwrap();
}

#[test]
fn rescan_finds_namespaces_without_an_event() {
    let cfg = MockConfig {
        aen: false,
        ..cfg(vec![1])
    };
    let (dev, ctrl) = init(cfg, opts(1, InitMode::Fast));
    assert!(!ctrl.async_events_armed());
    dev.attach(3);
    assert!(ctrl.poll_events().unwrap().is_empty());
    let report = ctrl.rescan().unwrap();
    let nsids: Vec<_> = report.iter().map(|r| (r.nsid, r.state)).collect();
    assert_eq!(nsids, [(1, NsState::Ready), (3, NsState::Ready)]);
}
