//! Faults injected by the operator, seen as a host sees them: statuses,
//! late and missing completions (Abort and reset recover them), media
//! errors, not-ready periods, SMART warnings, power loss, and namespaces
//! changed at run time.

use super::*;
use crate::faults::{FaultKind, FaultSpec, Latency};
use crate::memory::GuestAddress;

const BUF: u64 = DATA;

fn read(slba: u64) -> Command {
    rw(NvmOpcode::READ, 1, slba, 1, BUF, 0)
}

fn on_reads(kind: FaultKind) -> FaultSpec {
    FaultSpec {
        nsid: Some(1),
        opcodes: vec![NvmOpcode::READ.0],
        ..FaultSpec::new(kind)
    }
}

fn host() -> Host {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    h
}

fn abort(sqid: u16, cid: u16) -> Command {
    let mut c = cmd(AdminOpcode::ABORT.0);
    c.cdw10 = U32::new(u32::from(sqid) | (u32::from(cid) << 16));
    c
}

#[test]
fn status_fault_fails_matching_commands_with_its_status_and_dnr_count_times() {
    let mut h = host();
    let mut spec = on_reads(FaultKind::Status(
        Status::UNRECOVERED_READ_ERROR.with_dnr(false),
    ));
    spec.lba = Some((8, 8));
    spec.count = Some(2);
    let id = h.ctrl.fault_add(spec).unwrap();
    assert!(id.is_some(), "a command fault has an id");
    assert_eq!(
        h.submit(1, read(0)).status(),
        Status::SUCCESS,
        "outside the range"
    );
    for _ in 0..2 {
        let s = h.submit(1, read(9)).status();
        assert!(s.same_code(Status::UNRECOVERED_READ_ERROR));
        assert!(!s.dnr());
    }
    assert_eq!(
        h.submit(1, read(9)).status(),
        Status::SUCCESS,
        "count spent"
    );
    assert!(h.ctrl.fault_list().is_empty());
}

#[test]
fn latency_fault_delays_its_command_while_others_on_the_queue_complete() {
    let mut h = host();
    let delay = Duration::from_millis(300);
    let mut spec = on_reads(FaultKind::Latency(Latency::Fixed(delay)));
    spec.lba = Some((0, 1));
    h.ctrl.fault_add(spec).unwrap();
    let start = Instant::now();
    let slow = h.push(1, read(0));
    let fast = h.push(1, read(5));
    h.ring_sq(1);
    let first = h.reap(1);
    assert_eq!(first.cid(), fast, "the undelayed read completes first");
    let second = h.reap(1);
    assert_eq!(second.cid(), slow);
    assert_eq!(second.status(), Status::SUCCESS);
    assert!(start.elapsed() >= delay, "completed before its latency");
}

#[test]
fn never_complete_fault_holds_the_command_until_abort_completes_it() {
    let mut h = host();
    h.ctrl
        .fault_add(on_reads(FaultKind::NeverComplete))
        .unwrap();
    let cid = h.push(1, read(0));
    h.ring_sq(1);
    std::thread::sleep(Duration::from_millis(200));
    assert!(h.peek_cqe(1).is_none(), "a never-complete read completed");
    let a = h.admin(abort(1, cid));
    assert_eq!(a.status(), Status::SUCCESS);
    assert_eq!(a.dw0.get() & 1, 0, "reported aborted");
    let c = h.reap(1);
    assert_eq!(c.cid(), cid);
    assert_eq!(c.status(), Status::ABORTED_BY_REQUEST);
}

#[test]
fn never_completed_commands_are_dropped_by_a_controller_reset() {
    let mut h = host();
    let mut spec = on_reads(FaultKind::NeverComplete);
    spec.count = Some(1);
    h.ctrl.fault_add(spec).unwrap();
    h.push(1, read(0));
    h.ring_sq(1);
    std::thread::sleep(Duration::from_millis(100));
    h.reenable();
    h.mem.zero(GuestAddress(cq_base(1)), 16 * 16).unwrap();
    h.create_pair(1, 16);
    let c = h.submit(1, read(0));
    assert_eq!(c.status(), Status::SUCCESS);
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        h.peek_cqe(1).is_none(),
        "the dropped command completed after the reset"
    );
}

#[test]
fn media_error_fault_fails_reads_of_its_range_until_rewritten() {
    let mut h = host();
    let mut spec = FaultSpec::new(FaultKind::MediaError);
    spec.nsid = Some(1);
    spec.lba = Some((10, 2));
    assert_eq!(h.ctrl.fault_add(spec.clone()).unwrap(), None);
    assert!(h
        .submit(1, read(11))
        .status()
        .same_code(Status::UNRECOVERED_READ_ERROR));
    assert_eq!(h.submit(1, read(12)).status(), Status::SUCCESS);
    let w = h.submit(1, rw(NvmOpcode::WRITE, 1, 11, 1, BUF, 0));
    assert_eq!(w.status(), Status::SUCCESS);
    assert_eq!(h.submit(1, read(11)).status(), Status::SUCCESS);
    spec.lba = Some((NS_BLOCKS - 1, 2));
    assert_eq!(
        h.ctrl.fault_add(spec),
        Err(crate::FaultError::OutOfRange(1))
    );
}

#[test]
fn not_ready_fault_answers_namespace_not_ready_for_its_period() {
    let mut h = host();
    let mut spec = FaultSpec::new(FaultKind::NotReady(Duration::from_millis(300)));
    spec.nsid = Some(1);
    h.ctrl.fault_add(spec).unwrap();
    assert_eq!(h.ctrl.not_ready_namespaces(), vec![1]);
    let s = h.submit(1, read(0)).status();
    assert!(
        s.same_code(Status::NAMESPACE_NOT_READY) && !s.dnr(),
        "{s:?}"
    );
    std::thread::sleep(Duration::from_millis(350));
    assert_eq!(h.submit(1, read(0)).status(), Status::SUCCESS);
    assert!(h.ctrl.not_ready_namespaces().is_empty());
}

#[test]
fn smart_warning_fault_sets_the_critical_warning_and_raises_its_event() {
    let mut h = host();
    // Temperature warnings enabled (AEC bit 1), one AER outstanding.
    assert_eq!(h.admin(set_features(0x0B, 0x2)).status(), Status::SUCCESS);
    let aer = h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    h.ring_sq(0);
    h.ctrl
        .fault_add(FaultSpec::new(FaultKind::SmartWarning(0x2)))
        .unwrap();
    let c = h.reap(0);
    assert_eq!(c.cid(), aer);
    // Type 1 (SMART / Health), information 01h (temperature), log 02h.
    assert_eq!(c.dw0.get(), 0x0002_0101);
    let log = h.admin(get_log(0x02, 128, 0, BUF));
    assert_eq!(log.status(), Status::SUCCESS);
    assert_eq!(h.read_mem(BUF, 1)[0], 0x2, "critical warning");
    h.ctrl.fault_clear(None);
    h.admin(get_log(0x02, 128, 0, BUF));
    assert_eq!(h.read_mem(BUF, 1)[0], 0, "cleared");
}

#[test]
fn controller_fatal_sets_cfs_until_the_host_resets() {
    let mut h = host();
    h.ctrl.controller_fatal("test");
    assert!(h.csts().cfs());
    h.reenable();
    assert!(!h.csts().cfs());
}

#[test]
fn operator_namespaces_are_added_resized_and_removed_with_notices() {
    let config = ControllerConfig {
        max_namespaces: 4,
        ..config()
    };
    let mut h = Host::with(config, 512);
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(
        h.admin(set_features(0x0B, 1 << 8)).status(),
        Status::SUCCESS
    );
    let backend: Arc<dyn BlockDevice> = Arc::new(RamDevice::new(1 << 20));
    let nsid = h.ctrl.namespace_add(backend, 0, None, true, None).unwrap();
    assert_eq!(nsid, 2);
    h.mem.write(GuestAddress(BUF), &[7; 512]).unwrap();
    let w = h.submit(1, rw(NvmOpcode::WRITE, 2, 3, 1, BUF, 0));
    assert_eq!(w.status(), Status::SUCCESS);
    assert_eq!(h.ctrl.namespace_resize(2, 2 << 20).unwrap(), 4096);
    let id = h.admin(identify(0, 2, BUF));
    assert_eq!(id.status(), Status::SUCCESS);
    let ns = IdentifyNamespace::read_from_bytes(&h.read_mem(BUF, 4096)).unwrap();
    assert_eq!(ns.nsze.get(), 4096);
    let r = h.submit(1, rw(NvmOpcode::READ, 2, 3, 1, BUF + 4096, 0));
    assert_eq!(r.status(), Status::SUCCESS);
    assert_eq!(h.read_mem(BUF + 4096, 512), vec![7; 512], "kept its data");
    h.ctrl.namespace_attach(2, false).unwrap();
    assert_eq!(
        h.ctrl.namespace_attach(2, false),
        Err(crate::NamespaceOpError::NotAttached(2))
    );
    let r = h.submit(1, rw(NvmOpcode::READ, 2, 3, 1, BUF, 0));
    assert!(r.status().same_code(Status::INVALID_NAMESPACE_OR_FORMAT));
    h.ctrl.namespace_remove(2).unwrap();
    assert_eq!(
        h.ctrl.namespace_remove(2),
        Err(crate::NamespaceOpError::NoSuchNamespace(2))
    );
    // The host hears of the changes: an AER completes with the notice.
    let (_, _) = h.admin_collect(cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    let log = h.admin(get_log(0x04, 1024, 0, BUF));
    assert_eq!(log.status(), Status::SUCCESS);
    assert_eq!(&h.read_mem(BUF, 4), &2u32.to_le_bytes());
}

#[test]
fn namespace_add_without_a_free_nsid_says_how_to_get_one() {
    let mut h = Host::new();
    h.enable();
    let backend: Arc<dyn BlockDevice> = Arc::new(RamDevice::new(1 << 20));
    assert_eq!(
        h.ctrl.namespace_add(backend.clone(), 0, None, true, None),
        Err(crate::NamespaceOpError::NoFreeNsid(1))
    );
    assert_eq!(
        h.ctrl.namespace_add(backend, 9, None, true, None),
        Err(crate::NamespaceOpError::Format(9))
    );
}

#[test]
fn power_loss_drops_acknowledged_unflushed_writes_and_never_flushed_ones() {
    let ram = Arc::new(RamDevice::new(NS_BLOCKS * 512).with_volatile_cache(true));
    let mut h = Host::enabled_on(config(), ram);
    h.create_pair(1, 16);
    let write = |h: &mut Host, lba: u64, byte: u8, fua: bool| {
        h.mem.write(GuestAddress(BUF), &[byte; 512]).unwrap();
        let mut c = rw(NvmOpcode::WRITE, 1, lba, 1, BUF, 0);
        if fua {
            c.cdw12 = U32::new(c.cdw12.get() | 1 << 30);
        }
        assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    };
    for lba in 0..4 {
        write(&mut h, lba, 0xA0 + lba as u8, false);
    }
    let flush = h.submit(1, rw(NvmOpcode::FLUSH, 1, 0, 1, 0, 0));
    assert_eq!(flush.status(), Status::SUCCESS);
    // Acknowledged after the flush: 0 and 2 plain, 1 with FUA; 3 untouched.
    write(&mut h, 0, 0xB0, false);
    write(&mut h, 1, 0xB1, true);
    write(&mut h, 2, 0xB2, false);
    write(&mut h, 100, 0xB3, false);
    assert_eq!(
        h.ctrl.fault_add(FaultSpec::new(FaultKind::PowerLoss)),
        Ok(None)
    );
    assert!(h.csts().cfs(), "the host sees the controller fail");
    h.reenable();
    h.create_pair(1, 16);
    let expect = [(0, 0xA0), (1, 0xB1), (2, 0xA2), (3, 0xA3), (100, 0x00)];
    for (lba, byte) in expect {
        let r = h.submit(1, rw(NvmOpcode::READ, 1, lba, 1, BUF, 0));
        assert_eq!(r.status(), Status::SUCCESS);
        assert_eq!(h.read_mem(BUF, 512), vec![byte; 512], "LBA {lba}");
    }
    // SMART / Health: Unsafe Shutdowns (bytes 159:144).
    assert_eq!(
        h.admin(get_log(0x02, 128, 0, BUF)).status(),
        Status::SUCCESS
    );
    assert_eq!(h.read_mem(BUF + 144, 1)[0], 1, "unsafe shutdowns");
}

#[test]
fn power_loss_without_a_volatile_cache_is_refused_with_the_reason() {
    let h = host();
    assert_eq!(
        h.ctrl.fault_add(FaultSpec::new(FaultKind::PowerLoss)),
        Err(crate::FaultError::NoVolatileCache)
    );
    assert!(!h.csts().cfs());
}
