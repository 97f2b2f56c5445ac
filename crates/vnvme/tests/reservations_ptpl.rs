//! Reservations between two hosts through the real server, kept through a
//! restart (Persist Through Power Loss): `vnvme serve --socket A --socket
//! B --ns SIZE:file=IMAGE`, each socket a controller of one subsystem with
//! the project's driver as its client and its own Host Identifier. Both
//! hosts' registrations and the reservation are in `IMAGE.reservations`
//! after a SIGTERM, and a new server on the same image answers them as
//! before: the holder's key releases, the other registrant writes, a
//! controller without an identifier (no registrant) is refused a write.

mod common;

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use common::client::Client;
use common::{serve_logged, temp_dir, Served};
use vnvme_driver::passthru::PassthruData;
use vnvme_spec::reservation::{RegisteredController, ReservationStatus};
use vnvme_spec::{AdminOpcode, Command as Sqe, NvmOpcode, Status};
use zerocopy::FromBytes;

const NSID: u32 = 1;
const KEY_A: u64 = 0xA1A1;
const KEY_B: u64 = 0xB2B2;
const CONFLICT: Status = Status::RESERVATION_CONFLICT.with_dnr(true);
/// Write Exclusive - Registrants Only: registrants write, others read.
const WERO: u32 = 3;

/// `vnvme serve --socket c0 --socket c1 --ns 16M:file=IMAGE`, once both
/// sockets are there.
fn serve(dir: &Path, image: &Path, log: &str) -> (Served, [PathBuf; 2]) {
    let sockets = [dir.join("c0.sock"), dir.join("c1.sock")];
    for s in &sockets {
        let _ = std::fs::remove_file(s);
    }
    let ns = format!("16M:file={}", image.display());
    let args: Vec<&OsStr> = vec![
        OsStr::new("--socket"),
        sockets[0].as_os_str(),
        OsStr::new("--socket"),
        sockets[1].as_os_str(),
        OsStr::new("--ns"),
        OsStr::new(&ns),
    ];
    let ready = [sockets[0].as_path(), sockets[1].as_path()];
    (serve_logged(&args, &dir.join(log), &ready), sockets)
}
impl Client {
    /// Set Features 81h: an 8-byte Host Identifier of `n`s.
    fn become_host(&self, n: u8) {
        let buf = self.mem.dma_alloc(4096).unwrap();
        buf.write_bytes(0, &[n; 8]).unwrap();
        let mut c = Sqe::new(AdminOpcode::SET_FEATURES.0, 0);
        c.cdw10 = 0x81.into();
        let done = (self.ctrl)
            .admin_passthru(c, Some(PassthruData::write(&buf, 8)))
            .unwrap();
        assert_eq!(done.status, Status::SUCCESS, "host id {n}");
    }

    /// A reservation command with `cdw10` and `data` (two keys or one).
    fn resv(&mut self, op: NvmOpcode, cdw10: u32, data: &[u8]) -> Status {
        let buf = self.mem.dma_alloc(4096).unwrap();
        buf.write_bytes(0, data).unwrap();
        let mut c = Sqe::new(op.0, 0);
        c.nsid = NSID.into();
        c.cdw10 = cdw10.into();
        let data = PassthruData::write(&buf, data.len());
        self.q.passthru(c, Some(data)).unwrap().status
    }

    /// Register (RREGA 000b) `nrkey`, with CPTPL `cptpl`.
    fn register(&mut self, nrkey: u64, cptpl: u32) -> Status {
        let data = [0u64.to_le_bytes(), nrkey.to_le_bytes()].concat();
        self.resv(NvmOpcode::RESERVATION_REGISTER, cptpl << 30, &data)
    }

    fn acquire(&mut self, rtype: u32, crkey: u64) -> Status {
        let data = [crkey.to_le_bytes(), 0u64.to_le_bytes()].concat();
        self.resv(NvmOpcode::RESERVATION_ACQUIRE, rtype << 8, &data)
    }

    fn release(&mut self, rtype: u32, crkey: u64) -> Status {
        self.resv(
            NvmOpcode::RESERVATION_RELEASE,
            rtype << 8,
            &crkey.to_le_bytes(),
        )
    }

    /// Reservation Report: the header and (CNTLID, host id byte, holds, key)
    /// of each entry.
    fn report(&mut self) -> (ReservationStatus, Vec<(u16, u8, u8, u64)>) {
        let buf = self.mem.dma_alloc(4096).unwrap();
        let mut c = Sqe::new(NvmOpcode::RESERVATION_REPORT.0, 0);
        c.nsid = NSID.into();
        c.cdw10 = (4096 / 4 - 1).into();
        let done = self.q.passthru(c, Some(PassthruData::read(&buf, 4096)));
        assert_eq!(done.unwrap().status, Status::SUCCESS, "report");
        let page = buf.to_vec();
        let (head, rest) = ReservationStatus::read_from_prefix(&page).unwrap();
        let entries = (0..usize::from(head.regctl.get()))
            .map(|i| RegisteredController::read_from_bytes(&rest[i * 24..(i + 1) * 24]).unwrap())
            .map(|e| (e.cntlid.get(), e.hostid[0], e.rcsts, e.rkey.get()))
            .collect();
        (head, entries)
    }

    /// A one-block write at LBA 0: its status.
    fn write(&mut self) -> Status {
        let buf = self.mem.dma_alloc(4096).unwrap();
        match self.q.write(NSID, 0, 1, &buf) {
            Ok(_) => Status::SUCCESS,
            Err(vnvme_driver::Error::IoCommand { status, .. }) => status,
            Err(e) => panic!("write: {e}"),
        }
    }
}

#[test]
fn both_hosts_registrations_and_the_reservation_survive_a_restart() {
    let dir = temp_dir("resv-ptpl");
    let image = dir.join("disk.img");
    let (server, sockets) = serve(&dir, &image, "serve1.log");
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    a.become_host(1);
    b.become_host(2);
    assert_eq!(a.register(KEY_A, 0b11), Status::SUCCESS, "with PTPL set");
    assert_eq!(b.register(KEY_B, 0), Status::SUCCESS);
    assert_eq!(a.acquire(WERO, KEY_A), Status::SUCCESS);
    let (head, entries) = b.report();
    assert_eq!((head.rtype, head.ptpls, head.gen.get()), (3, 1, 2));
    assert_eq!(entries, [(1, 1, 1, KEY_A), (2, 2, 0, KEY_B)]);
    drop((a, b));
    assert!(server.terminate().success());
    let sidecar = dir.join("disk.img.reservations");
    let text = std::fs::read_to_string(&sidecar).expect("the sidecar file");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("registrant")).count(),
        2
    );

    let (server, sockets) = serve(&dir, &image, "serve2.log");
    let mut a = Client::connect(&sockets[0]);
    let mut b = Client::connect(&sockets[1]);
    // Before the hosts name themselves: registered hosts without a
    // controller, and a controller of no registrant is fenced.
    let (head, entries) = a.report();
    assert_eq!((head.rtype, head.ptpls, head.gen.get()), (3, 1, 2));
    assert_eq!(
        entries,
        [(0xFFFF, 1, 1, KEY_A), (0xFFFF, 2, 0, KEY_B)],
        "kept, no controller yet"
    );
    assert_eq!(a.write(), CONFLICT, "no identifier: not a registrant");
    a.become_host(1);
    b.become_host(2);
    assert_eq!(b.report().1, [(1, 1, 1, KEY_A), (2, 2, 0, KEY_B)]);
    assert_eq!(b.write(), Status::SUCCESS, "a registrant writes");
    assert_eq!(a.write(), Status::SUCCESS, "the holder writes");
    assert_eq!(
        b.release(WERO, KEY_B),
        Status::SUCCESS,
        "not the holder: no-op"
    );
    assert_eq!(b.report().0.rtype, 3);
    assert_eq!(a.release(WERO, KEY_A), Status::SUCCESS, "the kept key");
    assert_eq!(b.report().0.rtype, 0);
    drop((a, b));
    assert!(server.terminate().success());
}
