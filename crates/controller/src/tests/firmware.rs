//! Firmware Image Download and Firmware Commit: pieces in any order, gaps,
//! overlaps and bounds, slots (read only, empty, chosen by the controller),
//! activation at the next reset or at once, the slot log, FR and the
//! Firmware Activation Starting notice.

use vnvme_spec::log::firmware::{commit_action as ca, FirmwareSlotLog};

use super::*;
use crate::memory::GuestAddress;

/// Identify and log pages land here; image pieces are staged at `DATA`.
const PAGE: u64 = DATA + 0x40000;
/// The configured revision of slot 1's image, as FR pads it.
const FACTORY: &[u8; 8] = b"FACTORY ";
/// The Firmware Activation Starting notice as an AER completes with it:
/// type 2 (notice), information 01h, log page 03h.
const FW_ACTIVATION_EVENT: u32 = 0x0003_0102;
const MIB: u32 = 1 << 20;

impl Host {
    /// Firmware Image Download of `data` (at most two pages) at byte
    /// `offset`.
    fn fw_download(&mut self, offset: u32, data: &[u8]) -> Status {
        self.mem.write(GuestAddress(DATA), data).unwrap();
        let mut c = cmd(AdminOpcode::FIRMWARE_IMAGE_DOWNLOAD.0);
        c.prp1 = U64::new(DATA);
        c.prp2 = U64::new(DATA + 4096);
        c.cdw10 = U32::new(data.len() as u32 / 4 - 1);
        c.cdw11 = U32::new(offset / 4);
        self.admin(c).status()
    }

    fn fw_commit(&mut self, fs: u8, action: u8) -> Status {
        self.admin(commit(fs, action)).status()
    }

    fn fw_log(&mut self, rae: bool) -> FirmwareSlotLog {
        let mut c = get_log(0x03, 128, 0, PAGE);
        if rae {
            c.cdw10 = U32::new(c.cdw10.get() | 1 << 15);
        }
        assert_eq!(self.admin(c).status(), Status::SUCCESS);
        FirmwareSlotLog::read_from_bytes(&self.read_mem(PAGE, 512)).unwrap()
    }

    fn id_ctrl(&mut self) -> IdentifyController {
        assert_eq!(self.admin(identify(1, 0, PAGE)).status(), Status::SUCCESS);
        IdentifyController::read_from_bytes(&self.read_mem(PAGE, 4096)).unwrap()
    }

    /// Downloads `image` in 4 KiB pieces, last first.
    fn download_backwards(&mut self, image: &[u8]) {
        let pieces: Vec<_> = image.chunks(4096).enumerate().collect();
        for (i, piece) in pieces.into_iter().rev() {
            let s = self.fw_download(i as u32 * 4096, piece);
            assert_eq!(s, Status::SUCCESS, "piece {i}");
        }
    }
}

fn commit(fs: u8, action: u8) -> Command {
    let mut c = cmd(AdminOpcode::FIRMWARE_COMMIT.0);
    c.cdw10 = U32::new(u32::from(fs) | (u32::from(action) << 3));
    c
}

/// An image of `len` bytes that names itself `name`.
fn image(name: &[u8; 8], len: usize) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
    v[..8].copy_from_slice(name);
    v
}

fn enabled() -> Host {
    let config = ControllerConfig {
        firmware: "FACTORY".into(),
        ..config()
    };
    let mut h = Host::with(config, 512);
    h.enable();
    h
}

const RESET_OUTCOME: Status = Status::FIRMWARE_ACTIVATION_REQUIRES_RESET;

fn invalid(s: Status) -> Status {
    s.with_dnr(true)
}

#[test]
fn identify_controller_reports_three_slots_activation_without_reset_and_fwug() {
    let mut h = enabled();
    let id = h.id_ctrl();
    assert_ne!(id.oacs.get() & (1 << 2), 0, "OACS: firmware commands");
    // Slot 1 read only, NOFS 3, activation without reset.
    assert_eq!(id.frmw, 0x01 | (3 << 1) | (1 << 4));
    assert_eq!((id.fwug, id.mtfa.get()), (1, 1));
    assert_ne!(
        id.oaes.get() & (1 << 9),
        0,
        "OAES: firmware activation notices"
    );
    assert_eq!(&id.fr, FACTORY);
    let log = h.fw_log(false);
    assert_eq!(log.afi, 0x01);
    assert_eq!(&log.frs[0], FACTORY);
    assert_eq!(log.frs[1..], [[0u8; 8]; 6]);
}

#[test]
fn pieces_out_of_order_commit_then_the_reset_activates_them() {
    let mut h = enabled();
    h.download_backwards(&image(b"GUEST-02", 3 * 4096 + 100));
    assert_eq!(h.fw_commit(2, ca::REPLACE_AND_ACTIVATE), RESET_OUTCOME);
    assert!(!RESET_OUTCOME.dnr(), "a successful outcome: no DNR");
    let log = h.fw_log(false);
    assert_eq!(log.afi, 0x21, "slot 1 runs, slot 2 next");
    assert_eq!(&log.frs[1], b"GUEST-02");
    assert_eq!(&h.id_ctrl().fr, FACTORY, "runs only after the reset");
    h.reenable();
    assert_eq!(&h.id_ctrl().fr, b"GUEST-02");
    let log = h.fw_log(false);
    assert_eq!(log.afi, 0x02);
    assert_eq!((&log.frs[0], &log.frs[1]), (FACTORY, b"GUEST-02"));
    // The slots outlive further resets; the next one changes nothing.
    h.reenable();
    assert_eq!(h.fw_log(false).afi, 0x02);
}

#[test]
fn unnamed_image_gets_a_hash_revision() {
    let mut h = enabled();
    assert_eq!(h.fw_download(0, &[0u8; 512]), Status::SUCCESS);
    assert_eq!(h.fw_commit(3, ca::REPLACE), Status::SUCCESS);
    let frs = h.fw_log(false).frs[2];
    assert_eq!(
        frs,
        crate::subsystem::firmware::revision([&[0u8; 512][..]].into_iter())
    );
    assert_eq!(&frs[..2], b"VN");
}

#[test]
fn gap_is_invalid_firmware_image_and_discards_the_pieces() {
    let mut h = enabled();
    let img = image(b"GAPPED01", 3 * 4096);
    assert_eq!(h.fw_download(0, &img[..4096]), Status::SUCCESS);
    assert_eq!(h.fw_download(8192, &img[8192..]), Status::SUCCESS);
    let s = invalid(Status::INVALID_FIRMWARE_IMAGE);
    assert_eq!(h.fw_commit(2, ca::REPLACE), s);
    assert_eq!(h.fw_log(false).frs[1], [0; 8], "nothing placed");
    // Discarded: the same pieces download again, and now complete.
    h.download_backwards(&img);
    assert_eq!(h.fw_commit(2, ca::REPLACE), Status::SUCCESS);
    assert_eq!(&h.fw_log(false).frs[1], b"GAPPED01");
    // A short piece that is not the last leaves a gap too.
    assert_eq!(h.fw_download(0, &img[..100]), Status::SUCCESS);
    assert_eq!(h.fw_download(4096, &img[4096..8192]), Status::SUCCESS);
    assert_eq!(h.fw_commit(2, ca::REPLACE), s);
}

#[test]
fn overlapping_pieces_are_overlapping_range() {
    let mut h = enabled();
    let img = image(b"OVERLAP1", 4 * 4096);
    let overlap = invalid(Status::OVERLAPPING_RANGE);
    assert_eq!(h.fw_download(0, &img[..8192]), Status::SUCCESS);
    assert_eq!(h.fw_download(4096, &img[4096..8192]), overlap, "inside");
    assert_eq!(h.fw_download(0, &img[..4096]), overlap, "the same again");
    assert_eq!(h.fw_download(12288, &img[12288..]), Status::SUCCESS);
    // Between the two, reaching into the later piece.
    assert_eq!(h.fw_download(8192, &img[8192..]), overlap);
    assert_eq!(h.fw_download(8192, &img[8192..12288]), Status::SUCCESS);
    assert_eq!(h.fw_commit(2, ca::REPLACE), Status::SUCCESS);
    assert_eq!(&h.fw_log(false).frs[1], b"OVERLAP1");
}

#[test]
fn pieces_past_the_image_limit_unaligned_or_over_mdts_are_invalid_field() {
    let mut h = enabled();
    let field = invalid(Status::INVALID_FIELD);
    let piece = [0x5Au8; 4096];
    assert_eq!(h.fw_download(16 * MIB, &piece[..4]), field, "past 16 MiB");
    assert_eq!(h.fw_download(16 * MIB - 4096, &piece), Status::SUCCESS);
    assert_eq!(h.fw_download(4 * MIB + 4, &piece), field, "not on FWUG");
    // OFST FFFFFFFFh: an offset near 16 GiB, no overflow.
    let mut c = cmd(AdminOpcode::FIRMWARE_IMAGE_DOWNLOAD.0);
    c.prp1 = U64::new(DATA);
    c.cdw11 = U32::new(u32::MAX);
    assert_eq!(h.admin(c).status(), field);
    // NUMD one dword beyond MDTS (128 KiB by default).
    c.cdw10 = U32::new((128 << 10) / 4);
    c.cdw11 = U32::new(0);
    assert_eq!(h.admin(c).status(), field);
    // NUMD FFFFFFFFh: 16 GiB, refused before any data moves.
    c.cdw10 = U32::new(u32::MAX);
    assert_eq!(h.admin(c).status(), field);
    // The piece at the limit is one the commit finds a gap before.
    assert_eq!(
        h.fw_commit(2, ca::REPLACE),
        invalid(Status::INVALID_FIRMWARE_IMAGE)
    );
}

#[test]
fn slot_zero_lets_the_controller_choose_an_empty_slot_then_a_spare_one() {
    let mut h = enabled();
    h.download_backwards(&image(b"CHOSEN-A", 4096));
    assert_eq!(h.fw_commit(0, ca::REPLACE_AND_ACTIVATE), RESET_OUTCOME);
    assert_eq!(h.fw_log(false).afi, 0x21, "slot 2, the first empty one");
    h.download_backwards(&image(b"CHOSEN-B", 4096));
    assert_eq!(h.fw_commit(0, ca::REPLACE), Status::SUCCESS);
    let log = h.fw_log(false);
    assert_eq!((&log.frs[1], &log.frs[2]), (b"CHOSEN-A", b"CHOSEN-B"));
    h.reenable();
    // Slot 2 runs: a new image goes to slot 3, not over the running one.
    h.download_backwards(&image(b"CHOSEN-C", 4096));
    assert_eq!(h.fw_commit(0, ca::REPLACE), Status::SUCCESS);
    let log = h.fw_log(false);
    assert_eq!(log.afi, 0x02);
    assert_eq!((&log.frs[1], &log.frs[2]), (b"CHOSEN-A", b"CHOSEN-C"));
    // Activate with slot 0: the image last written.
    assert_eq!(h.fw_commit(0, ca::ACTIVATE), RESET_OUTCOME);
    assert_eq!(h.fw_log(false).afi, 0x32);
}

#[test]
fn read_only_and_missing_slots_are_invalid_firmware_slot() {
    let mut h = enabled();
    let slot = invalid(Status::INVALID_FIRMWARE_SLOT);
    h.download_backwards(&image(b"NOTSLOT1", 4096));
    for action in [
        ca::REPLACE,
        ca::REPLACE_AND_ACTIVATE,
        ca::REPLACE_AND_ACTIVATE_NOW,
    ] {
        assert_eq!(h.fw_commit(1, action), slot, "CA {action} to slot 1");
    }
    for fs in [4, 7] {
        assert_eq!(h.fw_commit(fs, ca::REPLACE), slot, "slot {fs}");
        assert_eq!(h.fw_commit(fs, ca::ACTIVATE), slot, "slot {fs}");
    }
    assert_eq!(&h.fw_log(false).frs[0], FACTORY, "slot 1 untouched");
    // The download survived the refusals.
    assert_eq!(h.fw_commit(3, ca::REPLACE), Status::SUCCESS);
    assert_eq!(&h.fw_log(false).frs[2], b"NOTSLOT1");
}

#[test]
fn activating_an_empty_slot_or_committing_nothing_is_invalid_firmware_image() {
    let mut h = enabled();
    let image_status = invalid(Status::INVALID_FIRMWARE_IMAGE);
    assert_eq!(h.fw_commit(3, ca::ACTIVATE), image_status);
    assert_eq!(h.fw_commit(3, ca::REPLACE_AND_ACTIVATE_NOW), image_status);
    assert_eq!(h.fw_commit(2, ca::REPLACE), image_status);
    assert_eq!(h.fw_commit(0, ca::REPLACE_AND_ACTIVATE), image_status);
    assert_eq!(h.fw_log(false).afi, 0x01);
    // Slot 1's factory image can be activated; it is not written.
    assert_eq!(h.fw_commit(1, ca::ACTIVATE), RESET_OUTCOME);
}

#[test]
fn boot_partition_and_reserved_actions_are_invalid_field() {
    let mut h = enabled();
    h.download_backwards(&image(b"BOOTPART", 4096));
    for action in [
        4,
        5,
        ca::REPLACE_BOOT_PARTITION,
        ca::ACTIVATE_BOOT_PARTITION,
    ] {
        let s = h.fw_commit(2, action);
        assert_eq!(s, invalid(Status::INVALID_FIELD), "CA {action}");
    }
}

#[test]
fn a_reset_discards_an_uncommitted_download() {
    let mut h = enabled();
    let img = image(b"DROPPED1", 8192);
    assert_eq!(h.fw_download(0, &img[..4096]), Status::SUCCESS);
    h.reenable();
    // Gone: the rest alone leaves a gap, and the start downloads again.
    assert_eq!(h.fw_download(4096, &img[4096..]), Status::SUCCESS);
    assert_eq!(
        h.fw_commit(2, ca::REPLACE),
        invalid(Status::INVALID_FIRMWARE_IMAGE)
    );
    h.download_backwards(&img);
    assert_eq!(h.fw_commit(2, ca::REPLACE), Status::SUCCESS);
}

#[test]
fn activate_action_loads_a_placed_image_at_the_reset() {
    let mut h = enabled();
    h.download_backwards(&image(b"PLACED-1", 4096));
    assert_eq!(h.fw_commit(2, ca::REPLACE), Status::SUCCESS);
    h.reenable();
    assert_eq!(&h.id_ctrl().fr, FACTORY, "placed, not activated");
    assert_eq!(h.fw_commit(2, ca::ACTIVATE), RESET_OUTCOME);
    h.reenable();
    assert_eq!(&h.id_ctrl().fr, b"PLACED-1");
    // Back to the factory image the same way.
    assert_eq!(h.fw_commit(1, ca::ACTIVATE), RESET_OUTCOME);
    h.reenable();
    assert_eq!((&h.id_ctrl().fr, h.fw_log(false).afi), (FACTORY, 0x01));
}

#[test]
fn immediate_activation_switches_fr_and_sends_the_notice_once_until_the_log_is_read() {
    let mut h = enabled();
    assert_eq!(
        h.admin(set_features(0x0B, 1 << 9)).status(),
        Status::SUCCESS
    );
    let aer = h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    h.ring_sq(0);
    h.download_backwards(&image(b"NOW-0001", 4096));
    let (c, mut others) = h.admin_collect(commit(2, ca::REPLACE_AND_ACTIVATE_NOW));
    assert_eq!(c.status(), Status::SUCCESS);
    if others.is_empty() {
        others.push(h.reap(0));
    }
    assert_eq!(
        (others[0].cid(), others[0].dw0.get()),
        (aer, FW_ACTIVATION_EVENT)
    );
    assert_eq!(&h.id_ctrl().fr, b"NOW-0001", "no reset needed");
    assert_eq!(h.fw_log(true).afi, 0x02);
    // Masked until the log is read without RAE: activating slot 1 now
    // completes no AER (events are delivered in the commit's own pass,
    // before the next command's).
    let aer = h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    h.ring_sq(0);
    let (c, others) = h.admin_collect(commit(1, ca::REPLACE_AND_ACTIVATE_NOW));
    assert_eq!(c.status(), Status::SUCCESS, "slot 1 activates: no download");
    let (_, more) = h.admin_collect(get_features(0x0B, 0, PAGE));
    assert!(others.is_empty() && more.is_empty(), "masked");
    assert_eq!(&h.id_ctrl().fr, FACTORY);
    assert_eq!(h.fw_log(false).afi, 0x01);
    let (c, mut others) = h.admin_collect(commit(2, ca::REPLACE_AND_ACTIVATE_NOW));
    assert_eq!(c.status(), Status::SUCCESS);
    if others.is_empty() {
        others.push(h.reap(0));
    }
    assert_eq!(
        (others[0].cid(), others[0].dw0.get()),
        (aer, FW_ACTIVATION_EVENT)
    );
}

#[test]
fn immediate_activation_without_firmware_notices_enabled_sends_nothing() {
    let mut h = enabled();
    // Namespace Attribute Notices only.
    assert_eq!(
        h.admin(set_features(0x0B, 1 << 8)).status(),
        Status::SUCCESS
    );
    h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    h.ring_sq(0);
    h.download_backwards(&image(b"QUIET-01", 4096));
    let (c, others) = h.admin_collect(commit(3, ca::REPLACE_AND_ACTIVATE_NOW));
    assert_eq!(c.status(), Status::SUCCESS);
    let (_, more) = h.admin_collect(get_features(0x0B, 0, PAGE));
    assert!(others.is_empty() && more.is_empty());
    assert_eq!(&h.id_ctrl().fr, b"QUIET-01");
    // And a later reset keeps it: slot 3 is the active slot now.
    h.reenable();
    assert_eq!((&h.id_ctrl().fr, h.fw_log(false).afi), (b"QUIET-01", 0x03));
}

#[test]
fn a_pending_activation_survives_a_client_reconnect_and_runs_after_it() {
    let mut h = enabled();
    h.download_backwards(&image(b"RECONNEC", 4096));
    assert_eq!(h.fw_commit(3, ca::REPLACE_AND_ACTIVATE), RESET_OUTCOME);
    h.ctrl.detach();
    h.ctrl.attach(h.mem.clone(), h.irq.clone());
    h.mem.zero(GuestAddress(ACQ), 4096).unwrap();
    h.enable();
    assert_eq!(&h.id_ctrl().fr, b"RECONNEC");
}
