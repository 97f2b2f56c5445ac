//! Device Self-test: the tests and their results in the log, progress,
//! one test at a time, what aborts a test (the command, a reset, a format,
//! a sanitize) and what fails one (a Write Uncorrectable mark, a block the
//! backend cannot read); and how Identify and the effects log show both
//! background operations.

use vnvme_blockdev::BlockError;
use vnvme_spec::log::self_test::{code, result, vdi};
use vnvme_spec::log::SelfTestLog;

use super::*;

const LOG: u64 = DATA + 0x40000;
const NSID_ALL: u32 = 0xFFFF_FFFF;
/// An extended test of the test namespace (1 MiB) in 2 s.
const SLOW: u64 = 512 << 10;
/// A short test (1/16 of the 1 MiB namespace) in 2 s.
const VERY_SLOW: u64 = 32 << 10;

fn reading_at(rate: u64) -> ControllerConfig {
    ControllerConfig {
        self_test_rate: rate,
        ..config()
    }
}

fn dst(stc: u8, nsid: u32) -> Command {
    let mut c = cmd(AdminOpcode::DEVICE_SELF_TEST.0);
    c.nsid = U32::new(nsid);
    c.cdw10 = U32::new(u32::from(stc));
    c
}

impl Host {
    fn self_test_log(&mut self) -> SelfTestLog {
        let c = self.admin(get_log(0x06, 141, 0, LOG));
        assert_eq!(c.status(), Status::SUCCESS, "self-test log");
        SelfTestLog::read_from_bytes(&self.read_mem(LOG, 564)).unwrap()
    }

    /// The log once no test runs (10 s at most).
    fn self_tested(&mut self) -> SelfTestLog {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.self_test_log();
            if log.current_operation == 0 {
                return log;
            }
            assert!(Instant::now() < deadline, "self-test still running");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

fn dsts(stc: u8, result: u8) -> u8 {
    (stc << 4) | result
}

#[test]
fn a_short_test_passes_and_its_result_is_logged() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.admin(dst(code::SHORT, 1)).status(), Status::SUCCESS);
    let log = h.self_tested();
    let e = log.results[0];
    assert_eq!(e.dsts, dsts(code::SHORT, result::NO_ERROR));
    assert_eq!((e.seg, e.vdi, e.poh.get()), (0, 0, 0));
    assert_eq!(log.results[1].dsts, result::NOT_USED);
    // The controller alone, then everything: newest first.
    assert_eq!(h.admin(dst(code::SHORT, 0)).status(), Status::SUCCESS);
    h.self_tested();
    assert_eq!(
        h.admin(dst(code::EXTENDED, NSID_ALL)).status(),
        Status::SUCCESS
    );
    let log = h.self_tested();
    assert_eq!(log.results[0].dsts, dsts(code::EXTENDED, result::NO_ERROR));
    assert_eq!(log.results[2].dsts, dsts(code::SHORT, result::NO_ERROR));
    assert_eq!(log.results[3].dsts, result::NOT_USED);
}

#[test]
fn an_extended_test_shows_progress_and_a_second_test_meanwhile_is_refused() {
    let mut h = Host::with(reading_at(SLOW), 512);
    h.enable();
    assert_eq!(h.admin(dst(code::EXTENDED, 1)).status(), Status::SUCCESS);
    let first = h.self_test_log();
    assert_eq!(first.current_operation, code::EXTENDED);
    let busy = h.admin(dst(code::SHORT, 1)).status();
    assert_eq!(busy, Status::SELF_TEST_IN_PROGRESS.with_dnr(false));
    assert_eq!((busy.sct(), busy.sc()), (1, 0x1D));
    std::thread::sleep(Duration::from_millis(400));
    let later = h.self_test_log();
    assert_eq!(later.current_operation, code::EXTENDED, "2 s of reading");
    assert!(
        later.completion > first.completion && later.completion < 100,
        "completion {} then {}",
        first.completion,
        later.completion
    );
    let log = h.self_tested();
    assert_eq!(log.results[0].dsts, dsts(code::EXTENDED, result::NO_ERROR));
}

#[test]
fn abort_ends_the_running_test_as_aborted_by_a_command() {
    let mut h = Host::with(reading_at(SLOW), 512);
    h.enable();
    // Nothing to abort: nothing logged.
    assert_eq!(h.admin(dst(code::ABORT, 0)).status(), Status::SUCCESS);
    assert_eq!(h.self_test_log().results[0].dsts, result::NOT_USED);
    assert_eq!(h.admin(dst(code::EXTENDED, 1)).status(), Status::SUCCESS);
    assert_eq!(h.admin(dst(code::ABORT, 0)).status(), Status::SUCCESS);
    let log = h.self_test_log();
    assert_eq!(log.current_operation, 0);
    assert_eq!(log.results[0].dsts, dsts(code::EXTENDED, result::ABORTED));
    assert_eq!(log.results[1].dsts, result::NOT_USED);
    // The next test starts at once.
    assert_eq!(h.admin(dst(code::SHORT, 1)).status(), Status::SUCCESS);
    let log = h.self_tested();
    assert_eq!(log.results[0].dsts, dsts(code::SHORT, result::NO_ERROR));
}

#[test]
fn a_controller_reset_aborts_a_short_test_and_not_an_extended_one() {
    let mut h = Host::with(reading_at(VERY_SLOW), 512);
    h.enable();
    assert_eq!(h.admin(dst(code::SHORT, 1)).status(), Status::SUCCESS);
    h.reenable();
    let log = h.self_test_log();
    assert_eq!(log.current_operation, 0);
    assert_eq!(
        log.results[0].dsts,
        dsts(code::SHORT, result::ABORTED_RESET)
    );
    assert_eq!(h.admin(dst(code::EXTENDED, 1)).status(), Status::SUCCESS);
    h.reenable();
    assert_eq!(h.self_test_log().current_operation, code::EXTENDED);
    assert_eq!(h.admin(dst(code::ABORT, 0)).status(), Status::SUCCESS);
    let log = h.self_test_log();
    assert_eq!(log.results[0].dsts, dsts(code::EXTENDED, result::ABORTED));
}

#[test]
fn a_marked_block_fails_segment_2_naming_namespace_and_block() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let wu = rw(NvmOpcode::WRITE_UNCORRECTABLE, 1, 77, 3, 0, 0);
    assert_eq!(h.submit(1, wu).status(), Status::SUCCESS);
    // The controller alone does not look at namespaces.
    assert_eq!(h.admin(dst(code::SHORT, 0)).status(), Status::SUCCESS);
    let log = h.self_tested();
    assert_eq!(log.results[0].dsts, dsts(code::SHORT, result::NO_ERROR));
    assert_eq!(
        h.admin(dst(code::SHORT, NSID_ALL)).status(),
        Status::SUCCESS
    );
    let e = h.self_tested().results[0];
    assert_eq!(e.dsts, dsts(code::SHORT, result::SEGMENT_FAILED));
    assert_eq!(e.seg, 2);
    assert_eq!(e.vdi, vdi::NSID | vdi::FLBA | vdi::SCT | vdi::SC);
    assert_eq!((e.nsid.get(), e.flba.get()), (1, 77));
    assert_eq!((e.sct, e.sc), (2, 0x81), "unrecovered read error");
}

/// A RAM disk whose block `bad` (512 bytes) cannot be read.
#[derive(Debug)]
struct BadBlock {
    ram: RamDevice,
    bad: u64,
}

impl BlockDevice for BadBlock {
    fn size(&self) -> u64 {
        self.ram.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        let bad = self.bad * 512;
        if offset <= bad && bad < offset + buf.len() as u64 {
            return Err(BlockError::Io(std::io::Error::from_raw_os_error(5)));
        }
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> Result<(), BlockError> {
        self.ram.write(offset, buf)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        self.ram.write_zeroes(offset, len)
    }
}

#[test]
fn a_block_the_backend_cannot_read_fails_the_media_check_there() {
    let backend = Arc::new(BadBlock {
        ram: RamDevice::new(NS_BLOCKS * 512),
        bad: 300,
    });
    let mut h = Host::enabled_on(config(), backend);
    assert_eq!(h.admin(dst(code::EXTENDED, 1)).status(), Status::SUCCESS);
    let e = h.self_tested().results[0];
    assert_eq!(e.dsts, dsts(code::EXTENDED, result::SEGMENT_FAILED));
    assert_eq!((e.seg, e.nsid.get(), e.flba.get()), (3, 1, 300));
    assert_eq!((e.sct, e.sc), (2, 0x81));
}

#[test]
fn reserved_codes_and_unknown_namespaces_are_refused() {
    let mut h = Host::new();
    h.enable();
    for stc in [0, 3, 0xE] {
        let c = h.admin(dst(stc, 1));
        assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr(true), "{stc}");
    }
    let c = h.admin(dst(code::SHORT, 99));
    assert_eq!(
        c.status(),
        Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
    );
    assert_eq!(h.self_test_log().results[0].dsts, result::NOT_USED);
}

#[test]
fn a_format_or_a_sanitize_aborts_the_test() {
    let mut h = Host::with(reading_at(SLOW), 512);
    h.enable();
    assert_eq!(h.admin(dst(code::EXTENDED, 1)).status(), Status::SUCCESS);
    let mut format = cmd(AdminOpcode::FORMAT_NVM.0);
    format.nsid = U32::new(1);
    assert_eq!(h.admin(format).status(), Status::SUCCESS);
    let log = h.self_test_log();
    assert_eq!(log.current_operation, 0);
    assert_eq!(
        log.results[0].dsts,
        dsts(code::EXTENDED, result::ABORTED_FORMAT)
    );
    assert_eq!(
        h.admin(dst(code::EXTENDED, NSID_ALL)).status(),
        Status::SUCCESS
    );
    let mut sanitize = cmd(AdminOpcode::SANITIZE.0);
    sanitize.cdw10 = U32::new(2);
    assert_eq!(h.admin(sanitize).status(), Status::SUCCESS);
    let e = h.self_test_log().results[0];
    assert_eq!(e.dsts, dsts(code::EXTENDED, result::ABORTED_SANITIZE));
}

#[test]
fn identify_and_the_effects_log_show_sanitize_and_self_test() {
    let mut h = Host::with(reading_at(SLOW), 512);
    h.enable();
    assert!(h.admin(identify(1, 0, LOG)).status().is_success());
    let id = IdentifyController::read_from_bytes(&h.read_mem(LOG, 4096)).unwrap();
    assert_ne!(id.oacs.get() & (1 << 4), 0, "OACS device self-test");
    // Crypto erase, block erase, overwrite; NODMMAS 01b.
    assert_eq!(id.sanicap.get(), 0x4000_0007);
    assert_eq!(id.dsto, 1, "one test at a time");
    // 1 MiB at 512 KiB/s: 2 s, rounded up to a minute.
    assert_eq!(id.edstt.get(), 1);
    assert!(h.admin(get_log(0x05, 1024, 0, LOG)).status().is_success());
    let acs = |op: u8| {
        let at = LOG + u64::from(op) * 4;
        u32::from_le_bytes(h.read_mem(at, 4).try_into().unwrap())
    };
    assert_eq!(acs(AdminOpcode::SANITIZE.0), 0b11, "supported, LBCC");
    assert_eq!(acs(AdminOpcode::DEVICE_SELF_TEST.0), 1);
}
