//! A zoned namespace's zones across a crash: the words the record kept
//! as they changed go over the older slot's zones
//! (`zoned/record.rs`, [`SavedState::put_positions`]).

use vnvme_spec::zns::{za, zone_state, zrasf, zsa, ZoneDescriptor};

use super::super::zone_extensions::{set_ext, EXT};
use super::super::zoned::{dnr, send, write, zoned_host, ZONES, ZSZE};
use super::*;
use crate::ZonedConfig;

/// At most 2 zones open, the last zone read only, 128-byte extensions.
fn zones(z: &mut ZonedConfig) {
    z.max_open = Some(2);
    z.read_only_zones = 1;
    z.extension_size = EXT as u32;
}

/// The zoned host (namespace 2 zoned, pairs 1 and 2) recording into a
/// [`Recorder`], and its first checkpoint.
fn recorded_zoned_host() -> (Host, Arc<RamDevice>, Arc<Recorder>, SavedState) {
    let (h, backend) = zoned_host(zones);
    let rec = Arc::new(Recorder::default());
    assert!(h.ctrl.record_crash_state(rec.clone()));
    let saved = checkpoint(&h, &rec);
    (h, backend, rec, saved)
}

/// Every zone's descriptor.
fn all_zones(h: &mut Host) -> Vec<ZoneDescriptor> {
    let (n, d) = h.report(0, zrasf::ALL, false);
    assert_eq!(n, ZONES);
    d
}

/// The crash, with namespace 2 zoned on a copy of `backend`.
fn crash_zoned(h: &mut Host, rec: &Recorder, saved: &SavedState, backend: &RamDevice) {
    let copy = Arc::new(RamDevice::new(backend.size()));
    let mut data = vec![0; backend.size() as usize];
    backend.read(0, &mut data).unwrap();
    copy.write(0, &data).unwrap();
    let mut z = ZonedConfig::new(ZSZE * 512);
    zones(&mut z);
    let ns2 = NamespaceConfig::new(2, 512, copy).with_zoned(Some(z));
    let interrupted = crash_and_restore_with(h, config(), rec, saved, vec![ns2]);
    assert_eq!(interrupted, vec![]);
}

fn write_zeroes(slba: u64, nlb: u32) -> Command {
    rw(NvmOpcode::WRITE_ZEROES, 2, slba, nlb, 0, 0)
}

/// After the slot: a write, an append, an explicit open (which closes the
/// oldest implicitly opened zone, MOR being 2), a write then a close, a
/// write then a finish, a write then a reset, a read-only zone taken
/// offline, and a zone filled by Write Zeroes. The restore from the slot
/// before them all gives the zones the live controller reported, and the
/// host writes on at each write pointer. Without the words (the slot
/// alone) every zone but the read-only one comes back empty.
#[test]
fn zones_changed_after_the_slot_are_as_the_host_saw_them_after_the_crash() {
    let (mut h, backend, rec, saved) = recorded_zoned_host();
    let ok = Status::SUCCESS;
    assert_eq!(h.status(1, write(0, 4)), ok);
    let append = h.submit(1, rw(NvmOpcode::ZONE_APPEND, 2, ZSZE, 2, DATA, 0));
    assert_eq!((append.status(), append.dw0.get()), (ok, ZSZE as u32));
    assert_eq!(h.status(1, send(2, 2 * ZSZE, zsa::OPEN, false)), ok);
    assert_eq!(h.status(1, write(3 * ZSZE, 1)), ok);
    assert_eq!(h.status(1, send(2, 3 * ZSZE, zsa::CLOSE, false)), ok);
    assert_eq!(h.status(1, write(4 * ZSZE, 1)), ok);
    assert_eq!(h.status(1, send(2, 4 * ZSZE, zsa::FINISH, false)), ok);
    assert_eq!(h.status(1, write(5 * ZSZE, 8)), ok);
    assert_eq!(h.status(1, send(2, 5 * ZSZE, zsa::RESET, false)), ok);
    let last = (ZONES - 1) * ZSZE;
    assert_eq!(h.status(1, send(2, last, zsa::OFFLINE, false)), ok);
    assert_eq!(h.status(1, write_zeroes(6 * ZSZE, ZSZE as u32)), ok);
    let before = all_zones(&mut h);
    let states: Vec<u8> = before.iter().take(7).map(|d| d.state()).collect();
    use zone_state::*;
    assert_eq!(
        states,
        [CLOSED, CLOSED, EXPLICITLY_OPENED, CLOSED, FULL, EMPTY, FULL],
        "the zones the test means to restore"
    );
    assert_eq!(before[ZONES as usize - 1].state(), OFFLINE);

    crash_zoned(&mut h, &rec, &saved, &backend);
    assert_eq!(all_zones(&mut h), before);
    // The host goes on at its write pointers.
    assert_eq!(h.status(1, write(4, 1)), ok);
    assert_eq!(h.status(1, write(0, 1)), dnr(Status::ZONE_INVALID_WRITE));
    let append = h.submit(1, rw(NvmOpcode::ZONE_APPEND, 2, ZSZE, 1, DATA, 0));
    assert_eq!((append.status(), append.dw0.get()), (ok, ZSZE as u32 + 2));
    assert_eq!(
        h.status(1, write(4 * ZSZE + 1, 1)),
        dnr(Status::ZONE_IS_FULL)
    );
}

/// A write whose completion the crash forestalled (its write word never
/// cleared) is undone: its zone's write pointer goes back to its start,
/// so the host's retry there succeeds; a zone it filled goes back to
/// empty. A write completed before it stays.
#[test]
fn a_write_not_completed_at_the_crash_is_undone_to_its_start() {
    let (mut h, backend, rec, saved) = recorded_zoned_host();
    let ok = Status::SUCCESS;
    assert_eq!(h.status(1, write(0, 4)), ok);
    // From here the clearing of write words is lost, as if each write's
    // completion came after the crash.
    rec.with(|k| k.unsettled = true);
    assert_eq!(h.status(1, write(4, 2)), ok);
    assert_eq!(h.status(1, write_zeroes(ZSZE, ZSZE as u32)), ok);
    assert_eq!(h.zone_state(0), (zone_state::IMPLICITLY_OPENED, 6));
    assert_eq!(h.zone_state(1), (zone_state::FULL, 2 * ZSZE));

    crash_zoned(&mut h, &rec, &saved, &backend);
    assert_eq!(h.zone_state(0), (zone_state::IMPLICITLY_OPENED, 4));
    assert_eq!(h.zone_state(1), (zone_state::EMPTY, ZSZE));
    assert_eq!(h.status(1, write(4, 2)), ok, "the retry");
    assert_eq!(
        h.status(1, write_zeroes(ZSZE, ZSZE as u32)),
        ok,
        "the retry"
    );
}

/// A zone descriptor extension (which no zone word holds) set after the
/// slot: its completion is owed until a checkpoint holds it, and the
/// extended report after the crash returns it. Failed before it counted as
/// a state change: posted at once, the extension in no slot.
#[test]
fn a_zone_extension_the_host_saw_set_survives_the_crash() {
    let (mut h, backend, rec, _) = recorded_zoned_host();
    let data: Vec<u8> = (0..EXT as u8).collect();
    h.mem.write(GuestAddress(DATA), &data).unwrap();
    let cid = h.push(1, set_ext(3 * ZSZE, false));
    h.ring_sq(1);
    await_ran(&h, &rec, 1, cid);
    assert_eq!(
        h.peek_cqe(1),
        None,
        "posted before a slot held the extension"
    );
    let saved = checkpoint(&h, &rec);
    let c = h.reap(1);
    assert_eq!((c.cid(), c.status()), (cid, Status::SUCCESS));
    crash_zoned(&mut h, &rec, &saved, &backend);
    let (_, zones) = h.ext_report(0, zrasf::ALL, false);
    assert_eq!((zones[3].0.za, &zones[3].1), (za::ZDEV, &data));
    assert_eq!(h.zone_state(3), (zone_state::CLOSED, 3 * ZSZE));
}
