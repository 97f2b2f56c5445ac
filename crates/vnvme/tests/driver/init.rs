//! Initialisation: what Identify reports, admin commands sent (counted by
//! the driver and by the controller alike), queues and vectors granted,
//! learning mode, reset and shutdown.

use std::sync::Arc;

use vnvme_controller::DoorbellMode;
use vnvme_driver::{Error, InitMode, InitOptions, IoQueue};
use vnvme_spec::identify::{ascii_field, Cns};

use crate::rig::{device, eventually, pattern, start, DeviceOptions, Rig};

fn by(rig: &Rig, name: &str) -> u64 {
    rig.ctrl
        .init_admin_by_opcode()
        .get(name)
        .copied()
        .unwrap_or(0)
}

/// What the driver counted at initialisation is what the controller received
/// (once it has fetched the Asynchronous Event Request, which the driver
/// does not wait for).
fn assert_counts_agree(rig: &Rig) {
    let sent = rig.ctrl.init_admin_commands();
    eventually("every admin command fetched", || {
        rig.stats().admin_commands.values().sum::<u64>() >= sent
    });
    let received = rig.stats().admin_commands;
    assert_eq!(rig.ctrl.init_admin_by_opcode(), received);
    assert_eq!(
        rig.ctrl.init_admin_commands(),
        received.values().sum::<u64>()
    );
}

fn queues(n: u16, mode: InitMode) -> (DeviceOptions, InitOptions) {
    let device = DeviceOptions {
        max_io_queues: n,
        doorbells: DoorbellMode::Shadow,
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

#[test]
fn enable_and_identify_over_vfio_user() {
    let rig = start(
        DeviceOptions::default(),
        &["64M:ram", "16M:null"],
        InitOptions::default(),
    );
    let id = rig.ctrl.identify();
    assert_eq!(ascii_field(&id.mn), "vnvme");
    // No --serial: the one derived for this place.
    let serial = vnvme::identity::Origin::embedded().serial();
    assert_eq!(ascii_field(&id.sn), serial);
    assert!(serial.starts_with("VNVME-"), "{serial}");
    assert_eq!(id.nn.get(), 2);
    let ns = rig.ctrl.namespaces();
    assert_eq!(ns.len(), 2);
    assert_eq!(ns[0].size_bytes(), 64 << 20);
    assert_eq!(ns[1].size_bytes(), 16 << 20);
}

#[test]
fn init_without_shadow_or_events_sends_2n_plus_3_plus_2_per_namespace() {
    let opts = InitOptions {
        io_queues: 3,
        interrupts: false,
        async_events: false,
        ..InitOptions::default()
    };
    let rig = start(device(DoorbellMode::Trap), &["16M:null", "16M:null"], opts);
    let ctrl = &rig.ctrl;
    assert_eq!(ctrl.io_queue_count(), 3);
    let ns = ctrl.namespaces();
    assert_eq!(ns.iter().map(|n| n.nsid).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(ns[0].lba_size, 4096);
    // Identify Controller, Number of Queues, 3 x (CQ + SQ), active list,
    // and CNS 00h + 08h per namespace (NVMe 2.0).
    assert_eq!(ctrl.init_admin_commands(), 2 * 3 + 3 + 2 * 2);
    assert_eq!(
        (by(&rig, "create-io-cq"), by(&rig, "create-io-sq")),
        (3, 3),
        "no create-learn-delete-recreate"
    );
    assert_counts_agree(&rig);
    assert!(!ctrl.interrupts_enabled());
}

#[test]
fn init_uses_the_granted_number_of_queues() {
    let device = DeviceOptions {
        max_io_queues: 2,
        ..DeviceOptions::default()
    };
    let opts = InitOptions {
        io_queues: 8,
        ..InitOptions::default()
    };
    let rig = start(device, &["16M:null"], opts);
    assert_eq!(rig.ctrl.io_queue_count(), 2);
    assert_eq!(rig.admin_received("create-io-sq"), 2);
    assert!(rig.ctrl.take_io_queue(1).is_ok());
    assert!(matches!(
        rig.ctrl.take_io_queue(1),
        Err(Error::QueueTaken(2))
    ));
    assert!(matches!(
        rig.ctrl.take_io_queue(2),
        Err(Error::NoSuchQueue(3))
    ));
}

#[test]
fn fast_init_of_32_queues_sends_2n_plus_8_admin_commands() {
    let (device, opts) = queues(32, InitMode::Fast);
    let rig = start(device, &["16M:null"], opts);
    let ctrl = &rig.ctrl;
    assert_eq!(ctrl.io_queue_count(), 32);
    // Identify Controller, Number of Queues, Doorbell Buffer Config, 32 x
    // (CQ + SQ), Async Event Configuration, active list, CNS 00h + 08h,
    // and the Asynchronous Event Request left outstanding.
    assert_eq!(ctrl.init_admin_commands(), 2 * 32 + 8);
    assert_eq!(by(&rig, "create-io-cq"), 32);
    assert_eq!(by(&rig, "create-io-sq"), 32);
    assert_eq!(by(&rig, "identify"), 4);
    assert_eq!(by(&rig, "set-features"), 2);
    assert_eq!(by(&rig, "doorbell-buffer-config"), 1);
    assert_eq!(by(&rig, "async-event-request"), 1);
    assert_eq!(by(&rig, "delete-io-sq") + by(&rig, "delete-io-cq"), 0);
    assert_counts_agree(&rig);
    assert_eq!(ctrl.init_io_commands(), 0);
    assert!(
        rig.stats().io_commands.is_empty(),
        "nothing learnt by reads"
    );
    assert!(ctrl.async_events_armed());
}

#[test]
fn fast_init_with_slow_detached_and_unsupported_namespaces_sends_2n_plus_10() {
    // As `vnvme bench init`: no Doorbell Buffer Config.
    let (_, opts) = queues(32, InitMode::Fast);
    let device = DeviceOptions {
        max_io_queues: 32,
        ..device(DoorbellMode::Trap)
    };
    let mix = [
        "16M:null",
        "16M:null,ready=300ms",
        "16M:null,detached",
        "16M:null,format=4",
    ];
    for _ in 0..2 {
        let rig = start(device.clone(), &mix, opts.clone());
        // Identify Controller, Number of Queues, 32 x (CQ + SQ), Async Event
        // Configuration, active list, the Asynchronous Event Request, CNS
        // 00h + 08h for the ready namespace and for the slow one (ready when
        // CSTS.RDY is: no polling), CNS 00h for the one with metadata
        // (skipped), none for the detached one. The same every run.
        assert_eq!(rig.ctrl.init_admin_commands(), 2 * 32 + 10);
        assert_eq!(by(&rig, "identify"), 1 + 1 + 2 + 2 + 1);
        assert_eq!(rig.ctrl.namespaces().len(), 2);
        assert_counts_agree(&rig);
    }
}

#[test]
fn learning_init_of_32_queues_costs_224_plus_8_commands() {
    let (device, opts) = queues(32, InitMode::Learning);
    let rig = start(device, &["16M:null"], opts);
    let ctrl = &rig.ctrl;
    // Fast's 2N + 8, plus N x (delete SQ + delete CQ) and N x (CQ + SQ) again.
    assert_eq!(ctrl.init_admin_commands(), 6 * 32 + 8);
    assert_eq!(by(&rig, "create-io-cq"), 64);
    assert_eq!(by(&rig, "create-io-sq"), 64);
    assert_eq!(by(&rig, "delete-io-sq"), 32);
    assert_eq!(by(&rig, "delete-io-cq"), 32);
    assert_counts_agree(&rig);
    // One learning read per queue: the patch's 224 + 8 commands in all.
    assert_eq!(ctrl.init_io_commands(), 32);
    assert_eq!(rig.io_received("read"), 32);
    assert_eq!(
        ctrl.init_admin_commands() + ctrl.init_io_commands(),
        224 + 8
    );
    // The re-created queues work.
    let mut q = ctrl.take_io_queue(31).unwrap();
    let mut buf = rig.access.dma_alloc(4096).unwrap();
    q.read(1, 0, 1, &mut buf).unwrap();
    assert_eq!(rig.io_received("read"), 33);
}

#[test]
fn learning_with_zero_namespaces_sends_no_reads() {
    let (device, opts) = queues(4, InitMode::Learning);
    let rig = start(device, &[], opts);
    assert_eq!(rig.ctrl.init_admin_commands(), 6 * 4 + 6);
    assert_eq!(rig.ctrl.init_io_commands(), 0);
    assert_counts_agree(&rig);
    assert!(rig.stats().io_commands.is_empty());
}

#[test]
fn io_queues_get_their_own_msix_vector() {
    let device = DeviceOptions {
        msix_vectors: Some(8),
        ..DeviceOptions::default()
    };
    let opts = InitOptions {
        io_queues: 2,
        ..InitOptions::default()
    };
    let rig = start(device, &["16M:null"], opts);
    assert!(rig.ctrl.interrupts_enabled());
    assert_eq!(rig.ctrl.interrupt_vectors(), 3);
    let q1 = rig.ctrl.take_io_queue(0).unwrap();
    let mut q2 = rig.ctrl.take_io_queue(1).unwrap();
    assert_eq!(q1.interrupt_vector(), Some(1));
    assert_eq!(q2.interrupt_vector(), Some(2));
    assert!(!q1.shares_vector() && !q2.shares_vector());
    let before = rig.queue(2).interrupts;
    q2.flush(1).unwrap();
    // Counted after the completion is posted, which the driver may reap first.
    eventually("the interrupt of queue 2", || {
        rig.queue(2).interrupts > before
    });
    assert_eq!(rig.queue(2).interrupts - before, 1);
    assert_eq!(rig.queue(1).interrupts, 0);
}

#[test]
fn fewer_vectors_than_queues_share_them_and_every_queue_does_io() {
    let (mut device, opts) = queues(8, InitMode::Fast);
    device.msix_vectors = Some(3);
    let rig = start(device, &["16M:null"], opts);
    let ctrl = &rig.ctrl;
    assert_eq!(ctrl.io_queue_count(), 8);
    assert_eq!(ctrl.interrupt_vectors(), 3);
    let queues: Vec<IoQueue> = (0..8).map(|i| ctrl.take_io_queue(i).unwrap()).collect();
    for q in &queues {
        assert_eq!(q.interrupt_vector(), Some((q.qid() - 1) % 3), "{}", q.qid());
        assert!(q.shares_vector());
    }
    let before = rig.admin_received("identify");
    std::thread::scope(|s| {
        for mut q in queues {
            let access = Arc::clone(&rig.access);
            s.spawn(move || {
                let mut buf = access.dma_alloc(4096).unwrap();
                for lba in 0..20 {
                    q.read(1, lba, 1, &mut buf).unwrap();
                }
            });
        }
        // The admin queue shares vector 0 with I/O queues 1, 4 and 7.
        let mut buf = rig.access.dma_alloc(4096).unwrap();
        for _ in 0..20 {
            ctrl.admin(
                vnvme_driver::admin::identify(Cns::CONTROLLER, 0),
                Some(&mut buf),
            )
            .unwrap();
        }
    });
    assert_eq!(rig.io_received("read"), 8 * 20);
    assert_eq!(rig.admin_received("identify") - before, 20);
}

#[test]
fn data_written_on_eight_queues_sharing_three_vectors_reads_back() {
    let (mut device, opts) = queues(8, InitMode::Fast);
    device.msix_vectors = Some(3);
    let rig = start(device, &["16M:ram"], opts);
    let (access, ctrl) = (&rig.access, &rig.ctrl);
    assert_eq!(ctrl.interrupt_vectors(), 3);
    let qs: Vec<_> = (0..8).map(|i| ctrl.take_io_queue(i).unwrap()).collect();
    std::thread::scope(|s| {
        for (t, mut q) in qs.into_iter().enumerate() {
            let access = Arc::clone(access);
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
fn reset_makes_old_queues_stale_and_new_ones_work() {
    let mut rig = start(
        device(DoorbellMode::Trap),
        &["16M:null"],
        InitOptions::default(),
    );
    let mut old = rig.ctrl.take_io_queue(0).unwrap();
    rig.ctrl.reset().unwrap();
    assert!(matches!(old.flush(1), Err(Error::StaleQueue(1))));
    assert_eq!(rig.stats().enables, 2);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let flushes = rig.io_received("flush");
    q.flush(1).unwrap();
    assert_eq!(rig.io_received("flush") - flushes, 1);
    rig.ctrl.shutdown().unwrap();
    assert!(matches!(q.flush(1), Err(Error::StaleQueue(1))));
    assert_eq!(rig.io_received("flush") - flushes, 1);
}

#[test]
fn reset_and_reenable_keeps_ram_data() {
    let mut rig = start(
        DeviceOptions::default(),
        &["64M:ram"],
        InitOptions::default(),
    );
    let data = pattern(4096, 7);
    {
        let mut q = rig.ctrl.take_io_queue(0).unwrap();
        let w = rig.access.dma_alloc(4096).unwrap();
        w.write_bytes(0, &data).unwrap();
        q.write(1, 9, 1, &w).unwrap();
    }
    rig.ctrl.reset().unwrap();
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let mut r = rig.access.dma_alloc(4096).unwrap();
    q.read(1, 9, 1, &mut r).unwrap();
    assert_eq!(r.to_vec(), data);
}
