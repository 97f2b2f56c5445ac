//! Namespaces at initialisation and after: ready later (NSTAT), never
//! ready, detached, in a format the driver does not take, none at all, and
//! picked up later on an event or a rescan.

use std::time::{Duration, Instant};

use vnvme_controller::DoorbellMode;
use vnvme_driver::{Controller, DeviceAccess, Error, InitOptions, NsState};
use vnvme_spec::command::Command;
use vnvme_spec::{AdminOpcode, NvmOpcode, Status};

use crate::rig::{device, start, DeviceOptions, Rig};

fn states(ctrl: &Controller) -> Vec<(u32, NsState)> {
    ctrl.namespace_report()
        .iter()
        .map(|r| (r.nsid, r.state))
        .collect()
}

fn identifies(rig: &Rig) -> u64 {
    rig.ctrl
        .init_admin_by_opcode()
        .get("identify")
        .copied()
        .unwrap_or(0)
}

/// Namespace Attachment (SEL 0: attach) of `nsid` to this controller.
fn attach(ctrl: &Controller, access: &dyn DeviceAccess, nsid: u32) {
    let mut list = access.dma_alloc(4096).unwrap();
    let cntlid = ctrl.identify().cntlid.get();
    list.write_bytes(0, &1u16.to_le_bytes()).unwrap();
    list.write_bytes(2, &cntlid.to_le_bytes()).unwrap();
    let mut cmd = Command::new(AdminOpcode::NAMESPACE_ATTACHMENT.0, 0);
    cmd.nsid = nsid.into();
    ctrl.admin(cmd, Some(&mut list)).unwrap();
}

#[test]
fn namespace_ready_later_is_waited_for_by_ready_with_media() {
    let started = Instant::now();
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:null", "16M:null,ready=300ms"],
        InitOptions::default(),
    );
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(
        states(&rig.ctrl),
        [(1, NsState::Ready), (2, NsState::Ready)]
    );
    // CSTS.RDY waited for the slow namespace: Identify Controller, the
    // active list and CNS 00h + 08h once per namespace, nothing polled.
    assert_eq!(identifies(&rig), 2 + 2 * 2);
    assert_eq!(rig.admin_received("identify"), 2 + 2 * 2);
}

#[test]
fn namespace_ready_later_is_asked_again_when_ready_independent_of_media() {
    let opts = InitOptions {
        independent_of_media: true,
        ..InitOptions::default()
    };
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:null", "16M:null,ready=300ms"],
        opts,
    );
    assert_eq!(
        states(&rig.ctrl),
        [(1, NsState::Ready), (2, NsState::Ready)]
    );
    // The controller answers Identify CNS 00h at once and reports readiness
    // in NSTAT (CNS 08h), which the driver asked again until it was set.
    let n = identifies(&rig);
    assert!(n > 2 + 2 + 2, "{n} identifies: CNS 08h was retried");
    assert_eq!(rig.admin_received("identify"), n);
    // Not ready was never an error status.
    let completions = rig.stats().completions;
    assert_eq!(completions.keys().collect::<Vec<_>>(), ["success"]);
}

#[test]
fn never_ready_namespace_is_reported_not_ready() {
    // The controller gives up on the namespace (DNR) well before the
    // driver stops asking for NSTAT.
    let device = DeviceOptions {
        ready_timeout: Some(Duration::from_millis(50)),
        ..device(DoorbellMode::Trap)
    };
    let opts = InitOptions {
        ready_timeout: Some(Duration::from_millis(200)),
        ..InitOptions::default()
    };
    let rig = start(device, &["16M:null", "16M:null,never-ready"], opts);
    let report = rig.ctrl.namespace_report();
    assert_eq!(
        states(&rig.ctrl),
        [(1, NsState::Ready), (2, NsState::NotReady)]
    );
    assert_eq!(report[1].reason.as_deref(), Some("NSTAT: not ready"));
    let nsids: Vec<u32> = rig.ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1]);
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let mut buf = rig.access.dma_alloc(4096).unwrap();
    assert!(matches!(
        q.read(2, 0, 1, &mut buf),
        Err(Error::NoSuchNamespace(2))
    ));
    // Past its ready timeout the controller says so with DNR set; the
    // driver passes the status through untouched.
    let mut cmd = Command::new(NvmOpcode::FLUSH.0, 0);
    cmd.nsid = 2.into();
    let cqe = q.execute(cmd).unwrap();
    assert_eq!(cqe.status(), Status::NAMESPACE_NOT_READY.with_dnr(true));
}

#[test]
fn detached_and_metadata_namespaces_are_absent_or_skipped_without_retry() {
    let rig = start(
        device(DoorbellMode::Trap),
        &[
            "16M:null",
            "16M:null,detached",
            "16M:null,format=4",
            "16M:null,format=1",
        ],
        InitOptions::default(),
    );
    let report = rig.ctrl.namespace_report();
    // The detached namespace is not in the active list at all.
    assert_eq!(
        states(&rig.ctrl),
        [
            (1, NsState::Ready),
            (3, NsState::Skipped),
            (4, NsState::Skipped)
        ]
    );
    for r in &report[1..] {
        assert_eq!(
            r.reason.as_deref(),
            Some("unsupported LBA format: metadata")
        );
    }
    // Controller, list, CNS 00h + 08h for NSID 1, CNS 00h only for 3 and 4:
    // no retry, no NSTAT for a format the driver cannot use.
    assert_eq!(identifies(&rig), 2 + 2 + 1 + 1);
    let nsids: Vec<u32> = rig.ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1]);
}

#[test]
fn zero_namespaces_finish_with_one_list_and_no_identify() {
    let opts = InitOptions {
        io_queues: 4,
        ..InitOptions::default()
    };
    let rig = start(device(DoorbellMode::Shadow), &[], opts);
    assert!(rig.ctrl.namespace_report().is_empty());
    assert!(rig.ctrl.namespaces().is_empty());
    // 2N + 6: no Identify Namespace at all, nothing waited for.
    assert_eq!(rig.ctrl.init_admin_commands(), 2 * 4 + 6);
    assert_eq!(identifies(&rig), 2, "controller and active list only");
    assert_eq!(rig.admin_received("identify"), 2);
}

/// Waits for events until one reports `nsid`; returns how many events came.
fn wait_for_namespace(ctrl: &Controller, nsid: u32) -> Vec<vnvme_driver::AsyncEvent> {
    let mut events = Vec::new();
    for _ in 0..50 {
        events.extend(ctrl.wait_events(Duration::from_millis(200)).unwrap());
        if events
            .iter()
            .any(|e| e.namespaces.iter().any(|n| n.nsid == nsid))
        {
            return events;
        }
    }
    panic!(
        "no event for namespace {nsid}: {:?}",
        ctrl.namespace_report()
    );
}

#[test]
fn namespace_not_ready_past_the_timeout_is_picked_up_on_its_event() {
    let opts = InitOptions {
        ready_timeout: Some(Duration::from_millis(100)),
        independent_of_media: true,
        ..InitOptions::default()
    };
    let rig = start(device(DoorbellMode::Trap), &["16M:ram,ready=800ms"], opts);
    let ctrl = &rig.ctrl;
    assert_eq!(states(ctrl), [(1, NsState::NotReady)]);
    assert!(ctrl.namespaces().is_empty());
    let mut q = ctrl.take_io_queue(0).unwrap();
    let mut buf = rig.access.dma_alloc(4096).unwrap();
    assert!(matches!(
        q.read(1, 0, 1, &mut buf),
        Err(Error::NoSuchNamespace(1))
    ));

    let events = wait_for_namespace(ctrl, 1);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].namespaces.len(), 1);
    assert_eq!(events[0].namespaces[0].state, NsState::Ready);
    assert_eq!(states(ctrl), [(1, NsState::Ready)]);
    assert!(ctrl.async_events_armed(), "the request is re-armed");
    // The queue taken before sees the namespace at its next read.
    q.read(1, 0, 1, &mut buf).unwrap();
}

#[test]
fn namespace_attached_after_init_is_picked_up_on_its_event() {
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:null", "16M:ram,detached"],
        InitOptions::default(),
    );
    let ctrl = &rig.ctrl;
    assert!(ctrl.poll_events().unwrap().is_empty());
    let before = ctrl.admin_commands();
    assert_eq!(rig.admin_received("namespace-attachment"), 0);
    attach(ctrl, &*rig.access, 2);
    let events = wait_for_namespace(ctrl, 2);
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].namespaces.len(), 1);
    assert_eq!(events[0].namespaces[0].state, NsState::Ready);
    // The attachment, then Get Log Page 04h, CNS 00h + 08h and a new
    // Asynchronous Event Request.
    assert_eq!(ctrl.admin_commands(), before + 1 + 4);
    let nsids: Vec<u32> = ctrl.namespaces().iter().map(|n| n.nsid).collect();
    assert_eq!(nsids, [1, 2]);
    let mut q = ctrl.take_io_queue(0).unwrap();
    let buf = rig.access.dma_alloc(4096).unwrap();
    buf.write_bytes(0, &[7; 4096]).unwrap();
    q.write(2, 3, 1, &buf).unwrap();
    let mut back = rig.access.dma_alloc(4096).unwrap();
    q.read(2, 3, 1, &mut back).unwrap();
    assert_eq!(back.to_vec(), [7; 4096]);
}

#[test]
fn rescan_finds_namespaces_without_an_event() {
    let opts = InitOptions {
        async_events: false,
        ..InitOptions::default()
    };
    let rig = start(
        device(DoorbellMode::Trap),
        &["16M:null", "16M:null,detached", "16M:null,detached"],
        opts,
    );
    let ctrl = &rig.ctrl;
    assert!(!ctrl.async_events_armed());
    attach(ctrl, &*rig.access, 3);
    assert!(ctrl.poll_events().unwrap().is_empty());
    assert_eq!(states(ctrl), [(1, NsState::Ready)]);
    let report = ctrl.rescan().unwrap();
    let found: Vec<_> = report.iter().map(|r| (r.nsid, r.state)).collect();
    assert_eq!(found, [(1, NsState::Ready), (3, NsState::Ready)]);
    assert_eq!(rig.admin_received("async-event-request"), 0);
}
