//! Zones the controller changes by itself (the operator fails them, as a
//! worn device's zones fail): their statuses to I/O, the Changed Zone List
//! log (BFh) and its RAE semantics, and the Zone Descriptor Changed notice.

use vnvme_spec::zns::{za, zone_state, zrasf, zsa};

use super::zoned::{dnr, send, write, zoned_host, ZONES, ZSZE};
use super::*;
use crate::memory::GuestAddress;
use crate::{ZoneChange, ZoneOpError};

/// A Zone Descriptor Changed notice as an AER completes with it: type
/// Notice (2), information EFh, log page BFh.
const ZONE_CHANGED_EVENT: u32 = 0x00BF_EF02;

impl Host {
    /// Enables the notices of `aec` (Asynchronous Event Configuration) and
    /// posts one AER.
    fn arm(&mut self, aec: u32) -> u16 {
        assert_eq!(
            self.admin(set_features(0x0B, aec)).status(),
            Status::SUCCESS
        );
        let cid = self.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
        self.ring_sq(0);
        cid
    }

    /// Changed Zone List of namespace `nsid`: its zone identifiers, or
    /// `None` for the FFFFh count.
    fn changed_zones(&mut self, nsid: u32, rae: bool) -> Option<Vec<u64>> {
        let mut c = get_log(0xBF, 1024, 0, DATA);
        c.nsid = U32::new(nsid);
        if rae {
            c.cdw10 = U32::new(c.cdw10.get() | 1 << 15);
        }
        assert_eq!(self.admin(c).status(), Status::SUCCESS);
        let page = self.read_mem(DATA, 4096);
        let n = u16::from_le_bytes([page[0], page[1]]);
        if n == 0xFFFF {
            return None;
        }
        let ids = page[8..]
            .chunks_exact(8)
            .take(usize::from(n))
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .collect();
        Some(ids)
    }
}

#[test]
fn an_offline_zone_is_listed_announced_and_refuses_reads_and_writes() {
    let (mut h, _) = zoned_host(|_| {});
    let aer = h.arm(1 << 27);
    h.mem.write(GuestAddress(DATA), &[9; 512]).unwrap();
    assert_eq!(h.status(1, write(2 * ZSZE, 1)), Status::SUCCESS);
    assert_eq!(
        h.ctrl.zone_set_state(2, 2 * ZSZE, ZoneChange::Offline),
        Ok(true)
    );
    let event = h.reap(0);
    assert_eq!((event.cid(), event.dw0.get()), (aer, ZONE_CHANGED_EVENT));
    assert_eq!(h.zone_state(2).0, zone_state::OFFLINE);
    let offline = dnr(Status::ZONE_IS_OFFLINE);
    assert_eq!(h.status(1, write(2 * ZSZE + 1, 1)), offline);
    let read = rw(NvmOpcode::READ, 2, 2 * ZSZE, 1, DATA, 0);
    assert_eq!(h.status(1, read), offline);
    let across = rw(NvmOpcode::READ, 2, 2 * ZSZE - 1, 2, DATA, 0);
    assert_eq!(h.status(1, across), offline, "a read reaching into it");
    // RAE keeps the list; a plain read clears it.
    assert_eq!(h.changed_zones(2, true), Some(vec![2 * ZSZE]));
    assert_eq!(h.changed_zones(2, false), Some(vec![2 * ZSZE]));
    assert_eq!(h.changed_zones(2, false), Some(vec![]));
    // Other namespaces have no changed zones.
    assert_eq!(h.changed_zones(1, false), Some(vec![]));
    assert_eq!(h.changed_zones(0xFFFF_FFFF, false), Some(vec![]));
}

#[test]
fn a_read_only_zone_keeps_its_data_readable_and_gives_back_its_resources() {
    let (mut h, backend) = zoned_host(|z| z.max_open = Some(1));
    h.mem.write(GuestAddress(DATA), &[7; 512]).unwrap();
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
    assert_eq!(h.ctrl.zone_set_state(2, 0, ZoneChange::ReadOnly), Ok(true));
    assert_eq!(h.zone_state(0).0, zone_state::READ_ONLY);
    assert_eq!(h.status(1, write(1, 1)), dnr(Status::ZONE_IS_READ_ONLY));
    h.mem.zero(GuestAddress(DATA), 512).unwrap();
    assert_eq!(
        h.status(1, rw(NvmOpcode::READ, 2, 0, 1, DATA, 0)),
        Status::SUCCESS
    );
    assert_eq!(h.read_mem(DATA, 512), vec![7; 512]);
    let mut back = [0u8; 512];
    backend.read(0, &mut back).unwrap();
    assert_eq!(back, [7; 512]);
    // Its open resource is free: another zone opens under MOR 1 without
    // closing anything.
    assert_eq!(
        h.status(1, send(2, ZSZE, zsa::OPEN, false)),
        Status::SUCCESS
    );
    // Reset does not apply to it; the host may take it offline.
    assert_eq!(
        h.status(1, send(2, 0, zsa::RESET, false)),
        dnr(Status::INVALID_ZONE_STATE_TRANSITION)
    );
    assert_eq!(h.changed_zones(2, false), Some(vec![0]));
}

#[test]
fn failing_a_zone_again_or_back_is_refused_or_changes_nothing() {
    let (mut h, _) = zoned_host(|_| {});
    let ctrl = &h.ctrl;
    assert_eq!(ctrl.zone_set_state(2, ZSZE, ZoneChange::ReadOnly), Ok(true));
    assert_eq!(
        ctrl.zone_set_state(2, ZSZE, ZoneChange::ReadOnly),
        Ok(false)
    );
    assert_eq!(ctrl.zone_set_state(2, ZSZE, ZoneChange::Offline), Ok(true));
    assert_eq!(ctrl.zone_set_state(2, ZSZE, ZoneChange::Offline), Ok(false));
    assert_eq!(
        ctrl.zone_set_state(2, ZSZE, ZoneChange::ReadOnly),
        Err(ZoneOpError::AlreadyOffline)
    );
    assert_eq!(
        ctrl.zone_set_state(2, ZSZE + 1, ZoneChange::Offline),
        Err(ZoneOpError::NotZoneStart {
            lba: ZSZE + 1,
            zsze: ZSZE
        })
    );
    assert_eq!(
        ctrl.zone_set_state(2, ZONES * ZSZE, ZoneChange::Offline),
        Err(ZoneOpError::OutOfRange(ZONES * ZSZE))
    );
    assert_eq!(
        ctrl.zone_set_state(1, 0, ZoneChange::Offline),
        Err(ZoneOpError::NotZoned(1))
    );
    assert_eq!(
        ctrl.zone_set_state(9, 0, ZoneChange::Offline),
        Err(ZoneOpError::NoSuchNamespace(9))
    );
    // Listed once, however many times it changed.
    assert_eq!(h.changed_zones(2, false), Some(vec![ZSZE]));
}

#[test]
fn without_zone_notices_enabled_no_event_is_sent_but_the_zone_is_listed() {
    let (mut h, _) = zoned_host(|_| {});
    // Namespace Attribute Notices only.
    let aer = h.arm(1 << 8);
    assert_eq!(h.ctrl.zone_set_state(2, 0, ZoneChange::Offline), Ok(true));
    assert_eq!(h.changed_zones(2, false), Some(vec![0]));
    // The AER is still outstanding: an attribute change completes it.
    h.ctrl.namespace_attach(2, false).unwrap();
    let event = h.reap(0);
    assert_eq!((event.cid(), event.dw0.get()), (aer, 0x0004_0002));
}

#[test]
fn the_notice_stays_masked_until_the_log_is_read_without_rae() {
    let (mut h, _) = zoned_host(|_| {});
    let first = h.arm(1 << 27);
    assert_eq!(h.ctrl.zone_set_state(2, 0, ZoneChange::Offline), Ok(true));
    assert_eq!(h.reap(0).cid(), first);
    let second = h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    h.ring_sq(0);
    // Masked: the change is listed, no event.
    assert_eq!(
        h.ctrl.zone_set_state(2, ZSZE, ZoneChange::Offline),
        Ok(true)
    );
    assert_eq!(h.changed_zones(2, true), Some(vec![0, ZSZE]));
    assert_eq!(h.changed_zones(2, false), Some(vec![0, ZSZE]));
    // Unmasked by the read: the next change is announced.
    assert_eq!(
        h.ctrl.zone_set_state(2, 2 * ZSZE, ZoneChange::ReadOnly),
        Ok(true)
    );
    let event = h.reap(0);
    assert_eq!((event.cid(), event.dw0.get()), (second, ZONE_CHANGED_EVENT));
    assert_eq!(h.changed_zones(2, false), Some(vec![2 * ZSZE]));
}

#[test]
fn identify_and_features_offer_zone_descriptor_changed_notices() {
    let (mut h, _) = zoned_host(|_| {});
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(id.oaes.get() & (1 << 27), 1 << 27, "OAES bit 27");
    let set = h.admin(set_features(0x0B, 0xFFFF_FFFF));
    assert_eq!(set.status(), Status::SUCCESS);
    let mut get = cmd(AdminOpcode::GET_FEATURES.0);
    get.cdw10 = U32::new(0x0B);
    let c = h.admin(get);
    assert_eq!(c.dw0.get() & (1 << 27), 1 << 27, "kept by Set Features");
}

#[test]
fn a_zone_finished_by_the_controller_is_full_with_zfc_and_frees_its_resources() {
    let (mut h, _) = zoned_host(|z| z.max_open = Some(1));
    h.mem.write(GuestAddress(DATA), &[3; 512]).unwrap();
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
    assert_eq!(h.ctrl.zone_set_state(2, 0, ZoneChange::Finished), Ok(true));
    let (_, d) = h.report(0, zrasf::ALL, true);
    assert_eq!((d[0].state(), d[0].za), (zone_state::FULL, za::ZFC));
    assert_eq!(h.status(1, write(1, 1)), dnr(Status::ZONE_IS_FULL));
    // Its open resource is free: zone 1 opens under MOR 1.
    assert_eq!(
        h.status(1, send(2, ZSZE, zsa::OPEN, false)),
        Status::SUCCESS
    );
    assert_eq!(h.ctrl.zone_set_state(2, 0, ZoneChange::Finished), Ok(false));
    assert_eq!(
        h.ctrl.zone_set_state(2, 3 * ZSZE, ZoneChange::Finished),
        Err(ZoneOpError::Inapplicable {
            change: "full",
            applies: "open or closed",
            state: "empty"
        })
    );
    assert_eq!(h.changed_zones(2, false), Some(vec![0]));
    // A reset clears ZFC with the rest.
    assert_eq!(h.status(1, send(2, 0, zsa::RESET, false)), Status::SUCCESS);
    let (_, d) = h.report(0, zrasf::ALL, true);
    assert_eq!((d[0].state(), d[0].za), (zone_state::EMPTY, 0));
}

#[test]
fn finish_and_reset_recommendations_are_attributes_the_next_transition_clears() {
    let (mut h, _) = zoned_host(|_| {});
    h.mem.write(GuestAddress(DATA), &[3; 512]).unwrap();
    assert_eq!(h.status(1, write(0, 1)), Status::SUCCESS);
    let ctrl = &h.ctrl;
    assert_eq!(
        ctrl.zone_set_state(2, 0, ZoneChange::FinishRecommended),
        Ok(true)
    );
    assert_eq!(
        ctrl.zone_set_state(2, 0, ZoneChange::FinishRecommended),
        Ok(false)
    );
    let (_, d) = h.report(0, zrasf::ALL, true);
    assert_eq!(
        (d[0].state(), d[0].za),
        (zone_state::IMPLICITLY_OPENED, za::FZR)
    );
    // The host follows the recommendation: a full zone has none.
    assert_eq!(h.status(1, send(2, 0, zsa::FINISH, false)), Status::SUCCESS);
    assert_eq!(h.report(0, zrasf::ALL, true).1[0].za, 0);
    assert_eq!(
        h.ctrl.zone_set_state(2, 0, ZoneChange::ResetRecommended),
        Ok(true)
    );
    let (_, d) = h.report(0, zrasf::ALL, true);
    assert_eq!((d[0].state(), d[0].za), (zone_state::FULL, za::RZR));
    assert_eq!(h.status(1, send(2, 0, zsa::RESET, false)), Status::SUCCESS);
    assert_eq!(h.report(0, zrasf::ALL, true).1[0].za, 0);
    for change in [ZoneChange::FinishRecommended, ZoneChange::ResetRecommended] {
        assert!(matches!(
            h.ctrl.zone_set_state(2, 0, change),
            Err(ZoneOpError::Inapplicable { state: "empty", .. })
        ));
    }
    // One entry for the zone, however many changes.
    assert_eq!(h.changed_zones(2, false), Some(vec![0]));
    // Read only drops a reset recommendation too.
    assert_eq!(h.status(1, write(ZSZE, 1)), Status::SUCCESS);
    let ctrl = &h.ctrl;
    assert_eq!(
        ctrl.zone_set_state(2, ZSZE, ZoneChange::ResetRecommended),
        Ok(true)
    );
    assert_eq!(ctrl.zone_set_state(2, ZSZE, ZoneChange::ReadOnly), Ok(true));
    assert_eq!(h.report(ZSZE, zrasf::ALL, true).1[0].za, 0);
}
