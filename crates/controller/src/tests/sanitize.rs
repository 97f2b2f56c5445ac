//! Sanitize: the command's checks, what is refused while it runs or after
//! it failed, the Sanitize Status log and its event, the data gone
//! afterwards on the ram and file backends, a controller reset meanwhile.

use vnvme_blockdev::held::{HeldRam, Release};
use vnvme_blockdev::{BlockError, FileDevice, NullDevice};
use vnvme_spec::log::sanitize::{action, sstat, NOT_REPORTED, SPROG_IDLE};
use vnvme_spec::log::SanitizeStatusLog;

use super::*;
use crate::memory::GuestAddress;
use crate::vendor::CHECKSUM_LBA_RANGE;
use crate::SavedState;

const LOG: u64 = DATA + 0x40000;
const BUF: u64 = DATA + 0x50000;
const AUSE: u32 = 1 << 3;
const OIPBP: u32 = 1 << 8;
const NDAS: u32 = 1 << 9;
const EMVS: u32 = 1 << 10;
/// The test namespace (1 MiB) in 2 s: long enough to be seen running.
const SLOW: u64 = 512 << 10;

fn slow() -> ControllerConfig {
    ControllerConfig {
        sanitize_rate: SLOW,
        ..config()
    }
}

fn sanitize(sanact: u8, bits: u32, pattern: u32) -> Command {
    let mut c = cmd(AdminOpcode::SANITIZE.0);
    c.cdw10 = U32::new(u32::from(sanact) | bits);
    c.cdw11 = U32::new(pattern);
    c
}

fn owpass(n: u32) -> u32 {
    n << 4
}

fn in_progress() -> Status {
    Status::SANITIZE_IN_PROGRESS.with_dnr(false)
}

fn failed() -> Status {
    Status::SANITIZE_FAILED.with_dnr(true)
}

/// 4 KiB that holds no zero byte.
fn data(seed: u8) -> Vec<u8> {
    (0..4096)
        .map(|i| ((i as u8).wrapping_mul(7) ^ seed) | 1)
        .collect()
}

impl Host {
    fn sanitize_status(&mut self) -> SanitizeStatusLog {
        let c = self.admin(get_log(0x81, 128, 0, LOG));
        assert_eq!(c.status(), Status::SUCCESS, "sanitize status log");
        SanitizeStatusLog::read_from_bytes(&self.read_mem(LOG, 512)).unwrap()
    }

    /// The log once the operation has ended (10 s at most).
    fn sanitized(&mut self) -> SanitizeStatusLog {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.sanitize_status();
            if log.sstat.get() & 0x7 != sstat::IN_PROGRESS {
                return log;
            }
            assert!(Instant::now() < deadline, "sanitize still running");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Reads 8 blocks (4 KiB) at `slba` of `nsid`.
    fn read8(&mut self, nsid: u32, slba: u64) -> (Status, Vec<u8>) {
        self.mem.zero(GuestAddress(BUF), 4096).unwrap();
        let c = self.submit(1, rw(NvmOpcode::READ, nsid, slba, 8, BUF, 0));
        (c.status(), self.read_mem(BUF, 4096))
    }

    fn write8(&mut self, nsid: u32, slba: u64, data: &[u8]) -> Status {
        self.mem.write(GuestAddress(BUF), data).unwrap();
        self.submit(1, rw(NvmOpcode::WRITE, nsid, slba, 8, BUF, 0))
            .status()
    }
}

fn whole(dev: &dyn BlockDevice) -> Vec<u8> {
    let mut v = vec![0u8; dev.size() as usize];
    dev.read(0, &mut v).unwrap();
    v
}

#[test]
fn block_erase_leaves_zeroes_on_ram_and_file_and_a_completed_log() {
    let path = std::env::temp_dir().join(format!("vnvme-sanitize-{}.img", std::process::id()));
    let file = Arc::new(FileDevice::open(&path, Some(1 << 20)).unwrap());
    let ram = Arc::new(RamDevice::new(1 << 20));
    let namespaces = vec![
        NamespaceConfig::new(1, 512, ram.clone()),
        NamespaceConfig::new(2, 512, file.clone()),
    ];
    let mut h = Host::with_namespaces(config(), namespaces);
    h.enable();
    h.create_pair(1, 16);
    for nsid in [1, 2] {
        for slba in [0, 1000, 2040] {
            assert_eq!(h.write8(nsid, slba, &data(slba as u8)), Status::SUCCESS);
        }
    }
    let c = h.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    let log = h.sanitized();
    assert_eq!(
        log.sstat.get(),
        sstat::COMPLETED | sstat::GLOBAL_DATA_ERASED
    );
    assert_eq!(log.sprog.get(), SPROG_IDLE);
    assert_eq!(log.scdw10.get(), u32::from(action::BLOCK_ERASE));
    for nsid in [1, 2] {
        for slba in [0, 1000, 2040] {
            assert_eq!(h.read8(nsid, slba), (Status::SUCCESS, vec![0; 4096]));
        }
    }
    assert!(whole(&*ram).iter().all(|&b| b == 0), "ram erased");
    assert!(whole(&*file).iter().all(|&b| b == 0), "file erased");
    // User data written since: no longer Global Data Erased.
    assert_eq!(h.write8(1, 8, &data(3)), Status::SUCCESS);
    assert_eq!(h.sanitize_status().sstat.get(), sstat::COMPLETED);
    drop(h);
    drop(file);
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn io_and_admin_commands_not_permitted_wait_for_the_sanitize() {
    let mut h = Host::with(slow(), 512);
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.write8(1, 0, &data(1)), Status::SUCCESS);
    let c = h.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.read8(1, 0).0, in_progress());
    assert_eq!(h.write8(1, 0, &data(2)), in_progress());
    let wz = rw(NvmOpcode::WRITE_ZEROES, 1, 0, 8, 0, 0);
    assert_eq!(h.submit(1, wz).status(), in_progress());
    let verify = rw(NvmOpcode::VERIFY, 1, 0, 8, 0, 0);
    assert_eq!(h.submit(1, verify).status(), in_progress());
    // Flush touches no user data.
    let flush = rw(NvmOpcode::FLUSH, 1, 0, 1, 0, 0);
    assert_eq!(h.submit(1, flush).status(), Status::SUCCESS);
    // Vendor commands reading blocks (the built-in checksum) too.
    let checksum = rw(NvmOpcode(CHECKSUM_LBA_RANGE), 1, 0, 8, 0, 0);
    assert_eq!(h.submit(1, checksum).status(), in_progress());
    let mut format = cmd(AdminOpcode::FORMAT_NVM.0);
    format.nsid = U32::new(1);
    let mut self_test = cmd(AdminOpcode::DEVICE_SELF_TEST.0);
    self_test.cdw10 = U32::new(1);
    for refused in [
        format,
        self_test,
        sanitize(action::BLOCK_ERASE, 0, 0),
        sanitize(action::OVERWRITE, 0, 0),
        sanitize(action::EXIT_FAILURE_MODE, 0, 0),
        cmd(AdminOpcode::NAMESPACE_ATTACHMENT.0),
    ] {
        let op = AdminOpcode(refused.opcode());
        assert_eq!(h.admin(refused).status(), in_progress(), "{op}");
    }
    let permitted = [
        identify(1, 0, LOG),
        set_features(0x01, 0),
        get_log(0x02, 128, 0, LOG),
    ];
    for c in permitted {
        let op = AdminOpcode(c.opcode());
        assert_eq!(h.admin(c).status(), Status::SUCCESS, "{op}");
    }
    let log = h.sanitize_status();
    assert_eq!(log.sstat.get(), sstat::IN_PROGRESS);
    assert_ne!(log.sprog.get(), SPROG_IDLE);
    assert_eq!(h.sanitized().sstat.get() & 0x7, sstat::COMPLETED);
    assert_eq!(h.read8(1, 0), (Status::SUCCESS, vec![0; 4096]));
}

#[test]
fn reserved_actions_and_media_verification_are_invalid_field() {
    let mut h = Host::new();
    h.enable();
    let invalid = Status::INVALID_FIELD.with_dnr(true);
    for sanact in [0, 5, 6, 7] {
        let c = h.admin(sanitize(sanact, 0, 0));
        assert_eq!(c.status(), invalid, "sanact {sanact}");
    }
    let c = h.admin(sanitize(action::BLOCK_ERASE, EMVS, 0));
    assert_eq!(c.status(), invalid);
    // Nothing failed: Exit Failure Mode has nothing to do.
    let c = h.admin(sanitize(action::EXIT_FAILURE_MODE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.sanitize_status().sstat.get(), sstat::NEVER_SANITIZED);
}

#[test]
fn progress_moves_and_the_estimates_follow_the_rate() {
    let mut h = Host::with(slow(), 512);
    h.enable();
    let log = h.sanitize_status();
    // 1 MiB at 512 KiB/s; 16 passes; 16 times faster.
    assert_eq!((log.etbe.get(), log.eto.get(), log.etce.get()), (2, 32, 1));
    assert_eq!(log.etbend.get(), NOT_REPORTED);
    assert_eq!(log.sprog.get(), SPROG_IDLE);
    let c = h.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    let first = h.sanitize_status();
    std::thread::sleep(Duration::from_millis(400));
    let later = h.sanitize_status();
    assert_eq!(later.sstat.get(), sstat::IN_PROGRESS, "2 s of work");
    assert!(
        later.sprog.get() > first.sprog.get(),
        "SPROG {} then {}",
        first.sprog.get(),
        later.sprog.get()
    );
    h.sanitized();
}

#[test]
fn overwrite_leaves_the_last_pass_pattern_with_no_deallocate_and_counts_passes() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.write8(1, 0, &data(9)), Status::SUCCESS);
    let pattern = 0xA5A5_0F0Fu32;
    // Three passes inverting in between: the third writes the pattern.
    let c = h.admin(sanitize(
        action::OVERWRITE,
        owpass(3) | OIPBP | NDAS,
        pattern,
    ));
    assert_eq!(c.status(), Status::SUCCESS);
    let log = h.sanitized();
    assert_eq!(
        log.sstat.get(),
        sstat::COMPLETED | (3 << sstat::PASSES_SHIFT) | sstat::GLOBAL_DATA_ERASED
    );
    let repeated = |p: u32| p.to_le_bytes().repeat(1024);
    assert_eq!(h.read8(1, 0), (Status::SUCCESS, repeated(pattern)));
    assert_eq!(whole(&*h.backend), repeated(pattern).repeat(256));
    // Two passes: the second inverted.
    let c = h.admin(sanitize(
        action::OVERWRITE,
        owpass(2) | OIPBP | NDAS,
        pattern,
    ));
    assert_eq!(c.status(), Status::SUCCESS);
    h.sanitized();
    assert_eq!(h.read8(1, 100), (Status::SUCCESS, repeated(!pattern)));
    // OWPASS 0 is 16 passes; deallocated at the end without NDAS.
    let c = h.admin(sanitize(action::OVERWRITE, 0, pattern));
    assert_eq!(c.status(), Status::SUCCESS);
    let log = h.sanitized();
    assert_eq!(log.sstat.get() >> sstat::PASSES_SHIFT & 0x1F, 16);
    assert_eq!(h.read8(1, 0), (Status::SUCCESS, vec![0; 4096]));
}

#[test]
fn crypto_erase_makes_the_data_unreadable() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let written = data(5);
    assert_eq!(h.write8(1, 64, &written), Status::SUCCESS);
    let c = h.admin(sanitize(action::CRYPTO_ERASE, NDAS, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.sanitized().sstat.get() & 0x7, sstat::COMPLETED);
    // Not deallocated: the old data under a new key, neither it nor zeroes.
    let (status, read) = h.read8(1, 64);
    assert_eq!(status, Status::SUCCESS);
    let same = read.iter().zip(&written).filter(|(a, b)| a == b).count();
    assert!(same < 128, "{same} of 4096 bytes unchanged");
    assert!(read.iter().filter(|&&b| b == 0).count() < 128);
    let c = h.admin(sanitize(action::CRYPTO_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    h.sanitized();
    assert_eq!(h.read8(1, 64), (Status::SUCCESS, vec![0; 4096]));
}

#[test]
fn a_sanitize_goes_on_across_a_controller_reset() {
    let mut h = Host::with(slow(), 512);
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.write8(1, 0, &data(1)), Status::SUCCESS);
    let c = h.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    h.write32(offset::CC, 0);
    assert!(!h.csts().rdy());
    h.mem.zero(GuestAddress(ACQ), 4096).unwrap();
    h.enable();
    h.create_pair(1, 16);
    let log = h.sanitize_status();
    assert_eq!(log.sstat.get(), sstat::IN_PROGRESS);
    assert_eq!(h.read8(1, 0).0, in_progress());
    assert_eq!(h.sanitized().sstat.get() & 0x7, sstat::COMPLETED);
    assert_eq!(h.read8(1, 0), (Status::SUCCESS, vec![0; 4096]));
}

#[test]
fn completion_is_an_event_for_the_sanitize_status_log() {
    let mut h = Host::new();
    h.enable();
    let aer = h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    h.ring_sq(0);
    let (c, mut events) = h.admin_collect(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    if events.is_empty() {
        events.push(h.reap(0));
    }
    assert_eq!(events[0].cid(), aer);
    // NVM command set specific (6), Sanitize Operation Completed (1), 81h.
    assert_eq!(events[0].dw0.get(), 6 | (1 << 8) | (0x81 << 16));
    assert_eq!(h.sanitize_status().sstat.get() & 0x7, sstat::COMPLETED);
}

/// Reads zeroes; fails every write, zeroing and deallocation.
#[derive(Debug)]
struct Unwritable;

fn eio() -> BlockError {
    BlockError::Io(std::io::Error::from_raw_os_error(5))
}

impl BlockDevice for Unwritable {
    fn size(&self) -> u64 {
        NS_BLOCKS * 512
    }
    fn read(&self, _offset: u64, buf: &mut [u8]) -> Result<(), BlockError> {
        buf.fill(0);
        Ok(())
    }
    fn write(&self, _offset: u64, _buf: &[u8]) -> Result<(), BlockError> {
        Err(eio())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64) -> Result<(), BlockError> {
        Err(eio())
    }
}

#[test]
fn a_failed_sanitize_refuses_io_until_recovered_as_ause_allows() {
    let mut h = Host::enabled_on(config(), Arc::new(Unwritable));
    h.create_pair(1, 16);
    // Restricted (AUSE clear): only another sanitize leaves the failure.
    let c = h.admin(sanitize(action::BLOCK_ERASE, NDAS, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.sanitized().sstat.get(), sstat::FAILED);
    assert_eq!(h.read8(1, 0).0, failed());
    let mut format = cmd(AdminOpcode::FORMAT_NVM.0);
    format.nsid = U32::new(1);
    assert_eq!(h.admin(format).status(), failed());
    assert_eq!(h.admin(identify(1, 0, LOG)).status(), Status::SUCCESS);
    let exit = sanitize(action::EXIT_FAILURE_MODE, 0, 0);
    assert_eq!(h.admin(exit).status(), failed());
    // Unrestricted: fails again, and then Exit Failure Mode may leave it.
    let c = h.admin(sanitize(action::BLOCK_ERASE, AUSE, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.sanitized().sstat.get(), sstat::FAILED);
    assert_eq!(h.read8(1, 0).0, failed());
    assert_eq!(h.admin(exit).status(), Status::SUCCESS);
    assert_eq!(h.read8(1, 0).0, Status::SUCCESS);
    // The log still tells how the last operation ended.
    assert_eq!(h.sanitize_status().sstat.get(), sstat::FAILED);
}

#[test]
fn erased_blocks_are_not_uncorrectable_any_more() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    let wu = rw(NvmOpcode::WRITE_UNCORRECTABLE, 1, 4, 2, 0, 0);
    assert_eq!(h.submit(1, wu).status(), Status::SUCCESS);
    let unrecovered = Status::UNRECOVERED_READ_ERROR.with_dnr(true);
    assert_eq!(h.read8(1, 0).0, unrecovered);
    let c = h.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    h.sanitized();
    assert_eq!(h.read8(1, 0), (Status::SUCCESS, vec![0; 4096]));
}

#[test]
fn a_null_namespace_has_nothing_to_erase() {
    let null = Arc::new(NullDevice::new(1 << 30));
    let mut h = Host::enabled_on(slow(), null);
    let log = h.sanitize_status();
    assert_eq!((log.etbe.get(), log.eto.get()), (0, 0));
    let c = h.admin(sanitize(action::OVERWRITE, 0, 0x1234));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.sanitized().sstat.get() & 0x7, sstat::COMPLETED);
}

#[test]
fn dropping_the_controller_stops_a_running_sanitize_and_self_test() {
    // A thousand seconds of work each: only being told to stop ends them.
    let config = ControllerConfig {
        sanitize_rate: 1024,
        self_test_rate: 1024,
        ..config()
    };
    let mut h = Host::with(config, 512);
    h.enable();
    let mut dst = cmd(AdminOpcode::DEVICE_SELF_TEST.0);
    dst.nsid = U32::new(1);
    dst.cdw10 = U32::new(2);
    assert_eq!(h.admin(dst).status(), Status::SUCCESS);
    let c = h.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.sanitize_status().sstat.get(), sstat::IN_PROGRESS);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(h);
        let _ = tx.send(());
    });
    assert!(
        rx.recv_timeout(Duration::from_secs(10)).is_ok(),
        "the controller did not stop"
    );
}

#[test]
fn a_write_in_flight_when_the_sanitize_starts_lands_before_the_erase() {
    // Requests wait for the test: a write in flight when the sanitize starts.
    let backend = Arc::new(HeldRam::new(NS_BLOCKS * 512, Release::Test));
    let mut h = Host::enabled_on(config(), backend.clone());
    h.create_pair(1, 16);
    h.mem.write(GuestAddress(BUF), &data(4)).unwrap();
    let write = h.push(1, rw(NvmOpcode::WRITE, 1, 0, 8, BUF, 0));
    h.ring_sq(1);
    let deadline = Instant::now() + Duration::from_secs(5);
    while backend.held() == 0 {
        assert!(
            Instant::now() < deadline,
            "the write never reached the backend"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let c = h.admin(sanitize(action::BLOCK_ERASE, 0, 0));
    assert_eq!(c.status(), Status::SUCCESS);
    // The erase waits for the write: no progress while it is in flight.
    std::thread::sleep(Duration::from_millis(100));
    let log = h.sanitize_status();
    assert_eq!((log.sstat.get(), log.sprog.get()), (sstat::IN_PROGRESS, 0));
    backend.open();
    let done = h.reap(1);
    assert_eq!((done.cid(), done.status()), (write, Status::SUCCESS));
    assert_eq!(h.sanitized().sstat.get() & 0x7, sstat::COMPLETED);
    assert_eq!(h.read8(1, 0), (Status::SUCCESS, vec![0; 4096]));
}

/// A copy of `dev`'s data on a new device.
fn copy_of(dev: &RamDevice) -> Arc<RamDevice> {
    let copy = Arc::new(RamDevice::new(dev.size()));
    copy.write(0, &whole(dev)).unwrap();
    copy
}

/// A sanitize paused in the middle is saved with its operation, media key
/// and position; restored into a new controller (a live upgrade's next
/// process) on a copy of the medium, it goes on from there and leaves
/// exactly the medium, log and pass count the paused one leaves once it
/// resumes.
#[test]
fn a_paused_sanitize_is_saved_and_finishes_in_the_restored_controller_as_in_the_saved_one() {
    for (sanact, bits, pattern) in [
        (action::BLOCK_ERASE, NDAS, 0),
        (action::OVERWRITE, owpass(3) | OIPBP | NDAS, 0xA5A5_5A5A),
        (action::CRYPTO_ERASE, NDAS, 0),
    ] {
        let mut a = Host::with(slow(), 512);
        a.enable();
        a.create_pair(1, 16);
        assert_eq!(a.write8(1, 0, &data(1)), Status::SUCCESS);
        let c = a.admin(sanitize(sanact, bits, pattern));
        assert_eq!(c.status(), Status::SUCCESS);
        // Under way, not done.
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.sanitize_status().sprog.get() == 0 {
            assert!(Instant::now() < deadline, "the sanitize never moved");
            std::thread::sleep(Duration::from_millis(5));
        }
        a.ctrl.pause();
        let saved = a.ctrl.save_state().expect("saved with the sanitize paused");
        let background = |s: &SavedState| {
            let json: serde_json::Value = serde_json::from_str(&s.to_json_pretty()).unwrap();
            json["background"]["sanitize"].clone()
        };
        let at = background(&saved);
        assert_eq!(
            at["status"],
            u64::from(sstat::IN_PROGRESS),
            "{sanact}: {at}"
        );
        assert!(at["run"]["done"].as_u64().unwrap() > 0, "{sanact}: {at}");
        // Stopped: the position stays while paused.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(background(&a.ctrl.save_state().unwrap()), at);
        let decoded = SavedState::decode(&saved.encode()).expect("decodes");
        assert_eq!(decoded, saved);
        let mem = Arc::new(VecMemory::new(MEM_SIZE));
        mem.write(GuestAddress(0), &a.read_mem(0, MEM_SIZE))
            .unwrap();
        let backend = copy_of(&a.backend);
        let irq = Arc::new(CountingIrq::default());
        let ctrl = Controller::restore(
            slow(),
            vec![NamespaceConfig::new(1, 512, backend.clone())],
            &decoded,
            mem.clone(),
            irq.clone(),
        )
        .expect("a state with a sanitize in progress restores");
        a.ctrl.resume().unwrap();
        let mut b = Host {
            ctrl,
            mem,
            irq,
            backend,
            rings: a.rings.clone(),
            cid: a.cid,
            dbbuf: a.dbbuf,
            spdk: a.spdk,
        };
        assert_eq!(b.read8(1, 0).0, in_progress(), "{sanact}");
        let (done_a, done_b) = (a.sanitized(), b.sanitized());
        assert_eq!(done_b.sstat.get() & 0x7, sstat::COMPLETED, "{sanact}");
        assert_eq!(
            done_a.sstat, done_b.sstat,
            "{sanact}: SSTAT, passes included"
        );
        assert!(
            whole(&*a.backend) == whole(&*b.backend),
            "{sanact}: the same medium"
        );
        assert_ne!(b.read8(1, 0).1, data(1), "{sanact}: erased");
    }
}

mod shared;
