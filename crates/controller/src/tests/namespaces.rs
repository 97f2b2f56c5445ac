//! Namespace management and attachment, readiness, LBA formats and Format
//! NVM, the changed-namespace log and its event, queue/vector limits.

use super::*;
use crate::config::{Readiness, LBA_FORMATS};
use crate::memory::GuestAddress;

const CNTLID: u16 = 1;
/// Identify and log pages land here; command data buffers further on.
const PAGE: u64 = DATA + 0x40000;
const BUF: u64 = DATA + 0x50000;

impl Host {
    /// A host over `namespaces` (the `backend` field is a dummy).
    pub(super) fn with_namespaces(
        config: ControllerConfig,
        namespaces: Vec<NamespaceConfig>,
    ) -> Self {
        let ctrl = Controller::new(config, namespaces).unwrap();
        let mem = Arc::new(VecMemory::new(MEM_SIZE));
        let irq = Arc::new(CountingIrq::default());
        ctrl.attach(mem.clone(), irq.clone());
        Self {
            ctrl,
            mem,
            irq,
            backend: Arc::new(RamDevice::new(4096)),
            rings: vec![None; 16],
            cid: 0,
            dbbuf: None,
            spdk: false,
        }
    }

    pub(super) fn identify_page(&mut self, cns: u8, nsid: u32) -> Vec<u8> {
        let c = self.admin(identify(cns, nsid, PAGE));
        assert_eq!(
            c.status(),
            Status::SUCCESS,
            "identify cns {cns:#x} nsid {nsid}"
        );
        self.read_mem(PAGE, 4096)
    }

    pub(super) fn identify_ns(&mut self, cns: u8, nsid: u32) -> IdentifyNamespace {
        IdentifyNamespace::read_from_bytes(&self.identify_page(cns, nsid)).unwrap()
    }

    /// NSIDs in an Identify namespace list (CNS 02h or 10h).
    fn ns_list(&mut self, cns: u8) -> Vec<u32> {
        self.identify_page(cns, 0)
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .take_while(|&id| id != 0)
            .collect()
    }

    pub(super) fn create_ns(&mut self, nsze: u64, ncap: u64, flbas: u8) -> Completion {
        let mut data = vec![0u8; 4096];
        data[..8].copy_from_slice(&nsze.to_le_bytes());
        data[8..16].copy_from_slice(&ncap.to_le_bytes());
        data[26] = flbas;
        self.mem.write(GuestAddress(BUF), &data).unwrap();
        let mut c = cmd(AdminOpcode::NAMESPACE_MANAGEMENT.0);
        c.prp1 = U64::new(BUF);
        self.admin(c)
    }

    pub(super) fn delete_ns(&mut self, nsid: u32) -> Completion {
        let mut c = cmd(AdminOpcode::NAMESPACE_MANAGEMENT.0);
        c.nsid = U32::new(nsid);
        c.cdw10 = U32::new(1);
        self.admin(c)
    }

    fn attach_cmd(&mut self, nsid: u32, attach: bool, list: &[u16]) -> Command {
        let mut data: Vec<u8> = list.iter().flat_map(|v| v.to_le_bytes()).collect();
        data.resize(4096, 0);
        self.mem.write(GuestAddress(BUF), &data).unwrap();
        let mut c = cmd(AdminOpcode::NAMESPACE_ATTACHMENT.0);
        c.nsid = U32::new(nsid);
        c.prp1 = U64::new(BUF);
        c.cdw10 = U32::new(u32::from(!attach));
        c
    }

    pub(super) fn attach(&mut self, nsid: u32, attach: bool) -> Completion {
        let c = self.attach_cmd(nsid, attach, &[1, CNTLID]);
        self.admin(c)
    }

    pub(super) fn format(&mut self, nsid: u32, cdw10: u32) -> Completion {
        let mut c = cmd(AdminOpcode::FORMAT_NVM.0);
        c.nsid = U32::new(nsid);
        c.cdw10 = U32::new(cdw10);
        self.admin(c)
    }

    fn read1(&mut self, nsid: u32) -> Status {
        self.submit(1, rw(NvmOpcode::READ, nsid, 0, 1, BUF, 0))
            .status()
    }

    /// Enables Namespace Attribute Notices and posts one AER.
    fn arm_notices(&mut self) -> u16 {
        let c = self.admin(set_features(0x0B, 1 << 8));
        assert_eq!(c.status(), Status::SUCCESS);
        let cid = self.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
        self.ring_sq(0);
        cid
    }

    fn changed_log(&mut self, rae: bool) -> Vec<u32> {
        let mut c = get_log(0x04, 1024, 0, PAGE);
        if rae {
            c.cdw10 = U32::new(c.cdw10.get() | 1 << 15);
        }
        assert_eq!(self.admin(c).status(), Status::SUCCESS);
        self.read_mem(PAGE, 4096)
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .take_while(|&id| id != 0)
            .collect()
    }
}

/// The Namespace Attribute Changed notice as an AER completes with it.
const NS_CHANGED_EVENT: u32 = 0x0004_0002;

pub(super) fn ram_ns(nsid: u32, bytes: u64) -> NamespaceConfig {
    NamespaceConfig::new(nsid, 4096, Arc::new(RamDevice::new(bytes)))
}

pub(super) fn mgmt_config(capacity: u64) -> ControllerConfig {
    ControllerConfig {
        nvm_capacity: capacity,
        max_namespaces: 4,
        ..config()
    }
}

fn u128_at(b: &[u8], at: usize) -> u128 {
    u128::from_le_bytes(b[at..at + 16].try_into().unwrap())
}

#[test]
fn identify_controller_reports_ns_management_format_and_capacity() {
    let mut h = Host::with_namespaces(mgmt_config(4 << 20), vec![ram_ns(1, 1 << 20)]);
    h.enable();
    let id = h.identify_page(0x01, 0);
    let c = IdentifyController::read_from_bytes(&id).unwrap();
    assert_eq!(
        c.oacs.get() & 0b1010,
        0b1010,
        "OACS Format NVM and NS Management"
    );
    assert_eq!(c.nn.get(), 4);
    assert_eq!(u128_at(&id, 280), 4 << 20, "TNVMCAP");
    assert_eq!(u128_at(&id, 296), 3 << 20, "UNVMCAP");
}

#[test]
fn create_attach_io_detach_delete() {
    let mut h = Host::with_namespaces(mgmt_config(4 << 20), vec![ram_ns(1, 1 << 20)]);
    h.enable();
    h.create_pair(1, 16);
    // 256 blocks of 512 bytes (format 0).
    let c = h.create_ns(256, 256, 0);
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(c.dw0.get(), 2, "lowest free NSID");
    assert_eq!(h.ns_list(0x10), [1, 2], "allocated");
    assert_eq!(h.ns_list(0x02), [1], "active");
    // Allocated but not attached: inactive.
    assert_eq!(h.identify_page(0x00, 2), vec![0; 4096], "CNS 00h zeroes");
    assert_eq!(h.identify_page(0x08, 2), vec![0; 4096], "CNS 08h zeroes");
    let id = h.identify_ns(0x11, 2);
    assert_eq!(
        (id.nsze.get(), id.ncap.get(), id.format_index()),
        (256, 256, 0)
    );
    assert_eq!(
        h.identify_page(0x12, 2)[..2],
        [0, 0],
        "no controller attached"
    );
    assert_eq!(
        h.identify_page(0x13, 0)[..4],
        [1, 0, 1, 0],
        "the subsystem's controller"
    );
    assert_eq!(
        h.read1(2),
        Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
    );

    assert_eq!(h.attach(2, true).status(), Status::SUCCESS);
    assert_eq!(h.ns_list(0x02), [1, 2]);
    assert_eq!(h.identify_page(0x12, 2)[..4], [1, 0, 1, 0]);
    assert_eq!(h.identify_ns(0x00, 2).nsze.get(), 256);
    assert_eq!(h.read1(2), Status::SUCCESS);
    assert_eq!(
        h.attach(2, true).status(),
        Status::NAMESPACE_ALREADY_ATTACHED.with_dnr(true)
    );

    assert_eq!(h.attach(2, false).status(), Status::SUCCESS);
    assert_eq!(
        h.read1(2),
        Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
    );
    assert_eq!(
        h.attach(2, false).status(),
        Status::NAMESPACE_NOT_ATTACHED.with_dnr(true)
    );
    assert_eq!(h.delete_ns(2).status(), Status::SUCCESS);
    assert_eq!(
        h.delete_ns(2).status(),
        Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
    );
    assert_eq!(h.ns_list(0x10), [1]);
    assert_eq!(
        u128_at(&h.identify_page(0x01, 0), 296),
        3 << 20,
        "capacity back"
    );
}

#[test]
fn namespace_management_errors() {
    let mut h = Host::with_namespaces(mgmt_config(2 << 20), vec![ram_ns(1, 1 << 20)]);
    h.enable();
    let cmd_specific = |s: Status| s.with_dnr(true);
    // 1 MiB free: 2049 blocks of 512 do not fit.
    assert_eq!(
        h.create_ns(2049, 2049, 0).status(),
        cmd_specific(Status::NAMESPACE_INSUFFICIENT_CAPACITY)
    );
    // 520-byte blocks count their metadata: 2048 * 520 > 1 MiB.
    assert_eq!(
        h.create_ns(2048, 2048, 1).status(),
        cmd_specific(Status::NAMESPACE_INSUFFICIENT_CAPACITY)
    );
    assert_eq!(
        h.create_ns(8, 8, LBA_FORMATS.len() as u8).status(),
        cmd_specific(Status::INVALID_FORMAT)
    );
    assert_eq!(
        h.create_ns(8, 4, 0).status(),
        Status::INVALID_FIELD.with_dnr(true),
        "thin"
    );
    assert_eq!(
        h.create_ns(0, 0, 0).status(),
        Status::INVALID_FIELD.with_dnr(true)
    );
    // max_namespaces = 4: NSIDs 2, 3, 4, then none.
    for nsid in 2..=4 {
        let c = h.create_ns(8, 8, 0);
        assert_eq!((c.status(), c.dw0.get()), (Status::SUCCESS, nsid));
    }
    assert_eq!(
        h.create_ns(8, 8, 0).status(),
        cmd_specific(Status::NAMESPACE_ID_UNAVAILABLE)
    );
    // Controller lists: empty, another controller, ours twice.
    for list in [&[0u16][..], &[1, 7], &[2, CNTLID, CNTLID]] {
        let c = h.attach_cmd(2, true, list);
        assert_eq!(
            h.admin(c).status(),
            cmd_specific(Status::CONTROLLER_LIST_INVALID),
            "{list:?}"
        );
    }
    // Unallocated, NSID 0, broadcast.
    assert_eq!(h.delete_ns(3).status(), Status::SUCCESS);
    for nsid in [3, 0, 0xFFFF_FFFF] {
        assert_eq!(
            h.attach(nsid, true).status(),
            Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true),
            "attach {nsid:#x}"
        );
    }
    // Bad SEL values.
    let mut c = cmd(AdminOpcode::NAMESPACE_MANAGEMENT.0);
    c.cdw10 = U32::new(2);
    assert_eq!(h.admin(c).status(), Status::INVALID_FIELD.with_dnr(true));
    let mut c = h.attach_cmd(2, true, &[1, CNTLID]);
    c.cdw10 = U32::new(3);
    assert_eq!(h.admin(c).status(), Status::INVALID_FIELD.with_dnr(true));
    // Delete everything.
    assert_eq!(h.delete_ns(0xFFFF_FFFF).status(), Status::SUCCESS);
    assert_eq!(h.ns_list(0x10), Vec::<u32>::new());
}

#[test]
fn attach_raises_namespace_changed_event_and_log_clears_on_read() {
    let mut h = Host::with_namespaces(mgmt_config(2 << 20), vec![ram_ns(1, 1 << 20)]);
    h.enable();
    let aer = h.arm_notices();
    assert_eq!(h.create_ns(16, 16, 3).dw0.get(), 2);
    let c = h.attach_cmd(2, true, &[1, CNTLID]);
    let (c, mut others) = h.admin_collect(c);
    assert_eq!(c.status(), Status::SUCCESS);
    if others.is_empty() {
        others.push(h.reap(0));
    }
    assert_eq!(others[0].cid(), aer);
    assert_eq!(others[0].dw0.get(), NS_CHANGED_EVENT);
    // RAE keeps the list (and the event masked); a plain read clears it.
    assert_eq!(h.changed_log(true), [2]);
    assert_eq!(h.changed_log(false), [2]);
    assert_eq!(h.changed_log(false), Vec::<u32>::new());
    // Detach is a change too; with no AER outstanding the event waits.
    assert_eq!(h.attach(2, false).status(), Status::SUCCESS);
    let (_, others) = h.admin_collect(cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    assert!(others.is_empty());
    assert_eq!(h.changed_log(false), [2]);
}

#[test]
fn changed_namespace_list_overflows_to_all_ones() {
    let mut list = crate::subsystem::ChangedNamespaces::default();
    for id in 1..=1025 {
        list.add(id);
    }
    let page = list.page();
    assert_eq!(page[..8], [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0]);
    list.acknowledge(&page);
    list.add(9);
    assert_eq!(list.page()[..8], [9, 0, 0, 0, 0, 0, 0, 0]);
}

/// Submits a read to `nsid` until it stops failing with `busy`, at most
/// 5 s; returns the last status and how many attempts saw `busy`.
fn retry_while(h: &mut Host, nsid: u32, busy: Status) -> (Status, u32) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut tries = 0;
    loop {
        let s = h.read1(nsid);
        if !s.same_code(busy) || Instant::now() > deadline {
            return (s, tries);
        }
        tries += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn slow_namespace_is_not_ready_then_ready_with_event() {
    let slow = ram_ns(2, 1 << 20).with_readiness(Readiness::After(Duration::from_millis(250)));
    let mut h = Host::with_namespaces(config(), vec![ram_ns(1, 1 << 20), slow]);
    h.enable_independent_of_media();
    let aer = h.arm_notices();
    h.create_pair(1, 16);
    assert_eq!(h.identify_page(0x08, 2)[14] & 1, 0, "NSTAT: not ready");
    assert_eq!(h.identify_page(0x08, 1)[14] & 1, 1, "NSTAT: ready");
    // Identify works on a namespace that is not ready.
    assert_eq!(h.identify_ns(0x00, 2).nsze.get(), 256);
    assert_eq!(h.read1(1), Status::SUCCESS);
    let first = h.read1(2);
    assert_eq!(first, Status::NAMESPACE_NOT_READY.with_dnr(false));
    assert_eq!(first.sct(), 0);
    let (status, _) = retry_while(&mut h, 2, Status::NAMESPACE_NOT_READY);
    assert_eq!(status, Status::SUCCESS);
    // The event completes the AER about when the namespace turns ready.
    let (c, mut others) = h.admin_collect(identify(0x08, 2, PAGE));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.read_mem(PAGE, 16)[14] & 1, 1, "NSTAT: ready");
    if others.is_empty() {
        others.push(h.reap(0));
    }
    assert_eq!(
        (others[0].cid(), others[0].dw0.get()),
        (aer, NS_CHANGED_EVENT)
    );
    assert_eq!(h.changed_log(false), [2]);
}

#[test]
fn ready_with_media_holds_rdy_until_the_slowest_namespace_is_ready() {
    let slow = |nsid, ms| {
        ram_ns(nsid, 1 << 20).with_readiness(Readiness::After(Duration::from_millis(ms)))
    };
    let never = ram_ns(4, 1 << 20).with_readiness(Readiness::Never);
    let namespaces = vec![ram_ns(1, 1 << 20), slow(2, 150), slow(3, 300), never];
    let mut h = Host::with_namespaces(config(), namespaces);
    let enabled = Instant::now();
    h.enable_with(CC_ENABLE, ASQ, (31 << 16) | 31);
    let mut polls = 0;
    while !h.csts().rdy() {
        assert!(
            enabled.elapsed() < Duration::from_secs(5),
            "CSTS.RDY never set"
        );
        polls += 1;
        std::thread::sleep(Duration::from_millis(5));
    }
    let waited = enabled.elapsed();
    assert!(
        polls > 0 && waited >= Duration::from_millis(300),
        "RDY after {waited:?}"
    );
    assert!(!h.csts().cfs());
    // Every namespace that becomes ready is ready now: nothing to announce.
    h.arm_notices();
    h.create_pair(1, 16);
    for nsid in 1..=3 {
        assert_eq!(h.identify_page(0x08, nsid)[14] & 1, 1, "NSTAT {nsid}");
        assert_eq!(h.read1(nsid), Status::SUCCESS);
    }
    assert_eq!(h.identify_page(0x08, 4)[14] & 1, 0, "never ready");
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        h.peek_cqe(0).is_none(),
        "no namespace event completed the AER"
    );
}

#[test]
fn never_ready_namespace_sets_dnr_after_ready_timeout() {
    let config = ControllerConfig {
        // Long enough for the first reads after enable on a loaded machine.
        ready_timeout: Duration::from_millis(1200),
        ..config()
    };
    let never = ram_ns(1, 1 << 20).with_readiness(Readiness::Never);
    let mut h = Host::with_namespaces(config, vec![never]);
    h.enable();
    // CRTO.CRWMT is in 500 ms units, rounded up.
    assert_eq!(h.read32(offset::CRTO) & 0xFFFF, 3);
    h.create_pair(1, 16);
    assert_eq!(h.read1(1), Status::NAMESPACE_NOT_READY.with_dnr(false));
    let deadline = Instant::now() + Duration::from_secs(5);
    let last = loop {
        let s = h.read1(1);
        if s.dnr() || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(last, Status::NAMESPACE_NOT_READY.with_dnr(true));
    assert_eq!(h.identify_page(0x08, 1)[14] & 1, 0);
    // A reset and enable starts the clock again.
    h.write32(offset::CC, 0);
    h.mem.zero(GuestAddress(ACQ), 4096).unwrap();
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.read1(1), Status::NAMESPACE_NOT_READY.with_dnr(false));
}

#[test]
fn ready_timeout_covers_the_slowest_namespace() {
    let slow = ram_ns(1, 1 << 20).with_readiness(Readiness::After(Duration::from_secs(7)));
    let h = Host::with_namespaces(config(), vec![slow]);
    // 7 s and a margin of 2 s.
    assert_eq!(h.read32(offset::CRTO), 18 | (18 << 16), "CRWMT/CRIMT 9 s");
    let cap = Cap::from(h.read64(offset::CAP));
    assert_eq!(cap.to(), 18);
    assert!(cap.crwms() && cap.crims());
    let h = Host::with_namespaces(config(), vec![ram_ns(1, 1 << 20)]);
    assert_eq!(h.read32(offset::CRTO) & 0xFFFF, 10, "default 5 s");
}

#[test]
fn detached_namespace_from_config_is_inactive_until_attached() {
    let detached = ram_ns(2, 1 << 20).with_attached(false);
    let mut h = Host::with_namespaces(config(), vec![ram_ns(1, 1 << 20), detached]);
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.ns_list(0x02), [1]);
    assert_eq!(h.ns_list(0x10), [1, 2]);
    assert_eq!(h.identify_page(0x00, 2), vec![0; 4096]);
    assert_eq!(
        h.read1(2),
        Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
    );
    assert_eq!(h.attach(2, true).status(), Status::SUCCESS);
    assert_eq!(h.read1(2), Status::SUCCESS);
}

#[test]
fn identify_namespace_lists_every_lba_format() {
    let mut h = Host::with_namespaces(config(), vec![ram_ns(1, 1 << 20)]);
    h.enable();
    let id = h.identify_ns(0x00, 1);
    assert_eq!(usize::from(id.nlbaf_z) + 1, LBA_FORMATS.len());
    assert_eq!(id.format_index(), 3, "4096 + 0 by default");
    assert_eq!(id.mc, 0b11, "extended and separate metadata");
    for (lbaf, f) in id.lbaf.iter().zip(LBA_FORMATS) {
        assert_eq!(1u32 << lbaf.lbads, f.data_size);
        assert_eq!(lbaf.ms.get(), f.metadata_size);
    }
    assert_eq!(id.nsze.get(), 256);
}

#[test]
fn format_nvm_switches_format_and_erases() {
    let mut h = Host::with_namespaces(config(), vec![ram_ns(1, 1 << 20)]);
    h.enable();
    h.create_pair(1, 16);
    h.mem.write(GuestAddress(BUF), &[0xAB; 4096]).unwrap();
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE, 1, 0, 1, BUF, 0))
        .status()
        .is_success());
    // Format 0: 512 + 0, user data erase.
    assert_eq!(h.format(1, 1 << 9).status(), Status::SUCCESS);
    let id = h.identify_ns(0x00, 1);
    assert_eq!((id.format_index(), id.nsze.get()), (0, 2048));
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 8, BUF, 0))
        .status()
        .is_success());
    assert_eq!(h.read_mem(BUF, 4096), vec![0; 4096], "erased");
    // Errors: unknown format, protection information, crypto erase, NSID.
    let invalid_format = Status::INVALID_FORMAT.with_dnr(true);
    assert_eq!(
        h.format(1, LBA_FORMATS.len() as u32).status(),
        invalid_format
    );
    assert_eq!(h.format(1, 1 << 5).status(), invalid_format, "PI");
    assert_eq!(
        h.format(1, 2 << 9).status(),
        Status::INVALID_FIELD.with_dnr(true)
    );
    assert_eq!(
        h.format(5, 0).status(),
        Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
    );
    // Broadcast formats every active namespace.
    assert_eq!(h.format(0xFFFF_FFFF, 3).status(), Status::SUCCESS);
    assert_eq!(h.identify_ns(0x00, 1).format_index(), 3);
}

#[test]
fn io_during_format_gets_format_in_progress() {
    let config = ControllerConfig {
        format_duration: Duration::from_millis(200),
        ..config()
    };
    let mut h = Host::with_namespaces(config, vec![ram_ns(1, 1 << 20)]);
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.format(1, 0).status(), Status::SUCCESS);
    assert_eq!(h.read1(1), Status::FORMAT_IN_PROGRESS.with_dnr(false));
    let (status, tries) = retry_while(&mut h, 1, Status::FORMAT_IN_PROGRESS);
    assert_eq!(status, Status::SUCCESS);
    assert!(tries > 0);
}

#[test]
fn extended_metadata_io_moves_data_and_metadata_together() {
    // 4096 + 64, extended: one block is 4160 bytes, crossing a page, so
    // PRP2 carries the tail; two blocks need a PRP list.
    let ns = ram_ns(1, 1 << 20).with_format(5);
    let mut h = Host::with_namespaces(config(), vec![ns]);
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(
        h.format(1, 5 | 1 << 4).status(),
        Status::SUCCESS,
        "MSET extended"
    );
    let id = h.identify_ns(0x00, 1);
    assert!(id.extended_lba());
    assert_eq!(id.nsze.get(), (1 << 20) / 4160);
    let data: Vec<u8> = (0..2 * 4160u32).map(|i| (i % 253) as u8).collect();
    let (p1, p2, p3, list) = (BUF, BUF + 0x3000, BUF + 0x6000, BUF + 0x9000);
    h.mem.write(GuestAddress(p1), &data[..4096]).unwrap();
    h.mem.write(GuestAddress(p2), &data[4096..8192]).unwrap();
    h.mem.write(GuestAddress(p3), &data[8192..]).unwrap();
    let entries: Vec<u8> = [p2, p3].iter().flat_map(|p| p.to_le_bytes()).collect();
    h.mem.write(GuestAddress(list), &entries).unwrap();
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE, 1, 3, 2, p1, list))
        .status()
        .is_success());
    // Read one block back (4160 bytes: PRP1 + PRP2 as a page).
    let (r1, r2) = (BUF + 0x10000, BUF + 0x20000);
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 4, 1, r1, r2))
        .status()
        .is_success());
    let mut back = h.read_mem(r1, 4096);
    back.extend(h.read_mem(r2, 64));
    assert_eq!(back, data[4160..]);
    assert!(h
        .submit(1, rw(NvmOpcode::COMPARE, 1, 3, 2, p1, list))
        .status()
        .is_success());
    // Out of range counts blocks of 4160 bytes.
    let last = id.nsze.get();
    assert_eq!(
        h.submit(1, rw(NvmOpcode::READ, 1, last, 1, r1, r2))
            .status(),
        Status::LBA_OUT_OF_RANGE.with_dnr(true)
    );
}

#[test]
fn separate_metadata_io_uses_mptr() {
    let ns = ram_ns(1, 1 << 20).with_format(1);
    let mut h = Host::with_namespaces(config(), vec![ns]);
    h.enable();
    h.create_pair(1, 16);
    let id = h.identify_ns(0x00, 1);
    assert!(!id.extended_lba());
    assert_eq!((id.format_index(), id.nsze.get()), (1, (1 << 20) / 520));
    let data: Vec<u8> = (0..4096u32).map(|i| (i % 249) as u8).collect();
    let meta: Vec<u8> = (0..64u8).collect();
    let mptr = BUF + 0x8000 + 4;
    h.mem.write(GuestAddress(BUF), &data).unwrap();
    h.mem.write(GuestAddress(mptr), &meta).unwrap();
    let mut w = rw(NvmOpcode::WRITE, 1, 1, 8, BUF, 0);
    w.mptr = U64::new(mptr);
    assert!(h.submit(1, w).status().is_success());
    let (rd, rm) = (BUF + 0x10000, BUF + 0x18000);
    let mut r = rw(NvmOpcode::READ, 1, 1, 8, rd, 0);
    r.mptr = U64::new(rm);
    assert!(h.submit(1, r).status().is_success());
    assert_eq!(h.read_mem(rd, 4096), data);
    assert_eq!(h.read_mem(rm, 64), meta);
    // An unreachable metadata buffer is a data transfer error.
    let mut r = rw(NvmOpcode::READ, 1, 1, 8, rd, 0);
    r.mptr = U64::new(MEM_SIZE as u64 - 8);
    assert_eq!(
        h.submit(1, r).status(),
        Status::DATA_TRANSFER_ERROR.with_dnr(true)
    );
}

#[test]
fn fewer_vectors_than_queues_share_vectors() {
    let config = ControllerConfig {
        max_io_queues: 4,
        msix_vectors: 2,
        ..config()
    };
    let mut h = Host::with_namespaces(config, vec![ram_ns(1, 1 << 20)]);
    h.enable();
    assert_eq!(
        h.admin(create_cq(1, 16, 2, cq_base(1))).status(),
        Status::INVALID_INTERRUPT_VECTOR.with_dnr(true)
    );
    for qid in 1..=4u16 {
        h.mem.zero(GuestAddress(cq_base(qid)), 16 * 16).unwrap();
        let iv = qid % 2;
        assert!(h
            .admin(create_cq(qid, 16, iv, cq_base(qid)))
            .status()
            .is_success());
        assert!(h
            .admin(create_sq(qid, 16, qid, sq_base(qid)))
            .status()
            .is_success());
        h.rings[usize::from(qid)] = Some(Ring::new(sq_base(qid), cq_base(qid), 16));
    }
    let before = (h.irq.count(0), h.irq.count(1));
    for qid in 1..=4u16 {
        assert!(h
            .submit(qid, rw(NvmOpcode::READ, 1, 0, 1, BUF, 0))
            .status()
            .is_success());
    }
    assert!(
        h.irq.count(0) >= before.0 + 2,
        "vector 0: queues 2 and 4 (and admin)"
    );
    assert!(h.irq.count(1) >= before.1 + 2, "vector 1: queues 1 and 3");
    assert_eq!(h.irq.total(), h.irq.count(0) + h.irq.count(1));
}

#[test]
fn uncorrectable_blocks_survive_detach_and_attach_and_format_clears_them() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let wu = rw(NvmOpcode::WRITE_UNCORRECTABLE, 1, 100, 1, 0, 0);
    assert_eq!(h.submit(1, wu).status(), Status::SUCCESS);
    let verify = rw(NvmOpcode::VERIFY, 1, 100, 1, 0, 0);
    let unrecovered = Status::UNRECOVERED_READ_ERROR.with_dnr(true);
    assert_eq!(h.attach(1, false).status(), Status::SUCCESS);
    assert_eq!(h.attach(1, true).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, verify).status(), unrecovered);
    // The same format again (index 0: 512 bytes, no metadata): a new
    // medium, nothing marked.
    assert_eq!(h.format(1, 0).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, verify).status(), Status::SUCCESS);
}
