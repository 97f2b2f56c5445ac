//! Driver initialisation against the real controller, in one process over a
//! vfio-user socketpair: exact admin command counts (fast and learning),
//! shared interrupt vectors, and namespaces that are slow, detached,
//! unusable or attached later.

use std::sync::Arc;
use std::time::Duration;

use vnvme::device::DeviceOptions;
use vnvme::inproc::InProcess;
use vnvme::namespace::NamespaceSpec;
use vnvme_driver::{Controller, DeviceAccess, InitMode, InitOptions, NsState};
use vnvme_spec::command::Command;
use vnvme_spec::AdminOpcode;

fn start(
    namespaces: &[&str],
    device: DeviceOptions,
    opts: InitOptions,
) -> (InProcess, Arc<dyn DeviceAccess>, Controller) {
    let specs: Vec<NamespaceSpec> = namespaces.iter().map(|s| s.parse().unwrap()).collect();
    let device = device.build(&specs).unwrap();
    InProcess::start_driver(device, opts).unwrap()
}

fn queues(n: u16, mode: InitMode) -> (DeviceOptions, InitOptions) {
    let device = DeviceOptions {
        max_io_queues: n,
        ..DeviceOptions::default()
    };
    let opts = InitOptions {
        io_queues: n,
        init_mode: mode,
        queue_depth: 16,
        ..InitOptions::default()
    };
    (device, opts)
}

fn by(ctrl: &Controller, name: &str) -> u64 {
    ctrl.init_admin_by_opcode().get(name).copied().unwrap_or(0)
}

#[test]
fn fast_init_of_32_queues_sends_72_admin_commands() {
    let (device, opts) = queues(32, InitMode::Fast);
    let (_srv, _access, ctrl) = start(&["16M:null"], device, opts);
    assert_eq!(ctrl.io_queue_count(), 32);
    // Identify Controller, Number of Queues, Doorbell Buffer Config,
    // 32 x (CQ + SQ), Async Event Configuration, active list, CNS 00h and
    // 08h for the namespace, one Asynchronous Event Request: 2N + 8.
    assert_eq!(ctrl.init_admin_commands(), 2 * 32 + 8);
    assert!(ctrl.init_admin_commands() <= 2 * 32 + 10);
    assert_eq!(
        (by(&ctrl, "create-io-cq"), by(&ctrl, "create-io-sq")),
        (32, 32)
    );
    assert_eq!(by(&ctrl, "delete-io-sq") + by(&ctrl, "delete-io-cq"), 0);
    assert_eq!(ctrl.init_io_commands(), 0);
    assert!(ctrl.async_events_armed());
}

#[test]
fn learning_init_of_32_queues_costs_the_seeds_224_plus_8() {
    let (device, opts) = queues(32, InitMode::Learning);
    let (_srv, access, ctrl) = start(&["16M:null"], device, opts);
    assert_eq!(ctrl.init_admin_commands(), 6 * 32 + 8);
    assert_eq!(ctrl.init_io_commands(), 32);
    assert_eq!(
        ctrl.init_admin_commands() + ctrl.init_io_commands(),
        224 + 8
    );
    assert_eq!(
        (by(&ctrl, "delete-io-sq"), by(&ctrl, "delete-io-cq")),
        (32, 32)
    );
    // The re-created queues work.
    let mut q = ctrl.take_io_queue(31).unwrap();
    let mut buf = access.dma_alloc(4096).unwrap();
    q.read(1, 0, 1, &mut buf).unwrap();
}

#[test]
fn three_vectors_for_eight_queues_are_shared_and_every_queue_does_io() {
    let (mut device, opts) = queues(8, InitMode::Fast);
    device.msix_vectors = Some(3);
    let (_srv, access, ctrl) = start(&["16M:ram"], device, opts);
    assert_eq!(ctrl.interrupt_vectors(), 3);
    let qs: Vec<_> = (0..8).map(|i| ctrl.take_io_queue(i).unwrap()).collect();
    std::thread::scope(|s| {
        for (t, mut q) in qs.into_iter().enumerate() {
            let access = Arc::clone(&access);
            s.spawn(move || {
                assert_eq!(q.interrupt_vector(), Some((q.qid() - 1) % 3));
                assert!(q.has_interrupt());
                for i in 0..40u64 {
                    let data = vec![(t as u8) ^ (i as u8); 4096];
                    let w = access.dma_alloc(4096).unwrap();
                    w.write_bytes(0, &data).unwrap();
                    let lba = t as u64 * 100 + i;
                    q.write(1, lba, 1, &w).unwrap();
                    let mut r = access.dma_alloc(4096).unwrap();
                    q.read(1, lba, 1, &mut r).unwrap();
                    assert_eq!(r.to_vec(), data, "queue {} block {i}", q.qid());
                }
            });
        }
        // The admin queue shares vector 0 with I/O queues 1, 4 and 7.
        for _ in 0..20 {
            assert!(ctrl.poll_events().unwrap().is_empty());
        }
    });
}

#[test]
fn namespace_mix_is_ready_late_skipped_or_absent_with_reasons() {
    let (device, opts) = queues(2, InitMode::Fast);
    let (_srv, _access, ctrl) = start(
        &[
            "16M:null",
            "16M:null,ready=300ms",
            "16M:null,detached",
            "16M:null,format=4",
        ],
        device,
        opts,
    );
    let report = ctrl.namespace_report();
    let states: Vec<_> = report.iter().map(|n| (n.nsid, n.state)).collect();
    // The detached namespace is not in the active list at all.
    assert_eq!(
        states,
        [
            (1, NsState::Ready),
            (2, NsState::Ready),
            (4, NsState::Skipped)
        ]
    );
    assert_eq!(
        report[2].reason.as_deref(),
        Some("unsupported LBA format: metadata")
    );
    let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1, 2]);
}

#[test]
fn zero_namespaces_need_one_list_and_no_wait() {
    let (device, opts) = queues(4, InitMode::Fast);
    let (_srv, _access, ctrl) = start(&[], device, opts);
    assert!(ctrl.namespace_report().is_empty());
    assert_eq!(ctrl.init_admin_commands(), 2 * 4 + 6);
    assert_eq!(by(&ctrl, "identify"), 2, "controller and active list only");
}

#[test]
fn namespace_ready_after_the_timeout_is_picked_up_on_its_event() {
    let (device, mut opts) = queues(1, InitMode::Fast);
    opts.ready_timeout = Some(Duration::from_millis(100));
    let (_srv, access, ctrl) = start(&["16M:ram,ready=700ms"], device, opts);
    assert_eq!(ctrl.namespace_report()[0].state, NsState::NotReady);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut buf = access.dma_alloc(4096).unwrap();
    assert!(q.read(1, 0, 1, &mut buf).is_err());
    let mut ready = false;
    for _ in 0..50 {
        ctrl.wait_events(Duration::from_millis(200)).unwrap();
        if ctrl.namespace_report()[0].state == NsState::Ready {
            ready = true;
            break;
        }
    }
    assert!(ready, "{:?}", ctrl.namespace_report());
    q.read(1, 0, 1, &mut buf).unwrap();
}

#[test]
fn never_ready_namespace_is_reported_not_ready() {
    let (device, mut opts) = queues(1, InitMode::Fast);
    opts.ready_timeout = Some(Duration::from_millis(100));
    let (_srv, _access, ctrl) = start(&["16M:null", "16M:null,never-ready"], device, opts);
    let report = ctrl.namespace_report();
    assert_eq!(report[0].state, NsState::Ready);
    assert_eq!(report[1].state, NsState::NotReady);
    assert!(report[1].reason.is_some());
}

#[test]
fn namespace_attached_after_init_is_picked_up_on_its_event() {
    let (device, opts) = queues(1, InitMode::Fast);
    let (_srv, access, ctrl) = start(&["16M:null", "16M:ram,detached"], device, opts);
    assert_eq!(ctrl.namespaces().len(), 1);
    // Namespace Attachment (SEL 0: attach) of NSID 2 to this controller.
    let mut list = access.dma_alloc(4096).unwrap();
    let cntlid = ctrl.identify().cntlid.get();
    list.write_bytes(0, &[1, 0]).unwrap();
    list.write_bytes(2, &cntlid.to_le_bytes()).unwrap();
    let mut cmd = Command::new(AdminOpcode::NAMESPACE_ATTACHMENT.0, 0);
    cmd.nsid = 2.into();
    ctrl.admin(cmd, Some(&mut list)).unwrap();
    let mut found = false;
    for _ in 0..25 {
        ctrl.wait_events(Duration::from_millis(200)).unwrap();
        if ctrl.namespaces().iter().any(|n| n.nsid == 2) {
            found = true;
            break;
        }
    }
    assert!(found, "{:?}", ctrl.namespace_report());
    let mut q = ctrl.take_io_queue(0).unwrap();
    let w = access.dma_alloc(4096).unwrap();
    w.write_bytes(0, &[7; 4096]).unwrap();
    q.write(2, 3, 1, &w).unwrap();
}
