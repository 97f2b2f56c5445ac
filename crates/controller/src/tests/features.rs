//! Get and Set Features: the Select field, feature scope, and the features
//! with a data buffer or a persistent value.

use vnvme_spec::feature::{timestamp_origin, FeatureCapabilities, Timestamp};

use super::*;
use crate::memory::GuestAddress;

const BUF: u64 = DATA + 0x40000;
/// Every feature the controller implements with a RAM namespace (no
/// volatile write cache, so not 06h).
const FEATURES: &[u8] = &[
    0x01, 0x02, 0x04, 0x05, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0E, 0x0F, 0x16, 0x19, 0x80, 0x81,
];

fn get_ns(fid: u8, sel: u8, nsid: u32) -> Command {
    let mut c = get_features(fid, sel, BUF);
    c.nsid = U32::new(nsid);
    c
}

fn set_with_data(fid: u8, cdw11: u32, buf: u64) -> Command {
    let mut c = set_features(fid, cdw11);
    c.prp1 = U64::new(buf);
    c
}

impl Host {
    /// Set Features `fid` with `data` in the data buffer.
    fn set_data(&mut self, fid: u8, cdw11: u32, data: &[u8]) -> Status {
        self.mem.write(GuestAddress(BUF), data).unwrap();
        self.admin(set_with_data(fid, cdw11, BUF)).status()
    }

    /// Get Features `fid` (SEL `sel`, CDW11 `cdw11`): its dword 0 and the
    /// first `len` bytes of the data buffer (filled with FFh before).
    fn get_data(&mut self, fid: u8, sel: u8, cdw11: u32, len: usize) -> (u32, Vec<u8>) {
        self.mem.write(GuestAddress(BUF), &[0xFF; 4096]).unwrap();
        let mut c = get_features(fid, sel, BUF);
        c.cdw11 = U32::new(cdw11);
        let c = self.admin(c);
        assert_eq!(
            c.status(),
            Status::SUCCESS,
            "get feature {fid:#x} sel {sel}"
        );
        (c.dw0.get(), self.read_mem(BUF, len))
    }

    fn timestamp(&mut self) -> Timestamp {
        let (_, data) = self.get_data(0x0E, 0, 0, 8);
        Timestamp::from(u64::from_le_bytes(data.try_into().unwrap()))
    }
}

#[test]
fn supported_capabilities_say_changeable_and_not_saveable_for_every_feature() {
    let mut h = Host::new();
    h.enable();
    for &fid in FEATURES {
        // Error Recovery is namespace specific: asked of namespace 1.
        let nsid = if fid == 0x05 { 1 } else { 0 };
        let c = h.admin(get_ns(fid, 3, nsid));
        assert_eq!(c.status(), Status::SUCCESS, "feature {fid:#x}");
        let caps = FeatureCapabilities::from(c.dw0.get());
        assert!(caps.changeable(), "feature {fid:#x}");
        assert!(!caps.saveable(), "feature {fid:#x}");
        assert_eq!(caps.ns_specific(), fid == 0x05, "feature {fid:#x}");
        // Nothing saveable: Set Features with SV is refused.
        let mut save = set_features(fid, 0);
        save.cdw10 = U32::new(u32::from(fid) | (1 << 31));
        save.nsid = U32::new(nsid);
        let want = Status::FEATURE_NOT_SAVEABLE.with_dnr(true);
        assert_eq!(h.admin(save).status(), want, "feature {fid:#x}");
    }
    let c = h.admin(get_features(0x06, 3, BUF));
    assert_eq!(c.status(), Status::INVALID_FIELD.with_dnr(true), "no VWC");
    for sel in 4..8 {
        let c = h.admin(get_features(0x01, sel, BUF));
        assert_eq!(
            c.status(),
            Status::INVALID_FIELD.with_dnr(true),
            "sel {sel}"
        );
    }
}

#[test]
fn saved_and_default_values_ignore_what_was_set() {
    let mut h = Host::new();
    h.enable();
    let sets = [
        (0x01, 0x0304_0506),
        (0x0B, 0x100),
        (0x0F, 600_000),
        (0x80, 7),
    ];
    for (fid, value) in sets {
        assert_eq!(h.admin(set_features(fid, value)).status(), Status::SUCCESS);
        let (current, _) = h.get_data(fid, 0, 0, 0);
        assert_eq!(current, value, "feature {fid:#x} current");
        for sel in [1, 2] {
            let (v, _) = h.get_data(fid, sel, 0, 0);
            assert_eq!(v, 0, "feature {fid:#x} sel {sel}");
        }
    }
    // Temperature Threshold: the default is the warning temperature.
    assert_eq!(h.admin(set_features(0x04, 0x100)).status(), Status::SUCCESS);
    assert_eq!(h.get_data(0x04, 1, 0, 0).0, 0x0157);
    assert_eq!(h.get_data(0x04, 0, 0, 0).0, 0x100);
}

#[test]
fn controller_scope_features_refuse_a_namespace_on_set() {
    let mut h = Host::new();
    h.enable();
    let mut c = set_features(0x80, 3);
    c.nsid = U32::new(1);
    let want = Status::FEATURE_NOT_NAMESPACE_SPECIFIC.with_dnr(true);
    assert_eq!(h.admin(c).status(), want);
    c.nsid = U32::new(0xFFFF_FFFF);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    // Get reads the controller's value through a valid NSID.
    let c = h.admin(get_ns(0x80, 0, 1));
    assert_eq!((c.status(), c.dw0.get()), (Status::SUCCESS, 3));
    let invalid_ns = Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true);
    assert_eq!(
        h.admin(get_ns(0x80, 0, 2)).status(),
        invalid_ns,
        "beyond NN"
    );
    let mut c = set_features(0x80, 3);
    c.nsid = U32::new(7);
    assert_eq!(h.admin(c).status(), invalid_ns);
}

#[test]
fn error_recovery_is_kept_per_namespace() {
    let mut h = Host::new();
    h.enable();
    let invalid_ns = Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true);
    for nsid in [0, 0xFFFF_FFFF, 2] {
        assert_eq!(
            h.admin(get_ns(0x05, 0, nsid)).status(),
            invalid_ns,
            "{nsid:#x}"
        );
    }
    let mut set = set_features(0x05, 30);
    set.nsid = U32::new(1);
    assert_eq!(h.admin(set).status(), Status::SUCCESS);
    assert_eq!(h.admin(get_ns(0x05, 0, 1)).dw0.get(), 30, "TLER");
    set.nsid = U32::new(0xFFFF_FFFF);
    set.cdw11 = U32::new(40);
    assert_eq!(h.admin(set).status(), Status::SUCCESS, "all namespaces");
    assert_eq!(h.admin(get_ns(0x05, 0, 1)).dw0.get(), 40);
    assert_eq!(h.admin(get_ns(0x05, 1, 1)).dw0.get(), 0, "default");
    set.cdw11 = U32::new(1 << 16);
    let want = Status::INVALID_FIELD.with_dnr(true);
    assert_eq!(h.admin(set).status(), want, "DULBE without NSFEAT.DAE");
}

#[test]
fn timestamp_counts_from_reset_then_from_the_value_set() {
    let mut h = Host::new();
    h.enable();
    let t0 = h.timestamp();
    assert_eq!(t0.origin(), timestamp_origin::RESET);
    assert!(!t0.synch());
    let set_to: u64 = 1_700_000_000_000;
    // Bytes 7:6 of the value set are reserved: ignored.
    let mut data = set_to.to_le_bytes();
    data[6..].copy_from_slice(&[0xAB, 0xCD]);
    assert_eq!(h.set_data(0x0E, 0, &data), Status::SUCCESS);
    let t1 = h.timestamp();
    assert_eq!(t1.origin(), timestamp_origin::SET_FEATURES);
    std::thread::sleep(Duration::from_millis(300));
    let t2 = h.timestamp();
    assert!(
        t1.tstmp() >= set_to && t1.tstmp() < set_to + 1_000,
        "{t1:?}"
    );
    let advanced = t2.tstmp() - t1.tstmp();
    assert!((300..10_000).contains(&advanced), "advanced {advanced} ms");
    assert_eq!(h.get_data(0x0E, 0, 0, 16).1[8..], [0xFF; 8], "8 bytes sent");
    // The default is the value after a reset: 0, origin 000b.
    let (_, d) = h.get_data(0x0E, 1, 0, 8);
    let default = Timestamp::from(u64::from_le_bytes(d.try_into().unwrap()));
    assert_eq!(default.origin(), timestamp_origin::RESET);
    assert!(default.tstmp() < 1_000);
    // A Controller Level Reset clears it (§5.27.1.11: not maintained).
    h.reenable();
    let t3 = h.timestamp();
    assert_eq!(t3.origin(), timestamp_origin::RESET);
    assert!(t3.tstmp() < 10_000, "{t3:?}");
}

#[test]
fn timestamp_wraps_at_48_bits() {
    let mut h = Host::new();
    h.enable();
    let max: u64 = (1 << 48) - 1;
    assert_eq!(h.set_data(0x0E, 0, &max.to_le_bytes()), Status::SUCCESS);
    std::thread::sleep(Duration::from_millis(20));
    let t = h.timestamp();
    assert!(t.tstmp() < 10_000, "wrapped past 2^48: {t:?}");
}

#[test]
fn host_behavior_support_keeps_its_fields_and_refuses_reserved_values() {
    let mut h = Host::new();
    h.enable();
    let mut data = [0u8; 512];
    data[0] = 1; // ACRE
    data[2] = 1; // LBAFEE
    data[100] = 0x55; // reserved: not kept
    assert_eq!(h.set_data(0x16, 0, &data), Status::SUCCESS);
    let (_, got) = h.get_data(0x16, 0, 0, 513);
    assert_eq!(got[..4], [1, 0, 1, 0]);
    assert!(got[3..512].iter().all(|&b| b == 0), "reserved bytes read 0");
    assert_eq!(got[512], 0xFF, "512 bytes sent");
    let (_, default) = h.get_data(0x16, 1, 0, 512);
    assert!(default.iter().all(|&b| b == 0));
    data[1] = 2;
    let want = Status::INVALID_FIELD.with_dnr(true);
    assert_eq!(h.set_data(0x16, 0, &data), want, "ETDAS 2 is reserved");
    assert_eq!(h.get_data(0x16, 0, 0, 4).1, [1, 0, 1, 0], "unchanged");
}

#[test]
fn io_command_set_profile_accepts_only_the_nvm_and_zoned_combination() {
    let rejected = Status::IOCS_COMBINATION_REJECTED.with_dnr(true);
    // CC.CSS 000b: the feature has no effect and Set succeeds.
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.admin(set_features(0x19, 5)).status(), Status::SUCCESS);
    assert_eq!(h.get_data(0x19, 0, 0, 0).0, 0);
    // CC.CSS 110b: index 0 (NVM and ZNS) is the only combination.
    let mut h = Host::new();
    h.enable_with(0x0046_0001 | (0b110 << 4), ASQ, (31 << 16) | 31);
    assert!(h.csts().rdy());
    assert_eq!(h.admin(set_features(0x19, 0)).status(), Status::SUCCESS);
    for index in [1, 2, 0x1FF] {
        assert_eq!(h.admin(set_features(0x19, index)).status(), rejected);
    }
    assert_eq!(h.get_data(0x19, 0, 0, 0).0, 0);
}

#[test]
fn software_progress_marker_persists_across_controller_reset() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(
        h.admin(set_features(0x80, 0xFFFF_FF05)).status(),
        Status::SUCCESS
    );
    assert_eq!(
        h.get_data(0x80, 0, 0, 0).0,
        5,
        "PBSLC, reserved bits dropped"
    );
    h.reenable();
    assert_eq!(h.get_data(0x80, 0, 0, 0).0, 5);
    assert_eq!(h.get_data(0x80, 1, 0, 0).0, 0, "default");
}

#[test]
fn host_identifier_is_8_or_16_bytes_and_set_once_per_reset() {
    let mut h = Host::new();
    h.enable();
    let id64 = *b"host-id8";
    assert_eq!(h.set_data(0x81, 0, &id64), Status::SUCCESS);
    let (_, got) = h.get_data(0x81, 0, 0, 9);
    assert_eq!(got[..8], id64);
    assert_eq!(got[8], 0xFF, "8 bytes sent without EXHID");
    let (_, got) = h.get_data(0x81, 0, 1, 16);
    assert_eq!(got[..8], id64);
    assert_eq!(got[8..], [0; 8], "a 64-bit identifier in the 128-bit form");
    // Non-zero: it cannot change until a Controller Level Reset.
    let want = Status::COMMAND_SEQUENCE_ERROR.with_dnr(true);
    assert_eq!(h.set_data(0x81, 1, b"0123456789abcdef"), want);
    h.reenable();
    assert_eq!(h.get_data(0x81, 0, 1, 16).1, [0; 16], "reset to 0h");
    let id128 = *b"0123456789abcdef";
    assert_eq!(h.set_data(0x81, 1, &id128), Status::SUCCESS);
    assert_eq!(h.get_data(0x81, 0, 1, 17).1[..16], id128);
    assert_eq!(h.get_data(0x81, 1, 1, 16).1, [0; 16], "default");
}
