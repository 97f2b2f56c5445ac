//! Registers and enable.

use super::*;
use vnvme_spec::regs::NSSR_RESET;

#[test]
fn cap_and_version_describe_the_controller() {
    let h = Host::new();
    let cap = Cap::from(h.read64(offset::CAP));
    assert_eq!(cap.mqes_z(), 63);
    assert!(cap.cqr());
    assert_eq!(cap.dstrd(), 0);
    assert_eq!(cap.css() & 1, 1);
    assert_eq!(cap.mpsmin(), 0);
    assert!(cap.to() > 0);
    assert!(cap.crwms() && cap.crims());
    assert_eq!(h.read32(offset::VS), 0x0002_0000);
    assert_ne!(h.read32(offset::CRTO), 0);
    assert_eq!(h.read32(0x40), 0, "unknown offsets read 0");
}

#[test]
fn cc_enable_sets_rdy_and_disable_clears_it() {
    let mut h = Host::new();
    h.enable();
    h.write32(offset::CC, 0x0046_0000);
    assert!(!h.csts().rdy());
}

#[test]
fn cc_enable_with_bad_mps_sets_cfs() {
    let mut h = Host::new();
    h.enable_with(0x0046_0001 | (5 << 7), ASQ, (31 << 16) | 31);
    assert!(h.csts().cfs());
    assert!(!h.csts().rdy());
}

#[test]
fn cc_enable_with_zero_admin_queue_size_sets_cfs() {
    let mut h = Host::new();
    h.enable_with(0x0046_0001, ASQ, 31 << 16);
    assert!(h.csts().cfs());
    assert!(!h.csts().rdy());
}

#[test]
fn cc_enable_with_misaligned_asq_sets_cfs() {
    let mut h = Host::new();
    // 8 KiB aligned is fine for 4 KiB pages but not for 16 KiB (MPS = 2).
    h.enable_with(0x0046_0001 | (2 << 7), ASQ + 0x2000, (31 << 16) | 31);
    assert!(h.csts().cfs());
    // Clearing EN resets; a good configuration then enables.
    h.write32(offset::CC, 0);
    assert!(!h.csts().cfs());
    h.enable();
}

#[test]
fn shutdown_notification_completes_shst() {
    let mut h = Host::new();
    h.enable();
    h.write32(offset::CC, 0x0046_0001 | (1 << 14));
    assert_eq!(h.csts().shst(), 2);
}

/// After a shutdown a host may free its queues, and commands need a reset
/// (CSTS.SHST): nothing rung then is fetched, and nothing sets CFS. Before,
/// the workers went on, and one fetching from an SQ the driver had just freed
/// set CSTS.CFS (`vnvme bench init`, learning mode, most runs).
#[test]
fn after_a_shutdown_nothing_is_fetched_until_a_reset() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 8);
    h.write32(offset::CC, CC_ENABLE | (1 << 14));
    assert_eq!(h.csts().shst(), 2);

    h.push(1, rw(NvmOpcode::READ, 1, 0, 1, DATA, 0));
    h.ring_sq(1);
    h.push(0, identify(1, 0, DATA));
    h.ring_sq(0);
    std::thread::sleep(Duration::from_millis(200));
    assert!(h.peek_cqe(1).is_none(), "an I/O command ran after shutdown");
    assert!(
        h.peek_cqe(0).is_none(),
        "an admin command ran after shutdown"
    );
    assert!(!h.csts().cfs());
    assert_eq!(h.ctrl.stats().fatal_errors, 0);

    h.rings = vec![None; 16];
    h.reenable();
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
}

#[test]
fn bad_register_accesses_never_panic() {
    let h = Host::new();
    for off in [
        0u64,
        1,
        3,
        0x14,
        0x1001,
        0x1FFE,
        0x3FFF,
        u64::MAX - 3,
        u64::MAX,
    ] {
        for len in [0usize, 1, 2, 3, 4, 5, 8, 16] {
            let mut buf = vec![0xAA; len];
            h.ctrl.mmio_read(off, &mut buf);
            h.ctrl.mmio_write(off, &buf);
        }
    }
    assert!(h.ctrl.stats().invalid_register_accesses > 0);
}

#[test]
fn too_many_io_queues_names_the_real_limit() {
    let config = ControllerConfig {
        max_io_queues: 600,
        ..ControllerConfig::default()
    };
    let err = Controller::new(config, Vec::new()).unwrap_err().to_string();
    assert!(err.contains("1..=511"), "{err}");
    assert!(err.contains("got 600"), "{err}");
    let fits = ControllerConfig {
        max_io_queues: 511,
        msix_vectors: 512,
        ..ControllerConfig::default()
    };
    assert!(Controller::new(fits, Vec::new()).is_ok());
}

#[test]
fn nvm_subsystem_reset_is_offered_only_when_configured() {
    // Off by default, as in QEMU: the register is reserved, writes ignored.
    let mut h = Host::new();
    assert!(!Cap::from(h.read64(offset::CAP)).nssrs());
    h.enable();
    h.write32(offset::NSSR, NSSR_RESET);
    assert!(h.csts().rdy() && !h.csts().nssro(), "reset ignored");

    let config = ControllerConfig {
        nssr: true,
        ..config()
    };
    let mut h = Host::with(config, 512);
    assert!(Cap::from(h.read64(offset::CAP)).nssrs());
    h.enable();
    h.write32(offset::NSSR, 0x1234);
    assert!(h.csts().rdy(), "only \"NVMe\" resets");
    h.write32(offset::NSSR, NSSR_RESET);
    assert!(!h.csts().rdy() && h.csts().nssro());
    // NSSRO is write-1-to-clear.
    h.write32(offset::CSTS, 1 << 4);
    assert!(!h.csts().nssro());
}
