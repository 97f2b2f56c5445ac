//! Directive Send and Receive: the Identify and Streams directives, and
//! writes that name a stream.

use vnvme_spec::directive::StreamsParameters;
use vnvme_spec::status::invalid_field;

use super::*;
use crate::memory::GuestAddress;

const BUF: u64 = DATA + 0x40000;

fn directive(op: AdminOpcode, nsid: u32, dtype: u8, doper: u8, dspec: u16, cdw12: u32) -> Command {
    let mut c = cmd(op.0);
    c.nsid = U32::new(nsid);
    c.prp1 = U64::new(BUF);
    // NUMD 0's based: a 4 KiB buffer.
    c.cdw10 = U32::new(1023);
    c.cdw11 = U32::new(u32::from(doper) | u32::from(dtype) << 8 | u32::from(dspec) << 16);
    c.cdw12 = U32::new(cdw12);
    c
}

fn stream_write(sid: u16, slba: u64) -> Command {
    let mut c = rw(NvmOpcode::WRITE, 1, slba, 8, DATA, 0);
    c.cdw12 = U32::new(c.cdw12.get() | 1 << 20);
    c.cdw13 = U32::new(u32::from(sid) << 16);
    c
}

impl Host {
    fn dir_send(&mut self, dtype: u8, doper: u8, dspec: u16, cdw12: u32) -> Completion {
        self.admin(directive(
            AdminOpcode::DIRECTIVE_SEND,
            1,
            dtype,
            doper,
            dspec,
            cdw12,
        ))
    }

    /// Directive Receive into BUF (filled with FFh before).
    fn dir_receive(&mut self, dtype: u8, doper: u8, cdw12: u32) -> Completion {
        self.mem.write(GuestAddress(BUF), &[0xFF; 4096]).unwrap();
        self.admin(directive(
            AdminOpcode::DIRECTIVE_RECEIVE,
            1,
            dtype,
            doper,
            0,
            cdw12,
        ))
    }

    /// Enable Directive: Streams (TDTYPE 1) on or off for namespace 1.
    fn enable_streams(&mut self, on: bool) -> Status {
        self.dir_send(0, 1, 0, 1 << 8 | u32::from(on)).status()
    }

    fn streams_params(&mut self) -> StreamsParameters {
        assert_eq!(self.dir_receive(1, 1, 0).status(), Status::SUCCESS);
        StreamsParameters::read_from_bytes(&self.read_mem(BUF, 32)).unwrap()
    }

    /// Get Status: the open stream ids.
    fn open_streams(&mut self) -> Vec<u16> {
        assert_eq!(self.dir_receive(1, 2, 0).status(), Status::SUCCESS);
        let data = self.read_mem(BUF, 2 + 2 * 16);
        let osc = usize::from(u16::from_le_bytes([data[0], data[1]]));
        let ids = data[2..]
            .chunks(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]));
        ids.take(osc).collect()
    }

    fn allocate(&mut self, nsr: u16) -> Completion {
        self.dir_receive(1, 3, u32::from(nsr))
    }
}

#[test]
fn identify_controller_reports_directives_in_oacs() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.admin(identify(1, 0, BUF)).status(), Status::SUCCESS);
    let id = IdentifyController::read_from_bytes(&h.read_mem(BUF, 4096)).unwrap();
    assert_ne!(id.oacs.get() & (1 << 5), 0);
}

#[test]
fn identify_return_parameters_show_streams_enabled_only_after_enable() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.dir_receive(0, 1, 0).status(), Status::SUCCESS);
    let data = h.read_mem(BUF, 4096);
    assert_eq!((data[0], data[32]), (0b11, 0b01), "supported, enabled");
    assert!(data[1..32].iter().chain(&data[33..]).all(|&b| b == 0));
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    assert_eq!(h.dir_receive(0, 1, 0).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(BUF + 32, 1), [0b11]);
    assert_eq!(h.enable_streams(false), Status::SUCCESS);
    assert_eq!(h.dir_receive(0, 1, 0).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(BUF + 32, 1), [0b01]);
}

#[test]
fn enable_directive_refuses_identify_and_unknown_types() {
    let mut h = Host::new();
    h.enable();
    for tdtype in [0u32, 2, 0xFF] {
        assert_eq!(
            h.dir_send(0, 1, 0, tdtype << 8 | 1).status(),
            invalid_field()
        );
    }
    // Unknown operations and directive types.
    assert_eq!(h.dir_send(0, 2, 0, 0).status(), invalid_field());
    assert_eq!(h.dir_send(5, 1, 0, 0).status(), invalid_field());
    assert_eq!(h.dir_receive(0, 2, 0).status(), invalid_field());
    assert_eq!(h.dir_receive(9, 1, 0).status(), invalid_field());
}

#[test]
fn directives_name_an_active_namespace() {
    let mut h = Host::new();
    h.enable();
    for nsid in [0, 2] {
        let c = h.admin(directive(AdminOpcode::DIRECTIVE_RECEIVE, nsid, 0, 1, 0, 0));
        assert_eq!(
            c.status(),
            Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true)
        );
    }
    // Enable Directive for every namespace: FFFFFFFFh.
    let c = h.admin(directive(
        AdminOpcode::DIRECTIVE_SEND,
        0xFFFF_FFFF,
        0,
        1,
        0,
        0x101,
    ));
    assert_eq!(c.status(), Status::SUCCESS);
    assert_eq!(h.streams_params().msl.get(), 16);
}

#[test]
fn streams_receive_before_enable_is_invalid_field() {
    let mut h = Host::new();
    h.enable();
    for doper in 1..=3 {
        assert_eq!(h.dir_receive(1, doper, 1).status(), invalid_field());
    }
    assert_eq!(h.dir_send(1, 1, 1, 0).status(), invalid_field());
    assert_eq!(h.dir_send(1, 2, 0, 0).status(), invalid_field());
}

#[test]
fn streams_parameters_after_enable_and_allocate() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    let p = h.streams_params();
    assert_eq!((p.msl.get(), p.nssa.get(), p.nsso.get()), (16, 16, 0));
    // 4 KiB of 512-byte blocks, granularity one write size.
    assert_eq!((p.sws.get(), p.sgs.get()), (8, 1));
    assert_eq!((p.nsa.get(), p.nso.get()), (0, 0));
    let c = h.allocate(4);
    assert_eq!((c.status(), c.dw0.get()), (Status::SUCCESS, 4));
    let p = h.streams_params();
    assert_eq!((p.nssa.get(), p.nsa.get()), (12, 4));
}

#[test]
fn allocate_more_than_available_gives_what_is_left() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    let c = h.allocate(1000);
    assert_eq!((c.status(), c.dw0.get()), (Status::SUCCESS, 16));
    // Already holding resources: no more are given.
    assert_eq!(h.allocate(2).dw0.get(), 16);
    assert_eq!(h.streams_params().nssa.get(), 0);
    // Released, the next request is granted anew.
    assert_eq!(h.dir_send(1, 2, 0, 0).status(), Status::SUCCESS);
    assert_eq!(h.streams_params().nssa.get(), 16);
    assert_eq!(h.allocate(2).dw0.get(), 2);
}

#[test]
fn write_with_a_stream_opens_it_and_counts() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    assert_eq!(h.allocate(4).dw0.get(), 4);
    assert!(h.open_streams().is_empty());
    h.mem.write(GuestAddress(DATA), &[0xA5; 4096]).unwrap();
    assert_eq!(h.submit(1, stream_write(3, 16)).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, stream_write(3, 24)).status(), Status::SUCCESS);
    assert_eq!(h.submit(1, stream_write(1, 32)).status(), Status::SUCCESS);
    let mut back = vec![0; 4096];
    h.backend.read(24 * 512, &mut back).unwrap();
    assert_eq!(back, vec![0xA5; 4096], "the data lands as usual");
    assert_eq!(h.open_streams(), [1, 3]);
    let p = h.streams_params();
    assert_eq!((p.nso.get(), p.nsso.get()), (2, 2));
    let stats = h.ctrl.stats();
    assert_eq!(stats.stream_writes, [(1, 1), (3, 2)].into_iter().collect());
    // Get Status with room for the count only: one dword.
    let mut c = directive(AdminOpcode::DIRECTIVE_RECEIVE, 1, 1, 2, 0, 0);
    c.cdw10 = U32::new(0);
    h.mem.write(GuestAddress(BUF), &[0xFF; 8]).unwrap();
    assert_eq!(h.admin(c).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(BUF, 8), [2, 0, 1, 0, 0xFF, 0xFF, 0xFF, 0xFF]);
}

#[test]
fn write_with_a_stream_when_disabled_or_beyond_the_limit_is_invalid_field() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.submit(1, stream_write(1, 0)).status(), invalid_field());
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    // Enabled, nothing allocated.
    assert_eq!(h.submit(1, stream_write(1, 0)).status(), invalid_field());
    assert_eq!(h.allocate(2).dw0.get(), 2);
    for sid in [0, 3, 0xFFFF] {
        assert_eq!(h.submit(1, stream_write(sid, 0)).status(), invalid_field());
    }
    // A directive type other than Streams.
    let mut c = stream_write(1, 0);
    c.cdw12 = U32::new(c.cdw12.get() | 2 << 20);
    assert_eq!(h.submit(1, c).status(), invalid_field());
    assert!(h.open_streams().is_empty());
    assert!(h.ctrl.stats().stream_writes.is_empty());
}

#[test]
fn release_identifier_closes_one_stream_and_release_resources_all() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    assert_eq!(h.allocate(4).dw0.get(), 4);
    for sid in [1, 2, 4] {
        assert_eq!(h.submit(1, stream_write(sid, 0)).status(), Status::SUCCESS);
    }
    assert_eq!(h.dir_send(1, 1, 2, 0).status(), Status::SUCCESS);
    assert_eq!(h.open_streams(), [1, 4]);
    // Releasing a stream that is not open changes nothing.
    assert_eq!(h.dir_send(1, 1, 3, 0).status(), Status::SUCCESS);
    assert_eq!(h.open_streams(), [1, 4]);
    assert_eq!(h.dir_send(1, 2, 0, 0).status(), Status::SUCCESS);
    assert!(h.open_streams().is_empty());
    assert_eq!(h.streams_params().nsa.get(), 0);
    assert_eq!(h.submit(1, stream_write(1, 0)).status(), invalid_field());
}

#[test]
fn disabling_streams_releases_resources() {
    let mut h = Host::new();
    h.enable();
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    assert_eq!(h.allocate(5).dw0.get(), 5);
    assert_eq!(h.enable_streams(false), Status::SUCCESS);
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    let p = h.streams_params();
    assert_eq!((p.nssa.get(), p.nsa.get()), (16, 0));
}

#[test]
fn controller_reset_disables_streams_and_releases_resources() {
    let mut h = Host::new();
    h.enable();
    h.create_pair(1, 16);
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    assert_eq!(h.allocate(4).dw0.get(), 4);
    assert_eq!(h.submit(1, stream_write(2, 0)).status(), Status::SUCCESS);
    h.write32(offset::CC, 0x0046_0000);
    h.mem.zero(GuestAddress(ACQ), 4096).unwrap();
    h.enable();
    assert_eq!(h.dir_receive(0, 1, 0).status(), Status::SUCCESS);
    assert_eq!(h.read_mem(BUF + 32, 1), [0b01], "streams disabled");
    assert_eq!(h.dir_receive(1, 1, 0).status(), invalid_field());
    assert_eq!(h.enable_streams(true), Status::SUCCESS);
    let p = h.streams_params();
    assert_eq!((p.nssa.get(), p.nsa.get(), p.nsso.get()), (16, 0, 0));
}
