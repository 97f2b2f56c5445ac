//! Reservations (Base 2.0 §8.19): Register, Acquire, Release and Report
//! with every status they answer, the conflicts of each reservation type
//! for reads and writes, a second host (another Host Identifier after a
//! reset), and keys persisted through a restart with PTPL.

mod abort;
mod hosts;
mod notices;
mod saved;

use std::path::PathBuf;

use vnvme_spec::reservation::{RegisteredController, RegisteredControllerExt, ReservationStatus};

use super::*;
use crate::memory::GuestAddress;

const BUF: u64 = DATA + 0x40000;
const IO: u64 = DATA + 0x80000;
const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr(true);
const INVALID: Status = Status::INVALID_FIELD.with_dnr(true);
const KEY_A: u64 = 0xAAAA;
const KEY_B: u64 = 0xBBBB;

/// Host Identifier of host `n` (8 bytes).
fn id(n: u8) -> [u8; 8] {
    [n; 8]
}

fn resv(op: NvmOpcode, cdw10: u32, data: &[u8], h: &mut Host) -> Status {
    h.mem.write(GuestAddress(BUF), data).unwrap();
    let mut c = cmd(op.0);
    c.nsid = U32::new(1);
    c.prp1 = U64::new(BUF);
    c.cdw10 = U32::new(cdw10);
    h.submit(1, c).status()
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    [a.to_le_bytes(), b.to_le_bytes()].concat()
}

impl Host {
    /// Enabled with an I/O queue pair, as host `n` (8-byte identifier).
    fn as_host(config: ControllerConfig, file: Option<PathBuf>, n: u8) -> Self {
        let mut h = Self::new();
        let mut ns = NamespaceConfig::new(1, 512, h.backend.clone());
        ns.reservation_file = file;
        h.ctrl = Controller::new(config, vec![ns]).unwrap();
        h.ctrl.attach(h.mem.clone(), h.irq.clone());
        h.enable();
        h.become_host(n, false);
        h
    }

    /// Sets the Host Identifier (first after a reset: it is set once) and
    /// creates I/O queue pair 1.
    fn become_host(&mut self, n: u8, extended: bool) {
        let len = if extended { 16 } else { 8 };
        self.mem.write(GuestAddress(BUF), &[n; 16][..len]).unwrap();
        let mut c = set_features(0x81, u32::from(extended));
        c.prp1 = U64::new(BUF);
        assert_eq!(self.admin(c).status(), Status::SUCCESS, "host id");
        self.create_pair(1, 16);
    }

    /// Another host: a controller reset, then its identifier.
    fn switch_to(&mut self, n: u8, extended: bool) {
        self.reenable();
        self.become_host(n, extended);
    }

    /// Reservation Register: RREGA, IEKEY, CPTPL.
    fn register(&mut self, rrega: u32, iekey: bool, cptpl: u32, crkey: u64, nrkey: u64) -> Status {
        let cdw10 = rrega | u32::from(iekey) << 3 | cptpl << 30;
        resv(
            NvmOpcode::RESERVATION_REGISTER,
            cdw10,
            &keys(crkey, nrkey),
            self,
        )
    }

    fn acquire(&mut self, racqa: u32, rtype: u8, crkey: u64, prkey: u64) -> Status {
        let cdw10 = racqa | u32::from(rtype) << 8;
        resv(
            NvmOpcode::RESERVATION_ACQUIRE,
            cdw10,
            &keys(crkey, prkey),
            self,
        )
    }

    fn release(&mut self, rrela: u32, iekey: bool, rtype: u8, crkey: u64) -> Status {
        let cdw10 = rrela | u32::from(iekey) << 3 | u32::from(rtype) << 8;
        resv(
            NvmOpcode::RESERVATION_RELEASE,
            cdw10,
            &crkey.to_le_bytes(),
            self,
        )
    }

    /// Reservation Report of `dwords` dwords into a buffer of FFh.
    fn reservation_report(&mut self, eds: bool, dwords: u32) -> (Status, Vec<u8>) {
        self.mem.write(GuestAddress(BUF), &[0xFF; 4096]).unwrap();
        let mut c = cmd(NvmOpcode::RESERVATION_REPORT.0);
        c.nsid = U32::new(1);
        c.prp1 = U64::new(BUF);
        c.cdw10 = U32::new(dwords - 1);
        c.cdw11 = U32::new(u32::from(eds));
        let status = self.submit(1, c).status();
        (status, self.read_mem(BUF, 4096))
    }

    /// The report's header and its 24-byte registrant entries.
    fn status_of(&mut self) -> (ReservationStatus, Vec<RegisteredController>) {
        let (status, page) = self.reservation_report(false, 1024);
        assert_eq!(status, Status::SUCCESS, "report");
        let (head, rest) = ReservationStatus::read_from_prefix(&page).unwrap();
        let n = usize::from(head.regctl.get());
        let entries = (0..n)
            .map(|i| RegisteredController::read_from_bytes(&rest[i * 24..(i + 1) * 24]).unwrap())
            .collect();
        (head, entries)
    }

    fn io(&mut self, op: NvmOpcode) -> Status {
        self.submit(1, rw(op, 1, 0, 1, IO, 0)).status()
    }

    /// Flush with NSID FFFFFFFFh (every attached namespace).
    fn flush_all(&mut self) -> Status {
        let mut c = cmd(NvmOpcode::FLUSH.0);
        c.nsid = U32::new(u32::MAX);
        self.submit(1, c).status()
    }
}

fn host(n: u8) -> Host {
    Host::as_host(config(), None, n)
}

#[test]
fn identify_reports_reservations_and_their_capabilities() {
    let mut h = host(1);
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_ne!(id.oncs.get() & (1 << 5), 0, "ONCS bit 5");
    assert_eq!(h.admin(identify(0, 1, DATA)).status(), Status::SUCCESS);
    let ns = IdentifyNamespace::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(ns.rescap, 0xFE, "types 1h-6h and IEKEY, no PTPLS on RAM");
    assert_eq!(ns.nmic, 0, "one controller");
}

#[test]
fn register_replace_unregister_and_their_statuses() {
    let mut h = host(1);
    assert_eq!(
        h.register(1, false, 0, KEY_A, 0),
        CONFLICT,
        "unregister, not registered"
    );
    assert_eq!(
        h.register(2, false, 0, KEY_A, KEY_B),
        CONFLICT,
        "replace, not registered"
    );
    assert_eq!(h.register(0, false, 0, 0, 0), INVALID, "key 0h");
    assert_eq!(h.register(3, false, 0, 0, KEY_A), INVALID, "RREGA 3");
    assert_eq!(h.register(0, false, 1, 0, KEY_A), INVALID, "CPTPL 01b");
    assert_eq!(
        h.register(0, false, 3, 0, KEY_A),
        INVALID,
        "PTPL without PTPLS"
    );
    assert_eq!(
        h.status_of().0.regctl.get(),
        0,
        "nothing registered by refused commands"
    );
    assert_eq!(h.register(0, false, 0, 0, KEY_A), Status::SUCCESS);
    assert_eq!(
        h.register(0, false, 0, 0, KEY_A),
        Status::SUCCESS,
        "same key again"
    );
    assert_eq!(h.register(0, false, 0, 0, KEY_B), CONFLICT, "another key");
    let (head, regs) = h.status_of();
    assert_eq!((head.gen.get(), head.regctl.get()), (1, 1));
    assert_eq!(
        (regs[0].cntlid.get(), regs[0].hostid, regs[0].rkey.get()),
        (1, id(1), KEY_A)
    );
    assert_eq!(
        h.register(2, false, 0, KEY_B, 0x77),
        CONFLICT,
        "replace, wrong key"
    );
    assert_eq!(
        h.register(2, false, 0, KEY_A, 0),
        INVALID,
        "replace with 0h"
    );
    assert_eq!(h.register(2, false, 0, KEY_A, KEY_B), Status::SUCCESS);
    assert_eq!(
        h.register(2, true, 0, 0x1234, 0x77),
        Status::SUCCESS,
        "IEKEY"
    );
    assert_eq!(h.status_of().1[0].rkey.get(), 0x77);
    assert_eq!(
        h.register(1, false, 0, KEY_B, 0),
        CONFLICT,
        "unregister, wrong key"
    );
    assert_eq!(
        h.register(1, true, 0, 0, 0),
        Status::SUCCESS,
        "unregister, IEKEY"
    );
    let (head, _) = h.status_of();
    assert_eq!((head.gen.get(), head.regctl.get()), (4, 0));
}

#[test]
fn acquire_statuses_and_types() {
    let mut h = host(1);
    assert_eq!(h.acquire(0, 1, KEY_A, 0), CONFLICT, "not a registrant");
    h.register(0, false, 0, 0, KEY_A);
    assert_eq!(h.acquire(0, 1, KEY_B, 0), CONFLICT, "wrong key");
    assert_eq!(h.acquire(0, 0, KEY_A, 0), INVALID, "type 0h");
    assert_eq!(h.acquire(0, 7, KEY_A, 0), INVALID, "type 7h");
    assert_eq!(h.acquire(3, 1, KEY_A, 0), INVALID, "RACQA 3");
    assert_eq!(h.acquire(0, 2, KEY_A, 0), Status::SUCCESS);
    assert_eq!(
        h.acquire(0, 2, KEY_A, 0),
        Status::SUCCESS,
        "again, same type"
    );
    assert_eq!(h.acquire(0, 1, KEY_A, 0), CONFLICT, "another type");
    let (head, regs) = h.status_of();
    assert_eq!((head.rtype, regs[0].rcsts), (2, 1));
    assert_eq!(head.gen.get(), 1, "acquire does not count");
}

/// What each reservation type lets a host that does not hold it do
/// (Base 2.0 §8.19.1, Table 'Command Behavior in the Presence of a
/// Reservation'): (type, registrant read, registrant write, other read,
/// other write).
const TYPE_TABLE: [(u8, bool, bool, bool, bool); 6] = [
    (1, true, false, true, false),
    (2, false, false, false, false),
    (3, true, true, true, false),
    (4, true, true, false, false),
    (5, true, true, true, false),
    (6, true, true, false, false),
];

/// For each type: a registrant and a non-registrant that do not hold it,
/// reading and writing; the holder always may.
#[test]
fn each_reservation_type_answers_reads_and_writes_as_the_spec_table() {
    let ok = |allowed: bool| if allowed { Status::SUCCESS } else { CONFLICT };
    for (rtype, reg_read, reg_write, read, write) in TYPE_TABLE {
        let mut h = host(1);
        h.register(0, false, 0, 0, KEY_A);
        assert_eq!(h.acquire(0, rtype, KEY_A, 0), Status::SUCCESS);
        assert_eq!(
            h.io(NvmOpcode::WRITE),
            Status::SUCCESS,
            "holder writes, type {rtype}"
        );
        assert_eq!(
            h.io(NvmOpcode::READ),
            Status::SUCCESS,
            "holder reads, type {rtype}"
        );
        h.switch_to(2, false);
        assert_eq!(h.io(NvmOpcode::READ), ok(read), "other reads, type {rtype}");
        assert_eq!(
            h.io(NvmOpcode::COMPARE).same_code(CONFLICT),
            !read,
            "compare, type {rtype}"
        );
        assert_eq!(
            h.io(NvmOpcode::WRITE),
            ok(write),
            "other writes, type {rtype}"
        );
        assert_eq!(
            h.io(NvmOpcode::FLUSH),
            ok(write),
            "other flushes, type {rtype}"
        );
        assert_eq!(
            h.io(NvmOpcode::WRITE_ZEROES),
            ok(write),
            "write zeroes, type {rtype}"
        );
        h.register(0, false, 0, 0, KEY_B);
        assert_eq!(
            h.io(NvmOpcode::READ),
            ok(reg_read),
            "registrant reads, type {rtype}"
        );
        assert_eq!(
            h.io(NvmOpcode::WRITE),
            ok(reg_write),
            "registrant writes, type {rtype}"
        );
    }
}

#[test]
fn second_host_sees_the_first_as_not_associated_and_is_in_conflict() {
    let mut h = host(1);
    h.register(0, false, 0, 0, KEY_A);
    h.acquire(0, 1, KEY_A, 0);
    h.switch_to(2, false);
    assert_eq!(h.io(NvmOpcode::WRITE), CONFLICT);
    assert_eq!(h.acquire(0, 1, KEY_B, 0), CONFLICT, "not registered");
    h.register(0, false, 0, 0, KEY_B);
    assert_eq!(h.acquire(0, 1, KEY_B, 0), CONFLICT, "held by host 1");
    assert_eq!(
        h.release(0, false, 1, KEY_B),
        Status::SUCCESS,
        "not the holder: no effect"
    );
    let (head, regs) = h.status_of();
    assert_eq!((head.rtype, head.regctl.get()), (1, 2));
    assert_eq!(
        (regs[0].cntlid.get(), regs[0].hostid, regs[0].rcsts),
        (0xFFFF, id(1), 1)
    );
    assert_eq!(
        (regs[1].cntlid.get(), regs[1].hostid, regs[1].rcsts),
        (1, id(2), 0)
    );
}

#[test]
fn release_and_clear() {
    let mut h = host(1);
    h.register(0, false, 0, 0, KEY_A);
    assert_eq!(
        h.release(0, false, 1, KEY_A),
        Status::SUCCESS,
        "nothing held"
    );
    h.acquire(0, 3, KEY_A, 0);
    assert_eq!(h.release(0, false, 3, KEY_B), CONFLICT, "wrong key");
    assert_eq!(h.release(0, false, 1, KEY_A), INVALID, "wrong type");
    assert_eq!(h.release(2, false, 3, KEY_A), INVALID, "RRELA 2");
    assert_eq!(h.release(0, false, 3, KEY_A), Status::SUCCESS);
    assert_eq!(h.status_of().0.rtype, 0);
    h.acquire(0, 3, KEY_A, 0);
    h.switch_to(2, false);
    assert_eq!(
        h.release(1, false, 0, KEY_B),
        CONFLICT,
        "clear from a non-registrant"
    );
    h.register(0, false, 0, 0, KEY_B);
    assert_eq!(h.release(1, true, 0, 0), Status::SUCCESS, "clear, IEKEY");
    let (head, _) = h.status_of();
    assert_eq!((head.rtype, head.regctl.get(), head.gen.get()), (0, 0, 3));
    assert_eq!(h.io(NvmOpcode::WRITE), Status::SUCCESS);
}

#[test]
fn unregistering_holder_releases_and_all_registrants_last_one_does() {
    let mut h = host(1);
    h.register(0, false, 0, 0, KEY_A);
    h.acquire(0, 4, KEY_A, 0);
    h.register(1, false, 0, KEY_A, 0);
    assert_eq!(h.status_of().0.rtype, 0, "holder left: released");
    h.register(0, false, 0, 0, KEY_A);
    h.acquire(0, 6, KEY_A, 0);
    h.switch_to(2, false);
    h.register(0, false, 0, 0, KEY_B);
    assert_eq!(
        h.acquire(0, 6, KEY_B, 0),
        Status::SUCCESS,
        "all registrants hold it"
    );
    assert_eq!(h.acquire(0, 5, KEY_B, 0), CONFLICT, "another type");
    h.register(1, false, 0, KEY_B, 0);
    let (head, regs) = h.status_of();
    assert_eq!(
        (head.rtype, regs[0].rcsts),
        (6, 1),
        "host 1 still registered"
    );
    h.switch_to(1, false);
    assert_eq!(h.release(0, false, 6, KEY_A), Status::SUCCESS);
    h.acquire(0, 6, KEY_A, 0);
    h.register(1, false, 0, KEY_A, 0);
    assert_eq!(h.status_of().0.rtype, 0, "last registrant left");
}

#[test]
fn preempt_moves_the_reservation_or_only_unregisters() {
    let mut h = host(1);
    h.register(0, false, 0, 0, KEY_A);
    h.acquire(0, 2, KEY_A, 0);
    h.switch_to(2, false);
    h.register(0, false, 0, 0, KEY_B);
    assert_eq!(
        h.acquire(1, 1, KEY_B, 0),
        INVALID,
        "PRKEY 0h, not all registrants"
    );
    assert_eq!(h.acquire(1, 1, KEY_B, 0x99), CONFLICT, "PRKEY nobody has");
    assert_eq!(h.acquire(1, 1, KEY_A, KEY_A), CONFLICT, "CRKEY is not ours");
    assert_eq!(h.io(NvmOpcode::READ), CONFLICT);
    assert_eq!(
        h.acquire(2, 1, KEY_B, KEY_A),
        Status::SUCCESS,
        "preempt and abort"
    );
    let (head, regs) = h.status_of();
    assert_eq!((head.rtype, head.regctl.get(), head.gen.get()), (1, 1, 3));
    assert_eq!((regs[0].hostid, regs[0].rcsts), (id(2), 1));
    assert_eq!(h.io(NvmOpcode::WRITE), Status::SUCCESS);
    // All Registrants: PRKEY 0h takes it and unregisters everyone else.
    h.switch_to(3, false);
    h.register(0, false, 0, 0, 0x33);
    h.switch_to(2, false);
    h.release(0, false, 1, KEY_B);
    h.acquire(0, 5, KEY_B, 0);
    h.switch_to(1, false);
    h.register(0, false, 0, 0, KEY_A);
    assert_eq!(
        h.acquire(1, 5, KEY_A, 0x33),
        Status::SUCCESS,
        "only unregisters host 3"
    );
    assert_eq!(h.status_of().0.regctl.get(), 2);
    assert_eq!(h.acquire(1, 4, KEY_A, 0), Status::SUCCESS);
    let (head, regs) = h.status_of();
    assert_eq!(
        (head.rtype, head.regctl.get(), regs[0].hostid),
        (4, 1, id(1))
    );
}

#[test]
fn report_through_an_sgl_fills_numd_dwords_zero_padded() {
    // Linux sends an SGL for a passthrough buffer in one huge page: its
    // length is NUMD dwords, longer than the structure.
    let mut h = host(1);
    h.register(0, false, 0, 0, KEY_A);
    h.mem.write(GuestAddress(BUF), &[0xFF; 4096]).unwrap();
    let mut c = cmd(NvmOpcode::RESERVATION_REPORT.0);
    c.nsid = U32::new(1);
    c.set_psdt(vnvme_spec::sgl::psdt::SGL_MPTR_CONTIGUOUS);
    c.set_sgl1(&vnvme_spec::sgl::Descriptor::data_block(BUF, 4096));
    c.cdw10 = U32::new(1024 - 1);
    assert_eq!(h.submit(1, c).status(), Status::SUCCESS);
    let page = h.read_mem(BUF, 4096);
    assert_eq!(page[5], 1, "REGCTL");
    assert!(
        page[48..].iter().all(|&b| b == 0),
        "past the structure: zeroes"
    );
    // More than MDTS: refused, as any transfer that large.
    c.cdw10 = U32::new(u32::MAX);
    assert_eq!(
        h.submit(1, c).status(),
        Status::INVALID_FIELD.with_dnr(true)
    );
}

#[test]
fn report_layouts_numd_and_host_id_format() {
    let mut h = host(1);
    h.register(0, false, 0, 0, KEY_A);
    let (status, page) = h.reservation_report(false, 6);
    assert_eq!(status, Status::SUCCESS);
    assert_eq!(page[24], 0xFF, "cut to NUMD: 24 bytes");
    assert_eq!(page[5], 1, "REGCTL");
    h.switch_to(2, true);
    h.register(0, false, 0, 0, KEY_B);
    let (status, _) = h.reservation_report(false, 1024);
    assert_eq!(status, Status::HOST_ID_INCONSISTENT_FORMAT.with_dnr(true));
    let (status, page) = h.reservation_report(true, 1024);
    assert_eq!(status, Status::SUCCESS);
    assert_eq!(&page[5..7], &[2, 0], "REGCTL");
    assert!(
        page[24..64].iter().all(|&b| b == 0),
        "extended header reserved"
    );
    let e0 = RegisteredControllerExt::read_from_bytes(&page[64..128]).unwrap();
    let e1 = RegisteredControllerExt::read_from_bytes(&page[128..192]).unwrap();
    assert_eq!((e0.cntlid.get(), e0.rkey.get()), (0xFFFF, KEY_A));
    assert_eq!(e0.hostid[..8], id(1));
    assert_eq!(e0.hostid[8..], [0; 8]);
    assert_eq!(
        (e1.cntlid.get(), e1.rkey.get(), e1.hostid),
        (1, KEY_B, [2; 16])
    );
}

fn temp_file(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("vnvme-resv-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

#[test]
fn ptpl_keeps_keys_and_reservation_through_a_restart() {
    let file = temp_file("ptpl");
    let mut h = Host::as_host(config(), Some(file.clone()), 1);
    assert_eq!(h.admin(identify(0, 1, DATA)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 32)[31] & 1, 1, "RESCAP.PTPLS");
    h.register(0, false, 0, 0, KEY_A);
    assert!(!file.exists(), "no file without PTPL");
    assert_eq!(
        h.register(2, false, 3, KEY_A, KEY_B),
        Status::SUCCESS,
        "replace, PTPL on"
    );
    h.acquire(0, 1, KEY_B, 0);
    let mut get = get_features(0x83, 0, BUF);
    get.nsid = U32::new(1);
    assert_eq!(h.admin(get).dw0.get(), 1, "Get Features 83h");
    drop(h);

    let mut h = Host::as_host(config(), Some(file.clone()), 2);
    let (head, regs) = h.status_of();
    assert_eq!((head.ptpls, head.rtype, head.gen.get()), (1, 1, 2));
    assert_eq!((regs[0].hostid, regs[0].rkey.get()), (id(1), KEY_B));
    assert_eq!(
        h.io(NvmOpcode::WRITE),
        CONFLICT,
        "the reservation came back"
    );
    h.switch_to(1, false);
    let mut set = set_features(0x83, 0);
    set.nsid = U32::new(1);
    assert_eq!(
        h.admin(set).status(),
        Status::SUCCESS,
        "Set Features 83h: PTPL off"
    );
    assert!(!file.exists(), "file removed with PTPL");
    drop(h);

    let mut h = Host::as_host(config(), Some(file.clone()), 1);
    assert_eq!(
        h.status_of().0.regctl.get(),
        0,
        "nothing persisted without PTPL"
    );
}

#[test]
fn ptpl_on_a_namespace_without_a_file_and_a_bad_file_are_refused() {
    let mut h = host(1);
    let mut set = set_features(0x83, 1);
    set.nsid = U32::new(1);
    assert_eq!(h.admin(set).status(), INVALID);
    let file = temp_file("bad");
    std::fs::write(&file, "vnvme-reservations 1\nregistrant 01 8 1\n").unwrap();
    let mut ns = NamespaceConfig::new(1, 512, Arc::new(RamDevice::new(1 << 20)));
    ns.reservation_file = Some(file.clone());
    let err = Controller::new(config(), vec![ns]).unwrap_err().to_string();
    assert!(err.contains("bad host id"), "{err}");
    std::fs::remove_file(file).unwrap();
}
