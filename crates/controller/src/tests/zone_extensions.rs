//! Zone descriptor extensions (ZNS 1.1): ZDES in Identify Namespace, Set
//! Zone Descriptor Extension (ZSA 10h) and its statuses, Extended Report
//! Zones (ZRA 01h), and a reset clearing the extension.

use vnvme_spec::zns::{za, zone_state, zra, zrasf, zsa, IdentifyNamespaceZns, ZoneDescriptor};

use super::zoned::{dnr, receive, send, write, zns_identify, zoned_host, ZONES, ZSZE};
use super::*;
use crate::memory::GuestAddress;

/// 128-byte extensions: ZDES 2.
pub(super) const EXT: usize = 128;

/// Set Zone Descriptor Extension on the zone at `zslba`, its data at DATA.
pub(super) fn set_ext(zslba: u64, all: bool) -> Command {
    let mut c = send(2, zslba, zsa::SET_ZONE_DESCRIPTOR_EXTENSION, all);
    c.prp1 = U64::new(DATA);
    c
}

fn extended(slba: u64, bytes: u32, filter: u8, partial: bool) -> Command {
    let mut c = receive(2, slba, bytes, filter, partial);
    c.cdw13 = U32::new(c.cdw13.get() | u32::from(zra::EXTENDED_REPORT_ZONES));
    c
}

impl Host {
    /// Extended Report Zones into a 4 KiB buffer: the count, and each
    /// descriptor with its extension.
    pub(super) fn ext_report(
        &mut self,
        slba: u64,
        filter: u8,
        partial: bool,
    ) -> (u64, Vec<(ZoneDescriptor, Vec<u8>)>) {
        self.mem
            .write(GuestAddress(DATA + 4096), &[0xEE; 4096])
            .unwrap();
        let mut c = extended(slba, 4096, filter, partial);
        c.prp1 = U64::new(DATA + 4096);
        assert_eq!(self.status(1, c), Status::SUCCESS);
        let page = self.read_mem(DATA + 4096, 4096);
        let n = u64::from_le_bytes(page[..8].try_into().unwrap());
        let entries = page[64..]
            .chunks_exact(64 + EXT)
            .take(n as usize)
            .map(|e| {
                let d = ZoneDescriptor::read_from_bytes(&e[..64]).unwrap();
                (d, e[64..].to_vec())
            })
            .collect();
        (n, entries)
    }
}

fn ext_host(f: impl FnOnce(&mut crate::ZonedConfig)) -> Host {
    zoned_host(|z| {
        z.extension_size = EXT as u32;
        f(z);
    })
    .0
}

#[test]
fn identify_namespace_reports_zdes_in_64_byte_units() {
    let mut h = ext_host(|_| {});
    assert_eq!(h.admin(zns_identify(0x05, 2)).status(), Status::SUCCESS);
    let id = IdentifyNamespaceZns::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert!(
        id.lbafe[..4].iter().all(|f| f.zdes == 2),
        "ZDES 2 in every format"
    );
}

#[test]
fn set_extension_closes_an_empty_zone_and_extended_report_returns_it() {
    let mut h = ext_host(|_| {});
    let data: Vec<u8> = (0..EXT as u8).collect();
    h.mem.write(GuestAddress(DATA), &data).unwrap();
    assert_eq!(h.status(1, set_ext(3 * ZSZE, false)), Status::SUCCESS);
    assert_eq!(h.zone_state(3), (zone_state::CLOSED, 3 * ZSZE));
    let (n, zones) = h.ext_report(0, zrasf::ALL, false);
    assert_eq!(n, ZONES);
    // 64 + 128 bytes an entry: 21 fit after the header, all 16 zones here.
    assert_eq!(zones.len(), ZONES as usize);
    assert_eq!((zones[3].0.za, &zones[3].1), (za::ZDEV, &data));
    assert_eq!((zones[2].0.za, zones[2].1.clone()), (0, vec![0; EXT]));
    // The plain report shows the attribute, not the data.
    let (_, d) = h.report(3 * ZSZE, zrasf::ALL, true);
    assert_eq!((d[0].za, d[0].state()), (za::ZDEV, zone_state::CLOSED));
    // Filters and partial reports as Report Zones has them.
    let (n, zones) = h.ext_report(0, zrasf::CLOSED, true);
    assert_eq!((n, zones[0].0.zslba.get()), (1, 3 * ZSZE));
    assert_eq!(h.ext_report(4 * ZSZE, zrasf::CLOSED, false).0, 0);
    // Room for one entry: a non-partial count is of every match.
    h.mem.zero(GuestAddress(DATA + 4096), 4096).unwrap();
    let mut one = extended(0, 64 + 64 + EXT as u32, zrasf::ALL, false);
    one.prp1 = U64::new(DATA + 4096);
    assert_eq!(h.status(1, one), Status::SUCCESS);
    let page = h.read_mem(DATA + 4096, 512);
    assert_eq!(page[..8], ZONES.to_le_bytes());
    assert!(
        page[64 + 64 + EXT..].iter().all(|&b| b == 0),
        "one entry only"
    );
}

#[test]
fn a_zone_with_an_extension_is_written_finished_and_reset_like_any_closed_zone() {
    let mut h = ext_host(|_| {});
    h.mem.write(GuestAddress(DATA), &[0x42; EXT]).unwrap();
    assert_eq!(h.status(1, set_ext(0, false)), Status::SUCCESS);
    h.mem.write(GuestAddress(DATA), &[1; 512]).unwrap();
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
    assert_eq!(h.zone_state(0), (zone_state::IMPLICITLY_OPENED, 1));
    assert_eq!(h.status(1, send(2, 0, zsa::FINISH, false)), Status::SUCCESS);
    let (_, zones) = h.ext_report(0, zrasf::FULL, true);
    assert_eq!(
        (zones[0].0.za, zones[0].1[0]),
        (za::ZDEV, 0x42),
        "kept while full"
    );
    assert_eq!(h.status(1, send(2, 0, zsa::RESET, false)), Status::SUCCESS);
    let (_, zones) = h.ext_report(0, zrasf::ALL, true);
    assert_eq!(zones[0].0.state(), zone_state::EMPTY);
    assert_eq!(
        (zones[0].0.za, zones[0].1.clone()),
        (0, vec![0; EXT]),
        "a reset clears it"
    );
    // Empty again: it takes a new one.
    assert_eq!(h.status(1, set_ext(0, false)), Status::SUCCESS);
}

#[test]
fn set_extension_needs_an_empty_zone_and_one_zone() {
    let mut h = ext_host(|z| z.read_only_zones = 1);
    let transition = dnr(Status::INVALID_ZONE_STATE_TRANSITION);
    h.mem.write(GuestAddress(DATA), &[1; 512]).unwrap();
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
    assert_eq!(
        h.status(1, set_ext(0, false)),
        transition,
        "implicitly open"
    );
    assert_eq!(
        h.status(1, send(2, ZSZE, zsa::FINISH, false)),
        Status::SUCCESS
    );
    assert_eq!(h.status(1, set_ext(ZSZE, false)), transition, "full");
    assert_eq!(h.status(1, set_ext(2 * ZSZE, false)), Status::SUCCESS);
    assert_eq!(
        h.status(1, set_ext(2 * ZSZE, false)),
        transition,
        "closed, already set"
    );
    assert_eq!(
        h.status(1, set_ext((ZONES - 1) * ZSZE, false)),
        transition,
        "read only"
    );
    let invalid = dnr(Status::INVALID_FIELD);
    assert_eq!(h.status(1, set_ext(3 * ZSZE, true)), invalid, "select all");
    assert_eq!(
        h.status(1, set_ext(3 * ZSZE + 1, false)),
        invalid,
        "not a zone start"
    );
    assert_eq!(
        h.status(1, set_ext(ZONES * ZSZE, false)),
        dnr(Status::LBA_OUT_OF_RANGE)
    );
    assert_eq!(h.zone_state(3).0, zone_state::EMPTY, "nothing changed");
}

#[test]
fn set_extension_takes_an_active_resource() {
    let mut h = ext_host(|z| z.max_active = Some(2));
    assert_eq!(h.status(1, set_ext(0, false)), Status::SUCCESS);
    assert_eq!(h.status(1, set_ext(ZSZE, false)), Status::SUCCESS);
    assert_eq!(
        h.status(1, set_ext(2 * ZSZE, false)),
        dnr(Status::TOO_MANY_ACTIVE_ZONES)
    );
    assert_eq!(h.zone_state(2).0, zone_state::EMPTY);
    // A write cannot open a third zone either; a reset frees one.
    h.mem.write(GuestAddress(DATA), &[1; 512]).unwrap();
    assert_eq!(
        h.status(1, write(2 * ZSZE, 1)),
        dnr(Status::TOO_MANY_ACTIVE_ZONES)
    );
    assert_eq!(h.status(1, send(2, 0, zsa::RESET, false)), Status::SUCCESS);
    assert_eq!(h.status(1, set_ext(2 * ZSZE, false)), Status::SUCCESS);
}

#[test]
fn set_extension_whose_data_cannot_be_fetched_changes_nothing() {
    let mut h = ext_host(|_| {});
    let mut c = set_ext(0, false);
    c.prp1 = U64::new(1 << 50);
    assert!(!h.status(1, c).is_success());
    assert_eq!(h.zone_state(0).0, zone_state::EMPTY);
    let (_, zones) = h.ext_report(0, zrasf::ALL, true);
    assert_eq!(zones[0].0.za, 0);
}

#[test]
fn extended_report_refuses_bad_filters_and_lbas() {
    let mut h = ext_host(|_| {});
    assert_eq!(
        h.status(1, extended(0, 4096, 0x08, false)),
        dnr(Status::INVALID_FIELD)
    );
    assert_eq!(
        h.status(1, extended(ZONES * ZSZE, 4096, 0, false)),
        dnr(Status::LBA_OUT_OF_RANGE)
    );
    let mut bad_zra = receive(2, 0, 4096, 0, false);
    bad_zra.cdw13 = U32::new(0x02);
    assert_eq!(h.status(1, bad_zra), dnr(Status::INVALID_FIELD));
}
