use vnvme_spec::zns::{zone_state, zrasf};
use vnvme_spec::Status;

use super::{ZoneAction, ZonedConfig, ZonedError, Zones};

const ZONE: u64 = 64 << 10;
/// Blocks per zone at 4 KiB.
const ZSZE: u64 = 16;

fn zones(count: u64, f: impl FnOnce(&mut ZonedConfig)) -> Zones {
    let mut c = ZonedConfig::new(ZONE);
    f(&mut c);
    Zones::new(c, count * ZSZE + 3, 12).unwrap()
}

fn no_erase(_: u64) -> Result<(), Status> {
    Ok(())
}

fn state(z: &Zones, i: u64) -> u8 {
    let (_, d) = z.report(i * ZSZE, zrasf::ALL, true, 1).unwrap();
    d[0].state()
}

#[test]
fn namespace_is_whole_zones() {
    let z = zones(4, |_| {});
    assert_eq!((z.count, z.zsze, z.nsze()), (4, ZSZE, 4 * ZSZE));
}

#[test]
fn bad_configurations_are_refused() {
    let mut c = ZonedConfig::new(3 << 20);
    assert_eq!(c.validate(), Err(ZonedError::ZoneSize(3 << 20)));
    c = ZonedConfig::new(ZONE);
    c.zone_capacity = ZONE + 4096;
    assert!(matches!(c.validate(), Err(ZonedError::ZoneCapacity { .. })));
    c = ZonedConfig::new(ZONE);
    c.max_open = Some(3);
    c.max_active = Some(2);
    assert!(matches!(
        c.validate(),
        Err(ZonedError::OpenAboveActive { .. })
    ));
    c.max_active = Some(0);
    assert_eq!(c.validate(), Err(ZonedError::ZeroLimit));
    assert!(matches!(
        Zones::new(ZonedConfig::new(ZONE), ZSZE - 1, 12),
        Err(ZonedError::NoZone { .. })
    ));
    let mut c = ZonedConfig::new(ZONE);
    c.max_open = Some(5);
    assert!(matches!(
        Zones::new(c, 4 * ZSZE, 12),
        Err(ZonedError::LimitAboveZones { .. })
    ));
}

#[test]
fn writes_follow_the_write_pointer_and_fill_the_zone() {
    let z = zones(4, |_| {});
    assert_eq!(z.write(ZSZE, 4), Ok(()));
    assert_eq!(state(&z, 1), zone_state::IMPLICITLY_OPENED);
    assert_eq!(z.resources(), (1, 1));
    assert_eq!(
        z.write(ZSZE, 1).unwrap_err().raw(),
        Status::ZONE_INVALID_WRITE.with_dnr(true).raw()
    );
    assert_eq!(
        z.write(ZSZE + 4, 13),
        Err(Status::ZONE_BOUNDARY_ERROR.with_dnr(true))
    );
    assert_eq!(z.write(ZSZE + 4, 12), Ok(()));
    assert_eq!(state(&z, 1), zone_state::FULL);
    assert_eq!(z.resources(), (0, 0));
    assert_eq!(z.write(ZSZE, 1), Err(Status::ZONE_IS_FULL.with_dnr(true)));
}

#[test]
fn appends_return_where_they_wrote() {
    let z = zones(2, |_| {});
    assert_eq!(z.append(0, 3), Ok(0));
    assert_eq!(z.append(0, 5), Ok(3));
    assert_eq!(z.append(1, 1), Err(Status::INVALID_FIELD.with_dnr(true)));
    assert_eq!(
        z.append(0, 9),
        Err(Status::ZONE_BOUNDARY_ERROR.with_dnr(true))
    );
    assert_eq!(z.append(0, 8), Ok(8));
    assert_eq!(state(&z, 0), zone_state::FULL);
}

#[test]
fn the_open_limit_closes_the_oldest_implicitly_opened_zone() {
    let z = zones(4, |c| c.max_open = Some(2));
    z.write(0, 1).unwrap();
    z.write(ZSZE, 1).unwrap();
    z.write(2 * ZSZE, 1).unwrap();
    assert_eq!(state(&z, 0), zone_state::CLOSED);
    assert_eq!(z.resources(), (2, 3));
    // Explicitly opened zones are never closed for another.
    let z = zones(4, |c| c.max_open = Some(2));
    let mut e = no_erase;
    z.send(ZoneAction::Open, false, 0, &mut e).unwrap();
    z.send(ZoneAction::Open, false, ZSZE, &mut e).unwrap();
    assert_eq!(
        z.write(2 * ZSZE, 1),
        Err(Status::TOO_MANY_OPEN_ZONES.with_dnr(true))
    );
    assert_eq!(
        z.send(ZoneAction::Open, false, 2 * ZSZE, &mut e),
        Err(Status::TOO_MANY_OPEN_ZONES.with_dnr(true))
    );
}

#[test]
fn the_active_limit_refuses_a_new_zone() {
    let z = zones(4, |c| {
        c.max_open = Some(1);
        c.max_active = Some(2);
    });
    z.write(0, 1).unwrap();
    z.write(ZSZE, 1).unwrap();
    assert_eq!(z.resources(), (1, 2));
    assert_eq!(
        z.write(2 * ZSZE, 1),
        Err(Status::TOO_MANY_ACTIVE_ZONES.with_dnr(true))
    );
    let mut e = no_erase;
    assert_eq!(
        z.send(ZoneAction::Finish, false, 2 * ZSZE, &mut e),
        Err(Status::TOO_MANY_ACTIVE_ZONES.with_dnr(true))
    );
    // A closed zone reopens without a new active resource.
    z.write(1, 1).unwrap();
    z.send(ZoneAction::Finish, false, 0, &mut e).unwrap();
    assert_eq!(z.resources(), (0, 1));
    z.write(2 * ZSZE, 1).unwrap();
}

#[test]
fn zone_actions_move_states_and_refuse_invalid_transitions() {
    let z = zones(4, |c| c.read_only_zones = 1);
    let mut erased = Vec::new();
    let mut e = |lba: u64| {
        erased.push(lba);
        Ok(())
    };
    let invalid = Err(Status::INVALID_ZONE_STATE_TRANSITION.with_dnr(true));
    assert_eq!(z.send(ZoneAction::Close, false, 0, &mut e), invalid);
    z.send(ZoneAction::Open, false, 0, &mut e).unwrap();
    assert_eq!(state(&z, 0), zone_state::EXPLICITLY_OPENED);
    z.write(0, 2).unwrap();
    z.send(ZoneAction::Close, false, 0, &mut e).unwrap();
    assert_eq!(state(&z, 0), zone_state::CLOSED);
    z.send(ZoneAction::Finish, false, 0, &mut e).unwrap();
    assert_eq!(state(&z, 0), zone_state::FULL);
    assert_eq!(z.send(ZoneAction::Open, false, 0, &mut e), invalid);
    z.send(ZoneAction::Reset, false, 0, &mut e).unwrap();
    assert_eq!(state(&z, 0), zone_state::EMPTY);
    assert_eq!(z.resources(), (0, 0));
    assert_eq!(
        z.send(ZoneAction::Open, false, 1, &mut e),
        Err(Status::INVALID_FIELD.with_dnr(true))
    );
    // The read-only zone: no writes, only Offline.
    assert_eq!(state(&z, 3), zone_state::READ_ONLY);
    assert_eq!(
        z.write(3 * ZSZE, 1),
        Err(Status::ZONE_IS_READ_ONLY.with_dnr(true))
    );
    assert_eq!(z.send(ZoneAction::Reset, false, 3 * ZSZE, &mut e), invalid);
    assert_eq!(z.send(ZoneAction::Offline, false, 0, &mut e), invalid);
    assert_eq!(z.check_read(3 * ZSZE, 1), Ok(()));
    z.send(ZoneAction::Offline, true, 0, &mut e).unwrap();
    assert_eq!(state(&z, 3), zone_state::OFFLINE);
    assert_eq!(
        z.check_read(3 * ZSZE - 1, 2),
        Err(Status::ZONE_IS_OFFLINE.with_dnr(true))
    );
    assert_eq!(
        z.write(3 * ZSZE, 1),
        Err(Status::ZONE_IS_OFFLINE.with_dnr(true))
    );
    assert_eq!(erased, vec![0]);
}

#[test]
fn select_all_acts_on_the_zones_in_its_states_only() {
    let z = zones(4, |_| {});
    let mut erased = Vec::new();
    let mut e = |lba: u64| {
        erased.push(lba);
        Ok(())
    };
    z.write(0, 1).unwrap();
    z.write(ZSZE, 1).unwrap();
    z.send(ZoneAction::Close, true, 0, &mut e).unwrap();
    assert_eq!(
        (state(&z, 0), state(&z, 1)),
        (zone_state::CLOSED, zone_state::CLOSED)
    );
    assert_eq!(state(&z, 2), zone_state::EMPTY);
    z.send(ZoneAction::Open, true, 0, &mut e).unwrap();
    assert_eq!(z.resources(), (2, 2));
    z.send(ZoneAction::Finish, true, 0, &mut e).unwrap();
    assert_eq!(
        state(&z, 2),
        zone_state::EMPTY,
        "Finish all skips empty zones"
    );
    assert_eq!(z.resources(), (0, 0));
    z.send(ZoneAction::Reset, true, 0, &mut e).unwrap();
    assert_eq!(erased, vec![0, ZSZE]);
    let (n, _) = z.report(0, zrasf::EMPTY, false, 0).unwrap();
    assert_eq!(n, 4);
}

#[test]
fn reports_filter_and_count() {
    let z = zones(8, |_| {});
    z.write(2 * ZSZE, 3).unwrap();
    z.write(5 * ZSZE, 16).unwrap();
    let (n, d) = z.report(0, zrasf::ALL, false, 2).unwrap();
    assert_eq!((n, d.len()), (8, 2));
    let (n, d) = z.report(ZSZE + 5, zrasf::ALL, true, 100).unwrap();
    assert_eq!((n, d.len()), (7, 7));
    assert_eq!(d[0].zslba.get(), ZSZE);
    assert_eq!(d[1].wp.get(), 2 * ZSZE + 3);
    let (n, d) = z.report(0, zrasf::FULL, false, 10).unwrap();
    assert_eq!((n, d[0].zslba.get()), (1, 5 * ZSZE));
    let (n, _) = z.report(0, zrasf::IMPLICITLY_OPENED, true, 0).unwrap();
    assert_eq!(n, 0);
    assert_eq!(
        z.report(8 * ZSZE, zrasf::ALL, false, 1).unwrap_err(),
        Status::LBA_OUT_OF_RANGE.with_dnr(true)
    );
}

#[test]
fn changed_zone_list_overflows_to_ffffh_and_a_read_clears_it() {
    let mut list = super::changed::ChangedZones::default();
    for zone in 0..511u64 {
        list.add(zone * ZSZE);
    }
    let page = list.page();
    assert_eq!(page[..2], 511u16.to_le_bytes());
    assert_eq!(page[8 + 510 * 8..], (510 * ZSZE).to_le_bytes());
    list.add(511 * ZSZE);
    let page = list.page();
    assert_eq!(page[..2], [0xFF, 0xFF], "more than 511");
    assert!(page[2..].iter().all(|&b| b == 0), "and none listed");
    list.acknowledge(&page);
    list.add(0);
    let page = list.page();
    assert_eq!(
        (page[..2].to_vec(), page[8..16].to_vec()),
        (vec![1, 0], vec![0; 8])
    );
    // Zone 0's identifier is 0: the count, not a zero entry, ends the list.
    list.acknowledge(&page);
    assert_eq!(list.page()[..2], [0, 0]);
}

#[test]
fn extension_sizes_are_checked() {
    let mut c = ZonedConfig::new(ZONE);
    c.extension_size = 100;
    assert_eq!(c.validate(), Err(ZonedError::ExtensionSize(100)));
    c.extension_size = 256 * 64;
    assert_eq!(c.validate(), Err(ZonedError::ExtensionSize(256 * 64)));
    c.extension_size = 255 * 64;
    assert_eq!(c.validate(), Ok(()));
    // 8192 zones of 16320 bytes: more than 64 MiB.
    assert!(matches!(
        Zones::new(c, 8192 * ZSZE, 12),
        Err(ZonedError::ExtensionsTooLarge { .. })
    ));
}
