//! Zoned namespaces through the driver: Report Zones, the zone actions
//! and Zone Append against the controller's zone state machine.

use vnvme_controller::DoorbellMode;
use vnvme_driver::{Error, InitOptions};
use vnvme_spec::zns::{zone_state, zrasf, zsa};
use vnvme_spec::Status;

use crate::rig::{device, pattern, start};

/// 16 MiB in 1 MiB zones of 4 KiB blocks: 16 zones of 256 blocks.
const NS: &str = "16M:ram,zoned,zone-size=1M,max-open=2";
const ZSZE: u64 = 256;

fn status(e: Error) -> Status {
    e.status().expect("a device status")
}

#[test]
fn zones_are_reported_written_appended_and_reset() {
    let rig = start(device(DoorbellMode::Trap), &[NS], InitOptions::default());
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let report = rig.access.dma_alloc(4096).unwrap();
    let r = q.report_zones(1, 0, zrasf::ALL, false, &report).unwrap();
    assert_eq!((r.nr_zones, r.zones.len()), (16, 16));
    assert!(r.zones.iter().all(|z| z.state() == zone_state::EMPTY));
    assert_eq!(r.zones[3].zslba.get(), 3 * ZSZE);

    // A write at zone 1's write pointer, then two appends after it.
    let data = rig.access.dma_alloc(8192).unwrap();
    data.write_bytes(0, &pattern(8192, 3)).unwrap();
    q.write(1, ZSZE, 1, &data).unwrap();
    assert_eq!(q.zone_append(1, ZSZE, 2, &data).unwrap(), ZSZE + 1);
    assert_eq!(q.zone_append(1, ZSZE, 1, &data).unwrap(), ZSZE + 3);
    let mut back = rig.access.dma_alloc(8192).unwrap();
    q.read(1, ZSZE + 1, 2, &mut back).unwrap();
    assert_eq!(back.to_vec(), pattern(8192, 3));
    let off_pointer = q.write(1, ZSZE, 1, &data).unwrap_err();
    assert!(status(off_pointer).same_code(Status::ZONE_INVALID_WRITE));
    let not_a_zone_start = q.zone_append(1, ZSZE + 1, 1, &data).unwrap_err();
    assert!(status(not_a_zone_start).same_code(Status::INVALID_FIELD));

    let r = q.report_zones(1, ZSZE, zrasf::ALL, true, &report).unwrap();
    assert_eq!(r.nr_zones, 15, "partial: the descriptors returned");
    assert_eq!(
        (r.zones[0].state(), r.zones[0].wp.get()),
        (zone_state::IMPLICITLY_OPENED, ZSZE + 4)
    );

    // Actions: finish zone 1, open 2 explicitly; reset all.
    q.zone_action(1, ZSZE, zsa::FINISH, false).unwrap();
    q.zone_action(1, 2 * ZSZE, zsa::OPEN, false).unwrap();
    let r = q.report_zones(1, 0, zrasf::FULL, false, &report).unwrap();
    assert_eq!((r.nr_zones, r.zones[0].zslba.get()), (1, ZSZE));
    let closing_empty = q.zone_action(1, 0, zsa::CLOSE, false).unwrap_err();
    assert!(status(closing_empty).same_code(Status::INVALID_ZONE_STATE_TRANSITION));
    q.zone_action(1, 0, zsa::RESET, true).unwrap();
    let r = q.report_zones(1, 0, zrasf::EMPTY, false, &report).unwrap();
    assert_eq!(r.nr_zones, 16);
    q.read(1, ZSZE + 1, 2, &mut back).unwrap();
    assert!(
        back.to_vec().iter().all(|&b| b == 0),
        "reset zones read zeroes"
    );
}

#[test]
fn the_open_limit_closes_implicitly_opened_zones_for_the_driver() {
    let ns = "16M:ram,zoned,zone-size=1M,max-open=2,max-active=4";
    let rig = start(device(DoorbellMode::Trap), &[ns], InitOptions::default());
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let data = rig.access.dma_alloc(4096).unwrap();
    for zone in 0..4 {
        q.write(1, zone * ZSZE, 1, &data).unwrap();
    }
    let report = rig.access.dma_alloc(4096).unwrap();
    let r = q
        .report_zones(1, 0, zrasf::IMPLICITLY_OPENED, false, &report)
        .unwrap();
    assert_eq!(r.nr_zones, 2, "max-open=2");
    let r = q.report_zones(1, 0, zrasf::CLOSED, false, &report).unwrap();
    assert_eq!(r.nr_zones, 2);
    let fifth = q.write(1, 4 * ZSZE, 1, &data).unwrap_err();
    assert!(status(fifth).same_code(Status::TOO_MANY_ACTIVE_ZONES));
    // A report buffer shorter than its header is refused before sending.
    let tiny = rig.access.dma_alloc(32).unwrap();
    assert!(matches!(
        q.report_zones(1, 0, 0, false, &tiny),
        Err(Error::InvalidRequest(_))
    ));
}

/// A file removed when the test ends, however it ends.
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_zone_reset_punches_a_hole_in_a_file_backend() {
    use std::os::unix::fs::MetadataExt;
    let file = TempFile(std::env::temp_dir().join(format!("vnvme-zns-{}.img", std::process::id())));
    let ns = format!("16M:file={},zoned,zone-size=1M", file.0.display());
    let rig = start(device(DoorbellMode::Trap), &[&ns], InitOptions::default());
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let allocated = || std::fs::metadata(&file.0).unwrap().blocks() * 512;
    // A zoned namespace starts empty: the file was punched through.
    let empty = allocated();
    let data = rig.access.dma_alloc(32 * 4096).unwrap();
    data.write_bytes(0, &pattern(32 * 4096, 9)).unwrap();
    for i in 0..8 {
        q.write(1, i * 32, 32, &data).unwrap();
    }
    q.flush(1).unwrap();
    let written = allocated();
    assert!(written >= empty + (1 << 20), "{empty} -> {written} bytes");
    let report = rig.access.dma_alloc(4096).unwrap();
    let r = q.report_zones(1, 0, zrasf::FULL, false, &report).unwrap();
    assert_eq!(r.nr_zones, 1, "zone 0 full");
    q.zone_action(1, 0, zsa::RESET, false).unwrap();
    let reset = allocated();
    assert!(
        reset + (1 << 20) <= written,
        "{written} -> {reset} bytes: no hole"
    );
    let mut back = rig.access.dma_alloc(32 * 4096).unwrap();
    q.read(1, 64, 32, &mut back).unwrap();
    assert!(back.to_vec().iter().all(|&b| b == 0));
}

#[test]
fn zone_descriptor_extensions_are_set_and_reported_through_the_driver() {
    let ns = "16M:ram,zoned,zone-size=1M,zone-ext=64";
    let rig = start(device(DoorbellMode::Trap), &[ns], InitOptions::default());
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let ext = rig.access.dma_alloc(4096).unwrap();
    ext.write_bytes(0, &pattern(64, 9)).unwrap();
    q.set_zone_extension(1, 2 * ZSZE, &ext, 64).unwrap();
    let again = q.set_zone_extension(1, 2 * ZSZE, &ext, 64).unwrap_err();
    assert!(status(again).same_code(Status::INVALID_ZONE_STATE_TRANSITION));
    let report = rig.access.dma_alloc(4096).unwrap();
    let r = q
        .report_zones_extended(1, 0, zrasf::ALL, false, 64, &report)
        .unwrap();
    // 128 bytes an entry: 31 fit after the header, all 16 here.
    assert_eq!(
        (r.nr_zones, r.zones.len(), r.extensions.len()),
        (16, 16, 16)
    );
    assert_eq!(
        (r.zones[2].state(), r.zones[2].za),
        (zone_state::CLOSED, 0x80)
    );
    assert_eq!(r.extensions[2], pattern(64, 9));
    assert_eq!(r.extensions[1], vec![0; 64]);
    // A plain report has no extensions; a reset clears the zone's.
    let r = q
        .report_zones(1, 2 * ZSZE, zrasf::ALL, true, &report)
        .unwrap();
    assert!(r.extensions.is_empty());
    q.zone_action(1, 2 * ZSZE, zsa::RESET, false).unwrap();
    let r = q
        .report_zones_extended(1, 2 * ZSZE, zrasf::ALL, true, 64, &report)
        .unwrap();
    assert_eq!((r.zones[0].za, r.extensions[0].clone()), (0, vec![0; 64]));
    assert!(matches!(
        q.report_zones_extended(1, 0, 0, false, 100, &report),
        Err(Error::InvalidRequest(_))
    ));
}

#[test]
fn without_extensions_the_extended_report_is_invalid_field() {
    let rig = start(device(DoorbellMode::Trap), &[NS], InitOptions::default());
    let mut q = rig.ctrl.take_io_queue(0).unwrap();
    let buf = rig.access.dma_alloc(4096).unwrap();
    let e = q
        .report_zones_extended(1, 0, zrasf::ALL, false, 64, &buf)
        .unwrap_err();
    assert!(status(e).same_code(Status::INVALID_FIELD));
    let e = q.set_zone_extension(1, 0, &buf, 64).unwrap_err();
    assert!(status(e).same_code(Status::INVALID_FIELD));
}
