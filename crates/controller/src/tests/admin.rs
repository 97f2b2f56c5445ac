//! Admin commands.

use super::*;
use crate::memory::GuestAddress;

#[test]
fn identify_controller_reports_the_configuration() {
    let mut h = Host::with(
        ControllerConfig {
            oacs_extra: 1 << 8,
            ..config()
        },
        512,
    );
    h.enable();
    let c = h.admin(identify(1, 0, DATA));
    assert_eq!(c.status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert!(id.mn.starts_with(b"vnvme "));
    assert_eq!(id.sqes, 0x66);
    assert_eq!(id.cqes, 0x44);
    assert_eq!(id.nn.get(), 1);
    assert_eq!(id.mdts, 5);
    assert_eq!(id.oacs.get() & (1 << 8), 1 << 8);
    assert_eq!(id.oncs.get() & 0b1101, 0b1101);
    assert!(id.subnqn.starts_with(b"nqn."));
}

#[test]
fn identify_namespace_and_lists() {
    let mut h = Host::with(config(), 4096);
    h.enable();
    assert_eq!(h.admin(identify(0, 1, DATA)).status(), Status::SUCCESS);
    let ns = IdentifyNamespace::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(ns.nsze.get(), NS_BLOCKS);
    assert_eq!(ns.current_format().lbads, 12);
    assert_eq!(h.admin(identify(2, 0, DATA)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 8), [1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(h.admin(identify(3, 1, DATA)).status(), Status::SUCCESS);
    // EUI-64, NGUID, UUID, CSI: the first two as Identify Namespace has them.
    let d = h.read_mem(DATA, 64);
    assert_eq!((d[0], d[1], &d[4..12]), (1, 8, &ns.eui64[..]), "EUI-64");
    assert_eq!((d[12], d[13], &d[16..32]), (2, 16, &ns.nguid[..]), "NGUID");
    assert_eq!((d[32], d[33]), (3, 16), "UUID");
    assert_ne!(d[36..52], [0; 16], "a UUID is reported");
    assert_eq!(d[52..57], [4, 1, 0, 0, 0], "CSI: NVM");
    assert_eq!(d[57..], [0; 7], "then the end of the list");
    assert_eq!(h.admin(identify(8, 1, DATA)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA + 14, 1), [1], "NSTAT: ready");
    // Identify with PRP1 offset crossing into PRP2.
    let mut c = identify(1, 0, DATA + 0x800);
    c.prp2 = U64::new(DATA + 0x10000);
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    assert_eq!(
        h.read_mem(DATA + 0x800 + 512, 2),
        [0x66, 0x44],
        "SQES/CQES via PRP1"
    );
    assert_eq!(
        h.read_mem(DATA + 0x10000, 2),
        2500u16.to_le_bytes(),
        "PSD0 (byte 2048) via PRP2"
    );
}

#[test]
fn malformed_commands_complete_with_expected_status() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    // A PRP list whose second entry has an offset.
    h.mem
        .write(
            GuestAddress(DATA + 0x10000),
            &(DATA + 0x20000).to_le_bytes(),
        )
        .unwrap();
    h.mem
        .write(
            GuestAddress(DATA + 0x10008),
            &(DATA + 0x30010).to_le_bytes(),
        )
        .unwrap();
    let dnr = |s: Status| s.with_dnr(true);
    let mut fused = rw(NvmOpcode::READ, 1, 0, 1, DATA, 0);
    fused.cdw0 = U32::new(fused.cdw0.get() | (1 << 8));
    // PSDT 01b: DPTR is SGL Entry 1, here a data block of 0 bytes.
    let mut sgl = rw(NvmOpcode::READ, 1, 0, 1, DATA, 0);
    sgl.cdw0 = U32::new(sgl.cdw0.get() | (1 << 14));
    let mut reserved_psdt = rw(NvmOpcode::READ, 1, 0, 1, DATA, 0);
    reserved_psdt.cdw0 = U32::new(reserved_psdt.cdw0.get() | (3 << 14));
    let mut noncontig_cq = create_cq(2, 16, 2, cq_base(2));
    noncontig_cq.cdw11 = U32::new(0b10 | (2 << 16));
    let mut nsq_ffff = set_features(0x07, 0xFFFF_0000);
    nsq_ffff.cdw11 = U32::new(0xFFFF);
    let cases: Vec<(&str, u16, Command, Status)> = vec![
        (
            "unknown admin opcode",
            0,
            cmd(0x3F),
            dnr(Status::INVALID_OPCODE),
        ),
        (
            "unknown io opcode",
            1,
            cmd(0x7E),
            dnr(Status::INVALID_OPCODE),
        ),
        (
            "nsid 0",
            1,
            rw(NvmOpcode::READ, 0, 0, 1, DATA, 0),
            dnr(Status::INVALID_NAMESPACE_OR_FORMAT),
        ),
        (
            "nsid beyond nn",
            1,
            rw(NvmOpcode::READ, 2, 0, 1, DATA, 0),
            dnr(Status::INVALID_NAMESPACE_OR_FORMAT),
        ),
        (
            "nsid broadcast read",
            1,
            rw(NvmOpcode::READ, 0xFFFF_FFFF, 0, 1, DATA, 0),
            dnr(Status::INVALID_NAMESPACE_OR_FORMAT),
        ),
        (
            "lba range past the end",
            1,
            rw(NvmOpcode::READ, 1, NS_BLOCKS - 1, 2, DATA, 0),
            dnr(Status::LBA_OUT_OF_RANGE),
        ),
        (
            "lba overflow",
            1,
            rw(NvmOpcode::WRITE, 1, u64::MAX, 1, DATA, 0),
            dnr(Status::LBA_OUT_OF_RANGE),
        ),
        (
            "transfer above mdts",
            1,
            rw(NvmOpcode::READ, 1, 0, 257, DATA, 0),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "misaligned prp1",
            1,
            rw(NvmOpcode::READ, 1, 0, 1, DATA + 2, 0),
            dnr(Status::INVALID_PRP_OFFSET),
        ),
        (
            "prp2 data page with offset",
            1,
            rw(NvmOpcode::READ, 1, 0, 16, DATA, DATA + 0x10200),
            dnr(Status::INVALID_PRP_OFFSET),
        ),
        (
            "prp list entry with offset",
            1,
            rw(NvmOpcode::READ, 1, 0, 24, DATA, DATA + 0x10000),
            dnr(Status::INVALID_PRP_OFFSET),
        ),
        ("fused", 1, fused, dnr(Status::INVALID_FIELD)),
        ("empty sgl", 1, sgl, dnr(Status::DATA_SGL_LENGTH_INVALID)),
        ("psdt 11b", 1, reserved_psdt, dnr(Status::INVALID_FIELD)),
        (
            "create cq qid 0",
            0,
            create_cq(0, 16, 0, cq_base(0)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create cq qid beyond limit",
            0,
            create_cq(9, 16, 1, cq_base(2)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create cq qid in use",
            0,
            create_cq(1, 16, 1, cq_base(2)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create cq size 0's based 0",
            0,
            create_cq(2, 1, 2, cq_base(2)),
            dnr(Status::INVALID_QUEUE_SIZE),
        ),
        (
            "create cq size above mqes",
            0,
            create_cq(2, 65, 2, cq_base(2)),
            dnr(Status::INVALID_QUEUE_SIZE),
        ),
        (
            "create cq non-contiguous",
            0,
            noncontig_cq,
            dnr(Status::INVALID_FIELD),
        ),
        (
            "create cq vector out of range",
            0,
            create_cq(2, 16, 9, cq_base(2)),
            dnr(Status::INVALID_INTERRUPT_VECTOR),
        ),
        (
            "create cq misaligned base",
            0,
            create_cq(2, 16, 2, cq_base(2) + 0x100),
            dnr(Status::INVALID_PRP_OFFSET),
        ),
        (
            "create sq qid 0",
            0,
            create_sq(0, 16, 1, sq_base(2)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create sq qid beyond limit",
            0,
            create_sq(9, 16, 1, sq_base(2)),
            dnr(Status::INVALID_QID),
        ),
        (
            "create sq on cq 0",
            0,
            create_sq(2, 16, 0, sq_base(2)),
            dnr(Status::INVALID_CQ),
        ),
        (
            "create sq on missing cq",
            0,
            create_sq(2, 16, 5, sq_base(2)),
            dnr(Status::INVALID_CQ),
        ),
        (
            "create sq size above mqes",
            0,
            create_sq(2, 65, 1, sq_base(2)),
            dnr(Status::INVALID_QUEUE_SIZE),
        ),
        (
            "delete cq in use",
            0,
            delete(AdminOpcode::DELETE_IO_CQ, 1),
            dnr(Status::INVALID_QUEUE_DELETION),
        ),
        (
            "delete cq 0",
            0,
            delete(AdminOpcode::DELETE_IO_CQ, 0),
            dnr(Status::INVALID_QID),
        ),
        (
            "delete missing sq",
            0,
            delete(AdminOpcode::DELETE_IO_SQ, 5),
            dnr(Status::INVALID_QID),
        ),
        (
            "identify unknown cns",
            0,
            identify(0x55, 0, DATA),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "identify nsid 0",
            0,
            identify(0, 0, DATA),
            dnr(Status::INVALID_NAMESPACE_OR_FORMAT),
        ),
        (
            "unknown feature",
            0,
            set_features(0x7F, 0),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "number of queues 0xffff",
            0,
            nsq_ffff,
            dnr(Status::INVALID_FIELD),
        ),
        (
            "number of queues after create",
            0,
            set_features(0x07, 0x0003_0003),
            dnr(Status::COMMAND_SEQUENCE_ERROR),
        ),
        (
            "log page offset past end",
            0,
            get_log(0x02, 16, 4096, DATA),
            dnr(Status::INVALID_FIELD),
        ),
        (
            "unknown log page",
            0,
            get_log(0x70, 16, 0, DATA),
            dnr(Status::INVALID_FIELD),
        ),
    ];
    for (name, qid, c, want) in cases {
        let got = h.submit(qid, c).status();
        assert_eq!(got, want, "{name}");
    }
    // Every one of them was counted as an error.
    let stats = h.ctrl.stats();
    assert!(stats.errors >= 36, "errors counted: {}", stats.errors);
}

#[test]
fn number_of_queues_grants_and_limits_creation() {
    let mut h = Host::new();
    h.enable();
    let c = h.admin(set_features(0x07, 0x0001_0001));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(c.dw0.get(), 0x0001_0001);
    // Two queues granted: qid 3 is beyond the grant.
    let c = h.admin(create_cq(3, 16, 1, cq_base(3)));
    assert_eq!(c.status(), Status::INVALID_QID.with_dnr(true));
    h.create_pair(2, 16);
}

#[test]
fn get_log_page_smart_counts_io() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    for i in 0..3 {
        assert!(h
            .submit(1, rw(NvmOpcode::WRITE, 1, i, 8, DATA, 0))
            .status()
            .is_success());
    }
    assert!(h
        .submit(1, rw(NvmOpcode::READ, 1, 0, 8, DATA, 0))
        .status()
        .is_success());
    assert_eq!(
        h.admin(get_log(0x02, 128, 0, DATA)).status(),
        Status::SUCCESS
    );
    let smart = h.read_mem(DATA, 512);
    let u128_at = |o: usize| u128::from_le_bytes(smart[o..o + 16].try_into().unwrap());
    assert_eq!(u128_at(64), 1, "host read commands");
    assert_eq!(u128_at(80), 3, "host write commands");
    assert_eq!(u128_at(48), 1, "data units written (rounded up)");
    // Any length: 3 dwords at offset 4 of the effects log.
    assert_eq!(h.admin(get_log(0x05, 3, 4, DATA)).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(DATA, 4), [1, 0, 0, 0], "create-io-sq supported");
}

#[test]
fn async_event_request_limit_and_invalid_doorbell_event() {
    let mut h = Host::new();
    h.enable();
    for _ in 0..4 {
        let cid = h.push(0, cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
        let _ = cid;
    }
    h.ring_sq(0);
    // The fifth exceeds AERL + 1 = 4.
    let c = h.admin(cmd(AdminOpcode::ASYNC_EVENT_REQUEST.0));
    assert_eq!(c.status(), Status::AER_LIMIT_EXCEEDED.with_dnr(true));
    // A doorbell write to a queue that does not exist raises an error event.
    h.write32(0x1000 + 8 * 5, 1);
    let c = h.reap(0);
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(c.dw0.get() & 0x7, 0, "error event type");
    assert_eq!((c.dw0.get() >> 16) & 0xFF, 1, "error log page");
}

#[test]
fn security_send_and_receive_are_not_supported_even_if_configured() {
    // OACS bit 0 stays clear whatever oacs_extra asks: there is no security
    // protocol behind the commands. Optional commands a controller does not
    // support complete with Invalid Command Opcode (generic status 01h), which
    // nvme-cli's security-recv prints as it is.
    let mut h = Host::with(
        ControllerConfig {
            oacs_extra: 1,
            ..config()
        },
        512,
    );
    h.enable();
    assert_eq!(h.admin(identify(1, 0, DATA)).status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(DATA, 4096)).unwrap();
    assert_eq!(id.oacs.get() & 1, 0, "OACS.SSRS");
    for (name, opcode) in [("Security Send", 0x81), ("Security Receive", 0x82)] {
        let mut c = cmd(opcode);
        c.prp1 = U64::new(DATA);
        // SECP 00h (the protocol list), AL 512: what `nvme security-recv -x 512` sends.
        c.cdw11 = U32::new(512);
        assert_eq!(
            h.admin(c).status(),
            Status::INVALID_OPCODE.with_dnr(true),
            "{name}"
        );
    }
    // The Commands Supported and Effects log agrees: CSUPP clear for both.
    assert_eq!(
        h.admin(get_log(0x05, 1024, 0, DATA)).status(),
        Status::SUCCESS
    );
    let log = h.read_mem(DATA, 4096);
    for opcode in [0x81usize, 0x82] {
        assert_eq!(
            log[opcode * 4..opcode * 4 + 4],
            [0; 4],
            "opcode {opcode:#x}"
        );
    }
}
