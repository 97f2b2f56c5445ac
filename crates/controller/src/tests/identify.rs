//! Identify: the I/O command set structures (CNS 05h-08h, 1Ah-1Ch), SR-IOV
//! visibility (14h, 15h), the UUID and Domain lists, wrong CNS/CSI pairs.

use vnvme_spec::identify::virtualization::PrimaryControllerCaps;
use vnvme_spec::identify::{ctratt, oncs};
use vnvme_spec::regs::css;

use super::*;
use crate::memory::GuestAddress;

const NVM: u8 = 0x00;
const ZONED: u8 = 0x02;

/// Identify with CDW10.CNTID and CDW11.CSI.
fn identify_with(cns: u8, nsid: u32, cntid: u16, csi: u8) -> Command {
    let mut c = identify(cns, nsid, DATA);
    c.cdw10 = U32::new(u32::from(cns) | (u32::from(cntid) << 16));
    c.cdw11 = U32::new(u32::from(csi) << 24);
    c
}

/// Namespace 1 attached, namespace 2 allocated but detached, NN 4.
fn two_namespaces() -> Host {
    let mut h = Host::new();
    let cfg = ControllerConfig {
        max_namespaces: 4,
        ..config()
    };
    let ram = |blocks: u64| Arc::new(RamDevice::new(blocks * 512));
    let namespaces = vec![
        NamespaceConfig::new(1, 512, ram(NS_BLOCKS)),
        NamespaceConfig::new(2, 512, ram(NS_BLOCKS)).with_attached(false),
    ];
    h.ctrl = Controller::new(cfg, namespaces).unwrap();
    h.ctrl.attach(h.mem.clone(), h.irq.clone());
    h.enable();
    h
}

impl Host {
    /// Runs `c`, returning its status and the 4 KiB it wrote at DATA (which
    /// is filled with FFh first, so untouched bytes show).
    fn identify_data(&mut self, c: Command) -> (Status, Vec<u8>) {
        self.mem.write(GuestAddress(DATA), &[0xFF; 4096]).unwrap();
        let status = self.admin(c).status();
        (status, self.read_mem(DATA, 4096))
    }
}

#[test]
fn nvm_identify_namespace_cns_05h_reports_each_formats_guard() {
    let mut h = two_namespaces();
    for nsid in [1, 2, 0xFFFF_FFFF] {
        let (status, page) = h.identify_data(identify_with(0x05, nsid, 0, NVM));
        assert_eq!(status, Status::SUCCESS, "nsid {nsid:#x}");
        // LBSTM and PIC are zero; ELBAF of formats 6 and 7 says 64b Guard
        // (PIF 10b at bits 8:7), the others 16b Guard, STS 0 throughout;
        // the inactive NSID 2 reads the same.
        let elbaf = |i: usize| u32::from_le_bytes(page[12 + 4 * i..16 + 4 * i].try_into().unwrap());
        for i in 0..64 {
            let want = if i == 6 || i == 7 { 0b10 << 7 } else { 0 };
            assert_eq!(elbaf(i), want, "nsid {nsid:#x} format {i}");
        }
        assert!(page[..12].iter().all(|&b| b == 0), "nsid {nsid:#x}");
        assert!(page[268..].iter().all(|&b| b == 0), "nsid {nsid:#x}");
    }
    let invalid_ns = Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true);
    for nsid in [0, 5] {
        let status = h.admin(identify_with(0x05, nsid, 0, NVM)).status();
        assert_eq!(status, invalid_ns, "nsid {nsid}");
    }
}

#[test]
fn io_command_set_specific_cns_with_an_unsupported_csi_is_invalid_field() {
    let mut h = two_namespaces();
    let invalid_field = Status::INVALID_FIELD.with_dnr(true);
    for cns in [0x05, 0x06, 0x07, 0x1A, 0x1B] {
        for csi in [0x01, 0x30, 0xFF] {
            let (status, page) = h.identify_data(identify_with(cns, 1, 0, csi));
            assert_eq!(status, invalid_field, "cns {cns:#x} csi {csi:#x}");
            assert!(page.iter().all(|&b| b == 0xFF), "nothing transferred");
        }
    }
    // CNS values that take no CSI ignore it.
    let (status, _) = h.identify_data(identify_with(0x01, 0, 0, ZONED));
    assert_eq!(status, Status::SUCCESS);
}

#[test]
fn nvm_identify_controller_cns_06h_reports_no_size_limits() {
    let mut h = Host::new();
    h.enable();
    let (status, page) = h.identify_data(identify_with(0x06, 0, 0, NVM));
    assert_eq!(status, Status::SUCCESS);
    assert!(page.iter().all(|&b| b == 0), "VSL..DMSL: no limits");
}

#[test]
fn namespace_lists_for_the_nvm_command_set_match_the_plain_ones() {
    let mut h = two_namespaces();
    let (status, active) = h.identify_data(identify_with(0x07, 0, 0, NVM));
    assert_eq!(status, Status::SUCCESS);
    assert_eq!(active[..8], [1, 0, 0, 0, 0, 0, 0, 0]);
    let (status, allocated) = h.identify_data(identify_with(0x1A, 0, 0, NVM));
    assert_eq!(status, Status::SUCCESS);
    assert_eq!(allocated[..12], [1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    let (_, after_one) = h.identify_data(identify_with(0x1A, 1, 0, NVM));
    assert_eq!(after_one[..8], [2, 0, 0, 0, 0, 0, 0, 0]);
    let invalid_ns = Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true);
    for nsid in [0xFFFF_FFFE, 0xFFFF_FFFF] {
        assert_eq!(
            h.admin(identify_with(0x07, nsid, 0, NVM)).status(),
            invalid_ns
        );
    }
}

#[test]
fn nvm_identify_namespace_for_an_allocated_nsid_cns_1bh() {
    let mut h = two_namespaces();
    for nsid in [1, 2, 3] {
        let (status, page) = h.identify_data(identify_with(0x1B, nsid, 0, NVM));
        assert_eq!(status, Status::SUCCESS, "nsid {nsid}");
        let (_, cns05) = h.identify_data(identify_with(0x05, 1, 0, NVM));
        assert_eq!(page, cns05, "the same as CNS 05h");
    }
    let invalid_ns = Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true);
    for nsid in [0, 5, 0xFFFF_FFFF] {
        let status = h.admin(identify_with(0x1B, nsid, 0, NVM)).status();
        assert_eq!(status, invalid_ns, "nsid {nsid:#x}");
    }
}

#[test]
fn independent_identify_namespace_reports_readiness_and_no_volatile_cache() {
    let mut h = two_namespaces();
    let (status, page) = h.identify_data(identify(0x08, 1, DATA));
    assert_eq!(status, Status::SUCCESS);
    assert_eq!(
        page[0],
        1 << 5,
        "NSFEAT.VWCPN: the RAM backend has no cache"
    );
    assert_eq!(page[14], 1, "NSTAT.NRDY");
    let (status, inactive) = h.identify_data(identify(0x08, 2, DATA));
    assert_eq!(status, Status::SUCCESS);
    assert!(inactive.iter().all(|&b| b == 0));
}

#[test]
fn io_command_set_data_structure_lists_the_nvm_and_zoned_combination() {
    let mut h = Host::new();
    h.enable();
    for cntid in [0xFFFF, 1] {
        let (status, page) = h.identify_data(identify_with(0x1C, 0, cntid, 0));
        assert_eq!(status, Status::SUCCESS, "cntid {cntid:#x}");
        assert_eq!(
            page[..8],
            [5, 0, 0, 0, 0, 0, 0, 0],
            "combination 0: NVM and ZNS"
        );
        assert!(page[8..].iter().all(|&b| b == 0), "no other combination");
    }
    let (status, _) = h.identify_data(identify_with(0x1C, 0, 2, 0));
    assert_eq!(
        status,
        Status::INVALID_FIELD.with_dnr(true),
        "no controller 2"
    );
}

#[test]
fn primary_controller_capabilities_report_private_resources_only() {
    let mut h = Host::new();
    h.enable();
    let (status, page) = h.identify_data(identify_with(0x14, 0, 1, 0));
    assert_eq!(status, Status::SUCCESS);
    let caps = PrimaryControllerCaps::read_from_bytes(&page).unwrap();
    assert_eq!(caps.cntlid.get(), 1);
    assert_eq!(caps.crt, 0, "no flexible resources");
    assert_eq!(caps.vqprt.get(), 9, "8 I/O queues and the admin queue");
    assert_eq!(caps.viprt.get(), 9, "9 MSI-X vectors");
    assert_eq!((caps.vqfrt.get(), caps.vifrt.get()), (0, 0));
    let mut rest = page.clone();
    rest[..2].fill(0);
    rest[42..44].fill(0);
    rest[74..76].fill(0);
    assert!(rest.iter().all(|&b| b == 0), "everything else zero");
}

#[test]
fn primary_controller_capabilities_for_cntid_0_are_this_controllers() {
    // nvme-cli's `primary-ctrl-caps` without -c sends CNTID 0.
    let mut h = Host::new();
    h.enable();
    let (status, page) = h.identify_data(identify_with(0x14, 0, 0, 0));
    assert_eq!(status, Status::SUCCESS);
    let (_, own) = h.identify_data(identify_with(0x14, 0, 1, 0));
    assert_eq!(page, own, "CNTID 0 answers as CNTID 1 (ours)");
    let caps = PrimaryControllerCaps::read_from_bytes(&page).unwrap();
    assert_eq!(caps.cntlid.get(), 1, "the structure names this controller");
    for cntid in [2, 0xFFFE, 0xFFFF] {
        let (status, _) = h.identify_data(identify_with(0x14, 0, cntid, 0));
        assert_eq!(
            status,
            Status::INVALID_FIELD.with_dnr(true),
            "CNTID {cntid:#x} names no controller here"
        );
    }
}

#[test]
fn secondary_controller_list_and_uuid_list_are_empty() {
    let mut h = Host::new();
    h.enable();
    for (cns, cntid) in [(0x15, 0), (0x15, 1), (0x15, 0xFFFF), (0x17, 0)] {
        let (status, page) = h.identify_data(identify_with(cns, 0, cntid, 0));
        assert_eq!(status, Status::SUCCESS, "cns {cns:#x}");
        assert!(page.iter().all(|&b| b == 0), "cns {cns:#x}: zero entries");
    }
}

#[test]
fn domain_list_is_not_supported_by_a_single_domain_subsystem() {
    let mut h = Host::new();
    h.enable();
    let (status, page) = h.identify_data(identify_with(0x18, 0, 0, 0));
    assert_eq!(status, Status::INVALID_FIELD.with_dnr(true));
    assert!(page.iter().all(|&b| b == 0xFF));
}

#[test]
fn identify_controller_reports_keep_alive_host_id_and_feature_support() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(id.kas.get(), 1, "KATO in 100 ms units");
    let attrs = ctratt::HOST_ID_128 | ctratt::EXTENDED_LBA_FORMATS;
    assert_eq!(id.ctratt.get() & attrs, attrs);
    let feats = oncs::SAVE_SELECT | oncs::TIMESTAMP;
    assert_eq!(id.oncs.get() & feats, feats);
    let cap = Cap::from(h.read64(offset::CAP));
    assert_eq!(cap.css(), css::CAP_NVM | css::CAP_IOCS);
}

#[test]
fn cc_css_selects_nvm_or_all_io_command_sets_and_nothing_else() {
    for (css, ok) in [(0b000, true), (0b110, true), (0b001, false), (0b111, false)] {
        let mut h = Host::new();
        h.enable_with(0x0046_0001 | (css << 4), ASQ, (31 << 16) | 31);
        assert_eq!(h.csts().rdy(), ok, "CC.CSS {css:03b}");
        assert_eq!(h.csts().cfs(), !ok, "CC.CSS {css:03b}");
        if ok {
            // Admin commands and the NVM identify structures work either way.
            let (status, _) = h.identify_data(identify_with(0x06, 0, 0, NVM));
            assert_eq!(status, Status::SUCCESS);
        }
    }
}
