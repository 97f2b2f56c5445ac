//! Log pages with content of their own: Supported Log Pages, telemetry
//! (host- and controller-initiated), Endurance Group Information and the
//! Persistent Event Log, read the way nvme-cli reads them (4 KiB pieces
//! at offsets, LSP actions, RAE).

use super::*;
use crate::memory::GuestAddress;

const TELEMETRY_HOST: u8 = 0x07;
const TELEMETRY_CTRL: u8 = 0x08;
const ENDURANCE: u8 = 0x09;
const PEL: u8 = 0x0D;
const ESTABLISH: u8 = 1;
const RELEASE: u8 = 2;

fn log_cmd(lid: u8, lsp: u8, lsi: u16, rae: bool, bytes: u32, offset: u64) -> Command {
    let mut c = get_log(lid, bytes / 4, offset, DATA);
    c.cdw10 = U32::new(c.cdw10.get() | u32::from(lsp) << 8 | u32::from(rae) << 15);
    c.cdw11 = U32::new(c.cdw11.get() | u32::from(lsi) << 16);
    c
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

impl Host {
    /// One Get Log Page of at most 4 KiB (PRP1 only).
    fn log(
        &mut self,
        lid: u8,
        lsp: u8,
        lsi: u16,
        rae: bool,
        bytes: u32,
        offset: u64,
    ) -> Result<Vec<u8>, Status> {
        assert!(bytes <= 4096);
        self.mem.zero(GuestAddress(DATA), 4096).unwrap();
        let c = self.admin(log_cmd(lid, lsp, lsi, rae, bytes, offset));
        if c.status().is_success() {
            Ok(self.read_mem(DATA, bytes as usize))
        } else {
            Err(c.status())
        }
    }

    /// `bytes` of a log in 4 KiB pieces, RAE set on all but the last one,
    /// as libnvme's `nvme_get_log_page` does.
    fn log_pieces(&mut self, lid: u8, lsp: u8, bytes: u32, rae: bool) -> Vec<u8> {
        let mut out = Vec::new();
        while (out.len() as u32) < bytes {
            let n = (bytes - out.len() as u32).min(4096);
            let last = out.len() as u32 + n == bytes;
            let piece = self.log(lid, lsp, 0, rae || !last, n, out.len() as u64);
            out.extend(piece.unwrap_or_else(|s| panic!("log {lid:#x} at {}: {s:?}", out.len())));
        }
        out
    }

    /// Establishes a Persistent Event Log context, reads the whole log in
    /// pieces and releases the context.
    fn persistent_event_log(&mut self) -> Vec<u8> {
        let header = self
            .log(PEL, ESTABLISH, 0, false, 512, 0)
            .expect("establish");
        let tll = le64(&header, 8) as u32;
        let page = self.log_pieces(PEL, 0, tll.next_multiple_of(4), false);
        assert_eq!(self.log(PEL, RELEASE, 0, false, 512, 0), Ok(vec![0; 512]));
        page[..tll as usize].to_vec()
    }

    fn bad_enable_then_recover(&mut self) {
        self.write32(offset::CC, 0);
        // AQA of one entry: the enable is refused with CSTS.CFS.
        self.enable_with(CC_ENABLE, ASQ, 0);
        assert!(self.csts().cfs());
        self.reenable();
    }
}

/// Counter `name` of a telemetry log's Data Area 1 (the log from block 0).
fn counter(log: &[u8], name: &str) -> u64 {
    let stats = crate::stats::Stats::new(1);
    let counters = crate::reporting::telemetry::counters(&stats, &stats.snapshot());
    let i = counters.iter().position(|(n, _)| *n == name).unwrap();
    le64(log, 512 + 24 + i * 8)
}

/// Events of a Persistent Event Log page: (type, timestamp, data).
fn events(page: &[u8]) -> Vec<(u8, u64, Vec<u8>)> {
    let count = le32(page, 4) as usize;
    let mut at = 512;
    let mut out = Vec::new();
    for _ in 0..count {
        let (ehl, el) = (usize::from(page[at + 2]), usize::from(le16(page, at + 22)));
        assert_eq!(ehl, 21, "event header length");
        let data = page[at + 3 + ehl..at + 3 + ehl + el].to_vec();
        out.push((page[at], le64(page, at + 6), data));
        at += 3 + ehl + el;
    }
    assert_eq!(at, page.len(), "TLL covers the header and every event");
    out
}

fn types(events: &[(u8, u64, Vec<u8>)]) -> Vec<u8> {
    events.iter().map(|e| e.0).collect()
}

#[test]
fn supported_log_pages_lists_exactly_the_logs_answered() {
    let mut h = Host::new();
    h.enable();
    let page = h.log(0x00, 0, 0, false, 1024, 0).unwrap();
    let listed: Vec<u8> = (0..=255u8)
        .filter(|&lid| le32(&page, usize::from(lid) * 4) & 1 != 0)
        .collect();
    assert_eq!(
        listed,
        [
            0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0C, 0x0D, 0x80, 0x81,
            0xBF
        ]
    );
    // No entry claims index offsets, and OT = 1 is refused.
    assert!((0..256).all(|i| le32(&page, i * 4) & 2 == 0));
    for lid in 0..=255u8 {
        // LSI 1 (the endurance group); LSP 0 (Read: the Persistent Event
        // Log answers Command Sequence Error without a context).
        let answered = h.log(lid, 0, 1, true, 512, 0) != Err(Status::INVALID_FIELD.with_dnr(true));
        assert_eq!(answered, listed.contains(&lid), "log {lid:#x}");
    }
    let mut c = log_cmd(0x02, 0, 0, false, 512, 0);
    c.cdw14 = U32::new(1 << 23);
    assert_eq!(h.admin(c).status(), Status::INVALID_FIELD.with_dnr(true));
}

#[test]
fn identify_reports_telemetry_pel_and_one_endurance_group() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(
        id.lpa & 0x1E,
        0x1E,
        "effects, extended data, telemetry, PEL"
    );
    assert_eq!(id.ctratt.get() & (1 << 4), 1 << 4, "endurance groups");
    assert_eq!(id.endgidmax.get(), 1);
    assert_eq!(id.pels.get(), 1, "64 KiB");
    assert_eq!(h.admin(identify(0, 1, DATA)).status(), Status::SUCCESS);
    let ns = IdentifyNamespace::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(ns.endgid.get(), 1);
}

#[test]
fn host_telemetry_creates_a_snapshot_of_counters_errors_and_queues() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    assert!(h
        .submit(1, rw(NvmOpcode::WRITE, 1, 0, 8, DATA, 0))
        .status()
        .is_success());
    // An error for the error records (data area 2).
    assert!(!h.admin(cmd(0x7E)).status().is_success());
    // Before any capture: a header without data.
    let before = h.log(TELEMETRY_HOST, 0, 0, false, 512, 0).unwrap();
    assert_eq!(
        (before[0], before[381], le16(&before, 12)),
        (TELEMETRY_HOST, 0, 0)
    );

    let header = h.log(TELEMETRY_HOST, 1, 0, false, 512, 0).unwrap();
    assert_eq!(header[0], TELEMETRY_HOST);
    assert_eq!(&header[5..8], &[0, 0, 0], "IEEE OUI as in Identify");
    let (lb1, lb2, lb3) = (le16(&header, 8), le16(&header, 10), le16(&header, 12));
    assert!(
        1 <= lb1 && lb1 < lb2 && lb2 < lb3,
        "three areas: {lb1} {lb2} {lb3}"
    );
    assert_eq!(le32(&header, 16), 0, "no data area 4");
    assert_eq!(header[381], 1, "host generation");
    assert_eq!(header[382], 0, "no controller-initiated data");
    assert_eq!(&header[384..399], b"host-initiated\0");

    let log = h.log_pieces(TELEMETRY_HOST, 0, (u32::from(lb3) + 1) * 512, false);
    assert_eq!(log[..512], header[..]);
    let area1 = &log[512..];
    assert_eq!(&area1[..8], b"VNVMETEL");
    assert_eq!(le32(area1, 8), 1, "layout version");
    assert_eq!(le32(area1, 12), 24, "counters");
    assert_eq!(counter(&log, "host_write_commands"), 1);
    assert_eq!(counter(&log, "sectors_written"), 8);
    assert_eq!(counter(&log, "enables"), 1);
    let area2 = &log[512 * (usize::from(lb1) + 1)..];
    let newest = vnvme_spec::log::ErrorLogEntry::read_from_bytes(&area2[..64]).unwrap();
    assert_eq!(newest.error_count.get(), 1);
    assert_eq!(
        newest.status.get() >> 1,
        Status::INVALID_OPCODE.with_dnr(true).raw()
    );
    // Queue records: qid, then commands at byte 40.
    let area3 = &log[512 * (usize::from(lb2) + 1)..];
    let io = &area3[crate::reporting::telemetry::QUEUE_RECORD..];
    assert_eq!(
        (le16(area3, 0), le16(io, 0)),
        (0, 1),
        "admin queue, then queue 1"
    );
    assert!(le64(area3, 40) >= 4, "admin commands");
    assert_eq!(le64(io, 40), 1, "queue 1 ran one command");

    // Without CTHID the same capture is read again; with it, a new one.
    let again = h.log(TELEMETRY_HOST, 0, 0, false, 512, 0).unwrap();
    assert_eq!(again, header);
    let newer = h.log(TELEMETRY_HOST, 1, 0, false, 512, 0).unwrap();
    assert_eq!(newer[381], 2);
}

#[test]
fn telemetry_offsets_areas_and_lsp_are_checked() {
    let mut h = Host::new();
    h.enable();
    let invalid = Err(Status::INVALID_FIELD.with_dnr(true));
    let header = h.log(TELEMETRY_HOST, 1, 0, false, 512, 0).unwrap();
    let lb3 = u64::from(le16(&header, 12));
    assert_eq!(
        h.log(TELEMETRY_HOST, 0, 0, false, 512, 256),
        invalid,
        "not a block"
    );
    assert_eq!(
        h.log(TELEMETRY_HOST, 0, 0, false, 512, (lb3 + 1) * 512),
        invalid,
        "past the end"
    );
    assert!(h.log(TELEMETRY_HOST, 0, 0, false, 512, lb3 * 512).is_ok());
    // MCDA 1: only data area 1 is created.
    let one = h.log(TELEMETRY_HOST, 1 | 1 << 1, 0, false, 512, 0).unwrap();
    assert_eq!(le16(&one, 8), le16(&one, 10));
    assert_eq!(le16(&one, 8), le16(&one, 12));
    assert_eq!(
        h.log(TELEMETRY_HOST, 1 | 5 << 1, 0, false, 512, 0),
        invalid,
        "MCDA 5"
    );
    assert_eq!(h.log(TELEMETRY_CTRL, 0, 0, false, 512, 4), invalid);
}

#[test]
fn controller_telemetry_is_captured_at_cfs_and_latched_until_released() {
    let mut h = Host::new();
    h.enable();
    let none = h.log(TELEMETRY_CTRL, 0, 0, true, 512, 0).unwrap();
    assert_eq!(
        (none[0], none[382], none[383], le16(&none, 12)),
        (TELEMETRY_CTRL, 0, 0, 0)
    );
    // Reading past the header of an empty log is refused.
    assert!(h.log(TELEMETRY_CTRL, 0, 0, true, 512, 512).is_err());

    h.bad_enable_then_recover();
    let header = h.log(TELEMETRY_CTRL, 0, 0, true, 512, 0).unwrap();
    assert_eq!(
        (header[382], header[383]),
        (1, 1),
        "available, generation 1"
    );
    let reason = String::from_utf8_lossy(&header[384..]);
    assert!(reason.starts_with("enable refused: AQA"), "{reason}");
    let lb3 = u32::from(le16(&header, 12));
    assert!(lb3 >= 1);
    // The host log tells of it too.
    let host = h.log(TELEMETRY_HOST, 0, 0, false, 512, 0).unwrap();
    assert_eq!((host[382], host[383]), (1, 1));

    // A second failure does not replace the first capture.
    h.bad_enable_then_recover();
    let header = h.log(TELEMETRY_CTRL, 0, 0, true, 512, 0).unwrap();
    assert_eq!((header[382], header[383]), (1, 1));
    // Read whole with RAE cleared on the last piece (libnvme): released.
    let log = h.log_pieces(TELEMETRY_CTRL, 0, (lb3 + 1) * 512, false);
    assert_eq!(counter(&log, "fatal_errors"), 1, "at the first failure");
    let after = h.log(TELEMETRY_CTRL, 0, 0, true, 512, 0).unwrap();
    assert_eq!((after[382], after[383], le16(&after, 8)), (0, 1, 0));

    // The next failure is captured again.
    h.bad_enable_then_recover();
    let header = h.log(TELEMETRY_CTRL, 0, 0, false, 512, 0).unwrap();
    assert_eq!((header[382], header[383]), (1, 2));
}

#[test]
fn endurance_group_log_is_the_controllers_usage_for_group_1_only() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    for _ in 0..3 {
        assert!(h
            .submit(1, rw(NvmOpcode::WRITE, 1, 0, 4, DATA, 0))
            .status()
            .is_success());
    }
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 2, DATA, 0))
        .status()
        .is_success());
    let invalid = Err(Status::INVALID_FIELD.with_dnr(true));
    assert_eq!(h.log(ENDURANCE, 0, 0, false, 512, 0), invalid, "group 0");
    assert_eq!(h.log(ENDURANCE, 0, 2, false, 512, 0), invalid, "group 2");
    let eg = h.log(ENDURANCE, 0, 1, false, 512, 0).unwrap();
    let smart = h.log(0x02, 0, 0, false, 512, 0).unwrap();
    assert_eq!(eg[3], 100, "available spare");
    assert_eq!(le64(&eg, 48), le64(&smart, 32), "data units read");
    assert_eq!(le64(&eg, 64), le64(&smart, 48), "data units written");
    assert_eq!(
        le64(&eg, 64),
        1,
        "12 sectors written: one data unit, rounded up"
    );
    assert_eq!(le64(&eg, 96), 1, "host read commands");
    assert_eq!(le64(&eg, 112), 3, "host write commands");
    let capacity = NS_BLOCKS * 512;
    assert_eq!(le64(&eg, 160), capacity, "TEGCAP");
    assert_eq!(le64(&eg, 176), 0, "UEGCAP: all allocated");
}

#[test]
fn persistent_event_log_context_actions() {
    let mut h = Host::new();
    h.enable();
    let sequence = Err(Status::COMMAND_SEQUENCE_ERROR.with_dnr(true));
    assert_eq!(
        h.log(PEL, 0, 0, false, 512, 0),
        sequence,
        "read without a context"
    );
    assert_eq!(
        h.log(PEL, 3, 0, false, 512, 0),
        Err(Status::INVALID_FIELD.with_dnr(true))
    );
    // nvme-cli's default action 0xff arrives as LSP 7Fh: action 11b.
    assert_eq!(
        h.log(PEL, 0x7F, 0, false, 512, 0),
        Err(Status::INVALID_FIELD.with_dnr(true))
    );
    let header = h.log(PEL, ESTABLISH, 0, false, 512, 0).unwrap();
    assert_eq!(header[0], PEL);
    assert_eq!(header[16], 1, "log revision");
    assert_eq!(le16(&header, 18), 492, "log header length");
    assert_eq!(
        le64(&header, 44),
        1,
        "power cycle count: one client attached"
    );
    assert_eq!(&header[56..65], b"VNVME0001");
    assert_eq!(&header[116..138], b"nqn.2024-01.io.vnvme:V");
    assert_eq!(
        le32(&header, 374),
        1 << 18 | 1 << 16,
        "context exists, port"
    );
    assert_eq!(
        header[480],
        1 << 2 | 1 << 4 | 1 << 6 | 1 << 7,
        "events 02h, 04h, 06h, 07h"
    );
    assert_eq!(
        header[481],
        1 << 0 | 1 << 1 | 1 << 2 | 1 << 4,
        "events 08h, 09h, 0Ah, 0Ch"
    );
    assert_eq!(
        h.log(PEL, ESTABLISH, 0, false, 512, 0),
        sequence,
        "already established"
    );
    // The context is a snapshot: an event now does not change it.
    let tll = le64(&header, 8);
    h.reenable();
    assert_eq!(
        h.log(PEL, 0, 0, false, 512, 0),
        sequence,
        "a reset released the context"
    );
    let page = h.persistent_event_log();
    assert!(page.len() as u64 > tll);
    assert_eq!(h.log(PEL, 0, 0, false, 512, 0), sequence, "released");
    assert_eq!(
        h.log(PEL, RELEASE, 0, false, 512, 0),
        Ok(vec![0; 512]),
        "release again"
    );
}

#[test]
fn persistent_events_record_power_on_resets_format_and_namespace_changes() {
    let config = ControllerConfig {
        max_namespaces: 4,
        nvm_capacity: 4 * NS_BLOCKS * 512,
        ..config()
    };
    let mut h = Host::with(config, 512);
    h.enable();
    h.reenable();
    let mut c = cmd(AdminOpcode::FORMAT_NVM.0);
    c.nsid = U32::new(1);
    c.cdw10 = U32::new(3);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    // Create a namespace (64 blocks, format 0) and delete it.
    h.mem.zero(GuestAddress(DATA + 0x10000), 4096).unwrap();
    h.mem
        .write(GuestAddress(DATA + 0x10000), &64u64.to_le_bytes())
        .unwrap();
    h.mem
        .write(GuestAddress(DATA + 0x10008), &64u64.to_le_bytes())
        .unwrap();
    let mut c = cmd(AdminOpcode::NAMESPACE_MANAGEMENT.0);
    c.prp1 = U64::new(DATA + 0x10000);
    let created = h.admin(c);
    assert_eq!(created.status(), Status::SUCCESS);
    let nsid = created.dw0.get();
    let mut c = cmd(AdminOpcode::NAMESPACE_MANAGEMENT.0);
    c.nsid = U32::new(nsid);
    c.cdw10 = U32::new(1);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);

    let ev = events(&h.persistent_event_log());
    assert_eq!(types(&ev), [0x04, 0x04, 0x07, 0x08, 0x06, 0x06]);
    // The reset restarted the Timestamp: the events after it are in order.
    assert!(
        ev[2..].windows(2).all(|w| w[0].1 <= w[1].1),
        "in time order"
    );
    let (power_on, reset) = (&ev[0].2, &ev[1].2);
    assert_eq!(power_on.len(), 8 + 36);
    assert_eq!(le32(power_on, 8 + 16), 0, "power cycle count at creation");
    assert_eq!(le32(reset, 8 + 16), 1, "power cycle count at the reset");
    assert_eq!(le16(reset, 8), 1, "CNTLID");
    assert_eq!(
        &reset[..8],
        format!("{:<8}", env!("CARGO_PKG_VERSION")).as_bytes()
    );
    let (start, done) = (&ev[2].2, &ev[3].2);
    assert_eq!((le32(start, 0), le32(start, 8)), (1, 3), "NSID and CDW10");
    assert_eq!(
        (le32(done, 0), done[5], le32(done, 8)),
        (1, 0, 0),
        "completed"
    );
    let (create, delete) = (&ev[4].2, &ev[5].2);
    assert_eq!(
        (le32(create, 0), le64(create, 8), le32(create, 44)),
        (0, 64, nsid)
    );
    assert_eq!((le32(delete, 0), le32(delete, 44)), (1, nsid));
}

#[test]
fn persistent_events_record_firmware_commits_and_a_sanitize() {
    let config = ControllerConfig {
        firmware: "FACTORY".into(),
        ..config()
    };
    let mut h = Host::with(config, 512);
    h.enable();
    let image: Vec<u8> = b"NEWFW001".iter().copied().cycle().take(4096).collect();
    h.mem.write(GuestAddress(DATA + 0x20000), &image).unwrap();
    let mut c = cmd(AdminOpcode::FIRMWARE_IMAGE_DOWNLOAD.0);
    c.prp1 = U64::new(DATA + 0x20000);
    c.cdw10 = U32::new(4096 / 4 - 1);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    let commit = |fs: u32, ca: u32| {
        let mut c = cmd(AdminOpcode::FIRMWARE_COMMIT.0);
        c.cdw10 = U32::new(fs | ca << 3);
        c
    };
    assert_eq!(h.admin(commit(2, 0)).status(), Status::SUCCESS);
    let refused = h.admin(commit(1, 0)).status();
    assert_eq!(refused, Status::INVALID_FIRMWARE_SLOT.with_dnr(true));
    // Block erase, then wait for its completion event.
    let mut c = cmd(AdminOpcode::SANITIZE.0);
    c.cdw10 = U32::new(2);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    let deadline = Instant::now() + Duration::from_secs(10);
    let ev = loop {
        let ev = events(&h.persistent_event_log());
        if types(&ev).contains(&0x0A) {
            break ev;
        }
        assert!(Instant::now() < deadline, "no sanitize completion event");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(types(&ev), [0x04, 0x02, 0x02, 0x09, 0x0A]);
    let (placed, failed) = (&ev[1].2, &ev[2].2);
    assert_eq!(placed.len(), 22);
    assert_eq!(&placed[..8], b"FACTORY ", "old revision");
    assert_eq!(&placed[8..16], b"NEWFW001", "new revision");
    assert_eq!(
        (placed[16], placed[17], placed[18], placed[19]),
        (0, 2, 0, 0)
    );
    let sf = (refused.sct(), refused.sc());
    assert_eq!(&failed[8..16], &[0; 8], "no slot committed");
    assert_eq!((failed[17], failed[18], failed[19]), (1, sf.0, sf.1));
    let (start, done) = (&ev[3].2, &ev[4].2);
    assert_eq!(le32(start, 4), 2, "Sanitize CDW10");
    assert_ne!(le32(start, 0), 0, "SANICAP");
    assert_eq!(le16(done, 0), 0xFFFF, "SPROG: not in progress");
    assert_eq!(le16(done, 2) & 0x7, 1, "SSTAT: completed");
}

#[test]
fn persistent_events_carry_the_timestamp_the_host_set_and_a_reset_clears() {
    let mut h = Host::with(config(), 512);
    h.enable();
    let set_to: u64 = 1_700_000_000_000;
    h.mem
        .write(GuestAddress(DATA + 0x20000), &set_to.to_le_bytes())
        .unwrap();
    let mut c = set_features(0x0E, 0);
    c.prp1 = U64::new(DATA + 0x20000);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    let mut c = cmd(AdminOpcode::FORMAT_NVM.0);
    c.nsid = U32::new(1);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    h.reenable();
    let page = h.persistent_event_log();
    let ev = events(&page);
    assert_eq!(types(&ev), [0x04, 0x07, 0x08, 0x04]);
    // Bytes 5:0 milliseconds, byte 6 bits 3:1 the Timestamp Origin.
    let ms = |ts: u64| ts & 0xFFFF_FFFF_FFFF;
    let origin = |ts: u64| (ts >> 49) & 0x7;
    let power_on = ev[0].1;
    assert_eq!(origin(power_on), 0, "power-on: counted from the reset");
    assert!(ms(power_on) < 10_000, "{power_on:#x}");
    for e in &ev[1..] {
        assert_eq!(origin(e.1), 1, "set by Set Features: {:#x}", e.1);
        assert!((set_to..set_to + 10_000).contains(&ms(e.1)), "{:#x}", e.1);
    }
    // The reset cleared the clock after its event: the header (the
    // context established since) counts from the reset again.
    assert_eq!(origin(le64(&page, 20)), 0);
    assert!(ms(le64(&page, 20)) < 10_000);
}

#[test]
fn format_completion_event_enters_the_log_when_the_format_ends() {
    let config = ControllerConfig {
        format_duration: Duration::from_secs(1),
        ..config()
    };
    let mut h = Host::with(config, 512);
    h.enable();
    let mut c = cmd(AdminOpcode::FORMAT_NVM.0);
    c.nsid = U32::new(1);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    assert_eq!(types(&events(&h.persistent_event_log())), [0x04, 0x07]);
    std::thread::sleep(Duration::from_millis(1100));
    let ev = events(&h.persistent_event_log());
    assert_eq!(types(&ev), [0x04, 0x07, 0x08]);
    assert!(
        ev[2].1 >= ev[1].1 + 1000,
        "completed at the end of the duration"
    );
}

#[test]
fn persistent_event_log_is_bounded_oldest_dropped() {
    let mut h = Host::new();
    h.enable();
    // Each host-initiated capture records a 536-byte Telemetry Log Create
    // event: 200 of them are more than the 64 KiB the log holds.
    for _ in 0..200 {
        h.log(TELEMETRY_HOST, 1, 0, false, 512, 0).unwrap();
    }
    let page = h.persistent_event_log();
    assert!(page.len() <= 64 * 1024);
    assert!(page.len() > 64 * 1024 - 536, "full");
    let ev = events(&page);
    assert!(
        ev.iter().all(|e| e.0 == 0x0C),
        "the power-on event was dropped"
    );
    assert_eq!(
        &ev.last().unwrap().2[..1],
        &[TELEMETRY_HOST],
        "event data: the header"
    );
    assert_eq!(ev.last().unwrap().2[381], 200, "the newest capture is kept");
    assert_ne!(le16(&page, 372), 0, "generation number moved");
}
