//! Zoned namespaces (ZNS 1.1): Identify with CSI 02h, the zone rules of
//! writes and reads, Zone Management Send and Receive, Zone Append, and
//! their statuses, driven through queues like a host.

use vnvme_spec::zns::{
    zone_state, zra, zrasf, zsa, IdentifyControllerZns, IdentifyNamespaceZns, ReportZonesHeader,
    ZoneDescriptor,
};

use super::*;
use crate::memory::GuestAddress;
use crate::ZonedConfig;

pub(super) const ZNS: u8 = 0x02;
/// 64 KiB zones of 512-byte blocks; namespace 2 is 1 MiB: 16 zones.
pub(super) const ZSZE: u64 = 128;
pub(super) const ZONES: u64 = NS_BLOCKS / ZSZE;

/// Namespace 1 conventional, namespace 2 zoned as `f` says (64 KiB
/// zones), an I/O queue pair 1 and 2. Returns namespace 2's backend too.
pub(super) fn zoned_host(f: impl FnOnce(&mut ZonedConfig)) -> (Host, Arc<RamDevice>) {
    zoned_host_with(config(), f)
}

pub(super) fn zoned_host_with(
    config: ControllerConfig,
    f: impl FnOnce(&mut ZonedConfig),
) -> (Host, Arc<RamDevice>) {
    let mut h = Host::new();
    let mut z = ZonedConfig::new(ZSZE * 512);
    f(&mut z);
    let backend = Arc::new(RamDevice::new(NS_BLOCKS * 512));
    let namespaces = vec![
        NamespaceConfig::new(1, 512, h.backend.clone()),
        NamespaceConfig::new(2, 512, backend.clone()).with_zoned(Some(z)),
    ];
    h.ctrl = Controller::new(config, namespaces).unwrap();
    h.ctrl.attach(h.mem.clone(), h.irq.clone());
    h.enable();
    h.create_pair(1, 16);
    h.create_pair(2, 16);
    (h, backend)
}

pub(super) fn zns_identify(cns: u8, nsid: u32) -> Command {
    let mut c = identify(cns, nsid, DATA);
    c.cdw11 = U32::new(u32::from(ZNS) << 24);
    c
}

pub(super) fn send(nsid: u32, slba: u64, action: u8, all: bool) -> Command {
    let mut c = rw(NvmOpcode::ZONE_MGMT_SEND, nsid, slba, 1, 0, 0);
    c.cdw12 = U32::new(0);
    c.cdw13 = U32::new(u32::from(action) | (u32::from(all) << 8));
    c
}

pub(super) fn receive(nsid: u32, slba: u64, bytes: u32, filter: u8, partial: bool) -> Command {
    let mut c = rw(NvmOpcode::ZONE_MGMT_RECV, nsid, slba, 1, DATA, 0);
    c.cdw12 = U32::new(bytes / 4 - 1);
    c.cdw13 = U32::new((u32::from(filter) << 8) | (u32::from(partial) << 16));
    c
}

pub(super) fn write(slba: u64, nlb: u32) -> Command {
    rw(NvmOpcode::WRITE, 2, slba, nlb, DATA, 0)
}

impl Host {
    pub(super) fn status(&mut self, qid: u16, c: Command) -> Status {
        self.submit(qid, c).status()
    }

    /// Report Zones from `slba`: the header's count and the descriptors.
    pub(super) fn report(
        &mut self,
        slba: u64,
        filter: u8,
        partial: bool,
    ) -> (u64, Vec<ZoneDescriptor>) {
        self.mem.zero(GuestAddress(DATA), 4096).unwrap();
        let c = self.submit(1, receive(2, slba, 4096, filter, partial));
        assert_eq!(c.status(), Status::SUCCESS);
        let page = self.read_mem(DATA, 4096);
        let header = ReportZonesHeader::read_from_bytes(&page[..64]).unwrap();
        let n = header.nr_zones.get();
        let given = (n as usize).min(63);
        let descriptors = <[ZoneDescriptor]>::ref_from_bytes(&page[64..64 + given * 64])
            .unwrap()
            .to_vec();
        (n, descriptors)
    }

    /// Zone `i`'s state and write pointer.
    pub(super) fn zone_state(&mut self, i: u64) -> (u8, u64) {
        let (_, d) = self.report(i * ZSZE, zrasf::ALL, true);
        (d[0].state(), d[0].wp.get())
    }
}

pub(super) fn dnr(s: Status) -> Status {
    s.with_dnr(true)
}

#[test]
fn zoned_namespace_reports_csi_02h_and_its_zone_geometry() {
    let (mut h, _) = zoned_host(|z| {
        z.max_open = Some(3);
        z.max_active = Some(5);
    });
    // Namespace Identification Descriptors: CSI descriptor (type 04h) last.
    for (nsid, csi) in [(1, 0), (2, ZNS)] {
        h.mem.zero(GuestAddress(DATA), 4096).unwrap();
        assert_eq!(
            h.admin(identify(0x03, nsid, DATA)).status(),
            Status::SUCCESS
        );
        let page = h.read_mem(DATA, 64);
        assert_eq!(page[52..57], [0x04, 1, 0, 0, csi], "nsid {nsid}");
    }
    assert_eq!(h.admin(zns_identify(0x05, 2)).status(), Status::SUCCESS);
    let id = IdentifyNamespaceZns::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!((id.zoc.get(), id.ozcs.get()), (0, 1), "no ZOC, RAZB");
    assert_eq!((id.mor.get(), id.mar.get()), (2, 4), "0's based limits");
    let ns = IdentifyNamespace::read_from_bytes(&{
        h.admin(identify(0x00, 2, DATA));
        h.read_mem(DATA, 4096)
    })
    .unwrap();
    assert_eq!(ns.nsze.get(), ZONES * ZSZE);
    let format = usize::from(ns.flbas & 0xF);
    // The buffer was refilled by CNS 00h: ask again.
    h.admin(zns_identify(0x05, 2));
    let id = IdentifyNamespaceZns::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(id.lbafe[format].zsze.get(), ZSZE, "zone size in blocks");
    assert_eq!(
        h.admin(zns_identify(0x05, 1)).status(),
        dnr(Status::INVALID_FIELD),
        "a conventional namespace has no zoned structure"
    );
    assert_eq!(h.admin(zns_identify(0x06, 0)).status(), Status::SUCCESS);
    let ctrl = IdentifyControllerZns::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(ctrl.zasl, config().mdts, "ZASL = MDTS");
    // Active namespaces of the Zoned Namespace Command Set: 2 only.
    assert_eq!(h.admin(zns_identify(0x07, 0)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 8), [2, 0, 0, 0, 0, 0, 0, 0]);
}

#[test]
fn effects_log_of_the_zoned_command_set_lists_zone_append() {
    let (mut h, _) = zoned_host(|_| {});
    let iocs = |op: NvmOpcode| 1024 + 4 * usize::from(op.0);
    for (csi, listed) in [(0u8, false), (ZNS, true)] {
        let mut c = get_log(0x05, 1024, 0, DATA);
        c.cdw14 = U32::new(u32::from(csi) << 24);
        assert_eq!(h.admin(c).status(), Status::SUCCESS);
        let log = h.read_mem(DATA, 4096);
        for op in [
            NvmOpcode::ZONE_APPEND,
            NvmOpcode::ZONE_MGMT_SEND,
            NvmOpcode::ZONE_MGMT_RECV,
        ] {
            assert_eq!(log[iocs(op)] & 1 == 1, listed, "csi {csi} {op}");
        }
        assert_eq!(
            log[iocs(NvmOpcode::COPY)] & 1 == 1,
            !listed,
            "csi {csi} copy"
        );
        assert_eq!(log[iocs(NvmOpcode::WRITE)] & 1, 1);
    }
}

#[test]
fn writes_must_start_at_the_write_pointer() {
    let (mut h, backend) = zoned_host(|_| {});
    h.mem.write(GuestAddress(DATA), &[0xA5; 8 * 512]).unwrap();
    assert_eq!(h.status(1, write(ZSZE, 8)), Status::SUCCESS);
    assert_eq!(h.zone_state(1), (zone_state::IMPLICITLY_OPENED, ZSZE + 8));
    let mut back = vec![0; 8 * 512];
    backend.read(ZSZE * 512, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0xA5));
    for slba in [ZSZE, ZSZE + 4, ZSZE + 16] {
        assert_eq!(
            h.status(1, write(slba, 1)),
            dnr(Status::ZONE_INVALID_WRITE),
            "slba {slba}"
        );
    }
    assert_eq!(
        h.status(1, write(ZSZE + 8, 121)),
        dnr(Status::ZONE_BOUNDARY_ERROR),
        "past the zone's capacity"
    );
    assert_eq!(h.status(1, write(ZSZE + 8, 120)), Status::SUCCESS);
    assert_eq!(h.zone_state(1).0, zone_state::FULL);
    assert_eq!(h.status(1, write(ZSZE + 8, 1)), dnr(Status::ZONE_IS_FULL));
    // Write Zeroes follows the same rules; reads cross zone boundaries.
    let mut wz = rw(NvmOpcode::WRITE_ZEROES, 2, 5, 1, 0, 0);
    assert_eq!(h.status(1, wz), dnr(Status::ZONE_INVALID_WRITE));
    wz.cdw10 = U32::new(0);
    assert_eq!(h.status(1, wz), Status::SUCCESS);
    let read = rw(NvmOpcode::READ, 2, ZSZE - 4, 8, DATA, 0);
    assert_eq!(h.status(1, read), Status::SUCCESS);
    // Copy is not supported on a zoned namespace; deallocation is ignored.
    let copy = rw(NvmOpcode::COPY, 2, 0, 1, DATA, 0);
    assert_eq!(h.status(1, copy), dnr(Status::INVALID_OPCODE));
}

#[test]
fn zone_append_returns_the_lba_it_wrote_in_dw0_and_dw1() {
    let (mut h, backend) = zoned_host(|_| {});
    let zslba = 3 * ZSZE;
    for (i, expected) in [(0u8, zslba), (1, zslba + 4), (2, zslba + 8)] {
        h.mem
            .write(GuestAddress(DATA), &[0x10 + i; 4 * 512])
            .unwrap();
        let c = h.submit(1, rw(NvmOpcode::ZONE_APPEND, 2, zslba, 4, DATA, 0));
        assert_eq!(c.status(), Status::SUCCESS);
        assert_eq!(
            (c.dw0.get(), c.dw1.get()),
            (expected as u32, (expected >> 32) as u32)
        );
        let mut back = vec![0; 4 * 512];
        backend.read(expected * 512, &mut back).unwrap();
        assert!(back.iter().all(|&b| b == 0x10 + i), "append {i}");
    }
    let bad = rw(NvmOpcode::ZONE_APPEND, 2, zslba + 1, 1, DATA, 0);
    assert_eq!(
        h.status(1, bad),
        dnr(Status::INVALID_FIELD),
        "not a zone start"
    );
    let big = rw(NvmOpcode::ZONE_APPEND, 2, zslba, 117, DATA, 0);
    assert_eq!(h.status(1, big), dnr(Status::ZONE_BOUNDARY_ERROR));
    assert_eq!(h.zone_state(3), (zone_state::IMPLICITLY_OPENED, zslba + 12));
}

#[test]
fn zone_commands_on_a_conventional_namespace_are_invalid_opcode() {
    let (mut h, _) = zoned_host(|_| {});
    let append = rw(NvmOpcode::ZONE_APPEND, 1, 0, 1, DATA, 0);
    for c in [
        send(1, 0, zsa::RESET, false),
        receive(1, 0, 4096, 0, false),
        append,
    ] {
        assert_eq!(h.status(1, c), dnr(Status::INVALID_OPCODE));
    }
}

#[test]
fn zone_management_send_moves_zones_through_their_states() {
    let (mut h, backend) = zoned_host(|z| z.read_only_zones = 1);
    let invalid = dnr(Status::INVALID_ZONE_STATE_TRANSITION);
    assert_eq!(h.status(1, send(2, 0, zsa::CLOSE, false)), invalid);
    assert_eq!(h.status(1, send(2, 0, zsa::OPEN, false)), Status::SUCCESS);
    assert_eq!(h.zone_state(0).0, zone_state::EXPLICITLY_OPENED);
    h.mem.write(GuestAddress(DATA), &[0x77; 512]).unwrap();
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
    assert_eq!(h.status(1, send(2, 0, zsa::CLOSE, false)), Status::SUCCESS);
    assert_eq!(h.zone_state(0), (zone_state::CLOSED, 1));
    assert_eq!(h.status(1, send(2, 0, zsa::FINISH, false)), Status::SUCCESS);
    assert_eq!(h.zone_state(0).0, zone_state::FULL);
    assert_eq!(h.status(1, send(2, 0, zsa::OPEN, false)), invalid);
    assert_eq!(h.status(1, send(2, 0, zsa::RESET, false)), Status::SUCCESS);
    assert_eq!(h.zone_state(0), (zone_state::EMPTY, 0));
    let mut back = [0xFFu8; 512];
    backend.read(0, &mut back).unwrap();
    assert_eq!(back, [0; 512], "a reset zone reads as zeroes");
    // SLBA must be a zone start and inside the namespace.
    assert_eq!(
        h.status(1, send(2, 1, zsa::OPEN, false)),
        dnr(Status::INVALID_FIELD)
    );
    assert_eq!(
        h.status(1, send(2, ZONES * ZSZE, zsa::OPEN, false)),
        dnr(Status::LBA_OUT_OF_RANGE)
    );
    for action in [
        0x00,
        zsa::SET_ZONE_DESCRIPTOR_EXTENSION,
        zsa::FLUSH_EXPLICIT_ZRWA_RANGE,
        0x06,
    ] {
        assert_eq!(
            h.status(1, send(2, 0, action, false)),
            dnr(Status::INVALID_FIELD),
            "zsa {action:#x}"
        );
    }
    // The read-only zone: Zone Is Read Only; offline by Select All, then
    // Zone Is Offline to reads too.
    let last = ZONES - 1;
    assert_eq!(h.zone_state(last).0, zone_state::READ_ONLY);
    assert_eq!(
        h.status(1, write(last * ZSZE, 1)),
        dnr(Status::ZONE_IS_READ_ONLY)
    );
    assert_eq!(
        h.status(1, send(2, last * ZSZE, zsa::RESET, false)),
        invalid
    );
    assert_eq!(h.status(1, send(2, 0, zsa::OFFLINE, true)), Status::SUCCESS);
    assert_eq!(h.zone_state(last).0, zone_state::OFFLINE);
    let read = rw(NvmOpcode::READ, 2, last * ZSZE - 1, 2, DATA, 0);
    assert_eq!(h.status(1, read), dnr(Status::ZONE_IS_OFFLINE));
    assert_eq!(
        h.status(1, write(last * ZSZE, 1)),
        dnr(Status::ZONE_IS_OFFLINE)
    );
}

#[test]
fn select_all_resets_every_written_zone() {
    let (mut h, backend) = zoned_host(|_| {});
    h.mem.write(GuestAddress(DATA), &[0x5A; 512]).unwrap();
    for zone in 0..4 {
        assert_eq!(h.status(1, write(zone * ZSZE, 1)), Status::SUCCESS);
    }
    assert_eq!(h.report(0, zrasf::IMPLICITLY_OPENED, false).0, 4);
    assert_eq!(h.status(1, send(2, 0, zsa::CLOSE, true)), Status::SUCCESS);
    assert_eq!(h.report(0, zrasf::CLOSED, false).0, 4);
    assert_eq!(h.status(1, send(2, 0, zsa::RESET, true)), Status::SUCCESS);
    assert_eq!(h.report(0, zrasf::EMPTY, false).0, ZONES);
    let mut back = vec![0xFF; (4 * ZSZE * 512) as usize];
    backend.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0));
}

#[test]
fn open_and_active_limits_give_their_statuses() {
    let (mut h, _) = zoned_host(|z| {
        z.max_open = Some(2);
        z.max_active = Some(3);
    });
    for zone in 0..3 {
        assert_eq!(h.status(1, write(zone * ZSZE, 1)), Status::SUCCESS);
    }
    // Zone 0 was closed implicitly to open zone 2.
    assert_eq!(h.zone_state(0), (zone_state::CLOSED, 1));
    assert_eq!(
        h.status(1, write(3 * ZSZE, 1)),
        dnr(Status::TOO_MANY_ACTIVE_ZONES)
    );
    assert_eq!(
        h.status(1, send(2, ZSZE, zsa::OPEN, false)),
        Status::SUCCESS
    );
    assert_eq!(
        h.status(1, send(2, 2 * ZSZE, zsa::OPEN, false)),
        Status::SUCCESS
    );
    assert_eq!(
        h.status(1, write(1, 1)),
        dnr(Status::TOO_MANY_OPEN_ZONES),
        "both open zones explicitly opened: none to close"
    );
    assert_eq!(
        h.status(1, send(2, ZSZE, zsa::FINISH, false)),
        Status::SUCCESS
    );
    assert_eq!(h.status(1, write(1, 1)), Status::SUCCESS);
    // Zone 1 full gave its active resource back: zone 3 takes it.
    assert_eq!(h.status(1, write(3 * ZSZE, 1)), Status::SUCCESS);
    assert_eq!(h.zone_state(0), (zone_state::CLOSED, 2));
    assert_eq!(
        h.status(1, write(4 * ZSZE, 1)),
        dnr(Status::TOO_MANY_ACTIVE_ZONES)
    );
}

#[test]
fn report_zones_filters_counts_and_refuses_what_it_lacks() {
    let (mut h, _) = zoned_host(|_| {});
    h.mem.write(GuestAddress(DATA), &[1; 512]).unwrap();
    assert_eq!(h.status(1, write(2 * ZSZE, 1)), Status::SUCCESS);
    let (n, d) = h.report(0, zrasf::ALL, false);
    assert_eq!((n, d.len()), (ZONES, ZONES as usize));
    assert_eq!(d[2].wp.get(), 2 * ZSZE + 1);
    assert_eq!((d[2].zslba.get(), d[2].zcap.get()), (2 * ZSZE, ZSZE));
    assert_eq!(d[2].zt, 0x02, "sequential write required");
    let (n, d) = h.report(2 * ZSZE + 7, zrasf::ALL, true);
    assert_eq!((n, d[0].zslba.get()), (ZONES - 2, 2 * ZSZE));
    assert_eq!(h.report(0, zrasf::EMPTY, false).0, ZONES - 1);
    // A buffer of the header and two descriptors: non-partial counts all.
    h.mem.zero(GuestAddress(DATA), 4096).unwrap();
    assert_eq!(
        h.status(1, receive(2, 0, 192, zrasf::ALL, false)),
        Status::SUCCESS
    );
    let page = h.read_mem(DATA, 256);
    assert_eq!(page[..8], ZONES.to_le_bytes());
    assert_eq!(page[192..], [0; 64], "nothing past the buffer");
    h.mem.zero(GuestAddress(DATA), 4096).unwrap();
    assert_eq!(
        h.status(1, receive(2, 0, 192, zrasf::ALL, true)),
        Status::SUCCESS
    );
    assert_eq!(h.read_mem(DATA, 8), 2u64.to_le_bytes());
    let mut extended = receive(2, 0, 4096, 0, false);
    extended.cdw13 = U32::new(u32::from(zra::EXTENDED_REPORT_ZONES));
    assert_eq!(
        h.status(1, extended),
        dnr(Status::INVALID_FIELD),
        "ZDES is 0"
    );
    let bad_filter = receive(2, 0, 4096, 0x08, false);
    assert_eq!(h.status(1, bad_filter), dnr(Status::INVALID_FIELD));
    let beyond = receive(2, ZONES * ZSZE, 4096, 0, false);
    assert_eq!(h.status(1, beyond), dnr(Status::LBA_OUT_OF_RANGE));
    let mut huge = receive(2, 0, 4096, 0, false);
    huge.cdw12 = U32::new(u32::MAX);
    assert_eq!(h.status(1, huge), dnr(Status::INVALID_FIELD), "beyond MDTS");
}

#[test]
fn racing_writes_at_one_write_pointer_let_exactly_one_win() {
    // Queue pairs 1 and 2 on two workers: their commands run at once.
    let two_workers = ControllerConfig {
        workers: 2,
        ..config()
    };
    let (mut h, _) = zoned_host_with(two_workers, |_| {});
    let rounds = 32u64;
    for round in 0..rounds {
        // The same LBA from two queues.
        h.push(1, write(round * 2, 2));
        h.push(2, write(round * 2, 2));
        h.ring_sq(1);
        h.ring_sq(2);
        let a = h.reap(1).status();
        let b = h.reap(2).status();
        let mut got = [a, b];
        got.sort();
        assert_eq!(
            got,
            [Status::SUCCESS, dnr(Status::ZONE_INVALID_WRITE)],
            "round {round}"
        );
    }
    assert_eq!(h.zone_state(0), (zone_state::IMPLICITLY_OPENED, rounds * 2));
}

#[test]
fn changed_zone_list_is_empty() {
    let (mut h, _) = zoned_host(|_| {});
    let mut c = get_log(0xBF, 1024, 0, DATA);
    c.nsid = U32::new(2);
    h.mem.write(GuestAddress(DATA), &[0xFF; 4096]).unwrap();
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    assert!(h.read_mem(DATA, 4096).iter().all(|&b| b == 0));
}

#[test]
fn format_keeps_a_namespace_zoned_with_every_zone_empty() {
    let (mut h, _) = zoned_host(|_| {});
    h.mem.write(GuestAddress(DATA), &[1; 512]).unwrap();
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
    let mut format = cmd(AdminOpcode::FORMAT_NVM.0);
    format.nsid = U32::new(2);
    // LBA format 0: 512-byte blocks, as before.
    assert_eq!(h.admin(format).status(), Status::SUCCESS);
    assert_eq!(h.report(0, zrasf::EMPTY, false).0, ZONES);
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
}

#[test]
fn a_sanitize_leaves_every_zone_empty() {
    let (mut h, _) = zoned_host(|_| {});
    h.mem.write(GuestAddress(DATA), &[3; 512]).unwrap();
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
    assert_eq!(h.status(1, write(ZSZE, 8)), Status::SUCCESS);
    let mut sanitize = cmd(AdminOpcode::SANITIZE.0);
    sanitize.cdw10 = U32::new(0x2); // Block Erase
    assert_eq!(h.admin(sanitize).status(), Status::SUCCESS);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let c = h.submit(1, receive(2, 0, 4096, zrasf::EMPTY, false));
        if c.status().is_success() {
            break;
        }
        assert!(
            c.status().same_code(Status::SANITIZE_IN_PROGRESS),
            "{:?}",
            c.status()
        );
        assert!(Instant::now() < deadline, "sanitize still running");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(h.report(0, zrasf::EMPTY, false).0, ZONES);
    assert_eq!(
        h.status(1, write(0, 1)),
        Status::SUCCESS,
        "written from the zone start again"
    );
}
